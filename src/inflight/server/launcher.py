"""Start and stop a real ``tritonserver`` that serves the model repository with our backend.

The process's lifecycle: start it (pinned, its backend directory and environment prepared by
``inflight.server.config``), wait until it is ready, stop it and say why it exited; how it is
configured and where it comes from is ``inflight.server.config``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

from inflight.server.config import (
    ServerConfig,
    TritonDist,
    check_stub_numpy,
    find_tritonserver,
    free_ports,
    listens_on,
    port_free,
    prepare_backend_dir,
    stub_environment,
)
from inflight.server.reply_buffer import http_reply_buffer
from inflight.tool_errors import ServerError, StopRequested

LOGGER = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal a process gets when the thread that forked it dies (``<sys/prctl.h>``)."""
#: Starts of a server whose ports were picked free, each on new ones after a port was taken first.
PORT_ATTEMPTS = 3


def _server_child_setup(cpus: tuple[int, ...], parent_pid: int | None = None) -> None:
    """In the forked child before exec: pin to ``cpus`` and lift the open-file limit to its hard limit.

    Every open HTTP connection is a file descriptor of tritonserver; an open-loop load keeps one
    per request in flight, more than the common soft limit of 1024 under overload. With
    ``parent_pid``, the child also asks for SIGTERM when its parent dies (and stops now if it
    already has).
    """
    if parent_pid is not None and sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
    if cpus:
        os.sched_setaffinity(0, cpus)
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


#: The folders Triton's Python backend makes for its stubs' environments (``mkdtemp``), one per server.
PYTHON_ENV_DIRS = Path("/tmp/python_env_*")


def running_tritonservers() -> list[int]:
    """Pids of the tritonserver processes running on this host now (from ``/proc``; empty elsewhere)."""
    pids = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if comm.read_text().strip() == "tritonserver":
                pids.append(int(comm.parent.name))
    return sorted(pids)


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes of process group ``pgid``, from ``/proc``.

    Where ``/proc`` is missing, ``[pgid]`` while ``killpg(pgid, 0)`` finds the group, else ``[]``.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for stat in proc.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split after the last ')'
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(stat.parent.name))
    return sorted(members)


def exit_reason(log: str, code: int | None, killed: str | None = None) -> str | None:
    """Why tritonserver exited non-gracefully, read from its log; None for a clean exit (code 0).

    Args:
        log: The server log of this run.
        code: Its exit code (negative: killed by that signal).
        killed: Why the launcher killed it, when it did (e.g. "it did not stop within 60 s of
            SIGTERM and was killed").
    """
    if code == 0 or code is None:
        return None
    parts: list[str] = []
    if killed is not None:
        parts.append(f"{killed} (signal {-code})" if code < 0 else killed)
    elif code == -signal.SIGTERM and "Started HTTPService" not in log:
        parts.append(
            "it was killed by signal 15 (SIGTERM), not shut down: it had not started serving yet (Triton 2.51 "
            "dies of SIGTERM while it loads its models; none was finalized)"
        )
    elif code < 0:
        parts.append(f"it was killed by signal {-code}")
    lines = log.splitlines()
    failed = [ln.split("failed to stop server:", 1)[1].strip(' ".') for ln in lines if "failed to stop server:" in ln]
    if failed:
        parts.append(f"Triton: failed to stop server: {failed[-1]}")
    for proto in ("HTTP", "GRPC"):
        found = [ln for ln in lines if "Found " in ln and f" {proto} SERVICE CONNECTIONS" in ln.upper()]
        if found:
            n = found[-1].split("Found ", 1)[1].split(" ", 1)[0]
            if n.isdigit() and int(n) > 0:
                parts.append(
                    f"{n} {proto if proto == 'HTTP' else 'gRPC'} connection(s) were still open when the exit "
                    "timeout expired (Triton waits for them; a request it never answers keeps one: Triton 2.51 "
                    "never answers a request whose batch dimension is 0, e.g. shape [0, 0]; README, Known limits)"
                )
    stubs = sum("Non-graceful termination detected" in ln for ln in lines)
    if stubs:
        parts.append(f"{stubs} Python-backend stub(s) were terminated without finalize()")
    errors = [ln for ln in lines if ln.startswith("E") and "failed to stop server" not in ln]
    if not parts and errors:
        parts.append(f"last error in its log: {errors[-1][:300]}")
    return "; ".join(parts) if parts else f"exit code {code} (the log says nothing more)"


