"""The served bert_tiny (last layer for CLS only) against the unmodified encoder, on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inflight.build.export import export_torch  # noqa: E402
from inflight.models.bert import SPEC, make_module  # noqa: E402
from inflight.runtime.engines.torch_engine import TorchHostEngine  # noqa: E402


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
@pytest.mark.parametrize("seq", [1, 16, 64, 128])
def test_cls_only_matches_the_unmodified_model(seq: int, attention: str) -> None:
    full = make_module(0, cls_only=False)
    served = make_module(0, attention=attention)
    x = SPEC.example_inputs(33, seq_len=seq, rng=np.random.default_rng(seq))
    args = [torch.from_numpy(x[t.name]) for t in SPEC.inputs]
    with torch.inference_mode():
        want, got = full(*args), served(*args)
    assert got.shape == want.shape == (33, 128)
    assert float((got - want).abs().max()) <= 1e-5
    if seq > 1:  # a different mask changes the output: the check is not vacuous
        args[1] = torch.ones_like(args[1])
        with torch.inference_mode():
            assert float((served(*args) - want).abs().max()) > 1e-3


def test_explicit_cls_attention_matches_the_unmodified_model() -> None:
    """``cls_attention=explicit``: SDPA in the first layer, matmul-softmax-matmul for the CLS query."""
    full = make_module(0, cls_only=False)
    served = make_module(0, cls_attention="explicit")
    x = SPEC.example_inputs(9, seq_len=40, rng=np.random.default_rng(3))
    args = [torch.from_numpy(x[t.name]) for t in SPEC.inputs]
    with torch.inference_mode():
        assert float((served(*args) - full(*args)).abs().max()) <= 1e-5


def test_unknown_attention_is_refused() -> None:
    with pytest.raises(ValueError, match="attention="):
        make_module(0, attention="flash")
    with pytest.raises(ValueError, match="cls_attention="):
        make_module(0, cls_attention="flash")


def test_inductor_compiled_engine_matches_eager_on_cpu(tmp_path: Path) -> None:
    """torch.compile (inductor, dynamic shapes) of the exported artifact: one program, several shapes."""
    art = tmp_path / "model.pt2"
    export_torch(SPEC, make_module(0), art)
    eager = TorchHostEngine(art, SPEC, compile="none")
    compiled = TorchHostEngine(art, SPEC, compile="inductor")
    assert compiled.compiled and not eager.compiled and "inductor-compiled" in compiled.describe()
    for rows, seq in ((3, 16), (17, 40)):
        x = SPEC.example_inputs(rows, seq_len=seq, rng=np.random.default_rng(rows))
        a = np.zeros((rows, 128), np.float32)
        b = np.zeros((rows, 128), np.float32)
        eager.run(x, {"cls": a})
        compiled.run(x, {"cls": b})
        assert np.abs(a - b).max() <= 1e-4
    eager.close()
    compiled.close()
