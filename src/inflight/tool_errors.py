"""The tools' errors: the server launcher, the load test and the profilers.

They belong to the project's one exception tree (each is an ``inflight.errors.InflightError``), but
the deployed backend never raises them, so they live apart from the product's ``inflight.errors``.
Every message says what was wrong and how to fix it.
"""

from __future__ import annotations

from inflight.errors import ConfigError, InflightError


class ServerError(InflightError):
    """The Triton server could not be found, started or reached."""


class StopRequested(ServerError):
    """A stop was requested (e.g. Ctrl+C) while the server was starting; the server still runs."""


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


class CheckpointError(ConfigError):
    """A checkpoint ``inflight import-hf`` cannot serve faithfully (the message says what was found and what to do)."""
