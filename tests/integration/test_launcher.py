"""The launcher refuses clearly: taken port, numpy >= 2 in the stub's environment, no server binary."""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import subprocess
import sys
import threading
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from inflight.server.config import (
    ServerConfig,
    check_stub_numpy,
    find_tritonserver,
    free_ports,
    prepare_backend_dir,
    stub_environment,
)
from inflight.server.launcher import TritonServer
from inflight.tool_errors import ServerError

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_port_in_use_is_refused_with_the_fix(tmp_path: Path, repository: Path) -> None:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        grpc, metrics = free_ports(2)
        cfg = ServerConfig(
            model_repository=repository,
            workdir=tmp_path,
            http_port=port,
            grpc_port=grpc,
            metrics_port=metrics,
        )
        with pytest.raises(ServerError, match=rf"http port {port} is already in use.*--http-port"):
            TritonServer(cfg).start()


@contextlib.contextmanager
def another_http_server() -> Iterator[int]:
    """A plain HTTP server that answers 200 to every GET (a readiness probe too) on a free port, for the block."""

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_port_taken_after_the_check_is_not_mistaken_for_this_servers_readiness(
    tmp_path: Path, repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process takes the HTTP port between the launcher's check and the bind and answers the probe.

    (A CI run's load test loaded its models into another server that way.) The check is made to pass here, as it
    did there: tritonserver then exits ("already in use"), and the other server's 200 must not count as ready.
    """
    monkeypatch.setattr("inflight.server.launcher.port_free", lambda port: True)
    with another_http_server() as taken:
        grpc, metrics = free_ports(2)
        fixed = ServerConfig(
            model_repository=repository,
            workdir=tmp_path / "fixed",
            http_port=taken,
            grpc_port=grpc,
            metrics_port=metrics,
            models=[],
        )
        with pytest.raises(ServerError, match="already in use"):
            TritonServer(fixed).start()
        # ports picked free: started again on new ones
        picked = ServerConfig.on_free_ports(repository, tmp_path / "picked", http_port=taken)
        assert picked.ports_picked
        with TritonServer(picked) as s:
            assert picked.http_port != taken and s.ready() and s.is_alive()
        assert "already in use" in (tmp_path / "picked" / "tritonserver.log").read_text()


def test_missing_binary_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match=r"tritonserver not found at .*pip install 'inflight\[server\]'"):
        find_tritonserver(tmp_path / "nope" / "tritonserver")


def test_numpy_2_in_the_stub_environment_is_refused(tmp_path: Path) -> None:
    """A real venv with numpy 2 first on PATH: the launcher must refuse and say how to fix it."""
    env_dir = tmp_path / "np2"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    r = subprocess.run([py, "-m", "pip", "install", "-q", "numpy>=2,<3"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot install numpy 2 into a test venv here (no package index?): {r.stderr[-300:]}")
    env = dict(os.environ, PATH=f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ServerError, match=r"numpy 2\.\d+\.\d+ is installed in .*np2.*pip install 'numpy<2'"):
        check_stub_numpy(env)


def test_stub_environment_uses_this_interpreter(tmp_path: Path) -> None:
    dist = find_tritonserver()
    env = stub_environment(dist, base={"PATH": "/usr/bin"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert check_stub_numpy(env).startswith("1.")
    backends = prepare_backend_dir(dist, tmp_path)
    assert (backends / "inflight" / "model.py").is_file()
    assert (backends / "null" / "model.py").is_file(), "the null control model travels with ours"
    assert (backends / "python" / "triton_python_backend_stub").exists()


def test_serve_command_stops_cleanly_on_sigterm(tmp_path: Path, repository: Path) -> None:
    import signal
    import time
    import urllib.request

    http, grpc, metrics = free_ports(3)
    p = subprocess.Popen(
        [
            sys.executable, "-m", "inflight.cli", "serve", "--repository", str(repository), "-m", "linear_head_sync",
            "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
            "--workdir", str(tmp_path),
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("server did not become ready")
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out
    assert "tritonserver stopped (exit code 0)" in out
    assert "finalized (drained)" in (tmp_path / "tritonserver.log").read_text()


def test_a_stub_built_for_another_python_is_refused(tmp_path: Path) -> None:
    """An installed server whose stub links another libpython (e.g. a 3.12 kit under 3.11) is refused."""
    import shutil

    from inflight.server.config import _dist_for, stub_python_version

    pytriton = pytest.importorskip("pytriton", reason="the stubs for other Pythons come from the nvidia-pytriton wheel")
    stubs = Path(pytriton.__file__).parent / "tritonserver" / "python_backend_stubs"
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    other = next(v for v in ("3.12", "3.11", "3.10") if v != running)
    if not (stubs / other / "triton_python_backend_stub").is_file():
        pytest.skip(f"this Triton install has no stub for Python {other} (a trimmed kit keeps only its own)")
    assert stub_python_version(stubs / running / "triton_python_backend_stub") == running
    server = tmp_path / "tritonserver"
    (server / "bin").mkdir(parents=True)
    (server / "backends" / "python").mkdir(parents=True)
    (server / "bin" / "tritonserver").write_text("")
    shutil.copy(stubs / other / "triton_python_backend_stub", server / "backends" / "python")
    with pytest.raises(ServerError, match=rf"built for Python {other} but inflight runs under Python {running}"):
        _dist_for(server / "bin" / "tritonserver")
