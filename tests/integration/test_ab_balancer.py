"""``inflight ab --server-per-gpu 0,1 --balancer nginx`` end to end on the CPU host: nginx over two tritonservers.

The runner starts one server per listed GPU (on the CPU host no GPU is visible and the null control
model runs on the CPU), nginx in front of them on the server cores, and measures the null model
through the balancer and directly (``via=direct``), the two sharing one load. Every request must be
answered, both servers must have answered a share of the balanced load by their own counters, the
document must record the layout and the balancer (version, configuration, cores, CPU per window),
and nginx and the servers must be gone after the run, also when it is interrupted (Ctrl+C).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Collection
from pathlib import Path

import psutil
import pytest
from tests.helpers import ab_command

from inflight.loadtest import cpu
from inflight.loadtest import openloop as ol
from inflight.server.balancer import find_nginx
from inflight.tool_errors import ServerError

pytestmark = pytest.mark.integration

#: Seconds the whole run may take (two server starts, nginx, two 1 s warm-ups and 3 s windows; ~30 s here).
RUN_TIMEOUT_S = 300


@pytest.fixture
def nginx_env() -> dict[str, str]:
    """The runner's environment: nginx named explicitly (the test's interpreter may not be the one setup.sh used)."""
    try:
        nginx = find_nginx()
    except ServerError as e:
        pytest.skip(str(e))
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["INFLIGHT_NGINX"] = str(nginx)
    return env


def _started_under(pid: int, known: Collection[int] = ()) -> dict[int, str]:
    """The tritonserver and nginx processes among ``pid``'s descendants now (pid -> name; servers, not their stubs).

    ``known``: the processes seen before; a child of one of them is its worker or stub. An nginx worker outliving its
    master by a moment at the stop once counted as a second nginx (a CI run of 2026-12-02): its parent was gone
    from the snapshot, so workers are also told apart by the title their master gives them.
    """
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    found: dict[int, tuple[str, int]] = {}
    for c in children:
        with contextlib.suppress(psutil.Error):
            name = c.name()
            argv = c.cmdline()
            # a child caught between its fork and its exec can show its new name beside its parent's command line:
            # skip it until the two agree (the runner's `nginx -v` once counted as a second nginx so, its name read
            # after the exec and its command line, the runner's own, before; a CI run of 2026-12-02)
            if not argv or Path(argv[0].split(":")[0]).name != name:
                continue
            # not the runner's `nginx -v` (its version, read before the start): caught alive on a busy host
            # nor an nginx worker (its master titles it so): by its title, as its parent may be gone already
            worker = " ".join(argv).startswith("nginx: worker process")
            if name in ("tritonserver", "nginx") and "-v" not in argv[1:] and not worker:
                found[c.pid] = (name, c.ppid())
    # a stub is forked by its server and named tritonserver until it execs; nginx's workers are its master's children
    return {p: name for p, (name, parent) in found.items() if parent not in found and parent not in known}


def _run_ab(
    cmd: list[str], log: Path, env: dict[str, str], *, interrupt_when: str | None = None
) -> tuple[int, dict[int, str]]:
    """Run ``inflight ab``; its exit code and the servers and nginx it started (seen while it ran).

    ``interrupt_when``: send SIGINT (Ctrl+C) once a process of that name runs under it. Whatever
    happens, nothing it started outlives the test.
    """
    seen: dict[int, str] = {}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            interrupted = False
            while proc.poll() is None:
                seen |= _started_under(proc.pid, seen)
                if interrupt_when and not interrupted and interrupt_when in seen.values():
                    time.sleep(2.0)  # into the run: the variant loading or the generator sending
                    proc.send_signal(signal.SIGINT)
                    interrupted = True
                if time.monotonic() > deadline:
                    raise TimeoutError(f"inflight ab ran over {RUN_TIMEOUT_S} s; see {log}")
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(90)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            leftovers = [p for p in seen if psutil.pid_exists(p)]
            for p in leftovers:  # each has its own process group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p, signal.SIGKILL)
    return proc.returncode, seen


def _command(repository: Path, out: Path, cores: list[int], *variants: str, window: int = 3) -> list[str]:
    return ab_command(
        *variants,
        "--server-per-gpu",
        "0,1",
        "--balancer",
        "nginx",
        "--generator",
        "asyncio",
        "--rate",
        "40",
        # the servers (and nginx, sharing their cores by default) on two cores; the generator shares them
        "--server-cpus",
        ol.format_cpus(cores[:2]),
        "--no-isolate",
        "--check-every",
        "1",
        repository=repository,
        out=out,
        window=window,
        processes=2,
    )


def test_nginx_in_front_of_two_servers_spreads_every_request_and_its_cost_is_recorded(
    repository: Path, tmp_path: Path, nginx_env: dict[str, str]
) -> None:
    cores = cpu.run_cores()
    if len(cores) < 2:
        pytest.skip(f"needs two cores to give each of two servers its own; this process may run on {cores}")
    out = tmp_path / "balanced"
    cmd = _command(repository, out, cores, "bert_tiny_null", "bert_tiny_null@via=direct")
    log = tmp_path / "ab.log"
    code, seen = _run_ab(cmd, log, nginx_env)
    text = log.read_text(errors="replace")
    assert code == 0, f"inflight ab failed ({code}):\n{text[-4000:]}"

    (path,) = out.glob("ab-*.json")
    doc = json.loads(path.read_text())
    assert doc["valid"], doc["problems"]
    server = doc["server"]
    assert server["layout"] == "per-gpu-servers+nginx"
    per_gpu = server["per_gpu_servers"]
    front = server["balancer"]
    assert front["kind"] == "nginx" and front["version"].startswith("nginx/")
    assert front["cpus"] == ol.format_cpus(cores[:2]) and front["own_cores"] is False and front["workers"] == 2
    assert "shares the servers' cores" in front["cpus_rule"]
    assert all(f"server {s['http']};" in front["config"] for s in per_gpu) and front["upstreams"] == [
        s["http"] for s in per_gpu
    ]
    assert front["exit"] == {"code": 0, "reason": None}
    # the runner started exactly the two servers and one nginx, and all are gone now
    assert sorted(seen.values()) == ["nginx", "tritonserver", "tritonserver"]
    assert {p for p, name in seen.items() if name == "tritonserver"} == {s["pid"] for s in per_gpu}
    assert front["pid"] in seen
    assert not any(psutil.pid_exists(p) for p in seen)
    assert (Path(doc["data_dir"]) / "nginx-error.log").is_file()

    assert [(v["label"], v["route"]) for v in doc["variants"]] == [("A", "balancer"), ("B", "direct")]
    through, direct = doc["runs"]
    for run in (through, direct):
        assert run["rate"] == 40.0 and run["locust"]["failures"] == 0 and run["locust"]["requests"] > 0
        # each server answered a share, by its own statistics; together what Triton's summed statistics say
        assert len(run["per_server_requests"]) == 2 and all(n > 0 for n in run["per_server_requests"])
        assert sum(run["per_server_requests"]) == run["server"]["requests"]
        assert run["load_shared"] == ["A", "B"]
        assert run["balancer_cpu"]["nginx_cores"] >= 0
    assert (through["route"], direct["route"]) == ("balancer", "direct")
    # through the balancer the generator saw one endpoint; directly, each server's
    assert through["targets"] == [front["url"]] and "per_url" not in through["generator_run"]
    assert direct["targets"] == [s["http"] for s in per_gpu]
    assert sorted(direct["generator_run"]["per_url"]) == sorted(s["http"] for s in per_gpu)
    # one load for both: loaded once, unloaded once (after the second)
    assert through["load_s"] == direct["load_s"] and "unload_s" not in through and "unload_s" in direct
    # nginx's CPU is read from /proc in clock ticks (10 ms): a 3 s window of 40 req/s through it (~120 requests of
    # tens of µs) may hold no tick, so the cost is recorded as a number, not always above 0 (0.0 seen once in CI)
    cost = through["balancer_cpu"]
    assert isinstance(cost["us_per_request"], float) and cost["us_per_request"] >= 0 and cost["wall_s"] > 0
    assert "balancer: nginx/" in text


def test_ctrl_c_stops_nginx_and_the_servers(repository: Path, tmp_path: Path, nginx_env: dict[str, str]) -> None:
    cores = cpu.run_cores()
    if len(cores) < 2:
        pytest.skip(f"needs two cores to give each of two servers its own; this process may run on {cores}")
    cmd = _command(repository, tmp_path / "interrupted", cores, "bert_tiny_null", window=30)
    code, seen = _run_ab(cmd, tmp_path / "ab.log", nginx_env, interrupt_when="nginx")
    assert code != 0 and "nginx" in seen.values()
    assert not [name for p, name in seen.items() if psutil.pid_exists(p)], "left running after Ctrl+C"
