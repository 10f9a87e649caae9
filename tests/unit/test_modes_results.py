"""The sync-against-pipelined section and summary block, from the committed sittings under results/modes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inflight.lab import entries as entries_module
from inflight.lab import modes_results, modes_select, stats
from inflight.lab.entries import Entry, entries
from inflight.lab.sections import decision, glance
from inflight.lab.sections import modes as modes_section

ROOT = Path(__file__).resolve().parents[2]


def test_every_sitting_pins_the_server_apart_from_the_generator() -> None:
    sittings = modes_select.sittings(ROOT / "results")
    assert sittings, "no sitting under results/modes"
    for sitting in sittings:
        for e in entries(ROOT / "results", sitting):
            cpu_sets = e.doc["load"]["cpu_sets"]
            assert cpu_sets["isolated"], (e.path, cpu_sets)
            assert entries_module.server_cores(e) in (4, 6, 8), (e.path, cpu_sets)


def test_the_summary_block_matches_the_files_and_is_committed() -> None:
    block = modes_results.summary(ROOT)
    assert block is not None
    committed = json.loads((ROOT / "results" / "summary.json").read_text())["modes"]
    assert json.dumps(committed, sort_keys=True) == json.dumps(block, sort_keys=True)
    for row in block["capacity"]:
        assert set(row) >= {"server_cpus", "best_sync_rps", "best_pipelined_rps", "default_rps", "plain_rps"}
        # each capacity is one a search of that budget bracketed: re-derive it from the files
        es = [e for es in modes_select.collect(ROOT)["budgets"].values() for e in es]
        caps = {e.capacity for e in es if e.summary.get("capacity_bounded") and e.summary["spec"] == row["best_sync"]}
        assert row["best_sync_rps"] in caps
        # every figure of a row comes from its one sitting (the newest that searched both modes)
        here = [e for e in es if str(modes_select.sitting_of(e).relative_to(ROOT)) == row["sitting"]]
        assert row["best_sync_rps"] in {e.capacity for e in here if e.summary["spec"] == row["best_sync"]}
        assert row["best_pipelined_rps"] in {e.capacity for e in here if e.summary["spec"] == row["best_pipelined"]}
        for key, spec_key in (("default_rps", "default"), ("plain_rps", None)):
            if row[key] is None:
                continue  # not measured for this budget: null, not a made-up figure
            if spec_key:
                kind = [e for e in here if e.capacity is not None and e.summary["spec"] == row[spec_key]]
            else:  # the plain baseline: from the row's sitting, or the newest that searched it (named)
                at = row["plain_sitting"]
                kind = [e for e in es if e.kind == "plain" and str(modes_select.sitting_of(e).relative_to(ROOT)) == at]
            assert row[key] in {e.capacity for e in kind}, (key, row)
    assert block["p99_ratio_max"] > 0
    assert set(block["regime"]) >= {"model", "device", "one_instance_ratio", "instances_ratio", "gpu_memory_ratio"}


def test_the_results_page_holds_the_current_section() -> None:
    page = (ROOT / "docs" / "RESULTS.md").read_text()
    section = "\n".join(modes_section.SECTION.lines(ROOT))
    assert section and section in page


def test_the_overlap_bound_is_cycle_over_cycle_less_the_wait() -> None:
    class E:
        summary = {"executor": {"execute_ms": 2.0, "between_executes_ms": 6.0, "device_wait_ms": 0.8}}

    assert modes_select.overlap_bound(E()) == 8.0 / 7.2  # type: ignore[arg-type]
    E.summary = {"executor": {"execute_ms": 2.0}}
    assert modes_select.overlap_bound(E()) is None  # type: ignore[arg-type]


def test_the_readme_holds_the_current_decision_table() -> None:
    table = decision.decision_table(ROOT)
    readme = (ROOT / "README.md").read_text()
    assert table, "no capacity search under results/modes"
    assert "\n".join(table) in readme, "README's decision table is stale: run `inflight results-report`"


def test_only_a_variant_without_deployment_overrides_counts_as_the_default() -> None:
    class E:
        summary = {"spec": "bert_tiny_inflight@gpus=0,capture_at_load=false"}

    assert modes_select.is_default(E())  # type: ignore[arg-type]
    E.summary = {"spec": "bert_tiny_inflight"}
    assert modes_select.is_default(E())  # type: ignore[arg-type]
    E.summary = {"spec": "bert_tiny_inflight@instances=8,mode=auto"}
    assert not modes_select.is_default(E())  # type: ignore[arg-type]
    E.summary = {"spec": "bert_tiny_sync"}
    assert not modes_select.is_default(E())  # type: ignore[arg-type]


def test_p99_at_a_rate_of_several_rounds_is_their_median_without_limited_windows() -> None:
    class E:
        summary = {
            "sweep": [
                {"offered_rps": 1000.0, "p99_ms": 5.0, "valid": True, "generator_limited": False},
                {"offered_rps": 1000.0, "p99_ms": 40.0, "valid": True, "generator_limited": False},
                {"offered_rps": 1000.0, "p99_ms": 7.0, "valid": True, "generator_limited": False},
                {"offered_rps": 2000.0, "p99_ms": 9.0, "valid": True, "generator_limited": False},
                {"offered_rps": 2000.0, "p99_ms": 90.0, "valid": True, "generator_limited": True},
                {"offered_rps": 3000.0, "p99_ms": 11.0, "valid": False, "generator_limited": False},
            ]
        }

    # one stalled round of three does not decide the rate; a limited or invalid window never counts
    assert modes_results.p99_by_rate(E()) == {1000.0: 7.0, 2000.0: 9.0}  # type: ignore[arg-type]


def _fixed(call: str, kind: str, p99s: list[float]) -> Entry:
    """One variant of a fixed-rate file (one device call) of the sitting ``s``: its rounds' p99s at 1,000 req/s."""
    return Entry(
        path=Path("results/modes/s") / call / "ab.json",
        doc={},
        summary={
            "spec": f"bert_tiny_{kind}",
            "sweep": [{"offered_rps": 1000.0, "p99_ms": v, "valid": True, "generator_limited": False} for v in p99s],
        },
        variant={"variant": "sync" if kind == "sync" else "inflight"},
    )


