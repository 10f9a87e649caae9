"""Sync against pipelined on the CPU host, end to end (issue 30's CPU test): a short open-loop capacity search.

The server on core 0 and the load on core 1 (a core budget of one), one sitting under
``<root>/results/modes``: the sync variant, ``bert_tiny_inflight`` as ``build-models`` wrote it for
this host (the default) and the plain Python backend, each by a capacity search at a loose SLO, 1 s (this
host's p99 is tens of milliseconds at 10 req/s alone; beside three other test workers a stall of the host
took another search's p99 at 10 req/s past 1 s once, so a p99 SLO can only bracket here, not measure).
The run's JSON must say where server and load ran and give each variant a capacity the search bracketed.
(The lab's reading of such sittings into RESULTS' "Sync against pipelined" is frozen since the question closed:
docs/RESULTS-archive.md.)
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from tests.helpers import ab_command

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
    (path,) = out.glob("ab-*.json")
    doc = json.loads(path.read_text())
    assert doc["valid"], doc["problems"]
    assert doc["load"]["cpu_sets"]["server"] == str(cores[0]) and doc["load"]["cpu_sets"]["client"] == str(cores[1])
    assert doc["load"]["cpu_sets"]["isolated"] is True
    # the search: each variant's high end first, then its low end, then one midpoint (--search-steps 1)
    for name in ("bert_tiny_sync", "bert_tiny_inflight", "bert_tiny_plain"):
        rates = [r["rate"] for r in doc["runs"] if r["model_name"] == name]
        assert rates[:2] == [5000.0, 10.0] and len(rates) == 3 and rates[2] == pytest.approx(2505.0), (name, rates)
        high = next(r for r in doc["runs"] if r["model_name"] == name and r["rate"] == 5000.0)
        assert high["slo_misses"], "the high end missed the SLO and says why"
        search = [r for r in doc["runs"] if r["model_name"] == name][-1]["capacity_search"]
        assert search["points"][0]["offered_rps"] == 5000.0 and search["bounded"] is True
    caps = {s["model_name"]: s for s in doc["summary"]}
    assert set(caps) == {"bert_tiny_sync", "bert_tiny_inflight", "bert_tiny_plain"}
    for name, s in caps.items():
        # the search bracketed each: a rate met, a higher one missed
        assert s["capacity_bounded"] is True, (name, s["sweep"])
        assert s["capacity_rps"] is not None and 10 <= s["capacity_rps"] < s["capacity_upper_rps"] <= 5000, name
        # the capacity is the highest rate met and the upper bound the lowest missed, of the points searched
        assert (s["capacity_rps"], s["capacity_upper_rps"]) in ((10.0, 2505.0), (2505.0, 5000.0)), name
    # the default as built for this host: one instance a core of the host, in mode auto
    (default,) = [v for v in doc["variants"] if v["model_name"] == "bert_tiny_inflight"]
    assert default["config"]["instance_group"][0]["count"] == len(cores)
    assert default["config"]["parameters"]["mode"]["string_value"] == "auto"
