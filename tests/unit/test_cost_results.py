"""The cpu_per_request block is computed from the A/B files of one sitting."""

from __future__ import annotations

import json
from pathlib import Path

from inflight.lab.cost_results import overlap_bound, reproduce_command, summary, table
from inflight.lab.sections.cost import SECTION, cost_verdict


def _variant(label: str, spec: str, mode: str | None) -> dict:
    params = {"mode": {"string_value": mode}} if mode else {}
    return {"label": label, "spec": spec, "variant": "null" if mode is None else "x", "config": {"parameters": params}}


def _file(root: Path, name: str, rows: list[tuple[str, str, str | None, float, float]]) -> None:
    d = root / "results" / "cpu-cost" / name
    d.mkdir(parents=True)
    doc = {
        "device": {"name": "GPU X"},
        "variants": [_variant(label, spec, mode) for label, spec, mode, _, _ in rows],
        "summary": [
            {"variant": label, "spec": spec, "rps": rps, "cpu": {"server_us_per_request": us}, "valid": True}
            for label, spec, _, rps, us in rows
        ],
    }
    (d / f"ab-{name}.json").write_text(json.dumps(doc))


def test_block_from_the_sitting_with_null_and_sync_and_every_ratio(tmp_path: Path) -> None:
    assert summary(tmp_path) is None
    _file(
        tmp_path,
        "1",
        [
            ("A", "m_null@instances=8", None, 30000.0, 200.0),
            ("B", "m_sync@instances=1", "sync", 6000.0, 240.0),
            ("C", "m_sync@instances=8", "sync", 40000.0, 250.0),
            ("D", "m_inflight@instances=1,mode=auto", "auto", 6900.0, 260.0),
            ("E", "m_inflight@instances=8,mode=overlap", "overlap", 30000.0, 300.0),
        ],
    )
    _file(
        tmp_path,
        "2",
        [
            ("A", "m_sync@instances=8", "sync", 20000.0, 300.0),
            ("B", "m_inflight@instances=8,mode=auto", "auto", 22000.0, 315.0),
        ],
    )
    (tmp_path / "results" / "summary.json").write_text(json.dumps({"kept": 1}))
    block = SECTION.write_summary(tmp_path)
    assert block is not None
    assert block["sync_us"] == 250.0 and block["pipelined_us"] == 300.0 and block["null_us"] == 200.0
    assert block["best_sync_rps"] == 40000.0 and block["best_pipelined_rps"] == 30000.0
    assert abs(block["one_instance_ratio"] - 1.15) < 1e-9
    assert [t["met"] for t in block["targets"]] == [False, False, True]
    assert [round(s["rps_ratio"], 2) for s in block["sittings"]] == [0.75, 1.1]
    doc = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert doc["kept"] == 1 and doc["cpu_per_request"]["file"].endswith("ab-1.json")


def test_one_instance_target_carries_the_overlap_bound_of_the_sync_instance(tmp_path: Path) -> None:
    _file(
        tmp_path,
        "1",
        [
            ("A", "m_null@instances=8", None, 30000.0, 200.0),
            ("B", "m_sync@instances=1", "sync", 6000.0, 240.0),
            ("C", "m_sync@instances=8", "sync", 20000.0, 250.0),
            ("D", "m_inflight@instances=1,mode=auto", "auto", 6100.0, 260.0),
        ],
    )
    path = next((tmp_path / "results" / "cpu-cost").rglob("ab-*.json"))
    doc = json.loads(path.read_text())
    # cycle 3 + 5 = 8 ms of which 0.8 ms device wait: at most 8 / 7.2 from overlap
    doc["summary"][1]["executor"] = {"execute_ms": 3.0, "between_executes_ms": 5.0, "device_wait_ms": 0.8}
    path.write_text(json.dumps(doc))
    block = summary(tmp_path)
    assert block is not None
    bound = block["one_instance_overlap_bound"]
    assert abs(bound["value"] - 8.0 / 7.2) < 1e-9 and bound["device_wait_ms"] == 0.8
    one = block["targets"][2]
    assert one["met"] is False and abs(one["bound"] - 8.0 / 7.2) < 1e-9
    assert cost_verdict(one) == "**missed** (overlap bound 1.111)"
    assert cost_verdict(block["targets"][0]) == "met"


def test_overlap_bound_needs_every_figure() -> None:
    assert overlap_bound(None) is None
    assert overlap_bound({"execute_ms": 3.0, "between_executes_ms": 5.0}) is None
    assert overlap_bound({"execute_ms": 3.0, "between_executes_ms": None, "device_wait_ms": 1.0}) is None
    assert overlap_bound({"execute_ms": 0.5, "between_executes_ms": 0.0, "device_wait_ms": 1.0}) is None


def test_the_lab_page_holds_the_current_cost_table() -> None:
    """docs/LAB.md's cost table is what ``python -m inflight.lab.cost_results`` prints from results/."""
    root = Path(__file__).resolve().parents[2]
    lab = (root / "docs" / "LAB.md").read_text()
    assert "\n".join(table(root)) in lab, "regenerate it: python -m inflight.lab.cost_results"


def test_reproduce_command_comes_from_the_file_settings() -> None:
    doc = {
        "load": {
            "cpu_sets": {"server": "0-7", "client": "8-15"},
            "processes": 7,
            "window_s": 10.0,
            "warmup_s": 4.0,
            "repeat": 2,
        },
        "summary": [{"spec": "m_null@instances=8"}, {"spec": "m_sync@instances=1"}],
    }
    assert reproduce_command(doc) == (
        'AB_CPUS="--server-cpus 0-7 --client-cpus 8-15" PROCS=7 WINDOW=10 WARMUP=4 REPEAT=2 '
        "bash scripts/lab/gpu_session.sh cost 'm_null@instances=8' 'm_sync@instances=1'"
    )
    assert reproduce_command({}) == "bash scripts/lab/gpu_session.sh cost"
