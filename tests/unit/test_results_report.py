"""docs/RESULTS.md is generated from the committed result JSON, and stays in sync with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inflight.lab import results_report as rr
from inflight.lab.sections import ab_runs, glance, many_instances, one_instance
from inflight.lab.sections.engine import engine_targets

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    """The committed tree's pages, rendered once for the module (a render reads ~350 result files: 5-25 s)."""
    return rr.render_pages(ROOT)


@pytest.fixture(scope="module")
def page(pages: dict[str, str]) -> str:
    """Every page in one text, the main one first (what the results index searches)."""
    return "\n".join(pages.values())


def _read(paths: list[Path], root: Path) -> list[tuple[Path, dict[str, object]]]:
    """A section's input from A/B files: each path from ``root`` and its document."""
    return [(p.relative_to(root), json.loads(p.read_text())) for p in paths]


def test_results_pages_are_generated_from_the_committed_json(pages: dict[str, str]) -> None:
    assert list(pages) == [rr.MAIN_PAGE, rr.AB_RUNS_PAGE]
    for rel, text in pages.items():
        assert (ROOT / rel).read_text() == text, f"{rel} is stale: run `inflight results-report`"


def test_the_main_page_opens_with_the_headline_and_links_the_runs_page(pages: dict[str, str]) -> None:
    main, runs = pages[rr.MAIN_PAGE], pages[rr.AB_RUNS_PAGE]
    assert main.splitlines()[4] == "## At a glance"
    assert "](RESULTS-ab-runs.md)" in main and "](RESULTS.md)" in runs
    # the runs' rows live on the runs page only
    assert runs.count("\n| [`results/") >= 10 and "\n| [`results/" not in main.split("## Through the server", 1)[1]