def test_p99_ratios_pool_the_rounds_of_every_fixed_file_of_a_sitting() -> None:
    """Two device calls of one sitting at the same rate: each side's p99 is its median over all six rounds."""
    first = [_fixed("call-1", "sync", [4.0, 30.0, 5.0]), _fixed("call-1", "inflight", [6.0, 6.5, 40.0])]
    second = [_fixed("call-2", "sync", [6.0, 7.0, 5.5]), _fixed("call-2", "inflight", [5.0, 6.2, 5.8])]
    es = first + second
    got = modes_results.p99_ratios(es, first[0], first[1])
    # sync's six: 4, 5, 5.5, 6, 7, 30 -> 5.75; the other's: 5, 5.8, 6, 6.2, 6.5, 40 -> 6.1 (not the last file's alone)
    assert got == {1000.0: pytest.approx(6.1 / 5.75)}
    assert modes_results.p99_rounds(es, "bert_tiny_sync") == {1000.0: [4.0, 30.0, 5.0, 6.0, 7.0, 5.5]}
    assert modes_results.p99_spread(es, "bert_tiny_sync") == pytest.approx(30.0 / 4.0)


def _entry(sitting: str, kind: str, capacity: float, bounded: bool, started: str, comparable: bool = True) -> Entry:
    """A capacity search's entry in ``results/modes/<sitting>/<run>/ab.json``."""
    summary = {"variant": "A", "spec": f"bert_tiny_{kind}", "capacity_rps": capacity, "capacity_bounded": bounded}
    return Entry(
        path=Path("results/modes") / sitting / f"cap-{kind}" / "ab.json",
        doc={"started": started, "runs": [{"variant": "A", "capacity_search": {"lo": 1}}]},
        summary={**summary, "comparable": comparable},
        variant={"variant": kind},
    )


def test_a_core_budget_takes_its_newest_sitting_that_searched_both_modes() -> None:
    old = [
        _entry("a-old", "sync", 29_500.0, True, "2026-11-25T12:35:00"),
        _entry("a-old", "inflight", 27_000.0, True, "2026-11-25T12:37:00"),
    ]
    new = [
        _entry("b-new", "sync", 26_375.0, True, "2026-11-26T04:12:00"),
        # a lower bound (its search's high end met the SLO) still makes the sitting a comparison
        _entry("b-new", "inflight", 28_000.0, False, "2026-11-26T04:14:00"),
    ]
    newest_but_one_mode = [_entry("c-sync-only", "sync", 40_000.0, True, "2026-11-27T00:00:00")]
    b = modes_results.core_budget(old + new + newest_but_one_mode)
    assert b is not None
    # not the best of every sitting (29,500 sync, 40,000 sync alone): one sitting's pair
    assert (b["best_sync_rps"], b["best_pipelined_rps"]) == (26_375.0, 28_000.0)
    assert b["sitting"] == Path("results/modes/b-new") and b["best_pipelined_is_lower_bound"]
    assert modes_select.newest_comparison(newest_but_one_mode) == []


