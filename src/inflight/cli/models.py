"""``inflight`` commands that write models: ``add-variant``, ``build-models``, ``import-hf``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from inflight.cli_util import REPO_DEFAULT, fail, setup_logging
from inflight.errors import InflightError
from inflight.variants import DEFAULT_MAX_BATCH_SIZE, Kind


def add_variant_cmd(
    spec: Annotated[str, typer.Argument(help="A built variant with overrides, e.g. bert_tiny_inflight@mode=auto.")],
    tag: Annotated[str, typer.Option(help="Appended to the variant's name: bert_tiny_inflight_<tag>.")],
    repository: Annotated[Path, typer.Option(help="Model repository (built by build-models).")] = REPO_DEFAULT,
) -> None:
    """Write a tagged copy of a built variant with overrides, to serve beside the original."""
    from inflight.build.configs import add_variant

    try:
        typer.echo(add_variant(repository, spec, tag))
    except InflightError as e:
        fail(e)


def build_models_cmd(
    models: Annotated[Optional[list[str]], typer.Argument(help="Models to build (default: all).")] = None,  # noqa: UP045
    repository: Annotated[Path, typer.Option(help="Model repository to write.")] = REPO_DEFAULT,
    kind: Annotated[str, typer.Option(help="Instance kind: auto (GPU when present), gpu or cpu.")] = "auto",
    instances: Annotated[int, typer.Option(help="Instances of every variant but <model>_inflight.")] = 1,
    server_cpus: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Cores the server will run on, as a count (8) or as taskset -c takes them (0-7): <model>_inflight "
            "gets one auto-mode instance per core. Default: the cores this command may run on."
        ),
    ] = None,
    gpus: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            help="GPUs the server will see: <model>_inflight's cores are split among them (Triton places the "
            "instance count on each GPU). Default: CUDA_VISIBLE_DEVICES, else the GPUs nvidia-smi lists."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Weight seed.")] = 0,
    onnx: Annotated[bool, typer.Option(help="Also export ONNX for TensorRT.")] = True,
    configs_only: Annotated[bool, typer.Option(help="Write config.pbtxt files only.")] = False,
    verbose: bool = False,
) -> None:
    """Write configs (inflight, sync, trt, plain variants and the null control model) and the Torch/ONNX artifacts."""
    setup_logging(verbose)
    from inflight.build.repository import build_models

    kinds: dict[str, Kind] = {"auto": "auto", "gpu": "gpu", "cpu": "cpu"}
    if kind not in kinds:
        fail(ValueError(f"--kind {kind!r}: choose auto, gpu or cpu"))
    try:
        cores = _core_count(server_cpus)
        out = build_models(
            repository,
            models,
            kind=kinds[kind],
            instances=instances,
            seed=seed,
            onnx=onnx,
            configs_only=configs_only,
            server_cpus=cores,
            gpus=gpus,
        )
    except InflightError as e:
        fail(e)
    for s in out:
        typer.echo(json.dumps(s))


def _core_count(server_cpus: str | None) -> int | None:
    """``--server-cpus`` as a count: ``8`` or a taskset list (``0-7``); None when not given."""
    from inflight.loadtest.list_options import parse_cpus

    if server_cpus is None:
        return None
    return int(server_cpus) if server_cpus.isdigit() else len(parse_cpus(server_cpus))


def import_hf_cmd(
    checkpoint: Annotated[
        Path, typer.Argument(help="A Hugging Face BERT checkpoint folder (config.json + safetensors).")
    ],
    name: Annotated[str, typer.Option(help="The model's name: NAME_inflight, NAME_sync, NAME_plain, NAME_trt.")],
    repository: Annotated[Path, typer.Option(help="Model repository to write.")] = REPO_DEFAULT,
    max_batch_size: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            min=1,
            help="Largest batch (sequences) of the configs. Default: with a GPU, the largest of 2048 and 1024 at "
            f"which one instance a core fits its memory, else {DEFAULT_MAX_BATCH_SIZE} (larger batches serve a "
            "GPU-bound encoder better at more GPU memory per instance and a longer batcher delay: docs/LAB.md).",
        ),
    ] = None,
    server_cpus: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Cores the server will run on (8 or 0-7): NAME_inflight gets one instance per core."),
    ] = None,
    gpus: Annotated[Optional[int], typer.Option(help="GPUs the server will see (default: as build-models).")] = None,  # noqa: UP045
    onnx: Annotated[bool, typer.Option(help="Also export ONNX for a TensorRT plan.")] = True,
    allow_pickle: Annotated[
        bool,
        typer.Option(
            help="Read pytorch_model.bin: unpickling runs code from the file; only for checkpoints you trust."
        ),
    ] = False,
    verbose: bool = False,
) -> None:
    """Serve your own BERT-family checkpoint: its configs, artifacts, architecture and tokenizer into the repository."""
    setup_logging(verbose)
    from inflight.build.checkpoint import import_checkpoint

    try:
        cores = _core_count(server_cpus)
        out = import_checkpoint(
            repository,
            checkpoint,
            name,
            allow_pickle=allow_pickle,
            max_batch_size=max_batch_size,
            onnx=onnx,
            server_cpus=cores,
            gpus=gpus,
        )
    except InflightError as e:
        fail(e)
    typer.echo(json.dumps(out, default=str))


def register(app: typer.Typer) -> None:
    """Add ``add-variant``, ``build-models`` and ``import-hf`` to ``app`` (the ``inflight`` command line)."""
    app.command("add-variant")(add_variant_cmd)
    app.command("build-models")(build_models_cmd)
    app.command("import-hf")(import_hf_cmd)
