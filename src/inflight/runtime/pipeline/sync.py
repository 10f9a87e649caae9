"""``SyncExecutor``: the stock-equivalent baseline, one slot, the caller blocked until the device is done."""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np

from inflight.runtime.batch import Batch
from inflight.runtime.pipeline.base import ExecutorBase
from inflight.runtime.pipeline.contract import Ranges
from inflight.runtime.runners import Runner


class SyncExecutor(ExecutorBase):
    """Stock-equivalent: one slot, wait for the device after each batch."""

    #: The sync mode's ring: one slot (``assembly.ring_slots`` reads it for the engine's bindings).
    SLOTS: ClassVar[int] = 1

    def __init__(self, runner: Runner, ranges: Ranges | None = None) -> None:
        super().__init__(runner, ranges)
        self.slots = runner.make_slots(self.SLOTS)

    def run(self, batch: Batch) -> list[dict[str, np.ndarray]]:
        """Execute ``batch`` and return per-request output views (valid until the next ``run``).

        Raises:
            EngineError: when the batch failed on the device.
            ClosedError: after ``close()``.
        """
        self._check_open()
        (slot,) = self.slots
        t0 = time.perf_counter()
        self._count_sole_slot(t0)
        return self._run_in_band(slot, batch)

    def in_flight(self) -> int:
        """Batches on the device between calls: none."""
        return 0

    def close(self, timeout_s: float = 10.0) -> bool:
        """Release the runner (nothing is in flight between calls); always drained."""
        if not self._closed:
            self._closed = True
            self.runner.close()
        return True
