"""A debugger that overruns its time must not leave the stub it looked at stopped.

A stopped stub never exits, and Triton's unload waits on it with no limit: CI saw exactly that after
gdb ran past its 60 s under load (the stubs "did not exit after unload"). The debugger here is a
real process that does what a debugger cut off between attach and detach leaves behind: the target
stopped, and itself still running.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from inflight.lab.stalls import native_stacks, process_states, thread_states

STOPPING_DEBUGGER = """#!/bin/sh
# stops the process after -p, then hangs like a debugger that cannot finish
while [ $# -gt 0 ]; do [ "$1" = "-p" ] && pid=$2; shift; done
kill -STOP "$pid"
exec sleep 300
"""


def test_a_debugger_cut_off_leaves_the_process_running(tmp_path: Path) -> None:
    debugger = tmp_path / "stopping-debugger"
    debugger.write_text(STOPPING_DEBUGGER)
    debugger.chmod(0o755)
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        text = native_stacks(target.pid, str(debugger), timeout_s=1.0)
        assert "did not finish within 1 s" in text
        assert "sent the process SIGCONT" in text and "T" in text  # it was stopped, and says so
        deadline = time.monotonic() + 5.0
        while process_states(target.pid) & {"T", "t"} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_states(target.pid) & {"T", "t"}, f"left stopped: {thread_states(target.pid)}"
        target.terminate()  # a running process acts on SIGTERM; a stopped one would not
        assert target.wait(timeout=5.0) != 0
    finally:
        target.kill()
        target.wait()
