"""The builder's artifacts are the model: torch.export and ONNX outputs equal the PyTorch module's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inflight.build.repository import build_model
from inflight.models import MODELS
from inflight.models.artifact import load_module
from inflight.models.reference import relative_error

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("model", ["bert_tiny", "linear_head"])
def test_exported_artifacts_match_the_module(tmp_path: Path, model: str) -> None:
    import onnxruntime as ort
    import torch

    summary = build_model(tmp_path, model, onnx=True)
    assert summary["parameters"] == sum(p.numel() for p in MODELS[model].make_module(0).parameters())
    for variant in ("inflight", "sync", "trt", "null"):
        assert (tmp_path / f"{model}_{variant}" / "config.pbtxt").is_file()
    pt2 = tmp_path / f"{model}_inflight" / "1" / "model.pt2"
    assert (tmp_path / f"{model}_sync" / "1" / "model.pt2").stat().st_ino == pt2.stat().st_ino, "not hard-linked"
    spec = MODELS[model]
    module = spec.make_module(0)
    exported = load_module(pt2)  # the path every user of an artifact takes (the fused kernels registered)
    session = ort.InferenceSession(str(tmp_path / f"{model}_trt" / "1" / "model.onnx"))
    rng = np.random.default_rng(5)
    for batch, seq in ((1, 1), (3, 17), (64, 64)):
        x = spec.example_inputs(batch, seq_len=seq if spec.variable_seq else None, rng=rng)
        args = [torch.from_numpy(x[t.name]) for t in spec.inputs]
        with torch.inference_mode():
            ref = module(*args).numpy()
            got_pt2 = exported(*args).numpy()
        got_onnx = session.run(None, x)[0]
        assert relative_error(got_pt2, ref) <= 1e-6
        assert relative_error(got_onnx, ref) <= 1e-4


def test_ensure_built_builds_only_what_is_missing_or_stale(tmp_path: Path) -> None:
    from inflight.build.repository import artifacts_current, ensure_built

    assert ensure_built(tmp_path, ["linear_head"]) == ["linear_head"]
    assert artifacts_current(tmp_path, "linear_head")
    assert ensure_built(tmp_path, ["linear_head"]) == []  # current: nothing to do
    assert ensure_built(tmp_path, ["linear_head"], seed=1) == ["linear_head"]  # another seed is stale
