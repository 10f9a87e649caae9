"""Sync against pipelined on the CPU host, end to end (issue 30's CPU test): a short open-loop capacity search.

The server on core 0 and the load on core 1 (a core budget of one), one sitting under
``<root>/results/modes``: the sync variant, ``bert_tiny_inflight`` as ``build-models`` wrote it for
this host (the default) and the plain Python backend, each by a capacity search at a loose SLO, 1 s (this
host's p99 is tens of milliseconds at 10 req/s alone; beside three other test workers a stall of the host
took another search's p99 at 10 req/s past 1 s once, so a p99 SLO can only bracket here, not measure).
``inflight.lab.modes_results`` must read the files
into ``summary.json``'s ``modes`` keys and the README's decision table, every capacity one of the
searches bracketed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from tests.helpers import ab_command

from inflight.lab import modes_results
from inflight.lab.sections import decision

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=120)]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores: one for the server, one for the load")
def test_capacity_search_of_sync_default_and_plain_writes_the_modes_keys(repository: Path, tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    out = tmp_path / "results" / "modes" / "cpu-1core" / "cap"
    cmd = ab_command(
        "bert_tiny_sync@instances=1",
        "bert_tiny_inflight",
        "bert_tiny_plain@instances=1",
        "--search",
        "10,5000",
        "--search-steps",
        "1",
        "--slo",
        "1000",
        "--generator",
        "asyncio",
        "--server-cpus",
        str(cores[0]),
        "--client-cpus",
        str(cores[1]),
        repository=repository,
        out=out,
        window=2,
    )
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, f"inflight ab failed ({r.returncode}):\n{r.stdout}\n{r.stderr[-4000:]}"
    block = modes_results.summary(tmp_path)
    assert block is not None, "no core budget with a bracketed sync and pipelined capacity"
    (row,) = block["capacity"]
    assert row["server_cpus"] == 1
    assert set(row) >= {"server_cpus", "best_sync_rps", "best_pipelined_rps", "default_rps", "plain_rps"}
    for key in ("best_sync_rps", "best_pipelined_rps", "default_rps", "plain_rps"):
        assert row[key] is not None and 10 <= row[key] < 5000, (key, row)
    assert row["default"] == "bert_tiny_inflight" and row["default_instances"] == len(cores)
    # the p99 ratio needs a rate at which both ran with the generator on schedule (a busy 2-core host may
    # flag every window generator-limited: then there is none, and the block says so with null)
    budget = next(iter(modes_results.collect(tmp_path)["budgets"].values()))
    on_schedule = [set(modes_results.p99_by_rate(e)) for e in budget if e.kind in ("sync", "pipelined")]
    if set.intersection(*on_schedule):
        assert block["p99_ratio_max"] is not None and block["p99_ratio_max"] > 0
    else:
        assert block["p99_ratio_max"] is None
    table = "\n".join(decision.decision_table(tmp_path))
    assert "bert_tiny" in table and "default as built" in table
