"""The experiment plan's parts and the summary.json built from A/B, bound and nsys JSON files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inflight.lab import experiments as ex
from inflight.server.control import variant_config
from inflight.variants import parse_variant_arg

ROOT = Path(__file__).resolve().parents[2]


def test_every_planned_variant_resolves_against_the_committed_configs() -> None:
    published = 0
    for part, variants in ex.PLAN.items():
        assert 1 <= len(variants) <= 4, f"{part}: a part must fit one 10-minute call at 60 s windows"
        for v in variants:
            name, overrides = parse_variant_arg(v)
            vc = variant_config(ROOT / "model_repository", name, overrides)
            # the plan ran when <model>_inflight was pipelined; it is auto now (build-models --server-cpus), a
            # pipelined mode either way (the results' files hold the config each variant ran)
            assert (vc.params.mode == "sync") == name.endswith("_sync")
            published += part.startswith("sync")
    assert published == 7
    pipe = [parse_variant_arg(v)[1] for p in ex.PIPELINED_PARTS for v in ex.PLAN[p]]
    assert sorted((o["instances"], o["slots"]) for o in pipe) == [(i, s) for i in ("1", "2", "4") for s in ("2", "4")]


def _ab(path: Path, entries: list[tuple[str, float, float, float, bool]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "device": {"name": "NVIDIA H200", "driver": "580"},
                "load": {"window_s": 60},
                "summary": [
                    {
                        "spec": spec,
                        "items_per_s": items,
                        "valid": valid,
                        "latency_ms": {"p99": p99},
                        "server": {"avg_batch_items": batch},
                    }
                    for spec, items, p99, batch, valid in entries
                ],
            }
        )
    )


def test_summary_picks_the_best_valid_configuration_of_each_mode(tmp_path: Path) -> None:
    root = tmp_path / "experiments"
    _ab(
        root / "sync-a1" / "ab-1.json",
        [("s4", 900_000.0, 70.0, 1990.0, True), ("s8", 1_050_000.0, 66.0, 1950.0, True)],
    )
    _ab(root / "sync-b" / "ab-1.json", [("s6g", 2_000_000.0, 50.0, 1990.0, False)])  # invalid: ignored
    _ab(root / "pipe-a" / "ab-1.json", [("p1", 300_000.0, 200.0, 1996.0, True)])
    with pytest.raises(ValueError, match="pipe-b"):
        ex.summary(tmp_path / "nothing")
    _ab(root / "pipe-b" / "ab-1.json", [("p4", 945_000.0, 76.0, 1965.0, True)])
    (root / "engine_bound.json").write_text(
        json.dumps(
            {"rows": [{"batch": 1950, "engine_bound_items_s": 1.10e6}, {"batch": 2000, "engine_bound_items_s": 1.12e6}]}
        )
    )
    (root / "nsys").mkdir()
    (root / "nsys" / "summary.json").write_text(
        json.dumps({"files": [{"label": "best_pipelined", "summary": {"gpu_activity": 0.8}}]})
    )
    assert ex.formed_batches(root) == [1950, 2000]
    d = ex.summary(root)
    assert d["device"] == "NVIDIA H200"
    assert d["pipelined_over_sync_items_per_s"] == pytest.approx(945_000 / 1_050_000)
    assert d["pipelined_fraction_of_engine_bound"] == pytest.approx(945_000 / 1.10e6)  # bound at 1950 (1965 formed)
    assert d["pipelined_gpu_temporal_activity"] == 0.8
    assert (d["pipelined_p99_ms"], d["sync_p99_ms"]) == (76.0, 66.0)
    assert d["detail"]["best_sync"]["spec"] == "s8" and d["detail"]["best_pipelined"]["spec"] == "p4"

    assert d["detail"]["notes"] == []
    # the profile ran another configuration than the best one: said so, with both names
    (root / "nsys" / "best_pipelined").mkdir()
    (root / "nsys" / "best_pipelined" / "run.json").write_text(
        json.dumps({"server": "python3 -m inflight.cli serve -m 'p2@slots=2' --workdir runs/x"})
    )
    assert ex.nsys_spec(root / "nsys" / "best_pipelined" / "run.json") == "p2@slots=2"
    assert ex.nsys_spec(root / "nsys" / "best_sync" / "run.json") is None
    notes = ex.summary(root)["detail"]["notes"]
    assert len(notes) == 1 and "ran p2@slots=2, not p4" in notes[0]
