"""A Locust plugin for the master/worker test: the worker's first preparation of its requests takes 9 s.

As ``--check``'s reference outputs do on a busy host (34 s seen on the 2-core host). The master's ``-t 8s`` run
must still start only once the worker is prepared (``locustfile._not_ready_while``); before that, the master
started the run when the worker connected and the run passed with no request sent. Busy, not sleeping: the
reference computation blocks the worker's gevent loop the same way.
"""

from __future__ import annotations

import sys
import time
from typing import Any

SLOW_S = 9.0

_locustfile = sys.modules["locustfile"]  # loaded first: it is named first after -f
_prepare = _locustfile.STATE.prepare
_calls = []


def _slow_first_prepare(options: Any) -> bool:
    if not _calls:
        t0 = time.monotonic()
        while time.monotonic() - t0 < SLOW_S:
            pass
    _calls.append(1)
    return bool(_prepare(options))


_locustfile.STATE.prepare = _slow_first_prepare
