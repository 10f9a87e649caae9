"""``inflight serve`` as a real child process, for the tests that stop it or fault it under load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from inflight.server.launcher import free_port

ROOT = Path(__file__).resolve().parents[1]


class Serve:
    """One ``inflight serve`` process, its output collected by a thread (lines with arrival times)."""

    def __init__(self, repository: Path, workdir: Path, model: str, *extra: str) -> None:
        self.workdir = workdir
        self.ports = (free_port(), free_port(), free_port())
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "inflight.cli", "serve", "--repository", str(repository), "-m", model,
                "--http-port", str(self.ports[0]), "--grpc-port", str(self.ports[1]),
                "--metrics-port", str(self.ports[2]), "--workdir", str(workdir), *extra,
            ],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.out: list[tuple[float, str]] = []
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, True), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, False), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read(self, stream, stdout: bool) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            (self.out.append((time.monotonic(), line)) if stdout else self.err.append(line))

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.ports[0]}"

    def printed(self, text: str) -> float | None:
        """When a stdout line containing ``text`` arrived, or None."""
        return next((t for t, line in self.out if text in line), None)

    def wait_serving(self, timeout_s: float = 180.0) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            t = self.printed("serving ")
            if t is not None:
                return t
            time.sleep(0.1)
        pytest.fail(f"serve printed no 'serving' line (rc {self.proc.poll()}):\n{self.text()}")

    def wait_exit(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def text(self) -> str:
        for t in self._threads:
            t.join(5) if self.proc.poll() is not None else None
        return "".join(line for _, line in self.out) + "".join(self.err)

    def left(self) -> list[str]:
        """Processes of this run still alive: tritonserver and its stubs name the workdir in their command line."""
        mark = str(self.workdir).encode()
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                args = cmdline.read_bytes()
                state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if mark in args and state != "Z" and int(cmdline.parent.name) != self.proc.pid:
                shown = args.replace(b"\0", b" ")[:160].decode(errors="replace")
                found.append(f"{cmdline.parent.name}: {shown}")
        return found

    def kill_all(self) -> None:
        """Clean-up on failure: the serve process and whatever of its run is left."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for entry in self.left():
            os.kill(int(entry.split(":", 1)[0]), signal.SIGKILL)
