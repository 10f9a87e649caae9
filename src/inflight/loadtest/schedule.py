"""The send times of one open-loop generator source: Poisson (exponential gaps) or constant, from a seed.

Several sources (one per generator process) superpose to the target rate: independent Poisson
sources sum to a Poisson process of the summed rate. How late each send left is counted by
:class:`inflight.loadtest.openloop.Lateness`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Literal

import numpy as np

from inflight.errors import ConfigError

ArrivalDist = Literal["poisson", "constant"]

ARRIVALS: tuple[ArrivalDist, ...] = ("poisson", "constant")


class Schedule:
    """Send times (seconds from the source's start) of one source of an open-loop load.

    ``sources`` sources with indices ``0..sources-1`` together offer ``rate`` requests per second:
    each offers ``rate / sources``. Poisson sources draw exponential gaps from a generator seeded
    with ``(seed, index)``; constant sources are evenly spaced and phase-shifted so that together
    they interleave into one constant stream.

    Args:
        rate: Total requests per second of all sources together (> 0).
        dist: ``poisson`` or ``constant``.
        seed: Seed of the whole load (the same seed, the same schedule).
        index: This source's index.
        sources: How many sources share the rate.

    Raises:
        ConfigError: for a rate <= 0, an unknown distribution or an index outside the sources.
    """

    def __init__(self, rate: float, *, dist: ArrivalDist = "poisson", seed: int = 0, index: int = 0, sources: int = 1):
        if not rate > 0 or not math.isfinite(rate):
            raise ConfigError(f"--rate {rate}: offer a positive number of requests per second")
        if dist not in ARRIVALS:
            raise ConfigError(f"--arrival {dist!r}: choose one of {', '.join(ARRIVALS)}")
        if sources < 1 or not 0 <= index < sources:
            raise ConfigError(f"arrival source {index} of {sources}: the index must be in 0..{sources - 1}")
        self.rate = float(rate)
        self.dist = dist
        self.seed = seed
        self.index = index
        self.sources = sources
        self.source_rate = self.rate / sources

    def __iter__(self) -> Iterator[float]:
        """Yield the send offsets, increasing, without end."""
        if self.dist == "constant":
            gap = 1.0 / self.source_rate
            first = self.index / self.rate  # source i sends at (i + k * sources) / rate
            k = 0
            while True:
                yield first + k * gap
                k += 1
        rng = np.random.default_rng([self.seed, self.index])
        t = 0.0
        scale = 1.0 / self.source_rate
        while True:
            for gap in rng.exponential(scale, 4096):
                t += float(gap)
                yield t

    def offsets(self, duration_s: float) -> np.ndarray:
        """Every send offset before ``duration_s`` (for tests and reports)."""
        out = []
        for t in self:
            if t >= duration_s:
                break
            out.append(t)
        return np.asarray(out, dtype=np.float64)