def test_a_sitting_that_searched_each_side_several_times_is_judged_by_the_medians() -> None:
    """One search moves with the host: the medians of interleaved searches are compared, not the two best."""

    def search(kind: str, capacity: float, minute: int, bounded: bool = True) -> Entry:
        e = _entry("abba", kind, capacity, bounded, f"2026-11-27T10:{minute:02d}:00")
        return dataclasses.replace(e, path=e.path.parent.with_name(f"{minute:02d}-cap-{kind}") / "ab.json")

    es = [
        search("sync", 10_000.0, 1),
        search("inflight", 13_000.0, 2),
        search("inflight", 9_000.0, 3),
        search("sync", 11_000.0, 4),
        search("sync", 10_500.0, 5),
        search("inflight", 9_500.0, 6),
    ]
    b = modes_results.core_budget(es)
    assert b is not None
    assert b["sync_searches_rps"] == [10_000.0, 11_000.0, 10_500.0]
    assert b["pipelined_searches_rps"] == [13_000.0, 9_000.0, 9_500.0]
    # the best of each (13,000 / 11,000 = 1.18) would pass; the medians (9,500 / 10,500) do not
    assert (b["best_sync_rps"], b["best_pipelined_rps"]) == (11_000.0, 13_000.0)
    assert b["capacity_ratio"] == pytest.approx(9_500 / 10_500)
    row = {**b, "best_pipelined_is_lower_bound": False, "p99_ratio_max": 1.0, "default_rps": None}
    (head,) = glance.modes_rows({"capacity": [{**row, "device": "GPU"}]})
    assert "(medians of 3 and 3 searches)" in head[0] and head[1].startswith("0.90x") and "capacity" in head[3]
    # a search whose generator fell behind at or below its capacity is not compared (the 8-core H100 sitting's
    # first sync search: 22,500 req/s with 1.2% of the sends over 10 ms late there)
    behind = search("sync", 9_000.0, 7)
    behind.summary["comparable"] = False
    b2 = modes_results.core_budget([*es, behind])
    assert b2 is not None and b2["sync_searches_rps"] == [10_000.0, 11_000.0, 10_500.0]
    # one search a side: the two searches themselves
    assert stats.capacity_ratio([10_000.0], [9_000.0, 12_000.0]) == 1.2
    # the default against the better mode, read the same way
    assert modes_results.default_share([10.0, 12.0], [9.0, 13.0], [9.0, 13.0]) == 1.0
    assert modes_results.default_share([10.0, 12.0], [9.0, 13.0], [8.0, 10.0]) == pytest.approx(9 / 11)
    assert modes_results.default_share([10.0], [9.0], [8.0, 10.0]) == 1.0
    assert stats.capacity_ratio([], [1.0]) is None and modes_results.default_share([1.0], [1.0], []) is None


def test_the_plain_baseline_comes_from_the_rows_sitting_else_the_newest_that_searched_it_beside_sync() -> None:
    here = [_entry("b-new", "sync", 26_375.0, True, "2026-11-26T04:12:00")]
    older = [
        _entry("a-old", "sync", 22_000.0, True, "2026-11-25T12:35:00"),
        _entry("a-old", "plain", 19_500.0, True, "2026-11-25T12:39:00"),
        _entry("a-older", "sync", 20_000.0, True, "2026-11-24T12:35:00"),
        _entry("a-older", "plain", 18_000.0, True, "2026-11-24T12:39:00"),
        _entry("a-unbracketed", "sync", 20_000.0, True, "2026-11-25T19:00:00"),
        _entry("a-unbracketed", "plain", 40_000.0, False, "2026-11-25T20:00:00"),
        # the newest plain search, but no sync beside it: not read (another host of the device may be 3x slower)
        _entry("a-alone", "plain", 2_812.0, True, "2026-11-26T22:08:00"),
    ]
    every = here + older
    got = modes_select.plain_for(every, here)
    assert got is not None and got.capacity == 19_500.0  # newest bracketed search beside sync, not the largest
    # read against sync in its own sitting (19,500 / 22,000), with that sitting named
    there = modes_select.sync_beside(every, got)
    assert modes_section.plain_cell(got, got in here, there) == "19,500 (1 inst.) (0.89x sync there, `a-old`)"
    mine = _entry("b-new", "plain", 20_000.0, True, "2026-11-26T04:16:00")
    assert modes_select.plain_for([*here, mine, *older], [*here, mine]) is mine
    assert modes_section.plain_cell(mine, True, None) == "20,000 (1 inst.)"
    assert modes_select.plain_for(here, here) is None
    assert modes_select.plain_for([*here, older[-1]], here) is None
    assert modes_section.plain_cell(None, False, None) == "not measured beside sync"


def test_the_headline_names_each_missed_target_of_a_core_budget() -> None:
    row = {
        "device": "GPU",
        "server_cpus": 4,
        "best_sync_rps": 14_000.0,
        "best_pipelined_rps": 16_000.0,
        "best_pipelined_is_lower_bound": False,
        "default_rps": 16_000.0,
        "capacity_ratio": 16 / 14,
        "default_share": 1.0,
        "p99_ratio_max": 1.43,
    }
    block = {"capacity": [row, {**row, "server_cpus": 8, "p99_ratio_max": 1.04, "best_pipelined_is_lower_bound": True}]}
    (four, eight) = glance.modes_rows(block)
    assert four[1] == "1.14x; 1.43; 100%" and four[3] == "**missed** (p99)"
    assert eight[1].startswith(">= 1.14x") and eight[3] == "met"
    # a p99 ratio under sync's own spread over rounds is still missed, and says so
    noisy = glance.modes_rows({"capacity": [{**row, "p99_sync_spread_max": 2.62}]})[0]
    assert noisy[3] == "**missed** (p99); p99 ratio within sync's own spread over rounds (2.62)"
    calm = glance.modes_rows({"capacity": [{**row, "p99_sync_spread_max": 1.2}]})[0]
    assert calm[3] == "**missed** (p99)"
    slow = {**row, "best_pipelined_rps": 13_000.0, "default_rps": 12_000.0, "capacity_ratio": 13 / 14}
    assert glance.modes_rows({"capacity": [{**slow, "default_share": 12 / 14}]})[0][3] == (
        "**missed** (capacity, p99, default)"
    )
    # no comparable search on a side: no ratio (not one re-derived from the best figures), and no verdict of met
    unjudged = glance.modes_rows({"capacity": [{**row, "capacity_ratio": None, "default_share": None}]})[0]
    assert unjudged[1] == "n/a; 1.43; n/a" and unjudged[3] == "**missed** (capacity, p99, default)"
    reg = {"model": "m", "device": "GPU", "one_instance_ratio": 1.25, "one_instance_ratio_is_lower_bound": False}
    assert glance.modes_rows({"regime": reg}) == [
        ["one pipelined instance / one sync instance (m, GPU)", "1.25x", ">= 1.3x", "**missed**"]
    ]
    with_auto = {**reg, "auto_one_instance_ratio": 1.65, "auto_one_instance_ratio_is_lower_bound": False}
    assert glance.modes_rows({"regime": with_auto})[1] == [
        "one `m_inflight` instance as built (`auto`) / one sync instance (m, GPU)",
        "1.65x",
        ">= 1.3x",
        "met",
    ]


