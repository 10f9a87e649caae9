"""Where the host's CPU time went during a load-test window.

Under the published load the request path (Triton's frontend, the Python backend's stubs, the load
generator) competes for the host's cores; when the host is saturated, the variant that spends less
CPU per request serves more, whatever it does on the GPU. The A/B runner snapshots the CPU time of
the whole host and of the server's process tree (tritonserver and its children: the Python-backend
stubs; with one server per GPU, every server's tree) at the same two instants as Triton's statistics,
so each window gets:

* ``host_busy``: the busy fraction of the run's cores (``1 - idle / total``, iowait counted idle); the
  run's cores are the runner's CPU affinity, all of the host's unless it was started under ``taskset``;
* ``host_steal``: the fraction of those cores' time the hypervisor gave to someone else (Linux's
  ``steal``, counted in ``host_busy`` too): a virtual host whose cores are taken away stalls every
  thread on them, whatever the variant, and the p99 of a short window shows it;
* ``server_cores`` / ``stub_cores``: CPU seconds of the server tree / of the stubs alone, per wall
  second (1.0 = one core kept busy);
* ``other_cores``: the rest of the busy time (the load generator, the runner, anything else);
* ``server_us_per_request``: the server tree's CPU time per successful request (Triton's count);
* ``threads``: the busiest threads of the server tree (``[process, thread name, busy fraction]``) and
  how many were busy over 80% of the window: a serial part of the request path (an HTTP thread, a
  scheduler thread, a stub's execute thread) shows as a thread near 100% while the cores are not.

Processes that exit inside the window take their CPU time with them; the stubs of a loaded model
live through it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import psutil

STUB_NAME = "triton_python_backend_stub"


@dataclasses.dataclass(frozen=True)
class CpuSnapshot:
    """Cumulative CPU times at one instant.

    Attributes:
        t: ``time.monotonic()`` when taken.
        host_busy_s: Non-idle CPU seconds of the run's cores since boot (all processes on them).
        host_total_s: All CPU seconds of the run's cores since boot.
        host_steal_s: Seconds of the run's cores the hypervisor ran something else (0 on bare metal).
        server_s: User + system seconds of the server tree (None: no server process to watch).
        stub_s: The same for the Python-backend stubs in that tree.
        cores: Cores of the run (the runner's CPU affinity).
    """

    t: float
    host_busy_s: float
    host_total_s: float
    server_s: float | None
    stub_s: float | None
    cores: int
    threads: Mapping[int, tuple[str, float]] = dataclasses.field(default_factory=dict)
    host_steal_s: float = 0.0


def _is_stub(name: str) -> bool:
    """True for a Python-backend stub's process name (``/proc``'s comm is cut at 15 characters)."""
    return name.startswith(STUB_NAME[:15])


def _tree_times(pid: int) -> tuple[float, float] | None:
    """(whole tree, stubs only) user + system seconds of ``pid`` and its live descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = stubs = 0.0
    for p in procs:
        try:
            with p.oneshot():
                ct = p.cpu_times()
                name = p.name()
        except psutil.Error:  # exited between listing and reading
            continue
        busy = ct.user + ct.system
        total += busy
        if _is_stub(name):
            stubs += busy
    return total, stubs


_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
#: Threads busier than this share of a window are counted as saturated.
BUSY_THREAD = 0.8


def _thread_times(pid: int) -> dict[int, tuple[str, float]]:
    """``{tid: ("process/thread", user + system seconds)}`` of every thread of ``pid`` and its live descendants."""
    try:
        root = psutil.Process(pid)
        pids = [root.pid, *(c.pid for c in root.children(recursive=True))]
    except psutil.Error:
        return {}
    out: dict[int, tuple[str, float]] = {}
    for p in pids:
        proc = "stub" if p != pid else "tritonserver"
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            name = stat[stat.find("(") + 1 : stat.rfind(")")]
            fields = stat[stat.rfind(")") + 2 :].split()
            # fields[11], fields[12]: utime, stime (the 14th and 15th of proc(5), counted from the state)
            out[int(tid)] = (f"{proc}/{name}", (int(fields[11]) + int(fields[12])) * _TICK_S)
    return out


