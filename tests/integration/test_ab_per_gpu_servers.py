"""``inflight ab --server-per-gpu 0,1`` end to end on the CPU host: two real tritonservers, one generator.

The runner starts one server per listed GPU (``CUDA_VISIBLE_DEVICES=0`` and ``=1``; on the CPU host
no GPU is visible either way and the null control model runs on the CPU), each pinned to one of two
cores, loads the null model on both, and the asyncio generator's two sources send to one server
each. One rate, a 3 s window: the JSON must record two servers on disjoint cores that each answered
a share of the requests, the report must state the deployment, and both servers must be gone after
the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from tests.helpers import ab_command

from inflight.loadtest import cpu, list_options
from inflight.loadtest import openloop as ol

pytestmark = pytest.mark.integration

#: Seconds the whole run may take (two server starts, a 1 s warm-up, a 3 s window, two stops; ~20 s here).
RUN_TIMEOUT_S = 300


def _tritonservers_under(pid: int) -> set[int]:
    """Pids of the tritonserver processes among ``pid``'s descendants now."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return set()
    found: dict[int, int] = {}  # pid -> parent pid
    for c in children:
        with contextlib.suppress(psutil.Error):
            if c.name() == "tritonserver":
                found[c.pid] = c.ppid()
    # a server starts each Python stub by fork, a trial run of the stub through system(), then exec of bash
    # (python_backend src/stub_launcher.cc, StubLauncher::Launch): until the exec the child is named tritonserver
    # too (a CI run on the CPU host, 2026-11-27, saw one), so a tritonserver whose parent is one is not a server
    return {pid for pid, parent in found.items() if parent not in found}


def _run_ab(cmd: list[str], log: Path, env: dict[str, str]) -> tuple[int, set[int]]:
    """Run ``inflight ab``; return its exit code and the tritonservers it started (seen while it ran).

    On a timeout or a failure of this test the run is stopped with SIGTERM (the runner then stops its
    servers), and any server still alive after that is killed: nothing it started outlives the test.
    """
    seen: set[int] = set()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while proc.poll() is None:
                seen |= _tritonservers_under(proc.pid)
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
            for pid in seen:  # the launcher gives each server its own process group
                if psutil.pid_exists(pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGKILL)
    return proc.returncode, seen


def test_one_server_per_gpu_each_on_its_cores_each_answering_a_share(repository: Path, tmp_path: Path) -> None:
    cores = cpu.run_cores()
    if len(cores) < 2:
        pytest.skip(f"needs two cores to give each of two servers its own; this process may run on {cores}")
    out = tmp_path / "perserver"
    cmd = ab_command(
        "bert_tiny_null",
        "--server-per-gpu",
        "0,1",
        "--generator",
        "asyncio",
        "--rate",
        "40",
        # the servers on two cores, one each; the generator shares them (the CPU host has two)
        "--server-cpus",
        ol.format_cpus(cores[:2]),
        "--no-isolate",
        "--check-every",
        "1",
        repository=repository,
        out=out,
        window=3,
        processes=2,
    )
    # GPU indices count the GPUs this run sees; without an inherited list they are the host's own
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    log = tmp_path / "ab.log"
    code, seen = _run_ab(cmd, log, env)
    text = log.read_text(errors="replace")
    assert code == 0, f"inflight ab failed ({code}):\n{text[-4000:]}"

    (path,) = out.glob("ab-*.json")
    doc = json.loads(path.read_text())
    assert doc["valid"], doc["problems"]
    server = doc["server"]
    assert server["server_gpus"] == [0, 1]
    per_gpu = server["per_gpu_servers"]
    assert [s["gpu"] for s in per_gpu] == [0, 1]
    assert [s["cuda_visible_devices"] for s in per_gpu] == ["0", "1"]
    # each server on its own core: disjoint, and together the server set
    shares = [set(list_options.parse_cpus(s["cpus"])) for s in per_gpu]
    assert all(shares) and not shares[0] & shares[1]
    assert shares[0] | shares[1] == set(cores[:2])
    assert len({s["http"] for s in per_gpu}) == 2 and server["http"] == ",".join(s["http"] for s in per_gpu)
    assert all(s["exit"] == {"code": 0, "reason": None} for s in per_gpu) and server["exit"]["code"] == 0
    # the runner started exactly these two servers, and both are gone now
    assert seen == {s["pid"] for s in per_gpu}
    assert not any(psutil.pid_exists(pid) for pid in seen)

    (run,) = doc["runs"]
    assert run["rate"] == 40.0 and run["locust"]["failures"] == 0
    # each server answered a non-zero share; together they answered what Triton's summed statistics say
    assert len(run["per_server_requests"]) == 2 and all(n > 0 for n in run["per_server_requests"])
    assert sum(run["per_server_requests"]) == run["server"]["requests"] > 0
    assert server["per_server_requests"] == run["per_server_requests"]
    # the generator's side: one source per server
    per_url = run["generator_run"]["per_url"]
    assert sorted(per_url) == sorted(s["http"] for s in per_gpu)
    assert all(v["sources"] == 1 and v["ok"] > 0 for v in per_url.values())
    # every server's figures are in the record: both servers' stubs, their drained queues, their unloads
    assert run["stub_memory"]["stubs"] == 2
    assert run["drain_s"] is not None and run["requests_after_window"]["pending"] == 0
    assert [u["gpu"] for u in run["per_server_unload"]] == [0, 1]
    assert run["cpu"]["host_cores"] == len(cores) and run["cpu"]["server_cores"] >= 0

    data = Path(doc["data_dir"])
    for g in (0, 1):
        assert "tritonserver started by inflight" in (data / f"tritonserver-gpu{g}.log").read_text()
    md = path.with_suffix(".md").read_text()
    assert "- deployment: 2 servers, one per GPU: GPU 0 on core" in md and "GPU 1 on core" in md
    assert "requests answered per server" in md
    assert "servers: 2 servers, one per GPU" in text
