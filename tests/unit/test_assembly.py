"""The one construction path on the CPU: what ``assemble`` builds from a configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from inflight.errors import ConfigError, EngineError
from inflight.model_config import BackendParameters
from inflight.models.bert import SPEC
from inflight.models.heads import LINEAR_SPEC
from inflight.runtime.assembly import assemble, capture_at_load, capture_order, seq_buckets_for
from inflight.runtime.engines import DeviceEngine, HostEngine, SlotBuffers


def test_sequence_buckets_end_at_the_models_longest_sequence() -> None:
    p = BackendParameters(seq_buckets=(16, 64))
    assert seq_buckets_for(SPEC, p) == (16, 64, SPEC.max_seq_len)
    assert seq_buckets_for(SPEC, BackendParameters(seq_buckets=(16, 64, 1024))) == (16, 64, SPEC.max_seq_len)
    assert seq_buckets_for(LINEAR_SPEC, p) is None
    assert capture_order((16, 64, 128), 64) == [64, 16, 128]


def test_cpu_instance_runs_exactly_what_arrived_and_captures_nothing(repository: Path) -> None:
    p = BackendParameters(seq_buckets=(16, 64))
    parts = assemble(p, SPEC, max_batch=32, version_dir=repository / "bert_tiny_inflight" / "1", device_id=None)
    try:
        assert parts.layout.max_items == 32 and parts.layout.max_seq == SPEC.max_seq_len
        assert parts.buckets.batch == tuple(range(1, 33)) and not parts.buckets.tokens
        assert parts.engine is parts.runner.engine and isinstance(parts.engine, HostEngine)
        parts.runner.make_slots(1)
        assert capture_at_load(parts, p) == (0, "")
    finally:
        parts.runner.close()


def test_a_missing_artifact_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="inflight build-models"):
        assemble(BackendParameters(), SPEC, max_batch=8, version_dir=tmp_path, device_id=None)


def test_tensorrt_on_a_cpu_instance_is_refused_with_the_fix(repository: Path) -> None:
    with pytest.raises(ConfigError, match="engine=torch on CPU"):
        assemble(
            BackendParameters(engine="tensorrt"),
            SPEC,
            max_batch=8,
            version_dir=repository / "bert_tiny_inflight" / "1",
            device_id=None,
        )


def test_engine_kinds_each_implement_their_whole_interface() -> None:
    """A device engine cannot be made without bind/enqueue, a host engine without run; neither has the other's."""

    class NoEnqueue(DeviceEngine):
        def describe(self) -> str:
            return ""

        def close(self) -> None:
            pass

        def bind(self, slot: int, buffers: SlotBuffers) -> None:
            pass

    with pytest.raises(TypeError, match="enqueue"):
        NoEnqueue()  # type: ignore[abstract]
    assert not hasattr(HostEngine, "enqueue") and not hasattr(HostEngine, "bind")
    assert not hasattr(DeviceEngine, "run")
    from inflight.runtime.engines.tensorrt_engine import TensorRTEngine
    from inflight.runtime.engines.torch_engine import TorchEngine, TorchHostEngine

    assert issubclass(TorchEngine, DeviceEngine) and issubclass(TensorRTEngine, DeviceEngine)
    assert issubclass(TorchHostEngine, HostEngine) and not issubclass(TorchHostEngine, DeviceEngine)
