"""Logging: ``logging`` everywhere, routed to ``pb_utils.Logger`` inside the Triton stub.

``pb_utils.Logger`` enqueues messages for the stub's log thread, so it may be called from any
thread (unlike custom metrics). Outside Triton (CLI, tests) plain ``logging`` configuration applies.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
from collections.abc import Callable
from typing import Any

_INSTALLED = False


class TritonLogHandler(logging.Handler):
    """Forwards records to the Triton server log through ``pb_utils.Logger``."""

    def __init__(self, pb_utils: Any) -> None:
        super().__init__()
        self._logger = pb_utils.Logger

    def emit(self, record: logging.LogRecord) -> None:
        """Send one record at the matching Triton level."""
        try:
            msg = f"[{record.name}] {self.format(record)}"
            if record.levelno >= logging.ERROR:
                self._logger.log_error(msg)
            elif record.levelno >= logging.WARNING:
                self._logger.log_warn(msg)
            elif record.levelno >= logging.INFO:
                self._logger.log_info(msg)
            else:
                self._logger.log_verbose(msg)
        except Exception:  # logging must never take the backend down
            self.handleError(record)


def route_to_triton(pb_utils: Any, level: int = logging.INFO) -> None:
    """Attach ``TritonLogHandler`` to the ``inflight`` logger once per process."""
    global _INSTALLED
    if _INSTALLED:
        return
    root = logging.getLogger("inflight")
    root.setLevel(level)
    root.addHandler(TritonLogHandler(pb_utils))
    root.propagate = False
    _INSTALLED = True


#: The signal on which a stub writes every thread's Python stack to its stderr (the server log).
#: python_backend's stub handles SIGINT and SIGTERM itself; SIGUSR2 is free.
STACK_SIGNAL = signal.SIGUSR2

#: Entry-point group of the optional live GPU gauges (``cupti=true``): an object whose call returns
#: something with a ``figures`` callable and a ``close()``. The profiling package registers
#: ``inflight.profiling.cupti_live:LiveGpuMetrics.start`` under the name ``cupti``; the runtime finds
#: it here without importing any diagnostics module itself.
GPU_METRICS_GROUP = "inflight.gpu_metrics"
#: Entry point group of the lab's diagnostics the load test calls when a server misbehaves
#: (``stuck_stubs``: :func:`inflight.lab.stalls.dump_stuck_stubs`), found without importing the lab.
DIAGNOSTICS_GROUP = "inflight.diagnostics"


def install_stack_dump() -> bool:
    """Make this process write all threads' Python stacks to stderr on :data:`STACK_SIGNAL`.

    Returns:
        True when the handler is installed (False where the platform has no such signal or
        stderr is not a real file).
    """
    try:
        faulthandler.register(STACK_SIGNAL, all_threads=True, chain=False)
    except (AttributeError, ValueError, RuntimeError, OSError) as e:
        logging.getLogger(__name__).debug("no stack dump on SIGUSR2: %s", e)
        return False
    return True


def plugin(group: str, name: str, fix: str) -> Callable[..., Any]:
    """The callable registered as ``name`` under the entry point ``group`` (a hook the caller does not import).

    Args:
        group: The entry point group (:data:`GPU_METRICS_GROUP`, :data:`DIAGNOSTICS_GROUP`).
        name: The entry point's name.
        fix: What to do when it is missing, for the error.

    Raises:
        LookupError: when no installed distribution registers it, saying ``fix``.
    """
    from importlib.metadata import entry_points

    for ep in entry_points(group=group):
        if ep.name == name:
            found: Callable[..., Any] = ep.load()
            return found
    raise LookupError(f"no {name!r} is installed (entry point group {group!r}); {fix}")


def gpu_metrics_provider(name: str = "cupti") -> Callable[[], Any]:
    """The live GPU-metrics starter registered as ``name`` under :data:`GPU_METRICS_GROUP`.

    Raises:
        LookupError: when no installed distribution registers it, with the advice to install
            inflight as a package with cupti-python (or set cupti=false).
    """
    return plugin(
        GPU_METRICS_GROUP,
        name,
        "install inflight as a package (`pip install -e .`) with cupti-python, or set cupti=false",
    )
