"""Locust's ``--run-time`` counts from the start of the run, however long the process blocked before it."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from inflight.loadtest import workload as wl
from inflight.server.config import free_port

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"
SLOW_IMPORT = Path(__file__).resolve().parent / "fixtures" / "slow_import.py"
STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]"


def _stamp(log: str, message: str) -> datetime:
    m = re.search(STAMP + r"[^\n]*" + re.escape(message), log)
    assert m, (message, log[-3000:])
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")


def test_run_time_counts_from_the_start_after_a_slow_import(tmp_path: Path) -> None:
    w = wl.Workload(model="bert_tiny_sync", items=1, seq_len=16, pool=2)
    pool = wl.save_pool(wl.build_pool(w), tmp_path / "pool.npz")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            f"{LOCUSTFILE},{SLOW_IMPORT}",
            "--headless",
            "-u",
            "1",
            "-r",
            "1",
            "-t",
            "3s",
            # nothing listens there: each request fails at once, which is all this test needs
            "--host",
            f"http://127.0.0.1:{free_port()}",
            "--only-summary",
            "--model",
            "bert_tiny_sync",
            "--items",
            "1",
            "--seq-len",
            "16",
            "--pool",
            "2",
            "--pool-file",
            str(pool),
            "TritonHttpUser",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    log = r.stderr
    ran = (_stamp(log, "--run-time limit reached") - _stamp(log, "Run time limit set to 3 seconds")).total_seconds()
    assert ran >= 2.9, (ran, log[-3000:])
