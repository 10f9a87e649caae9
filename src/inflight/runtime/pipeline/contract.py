"""What the executors share with their callers: the response sink, NVTX ranges, the failure texts.

Every failure text a request can get from an executor is written here once; the executors and the
modes (``inflight.runtime.modes``) both take them from here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np

#: The executors' logger. Its name is the one their log lines have always carried (``[name]`` in each line,
#: ``inflight.log``), kept so that those lines read as before.
LOGGER = logging.getLogger("inflight.runtime.executor")

#: The error of every request refused or failed because its instance is closing.
SHUTTING_DOWN = "the model is being unloaded; retry on another instance or after reload"

#: The error of each request of a batch still on the device when its executor's ``close`` timed out.
UNLOADED_BEFORE_COMPLETION = "the model was unloaded before this batch completed"


class Unlaunched(NamedTuple):
    """How a batch (or an overlap chunk) that never reached the device fails at one step.

    Attributes:
        what: What the log line says of it.
        error: The error its requests get, before the exception's text (``message``).
    """

    what: str
    error: str

    def message(self, exc: BaseException) -> str:
        """The error each request of the batch gets when the step raised ``exc``."""
        return f"{self.error}: {exc}"


GATHER_FAILED = Unlaunched("could not be gathered", "batch failed before launch")
LAUNCH_FAILED = Unlaunched("failed to launch", "batch failed to launch on the device")


def failed_on_device(error: BaseException) -> str:
    """The error each request of a batch gets when the batch failed on the device (or in-band, anywhere)."""
    return f"batch failed on the device: {error}"


class ResponseSink(Protocol):
    """Where responses go: the Triton response sender, or a test's collector."""

    def send(self, handle: Any, outputs: Mapping[str, np.ndarray] | None, error: str | None) -> None:
        """Send exactly one final response (outputs, or an error) for the request ``handle``; may block."""


#: Builds the response object of one request from its outputs, or from an error message (``Returned``).
Build = Callable[[Mapping[str, np.ndarray] | None, str | None], Any]


class Returned:
    """A ``ResponseSink`` for a batch answered in ``execute()``'s returned list: handles are list positions.

    Each outcome is built into a response object at once (``build``: the mode's, e.g. a Triton
    ``InferenceResponse``), while the outputs it is given are still valid; ``build_s`` sums the time
    the builds took.

    Args:
        build: Builds one request's response object.
        responses: The list the responses go into, at their handles (``[None] * n`` by default).
        n: The list's length when ``responses`` is not given.
    """

    def __init__(self, build: Build, responses: list[Any] | None = None, n: int = 0) -> None:
        self._build = build
        self.responses: list[Any] = [None] * n if responses is None else responses
        self.build_s = 0.0

    def send(self, handle: int, outputs: Mapping[str, np.ndarray] | None, error: str | None) -> None:
        """Build the response of the request at position ``handle``."""
        t0 = time.perf_counter()
        self.responses[handle] = self._build(outputs, error)
        self.build_s += time.perf_counter() - t0


class Ranges(Protocol):
    """NVTX-style named ranges (a no-op object when profiling is off)."""

    def range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A context manager that marks ``name`` on the timeline."""


class NoRanges:
    """``Ranges`` that mark nothing (profiling off)."""

    def range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A context manager that does nothing."""
        return contextlib.nullcontext()