def test_auto_is_read_from_its_newest_sitting_with_its_fixed_rate_p99s() -> None:
    """Each sitting measured the auto rule of its day's code, so the newest one stands, not the best figure."""
    c = modes_select.collect(ROOT)
    es = c["regimes"][("NVIDIA H200", "bert_small")]
    a = modes_results.newest_auto(es)
    assert a is not None and a["sitting"].name == "20261126-h200-bert_small-early"
    assert (a["sync"].capacity, a["auto"].capacity) == (2_875.0, 4_750.0)
    # the fixed parts' rates (20/50/80% of sync's capacity; the auto-only file at 4,300 has no sync to divide by),
    # not the searches' own windows
    assert list(a["p99_ratios"]) == [580.0, 1400.0, 2300.0]
    # older sittings' auto (the busy gate alone: 2,469 req/s; skipped windows without the early reference end:
    # 3,188) are not taken, nor a sitting without sync
    for name, capacity in (("20261126-h200-regime-busy", 2_468.75), ("20261126-h200-bert_small-skip", 3_187.5)):
        older = [e for e in es if modes_select.sitting_of(e).name == name]
        assert modes_results.newest_auto(older)["auto"].capacity == capacity  # type: ignore[index]
    assert modes_results.newest_auto([e for e in es if e.mode == "auto"]) is None
    reg = json.loads((ROOT / "results/summary.json").read_text())["modes"]["regime"]
    assert reg["auto_one_instance_ratio"] == a["ratio"] and reg["auto_p99_ratio_max"] == max(a["p99_ratios"].values())


def test_sync_against_itself_gives_the_noise_a_p99_ratio_is_read_against() -> None:
    """Sync's own p99s over interleaved rounds at one rate: the largest max / min of the sitting (its noise)."""
    c = modes_select.collect(ROOT)
    budget = c["budgets"][("NVIDIA H200", 4)]
    rounds = [e for e in budget if modes_select.sitting_of(e).name == "20261126-h200-4cores-rounds"]
    b = modes_results.core_budget(rounds)
    assert b is not None and b["sitting"].name == "20261126-h200-4cores-rounds"
    # sync's four rounds at 13,400 req/s: p99 8.52, 11.88, 22.29, 17.62 ms (the default's: 13.10 .. 19.53)
    assert b["p99_sync_spread"] == pytest.approx(22.29 / 8.52, rel=1e-3)
    assert b["p99_sync_spread"] > max(b["p99_ratios"].values())
    # three fixed files of two rounds each, pooled per rate (six rounds)
    pooled = modes_results.core_budget(
        [e for e in budget if modes_select.sitting_of(e).name == "20261126-h200-4cores-pooled"]
    )
    assert pooled is not None and pooled["p99_rounds"] == 6 and list(pooled["p99_ratios"]) == [2000.0, 5250.0, 8500.0]
    # the budget's row: its newest sitting that searched both modes, whatever its rounds
    newest = modes_results.core_budget(budget)
    rows = json.loads((ROOT / "results/summary.json").read_text())["modes"]["capacity"]
    row = next(r for r in rows if r["device"] == "NVIDIA H200" and r["server_cpus"] == 4)
    assert newest is not None and row["sitting"] == str(newest["sitting"].relative_to(ROOT))
    assert row["p99_sync_spread_max"] == newest["p99_sync_spread"] and row["p99_rounds"] == newest["p99_rounds"]
    # a sitting of one round per rate has no spread to give
    h100 = c["budgets"][("NVIDIA H100 80GB HBM3", 8)]
    one = modes_results.core_budget([e for e in h100 if modes_select.sitting_of(e).name == "20261125-h100-8cores-auto"])
    assert one is not None and one["p99_sync_spread"] is None


