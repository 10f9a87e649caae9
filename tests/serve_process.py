"""``inflight serve`` as a real child process, for the tests that stop it or fault it under load.

The class lives in :mod:`inflight.lab.serve_process` (the faults driver runs it too); this name stays for the tests.
"""

from __future__ import annotations

from inflight.lab.serve_process import ServeProcess as Serve

__all__ = ["Serve"]
