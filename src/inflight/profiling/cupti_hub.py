"""The process-wide owner of CUPTI's activity state, and where cupti-python comes from.

CUPTI's activity callbacks and enabled kinds are process-global, so every consumer
(:mod:`~inflight.profiling.cupti_live`'s ``LiveGpuMetrics`` and ``CuptiWindow``) subscribes to the
one owner :func:`hub` returns; it reduces each buffer once
(:func:`~inflight.profiling.cupti_records.reduce_activities`) and hands the batch to all.
:func:`import_cupti` imports cupti-python lazily (``pip install cupti-python pyelftools``), so
importing this module needs no GPU; :func:`cupti_library_path` finds libcupti for
``NVTX_INJECTION64_PATH``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from inflight.profiling.cupti_records import (
    K_KERNEL,
    K_MARKER,
    K_MEMCPY,
    K_RUNTIME,
    Batch,
    CbidNames,
    reduce_activities,
)
from inflight.tool_errors import CuptiUnavailableError

LOGGER = logging.getLogger(__name__)


def import_cupti() -> Any:
    """The ``cupti.cupti`` module of cupti-python.

    Raises:
        CuptiUnavailableError: when it is not installed or cannot load.
    """
    try:
        from cupti import cupti
    except ImportError as e:
        raise CuptiUnavailableError(
            f"cupti-python is not importable ({e}); `pip install cupti-python pyelftools` (or 'inflight[profiling]')"
        ) from None
    return cupti


def cupti_library_path() -> str | None:
    """Path of libcupti (for ``NVTX_INJECTION64_PATH``), found the way cupti-python finds it.

    Returns:
        The absolute path, or None when it cannot be located.
    """
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        path = getattr(load_nvidia_dynamic_lib("cupti"), "abs_path", None)
        return str(path) if path else None
    except Exception as e:  # pathfinder raises several error types; any means "not found"
        LOGGER.debug("libcupti not located: %s", e)
        return None


class _Subscriber:
    """What the hub needs from a consumer (duck-typed)."""

    kinds: frozenset[int]
    periodic: bool
    kernel_names: bool

    def on_batch(self, batch: Batch) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def on_tick(self, now_ns: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class _Hub:
    """Owns CUPTI's activity state for the process: callbacks, enabled kinds, the flusher.

    CUPTI's activity callbacks and enabled kinds are process-global, so consumers subscribe
    here; each gets every reduced batch. Kinds are enabled while at least one subscriber wants
    them; one flusher thread runs while a periodic subscriber exists.

    Args:
        buffer_bytes: Size of each activity buffer handed to CUPTI.
        force_flush: Periodic flushes use ``CUPTI_ACTIVITY_FLAG_FLUSH_FORCED``.
    """

    def __init__(self, buffer_bytes: int = 4 << 20, force_flush: bool = True) -> None:
        self.buffer_bytes = int(buffer_bytes)
        self.force_flush = force_flush
        self._lock = threading.RLock()
        self._subs: list[Any] = []
        self._enabled: dict[int, int] = {}
        self._cupti: Any = None
        self._names: CbidNames | None = None
        self._registered = False
        self.thread_id_type = "unknown"
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()
        self._interval_s = 0.25

    # CUPTI is imported and configured on first use only.
    def _ensure(self) -> Any:
        if self._cupti is not None:
            return self._cupti
        c = import_cupti()
        for name, value in (("MEMCPY", K_MEMCPY), ("KERNEL", K_KERNEL), ("RUNTIME", K_RUNTIME), ("MARKER", K_MARKER)):
            if int(getattr(c.ActivityKind, name)) != value:
                LOGGER.warning(
                    "cupti ActivityKind.%s is %s, expected %s", name, int(getattr(c.ActivityKind, name)), value
                )
        try:
            c.set_thread_id_type(c.ActivityThreadIdType.SYSTEM)
            self.thread_id_type = "system"
        except Exception as e:  # records then carry pthread_self() ids
            self.thread_id_type = "default"
            LOGGER.warning("CUPTI thread ids stay pthread_self()-based (set_thread_id_type failed: %s)", e)
        try:
            c.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        except Exception as e:
            raise CuptiUnavailableError(
                f"CUPTI refused the activity callbacks ({e}); is another profiler (nsys, torch.profiler) attached?"
            ) from None
        self._registered = True
        self._names = CbidNames(c)
        self._cupti = c
        return c

    def timestamp(self) -> int:
        """CUPTI's current timestamp, ns."""
        return int(self._ensure().get_timestamp())

    def subscribe(self, sub: Any) -> None:
        """Enable ``sub.kinds`` and start delivering batches to ``sub``.

        Raises:
            CuptiUnavailableError: when CUPTI refuses a kind (another profiler, no GPU).
        """
        with self._lock:
            c = self._ensure()
            counted: list[int] = []
            newly: list[int] = []
            for k in sorted(sub.kinds):
                try:
                    if self._enabled.get(k, 0) == 0:
                        c.activity_enable(k)
                        newly.append(k)
                except Exception as e:
                    self._rollback(counted, newly)
                    raise CuptiUnavailableError(
                        f"CUPTI could not enable activity kind {k} ({e}); with a CUDA 13.2-or-older driver only one "
                        "CUPTI subscriber may run per process (nsys, torch.profiler and this module exclude each other)"
                    ) from None
                self._enabled[k] = self._enabled.get(k, 0) + 1
                counted.append(k)
            self._subs.append(sub)
            if sub.periodic:
                self._start_flusher()

    def _rollback(self, counted: list[int], newly: list[int]) -> None:
        for k in counted:
            self._enabled[k] -= 1
            if self._enabled[k] <= 0:
                del self._enabled[k]
        for k in newly:
            try:
                self._cupti.activity_disable(k)
            except Exception as e:
                LOGGER.debug("activity_disable(%s) during rollback: %s", k, e)

    def unsubscribe(self, sub: Any, *, flush: bool = True) -> None:
        """Deliver what CUPTI holds, then stop delivering to ``sub`` and release its kinds."""
        if flush:
            self.flush(force=True)
        with self._lock:
            if sub not in self._subs:
                return
            self._subs.remove(sub)
            gone: list[int] = []
            for k in sub.kinds:
                self._enabled[k] -= 1
                if self._enabled[k] <= 0:
                    del self._enabled[k]
                    gone.append(k)
            for k in gone:
                try:
                    self._cupti.activity_disable(k)
                except Exception as e:
                    LOGGER.debug("activity_disable(%s): %s", k, e)
            stop_flusher = not any(s.periodic for s in self._subs)
        if stop_flusher:
            self._stop_flusher()
        if gone and flush:
            self.flush(force=True)  # drain records of the kinds just disabled

    def flush(self, *, force: bool) -> None:
        """``cupti.activity_flush_all``; the completed callback runs before this returns.

        The hub lock is *not* held here: CUPTI may call back from its own thread.
        """
        c = self._cupti
        if c is None:
            return
        try:
            c.activity_flush_all(1 if force else 0)
        except Exception as e:
            LOGGER.warning("cupti.activity_flush_all failed: %s", e)

    # -- CUPTI callbacks (CUPTI's thread or the flushing thread) --------------------------------
    def _buffer_requested(self) -> tuple[int, int]:
        return self.buffer_bytes, 0

    def _buffer_completed(self, activities: Any) -> None:
        try:
            with self._lock:
                subs = list(self._subs)
            if not subs:
                return
            names = self._names or CbidNames(None)
            batch = reduce_activities(activities, names, kernel_names=any(s.kernel_names for s in subs))
            for s in subs:
                try:
                    s.on_batch(batch)
                except Exception:
                    LOGGER.exception("CUPTI consumer %r failed on a batch", s)
        except Exception:  # never let an exception escape into CUPTI
            LOGGER.exception("CUPTI buffer-completed callback failed")

    # -- periodic flushing ---------------------------------------------------------------------
    def _start_flusher(self) -> None:
        intervals = [s.interval_s for s in self._subs if s.periodic]
        self._interval_s = min(intervals) if intervals else 0.25
        if self._flusher is not None and self._flusher.is_alive():
            return
        self._stop.clear()
        self._flusher = threading.Thread(target=self._flush_loop, name="inflight-cupti-flush", daemon=True)
        self._flusher.start()

    def _stop_flusher(self) -> None:
        t = self._flusher
        if t is None:
            return
        self._stop.set()
        if t is not threading.current_thread():
            t.join(timeout=5.0)
        self._flusher = None

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                now = int(self._cupti.get_timestamp())
                self.flush(force=self.force_flush)
                with self._lock:
                    subs = [s for s in self._subs if s.periodic]
                for s in subs:
                    s.on_tick(now)
            except Exception:
                LOGGER.exception("CUPTI flusher iteration failed")


_HUB_LOCK = threading.Lock()
_HUB: _Hub | None = None


def hub() -> _Hub:
    """The process-wide CUPTI owner (created on first use, CUPTI imported then)."""
    global _HUB
    with _HUB_LOCK:
        if _HUB is None:
            _HUB = _Hub()
        return _HUB
