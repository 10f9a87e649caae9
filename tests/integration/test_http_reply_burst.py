"""Triton 2.51's HTTP frontend drops replies that overflow its per-thread socket pair; the launcher prevents it.

600 single-item requests on 600 HTTP connections land in one batch of the null control model (a
plain Python model, none of our code), so their replies finish in one burst, all through the one
HTTP thread the server gets here. With the kernel's
default socket send buffer (212992 bytes) the frontend's ``evthr_defer`` drops the replies that do
not fit: those requests never get a response and the model never unloads, which is the defect
first seen on the GPU host under the published load. With ``net.core.wmem_default`` raised while
the server starts (``ServerConfig.http_reply_buffer_bytes``, the default) every request is answered
and the model unloads. Needs root (to set the sysctl), as on the project's hosts; skips otherwise.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from inflight.server.config import ServerConfig
from inflight.server.control import load_variant, variant_config, wait_unloaded
from inflight.server.launcher import TritonServer
from inflight.server.reply_buffer import WMEM_DEFAULT, WMEM_LOCK

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=80)]

BURST = 600
KERNEL_DEFAULT = 212992


@contextlib.contextmanager
def launchers_held() -> Iterator[None]:
    """Hold the lock every launcher takes to raise, start and restore (other tests' servers wait to start)."""
    with open(WMEM_LOCK, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def wmem_default(value: int) -> Iterator[None]:
    """Set the sysctl to ``value`` for the block, and back, each while no launcher is between raise and restore.

    The tests run beside others (scripts/test.sh: pytest-xdist), whose servers raise the value under the lock
    while they start: writing it outside the lock could shrink another server's buffer as it is made.
    """
    try:
        with launchers_held():
            old = WMEM_DEFAULT.read_text().strip()
            WMEM_DEFAULT.write_text(str(value))
    except OSError as e:
        pytest.skip(f"cannot set net.core.wmem_default here ({e.strerror}): needs root on Linux")
    try:
        yield
    finally:
        with launchers_held():
            WMEM_DEFAULT.write_text(old)


def _burst(repository: Path, workdir: Path, reply_buffer: int | None) -> tuple[int, int, bool, str]:
    """(answered, unanswered, unloaded, server log) for one burst of BURST requests."""
    # one HTTP thread: every reply of the burst goes through the same socket pair, so whether it overflows
    # does not depend on how many cores drain the pairs (16 HTTP threads on a 16-core host kept up with 600)
    # a server whose replies were lost never unloads that model: its stop waits Triton's exit timeout (30 s by
    # default), so the test sets 5 s
    cfg = ServerConfig.on_free_ports(
        repository,
        workdir,
        http_reply_buffer_bytes=reply_buffer,
        extra_args=("--http-thread-count=1", "--exit-timeout-secs=5"),
    )
    ids = np.ones((1, 8), np.int64)

    def inputs() -> list[Any]:
        out = []
        for name in ("input_ids", "attention_mask"):
            t = httpclient.InferInput(name, [1, 8], "INT64")
            t.set_data_from_numpy(ids, binary_data=True)
            out.append(t)
        return out

    with TritonServer(cfg) as s:
        # a long queue delay gathers the whole burst into one batch; 100 ms stands in for the device
        vc = variant_config(repository, "bert_tiny_null", {"kind": "cpu", "delay_us": "8000000", "sleep_us": "100000"})
        load_variant(s.http_url, vc)
        c = httpclient.InferenceServerClient(s.http_url, concurrency=BURST, network_timeout=20, connection_timeout=20)
        futures = [c.async_infer(vc.model_name, inputs()) for _ in range(BURST)]
        answered = 0
        for f in futures:
            with contextlib.suppress(Exception):
                f.get_result()
                answered += 1
        c.close()
        with httpclient.InferenceServerClient(s.http_url) as admin:
            admin.unload_model(vc.model_name)
        try:
            wait_unloaded(s.http_url, vc.model_name, 10)
            unloaded = True
        except Exception:
            unloaded = False
        log = s.log_path.read_text(errors="replace")
    return answered, BURST - answered, unloaded, log


def test_the_default_socket_buffer_loses_replies_and_the_unload(repository: Path, tmp_path: Path) -> None:
    """The defect itself, without our code and without the launcher's fix (characterizes Triton 2.51)."""
    # no launcher may raise the value while this server makes its sockets: they wait for the lock
    with wmem_default(KERNEL_DEFAULT), launchers_held():
        answered, lost, unloaded, log = _burst(repository, tmp_path, reply_buffer=None)
    assert lost > 0, f"all {BURST} replies arrived: the frontend no longer drops replies (a fixed Triton?)"
    assert not unloaded and "bert_tiny_null (bert_tiny_null_0_0) finalized" not in log
    assert answered > 0


def test_the_launcher_raises_the_buffer_and_every_request_is_answered(repository: Path, tmp_path: Path) -> None:
    with wmem_default(KERNEL_DEFAULT):
        answered, lost, unloaded, log = _burst(repository, tmp_path, reply_buffer=8 << 20)
        with launchers_held():  # not while another test's launcher holds it raised
            restored = WMEM_DEFAULT.read_text().strip()
        assert restored == str(KERNEL_DEFAULT), "the launcher did not restore the sysctl"
    assert (answered, lost) == (BURST, 0)
    assert unloaded and "bert_tiny_null (bert_tiny_null_0_0) finalized (drained)" in log
