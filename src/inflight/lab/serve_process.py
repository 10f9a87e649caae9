"""The server a fault hits: ``inflight serve`` as a child process, its stubs' memory, Triton's metrics and log.

:class:`ServeProcess` starts and stops ``inflight serve`` (the faults driver and the integration tests run it);
:class:`RssSampler` samples the stubs' resident memory (VmRSS) while the load runs; :func:`samples` reads a
metric family of Triton's metrics endpoint per instance.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

import inflight
from inflight.server.config import free_ports
from inflight.tool_errors import ServerError

SRC = Path(inflight.__file__).resolve().parents[1]


class ServeProcess:
    """One ``inflight serve`` child process, its output collected by threads (stdout lines with arrival times).

    Args:
        repository: The model repository.
        workdir: ``inflight serve``'s workdir (backends and the server log); its path marks this run's processes.
        model: The ``-m`` argument (``NAME`` or ``NAME@key=value,...``).
        *extra: More ``inflight serve`` arguments.
    """

    def __init__(self, repository: Path, workdir: Path, model: str, *extra: str) -> None:
        self.workdir = workdir
        http, grpc, metrics = free_ports(3)
        self.ports = (http, grpc, metrics)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
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

    def _read(self, stream: IO[str], stdout: bool) -> None:
        for line in stream:
            (self.out.append((time.monotonic(), line)) if stdout else self.err.append(line))

    @property
    def http(self) -> str:
        """``host:port`` of the HTTP endpoint."""
        return f"127.0.0.1:{self.ports[0]}"

    @property
    def metrics(self) -> str:
        """The metrics endpoint's URL."""
        return f"http://127.0.0.1:{self.ports[2]}/metrics"

    def printed(self, text: str) -> float | None:
        """When a stdout line containing ``text`` arrived, or None."""
        return next((t for t, line in self.out if text in line), None)

    def wait_serving(self, timeout_s: float = 300.0) -> float:
        """Wait for the ``serving`` line; return when it came.

        Raises:
            ServerError: when the process exited or printed no such line within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            t = self.printed("serving ")
            if t is not None:
                return t
            time.sleep(0.1)
        raise ServerError(f"serve printed no 'serving' line (rc {self.proc.poll()}):\n{self.text()[-4000:]}")

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit status, or None when still running after ``timeout_s``."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def text(self) -> str:
        """Everything printed so far (stdout, then stderr)."""
        for t in self._threads:
            t.join(5) if self.proc.poll() is not None else None
        return "".join(line for _, line in self.out) + "".join(self.err)

    def left(self) -> list[str]:
        """Processes of this run still alive: tritonserver and its stubs name the workdir in their command line."""
        return [f"{pid}: {' '.join(args)[:160]}" for pid, args in self._mine()]

    def _mine(self) -> list[tuple[int, list[str]]]:
        mark = str(self.workdir)
        return [(pid, args) for pid, args in _processes() if pid != self.proc.pid and any(mark in a for a in args)]

    def tritonserver_pid(self) -> int | None:
        """The pid of this run's tritonserver, or None."""
        return next((pid for pid, args in self._mine() if args and args[0].endswith("/tritonserver")), None)

    def stubs(self, model: str) -> dict[str, int]:
        """The live ``triton_python_backend_stub`` processes of ``model``'s instances: pid by instance name."""
        server = self.tritonserver_pid()
        out = {}
        for pid, args in self._mine():
            # stub argv: path, model.py, shm region, sizes, parent pid, backend dir, ..., instance name, ...
            if args and args[0].endswith("triton_python_backend_stub") and str(server) in args and _ppid(pid) == server:
                name = next((a for a in args[1:] if re.fullmatch(re.escape(model) + r"_\d+_\d+", a)), None)
                if name:
                    out[name] = pid
        return out

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM to ``inflight serve``; its exit status (None: still running after ``timeout_s``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout_s)

    def kill_all(self) -> None:
        """Clean-up on failure: the serve process and whatever of its run is left."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid, _ in self._mine():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _processes() -> Iterator[tuple[int, list[str]]]:
    """Live (not zombie) processes with their argv."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            raw = cmdline.read_bytes()
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if raw and state != "Z":
            yield int(cmdline.parent.name), [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")]


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def rss_mib(pid: int) -> float | None:
    """VmRSS of ``pid`` in MiB (from /proc/<pid>/status), or None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        return None
    return None


class RssSampler:
    """Samples the VmRSS of a model's stubs every ``every_s`` in a thread while in its ``with`` block."""

    def __init__(self, serve: ServeProcess, model: str, every_s: float = 2.0) -> None:
        self.serve, self.model, self.every_s = serve, model, every_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            stubs = self.serve.stubs(self.model)
            rss = {name: rss_mib(pid) for name, pid in sorted(stubs.items())}
            self.samples.append({"t_s": round(time.monotonic() - self._t0, 2), "rss_mib": rss})
            self._stop.wait(self.every_s)

    def __enter__(self) -> RssSampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def series(self) -> dict[str, list[float]]:
        """RSS (MiB) per stub over the samples it was alive in."""
        out: dict[str, list[float]] = {}
        for s in self.samples:
            for name, v in s["rss_mib"].items():
                if v is not None:
                    out.setdefault(name, []).append(v)
        return out


#: Stub memory counts as flat when the median of the last third of the samples exceeds the first third's by
#: no more than this (MiB), for every stub.
RSS_FLAT_MIB = 20.0


def rss_flat(series: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Whether each stub's RSS stayed flat: the last third's median at most :data:`RSS_FLAT_MIB` above the first's."""
    per: dict[str, dict[str, float | None]] = {}
    for name, values in series.items():
        if len(values) < 3:
            per[name] = {"start_mib": None, "end_mib": None, "growth_mib": None}
            continue
        third = len(values) // 3
        first, last = statistics.median(values[:third]), statistics.median(values[-third:])
        per[name] = {"start_mib": first, "end_mib": last, "growth_mib": last - first}
    growths = [p["growth_mib"] for p in per.values()]
    flat = bool(growths) and all(g is not None and g <= RSS_FLAT_MIB for g in growths)
    return {"criterion_mib": RSS_FLAT_MIB, "stubs": per, "flat": flat}


def scrape(metrics_url: str) -> str:
    """The metrics endpoint's text."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        return str(r.read().decode())


_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+(\S+)$")


def samples(text: str, name: str, model: str) -> dict[str, float]:
    """``name``'s samples of ``model`` by their label set (``instance=...,pid=...``), from metrics text."""
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("model") != model:
            continue
        key = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("model", "version"))
        out[key] = float(m.group(3))
    return out


def model_ready(http: str, model: str) -> bool | None:
    """Whether Triton says ``model`` is ready (None when the server did not answer)."""
    try:
        with urllib.request.urlopen(f"http://{http}/v2/models/{model}/ready", timeout=10) as r:
            return bool(r.status == 200)
    except urllib.error.HTTPError:
        return False
    except OSError:
        return None


def log_lines(path: Path, since: int, pattern: str = r"^[EW]\d{4}|stub|Stub|unhealthy|restart") -> list[str]:
    """Lines of the server log after byte ``since`` that match ``pattern`` (warnings, errors, stub news)."""
    try:
        with path.open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    lines = [line[:300] for line in text.splitlines() if re.search(pattern, line)]
    return lines[:40]