class TritonServer:
    """A tritonserver process: ``start()``, ``wait_ready()``, ``stop()``; a context manager.

    Example:
        >>> with TritonServer(ServerConfig(model_repository=repo, workdir=tmp, models=["bert_tiny_sync"])) as s:
        ...     print(s.http_url)
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.dist: TritonDist | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = config.workdir / "tritonserver.log"
        self._log_start = 0  # where this start's part of the (appended) log begins
        self._env_dirs_before: set[Path] = set()
        #: Why the server last exited non-gracefully (from its log), or None after a clean exit.
        self.exit_reason: str | None = None
        self._log_file: object | None = None

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP endpoint (tritonclient form)."""
        return f"127.0.0.1:{self.config.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint."""
        return f"127.0.0.1:{self.config.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus metrics endpoint."""
        return f"http://127.0.0.1:{self.config.metrics_port}/metrics"

    def command(self, backend_dir: Path) -> list[str]:
        """The tritonserver command line."""
        assert self.dist is not None
        c = self.config
        cmd = [
            str(self.dist.binary),
            f"--model-repository={c.model_repository.resolve()}",
            f"--backend-directory={backend_dir}",
            f"--http-port={c.http_port}",
            f"--grpc-port={c.grpc_port}",
            f"--metrics-port={c.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=true",
            f"--log-verbose={c.log_verbose}",
            "--exit-on-error=false",
            "--strict-readiness=true",
        ]
        if c.models is not None:
            cmd.append("--model-control-mode=explicit")
            cmd += [f"--load-model={m}" for m in c.models]
        cmd += [f"--backend-config={b}" for b in c.backend_config]
        cmd += list(c.extra_args)
        return cmd

    def start(self, stop_requested: Callable[[], bool] | None = None) -> TritonServer:
        """Check ports and numpy, prepare the backend folder, launch, and wait for readiness.

        On a port taken first, a ``ports_picked`` config starts again on new ports (:data:`PORT_ATTEMPTS` in all).

        Args:
            stop_requested: Polled while waiting for another launcher's start (``http_reply_buffer``'s lock) and
                for readiness; when it returns True ``StopRequested`` is raised (e.g. Ctrl+C during a long model load).

        Raises:
            ServerError: on a taken port, numpy >= 2, no server binary, or a server that exits or
                does not become ready (the message quotes the end of the server log); the server is
                stopped then.
            StopRequested: when ``stop_requested()`` turned True; the server (if it was started) still runs, for
                the caller to ``stop()``.
        """
        c = self.config
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                return self._start(stop_requested)
            except ServerError as e:
                if not c.ports_picked or "already in use" not in str(e):
                    raise
            c.http_port, c.grpc_port, c.metrics_port = free_ports(3)
            LOGGER.warning("a port was taken before tritonserver bound it; starting again on HTTP %s", self.http_url)
        return self._start(stop_requested)

    def _start(self, stop_requested: Callable[[], bool] | None) -> TritonServer:
        c = self.config
        for name, port in (("http", c.http_port), ("grpc", c.grpc_port), ("metrics", c.metrics_port)):
            if not port_free(port):
                raise ServerError(
                    f"{name} port {port} is already in use (another tritonserver?); stop it or choose another "
                    f"port (--{name}-port / INFLIGHT_{name.upper()}_PORT)"
                )
        self.dist = find_tritonserver(c.tritonserver)
        c.workdir.mkdir(parents=True, exist_ok=True)
        backend_dir = prepare_backend_dir(self.dist, c.workdir)
        env = stub_environment(self.dist)
        env.update(c.env)
        numpy_version = check_stub_numpy(env)
        cmd = self.command(backend_dir)
        LOGGER.info("starting %s (numpy %s in the stub)", " ".join(cmd), numpy_version)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by this object, closed in stop()
        self._log_file = log
        # one log file for every start in this workdir: each start gets a header, and the exit reason
        # is read from this start's part only
        self._log_start = log.tell()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %z")
        log.write(f"==== {stamp}: tritonserver started by inflight: {' '.join(cmd)}\n".encode())
        log.flush()
        self._env_dirs_before = set(PYTHON_ENV_DIRS.parent.glob(PYTHON_ENV_DIRS.name))
        self.exit_reason = None
        buffer = (
            http_reply_buffer(c.http_reply_buffer_bytes, stop_requested=stop_requested)
            if c.http_reply_buffer_bytes
            else contextlib.nullcontext()
        )
        with buffer:
            try:
                self.process = subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=functools.partial(
                        _server_child_setup, tuple(c.cpus), os.getpid() if c.die_with_launcher else None
                    ),
                )
                LOGGER.info("tritonserver started: pid %d (its own process group)", self.process.pid)
                self.wait_ready(c.startup_timeout_s, stop_requested)
            except StopRequested:
                raise  # the caller stops it (its stop() may escalate on further requests)
            except BaseException:
                self.stop()
                raise
        return self

    def is_alive(self) -> bool:
        """True while the server process runs."""
        return self.process is not None and self.process.poll() is None

    def _get(self, path: str, timeout: float = 2.0) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=timeout) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return 0

    def ready(self) -> bool:
        """True when the server says it is ready (all loaded models ready, strict readiness)."""
        return self._get("/v2/health/ready") == 200

    def model_ready(self, model: str) -> bool:
        """True when ``model`` is loaded and ready."""
        return self._get(f"/v2/models/{model}/ready") == 200

    def wait_ready(self, timeout_s: float, stop_requested: Callable[[], bool] | None = None) -> None:
        """Block until ready.

        Raises:
            ServerError: when the process exits first, ``timeout_s`` passes or ``stop_requested()``
                returns True.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if stop_requested is not None and stop_requested():
                raise StopRequested("stop requested while tritonserver was starting; it was not ready yet")
            if not self.is_alive():
                code = self.process.returncode if self.process else None
                raise ServerError(f"tritonserver exited with code {code} during start-up:\n{self.log_tail()}")
            if self.ready() and self._serves_http():
                for m in self.config.models or ():
                    if not self.model_ready(m):
                        raise ServerError(f"model {m!r} failed to load:\n{self.log_tail()}")
                return
            time.sleep(0.25)
        raise ServerError(f"tritonserver not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def _serves_http(self) -> bool:
        """Whether this server listens on the HTTP port: the readiness answer is its own (``listens_on``)."""
        return self.process is not None and listens_on(self.process.pid, self.config.http_port) is not False

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(
        self,
        timeout_s: float = 60.0,
        *,
        more_requests: Callable[[float], int] | None = None,
        kill_grace_s: float = 5.0,
        group_grace_s: float = 3.0,
    ) -> int | None:
        """Stop the server: SIGTERM to its process group (Triton unloads the models, calling finalize()).

        The server is killed (SIGKILL to its process group) after ``timeout_s``, or sooner when
        more stop requests come in: one more sends SIGTERM to the group again and SIGKILL
        ``kill_grace_s`` later; two more send SIGKILL at once. This returns only when no process
        of the server's group is left: stubs that outlive tritonserver by ``group_grace_s`` are
        killed too.

        Args:
            timeout_s: How long Triton may take to stop on its own.
            more_requests: Waits at most the seconds it is given for another stop request and
                returns how many came in since this stop began (``StopSignals.wait`` minus its
                count at the start); None: no escalation but the timeout.
            kill_grace_s: Between the second request's SIGTERM and SIGKILL.
            group_grace_s: How long the group's other processes may outlive tritonserver.

        Returns:
            The exit code (negative: the signal that killed it), or None when the server was not
            started.
        """
        p = self.process
        code: int | None = None
        killed: str | None = None
        if p is not None and p.poll() is None:
            self._signal_group(signal.SIGTERM)
            t0 = time.monotonic()
            kill_at = t0 + timeout_s
            escalated = False
            while p.poll() is None:
                now = time.monotonic()
                if now >= kill_at:
                    if killed is None:
                        killed = f"it did not stop within {timeout_s:.0f} s of SIGTERM and was killed"
                    LOGGER.warning("tritonserver: %s; sending SIGKILL to its process group", killed)
                    self._signal_group(signal.SIGKILL)
                    p.wait()
                    break
                step = min(0.25, kill_at - now)
                if more_requests is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(step)
                    continue
                more = more_requests(step)
                if more >= 2:
                    killed = "a third stop request (Ctrl+C) came while it was stopping: it was killed"
                    kill_at = now
                elif more == 1 and not escalated:
                    escalated = True
                    killed = (
                        f"a second stop request (Ctrl+C) came while it was stopping: SIGTERM again, and it was "
                        f"killed {kill_grace_s:.0f} s later"
                    )
                    LOGGER.warning(
                        "second stop request: SIGTERM to tritonserver's process group again, SIGKILL in %.0f s "
                        "(a third request kills it now)",
                        kill_grace_s,
                    )
                    self._signal_group(signal.SIGTERM)
                    kill_at = min(kill_at, now + kill_grace_s)
            code = p.returncode
        elif p is not None:
            code = p.returncode
        if p is not None:
            self._reap_group(p.pid, group_grace_s)
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None
        if p is not None:
            self.exit_reason = exit_reason(self._log_since_start(), code, killed=killed if code != 0 else None)
            if self.exit_reason:
                LOGGER.warning("tritonserver exited non-gracefully (code %s): %s", code, self.exit_reason)
            self._remove_leftover_env_dirs()
        return code

    def _signal_group(self, sig: int) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    def _reap_group(self, pgid: int, grace_s: float) -> None:
        """Wait until no process of group ``pgid`` is left; SIGKILL the rest after ``grace_s``."""
        deadline = time.monotonic() + grace_s
        while group_members(pgid):
            if time.monotonic() >= deadline:
                left = group_members(pgid)
                LOGGER.warning(
                    "%d process(es) of tritonserver's group outlived it by %.0f s (pid %s); killing them",
                    len(left),
                    grace_s,
                    ", ".join(map(str, left[:5])),
                )
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                deadline = time.monotonic() + grace_s
                while group_members(pgid) and time.monotonic() < deadline:
                    time.sleep(0.05)
                return
            time.sleep(0.05)

    def _log_since_start(self) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _remove_leftover_env_dirs(self) -> None:
        """Remove the empty ``/tmp/python_env_*`` folders this server's Python backend left behind.

        The Python backend makes one (at the first Python model's load, not at server start) and
        removes it when it shuts down cleanly; after a non-graceful exit it stays. The folder names
        say nothing of their server, and another live server would abort at its own shutdown if its
        folder went missing ("fts_read error"), so folders are removed only while no other tritonserver
        runs on this host, and only empty ones that appeared while this server ran.
        """
        left = set(PYTHON_ENV_DIRS.parent.glob(PYTHON_ENV_DIRS.name)) - self._env_dirs_before
        if not left:
            return
        others = running_tritonservers()
        if others:
            LOGGER.info(
                "left %d /tmp/python_env_* folder(s) in place: another tritonserver runs (pid %s) and may own them",
                len(left),
                ", ".join(map(str, others[:5])),
            )
            return
        for d in left:
            with contextlib.suppress(OSError):
                d.rmdir()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@contextlib.contextmanager
def serving(config: ServerConfig) -> Iterator[TritonServer]:
    """Context manager form of ``TritonServer(config)``."""
    server = TritonServer(config)
    server.start()
    try:
        yield server
    finally:
        server.stop()