def test_write_puts_every_page_in_the_folder_asked_for(tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "repo"
    shutil.copytree(ROOT / "results", root / "results")
    (root / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "DESIGN.md", root / "docs" / "DESIGN.md")
    out = tmp_path / "pages"
    main = rr.write(root, out)
    assert main == out / "RESULTS.md" and (out / "RESULTS-ab-runs.md").is_file()
    assert (root / "results" / "README.md").is_file()


def test_every_ab_figure_comes_from_its_json(page: str) -> None:
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


def test_engine_bench_rows_come_from_its_json(page: str) -> None:
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


def _ab_doc(protocol: str, rps: dict[str, float], instances: int = 1, sleep_us: int = 0) -> dict[str, object]:
    """A minimal A/B document: one null, one sync and one pipelined variant."""
    variants, summary = [], []
    for label, kind in zip("ABC", ("null", "sync", "inflight"), strict=True):
        params = {"sleep_us": {"string_value": str(sleep_us)}} if kind == "null" else {}
        config = {"instance_group": [{"count": instances}], "parameters": params}
        variants.append({"label": label, "variant": kind, "config": config})
        summary.append({"variant": label, "spec": f"bert_tiny_{kind}", "rps": rps[kind], "runs": 1, "executor": None})
    return {"load": {"protocol": protocol}, "variants": variants, "summary": summary, "runs": []}


def test_ceiling_section_computes_the_ratios_from_the_json(tmp_path: Path) -> None:
    d = tmp_path / "results" / "per-instance-ceiling"
    d.mkdir(parents=True)
    (d / "ab-1.json").write_text(json.dumps(_ab_doc("http", {"null": 9000.0, "sync": 5000.0, "inflight": 5500.0})))
    (d / "ab-2.json").write_text(json.dumps(_ab_doc("grpc", {"null": 8000.0, "sync": 5000.0, "inflight": 6000.0})))
    # not a one-instance null run with sleep 0: left out
    (d / "ab-3.json").write_text(json.dumps(_ab_doc("http", {"null": 1.0, "sync": 1.0, "inflight": 1.0}, instances=8)))
    (d / "ab-4.json").write_text(json.dumps(_ab_doc("http", {"null": 1.0, "sync": 1.0, "inflight": 1.0}, sleep_us=5)))
    text = "\n".join(one_instance.render(_read(sorted(d.glob("ab-*.json")), tmp_path)))
    assert "| 1.80x | n/a | 1.10x |" in text and "| 1.60x | n/a | 1.20x |" in text  # no deferred null in these
    assert "ab-3.json" not in text and "ab-4.json" not in text
    assert "Measured: 1.10x to 1.20x; **missed**" in text
    assert "so no executor can reach 2x here" in text  # the null model stays under 2x in both


def test_ceiling_section_says_when_the_ceiling_allows_the_target(tmp_path: Path) -> None:
    p = tmp_path / "ab-1.json"
    p.write_text(json.dumps(_ab_doc("grpc", {"null": 12000.0, "sync": 5000.0, "inflight": 11000.0})))
    text = "\n".join(one_instance.render(_read([p], tmp_path)))
    assert "**met**" in text and "as cheap as the null model's" in text


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


def _variant(label: str, kind: str, instances: int, **params: int) -> dict[str, object]:
    config = {
        "instance_group": [{"count": instances}],
        "parameters": {k: {"string_value": str(v)} for k, v in params.items()},
    }
    return {"label": label, "variant": kind, "config": config}


def test_ceiling_section_shows_the_deferred_null_instance(tmp_path: Path) -> None:
    doc = _ab_doc("http", {"null": 9000.0, "sync": 5000.0, "inflight": 5500.0})
    doc["variants"].append(_variant("D", "null", 1, sleep_us=0, sender_threads=8))  # type: ignore[attr-defined]
    doc["summary"].append({"variant": "D", "spec": "bert_tiny_null@sender_threads=8", "rps": 7000.0, "runs": 1})  # type: ignore[attr-defined]
    p = tmp_path / "ab-1.json"
    p.write_text(json.dumps(doc))
    text = "\n".join(one_instance.render(_read([p], tmp_path)))
    # null 1.80x (returned), deferred 1.40x, pipelined 1.10x, each over the same sync instance
    assert "| 9,000 | 5,000 | 5,500 | 7,000 | 1.80x | 1.40x | 1.10x |" in text
    assert "The deferred null instance serves 1.40x one sync instance" in text


def test_pipelined_ceiling_section_compares_with_the_best_sync_of_each_file(tmp_path: Path) -> None:
    variants = [
        _variant("A", "sync", 8),
        _variant("B", "sync", 4),
        _variant("C", "null", 8, sleep_us=1900, sender_threads=8),
        _variant("D", "inflight", 6),
        _variant("E", "inflight", 4),
    ]
    rps = {"A": 20000.0, "B": 15000.0, "C": 20800.0, "D": 19000.0, "E": 18000.0}
    cpu = {"server_us_per_request": 351.4, "stub_cores": 2.84, "other_cores": 5.9, "host_busy": 0.773, "host_cores": 16}
    us = {"A": 300.0, "B": 290.0, "C": 351.4, "D": 450.0, "E": 440.0}
    summary = [
        {
            "variant": k,
            "spec": f"spec-{k}",
            "rps": v,
            "cpu": {**cpu, "server_us_per_request": us[k]},
            "client_limited": k == "A",
        }
        for k, v in rps.items()
    ]
    p = tmp_path / "ab-1.json"
    p.write_text(json.dumps({"variants": variants, "summary": summary, "load": {"protocol": "grpc"}}))
    (tmp_path / "ab-2.json").write_text(
        json.dumps({"variants": variants[2:], "summary": summary[2:]})
    )  # no sync: left out
    text = "\n".join(many_instances.render(_read([p, tmp_path / "ab-2.json"], tmp_path)))
    assert "ab-2.json" not in text
    assert (
        "| `spec-C` | null, deferred to 8 sender threads | 8 | 20,800 | 1.04x | 351 | 2.8 | 5.9 | 77.3% of 16 | "
        "shared | no |" in text
    )
    assert (
        "| grpc | `spec-A` | sync | 8 | 20,000 | 1.00x |" in text and "| `spec-B` | sync | 4 | 15,000 | 0.75x |" in text
    )
    assert "best pipelined / best sync): 0.95x; **missed**" in text
    assert "serves 1.04x the best sync" in text and "within a few percent of zero cost" in text
    assert "least first (the lowest of each kind in an A/B): sync < deferred null < pipelined in every A/B" in text


def test_pipelined_ceiling_section_says_when_no_executor_can_beat_the_sync(tmp_path: Path) -> None:
    variants = [_variant("A", "sync", 8), _variant("B", "null", 8, sleep_us=1900, sender_threads=8)]
    summary = [{"variant": "A", "spec": "s", "rps": 20000.0}, {"variant": "B", "spec": "n", "rps": 17600.0}]
    p = tmp_path / "ab-1.json"
    p.write_text(json.dumps({"variants": variants, "summary": summary}))
    text = "\n".join(many_instances.render(_read([p], tmp_path)))
    assert "serves 0.88x the best sync" in text and "no executor on this path can beat it here" in text
    assert "Target: the best pipelined" not in text  # no pipelined variant in the file: no verdict


def test_open_loop_section_comes_from_the_committed_json(page: str) -> None:
    from inflight.lab import open_loop_results as olr
    from inflight.lab import two_gpu_results

    block = olr.summary(ROOT, two_gpu=two_gpu_results.summary(ROOT))
    assert block is not None
    # results/summary.json holds what the files say (inflight results-report rewrote it from them)
    committed = json.loads((ROOT / "results" / "summary.json").read_text())
    assert committed["open_loop"] == json.loads(json.dumps(block))
    for key in ("best_sync", "best_pipelined", "two_gpu"):
        entry = block[key]
        assert f"| {entry['capacity_rps']:,.0f} |" in page and entry["file"] in page
        doc = json.loads((ROOT / entry["file"]).read_text())
        (s,) = [s for s in doc["summary"] if s["spec"] == entry["spec"]]
        assert s["capacity_rps"] == entry["capacity_rps"]
    assert f"{block['generator_verified_rps']:,.0f} req/s" in page
    for t in block["targets"]:
        assert f"| {t['figure']} |" in page
    ratio = block["pipelined_over_sync"]
    assert ratio == block["best_pipelined"]["capacity_rps"] / block["best_sync"]["capacity_rps"]
    assert f"| pipelined / best sync capacity | {ratio:.2f}x |" in page


def _open_loop_doc(caps: dict[str, tuple[str, dict[str, int], float]]) -> dict[str, object]:
    """An open-loop A/B document: label -> (kind, parameters, capacity)."""
    variants, summary = [], []
    for label, (kind, params, cap) in caps.items():
        v = _variant(label, kind, 8, **params)
        v["config"]["instance_group"][0]["gpus"] = [0]  # type: ignore[index]
        variants.append(v)
        summary.append({"variant": label, "spec": f"{label}-spec", "capacity_rps": cap, "comparable": True})
    return {
        "load": {"closed_loop": False, "items": 50, "open_loop": {"slo_p99_ms": 50.0}},
        "variants": variants,
        "summary": summary,
        "runs": [],
        "device": {"name": "GPU"},
    }


def test_open_loop_summary_takes_its_ratios_from_the_newest_sitting_only(tmp_path: Path) -> None:
    from inflight.lab import cost_results
    from inflight.lab import open_loop_results as olr
    from inflight.lab.entries import sittings

    def put(sitting: str, run: str, doc: dict[str, object]) -> None:
        d = tmp_path / "results" / "open-loop" / sitting / run
        d.mkdir(parents=True)
        (d / "ab-1.json").write_text(json.dumps(doc))

    put("20260101-0100-old", "a", _open_loop_doc({"A": ("sync", {}, 10_000.0), "B": ("inflight", {}, 40_000.0)}))
    put("20260102-0100-new", "a", _open_loop_doc({"A": ("sync", {}, 30_000.0)}))
    put(
        "20260102-0100-new",
        "b",
        _open_loop_doc({"B": ("inflight", {"mode": "auto"}, 24_000.0), "C": ("inflight", {}, 20_000.0)}),  # type: ignore[dict-item]
    )
    assert [p.name for p in sittings(tmp_path / "results")] == ["20260101-0100-old", "20260102-0100-new"]
    block = olr.summary(tmp_path)
    assert block is not None and block["sitting"].endswith("20260102-0100-new")
    # the old sitting's 40k pipelined figure is not compared with the new sitting's sync
    assert block["best_pipelined"]["capacity_rps"] == 24_000.0 and block["pipelined_over_sync"] == 0.8
    old = olr.summary(tmp_path, tmp_path / "results" / "open-loop" / "20260101-0100-old")
    assert old is not None and old["pipelined_over_sync"] == 4.0
    strategies = cost_results.open_loop_strategies(tmp_path)
    assert strategies is not None and strategies["ratio"] == 1.2
    assert strategies["new"]["spec"] == "B-spec" and strategies["deferred"]["spec"] == "C-spec"


def test_cost_block_is_what_its_files_say(page: str) -> None:
    from inflight.lab import cost_results

    committed = json.loads((ROOT / "results" / "summary.json").read_text())["cpu_per_request"]
    assert committed == json.loads(json.dumps(cost_results.summary(ROOT)))
    for t in committed["targets"]:
        assert f"| {t['figure']} | {t['value']:.3f} |" in page


def test_headline_lists_every_target_of_the_summary_and_the_engine_bench(page: str) -> None:
    """'At a glance' opens the page: one row per target of each block, each verdict as its section has it."""
    results = ROOT / "results"
    lines = glance.SECTION.lines(ROOT)
    assert page.index("## At a glance") < page.index("## A user's model")
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| area")]
    d = json.loads((results / "summary.json").read_text())
    eb = json.loads((results / "engine_bench.json").read_text())
    engine = [
        r
        for r in eb["rows"]
        if "sync_items_s" not in r and r.get("engine_us_per_batch") is not None  # the engines' rows, not the executors'
    ]
    want = (
        len(d["open_loop"]["targets"])
        + len(engine_targets(engine, eb.get("mixed_length_token_ratio")))
        + len(d["cpu_per_request"]["targets"])
        + len(glance.modes_rows(d.get("modes")))  # a row per core budget, two for the regime
        + len(glance.gpu_bound_rows(d.get("gpu_bound")))  # issue 53's eight targets, and text's capacity
    )
    assert len(glance.gpu_bound_rows(d.get("gpu_bound"))) == 9
    assert len(rows) == want
    # the regime: one pipelined instance, and one instance of the repository as built (auto)
    assert len(glance.modes_rows(d.get("modes"))) == len(d["modes"]["capacity"]) + 2
    for t in d["open_loop"]["targets"] + d["cpu_per_request"]["targets"]:
        verdict = "met" if t["met"] else "**missed**"
        if t.get("bound") is not None and not t["met"]:
            verdict += f" (overlap bound {t['bound']:.3f})"
        assert any(f"| {t['figure']} |" in r and f"| {verdict} |" in r for r in rows), t["figure"]
    met = sum("| met |" in r for r in rows)
    assert f"({met} of {want} met;" in lines[2]


def test_results_index_is_current_and_lists_every_entry_in_git(page: str) -> None:
    index = (ROOT / "results" / "README.md").read_text()
    assert index == rr.render_index(ROOT, page), "results/README.md is stale: run `inflight results-report`"
    entries = {p.relative_to(ROOT / "results").parts[0] for p in rr._tracked(ROOT, "results")} - {"README.md"}
    assert entries and all(f"[`{e}`]({e})" in index for e in entries)
