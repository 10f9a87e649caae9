"""Reference outputs: the same model artifact run in PyTorch on the CPU, in fp32.

Tests and ``locust --check`` compare served outputs with these.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from inflight.models.artifact import load_module
from inflight.models.registry import get_model

_LOCK = threading.Lock()


@functools.lru_cache(maxsize=8)
def _module(artifact: str) -> Any:
    return load_module(Path(artifact))


def artifact_path(repository: Path | str, model: str) -> Path:
    """The Torch artifact of ``model`` (a base or variant name) in ``repository``."""
    spec = get_model(model)
    return Path(repository) / f"{spec.name}_inflight" / "1" / "model.pt2"


def reference_outputs(repository: Path | str, model: str, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """fp32 CPU outputs of ``model`` for ``inputs`` (thread-safe; the module is cached)."""
    import torch

    spec = get_model(model)
    module = _module(str(artifact_path(repository, model)))
    args = [torch.from_numpy(np.ascontiguousarray(inputs[t.name])) for t in spec.inputs]
    with _LOCK, torch.inference_mode():
        return np.asarray(module(*args).float().numpy())


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """Largest per-item ``||out - ref|| / ||ref||`` (NaN counts as an infinite error).

    An item whose reference norm is below the batch's RMS item norm is measured against that RMS
    instead: a head's two logits can both be near zero for one item, and fp16 rounding of them is
    not a large error of the model (a lone item keeps its own norm).
    """
    out = np.asarray(out, np.float64).reshape(len(out), -1)
    ref = np.asarray(ref, np.float64).reshape(len(ref), -1)
    if out.shape != ref.shape:
        raise ValueError(f"shape {out.shape} differs from the reference's {ref.shape}")
    num = np.linalg.norm(out - ref, axis=1)
    norms = np.linalg.norm(ref, axis=1)
    floor = float(np.sqrt(np.mean(norms**2))) if len(norms) else 0.0
    den = np.maximum(norms, max(floor, 1e-12))
    err = num / den
    return float("inf") if not np.all(np.isfinite(err)) else float(err.max(initial=0.0))


def error_bound(gpu: bool) -> float:
    """Accepted ``relative_error``: fp32 on the CPU, fp16 on the GPU."""
    return 2e-2 if gpu else 1e-5
