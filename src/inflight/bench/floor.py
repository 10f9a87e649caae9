"""The physical floor of a batch: its arithmetic and unavoidable memory traffic at peak rates.

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` on the model itself (matmuls and
attention; elementwise work is not counted). Bytes are what a batch must move at least once:
weights, inputs and outputs (activations that a perfect fusion keeps on chip are not counted).
The floor is ``max(FLOPs / peak FLOP/s, bytes / peak bandwidth)``; it is a bound, not a target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from inflight.models.spec import ModelSpec


@dataclass(frozen=True)
class Peak:
    """A device's dense peak rates (datasheet figures, no sparsity).

    Attributes:
        name: Which datasheet entry.
        tensor_flops: FP16/BF16 tensor-core FLOP/s with FP32 accumulation.
        fp32_flops: FP32 (non-tensor) FLOP/s.
        bandwidth: HBM bytes/s.
    """

    name: str
    tensor_flops: float
    fp32_flops: float
    bandwidth: float


#: Datasheet peaks (SXM parts): matched by substring of the CUDA device name, first match wins.
PEAKS: tuple[tuple[str, Peak], ...] = (
    (
        "H200",
        Peak(
            "H200 SXM: 989.5 TFLOP/s dense FP16/BF16 tensor, 67 TFLOP/s FP32, 4.8 TB/s HBM3e", 989.5e12, 67e12, 4.8e12
        ),
    ),
    (
        "H100",
        Peak(
            "H100 SXM: 989.5 TFLOP/s dense FP16/BF16 tensor, 67 TFLOP/s FP32, 3.35 TB/s HBM3", 989.5e12, 67e12, 3.35e12
        ),
    ),
    (
        "A100",
        Peak(
            "A100 SXM: 312 TFLOP/s dense FP16/BF16 tensor, 19.5 TFLOP/s FP32, 2.04 TB/s HBM2e", 312e12, 19.5e12, 2.04e12
        ),
    ),
)


def peak_for(device_name: str) -> Peak | None:
    """The datasheet peaks of ``device_name``, or None when this table does not know it."""
    for key, peak in PEAKS:
        if key in device_name:
            return peak
    return None


def batch_work(spec: ModelSpec, module: Any, rows: int, seq: int | None, precision: str) -> tuple[float, float]:
    """``(FLOPs, bytes)`` of one batch of ``rows`` items at length ``seq`` (counted on the CPU, fp32).

    Bytes: parameters at ``precision`` plus the inputs and outputs as served.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    x = spec.example_inputs(rows, seq_len=seq, rng=np.random.default_rng(0))
    args = [torch.from_numpy(x[t.name]) for t in spec.inputs]
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        module(*args)
    flops = float(counter.get_total_flops())
    width = 4 if precision == "fp32" else 2
    params = sum(p.numel() for p in module.parameters()) * width
    io = sum(a.nbytes for a in x.values()) + sum(
        rows * int(np.prod(t.dims)) * np.dtype(t.dtype).itemsize for t in spec.outputs
    )
    return flops, float(params + io)


def floor_us(flops: float, nbytes: float, peak: Peak, precision: str) -> float:
    """The floor in microseconds at ``peak`` (tensor cores for fp16/bf16, FP32 units for fp32)."""
    rate = peak.fp32_flops if precision == "fp32" else peak.tensor_flops
    return max(flops / rate, nbytes / peak.bandwidth) * 1e6
