"""The load test's reference outputs: the model's served artifact run in PyTorch on the CPU (fp32)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from inflight.errors import ConfigError
from inflight.models.artifact import load_module
from inflight.models.registry import get_model
from inflight.models.spec import ModelSpec

if TYPE_CHECKING:
    pass


LOGGER = logging.getLogger(__name__)


def artifact_path(repository: Path, model: str) -> Path:
    """The Torch artifact the backend serves, ``<repo>/<model>_inflight/1/model.pt2``."""
    from inflight.variants import base_name

    return Path(repository) / f"{base_name(model)}_inflight" / "1" / "model.pt2"


def reference_outputs(
    repository: Path, model: str, inputs: Sequence[Mapping[str, np.ndarray]], spec: ModelSpec | None = None
) -> list[dict[str, np.ndarray]]:
    """Run the model's artifact in PyTorch on the CPU (fp32) for each input set.

    Raises:
        ConfigError: when the artifact is missing.
    """
    path = artifact_path(repository, model)
    if not path.is_file():
        raise ConfigError(
            f"--check needs the model artifact {path}; pass --repository with the model repository the server "
            "uses (build it with `inflight build-models`)"
        )
    import torch

    spec = spec if spec is not None else get_model(model)
    module = load_module(path)
    out: list[dict[str, np.ndarray]] = []
    with torch.no_grad():
        for x in inputs:
            y = module(*(torch.from_numpy(np.ascontiguousarray(x[t.name])) for t in spec.inputs))
            ys = y if isinstance(y, (tuple, list)) else (y,)
            out.append({t.name: v.detach().float().numpy() for t, v in zip(spec.outputs, ys, strict=True)})
    LOGGER.info("computed %d reference outputs for %s from %s", len(out), model, path)
    return out
