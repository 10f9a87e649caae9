"""One exception tree for the whole project.

Every message says what was wrong and how to fix it.
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


class ServerError(InflightError):
    """The Triton server could not be found, started or reached."""


class StopRequested(ServerError):
    """A stop was requested (e.g. Ctrl+C) while the server was starting; the server still runs."""


class ShuttingDownError(InflightError):
    """The model is being unloaded; in-flight work that cannot finish is failed with this."""


class StatsError(InflightError):
    """Statistics that cannot be compared (other model, counters that went backwards, no data)."""


class HttpProtocolError(InflightError):
    """The server's answer is not HTTP/1.1 the load generator can read (the message says what was seen)."""


class CuptiUnavailableError(InflightError):
    """CUPTI cannot be used here (not installed, no GPU/driver, or another profiler owns it)."""


class NsysExportError(InflightError, ValueError):
    """The file is not a usable nsys sqlite export (missing, unreadable, or without GPU data).

    Also a ``ValueError``, as it was before it joined this tree, for callers that catch that.
    """
