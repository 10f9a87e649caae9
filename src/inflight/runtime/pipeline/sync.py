"""``SyncExecutor``: the stock-equivalent baseline, one slot, the caller blocked until the device is done."""

from __future__ import annotations

import time
from typing import ClassVar

from inflight.runtime.batch import Batch
from inflight.runtime.pipeline.base import ExecutorBase
from inflight.runtime.pipeline.contract import Ranges, ResponseSink
from inflight.runtime.runners import Runner


class SyncExecutor(ExecutorBase):
    """Stock-equivalent: one slot, wait for the device after each batch."""

    #: The sync mode's ring: one slot (``assembly.ring_slots`` reads it for the engine's bindings).
    SLOTS: ClassVar[int] = 1

    def __init__(self, runner: Runner, ranges: Ranges | None = None) -> None:
        super().__init__(runner, ranges)
        self.slots = runner.make_slots(self.SLOTS)

    def run(self, batch: Batch, sink: ResponseSink) -> None:
        """Execute ``batch`` and report each request's outcome to ``sink`` (by its handle) before returning.

        The outputs are views of the slot's buffers, valid during ``send`` only. A batch that failed
        is answered with errors (``failed_on_device``); the executor carries on.

        Raises:
            ClosedError: after ``close()``.
        """
        self._check_open()
        (slot,) = self.slots
        t0 = time.perf_counter()
        self._count_sole_slot(t0)
        self._answer_in_band(slot, batch, sink)

    def in_flight(self) -> int:
        """Batches on the device between calls: none."""
        return 0

    def close(self, timeout_s: float = 10.0) -> bool:
        """Release the runner (nothing is in flight between calls); always drained."""
        if not self._closed:
            self._closed = True
            self.runner.close()
        return True
