"""The launcher's account of a server's exit, and the Python backend's leftover folders."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inflight.server import launcher
from inflight.server.config import ServerConfig
from inflight.server.launcher import TritonServer, exit_reason, running_tritonservers

ZERO_BATCH_LOG = """\
I1123 03:04:00.798279 10920 http_server.cc:248] "Timeout 4: Found 3 HTTP service connections"
I1123 03:04:03.798915 10920 http_server.cc:248] "Timeout 1: Found 1 HTTP service connections"
E1123 03:04:04.800053 10920 main.cc:535] "failed to stop server: Internal - Exit timeout expired. Exiting immediately."
I1123 03:04:05.830814 11162 pb_stub.cc:2145]  Non-graceful termination detected.
I1123 03:04:05.900671 11109 pb_stub.cc:2145]  Non-graceful termination detected.
"""


def test_exit_reason_reads_the_log() -> None:
    r = exit_reason(ZERO_BATCH_LOG, 1)
    assert r is not None
    assert "Triton: failed to stop server: Internal - Exit timeout expired. Exiting immediately" in r
    assert "1 HTTP connection(s) were still open when the exit timeout expired" in r  # the last count
    assert "batch dimension is 0" in r and "2 Python-backend stub(s) were terminated without finalize()" in r
    assert exit_reason(ZERO_BATCH_LOG, 0) is None  # a clean exit needs no reason, whatever the log holds
    assert exit_reason("", None) is None
    killed = exit_reason("", -9, killed="it did not stop within 60 s of SIGTERM and was killed")
    assert killed == "it did not stop within 60 s of SIGTERM and was killed (signal 9)"
    assert exit_reason("", -11) == "it was killed by signal 11"
    assert "it had not started serving yet" in (exit_reason("I ... loading: linear_head_sync:1\n", -15) or "")
    assert exit_reason('I "Started HTTPService at 0.0.0.0:8000"\n', -15) == "it was killed by signal 15"
    assert exit_reason("E1123 model.cc] boom\n", 1) == "last error in its log: E1123 model.cc] boom"
    assert exit_reason("nothing useful\n", 3) == "exit code 3 (the log says nothing more)"


def test_running_tritonservers_finds_a_process_by_name(tmp_path: Path) -> None:
    fake = tmp_path / "tritonserver"
    fake.symlink_to(Path(sys.executable).resolve())
    p = subprocess.Popen([str(fake), "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 5
        while p.pid not in running_tritonservers() and time.monotonic() < deadline:
            time.sleep(0.05)  # /proc/PID/comm names the program once the child has exec'd it
        assert p.pid in running_tritonservers()
    finally:
        p.kill()
        p.wait()
    assert p.pid not in running_tritonservers()


def _server_with_leftovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, others: list[int]
) -> tuple[TritonServer, Path, Path]:
    monkeypatch.setattr(launcher, "PYTHON_ENV_DIRS", tmp_path / "python_env_*")
    monkeypatch.setattr(launcher, "running_tritonservers", lambda: others)
    old = tmp_path / "python_env_old"
    old.mkdir()
    server = TritonServer(ServerConfig(model_repository=tmp_path, workdir=tmp_path))
    server._env_dirs_before = {old}
    new = tmp_path / "python_env_new"
    new.mkdir()
    return server, old, new


def test_leftover_env_folders_are_removed_when_no_other_server_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, old, new = _server_with_leftovers(tmp_path, monkeypatch, others=[])
    busy = tmp_path / "python_env_busy"
    busy.mkdir()
    (busy / "env").write_text("extracted environment")
    server._remove_leftover_env_dirs()
    assert old.is_dir(), "a folder that was there before this server started is not its to remove"
    assert not new.exists(), "the empty folder this server left is removed"
    assert busy.is_dir(), "a folder with contents is never removed"


def test_leftover_env_folders_stay_while_another_server_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server, old, new = _server_with_leftovers(tmp_path, monkeypatch, others=[os.getpid()])
    server._remove_leftover_env_dirs()
    assert old.is_dir() and new.is_dir(), "another live tritonserver may own the new folder: it must stay"


def test_free_ports_are_distinct_and_bindable() -> None:
    from inflight.server.config import free_ports, port_free

    for _ in range(200):
        ports = free_ports(3)
        assert len(set(ports)) == 3, ports
    assert all(port_free(p, "127.0.0.1") for p in free_ports(3))


def test_free_ports_lie_below_the_ephemeral_range_where_clients_connections_take_theirs() -> None:
    from inflight.server.config import PORTS_FROM, _ephemeral_low, free_ports

    low = _ephemeral_low()
    if low is None or low - PORTS_FROM < 1000:
        pytest.skip(f"no room below the ephemeral range here (its first port: {low})")
    ports = [p for _ in range(50) for p in free_ports(3)]
    assert all(PORTS_FROM <= p < low for p in ports), [p for p in ports if not PORTS_FROM <= p < low][:5]
