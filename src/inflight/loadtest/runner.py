"""The A/B runner: the same load against each variant in turn, on one tritonserver (or one per GPU).

For each variant (``bert_tiny_sync@instances=4,delay_us=500``...), in the order given and, with
``repeat``, interleaved with the order reversed every other round (A, B, B, A...):

1. load it under its name with its config override (``control.load_variant``);
2. warm up for ``warmup_s`` under the same load (a Locust run that is not measured);
3. snapshot the server statistics and the CPU times (``inflight.loadtest.cpu``); run Locust
   headless for the window (``--reset-stats``: the statistics start once every user is running)
   while sampling the backend's live GPU gauges and printing a progress line; snapshot again;
4. unload it.

Every variant sees the same load shape, seed, request pool and warm-up. A run is flagged
client-limited (kept, a lower bound for the server) when Locust reports its own CPU above 90%,
and marked invalid when Locust fails or no request succeeded. Results go to ``<out>/ab-<timestamp>.json`` (all
raw figures, the variant configs, versions and device) and the report next to it.

With ``server_gpus`` (``inflight ab --server-per-gpu 0,1``, open loop with the asyncio generator only)
the runner starts one tritonserver per listed GPU instead, each seeing only its GPU
(``CUDA_VISIBLE_DEVICES``) on its own contiguous share of the server cores
(:func:`~inflight.loadtest.openloop.share_cpus`), loads every variant on each, spreads the
generator's sources over them, and sums what the servers say (statistics, metrics, CPU, stub
memory, executor counters) into the figures of one deployment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import importlib.metadata
import json
import logging
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

import inflight
from inflight.errors import ConfigError, InflightError
from inflight.loadtest import cpu, rategen
from inflight.loadtest import openloop as ol
from inflight.loadtest import stats as st
from inflight.loadtest import workload as wl
from inflight.loadtest.presets import LoadShape
from inflight.log import DIAGNOSTICS_GROUP, plugin
from inflight.server import control
from inflight.variants import VariantConfig, parse_variant_arg

LOGGER = logging.getLogger(__name__)

SCHEMA = "inflight-ab/1"
USER_CLASSES = {"http": "TritonHttpUser", "grpc": "TritonGrpcUser"}
Generator = Literal["locust", "asyncio"]
GENERATORS: tuple[Generator, ...] = ("locust", "asyncio")
OPEN_LOOP_USER_CLASS = "OpenLoopHttpUser"
#: Seconds to wait after an open-loop window for the server to finish the requests it still holds.
DRAIN_TIMEOUT_S = 120.0
#: Windows a capacity search usually takes (for the time estimate only).
SEARCH_WINDOWS_ESTIMATE = 6
#: Seconds a Locust run may exceed its planned duration (start-up, stop, summary) before it is killed.
LOCUST_GRACE_S = 120.0
#: Shortest Locust run in which its CPU warning can appear (it samples every 10 s; the first is a baseline).
LOCUST_CPU_VISIBLE_S = 20.0
#: Rough start-up/stop cost of one Locust run, for the overall time estimate only.
LOCUST_OVERHEAD_S = 4.0


@dataclass(kw_only=True)
class AbConfig:
    """One A/B test.

    Attributes:
        variants: Variant specs, ``name[@key=value,...]``; the first is the baseline A.
        shape: The load, identical for every variant.
        repository: Model repository (configs to override, artifacts for ``--check``).
        out: Folder for the JSON, the report and the raw data.
        url: HTTP ``host:port`` of a running server; None starts one on free ports.
        grpc_url: gRPC ``host:port`` (default: the URL's host, port 8001).
        metrics_url: Metrics endpoint (default: ``http://<host>:8002/metrics``).
        repeat: Rounds; each round runs every variant once (A, B, A, B...).
        locustfile: The Locust file (default: ``loadtest/locustfile.py`` of the checkout).
        tritonserver: Server binary when the runner starts one.
        backend_config: Extra ``--backend-config`` entries for the server it starts.
        server_args: More tritonserver arguments for the server it starts (e.g. ``--http-thread-count=16``).
        keep_raw: Keep the raw latency files (they can be large) and the request pools next to the results.
        progress_interval_s: Seconds between progress lines and GPU gauge samples.
        preset: Name of the preset the shape came from (recorded only).
        unload_timeout_s: How long a variant may take to unload after its window. Triton
            finalizes a model's instances one after another (about 2 s each for bert_tiny on the
            H200), so a many-instance variant can take longer: the runner then waits
            ``unload_grace_s`` more and records a *slow* unload if it completes (not a problem), or
            a *stalled* one if it does not (a caveat of that run, with a dump of its stubs and
            Triton's request counters), and goes on with the next variant.
        unload_grace_s: The extra wait that tells a slow unload from a stalled one.
        rates: Open loop: offered rates (requests per second) to sweep, one window each; empty and
            no ``search``: closed loop.
        search: Open loop: ``(low, high)`` req/s of a capacity search by bisection after the sweep.
        slo_ms: p99 latency SLO of the capacity (milliseconds, from the scheduled send time).
        search_tolerance: The search stops when its interval is within this fraction of its low end.
        search_steps: Most midpoints the search measures.
        rate_repeat: Open loop: consecutive windows at each ``rates`` entry (a soak: one rate, several
            windows, the variant loaded throughout; the report compares the first and last).
        server_cpus: Cores of the server (``taskset -c`` form); None: chosen by ``split_cpus``.
        client_cpus: Cores of the load generator (and this runner); None: chosen likewise.
        isolate: Pin the server and the generator to disjoint cores when the host has enough.
        generator: Open loop: ``locust`` (Locust's ``OpenLoopHttpUser``) or ``asyncio``
            (:mod:`inflight.loadtest.rategen`, for rates Locust cannot hold on the generator's cores).
        server_gpus: GPU indices, one tritonserver per entry (open loop with the asyncio generator,
            no ``url``): each sees only its GPU (``CUDA_VISIBLE_DEVICES``, through the inherited one
            when set), as device 0, and runs on its own contiguous share of ``server_cpus``; the
            generator's sources are spread over the servers. Empty: one server for every GPU.
    """

    variants: Sequence[str]
    shape: LoadShape
    repository: Path
    out: Path = Path("results")
    url: str | None = None
    grpc_url: str | None = None
    metrics_url: str | None = None
    repeat: int = 1
    locustfile: Path | None = None
    tritonserver: str | None = None
    backend_config: Sequence[str] = ()
    server_args: Sequence[str] = ()
    keep_raw: bool = False
    progress_interval_s: float = 5.0
    preset: str | None = None
    unload_timeout_s: float = 120.0
    unload_grace_s: float = 60.0
    rates: Sequence[float] = ()
    search: tuple[float, float] | None = None
    slo_ms: float = ol.DEFAULT_SLO_MS
    search_tolerance: float = 0.05
    search_steps: int = 6
    rate_repeat: int = 1
    server_cpus: str | None = None
    client_cpus: str | None = None
    isolate: bool = True
    generator: Generator = "locust"
    server_gpus: Sequence[int] = ()


@dataclass(kw_only=True)
class Variant:
    """A variant to test: its label (A, B...), spec string and resolved configuration."""

    label: str
    spec: str
    config: VariantConfig
    overrides: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The name the server serves it under."""
        return self.config.model_name


@dataclass(kw_only=True)
class Endpoints:
    """Where the server listens."""

    http: str
    grpc: str
    metrics: str


@dataclass(frozen=True, kw_only=True)
class GpuServerPlan:
    """One of the servers of ``--server-per-gpu``: its GPU, what it is shown as, and its cores.

    Attributes:
        gpu: The GPU index as listed (among the GPUs this run sees).
        visible_device: The server's ``CUDA_VISIBLE_DEVICES`` (the GPU's entry in the inherited one).
        cpus: Its cores (empty: not pinned).
    """

    gpu: int
    visible_device: str
    cpus: tuple[int, ...]

    @property
    def log_name(self) -> str:
        """File name of its log next to the results."""
        return f"tritonserver-gpu{self.gpu}.log"


def visible_device(gpu: int, inherited: str | None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` that shows a server GPU ``gpu`` of this run alone.

    GPU indices count the GPUs this run sees: without an inherited ``CUDA_VISIBLE_DEVICES`` that is
    ``str(gpu)``; with one (a lane of a shared host, ``2,3``) it is that list's ``gpu``-th entry.

    Raises:
        ConfigError: when the inherited list shows fewer GPUs.
    """
    if inherited is None:
        return str(gpu)
    shown = [x.strip() for x in inherited.split(",") if x.strip()]
    if gpu >= len(shown):
        raise ConfigError(
            f"--server-per-gpu: GPU {gpu} is not visible to this run: CUDA_VISIBLE_DEVICES={inherited!r} shows "
            f"{len(shown)} GPU{'s' if len(shown) != 1 else ''} (indices 0..{len(shown) - 1}); list GPUs among them or "
            "unset CUDA_VISIBLE_DEVICES"
        )
    return shown[gpu]


def plan_gpu_servers(gpus: Sequence[int], server_cpus: Sequence[int], inherited: str | None) -> list[GpuServerPlan]:
    """One server per GPU of ``gpus``, each on its contiguous share of ``server_cpus`` (see ``share_cpus``).

    Raises:
        ConfigError: for no GPU, a negative or repeated index, a GPU the inherited
            ``CUDA_VISIBLE_DEVICES`` does not show, or more servers than server cores.
    """
    if not gpus:
        raise ConfigError("--server-per-gpu names no GPU; list one or more, e.g. 0,1")
    bad = [g for g in gpus if g < 0]
    if bad:
        raise ConfigError(f"--server-per-gpu {_gpu_list(gpus)}: {bad[0]} is not a GPU index (0, 1, ...)")
    twice = sorted({g for g in gpus if list(gpus).count(g) > 1})
    if twice:
        raise ConfigError(
            f"--server-per-gpu {_gpu_list(gpus)}: GPU {', '.join(map(str, twice))} listed more than once; list each "
            "GPU once (one server per GPU)"
        )
    try:
        shares = ol.share_cpus(server_cpus, len(gpus))
    except ConfigError as e:
        raise ConfigError(f"--server-per-gpu {_gpu_list(gpus)}: {e}") from None
    return [
        GpuServerPlan(gpu=g, visible_device=visible_device(g, inherited), cpus=cpus)
        for g, cpus in zip(gpus, shares, strict=True)
    ]


T = TypeVar("T")


def round_order(variants: Sequence[T], repeat: int) -> list[tuple[int, T]]:
    """The (round, variant) runs of ``repeat`` rounds: the given order, reversed every other round (A B, B A, ...).

    Alternating balances what running first or second costs a variant (a server that just left an
    overload window, caches warmed by the one before): with an even number of rounds each variant
    runs first as often as last.
    """
    return [(r, v) for r in range(repeat) for v in (variants if r % 2 == 0 else list(reversed(variants)))]


def _gpu_list(gpus: Sequence[int]) -> str:
    return ",".join(map(str, gpus))


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


def resolve_variants(specs: Sequence[str], repository: Path) -> list[Variant]:
    """Parse ``name@key=value,...`` specs and read/override each config from the repository.

    Raises:
        ConfigError: for no variants, a bad spec, or an unknown model.
        ServerError: when a config.pbtxt is missing (build the repository first).
    """
    if not specs:
        raise ConfigError("name at least one variant, e.g. `inflight ab bert_tiny_sync bert_tiny_inflight`")
    out = []
    for i, spec in enumerate(specs):
        name, overrides = parse_variant_arg(spec)
        vc = control.variant_config(repository, name, overrides)
        label = chr(ord("A") + i) if i < 26 else f"V{i + 1}"
        out.append(Variant(label=label, spec=spec, config=vc, overrides=overrides))
    return out


class _TermAsExit:
    """While alive, SIGTERM (e.g. from ``timeout``) raises SystemExit, so the runner's cleanup runs.

    The server is then stopped and its log copied next to the results instead of being lost.
    """

    def __init__(self) -> None:
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._raise)

    @staticmethod
    def _raise(signum: int, frame: object) -> None:
        LOGGER.warning("SIGTERM: stopping the A/B run and the server; results so far are not written")
        raise SystemExit(128 + signum)

    def restore(self) -> None:
        """Put the previous SIGTERM handler back."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


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
        from inflight.server.launcher import free_port

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


def _kill_server(server: Any) -> None:
    """SIGKILL a TritonServer's process group (its stop failed) and reap it."""
    proc = getattr(server, "process", None)
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _dump_stuck_stubs(model: str, out_dir: Path, parent_pid: int | None) -> list[Path]:
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


def scrape(url: str, timeout_s: float = 5.0) -> str | None:
    """The metrics endpoint's text, or None when it cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return str(r.read().decode("utf-8", errors="replace"))
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        LOGGER.debug("metrics endpoint %s: %s", url, e)
        return None


def _joined(texts: Iterable[str | None]) -> str | None:
    """The servers' metrics texts that could be read, as one (None when none could).

    For means over instances (the GPU gauges) only: Triton's request counters must be read per
    server (:func:`~inflight.loadtest.stats.request_state` merges a series seen twice).
    """
    got = [t for t in texts if t is not None]
    return "\n".join(got) if got else None


def _sum_counts(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Request counters of several servers (:func:`~inflight.loadtest.stats.request_state`) summed key by key.

    A key is None where no server publishes it; the raw ``lines`` are left out.
    """
    keys = list(dict.fromkeys(k for p in parts for k in p if k != "lines"))
    out: dict[str, Any] = {}
    for k in keys:
        values = [p[k] for p in parts if p.get(k) is not None]
        out[k] = sum(values) if values else None
    return out


def _per_server_requests(befores: Sequence[Mapping[str, Any]], afters: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """Successful requests each server counted between its two statistics snapshots (None where they disagree)."""
    out: list[int | None] = []
    for b, a in zip(befores, afters, strict=True):
        try:
            out.append(st.stats_delta(b, a).requests)
        except st.StatsError:
            out.append(None)
    return out


def device_info() -> dict[str, Any]:
    """The GPU (name, driver, memory) from nvidia-smi, or ``{"name": "cpu"}`` without one."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run(
                [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            gpus = [
                dict(zip(("name", "driver", "memory"), (x.strip() for x in line.split(",")), strict=False))
                for line in r.stdout.strip().splitlines()
            ]
            if gpus:
                return {"name": gpus[0]["name"], "driver": gpus[0].get("driver"), "gpus": gpus}
        except (OSError, subprocess.SubprocessError) as e:
            LOGGER.warning("nvidia-smi failed (%s); recording the device as cpu", e)
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"name": "cpu", "driver": None, "cpu_model": cpu, "cpus": os.cpu_count()}


def versions(http_url: str | None) -> dict[str, str | None]:
    """Versions of tritonserver (asked from the server), locust, torch, inflight and friends."""

    def dist(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    server: str | None = None
    if http_url:
        client = control.http_client(http_url)
        try:
            server = str(client.get_server_metadata().get("version"))
        except Exception as e:  # any client failure: the version is then unknown, not fatal
            LOGGER.warning("could not ask %s for its version: %s", http_url, e)
        finally:
            client.close()
    return {
        "tritonserver": server,
        "locust": dist("locust"),
        "torch": dist("torch"),
        "inflight": inflight.__version__,
        "tritonclient": dist("tritonclient"),
        "numpy": dist("numpy"),
        "python": platform.python_version(),
    }


def _num(x: object) -> str:
    return f"{x:.1f}" if isinstance(x, (int, float)) and math.isfinite(x) else "?"


def _fmt_s(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def progress_time(elapsed_s: float, window_s: float, ramp_s: float, startup_s: float = LOCUST_OVERHEAD_S) -> str:
    """How far a Locust run is: seconds since it was started against what it should take in all.

    The run takes Locust's own start-up (about ``startup_s``), the ramp-up and the measured window,
    so the elapsed time is shown against their sum, each part named, and an overrun said as one.
    """
    planned = startup_s + ramp_s + window_s
    parts = f"Locust start-up ~{_fmt_s(startup_s)}, ramp-up {_fmt_s(ramp_s)}, window {_fmt_s(window_s)}"
    if elapsed_s <= planned:
        return f"{_fmt_s(elapsed_s)} of about {_fmt_s(planned)} ({parts})"
    return f"{_fmt_s(elapsed_s)}, past the planned {_fmt_s(planned)} ({parts}): waiting for Locust to finish"


class AbRunner:
    """Runs an ``AbConfig`` and writes its JSON and report (see the module docstring)."""

    def __init__(self, config: AbConfig) -> None:
        self.config = config
        self.shape = config.shape
        self.shape.check_values()
        if config.repeat < 1:
            raise ConfigError(f"--repeat {config.repeat}: run each variant at least once")
        self.variants = resolve_variants(config.variants, config.repository)
        nulls = [v.spec for v in self.variants if v.config.variant == "null"]
        if self.shape.check and nulls:
            raise ConfigError(
                f"--check compares responses with the model, but {', '.join(nulls)} is the null control model "
                "(it answers zeros); drop --check or the null variant"
            )
        self.locustfile = (config.locustfile or default_locustfile()).resolve()
        if not self.locustfile.is_file():
            raise ConfigError(f"--locustfile {self.locustfile} does not exist")
        now = dt.datetime.now()
        self.run_id = f"ab-{now:%Y%m%d-%H%M%S}"
        self._server_pids: list[int] = []  # the servers this runner started (none: --url)
        self.started = now.astimezone().isoformat(timespec="seconds")
        self.out = config.out
        self.data = self.out / self.run_id
        self._t0 = 0.0
        self._planned_total = 0.0
        self.open_loop = bool(config.rates) or config.search is not None
        if self.open_loop:
            if config.generator not in GENERATORS:
                raise ConfigError(f"--generator {config.generator!r}: choose one of {', '.join(GENERATORS)}")
            if self.shape.protocol != "http" and config.generator != "asyncio":
                raise ConfigError(
                    f"--protocol {self.shape.protocol}: Locust's open-loop user (--rate/--search) speaks HTTP only; "
                    "add --generator asyncio (it speaks both) or drop --protocol"
                )
            if config.rate_repeat < 1:
                raise ConfigError(f"--rate-repeat {config.rate_repeat}: measure each rate at least once")
            if config.slo_ms <= 0:
                raise ConfigError(f"--slo {config.slo_ms}: give a p99 latency SLO > 0 milliseconds")
            if config.search is not None:
                lo, hi = config.search
                if not 0 < lo < hi:
                    raise ConfigError(f"--search {lo:g},{hi:g}: give LOW,HIGH requests per second with 0 < LOW < HIGH")
        elif config.generator != "locust":
            raise ConfigError(
                f"--generator {config.generator}: the asyncio generator sends open-loop load only; add --rate or "
                "--search, or drop --generator"
            )
        available = cpu.run_cores()
        if config.isolate or config.server_cpus or config.client_cpus:
            self.cpu_sets = ol.split_cpus(available, config.server_cpus, config.client_cpus, isolate=config.isolate)
        else:
            self.cpu_sets = ol.CpuSets((), (), "not pinned (--no-isolate)")
        if config.url is not None and self.cpu_sets.isolated:
            # a server this runner did not start keeps its own cores; only the generator is pinned
            self.cpu_sets = ol.CpuSets(
                (),
                self.cpu_sets.client,
                f"server at --url not pinned by the runner; generator on {ol.format_cpus(self.cpu_sets.client)}",
            )
        #: One server per GPU (``--server-per-gpu``); empty: one server for every GPU (or the one at --url).
        self.gpu_servers: list[GpuServerPlan] = (
            self._plan_gpu_servers(list(config.server_gpus)) if config.server_gpus else []
        )

    def _plan_gpu_servers(self, gpus: list[int]) -> list[GpuServerPlan]:
        """Check ``--server-per-gpu`` against the rest of the configuration; plan one server per GPU.

        Raises:
            ConfigError: saying what does not fit and how to fix it.
        """
        c, flag = self.config, f"--server-per-gpu {_gpu_list(gpus)}"
        if not self.open_loop or c.generator != "asyncio":
            raise ConfigError(
                f"{flag} spreads open-loop load over one server per GPU, which only the asyncio generator can send "
                "(Locust's users send to one URL); add --rate or --search and --generator asyncio"
            )
        if c.url is not None:
            raise ConfigError(
                f"{flag} starts its own servers, one per GPU; drop --url (or drop {flag} to measure the server at "
                f"{c.url})"
            )
        if c.grpc_url or c.metrics_url:
            raise ConfigError(
                f"{flag}: --grpc-url and --metrics-url name one server's endpoints, but the runner starts and watches "
                "every server itself; drop them"
            )
        placed = [v.spec for v in self.variants if v.config.batching.gpus not in ((), (0,))]
        if placed:
            raise ConfigError(
                f"{flag}: {', '.join(placed)} places its instances with gpus=, but each server sees only its own GPU, "
                "as device 0; drop gpus= from the spec (every server then loads `instances` instances on its GPU) or "
                "write gpus=0"
            )
        if self.shape.users < len(gpus) or self.shape.users % len(gpus):
            raise ConfigError(
                f"{flag}: {len(gpus)} servers but {self.shape.users} generator source"
                f"{'s' if self.shape.users != 1 else ''}; each source sends to one server at the same rate, so give "
                f"every server as many: --processes a multiple of {len(gpus)}"
            )
        return plan_gpu_servers(gpus, self.cpu_sets.server, os.environ.get("CUDA_VISIBLE_DEVICES"))

    def _plans_dict(self) -> list[dict[str, Any]]:
        return [{"gpu": p.gpu, "cpus": ol.format_cpus(p.cpus)} for p in self.gpu_servers]

    @property
    def json_path(self) -> Path:
        """``<out>/ab-<timestamp>.json``."""
        return self.out / f"{self.run_id}.json"

    def run(self) -> Path:
        """Run every round and variant; write the JSON and the report.

        Returns:
            The JSON path.

        Raises:
            ServerError: when the server cannot be started or reached, or a variant fails to load.
        """
        from inflight.loadtest import report

        self.data.mkdir(parents=True, exist_ok=True)
        pools = self._prepare_pools()
        servers: list[Any] = []  # the TritonServers this runner started, in start order
        # the server's backend folder (a copy of the Python backend) stays out of the results
        workdir = tempfile.TemporaryDirectory(prefix="inflight-ab-server-")
        stop_on_term = _TermAsExit()
        own_cores = cpu.run_cores()
        if self.cpu_sets.client:
            # this runner and every Locust process it starts run on the generator's cores
            os.sched_setaffinity(0, self.cpu_sets.client)
        LOGGER.info("CPU sets: %s", self.cpu_sets.to_dict())
        try:
            if self.config.url is None:
                self._start_servers(Path(workdir.name), servers)
                self._server_pids = [s.process.pid for s in servers if s.process is not None]
                endpoints = [Endpoints(http=s.http_url, grpc=s.grpc_url, metrics=s.metrics_url) for s in servers]
            else:
                endpoints = [self._endpoints_for(self.config.url)]
            runs = self._run_all(endpoints, pools)
            doc = self._document(endpoints, runs, started_server=bool(servers))
        finally:
            try:
                exits = self._stop_servers(servers)
            finally:
                workdir.cleanup()
                stop_on_term.restore()
                if self.cpu_sets.client:
                    os.sched_setaffinity(0, own_cores)
                if not self.config.keep_raw:  # the pools are reproducible from the seed
                    for path in pools.values():
                        path.unlink(missing_ok=True)
        if servers:
            self._attach_exits(doc, exits)
            # the backend logs its own counters when a variant is unloaded: where its time went
            texts = []
            for ex in exits:
                with contextlib.suppress(OSError):
                    texts.append((self.data / ex["log"]).read_text(errors="replace"))
            if texts:
                # one text per server: each server's log holds its own instances' records of every run
                n = st.attach_executor_stats(doc, texts[0] if len(texts) == 1 else texts)
                LOGGER.info("executor counters from the server log: %d of %d runs", n, len(doc["runs"]))
                attach_served(doc, "\n".join(texts))
        self.json_path.write_text(json.dumps(_finite(doc), indent=1, allow_nan=False) + "\n")
        LOGGER.info("wrote %s", self.json_path)
        report.write_report(self.json_path)
        return self.json_path

    # -- set-up -----------------------------------------------------------------------------

    def _prepare_pools(self) -> dict[str, Path]:
        """One request pool per base model, shared by every variant of that model and every process."""
        pools: dict[str, Path] = {}
        s = self.shape
        for v in self.variants:
            base = v.config.spec.name
            if base in pools:
                continue
            # a model that is not built in travels as its config (in the pool file, to every generator process)
            # a model that is not built in travels as its config (in the pool file, to every generator process)
            w = dataclasses.replace(wl.Workload.of(v.name, s), config=wl.variant_config(v.config))
            path = self.data / f"pool-{base}.npz"
            wl.save_pool(wl.build_pool(w, repository=self.config.repository, check=s.check), path)
            pools[base] = path
        return pools

    def _start_servers(self, workdir: Path, started: list[Any]) -> None:
        """Start the server (or one per GPU), appending each to ``started`` once it runs.

        A server is appended as soon as it is up, so when a later one fails to start, the caller's
        cleanup stops the ones before it.
        """
        from inflight.server.launcher import ServerConfig, TritonServer

        common: dict[str, Any] = {
            "tritonserver": self.config.tritonserver,
            "backend_config": tuple(self.config.backend_config),
            "extra_args": tuple(self.config.server_args),
        }
        if not self.gpu_servers:
            cfg = ServerConfig.on_free_ports(self.config.repository, workdir, cpus=self.cpu_sets.server, **common)
            server = TritonServer(cfg)
            LOGGER.info("starting tritonserver (HTTP %s)", server.http_url)
            server.start()
            started.append(server)
            return
        for plan in self.gpu_servers:
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
            started.append(server)

    def _stop_servers(self, servers: Sequence[Any]) -> list[dict[str, Any]]:
        """Stop every server, each whatever happened to the others; copy each log next to the results.

        Returns:
            Per server, in order: ``{"code", "reason", "log"}`` (``log``: the file name in the data folder).

        Raises:
            BaseException: an interrupt (Ctrl+C, SIGTERM) that came while stopping, once every server is stopped.
        """
        exits: list[dict[str, Any]] = []
        interrupted: BaseException | None = None
        for i, server in enumerate(servers):
            plan = self.gpu_servers[i] if self.gpu_servers else None
            name = plan.log_name if plan is not None else "tritonserver.log"
            what = f"tritonserver for GPU {plan.gpu}" if plan is not None else "tritonserver"
            code: int | None = None
            try:
                code = server.stop()
                reason = server.exit_reason
            except BaseException as e:  # one failed stop must not leave the other servers running
                reason = f"stopping it failed: {type(e).__name__}: {e}"
                LOGGER.error("%s: %s; killing its process group", what, reason)
                _kill_server(server)
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

    def _attach_exits(self, doc: dict[str, Any], exits: Sequence[Mapping[str, Any]]) -> None:
        """How each server exited, into the document's ``server`` block and its caveats."""
        if not self.gpu_servers:
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

    @staticmethod
    def _endpoints_for(url: str) -> Endpoints:
        host = url.split("://", 1)[-1].rstrip("/")
        hostname = host.rsplit(":", 1)[0] if ":" in host else host
        return Endpoints(http=host, grpc=f"{hostname}:8001", metrics=f"http://{hostname}:8002/metrics")

    # -- the runs ---------------------------------------------------------------------------

    def _run_all(self, endpoints: Sequence[Endpoints], pools: dict[str, Path]) -> list[dict[str, Any]]:
        """Every round and variant against ``endpoints`` (one server, or one per GPU)."""
        if self.config.grpc_url:
            endpoints[0].grpc = self.config.grpc_url
        if self.config.metrics_url:
            endpoints[0].metrics = self.config.metrics_url
        s = self.shape
        order = round_order(self.variants, self.config.repeat)
        windows = max(1, len(self.config.rates) * self.config.rate_repeat) + (
            SEARCH_WINDOWS_ESTIMATE if self.config.search else 0
        )
        per_run = s.warmup_s + windows * (s.window_s + s.ramp_s + LOCUST_OVERHEAD_S) + LOCUST_OVERHEAD_S
        self._planned_total = per_run * len(order)
        self._t0 = time.monotonic()
        runs: list[dict[str, Any]] = []
        for i, (r, v) in enumerate(order):
            LOGGER.info(
                "run %d/%d: %s = %s (round %d of %d)", i + 1, len(order), v.label, v.spec, r + 1, self.config.repeat
            )
            runs.extend(self._run_one(v, r, i, len(order), endpoints, pools[v.config.spec.name]))
            self._planned_total = (time.monotonic() - self._t0) / (i + 1) * len(order)
        return runs

    def _run_one(
        self, v: Variant, rnd: int, index: int, total: int, endpoints: Sequence[Endpoints], pool: Path
    ) -> list[dict[str, Any]]:
        """Load ``v``, warm it up, measure its window(s), unload it: one record per window.

        Closed loop: one window. Open loop: one window per ``rates`` entry, then the capacity
        search's windows (each record carries its ``rate``; the search's outcome goes on the last).
        """
        s = self.shape
        tag = f"{v.label}-r{rnd + 1}"
        stalls: list[str] = []
        records: list[dict[str, Any]] = []
        unload: dict[str, Any] = {}
        load_s = self._load(endpoints, v.config)
        capacity: ol.Capacity | None = None
        try:
            if s.warmup_s > 0:
                warm_shape = s.replace(rate=self._first_rate()) if self.open_loop else s
                LOGGER.info(
                    "%s: warming up for %.0f s%s",
                    tag,
                    s.warmup_s,
                    f" at {warm_shape.rate:,.0f} req/s" if self.open_loop else "",
                )
                warm_raw = self.data / f"{tag}-warmup-raw"
                warm = run_locust(
                    self._command(v, warm_shape, endpoints, pool, s.warmup_s + s.ramp_s, raw_dir=warm_raw),
                    log=self.data / f"{tag}-warmup.log",
                    planned_s=s.warmup_s + s.ramp_s,
                )
                if not self.config.keep_raw:
                    shutil.rmtree(warm_raw, ignore_errors=True)
                warmup = {"returncode": warm.returncode, "wall_s": round(warm.wall_s, 1), "log": str(warm.log)}
            else:
                warmup = None

            def window(rate: float | None) -> dict[str, Any]:
                n = len(records)
                wtag = tag if not self.open_loop else f"{tag}-w{n + 1}"
                rec = self._window(v, wtag, index, total, endpoints, pool, rate)
                rec.update({"variant": v.label, "round": rnd + 1, "model_name": v.name, "load_s": round(load_s, 2)})
                if warmup is not None:
                    rec["warmup"] = warmup
                    if warmup["returncode"] not in (0, 1):
                        rec["problems"].append(
                            f"the warm-up Locust run exited with {warmup['returncode']} (log: {warmup['log']})"
                        )
                        rec["valid"] = False
                records.append(rec)
                return rec

            if not self.open_loop:
                window(None)
            else:
                for rate in self.config.rates:
                    for _ in range(self.config.rate_repeat):
                        window(rate)
                if self.config.search is not None:
                    lo, hi = self.config.search
                    capacity = ol.bisect_capacity(
                        lambda rate: rate_point(window(rate)),
                        lo,
                        hi,
                        slo_ms=self.config.slo_ms,
                        rel_tol=self.config.search_tolerance,
                        max_steps=self.config.search_steps,
                    )
        finally:
            unload = self._unload(v, tag, endpoints, stalls)
        if records:
            records[-1].update(unload)
            if capacity is not None:
                records[-1]["capacity_search"] = capacity.to_dict()
        for rec in records:
            rec["caveats"] += [
                f"{m}; the window itself was measured in full, but this variant's instances may have stayed loaded "
                "(idle) through the later windows on this server"
                for m in stalls
            ]
        return records

    def _first_rate(self) -> float:
        """The first open-loop rate measured (the sweep's first, else the search's low end): the warm-up's."""
        if self.config.rates:
            return float(self.config.rates[0])
        assert self.config.search is not None
        return self.config.search[0]

    def _load(self, endpoints: Sequence[Endpoints], vc: VariantConfig) -> float:
        """Load ``vc`` on every server (side by side when several); the seconds until all had it."""
        if len(endpoints) == 1:
            return control.load_variant(endpoints[0].http, vc)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(endpoints), thread_name_prefix="load") as pool:
            futures = [pool.submit(control.load_variant, e.http, vc) for e in endpoints]
        for f in futures:
            f.result()  # the first server's failure, with its message
        return time.perf_counter() - t0

    def _command(
        self,
        v: Variant,
        shape: LoadShape,
        endpoints: Sequence[Endpoints],
        pool: Path,
        duration_s: float,
        csv_prefix: Path | None = None,
        raw_dir: Path | None = None,
    ) -> list[str]:
        if self.open_loop and self.config.generator == "asyncio":
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

    def _window(
        self,
        v: Variant,
        tag: str,
        index: int,
        total: int,
        endpoints: Sequence[Endpoints],
        pool: Path,
        rate: float | None,
    ) -> dict[str, Any]:
        """One measured Locust run (at ``rate`` req/s when open loop) with its statistics and CPU figures.

        With one server per GPU, Triton's statistics are summed over the servers (each server's share
        of the successful requests goes to ``per_server_requests``), and so are the metrics' counters.
        """
        s = self.shape if rate is None else self.shape.replace(rate=rate)
        problems: list[str] = []
        record: dict[str, Any] = {}
        if rate is not None:
            record["rate"] = rate
        befores = [control.inference_stats(e.http, v.name) for e in endpoints]
        before = st.sum_model_stats(befores)
        cpu_before = self._cpu_snapshot()
        prefix = self.data / tag
        raw_dir = self.data / f"{tag}-raw"
        samples: list[dict[str, Any]] = []
        window = s.window_s + s.ramp_s
        started = time.monotonic()
        what = f"{v.name} at {rate:,.0f} req/s offered" if rate is not None else v.name

        def tick(elapsed: float) -> None:
            text = _joined(scrape(e.metrics) for e in endpoints)
            if text is not None:
                samples.append({"t": round(elapsed, 1), **st.gpu_gauges(text, v.name)})
            rps = st.current_rps(Path(f"{prefix}_stats_history.csv"))
            overall_left = self._planned_total - (time.monotonic() - self._t0)
            LOGGER.info(
                "[%d/%d %s %s] %s, %s; about %s left in all",
                index + 1,
                total,
                v.label,
                what,
                progress_time(elapsed, s.window_s, s.ramp_s),
                (
                    "no live rate (the asyncio generator reports at the end)"
                    if self.config.generator == "asyncio" and self.open_loop
                    else "warming up (no sample yet)"
                )
                if rps is None
                else f"{rps:,.0f} req/s now",
                _fmt_s(overall_left),
            )

        res = run_locust(
            self._command(v, s, endpoints, pool, window, csv_prefix=prefix, raw_dir=raw_dir),
            log=self.data / f"{tag}.log",
            planned_s=window,
            tick=tick,
            tick_interval_s=self.config.progress_interval_s,
        )
        cpu_after = self._cpu_snapshot()
        afters = [control.inference_stats(e.http, v.name) for e in endpoints]
        after = st.sum_model_stats(afters)
        if len(endpoints) > 1:
            record["per_server_requests"] = _per_server_requests(befores, afters)
        texts = [scrape(e.metrics) for e in endpoints]
        text = _joined(texts)
        if text is not None:
            # the gauges are means over instances: every server's instances together
            samples.append({"t": round(time.monotonic() - started, 1), **st.gpu_gauges(text, v.name)})
        if all(t is not None for t in texts):
            # Locust has stopped: every request it sent should have left Triton's queue by now. The counters are
            # read per server and summed (one server's series must not be merged with another's)
            record["requests_after_window"] = _sum_counts([st.request_state(t, v.name) for t in texts if t is not None])
        if rate is not None:
            record["stub_memory"] = cpu.stub_memory(self._server_pids)
            record["gpu_memory"] = cpu.gpu_memory(self._server_pids)
            record["generator"] = _generator_counts(raw_dir)
            # requests the generator gave up on at the end may still be queued or running in the server:
            # the next window must not start behind them
            record["drain_s"] = self._drain(endpoints, v)
        record.update(self._figures(res, before, after, prefix, raw_dir, samples, problems))
        requests = (record.get("server") or {}).get("requests")
        record["cpu"] = cpu.window(cpu_before[0], cpu_after[0], requests)
        if cpu_before[1] is not None and cpu_after[1] is not None:
            record["cpu"]["client_busy"] = cpu.window(cpu_before[1], cpu_after[1], None)["host_busy"]
        point = rate_point(record) if rate is not None else None
        if point is not None:
            record["slo_misses"] = ol.slo_failures(point, self.config.slo_ms)
            record["generator_limited"] = _generator_limited(record)
        locust, lat, server = record.get("locust"), record.get("latency_ms") or {}, record.get("server") or {}
        LOGGER.info(
            "%s %s: %s req/s%s, p50 %s ms, p99 %s ms, %s failures, avg batch %s requests taking %s us in execute() "
            "(Triton's compute_infer: the whole batch a request rode in), server cores busy %s, server CPU %s cores "
            "= %s us/request%s%s",
            tag,
            what,
            f"{locust['rps']:,.0f}" if locust else "?",
            ""
            if point is None
            else f" answered ({point.achieved_rps:,.0f} req/s achieved in the window, "
            f"{100 * point.achieved_rps / point.offered_rps:.0f}% of offered)",
            _num(lat.get("p50")),
            _num(lat.get("p99")),
            locust["failures"] if locust else "?",
            _num(server.get("avg_batch_requests")),
            _num(server.get("compute_infer_us")),
            f"{100 * record['cpu']['host_busy']:.0f}%" if math.isfinite(record["cpu"]["host_busy"]) else "?",
            _num(record["cpu"]["server_cores"]),
            _num(record["cpu"]["server_us_per_request"]),
            ""
            if rate is None
            else (" (SLO: met)" if not record["slo_misses"] else f" (SLO missed: {'; '.join(record['slo_misses'])})"),
            ("" if record["valid"] else " (INVALID: " + "; ".join(record["problems"]) + ")")
            + ("" if not record["caveats"] else " (CAVEAT: " + "; ".join(record["caveats"]) + ")"),
        )
        return record

    def _open_loop_summary(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Sweep, capacity at the SLO and whether the generator kept up, for one variant's windows."""
        rows = open_loop_points(records)
        points = [rate_point(r) for r in records if r.get("rate") is not None]
        capacity = ol.capacity_of(points, self.config.slo_ms)
        missed = sorted(p.offered_rps for p in points if not ol.meets_slo(p, self.config.slo_ms))
        upper = next((x for x in missed if capacity is None or x > capacity), None)
        at = [row for row in rows if capacity is not None and row["offered_rps"] == capacity]
        limited = [row["offered_rps"] for row in rows if row["generator_limited"]]
        return {
            "sweep": rows,
            "soak": soak_summary(records) if self.config.rate_repeat > 1 else None,
            "capacity_rps": capacity,
            "capacity_upper_rps": upper,
            "capacity_bounded": upper is not None,
            "capacity_point": at[-1] if at else None,
            "generator_limited_rates": limited,
            # a ratio between variants is valid only where the generator kept its schedule up to the capacity
            "comparable": capacity is not None and not any(x <= capacity for x in limited),
            "rps": at[-1]["achieved_rps"] if at else math.nan,
            "latency_ms": ({"p50": at[-1]["p50_ms"], "p95": at[-1]["p95_ms"], "p99": at[-1]["p99_ms"]} if at else {}),
        }

    def _drain(self, endpoints: Sequence[Endpoints], v: Variant, timeout_s: float = DRAIN_TIMEOUT_S) -> float | None:
        """Wait until ``v`` has no request queued and its answered count stopped moving on every server.

        Returns the seconds it took; None when a metrics endpoint cannot tell (the wait is then
        skipped) or the timeout passed (a warning says so; the next window's figures then include
        the backlog).
        """
        t0 = time.monotonic()
        last: tuple[tuple[int | None, int | None], ...] | None = None
        while time.monotonic() - t0 < timeout_s:
            states = []
            for e in endpoints:
                text = scrape(e.metrics)
                if text is None:
                    return None
                states.append(st.request_state(text, v.name))
            now = tuple((c.get("success"), c.get("failure")) for c in states)
            if all(c.get("pending") in (0, None) for c in states) and now == last:
                return round(time.monotonic() - t0, 2)
            last = now
            time.sleep(0.5)
        LOGGER.warning("%s still had requests queued or running %.0f s after the window", v.name, timeout_s)
        return None

    def _cpu_snapshot(self) -> tuple[cpu.CpuSnapshot, cpu.CpuSnapshot | None]:
        """(the servers' cores with their process trees, the generator's cores) — one snapshot when not pinned.

        With one server per GPU, the server side is every server's tree on the union of their shares.
        """
        sets = self.cpu_sets
        if not sets.isolated:
            return cpu.snapshot(self._server_pids), None
        cores = sorted({c for plan in self.gpu_servers for c in plan.cpus}) or sets.server
        return cpu.snapshot(self._server_pids, cores=cores), cpu.snapshot(None, cores=sets.client)

    def _unload(self, v: Variant, tag: str, endpoints: Sequence[Endpoints], stalls: list[str]) -> dict[str, Any]:
        """Unload ``v`` from every server; what it took (and whether it stalled) as record fields.

        With one server per GPU the servers unload side by side; the record then gives the time until
        all were done, whether any was slow or stalled (``requests_at_stall`` summed over the stalled
        ones), and each server's own fields in ``per_server_unload``.
        """
        if not self.gpu_servers:
            return self._unload_one(v, tag, endpoints[0], stalls)
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(endpoints), thread_name_prefix="unload") as pool:
            futures = [
                pool.submit(self._unload_one, v, tag, e, stalls, plan=plan, pid=pid)
                for e, plan, pid in zip(endpoints, self.gpu_servers, self._server_pids, strict=True)
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
                record["requests_at_stall"] = _sum_counts(at_stall)
        record["per_server_unload"] = [{"gpu": plan.gpu, **r} for plan, r in zip(self.gpu_servers, parts, strict=True)]
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
            pid = self._server_pids[0] if self._server_pids else None
        on = f" on the GPU {plan.gpu} server" if plan is not None else ""
        log_name = plan.log_name if plan is not None else "tritonserver.log"
        t_unload = time.monotonic()
        try:
            control.unload(endpoints.http, v.name, timeout_s=self.config.unload_timeout_s)
        except InflightError as e:
            # the window was measured in full; what follows it is either a slow unload (Triton
            # finalizes instances one at a time) or a stalled one, a server defect reported with the run
            try:
                control.wait_unloaded(endpoints.http, v.name, self.config.unload_grace_s)
                record["unload_slow"] = True
                LOGGER.warning(
                    "%s: unloading %s%s took %.1f s (more than --unload-timeout %.0f s; completed)",
                    tag,
                    v.name,
                    on,
                    time.monotonic() - t_unload,
                    self.config.unload_timeout_s,
                )
            except InflightError:
                stuck = self.data / (f"{tag}-gpu{plan.gpu}-stuck" if plan is not None else f"{tag}-stuck")
                text = scrape(endpoints.metrics)
                if text is not None:
                    # where the requests that hold the unload are: Triton's queue (pending > 0) or not
                    counts = st.request_state(text, v.name)
                    lines = counts.pop("lines")
                    record["requests_at_stall"] = counts
                    stuck.mkdir(parents=True, exist_ok=True)
                    (stuck / "request-metrics.txt").write_text("\n".join(lines) + "\n")
                dumps = _dump_stuck_stubs(v.name, stuck, pid)
                record["unload_stalled"] = True
                waited = time.monotonic() - t_unload
                stalls.append(
                    f"unloading {v.name}{on} stalled: {e}, still not unloaded {waited:.0f} s after the request "
                    f"(see {log_name} next to the results"
                    + (f"; what its {len(dumps)} running stub(s) were doing: {dumps[0].parent})" if dumps else ")")
                    + (
                        "; Triton 2.51's HTTP frontend does this when more replies finish at once than its socket "
                        "buffer holds, with a plain Python model too (README, Known limits): raise "
                        "net.core.wmem_default before the server starts (the runner's own server does, as root) "
                        "or run with --protocol grpc"
                        if self.shape.protocol == "http"
                        else ""
                    )
                )
        record["unload_s"] = round(time.monotonic() - t_unload, 2)
        return record

    def _figures(
        self,
        res: LocustRun,
        before: dict[str, Any],
        after: dict[str, Any],
        prefix: Path,
        raw_dir: Path,
        samples: list[dict[str, Any]],
        problems: list[str],
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"locust_log": str(res.log), "locust_returncode": res.returncode}
        if res.killed:
            problems.append(f"Locust overran its window and was killed (log: {res.log})")
        elif res.returncode not in (0, 1):  # 1 = some requests failed, counted below
            problems.append(f"Locust exited with {res.returncode} (log: {res.log}):\n{_tail(res.log)}")
        # A busy client does not make the figures wrong, it makes them a lower bound of what the server
        # can do: kept (and used), but flagged on the run, the variant and the report.
        caveats = []
        if res.cpu_warnings:
            caveats.append(
                "client-limited: the load generator's CPU was above 90% at some point, so the generator, not the "
                f"server, may have limited the figures (read them as a lower bound for the server): "
                f"{res.cpu_warnings[0]!r}; give the generator cores of its own or more --processes"
            )
        out["cpu_warnings"] = res.cpu_warnings
        out["client_limited"] = bool(res.cpu_warnings)
        out["caveats"] = caveats
        try:
            lat = st.read_raw_latencies(raw_dir)
        except st.StatsError as e:
            problems.append(str(e))
            lat = np.empty(0)
        out["latency_ms"] = st.latency_summary(lat)
        if self.open_loop and self.config.generator == "asyncio":
            out.update(_rategen_figures(raw_dir, out["latency_ms"], problems))
        else:
            try:
                out["locust"] = st.read_locust_stats(Path(f"{prefix}_stats.csv"))
            except st.StatsError as e:
                problems.append(str(e))
                out["locust"] = None
            out["failure_messages"] = st.read_locust_failures(Path(f"{prefix}_failures.csv"))
            out["failures_by_status"] = st.read_locust_failures_by_status(Path(f"{prefix}_failures.csv"))
            out["history"] = st.read_locust_history(Path(f"{prefix}_stats_history.csv"))
        out["_latencies"] = lat  # pooled per variant by _document, not written
        if not self.config.keep_raw:
            shutil.rmtree(raw_dir, ignore_errors=True)
        out["stats_before"], out["stats_after"] = before, after
        try:
            out["server"] = st.stats_delta(before, after).to_dict()
        except st.StatsError as e:
            problems.append(str(e))
            out["server"] = None
        out["gpu_samples"] = samples
        out["gpu_activity"] = st.summarize_gauge([x.get("gpu_activity") for x in samples])
        out["sync_share"] = st.summarize_gauge([x.get("sync_share") for x in samples])
        locust = out["locust"]
        if locust is not None and locust["requests"] - locust["failures"] <= 0:
            problems.append("no request succeeded in the window")
        out["problems"] = problems
        out["valid"] = not problems
        return out

    # -- the document -----------------------------------------------------------------------

    def _notes(self) -> list[str]:
        from inflight.loadtest.report import deployment_line

        notes = []
        if self.gpu_servers:
            notes.append(
                f"One tritonserver per GPU ({deployment_line(self._plans_dict())}): every variant was loaded on each "
                "server with the same config, and the generator's sources were spread over the servers (source i "
                "sent to server i mod n), so each server got about 1/n of the offered rate. Triton's statistics and "
                "request counters, the CPU figures, the stubs' memory and the executor counters are summed over the "
                "servers; the GPU gauges are means over every server's instances."
            )
        if self.shape.window_s + self.shape.ramp_s < LOCUST_CPU_VISIBLE_S:
            notes.append(
                f"Locust samples its own CPU every 10 s and its first sample is only a baseline, so a "
                f"{self.shape.window_s:g} s window cannot show its 'CPU usage above 90%' warning; only windows of "
                f"{LOCUST_CPU_VISIBLE_S:g} s or more are checked for a Locust-bound run."
            )
        if self.shape.check:
            notes.append(
                "--check compared every response with the model run in PyTorch on the CPU (fp32): "
                + ", ".join(
                    f"{m}: rtol {t.rtol:g}, atol {t.atol:g}{' x max|ref|' if t.scale_by_max else ''}"
                    for m, t in sorted({v.config.spec.name: wl.tolerance_for(v.name) for v in self.variants}.items())
                )
                + "."
            )
        return notes

    def _server_block(
        self, endpoints: Sequence[Endpoints], runs: Sequence[Mapping[str, Any]], started: bool
    ) -> dict[str, Any]:
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
        }
        if not self.gpu_servers:
            return block
        per_window = [r["per_server_requests"] for r in runs if r.get("per_server_requests")]
        block["server_gpus"] = [plan.gpu for plan in self.gpu_servers]
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
            for plan, e, pid in zip(self.gpu_servers, endpoints, self._server_pids, strict=False)
        ]
        block["per_server_requests"] = [sum(int(w[i] or 0) for w in per_window) for i in range(len(self.gpu_servers))]
        return block

    def _document(
        self, endpoints: Sequence[Endpoints], runs: list[dict[str, Any]], *, started_server: bool
    ) -> dict[str, Any]:
        s = self.shape
        summary = []
        for v in self.variants:
            mine = [r for r in runs if r["variant"] == v.label]
            lat = np.concatenate([r.pop("_latencies") for r in mine]) if mine else np.empty(0)
            rps = [r["locust"]["rps"] for r in mine if r.get("locust")]
            breakdowns = [st.ServerBreakdown(**r["server"]) for r in mine if r.get("server")]
            samples = [x for r in mine for x in r["gpu_samples"]]
            requests = sum(r["locust"]["requests"] for r in mine if r.get("locust"))
            failures = sum(r["locust"]["failures"] for r in mine if r.get("locust"))
            mean_rps = float(np.mean(rps)) if rps else math.nan
            entry_open: dict[str, Any] = {}
            if self.open_loop:
                entry_open = self._open_loop_summary(mine)
                lat = np.empty(0)  # latencies pooled across offered rates mean nothing: see the sweep
            summary.append(
                {
                    "variant": v.label,
                    "spec": v.spec,
                    "model_name": v.name,
                    "runs": len(mine),
                    "valid": all(r["valid"] for r in mine),
                    "client_limited": any(r.get("client_limited") for r in mine),
                    "rps": mean_rps,
                    "rps_runs": rps,
                    "items_per_s": mean_rps * s.items,
                    "requests": requests,
                    "failures": failures,
                    "latency_ms": st.latency_summary(lat),
                    "server": st.sum_breakdowns(breakdowns).to_dict() if breakdowns else None,
                    "gpu_activity": st.summarize_gauge([x.get("gpu_activity") for x in samples]),
                    "sync_share": st.summarize_gauge([x.get("sync_share") for x in samples]),
                    "cpu": cpu.combine(
                        [r.get("cpu") or {} for r in mine], [(r.get("server") or {}).get("requests") or 0 for r in mine]
                    ),
                    **entry_open,
                }
            )
        problems = [f"{r['variant']} round {r['round']}: {p}" for r in runs for p in r["problems"]]
        caveats = [f"{r['variant']} round {r['round']}: {c}" for r in runs for c in r.get("caveats", [])]
        return {
            "schema": SCHEMA,
            "id": self.run_id,
            "started": self.started,
            "finished": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "device": device_info(),
            "host": {"hostname": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform()},
            "versions": versions(endpoints[0].http),
            "server": self._server_block(endpoints, runs, started_server),
            "preset": self.config.preset,
            "load": {
                **s.to_dict(),
                "repeat": self.config.repeat,
                "closed_loop": not self.open_loop,
                "open_loop": (
                    {
                        "rates": list(self.config.rates),
                        "search": list(self.config.search) if self.config.search else None,
                        "slo_p99_ms": self.config.slo_ms,
                        "rate_tolerance": ol.RATE_TOLERANCE,
                        "search_tolerance": self.config.search_tolerance,
                        "search_steps": self.config.search_steps,
                        "late_threshold_ms": ol.LATE_THRESHOLD_MS,
                        "limit_late_ms": ol.LIMIT_LATE_MS,
                        "check_every": s.check_every,
                        "max_late_fraction": ol.MAX_LATE_FRACTION,
                        "latency_from": "the scheduled send time (a late send counts its lateness)",
                    }
                    if self.open_loop
                    else None
                ),
                "cpu_sets": self.cpu_sets.to_dict(),
                "user_class": (
                    ("inflight.loadtest.rategen" if self.config.generator == "asyncio" else OPEN_LOOP_USER_CLASS)
                    if self.open_loop
                    else USER_CLASSES[s.protocol]
                ),
                "generator": self.config.generator if self.open_loop else "locust",
                "locust_run_time_s": math.ceil(s.window_s + s.ramp_s),
                "order": [f"{r['variant']}{r['round']}" for r in runs],
            },
            "variants": [
                {
                    "label": v.label,
                    "spec": v.spec,
                    "model_name": v.name,
                    "model": v.config.spec.name,
                    "variant": v.config.variant,
                    "overrides": v.overrides,
                    "config": json.loads(v.config.to_json()),
                }
                for v in self.variants
            ],
            "percentiles": (
                "exact nearest-rank percentiles of the raw per-request latencies (float64 ms) written by every "
                "Locust process, counted from the end of spawning; Locust's own percentiles are rounded"
            ),
            "notes": self._notes(),
            "runs": runs,
            "summary": summary,
            "valid": not problems,
            "problems": problems,
            "caveats": caveats,
            "data_dir": str(self.data),
        }


_SERVED = re.compile(r"\[inflight\.runtime\.triton_model\] (\S+) \((\S+)\): (.*? mode.*?ready in [0-9.]+ s)")


def attach_served(doc: dict[str, Any], log: str) -> None:
    """Record under each variant what its instances said they serve with, from the server log.

    Mode, engine, device, precision and graphs as they served, where the config only says what was
    asked for (a CPU instance runs fp32 without CUDA graphs whatever ``precision`` and ``cuda_graphs`` say).
    """
    served: dict[str, list[str]] = {}
    for m in _SERVED.finditer(log):
        line = f"{m.group(2)}: {m.group(3)}"
        if line not in served.setdefault(m.group(1), []):
            served[m.group(1)].append(line)
    for v in doc.get("variants", []):
        v["served"] = served.get(v["model_name"], [])


def rate_point(record: Mapping[str, Any]) -> ol.RatePoint:
    """The open-loop figures of one window record (``rate`` set) as a :class:`~inflight.loadtest.openloop.RatePoint`."""
    locust = record.get("locust") or {}
    lat = record.get("latency_ms") or {}
    gen = record.get("generator") or {}
    requests = int(locust.get("requests", 0))
    failures = int(locust.get("failures", 0))
    rps = float(locust.get("rps", math.nan))
    # the generator's own count: successful answers inside the window, per second of it (Locust's rate
    # counts failures too and ends at its last answer)
    achieved = float(gen.get("achieved_rps", math.nan))
    if not math.isfinite(achieved):
        achieved = rps * (requests - failures) / requests if requests else 0.0
    return ol.RatePoint(
        offered_rps=float(record["rate"]),
        achieved_rps=achieved,
        requests=requests,
        failures=failures,
        p50_ms=float(lat.get("p50", math.nan)),
        p95_ms=float(lat.get("p95", math.nan)),
        p99_ms=float(lat.get("p99", math.nan)),
        late_fraction=float(gen.get("late_fraction", math.nan)),
        answered_fraction=float(gen.get("answered_fraction", math.nan)),
        valid=bool(record.get("valid", False)),
    )


def _rategen_figures(raw_dir: Path, latency: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
    """The asyncio generator's summary as the record's counts (the ``locust`` block's keys) and its own figures."""
    path = raw_dir / rategen.SUMMARY_NAME
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        problems.append(f"the asyncio generator wrote no summary ({e}); see its log")
        return {
            "locust": None,
            "failure_messages": [],
            "failures_by_status": {},
            "history": [],
            "generator_run": None,
        }
    if summary.get("errors"):
        problems.append("the asyncio generator: " + "; ".join(summary["errors"]))
    counts = {
        "requests": int(summary["requests"]),
        "failures": int(summary["failures"]),
        "rps": float(summary["rps"]),
        "failures_per_s": float(summary["failures_per_s"]),
        "avg_ms": float(latency.get("mean", math.nan)),
        "p50_ms": float(latency.get("p50", math.nan)),
        "p95_ms": float(latency.get("p95", math.nan)),
        "p99_ms": float(latency.get("p99", math.nan)),
        "max_ms": float(latency.get("max", math.nan)),
    }
    keys = (
        "sources",
        "cpu_s",
        "us_per_request",
        "busy_max",
        "peak_connections",
        "connection_waits",
        "stalls",
        "generator_gc",
    )
    own = {k: summary.get(k) for k in keys}
    if len(summary.get("per_url") or {}) > 1:
        own["per_url"] = summary["per_url"]  # several servers: what each one's sources sent and got answered
    return {
        "locust": counts,
        "failure_messages": summary.get("failure_messages", []),
        "failures_by_status": summary.get("failures_by_status", {}),
        "history": [],
        "generator_run": {"tool": summary.get("generator"), **own},
    }


def _generator_counts(raw_dir: Path) -> dict[str, Any]:
    """The open-loop sources' send counts (``openloop-*.json`` of every Locust process), summed."""
    parts: list[dict[str, Any]] = []
    for path in sorted(raw_dir.glob("openloop-*.json")):
        with contextlib.suppress(OSError, ValueError):
            parts.extend(json.loads(path.read_text()))
    return ol.Lateness.combine(parts) if parts else {"sources": 0}


def _generator_limited(record: Mapping[str, Any]) -> bool:
    """True when the generator did not keep its schedule: too many very late sends, or Locust's CPU warning."""
    gen = record.get("generator") or {}
    late = gen.get("very_late_fraction")
    return bool(record.get("client_limited")) or (
        isinstance(late, float) and math.isfinite(late) and late > ol.MAX_LATE_FRACTION
    )


def open_loop_points(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The sweep of one variant: a row per open-loop window, by offered rate (JSON-ready)."""
    rows = []
    for r in records:
        if r.get("rate") is None:
            continue
        p = rate_point(r)
        rows.append(
            {
                **p.to_dict(),
                "round": r.get("round"),
                "generator_limited": bool(r.get("generator_limited")),
                "slo_misses": list(r.get("slo_misses") or []),
                "avg_batch_requests": (r.get("server") or {}).get("avg_batch_requests"),
                "avg_batch_items": (r.get("server") or {}).get("avg_batch_items"),
                "server_cores": (r.get("cpu") or {}).get("server_cores"),
                "server_us_per_request": (r.get("cpu") or {}).get("server_us_per_request"),
                "host_busy": (r.get("cpu") or {}).get("host_busy"),
                "host_steal": (r.get("cpu") or {}).get("host_steal"),
                "client_busy": (r.get("cpu") or {}).get("client_busy"),
                "generator": r.get("generator"),
            }
        )
    return sorted(rows, key=lambda x: (x["offered_rps"], x.get("round") or 0))


#: A soak's p99 is steady when its last window is within this fraction of its first.
SOAK_P99_TOLERANCE = 0.20
#: A soak's stub memory is flat when its last reading is within this fraction of its first.
SOAK_MEMORY_TOLERANCE = 0.05


def soak_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Consecutive windows at one rate: failures, p99 first vs last window, stub memory first vs last.

    Windows are taken in the order they ran, per offered rate (the first rate with more than one window).
    """
    by_rate: dict[float, list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("rate") is not None:
            by_rate.setdefault(float(r["rate"]), []).append(r)
    runs = next((rs for rs in by_rate.values() if len(rs) > 1), None)
    if runs is None:
        return None
    points = [rate_point(r) for r in runs]
    first, last = points[0], points[-1]
    mem = [int((r.get("stub_memory") or {}).get("rss_bytes") or 0) for r in runs]
    p99_change = last.p99_ms / first.p99_ms - 1.0 if first.p99_ms > 0 else math.nan
    mem_change = mem[-1] / mem[0] - 1.0 if mem[0] > 0 else math.nan
    failures = sum(p.failures for p in points)
    return {
        "rate": first.offered_rps,
        "windows": len(runs),
        "window_s": [round(float((r.get("generator") or {}).get("span_s") or math.nan), 1) for r in runs],
        "failures": failures,
        "p99_ms": [p.p99_ms for p in points],
        "achieved_rps": [p.achieved_rps for p in points],
        "stub_rss_bytes": mem,
        "p99_change": p99_change,
        "stub_rss_change": mem_change,
        "p99_steady": bool(abs(p99_change) <= SOAK_P99_TOLERANCE),
        "memory_flat": bool(abs(mem_change) <= SOAK_MEMORY_TOLERANCE),
        "passed": bool(
            failures == 0 and abs(p99_change) <= SOAK_P99_TOLERANCE and abs(mem_change) <= SOAK_MEMORY_TOLERANCE
        ),
    }


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _finite(obj: Any) -> Any:
    """The document with NaN/inf replaced by None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def run_ab(config: AbConfig) -> Path:
    """Run an A/B test; return the JSON path (the report is written next to it).

    Raises:
        ConfigError: for bad variants or load options.
        ServerError: when the server cannot be started or reached or a variant does not load.
    """
    return AbRunner(config).run()
