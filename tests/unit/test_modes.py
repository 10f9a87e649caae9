"""The modes over real executors on the CPU runner, with Triton's request and response objects faked.

``auto``: each batch in-band (the sync mode's path) or deferred (the pipelined mode's), by the
overlap bound its in-band batches measure (``AutoPolicy``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from tests.helpers import TOY_SPEC

from inflight.errors import ValidationError
from inflight.runtime.batch import Buckets, Layout
from inflight.runtime.engines.base import HostEngine
from inflight.runtime.executor import AutoPolicy, PipelinedExecutor, SyncExecutor
from inflight.runtime.modes import Answering, AutoMode, Rejections, SyncMode, TritonSink
from inflight.runtime.runners import CpuRunner

SPEC = TOY_SPEC


class SlowEngine(HostEngine):
    """y = [sum(x), len] per row, after ``delay_s`` (the device's part of a batch)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def describe(self) -> str:
        return "slow toy"

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        time.sleep(self.delay_s)
        x = inputs["x"]
        outputs["y"][:, 0] = x.sum(axis=1)
        outputs["y"][:, 1] = x.shape[1]

    def close(self) -> None:
        pass


class FakePb:
    """The parts of ``triton_python_backend_utils`` the modes use."""

    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

    class TritonError:
        INVALID_ARG = 3

        def __init__(self, message: str, code: int | None = None) -> None:
            self.message = message
            self.code = code

    class Tensor:
        def __init__(self, name: str, array: np.ndarray) -> None:
            self.name = name
            self.array = array.copy()

    class InferenceResponse:
        def __init__(self, output_tensors: list[Any], error: Any = None) -> None:
            self.outputs = {t.name: t.array for t in output_tensors}
            self.error = error


class Sender:
    def __init__(self, request: Request) -> None:
        self.request = request

    def send(self, response: Any, flags: int = 0) -> None:
        assert flags == FakePb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self.request.lock:
            assert self.request.sent is None, "two responses for one request"
            self.request.sent = response
        self.request.done.set()


class Request:
    def __init__(self, x: np.ndarray) -> None:
        self.x = x
        self.sent: Any = None
        self.senders_taken = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self._sender = Sender(self)

    def get_response_sender(self) -> Sender:
        self.senders_taken += 1
        return self._sender


def _read(request: Request) -> tuple[dict[str, np.ndarray], int, int | None]:
    x = request.x
    if (x < 0).any():
        raise ValidationError("negative value in x", "value")
    return {"x": x}, len(x), int(x.shape[1])


def _answering() -> Answering:
    sink = TritonSink(FakePb)
    from inflight.runtime.executor import _NoRanges

    return Answering(SPEC, _read, sink, Rejections(sink, "toy"), _NoRanges())


def _runner(delay_s: float) -> CpuRunner:
    return CpuRunner(SlowEngine(delay_s), Layout(SPEC, 64, 16), Buckets(tuple(range(1, 65)), tuple(range(1, 17))))


def _auto(delay_s: float, policy: AutoPolicy) -> AutoMode:
    ring = PipelinedExecutor(_runner(delay_s), TritonSink(FakePb), slots=3, response_threads=2)
    return AutoMode(ring, _answering(), policy)


def _batch(rng: np.random.Generator, n: int = 4) -> list[Request]:
    return [Request(rng.integers(0, 100, size=(int(rng.integers(1, 5)), 6))) for _ in range(n)]


def _answer(request: Request, returned: Any) -> Any:
    """The response a request got: the one returned by execute(), or the one sent through its sender."""
    if returned is not None:
        assert request.sent is None, "a request answered twice"
        return returned
    assert request.done.wait(10), "a deferred request was never answered"
    return request.sent


def _expect(x: np.ndarray) -> np.ndarray:
    return np.stack([x.sum(axis=1), np.full(len(x), x.shape[1])], axis=1).astype(np.float32)


def test_auto_policy_measures_the_overlap_bound_and_defers_from_bound_min() -> None:
    p = AutoPolicy(bound_min=1.25, explore_every=4, explore_max=16)
    assert p.decide() == (False, "unmeasured")
    p.between(0.003)
    p.ran(0.002, 0.001)  # cycle 5 ms, 1 ms of it the device wait: 5 / 4
    assert p.bound == pytest.approx(1.25)
    decisions = [p.decide() for _ in range(60)]
    explored = [i + 1 for i, d in enumerate(decisions) if d == (False, "explored")]
    assert explored == [4, 12, 28, 44, 60]  # the period doubles from explore_every to explore_max
    assert all(d == (True, "deferred") for i, d in enumerate(decisions) if i + 1 not in explored)
    # an idle instance: long gaps waiting for requests, the device wait a small part of the cycle
    for _ in range(60):
        p.between(0.1)
        p.ran(0.002, 0.001)
    assert p.bound is not None and p.bound < 1.02
    assert p.decide() == (False, "inline")
    # deferring again starts the exploration period from explore_every
    p.bound = 2.0
    assert [p.decide()[1] for _ in range(4)] == ["deferred"] * 3 + ["explored"]
    never = AutoPolicy(bound_min=1.0, explore_every=0, bound=1.0)
    assert {never.decide() for _ in range(100)} == {(True, "deferred")}


def test_auto_defers_when_the_device_wait_is_most_of_the_cycle_and_answers_every_request() -> None:
    rng = np.random.default_rng(1)
    mode = _auto(0.02, AutoPolicy(bound_min=1.25, explore_every=4, explore_max=8))
    sent: list[tuple[Request, Any]] = []
    for _ in range(14):
        mode.between_executes(0.0005)  # the next batch was waiting: the gap is the stub's own work
        batch = _batch(rng)
        out = mode.execute(batch)
        sent += list(zip(batch, out if out is not None else [None] * len(batch), strict=True))
    assert mode.close(10)
    st = mode.stats
    # the first batch measured the bound in-band (20 ms wait in a cycle of about 20.5 ms); then
    # deferred, with in-band measurements after 4 and 12 deferred batches
    assert (st.auto_inline, st.auto_explored, st.auto_deferred) == (1, 2, 11), st.snapshot()
    assert st.auto_bound > 10 and st.deferred_requests == 11 * 4
    for request, returned in sent:
        response = _answer(request, returned)
        assert response.error is None
        np.testing.assert_array_equal(response.outputs["y"], _expect(request.x))


def test_an_idle_auto_instance_answers_in_band_exactly_as_the_sync_mode() -> None:
    """Long gaps between calls: the bound stays near 1, every batch takes the sync mode's path."""
    rng = np.random.default_rng(2)
    auto = _auto(0.002, AutoPolicy(bound_min=1.25, explore_every=4))
    sync = SyncMode(SyncExecutor(_runner(0.002)), _answering())
    for _ in range(10):
        auto.between_executes(0.05)
        sync.between_executes(0.05)
        batch = _batch(rng)
        twin = [Request(r.x.copy()) for r in batch]
        got = auto.execute(batch)
        want = sync.execute(twin)
        assert got is not None
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a.outputs["y"], b.outputs["y"])
        assert all(r.senders_taken == 0 and r.sent is None for r in batch), "an in-band batch used a sender"
    assert auto.close(10) and sync.close(10)
    st = auto.stats
    assert st.auto_inline == 10 and st.auto_deferred == 0 and st.auto_explored == 0
    assert 1.0 < st.auto_bound < 1.1


