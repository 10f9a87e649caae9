"""The served heads (their output-preserving rewrites) against the published heads, on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inflight.build.export import export_torch  # noqa: E402
from inflight.models import MODELS  # noqa: E402
from inflight.runtime.engines.torch_engine import TorchHostEngine, _compile_mode  # noqa: E402

REWRITTEN = ["linear_head"]


@pytest.mark.parametrize("model", REWRITTEN)
def test_rewritten_head_matches_the_published_head(model: str) -> None:
    spec = MODELS[model]
    assert spec.reference_options, f"{model} names the options of its unmodified form"
    served, published = spec.make_module(0), spec.make_module(0, **spec.reference_options)
    x = torch.from_numpy(spec.example_inputs(17, rng=np.random.default_rng(1))["features"])
    with torch.inference_mode():
        got, want = served(x), published(x)
        other = spec.make_module(1, **spec.reference_options)(x)
    assert got.shape == want.shape == (17, 2)
    assert float((got - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))
    # another seed's head gives another output: the comparison is not vacuous
    assert float((other - want).abs().max()) > 1e-3 * float(want.abs().max())


@pytest.mark.parametrize("model", REWRITTEN)
def test_exported_rewritten_head_runs_on_the_host_engine(model: str, tmp_path: Path) -> None:
    """The served artifact (torch.export of the rewritten head) loads and matches the published head."""
    spec = MODELS[model]
    art = tmp_path / "model.pt2"
    export_torch(spec, spec.make_module(0), art)
    engine = TorchHostEngine(art, spec)
    x = spec.example_inputs(5, rng=np.random.default_rng(2))
    got = np.zeros((5, 2), np.float32)
    try:
        engine.run(x, {"logits": got})
    finally:
        engine.close()
    with torch.inference_mode():
        want = spec.make_module(0, **spec.reference_options)(torch.from_numpy(x["features"])).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize(
    ("model", "on_gpu", "want"),
    [
        ("bert_tiny", True, "inductor"),
        ("seqlen_head", True, "inductor"),
        ("linear_head", True, "none"),
        ("stacked_head", True, "none"),
        ("linear_head", False, "none"),
        ("seqlen_head", False, "none"),
    ],
)
def test_auto_compile_is_the_models_measured_choice_on_a_gpu(model: str, on_gpu: bool, want: str) -> None:
    spec = MODELS[model]
    assert _compile_mode("auto", spec, on_gpu) == want
    assert _compile_mode("inductor", spec, on_gpu) == "inductor"


@pytest.mark.parametrize("model", ["linear_head", "stacked_head", "seqlen_head"])
def test_engine_bench_compares_the_served_head_with_the_engine_before(model: str) -> None:
    from inflight.bench.config import variants_for

    spec = MODELS[model]
    variants = variants_for(model, "fp16")
    served = variants[0]
    assert "(served)" in served.label and served.compile == spec.gpu_compile and served.module is None
    assert {v.compile for v in variants} == {"inductor", "none"}
    before = [v for v in variants if "the engine before" in v.label]
    assert len(before) == 1 and before[0].compile == "inductor"
    assert before[0].module == (tuple(sorted(spec.reference_options.items())) or None)