def busiest_threads(
    before: Mapping[int, tuple[str, float]], after: Mapping[int, tuple[str, float]], wall: float, top: int = 8
) -> dict[str, Any]:
    """The threads that were busiest between two readings of :func:`_thread_times`.

    Returns:
        ``busiest`` (``[name, busy fraction]``, highest first, ``top`` of them), ``over_80`` (threads
        busier than ``BUSY_THREAD``), ``by_name`` (cores per thread name, summed) and ``count`` (threads
        alive at the end, per process kind: ``tritonserver``, ``stub``).
    """
    if wall <= 0 or not after:
        return {"busiest": [], "over_80": 0, "by_name": {}, "count": {}}
    count: dict[str, int] = {}
    for name, _ in after.values():
        kind = name.split("/", 1)[0]
        count[kind] = count.get(kind, 0) + 1
    busy: list[tuple[str, float]] = []
    by_name: dict[str, float] = {}
    for tid, (name, cpu_s) in after.items():
        prev = before.get(tid)
        share = max(cpu_s - (prev[1] if prev is not None else 0.0), 0.0) / wall
        busy.append((name, share))
        by_name[name] = by_name.get(name, 0.0) + share
    busy.sort(key=lambda x: -x[1])
    return {
        "busiest": [[n, round(b, 3)] for n, b in busy[:top]],
        "over_80": sum(1 for _, b in busy if b > BUSY_THREAD),
        "by_name": {n: round(c, 3) for n, c in sorted(by_name.items(), key=lambda x: -x[1])[:12]},
        "count": count,
    }


ServerPids: TypeAlias = int | Sequence[int] | None
"""The server process(es) to watch: one pid, several (one server per GPU), or None."""


def _pids(server_pids: ServerPids) -> tuple[int, ...]:
    if server_pids is None:
        return ()
    return (server_pids,) if isinstance(server_pids, int) else tuple(server_pids)


def stub_memory(server_pids: ServerPids) -> dict[str, Any]:
    """Resident memory of the servers' Python-backend stubs now: ``{"stubs": n, "rss_bytes": total, "rss": [...]}``.

    Summed over every server given (one pid or several). Empty counts when there is no server process
    to watch. A stub that keeps growing under a steady load leaks (a soak test compares the first and
    last reading).
    """
    rss: list[int] = []
    for pid in _pids(server_pids):
        try:
            procs = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                if _is_stub(p.name()):
                    rss.append(int(p.memory_info().rss))
            except psutil.Error:
                continue
    return {"stubs": len(rss), "rss_bytes": sum(rss), "rss": sorted(rss)}


