"""Start and stop a real ``tritonserver`` that serves the model repository with our backend.

Two server installations are supported:

* ``tritonserver`` on PATH (an NGC Triton container, ``/opt/tritonserver``): its own backends
  (TensorRT, Python...) are linked into the backend directory next to ``inflight``;
* the binary inside the ``nvidia-pytriton`` wheel (Triton 2.51, Python backend only): the Python
  backend stub that matches the running interpreter is copied in, as PyTriton does.

The Python-backend stub embeds libpython and ignores PYTHONPATH: it takes ``sys.prefix`` from the
first ``python3`` on PATH and must load the libpython of that same installation. The launcher
therefore puts the running interpreter's ``bin/`` first on PATH and its LIBDIR first on
LD_LIBRARY_PATH, and refuses to start when that environment has numpy >= 2 (the 24.10 stub
mishandles numpy 2 arrays).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

from inflight.tool_errors import ServerError, StopRequested

LOGGER = logging.getLogger(__name__)

HTTP_REPLY_BUFFER_BYTES = 8 << 20
"""``net.core.wmem_default`` the launcher asks for while Triton starts (see ``ensure_http_reply_buffer``)."""
WMEM_DEFAULT = Path("/proc/sys/net/core/wmem_default")


def _reply_buffer_from_env() -> int:
    value = os.environ.get("INFLIGHT_HTTP_REPLY_BUFFER")
    return int(value) if value else HTTP_REPLY_BUFFER_BYTES


_HOW_TO_GET = (
    "install the server with `pip install 'inflight[server]'` (the nvidia-pytriton 0.7.0 wheel carries "
    "Triton 2.51), run inside an NGC Triton container (nvcr.io/nvidia/tritonserver:24.10-py3 or later) "
    "where `tritonserver` is on PATH, or pass --tritonserver PATH / set INFLIGHT_TRITONSERVER"
)


@dataclass(frozen=True, kw_only=True)
class TritonDist:
    """A Triton server installation.

    Attributes:
        binary: The ``tritonserver`` executable.
        backends_dir: Its own backend directory (holds ``python/``).
        lib_dirs: Extra shared-library folders the binaries need on LD_LIBRARY_PATH.
        stub: The Python-backend stub to copy for this interpreter, or None when the
            installation's ``python/`` already holds the right one (NGC containers).
        source: ``pytriton`` (the wheel) or ``path`` (an installed server).
    """

    binary: Path
    backends_dir: Path
    lib_dirs: tuple[Path, ...]
    stub: Path | None
    source: Literal["pytriton", "path"]


def find_tritonserver(explicit: str | os.PathLike[str] | None = None) -> TritonDist:
    """Locate a Triton server: ``explicit``, ``$INFLIGHT_TRITONSERVER``, ``$TRITONSERVER``, PATH, then the wheel.

    Raises:
        ServerError: when none is found, saying how to get one.
    """
    candidate = explicit or os.environ.get("INFLIGHT_TRITONSERVER") or os.environ.get("TRITONSERVER")
    if candidate:
        binary = Path(candidate).resolve()
        if not binary.is_file():
            raise ServerError(f"tritonserver not found at {binary}; {_HOW_TO_GET}")
        return _dist_for(binary)
    on_path = shutil.which("tritonserver")
    if on_path:
        return _dist_for(Path(on_path).resolve())
    try:
        import pytriton
    except ImportError:
        raise ServerError(
            f"no tritonserver found: not on PATH and nvidia-pytriton is not installed; {_HOW_TO_GET}"
        ) from None
    root = Path(pytriton.__file__).parent
    binary = root / "tritonserver" / "bin" / "tritonserver"
    if not binary.is_file():
        raise ServerError(f"the nvidia-pytriton install at {root} has no tritonserver binary; {_HOW_TO_GET}")
    return _dist_for(binary)


def _dist_for(binary: Path) -> TritonDist:
    server_root = binary.parent.parent
    backends = server_root / "backends"
    stubs = server_root / "python_backend_stubs"
    # the wheel's bundled libraries (found through rpath in place; needed on LD_LIBRARY_PATH once copied)
    wheel_libs = server_root.parent.parent / "nvidia_pytriton.libs"
    lib_dirs = (wheel_libs,) if wheel_libs.is_dir() else ()
    if stubs.is_dir():  # the nvidia-pytriton wheel layout
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = stubs / version / "triton_python_backend_stub"
        if not stub.is_file():
            available = sorted(p.name for p in stubs.iterdir() if p.is_dir())
            raise ServerError(
                f"the Triton wheel at {server_root} has no Python-backend stub for Python {version} "
                f"(it has {available}); run inflight with one of those Python versions"
            )
        return TritonDist(binary=binary, backends_dir=backends, lib_dirs=lib_dirs, stub=stub, source="pytriton")
    stub_path = backends / "python" / "triton_python_backend_stub"
    built_for = stub_python_version(stub_path) if stub_path.is_file() else None
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if built_for is not None and built_for != running:
        raise ServerError(
            f"the Python-backend stub {stub_path} is built for Python {built_for} but inflight runs under Python "
            f"{running}; run inflight with Python {built_for}, or point INFLIGHT_TRITONSERVER/TRITONSERVER at a server "
            "whose stub matches (the nvidia-pytriton wheel carries stubs for 3.8-3.13)"
        )
    if not (backends / "python").is_dir():
        raise ServerError(
            f"{binary} has no Python backend at {backends / 'python'}; inflight is a Python-based backend and needs it"
        )
    return TritonDist(binary=binary, backends_dir=backends, lib_dirs=lib_dirs, stub=None, source="path")


def stub_python_version(stub: Path) -> str | None:
    """The Python version a Python-backend stub links (``"3.12"``), read from its ``libpythonX.Y`` name."""
    import re

    m = re.search(rb"libpython(3\.\d+)\.so", stub.read_bytes())
    return m.group(1).decode() if m else None


def backend_source_dir() -> Path:
    """The folder holding our backend's ``model.py`` (``backends/inflight`` of the checkout).

    Raises:
        ServerError: when it cannot be found.
    """
    env = os.environ.get("INFLIGHT_BACKEND_DIR")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [here.parents[3] / "backends" / "inflight", here.parents[1] / "_backend"]
    for c in candidates:
        if (c / "model.py").is_file():
            return c
    raise ServerError(
        f"backends/inflight/model.py not found (looked in {[str(c) for c in candidates]}); set INFLIGHT_BACKEND_DIR "
        "to the folder that holds it"
    )


#: Python-based backends deployed beside ``inflight``: ``null`` (Triton's Python backend answering zeros,
#: none of our code) and ``plain`` (the model served the usual Python-backend way, eager fp16).
SIBLING_BACKENDS = ("null", "plain", "tokenizer")


def sibling_backend_dirs() -> dict[str, Path]:
    """The Python-based backends shipped beside ours: ``null`` (the control model) and ``plain`` (the baseline).

    Returns:
        Backend name -> the folder that holds its ``model.py``, for those the checkout has.
    """
    root = backend_source_dir().parent
    return {name: root / name for name in SIBLING_BACKENDS if (root / name / "model.py").is_file()}


def prepare_backend_dir(dist: TritonDist, workdir: Path) -> Path:
    """Create ``<workdir>/backends`` with ``python/`` (and the stub), ``inflight/``, ``null/`` and ``plain/``.

    ``null/`` and ``plain/`` (:data:`SIBLING_BACKENDS`) are copied when the checkout has them.

    Returns:
        The folder to pass as ``--backend-directory``.
    """
    dest = workdir / "backends"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if dist.stub is not None:
        shutil.copytree(dist.backends_dir / "python", dest / "python", ignore=shutil.ignore_patterns("__pycache__"))
        target = dest / "python" / "triton_python_backend_stub"
        shutil.copy2(dist.stub, target)
        target.chmod(0o755)
    else:
        for entry in dist.backends_dir.iterdir():
            if entry.name not in ("inflight", *SIBLING_BACKENDS):
                (dest / entry.name).symlink_to(entry)
    shutil.copytree(backend_source_dir(), dest / "inflight", ignore=shutil.ignore_patterns("__pycache__"))
    for name, source in sibling_backend_dirs().items():
        shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def stub_environment(dist: TritonDist, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver so the stub runs this interpreter's installation."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    libdirs = [sysconfig.get_config_var("LIBDIR") or "", *(str(p) for p in dist.lib_dirs)]
    old = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = os.pathsep.join([d for d in libdirs if d] + ([old] if old else []))
    env.pop("PYTHONHOME", None)
    return env


def check_stub_numpy(env: Mapping[str, str]) -> str:
    """Return the numpy version the stub will import; refuse numpy >= 2.

    Raises:
        ServerError: when numpy is missing or >= 2 in the stub's environment.
    """
    python = shutil.which("python3", path=env.get("PATH")) or sys.executable
    r = subprocess.run(
        [python, "-c", "import sys, numpy; print(numpy.__version__); print(sys.prefix)"],
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise ServerError(f"numpy is not importable by {python} (the stub's interpreter): {r.stderr.strip()[-400:]}")
    version, prefix = r.stdout.split()[:2]
    if int(version.split(".")[0]) >= 2:
        raise ServerError(
            f"numpy {version} is installed in {prefix}, the environment the Python-backend stub uses; the Triton "
            f"24.10 stub corrupts numpy 2 outputs ('output tensor shape does not match size'). Run "
            f"`{python} -m pip install 'numpy<2'` first"
        )
    return version


def port_free(port: int, host: str = "0.0.0.0") -> bool:
    """True when ``port`` can be bound on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """An ephemeral port that is free now."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ephemeral ports that are free now.

    The sockets are held open together while the kernel picks, so no two of the ports are the same
    (picking one at a time can hand out one port twice, and tritonserver then refuses HTTP and gRPC
    on one port).
    """
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


