"""One exception tree for the whole project: its base and the product's errors.

The errors the backend raises are defined here; the tools' own errors (server, load test,
profilers) subclass ``InflightError`` in ``inflight.tool_errors``. Every message says what was wrong
and how to fix it.
"""

from __future__ import annotations


class InflightError(Exception):
    """Base class of every error raised by inflight."""


class ValidationError(InflightError):
    """A request (or a configuration value) is not acceptable; only that request fails.

    Args:
        message: What is wrong and how to fix it (the client sees it).
        reason: A short stable name of the kind of problem (``dtype``, ``shape``, ``empty_batch``...),
            the label of the backend's rejected-requests counter.
    """

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


class ConfigError(InflightError):
    """A model configuration or a parameter in config.pbtxt is wrong."""


class EngineError(InflightError):
    """An engine could not be loaded, captured or run."""


class NoGPUError(EngineError):
    """A GPU was required (KIND_GPU, TensorRT, CUDA graphs) but none is usable."""


class ShuttingDownError(InflightError):
    """The model is being unloaded; in-flight work that cannot finish is failed with this."""


class ClosedError(ShuttingDownError):
    """A runner or an executor was used after ``close()`` (its resources are released)."""
