"""The TensorRT engine through the pipelined executor, where TensorRT runs on this GPU.

Skips with the reason where neither ``tensorrt`` nor ``tensorrt_rtx`` imports, and where the
runtime refuses this GPU (TensorRT-RTX 1.7 refuses compute capability 9.0: H100/H200).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import Collect

from inflight.errors import EngineError
from inflight.models import MODELS
from inflight.models.reference import error_bound, relative_error
from inflight.runtime.batch import Batch, Buckets, Item, Layout, pow2_buckets
from inflight.runtime.engines.tensorrt_engine import import_tensorrt

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trt_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mod = import_tensorrt()
    if mod is None:
        pytest.skip("neither `tensorrt` nor `tensorrt_rtx` is importable here: the TensorRT engine cannot run")
    from inflight.build.repository import build_model

    sys.path.insert(0, str(ROOT / "scripts"))
    from build_engine import build_plan

    repo = tmp_path_factory.mktemp("trt-repo")
    build_model(repo, "bert_tiny", onnx=True)
    plan = build_plan(
        repo / "bert_tiny_trt" / "1" / "model.onnx",
        model="bert_tiny",
        profiles=2,
        max_batch=256,
        opt_batch=256,
        max_seq=64,
        opt_seq=64,
        fp16=True,
    )
    path = repo / "bert_tiny_inflight" / "1" / "model.plan"
    path.write_bytes(plan)
    return path


def test_tensorrt_engine_pipelined_matches_reference(trt_plan: Path) -> None:
    from inflight.models.reference import reference_outputs
    from inflight.runtime.engines.tensorrt_engine import TensorRTEngine
    from inflight.runtime.pipeline import PipelinedExecutor
    from inflight.runtime.runners import CudaRunner

    spec = MODELS["bert_tiny"]
    try:
        engine = TensorRTEngine(trt_plan, spec, device_id=0, slots=2)
    except EngineError as e:
        if "compute capabilit" in str(e).lower():
            pytest.skip(f"the TensorRT runtime refuses this GPU: {e}")
        raise
    runner = CudaRunner(engine, Layout(spec, 256, 64), Buckets(pow2_buckets(256), (16, 32, 64)), device_id=0)
    sink = Collect()
    ex = PipelinedExecutor(runner, sink, slots=2, response_threads=2)
    runner.warmup((64,))
    rng = np.random.default_rng(3)
    items = []
    for k, (n, s) in enumerate([(1, 64), (7, 33), (100, 64), (256, 16)]):
        item = Item(inputs=spec.example_inputs(n, seq_len=s, rng=rng), count=n, seq=s, handle=k)
        items.append(item)
        ex.submit(Batch([item]))
    sink.wait(len(items), 60)
    assert ex.close(30)
    repo = trt_plan.parents[2]
    for item in items:
        out, err = sink.got[item.handle]
        assert err is None, err
        ref = reference_outputs(repo, "bert_tiny", item.inputs)  # type: ignore[arg-type]
        assert relative_error(out["cls"], ref) <= error_bound(True)
