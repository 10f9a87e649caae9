"""What a Python-backend stub that does not go away is doing.

Triton unloads a Python-backend instance by sending its stub process a finalize message and then
``waitpid()``-ing on it with no time limit (python_backend ``StubLauncher::TerminateStub``): a stub
that never exits holds the unload, and the server's shutdown, forever. When that happens we want
evidence, not a guess. Three views of each stuck stub, cheapest first:

* **Python stacks**: the backend registers ``faulthandler`` on ``SIGUSR2`` in every stub
  (:func:`install_stack_dump`); the dump goes to the stub's stderr, which is the server's log.
* **threads**: name, state and kernel wait channel of every thread, from ``/proc``.
* **native stacks**: ``cuda-gdb -p PID -batch -ex "thread apply all bt"`` where a debugger is
  installed (GPU hosts carry cuda-gdb but no gdb); skipped with a note otherwise.

Linux only (``/proc``); on other systems :func:`stub_processes` finds nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from inflight.log import STACK_SIGNAL, install_stack_dump

LOGGER = logging.getLogger(__name__)

STUB_EXECUTABLE = "triton_python_backend_stub"


@dataclass(frozen=True)
class StubProcess:
    """One running Python-backend stub.

    Attributes:
        pid: Process id.
        model_path: The ``model.py`` the stub runs (``<repository>/<model>/<version>/model.py``).
        instance: Triton's instance name (e.g. ``bert_tiny_sync_0_0``), when the command line has it.
        parent_pid: The tritonserver that started it (from its command line), when given there.
    """

    pid: int
    model_path: str
    instance: str | None
    parent_pid: int | None = None

    @property
    def model(self) -> str:
        """The model's name: the directory two levels above ``model.py``."""
        return Path(self.model_path).parent.parent.name


def _argv(process: Path) -> list[str]:
    try:
        raw = (process / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def stub_processes(
    model: str | None = None, *, parent_pid: int | None = None, proc: Path = Path("/proc")
) -> list[StubProcess]:
    """The running stub processes (of ``model`` and of the server ``parent_pid`` only, when given), by pid.

    Several servers on one host (A/B lanes) run stubs of the same model: pass the server's pid to
    see only its own.

    The stub's command line is ``triton_python_backend_stub MODEL_PATH SHM_REGION SHM_SIZE
    SHM_GROWTH PARENT_PID PYTHON_LIB IPC_HANDLE INSTANCE_NAME ...`` (python_backend
    ``StubLauncher::Launch``).
    """
    found = []
    for entry in proc.glob("[0-9]*"):
        argv = _argv(entry)
        if not argv or not argv[0].endswith(STUB_EXECUTABLE) or len(argv) < 2:
            continue
        parent = int(argv[5]) if len(argv) > 5 and argv[5].isdigit() else None
        stub = StubProcess(int(entry.name), argv[1], argv[8] if len(argv) > 8 else None, parent)
        if (model is None or stub.model == model) and (parent_pid is None or stub.parent_pid == parent_pid):
            found.append(stub)
    return sorted(found, key=lambda s: s.pid)


def _tasks(pid: int) -> list[tuple[str, str, str, str]]:
    """(tid, name, state, kernel wait channel) of every thread of ``pid`` (``/proc/PID/task``)."""
    tasks = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("[0-9]*"), key=lambda p: int(p.name)):

        def read(name: str, task: Path = task) -> str:
            try:
                return (task / name).read_text(errors="replace").strip()
            except OSError:
                return "?"

        stat = read("stat")
        # field 3 of stat, after the parenthesised name (which may hold spaces)
        state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
        tasks.append((task.name, read("comm"), state, read("wchan") or "-"))
    return tasks


def thread_states(pid: int) -> list[str]:
    """One line per thread: tid, name, state and kernel wait channel (``/proc/PID/task``)."""
    return [f"{tid:>8}  {comm:<16} state {state}  wchan {wchan}" for tid, comm, state, wchan in _tasks(pid)]


def process_states(pid: int) -> set[str]:
    """The states of ``pid``'s threads (``S``, ``R``, ``T`` stopped, ``t`` stopped by a tracer...)."""
    return {state for _, _, state, _ in _tasks(pid)}


