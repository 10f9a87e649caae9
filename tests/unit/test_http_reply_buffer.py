"""``ensure_http_reply_buffer``: raise wmem_default only when smaller, return what to restore, else warn."""

from __future__ import annotations

import fcntl
import logging
import threading
import time
from pathlib import Path

import pytest

from inflight.server.config import ServerConfig
from inflight.server.reply_buffer import HTTP_REPLY_BUFFER_BYTES, ensure_http_reply_buffer, http_reply_buffer
from inflight.tool_errors import ServerError, StopRequested


def test_raises_a_small_default_and_returns_the_old_value(tmp_path: Path) -> None:
    f = tmp_path / "wmem_default"
    f.write_text("212992\n")
    assert ensure_http_reply_buffer(8 << 20, f) == 212992
    assert f.read_text() == str(8 << 20)


def test_leaves_a_large_enough_default_alone(tmp_path: Path) -> None:
    f = tmp_path / "wmem_default"
    f.write_text("16777216\n")
    assert ensure_http_reply_buffer(8 << 20, f) is None
    assert f.read_text() == "16777216\n"


def test_no_sysctl_file_means_nothing_to_do(tmp_path: Path) -> None:
    assert ensure_http_reply_buffer(8 << 20, tmp_path / "missing") is None


def test_warns_with_the_fix_when_it_cannot_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "wmem_default"
    f.write_text("212992\n")

    def refuse(self: Path, *args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_text", refuse)
    with caplog.at_level(logging.WARNING, logger="inflight.server.reply_buffer"):
        assert ensure_http_reply_buffer(8 << 20, f) is None
    assert "sysctl -w net.core.wmem_default=8388608" in caplog.text and "gRPC" in caplog.text


def test_the_size_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert ServerConfig(model_repository=tmp_path, workdir=tmp_path).http_reply_buffer_bytes == HTTP_REPLY_BUFFER_BYTES
    monkeypatch.setenv("INFLIGHT_HTTP_REPLY_BUFFER", "0")
    assert not ServerConfig(model_repository=tmp_path, workdir=tmp_path).http_reply_buffer_bytes


def test_side_by_side_launchers_each_start_with_the_raised_value(tmp_path: Path) -> None:
    # Two launchers on one host (one lane per GPU): the second must not start its server while the
    # first restores the old value, or its sockets get the small buffer. The lock makes it wait.
    f, lock = tmp_path / "wmem_default", tmp_path / "wmem.lock"
    f.write_text("212992\n")
    seen: list[str] = []

    def second() -> None:
        with http_reply_buffer(8 << 20, f, lock):
            seen.append(f.read_text())  # what the second server's sockets would get

    with http_reply_buffer(8 << 20, f, lock):
        assert f.read_text() == str(8 << 20)
        t = threading.Thread(target=second)
        t.start()
        t.join(0.5)
        assert t.is_alive() and not seen  # waiting for the first server to be ready
    t.join(10)
    assert seen == [str(8 << 20)]
    assert f.read_text() == "212992"  # both restored what they found


def test_a_held_lock_times_out_with_a_fix(tmp_path: Path) -> None:
    f, lock = tmp_path / "wmem_default", tmp_path / "wmem.lock"
    f.write_text("212992\n")
    with lock.open("a+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with (
            pytest.raises(ServerError, match="INFLIGHT_HTTP_REPLY_BUFFER=0"),
            http_reply_buffer(8 << 20, f, lock, lock_timeout_s=0.5),
        ):
            pass
    assert f.read_text() == "212992\n"  # never touched without the lock


def test_a_stop_requested_while_waiting_for_the_lock_ends_the_wait_at_once(tmp_path: Path) -> None:
    # a Ctrl+C of `inflight serve` while another launcher holds the lock: serve must stop within seconds, not wait
    # for the other server (a CI run's serve waited past its 15 s for another xdist worker's start)
    f, lock = tmp_path / "wmem_default", tmp_path / "wmem.lock"
    f.write_text("212992\n")
    polls: list[float] = []

    def stop_requested() -> bool:
        polls.append(time.monotonic())
        return len(polls) >= 3  # the stop comes while the launcher waits

    with lock.open("a+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        t0 = time.monotonic()
        with (
            pytest.raises(StopRequested, match="no tritonserver was started"),
            http_reply_buffer(8 << 20, f, lock, lock_timeout_s=30.0, stop_requested=stop_requested),
        ):
            pass
        assert time.monotonic() - t0 < 5.0
    assert f.read_text() == "212992\n"  # never touched without the lock