@dataclass(kw_only=True)
class ServerConfig:
    """How to run tritonserver.

    Attributes:
        model_repository: The model repository to serve.
        workdir: Where the backend directory and the log go.
        http_port: HTTP/REST port.
        grpc_port: gRPC port.
        metrics_port: Prometheus metrics port.
        models: Models to load at start (explicit model control); empty: load none, None: load all.
        log_verbose: Triton ``--log-verbose`` level.
        tritonserver: Server binary; None searches (see ``find_tritonserver``).
        backend_config: Extra ``--backend-config`` entries, as ``backend,key=value``.
        extra_args: More tritonserver arguments.
        startup_timeout_s: How long to wait for readiness.
        env: Extra environment variables for the server.
        http_reply_buffer_bytes: Make ``net.core.wmem_default`` at least this large while the
            server starts (restored once it is ready); None or 0 leaves it alone. Default:
            ``INFLIGHT_HTTP_REPLY_BUFFER`` (bytes) when set, else 8 MiB. Triton 2.51's
            HTTP frontend hands each finished reply to its HTTP thread through a socket pair of the
            default send-buffer size and silently drops a reply that does not fit (see
            ``ensure_http_reply_buffer``).
        cpus: Cores the server and its stubs may run on (empty: the launcher's own affinity); the
            stubs inherit it from tritonserver.
        die_with_launcher: Ask Linux to send the server SIGTERM when the thread that started it
            dies (``PR_SET_PDEATHSIG``), so a launcher killed with SIGKILL does not leave it running
            and holding its ports. Only for a server started from a thread that outlives it (the
            main thread of ``inflight serve``): the signal follows the starting *thread*.
    """

    model_repository: Path
    workdir: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    models: Sequence[str] | None = None
    log_verbose: int = 0
    tritonserver: str | None = None
    backend_config: Sequence[str] = ()
    extra_args: Sequence[str] = ()
    startup_timeout_s: float = 300.0
    env: Mapping[str, str] = field(default_factory=dict)
    http_reply_buffer_bytes: int | None = field(default_factory=_reply_buffer_from_env)
    cpus: Sequence[int] = ()
    die_with_launcher: bool = False

    @classmethod
    def from_env(cls, model_repository: Path, workdir: Path, **overrides: object) -> ServerConfig:
        """Defaults, then ``INFLIGHT_HTTP_PORT``/``_GRPC_PORT``/``_METRICS_PORT``, then ``overrides``."""
        kw: dict[str, object] = {}
        for key in ("http_port", "grpc_port", "metrics_port"):
            value = os.environ.get(f"INFLIGHT_{key.upper()}")
            if value:
                kw[key] = int(value)
        kw.update(overrides)
        return cls(model_repository=model_repository, workdir=workdir, **kw)  # type: ignore[arg-type]

    @classmethod
    def on_free_ports(cls, model_repository: Path, workdir: Path, **overrides: object) -> ServerConfig:
        """Free HTTP, gRPC and metrics ports, explicit model control with nothing loaded, then ``overrides``."""
        http, grpc, metrics = free_ports(3)
        kw: dict[str, object] = {
            "http_port": http,
            "grpc_port": grpc,
            "metrics_port": metrics,
            "models": [],
        }
        kw.update(overrides)
        return cls(model_repository=model_repository, workdir=workdir, **kw)  # type: ignore[arg-type]


PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal a process gets when the thread that forked it dies (``<sys/prctl.h>``)."""


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


WMEM_LOCK = Path(tempfile.gettempdir()) / "inflight-wmem_default.lock"
"""Serializes the raise/start/restore of ``net.core.wmem_default`` between launchers on one host."""


@contextlib.contextmanager
def http_reply_buffer(
    min_bytes: int, path: Path = WMEM_DEFAULT, lock_path: Path = WMEM_LOCK, lock_timeout_s: float = 600.0
) -> Iterator[None]:
    """Hold ``net.core.wmem_default`` at ``min_bytes`` or more while the block starts a server, then restore it.

    The value is host-wide (per network namespace) and read when a socket is created, so two
    launchers starting servers side by side (one lane per GPU) must not interleave: one could
    restore the old value before the other server created its sockets. A lock file serializes them;
    a launcher that finds the lock taken waits (logged) until the other server is ready.
    """
    lock = None
    with contextlib.suppress(OSError):
        lock = open(lock_path, "a+")  # noqa: SIM115 - closed in the finally below
    try:
        deadline = time.monotonic() + lock_timeout_s
        waiting = False
        while lock is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waiting:
                    LOGGER.info(
                        "another launcher is starting a tritonserver on this host (%s); waiting for it", lock_path
                    )
                    waiting = True
                elif time.monotonic() > deadline:
                    raise ServerError(
                        f"waited {lock_timeout_s:.0f} s for another launcher's server start ({lock_path}); "
                        "is a launcher hung? remove the lock file's owner or set INFLIGHT_HTTP_REPLY_BUFFER=0"
                    ) from None
                time.sleep(0.2)
        restore = ensure_http_reply_buffer(min_bytes, path)
        try:
            yield
        finally:
            if restore is not None:
                with contextlib.suppress(OSError):
                    path.write_text(str(restore))
    finally:
        if lock is not None:
            lock.close()  # releases the flock


def ensure_http_reply_buffer(min_bytes: int, path: Path = WMEM_DEFAULT) -> int | None:
    """Raise the default socket send buffer to ``min_bytes`` if it is smaller; return the old value to restore.

    Triton 2.51's HTTP frontend (``InferResponseComplete`` in ``http_server.cc``) hands every
    finished reply to the connection's HTTP thread with libevhtp's ``evthr_defer``, which writes a
    small command into a non-blocking socket pair and silently drops it when the pair's send buffer
    is full; the dropped request never gets a response and keeps its model from ever unloading.
    The pair's buffer is ``net.core.wmem_default`` at server start (212992 bytes: a few hundred
    replies per thread), so a burst of completions larger than that loses requests.
    ``tests/integration/test_http_reply_burst.py`` shows both sides on a real server.

    Returns:
        The previous value when it was raised (restore it once the server is up); None when it was
        already large enough, cannot be read (not Linux) or cannot be written (a warning says how
        to fix it by hand).
    """
    try:
        current = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if current >= min_bytes:
        return None
    try:
        path.write_text(str(min_bytes))
    except OSError as e:
        LOGGER.warning(
            "net.core.wmem_default is %d bytes and could not be raised (%s): Triton's HTTP frontend drops "
            "finished replies that do not fit in a socket buffer of that size, so under bursts of completions "
            "over HTTP some requests never get a response and their model never unloads. Run `sysctl -w "
            "net.core.wmem_default=%d` as root before starting the server, or use gRPC.",
            current,
            e.strerror or e,
            min_bytes,
        )
        return None
    LOGGER.info(
        "raised net.core.wmem_default from %d to %d bytes while tritonserver starts (restored once it is ready): "
        "Triton's HTTP frontend drops finished replies that overflow a socket buffer of the old size",
        current,
        min_bytes,
    )
    return current


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

        Args:
            stop_requested: Polled while waiting for readiness; when it returns True the server is
                stopped and ``ServerError`` raised (e.g. Ctrl+C during a long model load).

        Raises:
            ServerError: on a taken port, numpy >= 2, no server binary, or a server that exits or
                does not become ready (the message quotes the end of the server log); the server is
                stopped then.
            StopRequested: when ``stop_requested()`` turned True; the server still runs, for the
                caller to ``stop()``.
        """
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
        buffer = http_reply_buffer(c.http_reply_buffer_bytes) if c.http_reply_buffer_bytes else contextlib.nullcontext()
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
            if self.ready():
                for m in self.config.models or ():
                    if not self.model_ready(m):
                        raise ServerError(f"model {m!r} failed to load:\n{self.log_tail()}")
                return
            time.sleep(0.25)
        raise ServerError(f"tritonserver not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

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