def _fixed_part(sitting: str, kind: str, rates_p99: dict[float, float], started: str) -> Entry:
    """One variant of a fixed-rate part (two variants in one file, no search), its p99 per offered rate."""
    sweep = [{"offered_rps": r, "p99_ms": p, "valid": True} for r, p in rates_p99.items()]
    return Entry(
        path=Path("results/modes") / sitting / "fixed" / "ab.json",
        doc={"started": started, "runs": [{"variant": kind}]},
        summary={"variant": kind, "spec": f"bert_tiny_{kind}", "sweep": sweep},
        variant={"variant": kind},
    )


def test_the_p99_targets_come_from_the_newest_sitting_that_ran_the_20_50_80_rates_side_by_side() -> None:
    rounds = [
        _entry("a-rounds", "sync", 10_000.0, True, "2026-11-26T18:00:00"),
        _fixed_part("a-rounds", "sync", {2_000.0: 4.0, 5_000.0: 8.0, 8_000.0: 20.0}, "2026-11-26T18:05:00"),
        _fixed_part("a-rounds", "inflight", {2_000.0: 4.0, 5_000.0: 6.0, 8_000.0: 21.0}, "2026-11-26T18:05:00"),
    ]
    # newer: a knee-only part (90/100% of its sync capacity) does not stand for item 2's load points
    knee = [
        _entry("b-knee", "sync", 3_500.0, True, "2026-11-26T19:00:00"),
        _fixed_part("b-knee", "sync", {3_200.0: 40.0, 3_500.0: 41.0}, "2026-11-26T19:05:00"),
        _fixed_part("b-knee", "inflight", {3_200.0: 36.0, 3_500.0: 42.0}, "2026-11-26T19:05:00"),
    ]
    searches_only = [
        _entry("c-searches", "sync", 11_000.0, True, "2026-11-26T21:00:00"),
        _entry("c-searches", "inflight", 11_000.0, True, "2026-11-26T21:02:00"),
    ]
    b = modes_results.core_budget(rounds + knee + searches_only)
    assert b is not None and b["sitting"] == Path("results/modes/c-searches")
    assert b["p99_sitting"] == Path("results/modes/a-rounds")
    assert b["p99_ratios"] == {2_000.0: 1.0, 5_000.0: 0.75, 8_000.0: 1.05}
    assert not modes_results._side_by_side(knee, knee[0], knee[2])
    assert modes_results._side_by_side(rounds, rounds[0], rounds[2])


def test_auto_in_band_only_is_not_a_pipelined_variant() -> None:
    def auto(bound: str) -> Entry:
        e = _entry("s", "inflight", 13_000.0, True, "2026-11-26T21:36:00")
        params = {"mode": {"string_value": "auto"}, "auto_bound_min": {"string_value": bound}}
        return Entry(e.path, e.doc, e.summary, {"variant": "inflight", "config": {"parameters": params}})

    assert not modes_select.is_pipelined(auto("inf")) and modes_select.is_pipelined(auto("1.25"))
    assert modes_select.is_pipelined(auto("0"))


def test_the_decision_table_deploys_the_mode_judged_best_and_a_tie_goes_to_the_pipelined_one() -> None:
    es = [
        _entry("s", "sync", 11_438.0, True, "2026-11-26T21:34:00"),
        _entry("s", "inflight", 13_312.0, True, "2026-11-26T21:36:00"),
        _entry("s", "inflight", 11_438.0, True, "2026-11-26T21:38:00"),
        _entry("s", "sync", 11_750.0, True, "2026-11-26T21:40:00"),
        _entry("s", "inflight", 10_812.0, True, "2026-11-26T21:42:00"),
        _entry("s", "sync", 11_438.0, True, "2026-11-26T21:45:00"),
    ]
    sync, pipe = es[3], es[1]
    # medians 11,438 each (not the best single search, 13,312): a tie, so the pipelined mode
    assert decision._deploy(es, pipe, sync) == "`pipelined`, 1 instance: 11,438 req/s (median)"
    assert decision._deploy(es[:2], pipe, sync) == "`pipelined`, 1 instance: 13,312 req/s"
    assert decision._deploy([es[0], es[2]], pipe, sync) == "`pipelined`, 1 instance: 11,438 req/s"
    assert decision._deploy([*es[:1], es[4]], pipe, sync) == "`sync`, 1 instance: 11,438 req/s"
    assert decision._deploy([], pipe, sync) is None


def test_a_plain_search_is_read_against_sync_of_its_own_instances_where_its_sitting_had_one() -> None:
    def of(kind: str, capacity: float, count: int) -> Entry:
        e = _entry("s", kind, capacity, True, "2026-11-25T12:00:00")
        return Entry(
            e.path.with_name(f"ab-{count}.json"),
            e.doc,
            e.summary,
            {"variant": kind, "config": {"instance_group": [{"count": count}]}},
        )

    plain, sync1, sync8 = of("plain", 2_000.0, 1), of("sync", 2_300.0, 1), of("sync", 9_000.0, 8)
    assert modes_select.sync_beside([plain, sync1, sync8], plain) is sync1
    assert modes_select.sync_beside([plain, sync8], plain) is sync8


