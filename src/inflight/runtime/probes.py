"""Diagnostics of an instance: where its execute thread's time goes, for the finalize log and a profiler.

``ExecuteTiming`` always runs (a few clock reads per ``execute()``); ``GilProbe`` and ``NvtxRanges`` are
off unless a backend parameter asks for them (``gil_probe``, ``nvtx``), and cost nothing then.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, ClassVar

from inflight.runtime.pipeline.stats import Aggregation

LOGGER = logging.getLogger(__name__)


class ExecuteTiming:
    """The execute thread's time in ``execute()`` calls and between them (the finalize log's figures).

    ``InflightModel.execute`` calls ``enter()`` first and ``exit()`` last.

    Attributes:
        figures: ``executes``, ``execute_s``, ``between_executes_s``, ``execute_max_ms``,
            ``executes_over_10ms`` and ``execute_failures`` so far.
    """

    #: Each figure, and how it combines over instances (``inflight.runtime.record``).
    FIGURES: ClassVar[dict[str, Aggregation]] = {
        "executes": "sum",
        "execute_s": "sum",
        "between_executes_s": "sum",
        "execute_max_ms": "max",
        "executes_over_10ms": "sum",
        "execute_failures": "sum",
    }

    def __init__(self) -> None:
        self.figures: dict[str, float] = {
            "executes": 0,
            "execute_s": 0.0,
            "between_executes_s": 0.0,
            "execute_max_ms": 0.0,
            "executes_over_10ms": 0,
            "execute_failures": 0,
        }
        self._t_enter = 0.0
        self._t_exit = 0.0

    def enter(self) -> float | None:
        """An ``execute()`` starts.

        Returns:
            The seconds since the previous ``execute()`` returned (None at the first).
        """
        self._t_enter = time.perf_counter()
        if not self._t_exit:
            return None
        gap = self._t_enter - self._t_exit
        self.figures["between_executes_s"] += gap
        return gap

    def exit(self) -> None:
        """The ``execute()`` that ``enter()`` saw start returns."""
        self._t_exit = time.perf_counter()
        took = self._t_exit - self._t_enter
        f = self.figures
        f["execute_s"] += took
        f["executes"] += 1
        f["execute_max_ms"] = max(f["execute_max_ms"], took * 1e3)
        if took > 0.010:
            f["executes_over_10ms"] += 1

    def failed(self) -> int:
        """Count an ``execute()`` that raised; return how many have so far."""
        self.figures["execute_failures"] += 1
        return int(self.figures["execute_failures"])


class GilProbe:
    """How late a thread that sleeps ``period_s`` wakes up, i.e. how long it waits for the GIL.

    Sampling starts at construction, on a daemon thread; ``stop()`` returns the figures.

    Args:
        period_s: How long each sample sleeps.
    """

    #: Each figure ``stop()`` returns, and how it combines over instances (``inflight.runtime.record``).
    FIGURES: ClassVar[dict[str, Aggregation]] = {
        "gil_probe_samples": "sum",
        "gil_probe_mean_late_us": "mean",
        "gil_probe_max_late_us": "max",
    }

    def __init__(self, period_s: float = 0.0005) -> None:
        self.period_s = period_s
        self.samples = 0
        self.late_s = 0.0
        self.max_late_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inflight-gil-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            time.sleep(self.period_s)
            late = time.perf_counter() - t0 - self.period_s
            self.samples += 1
            self.late_s += late
            self.max_late_s = max(self.max_late_s, late)

    def stop(self) -> dict[str, float]:
        """Stop sampling.

        Returns:
            ``gil_probe_samples``, ``gil_probe_mean_late_us`` and ``gil_probe_max_late_us``.
        """
        self._stop.set()
        self._thread.join(timeout=1.0)
        n = max(1, self.samples)
        return {
            "gil_probe_samples": self.samples,
            "gil_probe_mean_late_us": self.late_s / n * 1e6,
            "gil_probe_max_late_us": self.max_late_s * 1e6,
        }


class NvtxRanges:
    """NVTX ranges through the ``nvtx`` package; free when no profiler is attached.

    Args:
        enabled: Mark ranges; without the ``nvtx`` package they stay off (logged once).
        domain: The NVTX domain of every range.
    """

    def __init__(self, enabled: bool, domain: str) -> None:
        self._nvtx: Any = None
        self._domain = domain
        if enabled:
            try:
                import nvtx
            except ImportError:
                LOGGER.info("nvtx is not installed; NVTX ranges are off (pip install nvtx)")
            else:
                self._nvtx = nvtx

    def range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A context manager that marks ``name`` on the timeline (a no-op when off)."""
        if self._nvtx is None:
            return contextlib.nullcontext()
        return self._nvtx.annotate(name, domain=self._domain)
