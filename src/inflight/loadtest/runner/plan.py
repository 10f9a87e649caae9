"""The load plan of an A/B run, decided once, and the load generator's command lines and runs.

Closed loop (Locust's users, each sending its next request when the last returned) or open loop
(offered rates: Locust's ``OpenLoopHttpUser`` or the asyncio generator, :mod:`inflight.loadtest.rategen`):
:class:`LoadPlan` holds that choice and builds every run's command from it; :func:`run_locust` runs
one (Locust or the generator) to completion; :func:`cpu_sets_for` splits the cores between the
server and the generator.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import inflight
from inflight.errors import ConfigError
from inflight.loadtest import cpu
from inflight.loadtest import openloop as ol
from inflight.loadtest import stats as st
from inflight.loadtest.presets import LoadShape
from inflight.loadtest.runner.config import LOGGER_NAME, AbConfig, Endpoints, Variant
from inflight.loadtest.runner.front import own_cores

LOGGER = logging.getLogger(LOGGER_NAME)

USER_CLASSES = {"http": "TritonHttpUser", "grpc": "TritonGrpcUser"}
OPEN_LOOP_USER_CLASS = "OpenLoopHttpUser"
#: Windows a capacity search usually takes (for the time estimate only).
SEARCH_WINDOWS_ESTIMATE = 6
#: Seconds a Locust run may exceed its planned duration (start-up, stop, summary) before it is killed.
LOCUST_GRACE_S = 120.0
#: Shortest Locust run in which its CPU warning can appear (it samples every 10 s; the first is a baseline).
LOCUST_CPU_VISIBLE_S = 20.0
#: Rough start-up/stop cost of one Locust run, for the overall time estimate only.
LOCUST_OVERHEAD_S = 4.0


class LoadPlan:
    """How the load is sent, decided once for the whole run.

    Attributes:
        config: The run's configuration.
        open_loop: Offered rates (``--rate``/``--search``); False: closed loop.
        asyncio: The asyncio generator sends the open-loop load (else Locust does).
        locustfile: The Locust file (resolved).
    """

    def __init__(self, config: AbConfig) -> None:
        """Decide the loop and the generator; find the Locust file.

        Raises:
            ConfigError: when the Locust file does not exist.
        """
        self.config = config
        self.open_loop = config.open_loop
        self.asyncio = self.open_loop and config.generator == "asyncio"
        self.locustfile = (config.locustfile or default_locustfile()).resolve()
        if not self.locustfile.is_file():
            raise ConfigError(f"--locustfile {self.locustfile} does not exist")

    @property
    def generator(self) -> str:
        """The load generator recorded in the document: ``locust`` or ``asyncio``."""
        return self.config.generator if self.open_loop else "locust"

    @property
    def user_class(self) -> str:
        """What sends the requests: Locust's user class, or the asyncio generator's module."""
        if self.open_loop:
            return "inflight.loadtest.rategen" if self.config.generator == "asyncio" else OPEN_LOOP_USER_CLASS
        return USER_CLASSES[self.config.shape.protocol]

    def planned_per_variant_s(self) -> float:
        """Rough seconds one variant's warm-up and windows take (for the overall time estimate only)."""
        s = self.config.shape
        windows = max(1, len(self.config.rates) * self.config.rate_repeat) + (
            SEARCH_WINDOWS_ESTIMATE if self.config.search else 0
        )
        return s.warmup_s + windows * (s.window_s + s.ramp_s + LOCUST_OVERHEAD_S) + LOCUST_OVERHEAD_S

    def first_rate(self) -> float:
        """The first open-loop rate measured (the sweep's first, else the search's low end): the warm-up's."""
        if self.config.rates:
            return float(self.config.rates[0])
        assert self.config.search is not None
        return self.config.search[0]

    def command(
        self,
        v: Variant,
        shape: LoadShape,
        endpoints: Sequence[Endpoints],
        pool: Path,
        duration_s: float,
        csv_prefix: Path | None = None,
        raw_dir: Path | None = None,
    ) -> list[str]:
        """The command line of one run (warm-up or window) of ``v`` under ``shape`` for ``duration_s``."""
        if self.asyncio:
            assert raw_dir is not None, "the asyncio generator writes its figures into a folder"
            return rategen_command(
                shape=shape, model=v.name, endpoints=endpoints, duration_s=duration_s, pool_file=pool, raw_dir=raw_dir
            )
        (one,) = endpoints  # Locust sends to one server (--server-per-gpu needs the asyncio generator)
        return locust_command(
            locustfile=self.locustfile,
            shape=shape,
            model=v.name,
            endpoints=one,
            duration_s=duration_s,
            pool_file=pool,
            repository=self.config.repository,
            csv_prefix=csv_prefix,
            raw_dir=raw_dir,
        )


