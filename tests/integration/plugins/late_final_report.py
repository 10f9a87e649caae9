"""A Locust plugin for the master/worker test: each worker sends its final statistics 1.5 s late.

Locust runs a worker's ``test_stop`` listeners inside ``stop()``, before it sends its last report; sleeping
there makes that report arrive later than the 0.5 s Locust's master waits for it at quit (as a busy host
does), so the test sees whether the master still counts it (``inflight.loadtest.locust_master.wait_for_final_reports``).
"""

from __future__ import annotations

from typing import Any

import gevent
from locust import events
from locust.env import Environment
from locust.runners import WorkerRunner

LATE_S = 1.5


@events.test_stop.add_listener
def _late_final_report(environment: Environment, **_kw: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        gevent.sleep(LATE_S)
