"""Triton's HTTP reply buffer: hold ``net.core.wmem_default`` large enough while a server starts."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from inflight.tool_errors import ServerError, StopRequested

LOGGER = logging.getLogger(__name__)

HTTP_REPLY_BUFFER_BYTES = 8 << 20
"""``net.core.wmem_default`` the launcher asks for while Triton starts (see ``ensure_http_reply_buffer``)."""

WMEM_DEFAULT = Path("/proc/sys/net/core/wmem_default")

WMEM_LOCK = Path(tempfile.gettempdir()) / "inflight-wmem_default.lock"
"""Serializes the raise/start/restore of ``net.core.wmem_default`` between launchers on one host."""


@contextlib.contextmanager
def http_reply_buffer(
    min_bytes: int,
    path: Path = WMEM_DEFAULT,
    lock_path: Path = WMEM_LOCK,
    lock_timeout_s: float = 600.0,
    stop_requested: Callable[[], bool] | None = None,
) -> Iterator[None]:
    """Hold ``net.core.wmem_default`` at ``min_bytes`` or more while the block starts a server, then restore it.

    The value is host-wide (per network namespace) and read when a socket is created, so two
    launchers starting servers side by side (one lane per GPU) must not interleave: one could
    restore the old value before the other server created its sockets. A lock file serializes them;
    a launcher that finds the lock taken waits (logged) until the other server is ready, or until
    ``stop_requested()`` returns True (Ctrl+C meanwhile).

    Raises:
        StopRequested: when ``stop_requested()`` turned True while waiting for the lock (no server was started).
        ServerError: when the lock stayed taken for ``lock_timeout_s``.
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
                if stop_requested is not None and stop_requested():
                    raise StopRequested(
                        "stop requested while waiting for another launcher's server start; no tritonserver was started"
                    ) from None
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
