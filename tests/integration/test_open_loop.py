"""The open-loop sweep end to end on the CPU host: a real tritonserver, real Locust (OpenLoopHttpUser).

Two rates, 4 s windows, against the null control model and a sync variant (4 items of 16 tokens per
request, so that the 2-core host keeps up at these rates), then a tiny capacity search. The runner
starts its own server on free ports; the JSON, the Markdown report and the latency-vs-rate plot must
come out with the figures the issue asks for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _ab(repository: Path, out: Path, *args: str) -> dict:  # type: ignore[type-arg]
    cmd = [
        sys.executable,
        "-m",
        "inflight.loadtest.cli",
        "ab",
        *args,
        "--window",
        "4",
        "--warmup",
        "1",
        "--items",
        "4",
        "--seq-len",
        "16",
        "--processes",
        "1",
        "--repository",
        str(repository),
        "--out",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, f"inflight ab failed ({r.returncode}):\n{r.stdout}\n{r.stderr[-4000:]}"
    (path,) = out.glob("ab-*.json")
    doc = json.loads(path.read_text())
    doc["_stdout"] = r.stdout
    doc["_path"] = str(path)
    return doc


def test_rate_sweep_against_the_null_model_and_a_sync_variant(repository: Path, tmp_path: Path) -> None:
    doc = _ab(
        repository, tmp_path / "sweep", "bert_tiny_null", "bert_tiny_sync", "--rate", "20,40", "--check-every", "1"
    )
    path = Path(doc["_path"])
    assert doc["valid"], doc["problems"]
    load = doc["load"]
    assert load["closed_loop"] is False and load["user_class"] == "OpenLoopHttpUser"
    assert load["open_loop"]["rates"] == [20.0, 40.0] and load["open_loop"]["slo_p99_ms"] == 50.0
    assert load["arrival"] == "poisson" and load["users"] == 1
    # the CPU host has 2 cores: nothing is pinned, and the JSON says why
    assert load["cpu_sets"]["isolated"] is False and "fewer than 8" in load["cpu_sets"]["reason"]
    assert [r["rate"] for r in doc["runs"]] == [20.0, 40.0, 20.0, 40.0]
    for run in doc["runs"]:
        gen = run["generator"]
        # every request that came due was sent, and every one sent was answered in or just after the window
        assert gen["sources"] == 1 and gen["scheduled"] > 0.5 * run["rate"] * 4
        assert gen["completed"] <= gen["scheduled"] + gen["unanswered"] + 5
        assert run["drain_s"] is not None and run["drain_s"] < 60
        assert run["stub_memory"]["stubs"] == 1 and run["stub_memory"]["rss_bytes"] > 10 << 20
        assert run["locust"]["failures"] == 0
    for s in doc["summary"]:
        rows = s["sweep"]
        assert [r["offered_rps"] for r in rows] == [20.0, 40.0]
        for r in rows:
            assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"]
            assert r["failures"] == 0 and 0.5 < r["answered_fraction"] <= 1.05
            assert r["achieved_rps"] > 0.5 * r["offered_rps"]
        assert "capacity_rps" in s and "comparable" in s
    # the null model answers zeros at once: at 20 and 40 req/s it meets the 50 ms SLO with room to spare
    null = doc["summary"][0]
    assert null["sweep"][0]["p99_ms"] < 50
    md = path.with_suffix(".md").read_text()
    assert "## Open loop: capacity at p99 <= 50 ms" in md and "### Latency against offered rate" in md
    png = path.parent / f"{path.stem}-open-loop.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "capacity at p99 <= 50 ms" in doc["_stdout"] and " offered " in doc["_stdout"]


def test_capacity_search_by_bisection(repository: Path, tmp_path: Path) -> None:
    doc = _ab(
        repository,
        tmp_path / "search",
        "bert_tiny_sync",
        "--search",
        "10,3000",
        "--search-steps",
        "1",
        "--slo",
        "50",
    )
    assert doc["valid"], doc["problems"]
    (s,) = doc["summary"]
    rates = [r["rate"] for r in doc["runs"]]
    # the high end first (the model on 2 CPU cores cannot answer 3000 req/s within 50 ms), then the low end,
    # then one midpoint (which it cannot answer either)
    assert rates[:2] == [3000.0, 10.0] and len(rates) == 3 and rates[2] == pytest.approx(1505.0)
    search = doc["runs"][-1]["capacity_search"]
    assert search["points"][0]["offered_rps"] == 3000.0 and search["bounded"] is True
    assert s["capacity_rps"] == 10.0 and s["capacity_upper_rps"] == 1505.0 and s["capacity_bounded"] is True
    assert search["capacity_rps"] == 10.0 and search["upper_rps"] == 1505.0
    # the high end missed the SLO and says why
    high = next(r for r in doc["runs"] if r["rate"] == 3000.0)
    assert high["slo_misses"]
