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
