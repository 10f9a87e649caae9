"""What the servers' metrics endpoints say, read and summed over several servers."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from inflight.loadtest import stats as st
from inflight.loadtest.runner.config import LOGGER_NAME

LOGGER = logging.getLogger(LOGGER_NAME)


def scrape(url: str, timeout_s: float = 5.0) -> str | None:
    """The metrics endpoint's text, or None when it cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return str(r.read().decode("utf-8", errors="replace"))
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        LOGGER.debug("metrics endpoint %s: %s", url, e)
        return None


def joined(texts: Iterable[str | None]) -> str | None:
    """The servers' metrics texts that could be read, as one (None when none could).

    For means over instances (the GPU gauges) only: Triton's request counters must be read per
    server (:func:`~inflight.loadtest.stats.request_state` merges a series seen twice).
    """
    got = [t for t in texts if t is not None]
    return "\n".join(got) if got else None


def sum_counts(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Request counters of several servers (:func:`~inflight.loadtest.stats.request_state`) summed key by key.

    A key is None where no server publishes it; the raw ``lines`` are left out.
    """
    keys = list(dict.fromkeys(k for p in parts for k in p if k != "lines"))
    out: dict[str, Any] = {}
    for k in keys:
        values = [p[k] for p in parts if p.get(k) is not None]
        out[k] = sum(values) if values else None
    return out


def per_server_requests(befores: Sequence[Mapping[str, Any]], afters: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """Successful requests each server counted between its two statistics snapshots (None where they disagree)."""
    out: list[int | None] = []
    for b, a in zip(befores, afters, strict=True):
        try:
            out.append(st.stats_delta(b, a).requests)
        except st.StatsError:
            out.append(None)
    return out
