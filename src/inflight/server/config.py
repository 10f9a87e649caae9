"""How to run tritonserver: ``ServerConfig``, free ports, and where the server and its backends come from.

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
import os
import random
import shutil
import socket
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from inflight.server.reply_buffer import HTTP_REPLY_BUFFER_BYTES
from inflight.tool_errors import ServerError


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


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds a socket listening on TCP ``port`` (from ``/proc``; None where it cannot say).

    A server that answers on a port is not always the one just started there: another process can bind the
    port first, and the new server then exits while the other answers.
    """
    inodes: set[str] = set()
    try:
        for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
            with contextlib.suppress(FileNotFoundError):
                for row in table.read_text().splitlines()[1:]:
                    fields = row.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                        inodes.add(f"socket:[{inode}]")
        fds = os.listdir(f"/proc/{pid}/fd")
    except (OSError, ValueError, IndexError):
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
    return False


def free_port() -> int:
    """An ephemeral port that is free now."""
    return free_ports(1)[0]


#: Free ports are looked for from here up to the kernel's ephemeral range (``ip_local_port_range``), which
#: hands out the source ports of outgoing connections: a port picked inside it and freed can be taken by
#: a client's connection before the server binds it (a CI run's gRPC port was: "Address already in use").
PORTS_FROM = 20_000


def _ephemeral_low() -> int | None:
    """The first port of the kernel's ephemeral range (None where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that are free now, below the kernel's ephemeral range where it leaves room.

    The sockets are held open together while they are picked, so no two of the ports are the same
    (picking one at a time can hand out one port twice, and tritonserver then refuses HTTP and gRPC
    on one port). Random ports from :data:`PORTS_FROM` up to the ephemeral range are tried first
    (200 at most); the kernel picks the rest.
    """
    low = _ephemeral_low()
    below = range(PORTS_FROM, low) if low is not None and low - PORTS_FROM >= 1000 else range(0)
    rng = random.SystemRandom()
    with contextlib.ExitStack() as stack:
        socks: list[socket.socket] = []
        for _ in range(200 if below else 0):
            if len(socks) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", rng.choice(below)))
            except OSError:
                s.close()
                continue
            socks.append(stack.enter_context(s))
        while len(socks) < n:
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            socks.append(s)
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
        ports_picked: The ports were picked free (:meth:`on_free_ports`): a start that finds one taken by the
            time the server binds it starts again on new ones (``TritonServer.start``).
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
    ports_picked: bool = False

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
            "ports_picked": True,
        }
        kw.update(overrides)
        return cls(model_repository=model_repository, workdir=workdir, **kw)  # type: ignore[arg-type]
