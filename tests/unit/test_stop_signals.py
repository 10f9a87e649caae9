"""Stopping ``inflight serve``: the signal counter under signals at random moments, and the escalation.

The wait loop runs in a child process (a deadlock there fails the test by its timeout instead of
hanging pytest); it waits like ``inflight serve`` (``wait_for_stop`` polling a real process) while
another thread sends SIGINT/SIGTERM at random moments, one per round, then a burst of signals
0-0.5 ms apart against a loop that waits with no timeout. The handler ``inflight serve`` had before
(``Event.set`` on the Event its main loop waited on) deadlocked in that burst in 6 of 6 runs here
(its handler blocked on the Event's lock, nested once per further signal until RecursionError).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from inflight.server.config import ServerConfig
from inflight.server.launcher import TritonServer, group_members
from inflight.server.supervise import StopSignals

ROUNDS = 200

HARNESS = textwrap.dedent(
    """
    import json, os, random, signal, subprocess, sys, threading, time
    from inflight.server.supervise import StopSignals, wait_for_stop

    rounds, seed = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    main = threading.main_thread().ident
    # a real process to poll, as serve polls tritonserver
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    began = threading.Event()  # main thread -> sender: a round began (the handler never touches it)
    sent = [0.0]
    BURST = 2000

    def sender() -> None:
        for _ in range(rounds):
            began.wait()
            began.clear()
            time.sleep(rng.choice((0.0, rng.uniform(0, 0.002), rng.uniform(0, 0.03))))
            sent[0] = time.monotonic()
            sig = rng.choice((signal.SIGINT, signal.SIGTERM))
            if rng.random() < 0.5:
                os.kill(os.getpid(), sig)  # to the process, as Ctrl+C does
            else:
                signal.pthread_kill(main, sig)  # to the main thread, wherever it is
        began.wait()
        for _ in range(BURST):
            time.sleep(rng.uniform(0, 0.0005))
            os.kill(os.getpid(), signal.SIGINT)

    worst, outcomes = 0.0, []
    try:
        with StopSignals() as stops:
            burst = threading.Thread(target=sender, daemon=True)
            burst.start()
            for _ in range(rounds):
                since = stops.count
                began.set()
                how = wait_for_stop(stops, lambda: child.poll() is None, poll_s=rng.uniform(0.001, 0.05), since=since)
                while stops.count == since:  # "exited" cannot happen here; keep waiting for this round's signal
                    stops.wait(0.05)
                worst = max(worst, time.monotonic() - sent[0])
                outcomes.append(how)
            counted = stops.count
            began.set()  # the burst: signals 0-0.5 ms apart while the loop waits with no timeout
            while burst.is_alive():
                stops.wait(0.0)
            stops.wait(0.1)
        print(json.dumps({"rounds": len(outcomes), "signals": counted, "by_signal": outcomes.count("signal"),
                          "worst_s": worst, "burst_counted": stops.count - counted}))
    finally:
        child.kill()
        child.wait()
    """
)


def test_the_wait_loop_stops_on_each_of_200_signals_at_random_moments() -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"), *sys.path]))
    try:
        r = subprocess.run(
            [sys.executable, "-c", HARNESS, str(ROUNDS), str(seed)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the wait loop hung under signals (seed {seed}): a handler deadlock? output: {e.stdout!r}")
    assert r.returncode == 0, f"seed {seed}: {r.stderr[-2000:]}"
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["rounds"] == ROUNDS and got["signals"] == ROUNDS, (seed, got)
    assert got["by_signal"] == ROUNDS, (seed, got)
    assert got["worst_s"] < 1.0, f"seed {seed}: a signal took {got['worst_s']:.3f} s to end the wait"
    assert got["burst_counted"] >= 1, (seed, got)  # signals sent closer than the handler runs coalesce


def test_wait_returns_at_once_for_a_signal_that_came_before_and_restores_the_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stops:
        t0 = time.monotonic()
        assert stops.wait(0.05) == 0 and time.monotonic() - t0 >= 0.05
        os.kill(os.getpid(), signal.SIGTERM)
        t0 = time.monotonic()
        assert stops.wait(5.0) == 1 and time.monotonic() - t0 < 1.0
        assert stops.last == signal.SIGTERM
        t0 = time.monotonic()
        assert stops.wait(0.05) == 1 and time.monotonic() - t0 >= 0.05, "the same signal does not end two waits"
    assert signal.getsignal(signal.SIGTERM) == before
    stops.restore()  # safe twice
    with pytest.raises(RuntimeError, match=r"before install\(\); use `with StopSignals\(\) as stops:`"):
        stops.wait(0.01)


# A process group like tritonserver's: a leader and a child of it (a stub), both ignoring SIGTERM.
STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "print('up', flush=True); time.sleep(600)"])
    time.sleep(600) if sys.argv[1] == "stay" else None
    """
)


def _group(tmp_path: Path, leader: str) -> TritonServer:
    p = subprocess.Popen([sys.executable, "-c", STUBBORN, leader], start_new_session=True, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == b"up"
    server = TritonServer(ServerConfig(model_repository=tmp_path, workdir=tmp_path))
    server.process = p  # the launcher's stop() acts on whatever process group it started
    return server


def _requests_after(at_s: float, n: int):  # type: ignore[no-untyped-def]
    """``more_requests`` for ``stop``: no further request before ``at_s`` seconds, ``n`` after."""
    t0 = time.monotonic()

    def more(wait_s: float) -> int:
        time.sleep(wait_s)
        return n if time.monotonic() - t0 >= at_s else 0

    return more


@pytest.mark.parametrize("more", [1, 2])
def test_more_stop_requests_kill_a_group_that_ignores_sigterm(tmp_path: Path, more: int) -> None:
    server = _group(tmp_path, "stay")
    pgid = server.process.pid  # type: ignore[union-attr]
    try:
        t0 = time.monotonic()
        code = server.stop(timeout_s=60, more_requests=_requests_after(0.5, more), kill_grace_s=2)
        took = time.monotonic() - t0
    finally:
        os.killpg(pgid, signal.SIGKILL) if group_members(pgid) else None
    assert code == -signal.SIGKILL
    assert group_members(pgid) == [], "a process of the server's group outlived stop()"
    if more == 1:
        assert 2.0 <= took < 4.5, took  # SIGTERM again, SIGKILL 2 s later
        assert "a second stop request (Ctrl+C) came while it was stopping" in (server.exit_reason or "")
    else:
        assert took < 2.0, took
        assert "a third stop request (Ctrl+C)" in (server.exit_reason or "")
    assert (server.exit_reason or "").endswith("(signal 9)")


def test_stop_does_not_return_while_a_stub_outlives_the_server(tmp_path: Path) -> None:
    server = _group(tmp_path, "leave")  # the leader exits 0 on its own; its child stays, ignoring SIGTERM
    pgid = server.process.pid  # type: ignore[union-attr]
    try:
        server.process.wait(30)  # type: ignore[union-attr]
        assert group_members(pgid), "the child must still run for this test to mean anything"
        t0 = time.monotonic()
        code = server.stop(group_grace_s=1.0)
        took = time.monotonic() - t0
    finally:
        os.killpg(pgid, signal.SIGKILL) if group_members(pgid) else None
    assert code == 0 and server.exit_reason is None
    assert group_members(pgid) == [] and 1.0 <= took < 3.0, took