def test_auto_refuses_a_bad_request_alone_on_either_path() -> None:
    rng = np.random.default_rng(3)
    mode = _auto(0.01, AutoPolicy(bound_min=1.0, explore_every=0))
    for _ in range(2):  # the first in-band (unmeasured), the second deferred
        mode.between_executes(0.0)
        batch = _batch(rng, 3)
        batch[1].x[0, 0] = -1
        out = mode.execute(batch)
        answers = [_answer(r, None if out is None else out[i]) for i, r in enumerate(batch)]
        assert answers[1].error is not None and "negative value" in answers[1].error.message
        assert answers[1].error.code == FakePb.TritonError.INVALID_ARG
        for i in (0, 2):
            np.testing.assert_array_equal(answers[i].outputs["y"], _expect(batch[i].x))
    st = mode.stats
    assert (st.auto_inline, st.auto_deferred) == (1, 1)
    assert mode.rejections.total == 2
    assert mode.close(10)


def test_auto_fails_a_broken_execute_through_the_path_its_batch_took() -> None:
    rng = np.random.default_rng(4)
    mode = _auto(0.01, AutoPolicy(bound_min=1.0, explore_every=0))
    mode.between_executes(0.0)
    assert mode.execute(_batch(rng, 2)) is not None  # in-band: measures the bound
    batch = _batch(rng, 2)
    assert mode.execute(batch) is None  # deferred
    for r in batch:
        assert r.done.wait(10)
    # an execute() that raised after its batch was deferred: the answered requests are skipped
    # (their senders refuse a second response), and the mode returns None
    fresh = _batch(rng, 1)
    assert mode.fail([*batch, *fresh], "boom") is None
    assert fresh[0].sent is not None and fresh[0].sent.error.message == "boom"
    assert mode.close(10)


def test_auto_defers_from_1_25_on_a_gpu_and_never_on_a_cpu_unless_the_bound_is_set() -> None:
    import math

    from inflight.model_config import BackendParameters
    from inflight.runtime.assembly import auto_bound_min

    default = BackendParameters(mode="auto")
    assert auto_bound_min(default, on_device=True) == 1.25
    assert auto_bound_min(default, on_device=False) == math.inf
    p = AutoPolicy(bound_min=math.inf, bound=50.0)
    assert {p.decide() for _ in range(100)} == {(False, "inline")}
    for on_device in (True, False):
        assert auto_bound_min(BackendParameters(mode="auto", auto_bound_min=1.5), on_device=on_device) == 1.5
