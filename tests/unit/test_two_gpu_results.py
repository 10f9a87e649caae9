"""Issue 33's figures from a sitting of scripts/lab/two_gpu.sh.

The fixture is a real sitting of the script, run on the CPU host as a dry run (no GPUs: ``NO_GPUS=1``,
``VARIANT_EXTRA=kind=cpu``, one server core, 4 items x seq 16, p99 SLO 150 ms): layouts ``one`` and ``two``
and the generator's proof, as the script writes them on a host of two GPUs. Each window's raw Triton
statistics (``stats_before``/``stats_after``, 17 KB a window) are left out of the files; nothing here reads them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inflight.lab import entries as entries_module
from inflight.lab import open_loop_results, two_gpu_results
from inflight.lab.entries import entries
from inflight.lab.sections import two_gpu as two_gpu_section

FIXTURE = Path(__file__).parent / "fixtures" / "two-gpu-dry"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A repository root whose results/two-gpu holds the fixture's sitting."""
    dst = tmp_path / "results" / two_gpu_results.TWO_GPU_DIR
    shutil.copytree(FIXTURE, dst)
    return tmp_path


def test_each_run_is_read_with_its_layout(root: Path) -> None:
    (sitting,) = entries_module.sittings(root / "results", two_gpu_results.TWO_GPU_DIR)
    es = entries(root / "results", sitting)
    layouts = {two_gpu_results.layout(e) for e in es}
    assert layouts == {"one", "two", None}  # None: the generator's run (the null model)
    assert all(e.kind == "null" for e in es if two_gpu_results.layout(e) is None)


def test_the_block_compares_the_best_of_two_gpus_with_the_best_of_one(root: Path) -> None:
    block = two_gpu_results.summary(root)
    assert block is not None
    es = entries(root / "results", root / block["sitting"])
    one = max(e.capacity or 0.0 for e in es if two_gpu_results.layout(e) == "one")
    two = max(e.capacity or 0.0 for e in es if two_gpu_results.layout(e) in ("two", "perserver"))
    assert block["one_gpu"]["capacity_rps"] == one
    assert block["two_gpu_capacity_rps"] == two
    assert block["two_over_one"] == pytest.approx(two / one)
    assert block["target_met"] == (two / one >= two_gpu_results.TARGET_RATIO)
    # the generator's proof: the highest null-model rate that met the SLO on schedule, against 2x two GPUs
    null = next(e for e in es if e.kind == "null")
    met = [r["offered_rps"] for r in null.summary["sweep"] if not r["slo_misses"] and not r["generator_limited"]]
    assert block["generator_verified_rps"] == max(met)
    assert block["generator_covers"] == (max(met) >= entries_module.GENERATOR_MARGIN * two)
    # cores per GPU: the two layouts of two GPUs have their server's cores split between the GPUs
    assert block["two_gpu"]["cores_per_gpu"] == pytest.approx(1 / 2)


def test_write_summary_sets_the_two_gpu_block(root: Path) -> None:
    block = two_gpu_results.summary(root)
    assert block is not None
    (root / "results" / "summary.json").write_text("{}")
    assert two_gpu_section.SECTION.write_summary(root) == json.loads(json.dumps(block))
    written = json.loads((root / "results" / "summary.json").read_text())["two_gpu"]
    assert written["two_gpu_capacity_rps"] == block["two_gpu_capacity_rps"]


def test_the_section_names_the_layouts_and_the_verdict(root: Path) -> None:
    text = "\n".join(two_gpu_section.SECTION.lines(root))
    assert "| one |" in text and "| two |" in text
    assert "Two GPUs / one GPU:" in text and ("met" in text or "**missed**" in text)
    assert two_gpu_section.SECTION.lines(root.parent / "nothing") == []


