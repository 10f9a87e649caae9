"""Stop requests from signals, taken without a lock, and the wait of ``inflight serve`` on them.

A Python signal handler runs in the main thread between two bytecodes, also while that thread is
inside ``threading.Event.wait`` holding the Event's lock; a handler that then calls ``Event.set``
waits for that lock forever (``inflight serve`` froze this way about once in 32 Ctrl+C). Here the
handler only counts (an integer attribute: no lock), and ``signal.set_wakeup_fd`` writes a byte
to a pipe that the waiting loop waits on with ``select``, so a signal ends the wait at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import Literal


class StopSignals:
    """Counts SIGINT/SIGTERM (or ``signals``) while installed; ``wait`` wakes on the next one.

    Install it in the main thread (``with StopSignals() as stops:``); the previous handlers and
    wakeup fd come back on exit.

    Attributes:
        count: Signals received since installed.
        last: The number of the last signal received, or None.
    """

    def __init__(self, signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
        self.signals = tuple(signal.Signals(s) for s in signals)
        self.count = 0
        self.last: int | None = None
        self._returned = 0
        self._fds: tuple[int, int] | None = None
        self._old_handlers: dict[signal.Signals, object] = {}
        self._old_wakeup = -1

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # no lock, no I/O: the wakeup fd has already been written by the interpreter's C handler
        self.count += 1
        self.last = signum

    def install(self) -> StopSignals:
        """Set the handlers and the wakeup fd (main thread only)."""
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._fds = (r, w)
        self._old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for s in self.signals:
            self._old_handlers[s] = signal.signal(s, self._on_signal)
        return self

    def restore(self) -> None:
        """Put the previous handlers and wakeup fd back and close the pipe; safe to call twice."""
        for s, old in self._old_handlers.items():
            signal.signal(s, old)  # type: ignore[arg-type]
        self._old_handlers.clear()
        if self._fds is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            for fd in self._fds:
                os.close(fd)
            self._fds = None

    def wait(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for a signal this method has not returned for yet; return ``count``.

        A signal that came before the call (and after the previous return) ends it at once.
        """
        if self._fds is None:
            raise RuntimeError("StopSignals.wait() before install(); use `with StopSignals() as stops:`")
        deadline = time.monotonic() + timeout_s
        while self.count == self._returned:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            readable, _, _ = select.select([self._fds[0]], [], [], left)
            if readable:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._fds[0], 512):
                        pass
        self._returned = self.count
        return self.count

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.restore()


def wait_for_stop(
    stops: StopSignals, running: Callable[[], bool], poll_s: float = 0.5, since: int = 0
) -> Literal["signal", "exited"]:
    """Wait until a stop signal comes (``"signal"``) or ``running()`` turns False (``"exited"``).

    Args:
        stops: The installed signal counter.
        running: Polled every ``poll_s`` seconds (e.g. ``TritonServer.is_alive``).
        poll_s: Seconds between polls.
        since: Signals counted before this wait, which do not end it.
    """
    while True:
        if stops.count > since:
            return "signal"
        if not running():
            return "exited"
        stops.wait(poll_s)
