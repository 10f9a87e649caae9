"""``inflight serve`` always stops, never leaves a process behind, and its exit status tells.

Real servers on free ports: five Ctrl+C (SIGINT) at random moments from start-up to serving, each
stopped within 15 s with no process of that run left; a request Triton never answers (shape
``[0, 0]``, README Known limits) makes the exit unclean, and ``serve`` then exits 1 saying why; a
second Ctrl+C kills a server that is stuck stopping; a ``serve`` killed with SIGKILL takes its
tritonserver with it. stdout is read through a pipe with PYTHONUNBUFFERED unset, so each line must
come when printed.
"""

from __future__ import annotations

import json
import random
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.serve_process import Serve

from inflight.server.config import port_free

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=100)]

STOP_WITHIN_S = 15.0


@pytest.fixture
def serves() -> Iterator[list[Serve]]:
    started: list[Serve] = []
    yield started
    for s in started:
        s.kill_all()


def _infer_zero_batch(http: str) -> None:
    """A ``[0, 0]`` request, which Triton 2.51 never answers (the client gives up after 3 s)."""
    body = {
        "inputs": [
            {"name": n, "shape": [0, 0], "datatype": "INT64", "data": []} for n in ("input_ids", "attention_mask")
        ]
    }
    req = urllib.request.Request(
        f"http://{http}/v2/models/bert_tiny_null/infer", data=json.dumps(body).encode(), method="POST"
    )
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        urllib.request.urlopen(req, timeout=3).read()


def _log_tail(workdir: Path, chars: int = 3000) -> str:
    """The end of the tritonserver log ``inflight serve`` writes in ``workdir`` (a note when there is none)."""
    log = workdir / "tritonserver.log"
    return log.read_text(errors="replace")[-chars:] if log.is_file() else f"(no {log})"


def test_five_ctrl_c_at_random_moments_each_stop_within_15_s(
    repository: Path, tmp_path: Path, serves: list[Serve]
) -> None:
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    report = []
    for i in range(5):
        # from before the handlers are installed (Python's start-up) to well after the server is ready (~10 s)
        delay = rng.uniform(0.0, 16.0)
        s = Serve(repository, tmp_path / f"round{i}", "linear_head_sync")
        serves.append(s)
        time.sleep(delay)
        serving = s.printed("serving ") is not None
        s.proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        code = s.wait_exit(STOP_WITHIN_S)
        took = time.monotonic() - t0
        report.append(f"round {i}: SIGINT at {delay:.1f} s ({'serving' if serving else 'starting'}), {took:.1f} s")
        print(f"seed {seed}, {report[-1]}, serve exit code {code}")
        assert code is not None, (
            f"seed {seed}, {report[-1]}: serve still runs {STOP_WITHIN_S} s after SIGINT; its output:\n"
            f"{s.text()[-2000:]}\nits server log's end:\n{_log_tail(s.workdir)}"
        )
        assert s.left() == [], f"seed {seed}, {report[-1]}: processes left: {s.left()}"
        assert all(port_free(p) for p in s.ports), f"seed {seed}, {report[-1]}: a port is still taken"
        text = s.text()
        if serving:
            assert code == 0 and "tritonserver stopped (exit code 0)" in text, (seed, report[-1], text[-3000:])
        elif "tritonserver started: pid" in text:
            # stopped during start-up: Triton 2.51 dies of SIGTERM before it serves (unclean, said so), or stops
            assert "stop requested" in text and "Traceback" not in text, (seed, text[-3000:])
            assert code == 0 or (code == 1 and "had not started serving" in text), (seed, text[-3000:])
        elif "no tritonserver was started" in text:  # while another launcher's start held the lock: a clean stop
            assert code == 0 and "Traceback" not in text, (seed, text[-3000:])
        else:  # before the handlers were installed: Python's KeyboardInterrupt, no server was started
            assert code != 0, (seed, text[-3000:])
    print(f"seed {seed}: " + "; ".join(report))


def test_an_unclean_tritonserver_exit_makes_serve_exit_1_and_say_why(
    repository: Path, tmp_path: Path, serves: list[Serve]
) -> None:
    s = Serve(repository, tmp_path, "bert_tiny_null", "--exit-timeout", "3")
    serves.append(s)
    serving_at = s.wait_serving()
    assert s.proc.poll() is None, "the 'serving' line must come through the pipe while serve runs"
    _infer_zero_batch(s.http)
    s.proc.send_signal(signal.SIGINT)
    code = s.wait_exit(STOP_WITHIN_S + 3)
    text = s.text()
    assert code == 1, text[-3000:]
    assert s.printed("serving ") == serving_at
    assert "tritonserver stopped (exit code 1): not gracefully: Triton: failed to stop server" in text, text[-3000:]
    assert "error: tritonserver's exit was not clean (exit code 1)" in text and "batch dimension is 0" in text
    assert s.left() == []


def test_a_second_ctrl_c_kills_a_server_stuck_stopping(repository: Path, tmp_path: Path, serves: list[Serve]) -> None:
    s = Serve(repository, tmp_path, "bert_tiny_null")  # Triton's default exit timeout: 30 s
    serves.append(s)
    s.wait_serving()
    _infer_zero_batch(s.http)  # Triton will wait 30 s for this connection at shutdown
    s.proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert s.proc.poll() is None, "Triton stopped at once: the stuck connection did not hold it"
    s.proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    code = s.wait_exit(STOP_WITHIN_S)
    took = time.monotonic() - t0
    text = s.text()
    assert code == 1 and took < 8.0, (took, text[-3000:])
    assert "a second stop request (Ctrl+C) came while it was stopping" in text, text[-3000:]
    assert s.left() == []
    print(f"stopped {took:.1f} s after the second SIGINT")


def test_serve_killed_with_sigkill_takes_tritonserver_with_it(
    repository: Path, tmp_path: Path, serves: list[Serve]
) -> None:
    s = Serve(repository, tmp_path, "bert_tiny_null")
    serves.append(s)
    s.wait_serving()
    assert s.left(), "tritonserver must run for this test to mean anything"
    s.proc.kill()
    s.proc.wait()
    deadline = time.monotonic() + STOP_WITHIN_S
    while s.left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert s.left() == [], "tritonserver outlived serve killed with SIGKILL"
    assert all(port_free(p) for p in s.ports)


def test_ctrl_c_while_another_launcher_starts_its_server_stops_at_once(
    repository: Path, tmp_path: Path, serves: list[Serve], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Launchers on one host take turns starting servers (the HTTP reply buffer's lock); a Ctrl+C while waiting ends it.

    The lock is this test's own (``TMPDIR`` moves it), held as another launcher would hold it. A CI run's ``serve``
    went on waiting past its 15 s there, for another xdist worker's server start.
    """
    import fcntl

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with (tmp_path / "inflight-wmem_default.lock").open("a+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        s = Serve(repository, tmp_path / "serve", "linear_head_sync")
        serves.append(s)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("waiting for it" in line for line in s.err):
            assert s.proc.poll() is None, s.text()[-3000:]
            time.sleep(0.1)
        assert any("waiting for it" in line for line in s.err), f"serve never waited for the lock:\n{s.text()[-3000:]}"
        s.proc.send_signal(signal.SIGINT)
        code = s.wait_exit(5.0)
        assert code is not None, f"serve still waits 5 s after SIGINT:\n{s.text()[-3000:]}"
    text = s.text()
    assert code == 0 and "no tritonserver was started" in text and "Traceback" not in text, (code, text[-3000:])
    assert "serving " not in text, "a stop before serving must not print the serving line"
    assert s.left() == [] and all(port_free(p) for p in s.ports)
