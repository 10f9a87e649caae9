"""Where a bucket's GPU time goes: the served Torch engine's kernels at (batch, seq), by time.

Builds the engine the backend serves (``TorchEngine`` on the repository's ``model.pt2``, compiled
as ``compile=auto`` compiles it, fp16), captures the bucket's CUDA graph, times graph replays with
CUDA events, then runs the same compiled step under ``torch.profiler`` (kineto/CUPTI, bundled with
torch) and lists the kernels by total GPU time per batch. Writes a JSON (device, versions, per
bucket: replay time, kernel count, kernel rows, and the GPU time in GEMM kernels vs the others)
and prints a table.

Options for trying rewrites: ``--module key=value`` exports ``make_module(0, key=value...)`` in
place of the repository's artifact (e.g. ``cls_attention=explicit``), and ``--no-cudnn-sdp`` turns
PyTorch's cuDNN attention backend off before compiling, so ``scaled_dot_product_attention`` with a
mask lowers to the memory-efficient kernel instead, and ``--inductor key=value`` sets an attribute
of ``torch._inductor.config`` (e.g. ``coordinate_descent_tuning=true``) before compiling (set
``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`` when comparing such switches: inductor's on-disk cache does
not key on them).

``--unpadded`` profiles the unpadded launches instead: a 2,048-row batch at length 64 with the
example inputs' masked tails, and one of lengths 16-128 at 128, each through the engine's unpadded
graph of its token bucket.

Usage (GPU host): python3 scripts/lab/profile_engine.py --batch 512 --batch 2048 --out prof.json
(``--model seqlen_head``: a head; its ``--seq`` is ignored)
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

ITERS = 20


def _option_value(text: str) -> Any:
    """A ``--module`` value: JSON where it parses (``false``, ``3``), else the string (``explicit``)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _replay_and_profile(engine: Any, group: Any, stream: Any, step: Any) -> tuple[float, list[dict[str, Any]]]:
    """Replay time and kernels of ``group``.

    Returns the mean time of 100 replays of ``group``'s captured graph, and the kernels of
    ``step()`` per batch (the same compiled step, run outside the graph so the profiler sees each
    kernel).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        engine.enqueue(0, group, stream.cuda_stream)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(100):
        engine.enqueue(0, group, stream.cuda_stream)
    end.record(stream)
    end.synchronize()
    replay_us = start.elapsed_time(end) * 1e3 / 100
    with torch.inference_mode(), torch.cuda.stream(stream):
        step()
        stream.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(ITERS):
                step()
            stream.synchronize()
    return replay_us, _kernels(prof)


def _kernels(prof: Any) -> list[dict[str, Any]]:
    kernels: dict[str, dict[str, float]] = {}
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        k = kernels.setdefault(ev.name, {"us": 0.0, "calls": 0})
        k["us"] += ev.device_time / ITERS
        k["calls"] += 1 / ITERS
    return sorted(({"kernel": n, **v} for n, v in kernels.items()), key=lambda r: -float(r["us"]))


#: substrings of the names of cuBLAS/CUTLASS GEMM kernels (Hopper's nvjet and sm90 xmma included)
GEMM_KERNELS = ("gemm", "nvjet", "cutlass", "xmma")


def kernel_classes(kernels: list[dict[str, Any]]) -> dict[str, float]:
    """GPU microseconds per batch in GEMM kernels and in all the others."""
    gemm = sum(float(k["us"]) for k in kernels if any(g in k["kernel"].lower() for g in GEMM_KERNELS))
    return {"gemm_us": gemm, "other_us": sum(float(k["us"]) for k in kernels) - gemm}


def _profile_doc(replay_us: float, kernels: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        **fields,
        "replay_us": replay_us,
        "kernel_us_sum": sum(r["us"] for r in kernels),
        "kernels_per_batch": sum(r["calls"] for r in kernels),
        **kernel_classes(kernels),
        "kernels": kernels,
    }


def profile_bucket(engine: Any, rows: int, seq: int | None, stream: Any) -> dict[str, Any]:
    """Replay time and the kernels of one ``(rows, seq)`` bucket."""
    from inflight.runtime.batch import Group

    spec = engine.spec
    group = Group((rows, seq), rows, 0, {t.name: 0 for t in spec.inputs}, {t.name: 0 for t in spec.outputs})
    assert engine.capture(0, rows, seq, stream.cuda_stream)
    replay_us, kernels = _replay_and_profile(engine, group, stream, lambda: engine._step(rows, seq))
    return _profile_doc(replay_us, kernels, batch=rows, seq=seq)


def profile_unpadded(engine: Any, bufs: dict[str, Any], name: str, x: dict[str, Any], stream: Any) -> dict[str, Any]:
    """Replay time and kernels of the unpadded launch of the rows ``x`` (written to the slot's buffers)."""
    import numpy as np
    import torch

    from inflight.runtime.batch import Group, token_buckets

    spec = engine.spec
    rows, seq = x["input_ids"].shape
    for t in spec.inputs:
        bufs[t.name][: rows * seq].copy_(torch.from_numpy(np.ascontiguousarray(x[t.name])).reshape(-1))
    kept = int(np.count_nonzero(x[spec.mask_input]))
    tokens = next(b for b in token_buckets(rows * 128) if b >= kept)
    group = Group((rows, seq), rows, 0, {t.name: 0 for t in spec.inputs}, {t.name: 0 for t in spec.outputs}, tokens)
    assert engine.capture_unpadded(seq, tokens, stream.cuda_stream)
    replay_us, kernels = _replay_and_profile(engine, group, stream, lambda: engine._step_unpadded(seq, tokens))
    return _profile_doc(replay_us, kernels, batch=name, seq=seq, rows=rows, kept_tokens=kept, tokens=tokens)


def unpadded_main(a: Any, artifact: Path, out: Path) -> None:
    """``--unpadded``: the unpadded launches of a uniform and a mixed batch."""
    import numpy as np
    import torch

    from inflight.models.registry import get_model
    from inflight.runtime.engines.base import SlotBuffers
    from inflight.runtime.engines.torch_engine import TorchEngine

    spec = get_model(a.model)
    rows = max(a.batch or [2048])
    rng = np.random.default_rng(2)
    uniform = spec.example_inputs(rows, seq_len=64, rng=rng)
    mixed = {t.name: np.zeros((rows, 128), np.int64) for t in spec.inputs}
    for r in range(rows):
        one = spec.example_inputs(1, seq_len=int(rng.integers(16, 129)), rng=rng)
        for t in spec.inputs:
            mixed[t.name][r, : one[t.name].shape[1]] = one[t.name][0]
    doc: dict[str, Any] = {
        "kind": "engine_profile_unpadded",
        "device": torch.cuda.get_device_name(0),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
    }
    engine = TorchEngine(artifact, spec, device_id=0, precision=a.precision, compile=a.compile, unpad=True)
    n = rows * 128
    bufs = {t.name: torch.zeros(n, dtype=getattr(torch, t.dtype), device="cuda") for t in spec.inputs}
    outs = {t.name: torch.zeros(rows * t.dims[0], dtype=getattr(torch, t.dtype), device="cuda") for t in spec.outputs}
    engine.bind(
        0,
        SlotBuffers(
            inputs={k: (v.data_ptr(), v.numel() * v.element_size()) for k, v in bufs.items()},
            outputs={k: (v.data_ptr(), v.numel() * v.element_size()) for k, v in outs.items()},
            rows=rows,
        ),
    )
    stream = torch.cuda.Stream()
    runs = [profile_unpadded(engine, bufs, name, x, stream) for name, x in (("uniform", uniform), ("mixed", mixed))]
    doc.update(engine=engine.describe(), runs=runs)
    for b in runs:
        print(
            f"{b['batch']} seq {b['seq']}: {b['kept_tokens']} kept of {b['rows'] * b['seq']}, bucket "
            f"{b['tokens']}: replay {b['replay_us']:.1f} us, kernels {b['kernel_us_sum']:.1f} us in "
            f"{b['kernels_per_batch']:.0f} launches"
        )
        for k in b["kernels"][:20]:
            print(f"  {k['us']:8.1f} us  x{k['calls']:.0f}  {k['kernel'][:110]}")
    engine.close()
    out.write_text(json.dumps(doc, indent=1) + "\n")


def max_abs_error(engine: Any, spec: Any, seq: int | None) -> float:
    """Largest ``|engine - unmodified fp32 CPU model|`` over 256 items (with padded masks where the model has them)."""
    import numpy as np
    import torch

    from inflight.runtime.engines.torch_engine import _forward

    x = spec.example_inputs(256, seq_len=seq, rng=np.random.default_rng(1))
    ref_module = spec.build_module(0, **spec.reference_options)
    with torch.inference_mode():
        ref = ref_module(*[torch.from_numpy(x[t.name]) for t in spec.inputs]).double()
        args = {t.name: torch.from_numpy(x[t.name]).to(engine.device) for t in spec.inputs}
        got = _forward(engine.module, spec, engine.dtype, args)
    return float((got.double().cpu() - ref).abs().max())


def main() -> None:
    """Profile the buckets named on the command line."""
    import torch

    from inflight.models.registry import get_model
    from inflight.runtime.batch import Layout
    from inflight.runtime.engines.base import SlotBuffers
    from inflight.runtime.engines.torch_engine import TorchEngine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="bert_tiny")
    p.add_argument("--repository", type=Path, default=Path("model_repository"))
    p.add_argument("--batch", type=int, action="append")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--precision", default="fp16")
    p.add_argument("--module", action="append", default=[], help="make_module option key=value (exports anew)")
    p.add_argument("--no-cudnn-sdp", action="store_true", help="torch.backends.cuda.enable_cudnn_sdp(False)")
    p.add_argument("--compile", default="auto", help="TorchEngine compile mode (auto: as served, inductor, none...)")
    p.add_argument(
        "--inductor", action="append", default=[], help="torch._inductor.config attribute key=value (JSON value)"
    )
    p.add_argument("--unpadded", action="store_true", help="profile the unpadded launches")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    inductor = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in a.inductor)}
    if inductor:
        import torch._inductor.config as inductor_config

        for k, v in inductor.items():
            if not hasattr(inductor_config, k):
                raise SystemExit(f"--inductor {k}: torch._inductor.config has no such attribute")
            setattr(inductor_config, k, v)
    spec = get_model(a.model)
    batches = a.batch or [512, 2048]
    artifact = a.repository / f"{a.model}_inflight" / "1" / "model.pt2"
    if a.unpadded:
        unpadded_main(a, artifact, a.out)
        return
    options = {k: _option_value(v) for k, v in (kv.split("=", 1) for kv in a.module)}
    if options:
        from inflight.build.export import export_torch

        artifact = a.out.with_suffix(".pt2")
        export_torch(spec, spec.build_module(0, **options), artifact)
    if a.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    engine = TorchEngine(artifact, spec, device_id=0, precision=a.precision, compile=a.compile)
    seq = a.seq if spec.variable_seq else None
    layout = Layout(spec, max(batches), seq)
    bufs = {
        t.name: torch.ones(layout.max_items * Layout.per_item(t, seq), dtype=getattr(torch, t.dtype), device="cuda")
        for t in spec.inputs
    }
    outs = {
        t.name: torch.zeros(layout.max_items * Layout.per_item(t, seq), dtype=getattr(torch, t.dtype), device="cuda")
        for t in spec.outputs
    }
    engine.bind(
        0,
        SlotBuffers(
            inputs={k: (v.data_ptr(), v.numel() * v.element_size()) for k, v in bufs.items()},
            outputs={k: (v.data_ptr(), v.numel() * v.element_size()) for k, v in outs.items()},
        ),
    )
    stream = torch.cuda.Stream()
    buckets = [profile_bucket(engine, b, seq, stream) for b in batches]
    doc: dict[str, Any] = {
        "kind": "engine_profile",
        "device": torch.cuda.get_device_name(0),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
        "engine": engine.describe(),
        "module_options": options,
        "cudnn_sdp": not a.no_cudnn_sdp,
        "inductor_config": inductor,
        "max_abs_error_vs_fp32_cpu": max_abs_error(engine, spec, seq),
        "buckets": buckets,
    }
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    for b in buckets:
        print(
            f"batch {b['batch']} seq {b['seq']}: replay {b['replay_us']:.1f} us, kernels {b['kernel_us_sum']:.1f} us "
            f"in {b['kernels_per_batch']:.0f} launches ({b['gemm_us']:.1f} us in GEMM kernels)"
        )
        for k in b["kernels"][:25]:
            print(f"  {k['us']:8.1f} us  x{k['calls']:.0f}  {k['kernel'][:110]}")


if __name__ == "__main__":
    main()
