"""A real load balancer in front of several tritonservers: nginx, as users run one before Triton.

One tritonserver per GPU behind a balancer is how a multi-GPU host (and, with the balancer or a
Kubernetes Service in front, several hosts) is usually deployed. :class:`Balancer` runs nginx from
any install (``INFLIGHT_NGINX``, ``nginx`` on PATH, or the copy ``scripts/setup.sh`` unpacks from
Debian's package into ``.venv/nginx``) with a configuration written for the upstream servers: HTTP/1.1
keep-alive connections to each upstream, request bodies of any size held in memory, no access log.
nginx's default policy (round robin) spreads the requests; every file it writes stays in ``workdir``.
It is a tool beside the backend: nothing in the runtime imports it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from inflight.tool_errors import ServerError

#: Environment variable naming the nginx binary.
NGINX_ENV = "INFLIGHT_NGINX"
#: Where ``scripts/setup.sh`` unpacks Debian's nginx package, under the environment's prefix.
SETUP_NGINX = Path("nginx/usr/sbin/nginx")
#: Idle keep-alive connections each nginx worker keeps to the upstreams (a Triton HTTP frontend serves
#: many connections; a new connection per request would be the balancer's cost, not the layout's).
KEEPALIVE = 256


def find_nginx() -> Path:
    """The nginx binary: ``$INFLIGHT_NGINX``, ``nginx`` on PATH, or the one ``scripts/setup.sh`` unpacked.

    Raises:
        ServerError: when none is found, saying how to get one.
    """
    named = os.environ.get(NGINX_ENV)
    if named:
        if not os.access(named, os.X_OK):
            raise ServerError(f"{NGINX_ENV}={named} is not an executable file; point it at an nginx binary")
        return Path(named)
    on_path = shutil.which("nginx")
    if on_path:
        return Path(on_path)
    unpacked = Path(sys.prefix) / SETUP_NGINX
    if os.access(unpacked, os.X_OK):
        return unpacked
    raise ServerError(
        f"nginx not found: set {NGINX_ENV}, put nginx on PATH, or run scripts/setup.sh (it unpacks Debian's "
        "package: `apt-get download nginx && dpkg-deb -x nginx_*.deb .venv/nginx`)"
    )


def nginx_version(binary: Path) -> str | None:
    """``nginx -v``'s answer (``nginx/1.22.1``), or None when the binary does not say."""
    try:
        r = subprocess.run([str(binary), "-v"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (r.stderr or r.stdout).strip()
    return text.split(":", 1)[1].strip() if text.startswith("nginx version:") else text or None


def split_endpoint(endpoint: str, what: str, example: str) -> tuple[str, int]:
    """``host:port`` as ``(host, port)``.

    Raises:
        ServerError: naming ``what`` and giving ``example`` when ``endpoint`` is not host:port.
    """
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ServerError(f"{what} {endpoint!r}: give host:port, e.g. {example}")
    return host, int(port)


def nginx_config(upstreams: Sequence[str], port: int, workdir: Path, workers: int = 1, host: str = "127.0.0.1") -> str:
    """The configuration of a balancer on ``host:port`` over ``upstreams`` (``host:port`` HTTP endpoints).

    Args:
        upstreams: The servers' HTTP endpoints.
        port: The balancer's port.
        workdir: Where nginx keeps its pid, error log and temporary files.
        workers: nginx worker processes (each one event loop on one core).
        host: The address it listens on (``0.0.0.0``: every interface, for clients on other hosts).

    Raises:
        ServerError: for no upstream, a malformed one, or fewer than one worker.
    """
    if not upstreams:
        raise ServerError("a balancer needs at least one upstream server (host:port)")
    for u in upstreams:
        split_endpoint(u, "upstream", "127.0.0.1:8000")
    if workers < 1:
        raise ServerError(f"workers={workers}: give at least one nginx worker")
    servers = "\n".join(f"        server {u};" for u in upstreams)
    temp = "\n".join(
        f"    {kind}_temp_path {workdir / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""worker_processes {workers};
pid {workdir / "nginx.pid"};
error_log {workdir / "nginx-error.log"} warn;
events {{
    worker_connections 16384;
}}
http {{
    access_log off;
{temp}
    client_max_body_size 0;
    client_body_buffer_size 16m;
    upstream triton {{
{servers}
        keepalive {KEEPALIVE};
    }}
    server {{
        listen {host}:{port} backlog=4096;
        location / {{
            proxy_pass http://triton;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


class Balancer:
    """nginx over ``upstreams`` on ``127.0.0.1:port``, from ``start()`` (or ``with``) until ``stop()``.

    Args:
        upstreams: The servers' HTTP endpoints (``host:port``).
        port: The balancer's port.
        workdir: Its configuration, pid, log and temporary files.
        workers: nginx worker processes.
        cpus: Cores nginx may run on (``taskset`` list; empty: the caller's affinity).
        nginx: The binary (None: :func:`find_nginx`).
    """

    def __init__(
        self,
        upstreams: Sequence[str],
        port: int,
        workdir: Path,
        *,
        workers: int = 1,
        cpus: str = "",
        nginx: Path | None = None,
    ) -> None:
        self.upstreams = list(upstreams)
        self.port = port
        self.workdir = workdir
        self.workers = workers
        self.cpus = cpus
        self.nginx = nginx
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The balancer's HTTP endpoint (``host:port``)."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> Balancer:
        """Write the configuration, start nginx, and wait until it accepts connections.

        Raises:
            ServerError: when nginx is missing, refuses the configuration or does not listen in time
                (with the end of its error log).
        """
        binary = self.nginx or find_nginx()
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.workdir / kind).mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "nginx.conf"
        conf.write_text(nginx_config(self.upstreams, self.port, self.workdir, self.workers))
        cmd = [str(binary), "-p", str(self.workdir), "-c", str(conf), "-g", "daemon off;"]
        if self.cpus:
            cmd = ["taskset", "-c", self.cpus, *cmd]
        log = (self.workdir / "nginx.out").open("wb")
        try:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"nginx exited with code {self.proc.returncode}: {self._log_tail()}")
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.1)
        self.stop()
        raise ServerError(f"nginx did not listen on port {self.port} within {timeout_s:.0f} s: {self._log_tail()}")

    def ready(self, timeout_s: float = 60.0) -> None:
        """Wait until Triton answers ``/v2/health/ready`` through the balancer.

        Raises:
            ServerError: when it does not within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.2)
        raise ServerError(f"no upstream ready through the balancer on {self.url} within {timeout_s:.0f} s: {last}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop nginx (a graceful quit, then a kill); a no-op when it is not running."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)

    def _log_tail(self, lines: int = 5) -> str:
        texts = []
        for name in ("nginx-error.log", "nginx.out"):
            p = self.workdir / name
            if p.is_file():
                texts += p.read_text(errors="replace").splitlines()[-lines:]
        return " | ".join(texts) or "(no log)"

    def __enter__(self) -> Balancer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
