"""Each GPU's utilization during a window, as the driver reports it (``nvidia-smi --query-gpu=utilization.gpu``).

``utilization.gpu`` is the share of the driver's sample period (1/6 s to 1 s, by product) in which one or more
kernels ran on the GPU: the whole device's temporal activity, every process's kernels together, coarsely sampled
(copies not counted). The backend's live CUPTI gauges are each instance's own kernels instead, and several
instances on one GPU overlap there (``inflight.runtime.metrics``); nsys of the whole server gives the exact union
(``inflight nsys-summary``). The A/B runner samples this beside them in every window on a host with
``nvidia-smi`` (a window's ``gpu_util``: ``source`` and ``by_gpu``, keyed by the GPUs' physical indices, each GPU's
mean/min/max/n as fractions of 1).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from types import TracebackType
from typing import IO, Any

LOGGER = logging.getLogger(__name__)
#: Milliseconds between two samples (``nvidia-smi --loop-ms``).
INTERVAL_MS = 200
#: What the figure is, for the run's JSON.
SOURCE = "nvidia-smi utilization.gpu: the share of the driver's sample period in which a kernel ran"
_QUERY = "--query-gpu=timestamp,index,utilization.gpu"
_TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"


def parse(text: str, since: float | None = None, until: float | None = None) -> dict[str, list[float]]:
    """Each GPU's samples (fractions of 1) from ``nvidia-smi`` CSV lines ``timestamp, index, utilization``.

    Args:
        text: The lines (``--format=csv,noheader,nounits``).
        since: Keep only samples taken at or after this ``time.time()`` (the warm-up's end); None: all.
        until: And before this one (the window's planned end: the generator's stop and its answers' collection
            follow with the GPU idle); None: to the last.

    Lines that do not parse (a header, a partial last line, ``[N/A]``) are skipped.
    """
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        stamp, index, util = parts
        try:
            value = float(util) / 100.0
            taken = dt.datetime.strptime(stamp, _TIME_FORMAT).timestamp()
        except ValueError:
            continue
        if (since is None or taken >= since) and (until is None or taken < until):
            out.setdefault(index, []).append(value)
    return out


def summarize(samples: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """``{gpu: {"mean", "min", "max", "n"}}`` of each GPU's samples."""
    return {
        gpu: {"mean": sum(v) / len(v), "min": min(v), "max": max(v), "n": len(v)}
        for gpu, v in sorted(samples.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else kv[0])
        if v
    }


class UtilizationSampler:
    """``nvidia-smi --loop-ms`` running for the length of a ``with`` block; :meth:`result` then has each GPU's figures.

    Where ``nvidia-smi`` is missing (a CPU host) it samples nothing and :meth:`result` is None.
    """

    def __init__(self, interval_ms: int = INTERVAL_MS, smi: str = "nvidia-smi") -> None:
        """Sample every ``interval_ms`` with ``smi`` (a name on PATH or a path)."""
        self.interval_ms = interval_ms
        self.smi = shutil.which(smi)
        self._proc: subprocess.Popen[bytes] | None = None
        self._file: IO[bytes] | None = None
        self._text = ""

    def __enter__(self) -> UtilizationSampler:
        """Start sampling (nothing without ``nvidia-smi``)."""
        if self.smi is not None:
            self._file = tempfile.TemporaryFile()
            cmd: Sequence[str] = [self.smi, _QUERY, "--format=csv,noheader,nounits", f"--loop-ms={self.interval_ms}"]
            try:
                self._proc = subprocess.Popen(cmd, stdout=self._file, stderr=subprocess.STDOUT)
            except OSError:
                self._file.close()
                self._file = None
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop ``nvidia-smi`` and keep what it wrote."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._file is not None:
            with contextlib.closing(self._file):
                self._file.seek(0)
                self._text = self._file.read().decode(errors="replace")
            self._file = None

    def result(self, since: float | None = None, until: float | None = None) -> dict[str, dict[str, Any]] | None:
        """Each GPU's figures (:func:`summarize`) from samples in ``[since, until)``; None when nothing was sampled."""
        figures = summarize(parse(self._text, since, until))
        if not figures and self._text.strip() and not parse(self._text):  # it printed something else: say what
            LOGGER.warning("nvidia-smi sampled no utilization: %s", self._text.strip().splitlines()[0][:200])
        return figures or None