def _with_lowest_window(e: Entry, rate: float, p50: float, p99: float) -> Entry:
    """``e`` with a search whose lowest-rate window had this p50 and p99 (a higher window after it)."""
    sweep = [
        {"offered_rps": rate * 2, "p50_ms": p50, "p99_ms": 60.0, "valid": True},
        {"offered_rps": rate, "p50_ms": p50, "p99_ms": p99, "valid": True},
        # a generator-limited window is no evidence of the host
        {"offered_rps": rate / 2, "p50_ms": 1.0, "p99_ms": 90.0, "valid": True, "generator_limited": True},
    ]
    return dataclasses.replace(e, summary={**e.summary, "sweep": sweep})


def test_a_plain_figure_from_a_host_that_stalls_is_flagged_and_a_steady_hosts_preferred() -> None:
    steady = _entry("a-steady", "sync", 14_750.0, True, "2026-11-25T12:28:00")
    steady_sync = _with_lowest_window(steady, 6_000, 3.4, 8.3)
    steady_plain = _entry("a-steady", "plain", 13_000.0, True, "2026-11-25T12:31:00")
    stalled = _entry("b-stalls", "sync", 2_562.0, True, "2026-11-27T00:43:00")
    stalled_sync = _with_lowest_window(stalled, 2_000, 3.3, 37.0)
    stalled_plain = _entry("b-stalls", "plain", 2_250.0, True, "2026-11-27T00:46:00")
    assert modes_select.tail_spread(stalled_sync) == (2_000.0, 37.0 / 3.3)
    assert modes_select.stalls(stalled_sync) and not modes_select.stalls(steady_sync)
    assert not modes_select.stalls(None) and modes_select.tail_spread(stalled_plain) is None
    here = [_entry("c-row", "sync", 11_000.0, True, "2026-11-27T01:00:00")]
    every = [*here, steady_sync, steady_plain, stalled_sync, stalled_plain]
    # the newer plain search ran on a host that stalled: the steady host's stands in
    assert modes_select.plain_for(every, here) is steady_plain
    # where only the stalled one exists, it is read, and its cell says so
    only = [*here, stalled_sync, stalled_plain]
    assert modes_select.plain_for(only, here) is stalled_plain
    cell = modes_section.plain_cell(stalled_plain, False, modes_select.sync_beside(only, stalled_plain))
    assert cell == (
        "2,250 (1 inst.) (0.88x sync there, a host that stalls: sync's p99 11x its p50 at 2,000 req/s, `b-stalls`)"
    )
    # a steady host's plain search beside: no stalling shares are shown
    assert modes_select.stalling_plain_shares(every, steady_plain) == []
    assert modes_select.stalling_plain_shares(only, stalled_plain) == [2_250.0 / 2_562.0]


def test_plain_searches_from_several_hosts_that_stall_are_shown_as_their_range_not_the_newest_alone() -> None:
    first = _with_lowest_window(_entry("b-stalls", "sync", 2_562.0, True, "2026-11-27T00:43:00"), 2_000, 3.3, 37.0)
    first_plain = _entry("b-stalls", "plain", 2_250.0, True, "2026-11-27T00:46:00")
    second = _with_lowest_window(_entry("c-stalls", "sync", 1_719.0, True, "2026-11-27T03:15:00"), 1_000, 3.0, 30.0)
    second_plain = _entry("c-stalls", "plain", 3_312.0, True, "2026-11-27T03:18:00")
    here = [_entry("d-row", "sync", 11_000.0, True, "2026-11-27T04:00:00")]
    every = [*here, first, first_plain, second, second_plain]
    plain = modes_select.plain_for(every, here)
    assert plain is second_plain  # the newest, for want of a steady host
    shares = modes_select.stalling_plain_shares(every, plain)
    assert shares == [2_250.0 / 2_562.0, 3_312.0 / 1_719.0]  # oldest first
    cell = modes_section.plain_cell(plain, False, modes_select.sync_beside(every, plain), shares)
    assert cell == (
        "not measured on a steady host; on 2 hosts that stall (sync's p99 >= 5x its p50 at its lowest rate) "
        "0.88x, 1.93x sync there, newest `c-stalls`"
    )


def test_the_permutation_p_counts_the_relabellings_whose_medians_are_as_far_apart() -> None:
    # 2026-11-27's four searches a side on four H200 cores: medians 13,625 and 12,531
    sync = [10_500.0, 13_312.5, 13_937.5, 15_187.5]
    default = [11_437.5, 13_000.0, 12_062.5, 14_875.0]
    assert stats.permutation_p(sync, default) == pytest.approx(44 / 70)
    assert stats.permutation_p(default, sync) == pytest.approx(44 / 70)  # two-sided
    # fully separated groups: the medians ignore the extremes, so swapping the outermost values keeps the gap too
    # ({1, 2, 3, 11} against {4, 12, 13, 14}: 2.5 and 12.5), four labellings of 70
    assert stats.permutation_p([1.0, 2.0, 3.0, 4.0], [11.0, 12.0, 13.0, 14.0]) == pytest.approx(4 / 70)
    assert stats.permutation_p([1.0, 2.0], [11.0, 12.0]) == pytest.approx(2 / 6)  # never under 1/3
    assert stats.permutation_p([5.0, 5.0], [5.0, 5.0]) == 1.0
    assert stats.permutation_p([1.0], [2.0, 3.0]) is None  # one search a side: no test
    assert stats.permutation_p([1.0] * 9, [2.0] * 9) is None  # C(18, 9) over PERMUTATIONS_MAX


