"""The Locust master's quit: it waits for every worker's final statistics.

Imported by ``loadtest/locustfile.py`` after ``locust``, which monkey-patches the standard library with gevent first.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import gevent

if TYPE_CHECKING:
    from locust.runners import MasterRunner

LOGGER = logging.getLogger("inflight.locustfile")

#: Seconds the master waits, at quit, for each worker's final statistics (Locust itself waits 0.5 s).
FINAL_REPORT_WAIT_S = 10.0


def wait_for_final_reports(runner: MasterRunner, timeout_s: float = FINAL_REPORT_WAIT_S) -> None:
    """Make ``runner.quit()`` wait until every worker has sent its final statistics (at most ``timeout_s``).

    Locust's master sends its workers "quit" and keeps the reports that arrive within 0.5 s; a worker sends
    its last report (the requests since its previous one, up to 3 s of them) after stopping its users, so on a
    busy host that report came too late and the master's totals missed it (locustio/locust#1426): seen on the
    2-core CPU host as 923 requests counted where the workers' raw latencies held 1,005. A worker's "quit"
    message follows its final report on the same socket, and the master forgets the worker when it reads it;
    so the wrapped ``quit`` sends "quit" first and waits until no worker is left, then runs Locust's own.
    """
    from locust.rpc import Message

    locust_quit = runner.quit

    def quit_after_final_reports() -> None:
        if runner.clients:
            runner.stop(send_stop_to_client=False)
            for client in runner.clients.all:
                runner.server.send_to_client(Message("quit", None, client.id))
            deadline = time.monotonic() + timeout_s
            while runner.clients and time.monotonic() < deadline:
                gevent.sleep(0.05)
            if runner.clients:
                LOGGER.warning(
                    "%d worker(s) sent no final statistics within %.0f s; the totals miss their last report",
                    len(runner.clients),
                    timeout_s,
                )
        locust_quit()

    runner.quit = quit_after_final_reports  # type: ignore[method-assign]