def default_locustfile() -> Path:
    """``loadtest/locustfile.py`` of the checkout (or ``$INFLIGHT_LOCUSTFILE``).

    Raises:
        ConfigError: when it cannot be found.
    """
    env = os.environ.get("INFLIGHT_LOCUSTFILE")
    candidates = [Path(env)] if env else []
    checkout = Path(inflight.__file__).resolve().parents[2]
    candidates += [checkout / "loadtest" / "locustfile.py", Path("loadtest/locustfile.py")]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise ConfigError(
        f"loadtest/locustfile.py not found (looked in {[str(c) for c in candidates]}); run from the checkout, pass "
        "--locustfile, or set INFLIGHT_LOCUSTFILE"
    )


def cpu_sets_for(config: AbConfig) -> ol.CpuSets:
    """The server's and the generator's cores (``--server-cpus``, ``--client-cpus``, ``--isolate``).

    The balancer's own cores (``--balancer-cpus``) are taken out first: neither set gets them.

    Raises:
        ConfigError: for cores this run cannot use.
    """
    available = cpu.run_cores()
    balancer = own_cores(config, available)
    available = [c for c in available if c not in balancer]
    if config.isolate or config.server_cpus or config.client_cpus:
        sets = ol.split_cpus(available, config.server_cpus, config.client_cpus, isolate=config.isolate)
    else:
        sets = ol.CpuSets((), (), "not pinned (--no-isolate)")
    if config.url is not None and sets.isolated:
        # a server this runner did not start keeps its own cores; only the generator is pinned
        sets = ol.CpuSets(
            (),
            sets.client,
            f"server at --url not pinned by the runner; generator on {ol.format_cpus(sets.client)}",
        )
    return sets


def locust_command(
    *,
    locustfile: Path,
    shape: LoadShape,
    model: str,
    endpoints: Endpoints,
    duration_s: float,
    pool_file: Path,
    repository: Path,
    csv_prefix: Path | None = None,
    raw_dir: Path | None = None,
    master_port: int | None = None,
) -> list[str]:
    """The headless Locust command line of one run (warm-up or window).

    With worker processes, Locust's master listens on ``master_port`` (default: a free port picked
    now) instead of its fixed 5557, so several A/B runs can share a host.
    """
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(locustfile),
        "--headless",
        "-u",
        str(shape.users),
        "-r",
        f"{shape.spawn_rate:g}",
        "-t",
        f"{math.ceil(duration_s)}s",
        "--host",
        f"http://{endpoints.http}",
        "--only-summary",
        "--reset-stats",
        "--stop-timeout",
        f"{shape.stop_timeout_s:g}",
        "--model",
        model,
        "--items",
        str(shape.items),
        "--seq-len",
        str(shape.seq_len),
        "--token-dist",
        shape.token_dist,
        "--length-dist",
        shape.length_dist,
        "--seed",
        str(shape.seed),
        "--pool",
        str(shape.pool),
        "--pool-file",
        str(pool_file),
        "--repository",
        str(repository),
        "--grpc-url",
        endpoints.grpc,
    ]
    if shape.processes > 0:
        from inflight.server.config import free_port

        port = master_port or free_port()
        cmd += ["--processes", str(shape.processes), "--master-bind-port", str(port), "--master-port", str(port)]
    if shape.check:
        cmd.append("--check")
    if csv_prefix is not None:
        cmd += ["--csv", str(csv_prefix)]
    if raw_dir is not None:
        cmd += ["--raw-latency-dir", str(raw_dir)]
    if shape.rate > 0:
        cmd += [
            "--rate",
            f"{shape.rate:g}",
            "--arrival",
            shape.arrival,
            "--max-connections",
            str(shape.max_connections),
            "--check-every",
            "1" if shape.check else str(shape.check_every),
        ]
        cmd.append(OPEN_LOOP_USER_CLASS)
    else:
        cmd.append(USER_CLASSES[shape.protocol])
    return cmd


