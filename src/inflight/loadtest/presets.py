"""Load shapes of the A/B test: the ``published`` one and a short ``smoke`` one.

The published workload: 1000 closed-loop users (no think time) each sending 50 items per request,
a 120 s measured window after a warm-up under the same load, and enough Locust processes that
Locust is not the bottleneck (docs/LAB.md, "Toolchain facts": 8 processes reach 74k req/s against a null model).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Literal

from inflight.errors import ConfigError
from inflight.loadtest.schedule import ARRIVALS, ArrivalDist
from inflight.loadtest.workload import LENGTH_DISTS, TOKEN_DISTS, LengthDist, TokenDist

Protocol = Literal["http", "grpc"]


def default_processes() -> int:
    """Locust worker processes: one per core, leaving two cores to the system, at most 8, at least 1."""
    return max(1, min((os.cpu_count() or 1) - 2, 8))


@dataclass(frozen=True, kw_only=True)
class LoadShape:
    """Everything that must be identical between the variants of an A/B test.

    Attributes:
        users: Concurrent closed-loop users.
        spawn_rate: Users started per second.
        window_s: Measured seconds (after spawning completes; Locust's statistics are reset then).
        warmup_s: Seconds of the same load before each window (not measured).
        items: Items per request.
        seq_len: Sequence length (token models).
        token_dist: ``uniform`` or ``zipf`` token ids.
        length_dist: ``full`` or ``uniform`` (random padding) lengths.
        seed: Seed of the request pool.
        pool: Distinct requests.
        processes: Locust worker processes (``--processes``); 0 runs one plain Locust process.
        protocol: ``http`` (binary tensors) or ``grpc``.
        check: Compare every response with the PyTorch reference.
        rate: Open loop: requests per second of all Locust users together (0: closed loop).
        arrival: Open loop: ``poisson`` or ``constant`` arrivals.
        max_connections: Open loop: keep-alive connections per Locust user.
        check_every: Open loop: decode every Nth answer in full (``check``: every one).
        stop_timeout_s: When a run's time is up, each user may finish the request it has in
            flight for up to this long (Locust ``--stop-timeout``) instead of dropping its
            connection mid-request (which makes Triton cancel that request). It did not cure the
            lost requests and unload stalls seen on the GPU host (see the README).
    """

    users: int
    spawn_rate: float
    window_s: float
    warmup_s: float
    items: int = 50
    seq_len: int = 64
    token_dist: TokenDist = "uniform"
    length_dist: LengthDist = "full"
    seed: int = 0
    pool: int = 16
    processes: int = 1
    protocol: Protocol = "http"
    check: bool = False
    stop_timeout_s: float = 10.0
    rate: float = 0.0
    arrival: ArrivalDist = "poisson"
    max_connections: int = 256
    check_every: int = 16

    def check_values(self) -> None:
        """Reject impossible shapes.

        Raises:
            ConfigError: naming the option and what it accepts.
        """
        if self.users < 1:
            raise ConfigError(f"--users {self.users}: run at least one user")
        if self.spawn_rate <= 0:
            raise ConfigError(f"spawn rate {self.spawn_rate}: must be > 0 users per second")
        if self.window_s < 1:
            raise ConfigError(f"--window {self.window_s}: measure at least 1 s (the published window is 120 s)")
        if self.warmup_s < 0:
            raise ConfigError(f"--warmup {self.warmup_s}: must be >= 0 seconds")
        if self.items < 1:
            raise ConfigError(f"--items {self.items}: send at least one item per request")
        if self.stop_timeout_s < 0:
            raise ConfigError(f"stop timeout {self.stop_timeout_s}: must be >= 0 seconds")
        if self.processes < 0:
            raise ConfigError(f"--processes {self.processes}: use 0 (one plain Locust process) or more workers")
        if self.protocol not in ("http", "grpc"):
            raise ConfigError(f"--protocol {self.protocol!r}: choose http or grpc")
        if self.rate < 0:
            raise ConfigError(f"--rate {self.rate}: offer a rate > 0 requests per second (0 runs closed loop)")
        if self.arrival not in ARRIVALS:
            raise ConfigError(f"--arrival {self.arrival!r}: choose one of {', '.join(ARRIVALS)}")
        if self.check_every < 1:
            raise ConfigError(f"--check-every {self.check_every}: decode at least every answer (1) or every Nth")
        if self.max_connections < 1:
            raise ConfigError(f"--max-connections {self.max_connections}: allow at least one connection per user")
        if self.token_dist not in TOKEN_DISTS or self.length_dist not in LENGTH_DISTS:
            raise ConfigError(
                f"token/length distribution {self.token_dist}/{self.length_dist}: choose from {TOKEN_DISTS} and "
                f"{LENGTH_DISTS}"
            )

    @property
    def ramp_s(self) -> float:
        """Seconds Locust takes to start every user."""
        return self.users / self.spawn_rate

    def replace(self, **changes: Any) -> LoadShape:
        """A copy with ``changes`` (None values are ignored, so CLI options can be passed through)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON)."""
        return dataclasses.asdict(self)


def published() -> LoadShape:
    """The published workload: 1000 users, 50 items per request, 120 s window, closed loop."""
    return LoadShape(
        users=1000, spawn_rate=1000, window_s=120, warmup_s=30, items=50, seq_len=64, processes=default_processes()
    )


def smoke() -> LoadShape:
    """A quick check of the whole chain: 20 users, 10 s window."""
    return LoadShape(users=20, spawn_rate=20, window_s=10, warmup_s=3, items=50, seq_len=64, processes=1)


PRESETS = {"published": published, "smoke": smoke}


def preset(name: str) -> LoadShape:
    """The load shape called ``name``.

    Raises:
        ConfigError: for an unknown name.
    """
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
