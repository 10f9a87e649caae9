"""The server fleet of an A/B run: the server at ``--url``, one the runner starts, or one per GPU.

:class:`ServerFleet` plans the servers (``--server-per-gpu``: one per GPU, each on its share of the
server cores as :mod:`~inflight.loadtest.runner.gpu_servers` plans it, with ``--balancer`` a load
balancer in front of them), starts and stops them, says where each variant's load goes, loads and
unloads each variant on every one of them, waits for them to drain, and reads what they say
(metrics, CPU times); the module's functions read a metrics endpoint and sum several servers'
counters.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from inflight.errors import ConfigError, InflightError
from inflight.loadtest import cpu
from inflight.loadtest import openloop as ol
from inflight.loadtest import stats as st
from inflight.loadtest.runner.config import (
    LOGGER_NAME,
    ROUTE_BALANCER,
    ROUTE_DIRECT,
    ROUTE_GPU_PREFIX,
    AbConfig,
    Endpoints,
    Variant,
    check_routes,
    gpu_list,
    route_of,
    url_endpoints,
)
from inflight.loadtest.runner.front import Front, plan_front
from inflight.loadtest.runner.gpu_servers import GpuServerPlan, plan_gpu_servers
from inflight.loadtest.runner.metrics import scrape, sum_counts
from inflight.log import DIAGNOSTICS_GROUP, plugin
from inflight.server import control
from inflight.server import ensemble as ens

LOGGER = logging.getLogger(LOGGER_NAME)

#: Seconds to wait after an open-loop window for the server to finish the requests it still holds.
DRAIN_TIMEOUT_S = 120.0


class ServerFleet:
    """The servers of one A/B run and what is done to all of them at once.

    Attributes:
        config: The run's configuration.
        cpu_sets: The server's and the generator's cores.
        data: The run's data folder (server logs, stall dumps).
        plans: One per server of ``--server-per-gpu``; empty: one server for every GPU (or the one at ``--url``).
        servers: The TritonServers this runner started, in start order (none: ``--url``).
        pids: Their process ids.
        front: The load balancer in front of the servers (``--balancer``), or None.
    """

    def __init__(self, config: AbConfig, variants: Sequence[Variant], cpu_sets: ol.CpuSets, data: Path) -> None:
        """Plan the servers.

        Raises:
            ConfigError: when ``--server-per-gpu`` does not fit the variants, the load or the cores.
        """
        self.config = config
        self.cpu_sets = cpu_sets
        self.data = data
        check_routes(variants, config)
        self.plans: list[GpuServerPlan] = self._plan(list(config.server_gpus), variants) if config.server_gpus else []
        self.servers: list[Any] = []
        self.pids: list[int] = []
        front = plan_front(config, cpu_sets, len(self.plans))
        self.front = Front(front, data) if front is not None else None

    @property
    def layout(self) -> str:
        """``one-server``, ``per-gpu-servers``, or ``per-gpu-servers+nginx`` (recorded in the document)."""
        if not self.plans:
            return "one-server"
        return "per-gpu-servers" + (f"+{self.front.plan.kind}" if self.front is not None else "")

    def _plan(self, gpus: list[int], variants: Sequence[Variant]) -> list[GpuServerPlan]:
        """Check ``--server-per-gpu`` against the variants and the load; plan one server per GPU.

        (What it needs of the rest of the configuration, :class:`AbConfig` checked itself.)

        Raises:
            ConfigError: saying what does not fit and how to fix it.
        """
        shape, flag = self.config.shape, f"--server-per-gpu {gpu_list(gpus)}"
        placed = [v.spec for v in variants if v.config.batching.gpus not in ((), (0,))]
        if placed:
            raise ConfigError(
                f"{flag}: {', '.join(placed)} places its instances with gpus=, but each server sees only its own GPU, "
                "as device 0; drop gpus= from the spec (every server then loads `instances` instances on its GPU) or "
                "write gpus=0"
            )
        spread = any(route_of(v, self.config) == ROUTE_DIRECT for v in variants)
        if spread and (shape.users < len(gpus) or shape.users % len(gpus)):
            raise ConfigError(
                f"{flag}: {len(gpus)} servers but {shape.users} generator source"
                f"{'s' if shape.users != 1 else ''}; each source sends to one server at the same rate, so give "
                f"every server as many: --processes a multiple of {len(gpus)}"
            )
        return plan_gpu_servers(gpus, self.cpu_sets.server, os.environ.get("CUDA_VISIBLE_DEVICES"))

    def plans_dict(self) -> list[dict[str, Any]]:
        """Each per-GPU server's GPU and cores (for the report's deployment line)."""
        return [{"gpu": p.gpu, "cpus": ol.format_cpus(p.cpus)} for p in self.plans]

    # -- start and stop ---------------------------------------------------------------------

    def start(self, workdir: Path) -> None:
        """Start the server (or one per GPU), appending each to ``servers`` once it runs.

        A server is appended as soon as it is up, so when a later one fails to start, :meth:`stop`
        stops the ones before it.
        """
        from inflight.server.config import ServerConfig
        from inflight.server.launcher import TritonServer

        common: dict[str, Any] = {
            "tritonserver": self.config.tritonserver,
            "backend_config": tuple(self.config.backend_config),
            "extra_args": tuple(self.config.server_args),
        }
        if not self.plans:
            cfg = ServerConfig.on_free_ports(self.config.repository, workdir, cpus=self.cpu_sets.server, **common)
            server = TritonServer(cfg)
            LOGGER.info("starting tritonserver (HTTP %s)", server.http_url)
            server.start()
            self.servers.append(server)
            self._note_pids()
            return
        for plan in self.plans:
            cfg = ServerConfig.on_free_ports(
                self.config.repository,
                workdir / f"gpu{plan.gpu}",
                cpus=plan.cpus,
                env={"CUDA_VISIBLE_DEVICES": plan.visible_device},
                **common,
            )
            server = TritonServer(cfg)
            LOGGER.info(
                "starting tritonserver for GPU %d (CUDA_VISIBLE_DEVICES=%s, %s; HTTP %s)",
                plan.gpu,
                plan.visible_device,
                f"cores {ol.format_cpus(plan.cpus)}" if plan.cpus else "not pinned",
                server.http_url,
            )
            server.start()
            self.servers.append(server)
        self._note_pids()
        if self.front is not None:
            self.front.start(self.endpoints(), workdir / "nginx")

    def _note_pids(self) -> None:
        self.pids = [s.process.pid for s in self.servers if s.process is not None]

    def endpoints(self) -> list[Endpoints]:
        """Where the load goes, chosen once: every started server's endpoints, or those of ``--url``.

        ``--grpc-url`` and ``--metrics-url`` replace the first server's.
        """
        if self.config.url is None:
            endpoints = [Endpoints(http=s.http_url, grpc=s.grpc_url, metrics=s.metrics_url) for s in self.servers]
        else:
            endpoints = [url_endpoints(self.config.url)]
        if self.config.grpc_url:
            endpoints[0].grpc = self.config.grpc_url
        if self.config.metrics_url:
            endpoints[0].metrics = self.config.metrics_url
        return endpoints

    def targets(self, v: Variant, endpoints: Sequence[Endpoints]) -> list[Endpoints]:
        """Where the generator sends ``v``'s load: the balancer, every server, or one GPU's server (its ``via=``)."""
        route = route_of(v, self.config)
        if route == ROUTE_BALANCER and self.front is not None:
            return [self.front.endpoints()]
        if route.startswith(ROUTE_GPU_PREFIX) and self.plans:
            gpu = int(route.removeprefix(ROUTE_GPU_PREFIX))
            return [e for plan, e in zip(self.plans, endpoints, strict=True) if plan.gpu == gpu]
        return list(endpoints)

    def stop(self) -> list[dict[str, Any]]:
        """Stop the balancer, then every server, each whatever happened to the others; copy the logs beside the results.

        Returns:
            Per server, in order: ``{"code", "reason", "log"}`` (``log``: the file name in the data folder).

        Raises:
            BaseException: an interrupt (Ctrl+C, SIGTERM) that came while stopping, once every server is stopped.
        """
        exits: list[dict[str, Any]] = []
        interrupted: BaseException | None = None
        if self.front is not None:
            try:
                self.front.stop()
            except BaseException as e:  # the servers are stopped whatever happened to the balancer
                LOGGER.error("stopping the balancer failed: %s: %s", type(e).__name__, e)
                if not isinstance(e, Exception):
                    interrupted = e
        for i, server in enumerate(self.servers):
            plan = self.plans[i] if self.plans else None
            name = plan.log_name if plan is not None else "tritonserver.log"
            what = f"tritonserver for GPU {plan.gpu}" if plan is not None else "tritonserver"
            code: int | None = None
            try:
                code = server.stop()
                reason = server.exit_reason
            except BaseException as e:  # one failed stop must not leave the other servers running
                reason = f"stopping it failed: {type(e).__name__}: {e}"
                LOGGER.error("%s: %s; killing its process group", what, reason)
                kill_server(server)
                if not isinstance(e, Exception) and interrupted is None:
                    interrupted = e
            log = self.data / name
            with contextlib.suppress(OSError):
                shutil.copy(server.log_path, log)
            LOGGER.info(
                "%s stopped (exit code %s%s); its log: %s",
                what,
                code,
                f", not gracefully: {reason}" if reason else "",
                log,
            )
            exits.append({"code": code, "reason": reason, "log": name})
        if interrupted is not None:
            raise interrupted
        return exits

    def attach_exits(self, doc: dict[str, Any], exits: Sequence[Mapping[str, Any]]) -> None:
        """How each server (and the balancer) exited, into the document's ``server`` block and its caveats."""
        if self.front is not None and "balancer" in doc["server"]:
            front_exit = self.front.exit
            doc["server"]["balancer"]["exit"] = front_exit
            if front_exit is not None and front_exit["reason"]:
                doc["caveats"].append(
                    f"the balancer ({self.front.plan.kind}) exited non-gracefully: {front_exit['reason']}"
                )
        if not self.plans:
            (ex,) = exits
            doc["server"]["exit"] = {"code": ex["code"], "reason": ex["reason"]}
            if ex["reason"]:
                doc["caveats"].append(f"tritonserver exited non-gracefully (code {ex['code']}): {ex['reason']}")
            return
        for entry, ex in zip(doc["server"]["per_gpu_servers"], exits, strict=False):
            entry["exit"] = {"code": ex["code"], "reason": ex["reason"]}
            if ex["reason"]:
                doc["caveats"].append(
                    f"tritonserver for GPU {entry['gpu']} exited non-gracefully (code {ex['code']}): {ex['reason']}"
                )
        codes = [ex["code"] for ex in exits]
        reasons = [
            f"GPU {entry['gpu']}: {ex['reason']}"
            for entry, ex in zip(doc["server"]["per_gpu_servers"], exits, strict=False)
            if ex["reason"]
        ]
        # every server's exit in one: the first unclean code (0 when all were clean), every reason
        doc["server"]["exit"] = {
            "code": next((c for c in codes if c != 0), 0 if codes else None),
            "reason": "; ".join(reasons) or None,
        }

    # -- variants ---------------------------------------------------------------------------

    def load(self, endpoints: Sequence[Endpoints], v: Variant) -> float:
        """Load ``v`` on every server (side by side when several); the seconds until all had it.

        An ensemble's encoder loads first, then its other steps, then the ensemble (each step must be
        loaded before the ensemble that names it).
        """
        order = ens.load_order(v.config, v.ensemble)

        def load_all(http: str) -> None:
            for name, config_json in order:
                control.load_config(http, name, config_json)

        t0 = time.perf_counter()
        if len(endpoints) == 1:
            load_all(endpoints[0].http)
            return time.perf_counter() - t0
        with ThreadPoolExecutor(len(endpoints), thread_name_prefix="load") as pool:
            futures = [pool.submit(load_all, e.http) for e in endpoints]
        for f in futures:
            f.result()  # the first server's failure, with its message
        return time.perf_counter() - t0

    def unload(self, v: Variant, tag: str, endpoints: Sequence[Endpoints], stalls: list[str]) -> dict[str, Any]:
        """Unload ``v`` from every server; what it took (and whether it stalled) as record fields.

        With one server per GPU the servers unload side by side; the record then gives the time until
        all were done, whether any was slow or stalled (``requests_at_stall`` summed over the stalled
        ones), and each server's own fields in ``per_server_unload``.
        """
        if not self.plans:
            return self._unload_one(v, tag, endpoints[0], stalls)
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(endpoints), thread_name_prefix="unload") as pool:
            futures = [
                pool.submit(self._unload_one, v, tag, e, stalls, plan=plan, pid=pid)
                for e, plan, pid in zip(endpoints, self.plans, self.pids, strict=True)
            ]
        parts = [f.result() for f in futures]
        record: dict[str, Any] = {"unload_s": round(time.monotonic() - t0, 2)}
        if any(r.get("unload_slow") for r in parts):
            record["unload_slow"] = True
        stalled = [r for r in parts if r.get("unload_stalled")]
        if stalled:
            record["unload_stalled"] = True
            at_stall = [r["requests_at_stall"] for r in stalled if "requests_at_stall" in r]
            if at_stall:
                record["requests_at_stall"] = sum_counts(at_stall)
        record["per_server_unload"] = [{"gpu": plan.gpu, **r} for plan, r in zip(self.plans, parts, strict=True)]
        return record

    def _unload_one(
        self,
        v: Variant,
        tag: str,
        endpoints: Endpoints,
        stalls: list[str],
        *,
        plan: GpuServerPlan | None = None,
        pid: int | None = None,
    ) -> dict[str, Any]:
        """Unload ``v`` from one server (``plan``: one of the per-GPU servers, ``pid`` its process)."""
        record: dict[str, Any] = {}
        if plan is None:
            pid = self.pids[0] if self.pids else None
        on = f" on the GPU {plan.gpu} server" if plan is not None else ""
        log_name = plan.log_name if plan is not None else "tritonserver.log"
        t_unload = time.monotonic()
        for name in ens.unload_order(v.config, v.ensemble):
            try:
                control.unload(endpoints.http, name, timeout_s=self.config.unload_timeout_s)
            except InflightError as e:
                # the window was measured in full; what follows it is either a slow unload (Triton
                # finalizes instances one at a time) or a stalled one, a server defect reported with the run
                try:
                    control.wait_unloaded(endpoints.http, name, self.config.unload_grace_s)
                    record["unload_slow"] = True
                    LOGGER.warning(
                        "%s: unloading %s%s took %.1f s (more than --unload-timeout %.0f s; completed)",
                        tag,
                        name,
                        on,
                        time.monotonic() - t_unload,
                        self.config.unload_timeout_s,
                    )
                except InflightError:
                    stuck = self.data / (f"{tag}-gpu{plan.gpu}-stuck" if plan is not None else f"{tag}-stuck")
                    text = scrape(endpoints.metrics)
                    if text is not None:
                        # where the requests that hold the unload are: Triton's queue (pending > 0) or not
                        counts = st.request_state(text, name)
                        lines = counts.pop("lines")
                        record["requests_at_stall"] = counts
                        stuck.mkdir(parents=True, exist_ok=True)
                        (stuck / "request-metrics.txt").write_text("\n".join(lines) + "\n")
                    dumps = dump_stuck_stubs(name, stuck, pid)
                    record["unload_stalled"] = True
                    waited = time.monotonic() - t_unload
                    stalls.append(
                        f"unloading {name}{on} stalled: {e}, still not unloaded {waited:.0f} s after the request "
                        f"(see {log_name} next to the results"
                        + (f"; what its {len(dumps)} running stub(s) were doing: {dumps[0].parent})" if dumps else ")")
                        + (
                            "; Triton 2.51's HTTP frontend does this when more replies finish at once than its socket "
                            "buffer holds, with a plain Python model too (README, Known limits): raise "
                            "net.core.wmem_default before the server starts (the runner's own server does, as root) "
                            "or run with --protocol grpc"
                            if self.config.shape.protocol == "http"
                            else ""
                        )
                    )
                    break  # an ensemble's steps stay loaded while it does
        record["unload_s"] = round(time.monotonic() - t_unload, 2)
        return record

    def drain(self, endpoints: Sequence[Endpoints], v: Variant, timeout_s: float = DRAIN_TIMEOUT_S) -> float | None:
        """Wait until ``v`` has no request queued and its answered count stopped moving on every server.

        An ensemble's steps are waited for too: a request between its steps is queued in neither.

        Returns the seconds it took; None when a metrics endpoint cannot tell (the wait is then
        skipped) or the timeout passed (a warning says so; the next window's figures then include
        the backlog).
        """
        t0 = time.monotonic()
        models = [v.name, *(v.ensemble.step_models() if v.ensemble is not None else [])]
        last: tuple[tuple[int | None, int | None], ...] | None = None
        while time.monotonic() - t0 < timeout_s:
            states = []
            for e in endpoints:
                text = scrape(e.metrics)
                if text is None:
                    return None
                states += [st.request_state(text, m) for m in models]
            now = tuple((c.get("success"), c.get("failure")) for c in states)
            if all(c.get("pending") in (0, None) for c in states) and now == last:
                return round(time.monotonic() - t0, 2)
            last = now
            time.sleep(0.5)
        LOGGER.warning("%s still had requests queued or running %.0f s after the window", v.name, timeout_s)
        return None

    def cpu_snapshot(self) -> tuple[cpu.CpuSnapshot, cpu.CpuSnapshot | None]:
        """(the servers' cores with their process trees, the generator's cores) — one snapshot when not pinned.

        With one server per GPU, the server side is every server's tree on the union of their shares.
        """
        sets = self.cpu_sets
        if not sets.isolated:
            return cpu.snapshot(self.pids), None
        cores = sorted({c for plan in self.plans for c in plan.cpus}) or sets.server
        return cpu.snapshot(self.pids, cores=cores), cpu.snapshot(None, cores=sets.client)

    # -- the document -----------------------------------------------------------------------

    def block(self, endpoints: Sequence[Endpoints], runs: Sequence[Mapping[str, Any]], started: bool) -> dict[str, Any]:
        """The document's ``server`` block; with one server per GPU, each server's own figures too.

        ``http``/``grpc``/``metrics`` list every server's endpoint (comma-separated, as the generator's
        ``--url`` takes them); ``per_gpu_servers`` gives each server's GPU, cores and endpoints (its
        ``exit`` is added once it stopped) and ``per_server_requests`` the successful requests each
        answered in the measured windows.
        """
        block: dict[str, Any] = {
            "http": ",".join(e.http for e in endpoints),
            "grpc": ",".join(e.grpc for e in endpoints),
            "metrics": ",".join(e.metrics for e in endpoints),
            "started_by_runner": started,
            "backend_config": list(self.config.backend_config),
            "server_args": list(self.config.server_args),
            "repository": str(self.config.repository.resolve()),
            "layout": self.layout,
        }
        if not self.plans:
            return block
        per_window = [r["per_server_requests"] for r in runs if r.get("per_server_requests")]
        block["server_gpus"] = [plan.gpu for plan in self.plans]
        block["per_gpu_servers"] = [
            {
                "gpu": plan.gpu,
                "cuda_visible_devices": plan.visible_device,
                "cpus": ol.format_cpus(plan.cpus),
                "http": e.http,
                "grpc": e.grpc,
                "metrics": e.metrics,
                "pid": pid,
            }
            for plan, e, pid in zip(self.plans, endpoints, self.pids, strict=False)
        ]
        block["per_server_requests"] = [sum(int(w[i] or 0) for w in per_window) for i in range(len(self.plans))]
        if self.front is not None:
            block["balancer"] = self.front.block()
        return block


def kill_server(server: Any) -> None:
    """SIGKILL a TritonServer's process group (its stop failed) and reap it."""
    proc = getattr(server, "process", None)
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)


def dump_stuck_stubs(model: str, out_dir: Path, parent_pid: int | None) -> list[Path]:
    """What the lab's stall diagnostics (entry point ``stuck_stubs``) found in the model's stuck stubs.

    An empty list, with a warning, where they are not installed.
    """
    try:
        dump = plugin(DIAGNOSTICS_GROUP, "stuck_stubs", "install inflight as a package (`pip install -e .`)")
    except LookupError as e:
        LOGGER.warning("no stack dumps of the stuck stubs: %s", e)
        return []
    dumps: list[Path] = dump(model, out_dir, parent_pid=parent_pid)
    return dumps