def test_the_open_loop_block_takes_the_two_gpu_figures_from_the_sitting(root: Path) -> None:
    # the committed newest open-loop sitting beside the two-GPU one: the keys come from the latter
    repo = Path(__file__).resolve().parents[2]
    newest = entries_module.newest_sitting(repo / "results")
    assert newest is not None
    shutil.copytree(newest, root / "results" / "open-loop" / newest.name)
    tg = two_gpu_results.summary(root)
    assert tg is not None
    alone = open_loop_results.summary(root)
    block = open_loop_results.summary(root, two_gpu=tg)
    assert alone is not None and block is not None
    assert block["two_gpu_capacity_rps"] == tg["two_gpu_capacity_rps"] != alone["two_gpu_capacity_rps"]
    assert block["two_gpu_over_one_gpu"] == tg["two_over_one"]
    assert block["two_gpu_source"] == tg["sitting"] and "two_gpu_source" not in alone
    # the generator's proof is the higher of the two sittings', and covers twice the highest capacity or not
    assert block["generator_verified_rps"] == max(alone["generator_verified_rps"] or 0, tg["generator_verified_rps"])
    figures = {t["figure"]: t["value"] for t in block["targets"]}
    assert figures["two GPUs / one GPU capacity"] == tg["two_over_one"]


def test_each_layout_has_its_best_sync_and_best_pipelined(root: Path) -> None:
    block = two_gpu_results.summary(root)
    assert block is not None
    es = entries(root / "results", root / block["sitting"])
    for name, modes in block["per_layout_mode"].items():
        for mode, ref in modes.items():
            caps = [
                e.capacity
                for e in es
                if two_gpu_results.layout(e) == name
                and e.capacity is not None
                and (e.mode == "sync") == (mode == "sync")
            ]
            assert (ref is None) == (not caps), (name, mode)
            if ref is not None:
                assert ref["capacity_rps"] == max(caps)
                assert ref["layout"] == name


def test_the_null_models_ceiling_bounds_two_over_one(root: Path) -> None:
    block = two_gpu_results.summary(root)
    assert block is not None
    es = entries(root / "results", root / block["sitting"])
    answered = [r["achieved_rps"] for e in es if e.kind == "null" for r in e.summary["sweep"]]
    null = block["null_model"]
    assert null["max_answered_rps"] == max(answered)
    assert block["request_path_bound"] == pytest.approx(max(answered) / block["one_gpu"]["capacity_rps"])
    text = "\n".join(two_gpu_section.SECTION.lines(root))
    assert "answered at most" in text


def test_a_sitting_of_one_layout_is_listed_beside_the_newest_complete_one(root: Path) -> None:
    (sitting,) = entries_module.sittings(root / "results", two_gpu_results.TWO_GPU_DIR)
    partial = sitting.parent / "00000000-one-only"  # sorts first: older than the complete sitting
    shutil.copytree(sitting, partial)
    for d in partial.iterdir():
        if "-cap-two-" in d.name:
            shutil.rmtree(d)
    rows = {r["sitting"]: r for r in two_gpu_results.sitting_rows(root)}
    assert rows[str(partial.relative_to(root))]["two"] is None
    assert rows[str(partial.relative_to(root))]["two_over_one"] is None
    assert rows[str(sitting.relative_to(root))]["two"] is not None
    block = two_gpu_results.summary(root)
    assert block is not None and block["sitting"] == str(sitting.relative_to(root))
    text = "\n".join(two_gpu_section.SECTION.lines(root))
    assert "Other sittings" in text and partial.name in text


def test_each_mode_gets_its_own_two_over_one(root: Path) -> None:
    block = two_gpu_results.summary(root)
    assert block is not None
    by_layout = block["per_layout_mode"]
    for mode, ratio in block["two_over_one_by_mode"].items():
        one = by_layout["one"][mode]
        twos = [r for name in ("two", "perserver") if (r := by_layout[name][mode]) is not None]
        if one is None or not twos:
            assert ratio is None, mode
            continue
        assert ratio == pytest.approx(max(r["capacity_rps"] for r in twos) / one["capacity_rps"])
        assert f"{mode} {ratio:.2f}" in "\n".join(two_gpu_section.SECTION.lines(root))