def rategen_command(
    *,
    shape: LoadShape,
    model: str,
    endpoints: Endpoints | Sequence[Endpoints],
    duration_s: float,
    pool_file: Path,
    raw_dir: Path,
) -> list[str]:
    """The command line of one open-loop window (or warm-up) of the asyncio generator.

    It runs ``shape.users`` processes (one arrival source each, as the Locust run has one user per
    process) and writes its latencies, counts and summary into ``raw_dir``; it speaks
    ``shape.protocol`` (HTTP, or gRPC to the endpoints' gRPC ports). With several servers'
    endpoints (one per GPU) its ``--url`` lists them all and the sources are spread over them.
    """
    servers = [endpoints] if isinstance(endpoints, Endpoints) else list(endpoints)
    grpc = shape.protocol == "grpc"
    return [
        sys.executable,
        "-m",
        "inflight.loadtest.rategen",
        "--protocol",
        shape.protocol,
        "--url",
        ",".join(e.grpc if grpc else e.http for e in servers),
        "--model",
        model,
        "--pool-file",
        str(pool_file),
        "--rate",
        f"{shape.rate:g}",
        "--duration",
        f"{duration_s:g}",
        "--processes",
        str(max(1, shape.users)),
        "--arrival",
        shape.arrival,
        "--seed",
        str(shape.seed),
        "--max-connections",
        str(shape.max_connections),
        "--check-every",
        "1" if shape.check else str(shape.check_every),
        "--raw-dir",
        str(raw_dir),
    ]


@dataclass(kw_only=True)
class LocustRun:
    """What one Locust subprocess did."""

    returncode: int
    wall_s: float
    log: Path
    cpu_warnings: list[str]
    gauge_samples: list[dict[str, Any]]
    killed: bool = False


def run_locust(
    cmd: Sequence[str],
    *,
    log: Path,
    planned_s: float,
    tick: Callable[[float], None] | None = None,
    tick_interval_s: float = 5.0,
) -> LocustRun:
    """Run Locust to completion, calling ``tick(elapsed)`` every ``tick_interval_s``.

    The process gets its own session and is killed with its workers when it overruns
    ``planned_s + LOCUST_GRACE_S`` or when this process is interrupted.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    killed = False
    with log.open("wb") as f:
        proc = subprocess.Popen(list(cmd), stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            while True:
                try:
                    proc.wait(timeout=tick_interval_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                elapsed = time.monotonic() - t0
                if elapsed > planned_s + LOCUST_GRACE_S:
                    LOGGER.error("Locust overran its %.0f s by %.0f s; killing it", planned_s, LOCUST_GRACE_S)
                    _kill_group(proc)
                    killed = True
                    break
                if tick is not None:
                    tick(elapsed)
        except BaseException:
            _kill_group(proc)
            raise
    if not killed:
        _wait_group(proc)
    text = log.read_text(errors="replace")
    warnings = st.cpu_warnings(text)
    return LocustRun(
        returncode=proc.returncode if proc.returncode is not None else -1,
        wall_s=time.monotonic() - t0,
        log=log,
        cpu_warnings=warnings,
        gauge_samples=[],
        killed=killed,
    )


def _wait_group(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Wait until every process of ``proc``'s session is gone; kill what is left after ``timeout_s``.

    Locust's workers outlive its master by a little: they write their raw latencies then.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    LOGGER.warning("Locust worker processes still ran %.0f s after the master exited; killing them", timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