def test_the_worst_p99_ratios_rounds_are_tested_at_its_rate_and_a_missed_target_shows_both_p() -> None:
    es = [_fixed("call-1", "sync", [4.0, 5.0, 6.0]), _fixed("call-1", "inflight", [8.0, 9.0, 10.0])]
    p, n, m = modes_results.worst_p99_p(es, es[0], es[1])
    # separated: medians 5 and 9; {4, 5, 8} against {6, 9, 10} too, and the two the other way round: 4 of C(6, 3)
    assert (n, m) == (3, 3) and p == pytest.approx(4 / 20)
    assert modes_results.worst_p99_p(es[:1], es[0], es[1]) == (None, 0, 0)  # nothing ran side by side
    row = {
        "device": "GPU",
        "server_cpus": 4,
        "best_pipelined_is_lower_bound": False,
        "capacity_ratio": 0.92,
        "capacity_ratio_p": 0.63,
        "default_share": 1.0,
        "p99_ratio_max": 1.21,
        "p99_ratio_max_p": 0.67,
    }
    (head,) = glance.modes_rows({"capacity": [row]})
    assert head[3] == (
        "**missed** (capacity, p99); as far apart under a random labelling of the same runs: "
        "capacity p 0.63, p99 p 0.67"
    )
    # a target met shows no p of its own
    (met,) = glance.modes_rows({"capacity": [{**row, "capacity_ratio": 1.0}]})
    assert met[3] == "**missed** (p99); as far apart under a random labelling of the same runs: p99 p 0.67"


def _rounds_part(sitting: str, kind: str, rounds: dict[float, list[float]]) -> Entry:
    """One variant of a fixed-rate part: per offered rate, its p99 in rounds 1, 2, ..."""
    sweep = [
        {"offered_rps": r, "p99_ms": p, "valid": True, "round": i}
        for r, p99s in rounds.items()
        for i, p in enumerate(p99s, start=1)
    ]
    return Entry(
        path=Path("results/modes") / sitting / "fixed" / "ab.json",
        doc={"started": "2026-11-27T06:00:00", "runs": [{"variant": kind}]},
        summary={"variant": kind, "spec": f"bert_tiny_{kind}", "sweep": sweep},
        variant={"variant": kind},
    )


def test_the_sign_test_is_two_sided_and_exact() -> None:
    assert stats.sign_p(3, 0) == pytest.approx(2 / 8)
    assert stats.sign_p(0, 3) == pytest.approx(2 / 8)
    assert stats.sign_p(17, 12) == pytest.approx(2 * sum(math.comb(29, k) for k in range(17, 30)) / 2**29)
    assert stats.sign_p(2, 2) == 1.0 and stats.sign_p(0, 0) is None


def test_pooled_p99_pairs_rounds_and_places_each_rate_at_its_sittings_load_point() -> None:
    """Each sitting's rates count for the load point nearest their share of its median sync search; rounds
    pair by number within a file; a sitting without a sync search, and a rate at the knee, count for none."""
    a = [  # sync searched 10,000 and 12,000: median 11,000; 2,200 is 20%, 8,800 is 80%
        _entry("a", "sync", 10_000.0, True, "2026-11-27T05:00:00"),
        _entry("a", "sync", 12_000.0, True, "2026-11-27T05:02:00"),
        _rounds_part("a", "sync", {2_200.0: [4.0, 5.0], 8_800.0: [10.0, 30.0], 11_000.0: [40.0, 45.0]}),
        _rounds_part("a", "inflight", {2_200.0: [4.4, 4.5], 8_800.0: [20.0, 15.0], 11_000.0: [41.0, 44.0]}),
    ]
    b = [  # a sync capacity of 5,000: its 4,000 is 80%
        _entry("b", "sync", 5_000.0, True, "2026-11-27T06:00:00"),
        _rounds_part("b", "sync", {4_000.0: [8.0]}),
        _rounds_part("b", "inflight", {4_000.0: [12.0]}),
    ]
    orphan = [  # no sync search in its sitting: no reference, so no load point
        _rounds_part("c", "sync", {4_000.0: [8.0]}),
        _rounds_part("c", "inflight", {4_000.0: [80.0]}),
    ]
    got = modes_results.pooled_p99(a + b + orphan, "bert_tiny_sync", "bert_tiny_inflight")
    assert set(got) == {0.2, 0.8}  # 11,000 req/s is the knee (100%): no load point
    assert got[0.2] == {"ratio": pytest.approx(1.0), "rounds": 2, "sittings": 1, "above": 1, "sign_p": 1.0}
    # 80%: rounds 20/10 and 15/30 in a, 12/8 in b -> 2.0, 0.5, 1.5: median 1.5, two of three above
    assert got[0.8]["ratio"] == pytest.approx(1.5) and got[0.8]["rounds"] == 3 and got[0.8]["sittings"] == 2
    assert got[0.8]["above"] == 2 and got[0.8]["sign_p"] == pytest.approx(1.0)
    row = {
        "device": "GPU",
        "server_cpus": 4,
        "best_pipelined_is_lower_bound": False,
        "capacity_ratio": 1.0,
        "default_share": 1.0,
        "p99_ratio_max": 1.2,
        "p99_pooled": {f"{k:g}": v for k, v in got.items()},
    }
    (head,) = glance.modes_rows({"capacity": [row]})
    assert head[3] == (
        "**missed** (p99); p99 ratio over every sitting's paired rounds "
        "20%: 1.00 (2 in 1; p 1.00), 80%: 1.50 (3 in 2; p 1.00)"
    )
    (met,) = glance.modes_rows({"capacity": [{**row, "p99_ratio_max": 1.0}]})
    assert met[3] == "met"  # a met target shows no pooled figure