def gpu_memory(server_pids: ServerPids, smi: str = "nvidia-smi") -> dict[str, Any]:
    """GPU memory the servers' processes hold now, as ``nvidia-smi --query-compute-apps`` reports it.

    Returns:
        ``{"processes": n, "used_mib": total, "per_process_mib": [...]}`` over the server trees'
        processes that hold GPU memory (tritonserver and its stubs); ``{}`` where ``nvidia-smi`` is
        missing or fails (no GPU).
    """
    import subprocess

    pids: set[int] = set()
    for pid in _pids(server_pids):
        try:
            root = psutil.Process(pid)
            pids.update([root.pid, *(c.pid for c in root.children(recursive=True))])
        except psutil.Error:
            continue
    try:
        out = subprocess.run(
            [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    used: list[int] = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[0]) in pids:
            used.append(int(parts[1]))
    return {"processes": len(used), "used_mib": sum(used), "per_process_mib": sorted(used)}


def run_cores() -> list[int]:
    """The cores this process may run on (``taskset``/cgroup affinity): the server and Locust inherit them."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(psutil.cpu_count() or 1))


def snapshot(server_pids: ServerPids, cores: Sequence[int] | None = None) -> CpuSnapshot:
    """Cumulative CPU times of this run's cores and, when server pids are given, of their process trees.

    ``server_pids`` is one tritonserver's pid or several (one server per GPU: their trees are summed,
    and their threads listed together). "The host" is ``cores`` when given (the servers' own cores
    when the runner pins them apart from the load generator: with several servers, the union of
    their shares), else the set of cores this process may run on, so runs pinned side by side (one
    lane per GPU, ``taskset``) each see their own cores only.
    """
    per_cpu = psutil.cpu_times(percpu=True)
    t = time.monotonic()  # the instant of the host's counters: the process trees are walked after it
    busy = total = steal = 0.0
    cores = [c for c in (run_cores() if cores is None else cores) if c < len(per_cpu)]
    for c in cores:
        ct = per_cpu[c]
        all_s = float(sum(ct))
        total += all_s
        busy += all_s - ct.idle - getattr(ct, "iowait", 0.0)
        steal += getattr(ct, "steal", 0.0)
    pids = _pids(server_pids)
    trees = [t for t in (_tree_times(pid) for pid in pids) if t is not None]
    threads: dict[int, tuple[str, float]] = {}
    for pid in pids:
        threads.update(_thread_times(pid))  # thread ids are unique on the host
    return CpuSnapshot(
        t=t,
        host_busy_s=busy,
        host_total_s=total,
        server_s=sum(t[0] for t in trees) if trees else None,
        stub_s=sum(t[1] for t in trees) if trees else None,
        cores=len(cores),
        threads=threads,
        host_steal_s=steal,
    )


def window(before: CpuSnapshot, after: CpuSnapshot, requests: int | None) -> dict[str, Any]:
    """The CPU figures of the window between two snapshots (JSON-ready, NaN where unknown).

    Args:
        before: Snapshot at the start of the window.
        after: Snapshot at its end.
        requests: Successful requests the server counted in the window (None: unknown).
    """
    wall = after.t - before.t
    total = after.host_total_s - before.host_total_s
    busy = after.host_busy_s - before.host_busy_s
    out: dict[str, Any] = {
        "wall_s": round(wall, 3),
        "host_cores": after.cores,
        # at most all of it: the kernel counts in ticks (10 ms a core), so a saturated window can read a tick over
        "host_busy": min(busy / total, 1.0) if total > 0 else math.nan,
        "host_busy_cores": min(busy / wall, float(after.cores)) if wall > 0 else math.nan,
        "host_steal": (after.host_steal_s - before.host_steal_s) / total if total > 0 else math.nan,
        "server_cores": math.nan,
        "stub_cores": math.nan,
        "other_cores": math.nan,
        "server_us_per_request": math.nan,
    }
    if before.server_s is not None and after.server_s is not None and wall > 0:
        server = max(after.server_s - before.server_s, 0.0)
        stubs = max((after.stub_s or 0.0) - (before.stub_s or 0.0), 0.0)
        out["server_cores"] = server / wall
        out["stub_cores"] = stubs / wall
        out["other_cores"] = max(busy - server, 0.0) / wall
        if requests:
            out["server_us_per_request"] = server / requests * 1e6
    if after.threads:
        out["threads"] = busiest_threads(before.threads, after.threads, wall)
    return out


def combine(windows: list[Mapping[str, Any]], requests: list[int]) -> dict[str, Any] | None:
    """Several windows of one variant: wall-weighted means, CPU per request weighted by requests."""
    pairs = [(w, n) for w, n in zip(windows, requests, strict=True) if w]
    if not pairs:
        return None

    def wmean(key: str, weight: str) -> float:
        vals = [
            (float(w[key]), float(w["wall_s"]) if weight == "wall" else n)
            for w, n in pairs
            if w.get(key) is not None and not math.isnan(float(w[key]))
        ]
        norm = sum(x for _, x in vals)
        return sum(v * x for v, x in vals) / norm if norm else math.nan

    return {
        "windows": len(pairs),
        "host_cores": pairs[0][0].get("host_cores"),
        **{
            k: wmean(k, "wall")
            for k in ("host_busy", "host_busy_cores", "host_steal", "server_cores", "stub_cores", "other_cores")
        },
        "server_us_per_request": wmean("server_us_per_request", "requests"),
    }
