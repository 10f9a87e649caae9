"""An out-of-memory launch on the GPU fails its batch alone: the engine returns the cache, counts it, says what to do.

The allocation failure itself needs a GPU filled to the brim; these run the engine's handling of it on
the CPU host with the allocator's ``empty_cache`` recorded.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from inflight.errors import EngineError
from inflight.runtime.engines.torch_engine import GraphKey, TorchEngine


def _engine(calls: list[str]) -> Any:
    cuda = SimpleNamespace(empty_cache=lambda: calls.append("empty_cache"))
    fake: Any = SimpleNamespace(_torch=SimpleNamespace(cuda=cuda), counters={"out_of_memory": 0})
    fake._free_after_out_of_memory = lambda: TorchEngine._free_after_out_of_memory(fake)
    return fake


def test_an_out_of_memory_launch_frees_the_cache_counts_it_and_says_what_to_lower() -> None:
    calls: list[str] = []
    engine = _engine(calls)
    e = RuntimeError("CUDA out of memory. Tried to allocate 1024.00 MiB\nGPU 0 has a total capacity of 79.19 GiB")
    err = TorchEngine._out_of_memory(engine, GraphKey(rows=512, seq=128), e)
    assert isinstance(err, EngineError)
    text = str(err)
    assert "Tried to allocate 1024.00 MiB" in text and "total capacity" not in text  # the first line only
    assert "this batch failed and the instance serves the next one" in text
    assert "inflight build-models" in text and "max_batch_size" in text
    assert calls == ["empty_cache"] and engine.counters["out_of_memory"] == 1
    TorchEngine._out_of_memory(engine, GraphKey(rows=512, seq=128), e)
    assert calls == ["empty_cache"] * 2 and engine.counters["out_of_memory"] == 2