STEADY_SITTING = ROOT / "results" / "modes" / "20261127-h100-4cores-plainc"  # sync's p99 <= 2.8x its p50
STALLING_SITTING = ROOT / "results" / "modes" / "20261127-h100-4cores-plain"  # 11.2x at 2,000 req/s


def test_the_steady_check_names_a_host_that_stalls_and_passes_a_steady_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert modes_select.steady_main([str(STEADY_SITTING)]) == 0
    assert "steady: sync's p99 at most 2.8x its p50" in capsys.readouterr().out
    assert modes_select.steady_main([str(STALLING_SITTING)]) == 3
    out = capsys.readouterr().out
    assert "the host stalls" in out and "11.2x its p50 at 2,000 req/s" in out
    [(spec, rate, spread)] = modes_select.sync_tail_spreads(STALLING_SITTING)
    assert spec.startswith("bert_tiny_sync@") and rate == 2_000.0 and spread >= modes_select.STALL_SPREAD
    assert len(modes_select.sync_tail_spreads(STEADY_SITTING)) == 3  # every sync search of the sitting
    # a sitting of fixed rates alone has no search to judge the host by
    assert modes_select.steady_main([str(ROOT / "results" / "modes" / "20261126-h100-4cores-stalls")]) == 4


@pytest.mark.parametrize(("sitting", "rc"), [(STALLING_SITTING, 3), (STEADY_SITTING, 0)])
def test_modes_budget_stops_before_the_fixed_part_on_a_host_that_stalls(tmp_path: Path, sitting: Path, rc: int) -> None:
    campaign = tmp_path / sitting.name
    shutil.copytree(sitting, campaign, ignore=shutil.ignore_patterns("logs"))
    env = {**os.environ, "CAMPAIGN": str(campaign), "BUDGET_PARTS": "steady", "STEADY_GATE": "1"}
    env.update(OUT=str(tmp_path / "out"), PYTHON=sys.executable)
    r = subprocess.run(
        ["bash", "scripts/lab/modes_budget.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == rc, r.stdout + r.stderr
    assert ("the host stalls" in r.stdout) == (rc == 3)
    assert (campaign / "logs" / "steady.log").read_text() == r.stdout


def test_the_plain_cell_reads_plains_p99_against_syncs_at_the_lowest_rate_both_searched() -> None:
    sync = _with_lowest_window(_entry("a", "sync", 14_750.0, True, "2026-11-25T12:28:00"), 6_000, 3.4, 8.3)
    plain = _with_lowest_window(_entry("a", "plain", 13_000.0, True, "2026-11-25T12:31:00"), 6_000, 7.0, 15.0)
    # 3,000 req/s is generator-limited on both (no evidence); 12,000 is common too but not the lowest
    assert modes_results.plain_p99_over_sync(plain, sync) == (6_000.0, 15.0 / 8.3)
    cell = modes_section.plain_cell(plain, False, sync)
    assert cell == "13,000 (1 inst.) (0.88x sync there, p99 1.81x sync's at 6,000 req/s, `a`)"
    assert modes_section.plain_cell(plain, True, sync) == "13,000 (1 inst.) (p99 1.81x sync's at 6,000 req/s)"
    elsewhere = _with_lowest_window(_entry("b", "plain", 9_000.0, True, "2026-11-25T13:00:00"), 5_000, 7.0, 15.0)
    assert modes_results.plain_p99_over_sync(elsewhere, sync) is None  # no rate in common
    assert modes_results.plain_p99_over_sync(None, sync) is None
    # on the committed steady H100 sitting: 8,000 req/s, plain's p99 46.2 ms against sync's 25.1
    es = entries(ROOT / "results", STEADY_SITTING)
    best = {kind: max((e for e in es if e.kind == kind), key=lambda e: e.capacity or 0) for kind in ("sync", "plain")}
    rate, ratio = modes_results.plain_p99_over_sync(best["plain"], best["sync"]) or (0.0, 0.0)
    assert rate == 8_000.0 and ratio == pytest.approx(46.2 / 25.1, rel=0.01)
