"""What the engine bench measures: its configuration and the engines it compares.

:class:`BenchConfig` holds the model, batch sizes and executor settings; :func:`variants_for`
lists the engines compared for a model (the served one first); :func:`bench_spec` is the model
as the repository holding the artifact describes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inflight.models.registry import get_model
from inflight.models.spec import ModelSpec
from inflight.variants import repository_spec


@dataclass
class BenchConfig:
    """What to measure.

    Attributes:
        model: Registry model name.
        artifact: The ``.pt2`` file.
        batches: Batch sizes (items per batch).
        seq_len: Sequence length (variable-length models).
        items_per_request: Items per request; a batch holds several requests, as the dynamic batcher forms it.
        iters: Batches per measurement.
        warmup: Batches before each measurement.
        slots: Ring size of the pipelined executor.
        response_threads: Sender threads of the pipelined executor.
        precision: fp16 or fp32.
        device_id: GPU.
        wait_mode: blocking or poll (completion wait).
    """

    model: str = "bert_tiny"
    artifact: Path = Path("model_repository/bert_tiny_inflight/1/model.pt2")
    batches: Sequence[int] = (32, 128, 512, 2048)
    seq_len: int = 64
    items_per_request: int = 50
    iters: int = 200
    warmup: int = 20
    slots: int = 4
    response_threads: int = 4
    precision: str = "fp16"
    device_id: int = 0
    wait_mode: str = "blocking"
    variants: bool = True
    mixed: tuple[int, int] = (16, 128)


@dataclass(frozen=True)
class Variant:
    """One engine the bench compares.

    Attributes:
        label: Its name in the JSON (``engine`` key of each row).
        compile: ``none``, ``inductor`` or ``max-autotune``.
        precision: ``fp16``, ``bf16`` or ``fp32``.
        module: ``make_module`` options to export a module from (None: the repository's artifact).
    """

    label: str
    compile: str
    precision: str
    module: tuple[tuple[str, Any], ...] | None = None


def variants_for(model: str, precision: str, spec: ModelSpec | None = None) -> list[Variant]:
    """The engines compared for ``model``: the served one first, then the others.

    bert_tiny compares its rewrites and kernels one by one; a head compares the served engine
    (its rewrite, compiled as ``compile=auto`` compiles it on a GPU) with the other compile mode
    and with the published head as the engine ran it before (inductor) and eager.
    """
    if model == "bert_tiny":
        full = (("cls_only", False), ("kernels", False))
        return [
            Variant(f"inductor + Triton kernels, CLS-only last layer (served), {precision}", "inductor", precision),
            Variant(f"eager, unmodified model (the engine before), {precision}", "none", precision, full),
            Variant(f"inductor, unmodified model, {precision}", "inductor", precision, full),
            Variant(
                f"inductor, CLS-only last layer, unfused ops (served before the kernels), {precision}",
                "inductor",
                precision,
                (("kernels", False),),
            ),
            Variant("inductor + Triton kernels, CLS-only last layer (served), bf16", "inductor", "bf16"),
        ]
    spec = spec if spec is not None else get_model(model)
    served, other = spec.gpu_compile, "none" if spec.gpu_compile == "inductor" else "inductor"
    name = {"inductor": "inductor", "none": "eager"}
    rewrite = "bias+ReLU in the GEMM epilogue, " if model == "linear_head" else ""
    # without a rewrite, the engine before is the served artifact under inductor (compile=auto's
    # choice on a GPU before the heads were measured)
    before = {c: "" if spec.reference_options or c != "inductor" else ", the engine before" for c in (served, other)}
    out = [
        Variant(f"{name[served]}, {rewrite}served artifact{before[served]} (served), {precision}", served, precision),
        Variant(f"{name[other]}, {rewrite}served artifact{before[other]}, {precision}", other, precision),
    ]
    if spec.reference_options:
        ref = tuple(sorted(spec.reference_options.items()))
        out += [
            Variant(f"inductor, published head (the engine before), {precision}", "inductor", precision, ref),
            Variant(f"eager, published head, {precision}", "none", precision, ref),
        ]
    return out


def bench_spec(cfg: BenchConfig) -> ModelSpec:
    """The benchmarked model: built in, or what the repository holding the artifact says."""
    return repository_spec(cfg.artifact.parents[2], cfg.model)
