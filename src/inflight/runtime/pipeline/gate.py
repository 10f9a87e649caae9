"""``IssueGate``: holds the sender threads off while the issue path gathers and launches.

The sender threads share the GIL with the execute thread, the one thread that decides throughput
(``PipelinedExecutor``'s ``yield_to_issue``). The executor owns the gate and hands it to the two
stages that need it: the ``ResponsePool``'s senders wait on it, and whatever the issue path waits on
(a free slot of the ``SlotRing``, room in the pool's backlog) opens it meanwhile (``waiting``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class IssueGate:
    """Open while the issue path is idle or waits; closed while it runs (with ``yield_to_issue``).

    Args:
        yield_to_issue: Close the gate while the issue path runs (False: it never closes).
    """

    def __init__(self, yield_to_issue: bool) -> None:
        self.yield_to_issue = yield_to_issue
        #: set while the senders may build responses; clear while ``execute()`` gathers and launches
        self.idle = threading.Event()
        self.idle.set()

    @contextlib.contextmanager
    def issuing(self) -> Iterator[None]:
        """Mark the issue path busy: sender threads hold off building responses meanwhile.

        Sends already in their round trip carry on (that part does not hold the GIL); the senders
        resume when the block ends or the issue path waits (``waiting``), so they can never be
        starved into a deadlock.
        """
        if not self.yield_to_issue:
            yield
            return
        self.idle.clear()
        try:
            yield
        finally:
            self.idle.set()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """The issue path waits (for a slot, for the backlog): the senders may run meanwhile.

        Outside ``issuing`` the gate is open already, and this does nothing.
        """
        busy = not self.idle.is_set()
        self.idle.set()
        try:
            yield
        finally:
            if busy:
                self.idle.clear()

    def open(self) -> None:
        """Nothing is issued any more (the executor closes): the senders must not wait for the issue path."""
        self.idle.set()
