"""``SlotRing``: the slots of a ring, the free ones and the busy ones, and back-pressure."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from inflight.errors import ShuttingDownError
from inflight.runtime.batch import Slot
from inflight.runtime.pipeline.contract import SHUTTING_DOWN, Ranges
from inflight.runtime.pipeline.stats import ExecutorStats


class SlotRing:
    """The slots of a ring: the free ones, the busy ones, and back-pressure.

    ``acquire`` takes the free slot released last (its buffers the warmest in the host's caches: ``auto``'s
    in-band batches, each released before the next is taken, all run on one slot as the sync mode's do),
    waiting for one when every slot is busy (counted in ``slot_waits``); ``release`` returns one;
    ``drain`` waits for the busy ones at close and marks those still busy abandoned, so that their late
    completion frees nothing.

    Args:
        slots: The slots (made once by the runner).
        stats: The executor's counters (depth and waits).
        lock: The executor's lock (the ring's condition uses it).
        ranges: NVTX ranges.
        waiting: While ``acquire`` waits, what lets the response path run (the executor's ``IssueGate.waiting``;
            none by default).
    """

    def __init__(
        self,
        slots: list[Slot],
        stats: ExecutorStats,
        lock: threading.Lock,
        ranges: Ranges,
        waiting: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> None:
        self.slots = slots
        self.stats = stats
        self.ranges = ranges
        self._waiting = waiting
        self._free: deque[Slot] = deque(slots)
        self._busy: set[int] = set()
        self._cond = threading.Condition(lock)
        self._closing = False
        self._abandoned: set[int] = set()

    def in_flight(self) -> int:
        """Slots currently holding a batch on the device."""
        with self._cond:
            return len(self._busy)

    def acquire(self) -> Slot:
        """A free slot, marked busy (waits for one while every slot is busy).

        Raises:
            ShuttingDownError: when the ring is closing.
        """
        with self._cond:
            if not self._free and not self._closing:
                t0 = time.perf_counter()
                self.stats.slot_waits += 1
                with self._waiting(), self.ranges.range("slot_wait"):
                    while not self._free and not self._closing:
                        self._cond.wait()
                self.stats.slot_wait_s += time.perf_counter() - t0
            if self._closing:
                raise ShuttingDownError(SHUTTING_DOWN)
            slot = self._free.pop()  # the one released last
            self._busy.add(slot.index)
            depth = len(self._busy)
            self.stats.depth_launches[min(depth, 64)] += 1
            self.stats.max_depth = max(self.stats.max_depth, depth)
            return slot

    def unshared(self) -> Slot:
        """The slot ``acquire`` would hand out, without taking it: for a ring no other thread uses yet.

        Raises:
            ShuttingDownError: when the ring is closing.
        """
        if self._closing:
            raise ShuttingDownError(SHUTTING_DOWN)
        return self._free[-1]

    def release(self, slot: Slot) -> bool:
        """Return ``slot`` to the free list; False (and nothing freed) when ``drain`` abandoned it."""
        with self._cond:
            if slot.index in self._abandoned:
                return False
            slot.batch = None
            self._busy.discard(slot.index)
            self._free.append(slot)
            self._cond.notify()
            return True

    def drain(self, deadline: float) -> list[Slot]:
        """Refuse new work, wait until ``deadline`` for the busy slots; return (and abandon) those still busy."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while self._busy and time.monotonic() < deadline:
                self._cond.wait(timeout=max(0.0, deadline - time.monotonic()))
            stuck = [s for s in self.slots if s.index in self._busy]
            self._abandoned.update(s.index for s in stuck)
        return stuck
