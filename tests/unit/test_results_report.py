"""docs/RESULTS.md is generated from the committed result JSON, and stays in sync with it."""

from __future__ import annotations

import json
from pathlib import Path

from inflight.results_report import render

ROOT = Path(__file__).resolve().parents[2]


def test_results_page_is_generated_from_the_committed_json() -> None:
    page = render(ROOT)
    committed = (ROOT / "docs" / "RESULTS.md").read_text()
    assert committed == page, "docs/RESULTS.md is stale: run `inflight results-report`"


def test_every_ab_figure_comes_from_its_json() -> None:
    page = render(ROOT)
    for path in sorted((ROOT / "results").rglob("ab-*.json")):
        doc = json.loads(path.read_text())
        assert str(path.relative_to(ROOT)) in page
        for s in doc["summary"]:
            assert f"{s['rps']:,.0f}" in page
            assert f"{s['latency_ms']['p99']:,.1f}" in page


def test_engine_bench_rows_come_from_its_json() -> None:
    doc = json.loads((ROOT / "results" / "engine_bench.json").read_text())
    page = render(ROOT)
    for r in doc["rows"]:
        assert f"{r['engine_bound_items_s']:,.0f}" in page
        assert f"{100 * r['pipelined_fraction_of_bound']:.1f}%" in page


def test_experiment_plan_table_comes_from_the_committed_json() -> None:
    from inflight import experiments as ex

    page = render(ROOT)
    section = page.split("## The published experiment plan", 1)[1].split("\n## ", 1)[0]
    exp = ROOT / "results" / "experiments"
    bound = json.loads((exp / "engine_bound.json").read_text())
    flagged = 0
    for part in (*ex.SYNC_PARTS, *ex.PIPELINED_PARTS):
        doc = json.loads(ex.latest_ab(exp / part).read_text())  # type: ignore[union-attr]
        for s in doc["summary"]:
            row = next(line for line in section.splitlines() if f"| `{s['spec']}` |" in line)
            assert f"| {s['items_per_s']:,.0f} |" in row and f"| {s['latency_ms']['p99']:,.1f} |" in row
            fraction = s["items_per_s"] / ex.bound_at(bound, s["server"]["avg_batch_items"])
            assert f"| {100 * fraction:.1f}% |" in row
            stalled = any(r.get("unload_stalled") for r in doc["runs"] if r["variant"] == s["variant"])
            assert ("unload stalled" in row) == stalled and ("client-limited" in row) == bool(s.get("client_limited"))
            flagged += stalled
    assert (f"unload stalled ({flagged})" in section) == bool(flagged)
    # the profiled rows carry nsys' own activity figure
    nsys = json.loads((exp / "nsys" / "summary.json").read_text())
    for f in nsys["files"]:
        assert f"{100 * f['summary']['gpu_activity']:.1f}%" in section
