"""Logging: ``logging`` everywhere, routed to ``pb_utils.Logger`` inside the Triton stub.

``pb_utils.Logger`` enqueues messages for the stub's log thread, so it may be called from any
thread (unlike custom metrics). Outside Triton (CLI, tests) plain ``logging`` configuration applies.
"""

from __future__ import annotations

import logging
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