def find_debugger() -> str | None:
    """``cuda-gdb`` or ``gdb`` on PATH (or in ``/usr/local/cuda/bin``), ``INFLIGHT_DEBUGGER`` first."""
    for candidate in (os.environ.get("INFLIGHT_DEBUGGER"), "cuda-gdb", "gdb", "/usr/local/cuda/bin/cuda-gdb"):
        if candidate and (path := shutil.which(candidate)):
            return path
    return None


def native_stacks(pid: int, debugger: str, timeout_s: float = 60.0) -> str:
    """Every thread's native backtrace, by attaching ``debugger`` in batch mode (detaches after).

    A debugger that does not finish within ``timeout_s`` is asked to quit (SIGTERM: gdb detaches
    before it exits), killed 10 s later if it has not, and the process is then sent ``SIGCONT``: a
    debugger stopped between its attach and its detach leaves the attach's ``SIGSTOP`` behind, and a
    stub stopped by it never exits, so the unload it was called for would wait forever.
    """
    cmd = [debugger, "-q", "-nx", "-batch", "-p", str(pid), "-ex", "set pagination off", "-ex", "thread apply all bt"]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        return f"could not run {debugger}: {e}"
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.communicate(timeout=10.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        return f"{debugger} did not finish within {timeout_s:.0f} s{resume(pid)}"
    return f"$ {' '.join(cmd)}  (exit {proc.returncode})\n{out}{err}"


def resume(pid: int) -> str:
    """Send ``pid`` SIGCONT, which also drops a stop signal still pending; say what its threads were.

    Harmless to a running process (the stub does not handle SIGCONT).
    """
    states = sorted(process_states(pid))
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGCONT)
    return f"\n(sent the process SIGCONT; its threads' states before: {', '.join(states) or 'none read'})"


def dump_stuck_stubs(
    model: str,
    out_dir: Path,
    *,
    parent_pid: int | None = None,
    debugger: str | None = None,
    gdb_timeout_s: float = 60.0,
    max_native: int | None = None,
) -> list[Path]:
    """Write what each still-running stub of ``model`` is doing to ``out_dir/stuck-stub-<pid>.txt``.

    Sends each stub :data:`STACK_SIGNAL` first (its Python stacks land in the server log), then
    records its threads and, where a debugger is found, the native stacks of the first
    ``max_native`` stubs (attaching cuda-gdb takes about 10 s per process on the GPU host; default
    ``INFLIGHT_STALL_NATIVE_STACKS`` or 2). ``parent_pid`` limits it to one server's stubs.

    Returns:
        The files written (none when no stub of ``model`` is running).
    """
    stubs = stub_processes(model, parent_pid=parent_pid)
    if not stubs:
        return []
    if max_native is None:
        max_native = int(os.environ.get("INFLIGHT_STALL_NATIVE_STACKS", "2"))
    out_dir.mkdir(parents=True, exist_ok=True)
    for s in stubs:
        with contextlib.suppress(OSError):
            os.kill(s.pid, STACK_SIGNAL)
    time.sleep(1.0)  # let faulthandler write before the debugger stops the process
    debugger = debugger or find_debugger()
    written = []
    for i, s in enumerate(stubs):
        parts = [
            f"stub pid {s.pid}, instance {s.instance or '?'}, model {s.model} ({s.model_path}), "
            f"server pid {s.parent_pid or '?'}",
            f"Python stacks: sent signal {STACK_SIGNAL.name}; faulthandler writes them to the server log",
            "",
            "threads (tid, name, state, wait channel):",
            *thread_states(s.pid),
            "",
        ]
        if debugger is None:
            parts.append("native stacks: no cuda-gdb or gdb here (set INFLIGHT_DEBUGGER to a debugger to get them)")
        elif i >= max_native:
            parts.append(f"native stacks: taken for the first {max_native} stub(s) only")
        else:
            parts.append(native_stacks(s.pid, debugger, gdb_timeout_s))
        path = out_dir / f"stuck-stub-{s.pid}.txt"
        path.write_text("\n".join(parts) + "\n")
        written.append(path)
        LOGGER.warning("stub %s of %s (pid %d) has not exited; what it is doing: %s", s.instance, model, s.pid, path)
    return written


__all__ = [
    "STACK_SIGNAL",
    "StubProcess",
    "dump_stuck_stubs",
    "find_debugger",
    "install_stack_dump",
    "native_stacks",
    "process_states",
    "resume",
    "stub_processes",
    "thread_states",
]
