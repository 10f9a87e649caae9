"""Time the fused feed-forward kernel (``inflight::ffn_ln``) per tile configuration and erf, on a GPU.

For each token count (bert_tiny's hidden 128 and ffn 512, fp16): every ``(rows per program, ffn
columns per step, warps, stages)`` of the grid below with both erf implementations, timed with
CUDA events over back-to-back launches, with the max abs error against the fp32 definition; and
the unfused PyTorch ops (two cuBLAS GEMMs, the GELU, the residual and the layer norm, eager) for
scale. Writes a JSON and prints the fastest configurations.

Usage (GPU host): python3 scripts/lab/tune_ffn_kernel.py --out ffn_configs.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
from pathlib import Path
from typing import Any

CONFIGS = [
    (bm, bf, w, st)
    for bm, bf, w, st in itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (2, 3))
    if not (bm == 32 and w == 8) and not (bm == 128 and bf == 128)
]


def main() -> None:
    """Time every configuration and write the JSON."""
    import torch

    from inflight.models import kernels as K
    from inflight.models import triton_kernels as T

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, action="append")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    dev = torch.device("cuda:0")
    g = torch.Generator(device=dev).manual_seed(0)
    h, ff, dt = 128, 512, torch.float16

    def rnd(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=dev) * scale + shift).to(dt)

    w1, b1, w2, b2 = rnd(ff, h, scale=0.05), rnd(ff, scale=0.1), rnd(h, ff, scale=0.05), rnd(h, scale=0.1)
    gain, beta = rnd(h, scale=0.1, shift=1.0), rnd(h, scale=0.1)

    def fused(x: Any, config: Any = None) -> Any:
        return T.triton_ffn_ln(x, w1, b1, w2, b2, gain, beta, 1e-12, config=config)

    def unfused(x: Any) -> Any:
        return K.ffn_ln_reference(x, w1, b1, w2, b2, gain, beta, 1e-12)

    def timed(fn: Any, iters: int) -> float:
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / iters

    rows_out = []
    for rows in a.rows or [2048 * 64, 512 * 64]:
        x = rnd(rows, h)
        f32 = [t.float() for t in (w1, b1, w2, b2, gain, beta)]
        ref = K.ffn_ln_reference(x.float(), f32[0], f32[1], f32[2], f32[3], f32[4], f32[5], 1e-12)
        unfused_us = timed(lambda x=x: unfused(x), a.iters)
        entry: dict[str, Any] = {"rows": rows, "unfused_eager_us": unfused_us, "configs": []}
        for cfg in CONFIGS:
            for erf in ("libdevice", "poly"):
                c = (*cfg, erf)
                try:
                    y = fused(x, c)
                    err = (y.float() - ref).abs().max().item()
                    us = timed(lambda x=x, c=c: fused(x, c), a.iters)
                except Exception as e:  # a tile that does not fit (shared memory, registers): recorded, skipped
                    entry["configs"].append({"config": list(c), "error": f"{type(e).__name__}: {str(e)[:200]}"})
                    continue
                entry["configs"].append({"config": list(c), "us": us, "max_abs_error": err})
        ok = sorted((r for r in entry["configs"] if "us" in r), key=lambda r: r["us"])
        entry["default"] = {"config": list(T.ffn_block_rows(rows)), "erf": T.FFN_ERF}
        entry["default_us"] = timed(lambda x=x: fused(x), a.iters)
        rows_out.append(entry)
        print(f"rows {rows}: unfused eager {unfused_us:.1f} us, default {entry['default_us']:.1f} us; fastest:")
        for r in ok[:8]:
            print(f"  {r['us']:8.1f} us  err {r['max_abs_error']:.1e}  {r['config']}")
    doc = {
        "kind": "ffn_kernel_configs",
        "device": torch.cuda.get_device_name(0),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "rows": rows_out,
    }
    a.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
