"""docs/RESULTS.md is generated from the committed result JSON and stays in sync with it; the archive stays frozen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inflight.lab import archive
from inflight.lab import results_report as rr
from inflight.lab.sections import ab_runs, glance

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    """The committed tree's pages, rendered once for the module (a render reads ~350 result files: 5-25 s)."""
    return rr.render_pages(ROOT)


@pytest.fixture(scope="module")
def page(pages: dict[str, str]) -> str:
    """Every page in one text, the main one first (what the results index searches)."""
    return "\n".join(pages.values())


@pytest.fixture(scope="module")
def every_page(page: str) -> str:
    """The generated pages and the frozen archive in one text."""
    return page + "\n" + (ROOT / archive.ARCHIVE_PAGE).read_text()


def test_results_pages_are_generated_from_the_committed_json(pages: dict[str, str]) -> None:
    assert list(pages) == [rr.MAIN_PAGE, rr.AB_RUNS_PAGE]
    for rel, text in pages.items():
        assert (ROOT / rel).read_text() == text, f"{rel} is stale: run `inflight results-report`"


def test_the_main_page_opens_with_the_headline_and_links_the_runs_page(pages: dict[str, str]) -> None:
    main, runs = pages[rr.MAIN_PAGE], pages[rr.AB_RUNS_PAGE]
    assert main.splitlines()[4] == "## At a glance"
    assert "](RESULTS-ab-runs.md)" in main and "](RESULTS.md)" in runs and "](RESULTS-archive.md)" in main
    for title in archive.manifest(ROOT)["sections"]:
        assert f'"{title}"' in main.split("## Closed questions", 1)[1], title
    # the runs' rows live on the runs page only
    assert runs.count("\n| [`results/") >= 10 and "\n| [`results/" not in main.split("## Through the server", 1)[1]


def test_write_puts_every_page_in_the_folder_asked_for(tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "repo"
    shutil.copytree(ROOT / "results", root / "results")
    (root / "docs").mkdir()
    for name in ("DESIGN.md", "RESULTS-archive.md", "RESULTS-archive.json"):
        shutil.copy(ROOT / "docs" / name, root / "docs" / name)
    out = tmp_path / "pages"
    main = rr.write(root, out)
    assert main == out / "RESULTS.md" and (out / "RESULTS-ab-runs.md").is_file()
    assert (root / "results" / "README.md").is_file()
    assert (out / "RESULTS.md").read_text() == (ROOT / rr.MAIN_PAGE).read_text()
    # a sitting added to a frozen folder stops the write, saying which file and how to mend it
    extra = root / "results" / "modes" / "20990101-new" / "ab-20990101-000000.json"
    extra.parent.mkdir(parents=True)
    extra.write_text("{}")
    with pytest.raises(ValueError, match=r"results/modes/20990101-new/ab-20990101-000000.json is new"):
        rr.write(root, out)


def test_every_ab_figure_comes_from_its_json(every_page: str) -> None:
    page = every_page
    for path in sorted((ROOT / "results").rglob("ab-*.json")):
        doc = json.loads(path.read_text())
        if not doc["load"].get("closed_loop", True):
            # an open-loop run: linked by its report (the JSON where no .md was kept); its capacity figures
            # are checked below
            assert str(path.relative_to(ROOT)) in page
            continue
        assert str(path.relative_to(ROOT)) in page
        for s in doc["summary"]:
            assert f"{s['rps']:,.0f}" in page
            assert f"{s['latency_ms']['p99']:,.1f}" in page


def test_the_archived_engine_bench_rows_come_from_its_json(every_page: str) -> None:
    page = every_page
    doc = json.loads((ROOT / "results" / "engine_bench.json").read_text())
    executors = [r for r in doc["rows"] if "sync_items_s" in r]
    assert executors
    for r in executors:
        assert f"{r['engine_bound_items_s']:,.0f}" in page
        assert f"{100 * r['pipelined_fraction_of_bound']:.1f}%" in page
    # the engines compared (the compiled-engine issue's keys), each row with its time, floor and error
    engines = [r for r in doc["rows"] if "sync_items_s" not in r]
    assert engines and doc["mixed_length_token_ratio"] > 0
    for r in engines:
        assert {"engine", "engine_us_per_batch", "floor_us_per_batch"} <= r.keys()
        assert (
            f"| {r['engine']} | {r['batch']} | {r['engine_us_per_batch']:,.1f} | {r['floor_us_per_batch']:,.1f} |"
            in page
        )
    assert f"| {doc['mixed_length_token_ratio']:.3f} | >= 0.8 |" in page


def test_every_closed_loop_run_is_one_row_with_its_unloads(pages: dict[str, str]) -> None:
    """The runs page lists each closed-loop run once, linking its JSON, with how many of its windows stalled."""
    page = pages[rr.AB_RUNS_PAGE]
    listed = [p for p, _ in ab_runs.closed_loop_runs(ROOT)]
    assert listed
    for rel, doc in ab_runs.closed_loop_runs(ROOT):
        (row,) = [line for line in page.splitlines() if line.startswith(f"| [`{rel}`](../{rel}) |")]
        assert row.endswith(f"| {ab_runs.unload_cell(doc)} |")
        timed = [r for r in doc["runs"] if r.get("unload_s") is not None]
        stalled = sum(bool(r.get("unload_stalled")) for r in timed)
        assert (f"**{stalled} of {len(timed)} not unloaded**" in row) == bool(stalled), rel
    # the open-loop runs and the stall diagnoses are tabulated by their own sections, not here
    assert not any(p.parts[1] in ("open-loop", "stalls", "per-gpu-servers") for p in listed)


def test_results_index_is_current_and_lists_every_entry_in_git(page: str) -> None:
    index = (ROOT / "results" / "README.md").read_text()
    assert index == rr.render_index(ROOT, page), "results/README.md is stale: run `inflight results-report`"
    entries = {p.relative_to(ROOT / "results").parts[0] for p in rr._tracked(ROOT, "results")} - {"README.md"}
    assert entries and all(f"[`{e}`]({e})" in index for e in entries)


def test_headline_lists_the_archived_targets_then_the_live_ones(page: str) -> None:
    """'At a glance' opens the page: the frozen questions' rows as they were frozen, then one per live target."""
    lines = glance.SECTION.lines(ROOT)
    assert page.index("## At a glance") < page.index("## A user's model")
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| area")]
    frozen = archive.manifest(ROOT)["glance_rows"]
    live = glance.gpu_bound_rows(json.loads((ROOT / "results" / "summary.json").read_text())["gpu_bound"])
    assert len(frozen) == 25 and len(live) == 9  # issue 53's eight targets, and text's capacity
    assert len(rows) == len(frozen) + len(live)
    for row, want in zip(rows[: len(frozen)], frozen, strict=True):
        assert row == "| " + " | ".join([*want[:-1], f"{want[-1]} (archive)"]) + " |"
    for row, want in zip(rows[len(frozen) :], live, strict=True):
        assert row.startswith("| GPU-bound (MiniLM) | " + " | ".join(want) + " |")
    met = sum("| met |" in r for r in rows)
    assert f"({met} of {len(rows)} met)" in lines[2]
