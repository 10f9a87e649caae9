"""The load balancer in front of the per-GPU servers (``--balancer nginx``): its cores, its process, its record.

:func:`plan_front` decides once where nginx runs and with how many workers (the rule is recorded);
:class:`Front` starts it over the servers' HTTP endpoints, reads its CPU time per window, stops it
(whatever happened: the fleet stops it before its servers) and writes the document's ``balancer`` block.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inflight.errors import ConfigError
from inflight.loadtest import cpu
from inflight.loadtest import openloop as ol
from inflight.loadtest.runner.config import LOGGER_NAME, AbConfig, Endpoints

LOGGER = logging.getLogger(LOGGER_NAME)

#: The balancer's error log, copied next to the results when it stops.
LOG_NAME = "nginx-error.log"


@dataclass(frozen=True, kw_only=True)
class FrontPlan:
    """Where the balancer runs.

    Attributes:
        kind: ``nginx``.
        cpus: Its cores (empty: not pinned).
        own_cores: True when they are its own (``--balancer-cpus``), False when it shares the server cores.
        workers: nginx worker processes.
        rule: How the cores and workers were chosen (recorded).
    """

    kind: str
    cpus: tuple[int, ...]
    own_cores: bool
    workers: int
    rule: str


def own_cores(config: AbConfig, available: list[int]) -> list[int]:
    """The balancer's own cores (``--balancer-cpus``), checked against this run's cores and the other sets.

    Raises:
        ConfigError: for cores this run cannot use, or that ``--server-cpus``/``--client-cpus`` also name.
    """
    if config.balancer is None or config.balancer_cpus is None:
        return []
    own = ol.parse_cpus(config.balancer_cpus)
    if not set(own) <= set(available):
        raise ConfigError(
            f"--balancer-cpus {ol.format_cpus(own)}: not all of these cores are available to this process "
            f"(available: {ol.format_cpus(available)})"
        )
    for flag, given in (("--server-cpus", config.server_cpus), ("--client-cpus", config.client_cpus)):
        shared = set(own) & set(ol.parse_cpus(given)) if given else set()
        if shared:
            raise ConfigError(
                f"--balancer-cpus {ol.format_cpus(own)} overlaps {flag} {given} (cores "
                f"{ol.format_cpus(sorted(shared))}): give the balancer cores of its own, or drop --balancer-cpus "
                "(it then shares the server cores)"
            )
    return own


def plan_front(config: AbConfig, cpu_sets: ol.CpuSets, servers: int) -> FrontPlan | None:
    """The balancer's cores and workers (None without ``--balancer``).

    The rule: with ``--balancer-cpus`` it runs on those cores alone (kept out of the server's and the
    generator's sets) with one worker per core; without, it shares the server cores (the union of the
    per-GPU shares: its cost comes out of the servers' budget, as on a host that runs both) with one
    worker per server. ``--balancer-workers`` sets the workers either way.
    """
    if config.balancer is None:
        return None
    workers = config.balancer_workers
    if config.balancer_cpus is not None:
        cpus = tuple(ol.parse_cpus(config.balancer_cpus))
        n = workers or len(cpus)
        rule = f"its own cores {ol.format_cpus(cpus)} (--balancer-cpus), {n} worker{'s' if n != 1 else ''}"
        return FrontPlan(kind=config.balancer, cpus=cpus, own_cores=True, workers=n, rule=rule)
    n = workers or servers
    where = f"the server cores {ol.format_cpus(cpu_sets.server)}" if cpu_sets.server else "not pinned"
    rule = f"{where} (no --balancer-cpus: it shares the servers' cores), {n} worker{'s' if n != 1 else ''}" + (
        " (--balancer-workers)" if workers else " (one per server)"
    )
    return FrontPlan(kind=config.balancer, cpus=tuple(cpu_sets.server), own_cores=False, workers=n, rule=rule)


class Front:
    """The balancer of one run: started over the servers, read per window, stopped on every exit path.

    Attributes:
        plan: Where it runs.
        data: The run's data folder (its error log goes there).
        balancer: The running :class:`~inflight.server.balancer.Balancer` (None before start and after stop).
        pid: nginx's master process (None before start).
        version: ``nginx -v``'s answer (``nginx/1.22.1``).
        config_text: The configuration it ran with.
        exit: ``{"code", "reason"}`` once stopped.
    """

    def __init__(self, plan: FrontPlan, data: Path) -> None:
        """A balancer as ``plan`` says, writing into ``data``."""
        self.plan = plan
        self.data = data
        self.balancer: Any = None
        self.pid: int | None = None
        self.binary: str | None = None
        self.version: str | None = None
        self.config_text = ""
        self.url: str | None = None
        self.upstreams: list[str] = []
        self.exit: dict[str, Any] | None = None
        self._workdir: Path | None = None

    def start(self, servers: list[Endpoints], workdir: Path) -> None:
        """Start nginx over the servers' HTTP endpoints and wait until Triton answers through it.

        Raises:
            ServerError: when nginx is missing, refuses its configuration, or no server answers through it.
        """
        from inflight.server.balancer import Balancer, find_nginx, nginx_version
        from inflight.server.config import free_port

        binary = find_nginx()
        self.binary, self.version = str(binary), nginx_version(binary)
        self.upstreams = [e.http for e in servers]
        self._workdir = workdir
        self.balancer = Balancer(
            self.upstreams,
            free_port(),
            workdir,
            workers=self.plan.workers,
            cpus=ol.format_cpus(self.plan.cpus),
            nginx=binary,
        )
        LOGGER.info(
            "starting %s (%s) in front of %d servers on %s",
            self.version or "nginx",
            binary,
            len(servers),
            self.plan.rule,
        )
        self.balancer.start()
        self.url = self.balancer.url
        self.pid = self.balancer.proc.pid if self.balancer.proc is not None else None
        with contextlib.suppress(OSError):
            self.config_text = (workdir / "nginx.conf").read_text()
        self.balancer.ready()
        LOGGER.info("balancer on %s answers for the servers %s", self.url, ", ".join(self.upstreams))

    def endpoints(self) -> Endpoints:
        """Where the generator sends a variant that goes through the balancer (HTTP only: no gRPC, no metrics)."""
        assert self.url is not None, "the balancer was not started"
        return Endpoints(http=self.url, grpc="", metrics="")

    def stop(self) -> None:
        """Stop nginx (graceful quit, then a kill) and copy its error log next to the results; safe twice."""
        balancer, self.balancer = self.balancer, None
        if balancer is None:
            return
        proc = balancer.proc
        reason: str | None = None
        try:
            balancer.stop()
        except BaseException as e:  # an interrupt while it quits must not leave nginx running
            reason = f"stopping it failed: {type(e).__name__}: {e}"
            LOGGER.error("balancer: %s; killing its process group", reason)
            _kill(proc)
            if not isinstance(e, Exception):
                self.exit = {"code": proc.returncode if proc is not None else None, "reason": reason}
                raise
        code = proc.returncode if proc is not None else None
        if proc is not None and code is None:
            reason = reason or "still running after the stop"
        elif code not in (0, None):
            reason = reason or f"exited with code {code}"
        self.exit = {"code": code, "reason": reason}
        if self._workdir is not None:
            with contextlib.suppress(OSError):
                shutil.copy(self._workdir / "nginx-error.log", self.data / LOG_NAME)
        LOGGER.info("balancer stopped (exit code %s); its error log: %s", code, self.data / LOG_NAME)

    def snapshot(self) -> cpu.CpuSnapshot | None:
        """The CPU times of nginx (master and workers) and of its cores (None when it is not running)."""
        if self.pid is None or self.balancer is None:
            return None
        return cpu.snapshot(self.pid, cores=self.plan.cpus)

    @staticmethod
    def window(before: cpu.CpuSnapshot | None, after: cpu.CpuSnapshot | None, requests: int | None) -> dict[str, Any]:
        """The balancer's CPU in a window: cores busy with nginx, its microseconds per request, its cores' load."""
        if before is None or after is None:
            return {}
        w = cpu.window(before, after, requests)
        return {
            "nginx_cores": w["server_cores"],
            "us_per_request": w["server_us_per_request"],
            "cores_busy": w["host_busy"],
            "wall_s": w["wall_s"],
        }

    def block(self) -> dict[str, Any]:
        """The document's ``server.balancer``: what ran, where, with which configuration, and how it exited."""
        return {
            "kind": self.plan.kind,
            "version": self.version,
            "binary": self.binary,
            "url": self.url,
            "upstreams": self.upstreams,
            "policy": "round robin, keep-alive connections to every server",
            "workers": self.plan.workers,
            "cpus": ol.format_cpus(self.plan.cpus),
            "own_cores": self.plan.own_cores,
            "cpus_rule": self.plan.rule,
            "pid": self.pid,
            "config": self.config_text,
            "log": LOG_NAME,
            "exit": self.exit,
        }


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL nginx's process group (master and workers) and reap the master."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
