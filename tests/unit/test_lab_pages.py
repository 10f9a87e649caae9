"""The lab's page list: every section renders from the committed results, and summary.json keeps its keys."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

from inflight.lab import entries, results_report
from inflight.lab.sections import Section

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "src" / "inflight" / "lab"

#: The keys of results/summary.json that README, RESULTS and the issues read: the live sections' blocks, the
#: frozen ones of the archive and the published plan's top-level figures (kept as they are).
SUMMARY_KEYS = {
    "cpu_per_request",
    "detail",
    "device",
    "gpu_bound",
    "models",
    "modes",
    "open_loop",
    "pipelined_fraction_of_engine_bound",
    "pipelined_gpu_temporal_activity",
    "pipelined_over_sync_items_per_s",
    "pipelined_p99_ms",
    "sync_p99_ms",
    "two_gpu",
    "four_gpu",
}

#: Sections on a page whose results are not committed yet, each tested on its own fixture instead; their block
#: joins summary.json with their first sitting.
AWAITING_RESULTS: dict[str, str] = {}


def test_every_section_of_the_page_list_renders_from_the_committed_results() -> None:
    for page, sections in results_report.PAGES.items():
        assert sections, page
        for s in sections:
            lines = s.lines(ROOT)
            if s.title in AWAITING_RESULTS:
                assert not lines, f"{s.title!r} has results now: take it off AWAITING_RESULTS"
                continue
            assert lines and lines[0].startswith("## "), (page, s.title)
            assert s.title in lines[0], f"{s.title!r} is not the heading of its section: {lines[0]!r}"
    titles = [s.title for sections in results_report.PAGES.values() for s in sections]
    assert len(titles) == len(set(titles)), "a section is on two pages"
    pages = results_report.render_pages(ROOT)
    assert list(pages) == list(results_report.PAGES)
    # the A/B files were parsed once (entries.read_ab) and every section above read the same documents: had one
    # of them changed a document it was given, the pages would differ from the committed ones or from a fresh parse
    assert all((ROOT / rel).read_text() == text for rel, text in pages.items()), "the pages are stale or a doc changed"
    entries._parsed.cache_clear()
    assert results_report.render_pages(ROOT) == pages


def test_every_block_a_section_owns_is_recomputed_and_summary_json_keeps_its_keys(tmp_path: Path) -> None:
    committed = json.loads((ROOT / "results" / "summary.json").read_text())
    assert set(committed) == SUMMARY_KEYS
    owners = [s for sections in results_report.PAGES.values() for s in sections if s.summary_key]
    assert {s.summary_key for s in owners} == {s.summary_key for s in results_report.SUMMARIES}
    shutil.copytree(ROOT / "results", tmp_path / "results")
    written = results_report.write_summaries(tmp_path)
    again = json.loads((tmp_path / "results" / "summary.json").read_text())
    owned = {s.summary_key for s in results_report.SUMMARIES} - set(AWAITING_RESULTS.values())
    assert set(again) == SUMMARY_KEYS and set(written) == owned
    assert again == committed, "results/summary.json is stale: run `inflight results-report`"


def test_a_section_without_a_block_refuses_to_write_one(tmp_path: Path) -> None:
    s = Section(title="T", collect=lambda root: None, render=lambda data: [])
    assert s.lines(tmp_path) == []
    try:
        s.write_summary(tmp_path)
    except ValueError as e:
        assert "owns no block" in str(e)
    else:
        raise AssertionError("a section without summary_key wrote a block")


def test_the_lab_imports_no_private_name_of_the_runtime() -> None:
    found = []
    for path in LAB.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("inflight.runtime"):
                found += [f"{path.relative_to(LAB)}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert not found, found
