"""The completion waiter: waits for launched slots, copies their outputs out, hands the responses on.

``collect`` is the wait-and-copy of one slot (the completion thread's, and the overlap executor's for
its chunks); ``Completion`` is the thread that runs it for the pipelined executor, in launch order,
and forwards each batch to the next stage it was built with.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from inflight.runtime.batch import Slot
from inflight.runtime.pipeline.contract import LOGGER, Ranges, failed_on_device
from inflight.runtime.pipeline.responses import Outgoing
from inflight.runtime.pipeline.stats import ExecutorStats
from inflight.runtime.runners import Runner


def collect(
    runner: Runner, ranges: Ranges, slot: Slot, range_name: str
) -> tuple[dict[str, np.ndarray] | None, str | None, float]:
    """Wait for the slot's batch and copy its real output rows out of the slot.

    Args:
        runner: The device resources the slot belongs to (it waits; the executor owns it).
        ranges: NVTX ranges (the wait is marked ``range_name``).
        slot: A launched slot.
        range_name: The wait's range.

    Returns:
        The private copy of the outputs (None when the batch failed), the error message
        (None when it did not), and the seconds from the start of the wait to the copy done.
    """
    batch = slot.batch
    assert batch is not None
    t0 = time.perf_counter()
    try:
        with ranges.range(range_name):
            runner.wait(slot)
    except Exception as e:
        LOGGER.error("batch of %d requests failed on the device: %s", len(batch.items), e)
        return None, failed_on_device(e), time.perf_counter() - t0
    # the responses get their own copy of the real rows, so the slot can be freed at once
    layout = runner.layout
    outs = {t.name: layout.view(slot.host_out[t.name], t, slot.rows, None).copy() for t in layout.spec.outputs}
    return outs, None, time.perf_counter() - t0


class Completion:
    """The completion thread: waits for launched slots in launch order and hands their responses on.

    For each slot it waits for the device and copies the outputs out of the slot (``collect``), frees
    the slot through ``release`` (unless ``SlotRing.drain`` abandoned it: its requests were failed
    already) and forwards the responses to ``forward`` (the response pool's ``dispatch``). It calls
    nothing of the executor that owns it.

    Args:
        runner: Waits for the device (the executor owns it and closes it).
        ranges: NVTX ranges.
        release: Returns a slot to the ring; False when the ring abandoned it (``SlotRing.release``).
        forward: Takes a completed batch's responses (``ResponsePool.dispatch``).
        stats: The executor's counters.
        lock: The executor's lock.
    """

    def __init__(
        self,
        runner: Runner,
        ranges: Ranges,
        release: Callable[[Slot], bool],
        forward: Callable[[Outgoing], None],
        stats: ExecutorStats,
        lock: threading.Lock,
    ) -> None:
        self._runner = runner
        self._ranges = ranges
        self._release = release
        self._forward = forward
        self._stats = stats
        self._lock = lock
        self._queue: queue.SimpleQueue[Slot | None] = queue.SimpleQueue()
        # started by the first slot handed over (see ResponsePool: in-band batches never need it)
        self.thread = threading.Thread(target=self._loop, name="inflight-completion", daemon=True)

    def put(self, slot: Slot) -> None:
        """Hand over a launched slot (the first one starts the thread; only the issue path calls this)."""
        if self.thread.ident is None:
            self.thread.start()
        self._queue.put(slot)

    def _loop(self) -> None:
        while True:
            slot = self._queue.get()
            if slot is None:
                return
            batch = slot.batch
            assert batch is not None
            outs, error, waited = collect(self._runner, self._ranges, slot, "complete")
            item_rows = list(slot.item_rows) if error is None else []
            with self._lock:
                if error is None:
                    self._stats.device_wait_s += waited
                else:
                    self._stats.failed_batches += 1
            if self._release(slot):
                self._forward(Outgoing(batch.items, outs, error, offsets=item_rows))

    def stop(self, deadline: float) -> None:
        """Stop after the slots handed over (waiting until ``deadline``, 1 s at least)."""
        if self.thread.ident is None:  # never started: no slot was handed over
            return
        self._queue.put(None)
        self.thread.join(timeout=max(1.0, deadline - time.monotonic()))
