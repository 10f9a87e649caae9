"""The heads' RESULTS section is read from the bench and profile files."""

from __future__ import annotations

import json
from pathlib import Path

from inflight.lab.sections import heads as heads_results


def _row(engine: str, batch: int, us: float, floor: float) -> dict[str, object]:
    return {"engine": engine, "batch": batch, "engine_us_per_batch": us, "floor_us_per_batch": floor}


def _write(root: Path) -> None:
    folder = root / "results" / "engine-heads"
    (folder / "profiles").mkdir(parents=True)
    rows = [
        _row("eager, fused (served), fp16", 32, 50.0, 10.0),
        _row("eager, fused (served), fp16", 2048, 200.0, 80.0),
        _row("inductor, published head (the engine before), fp16", 2048, 400.0, 80.0),
        {"batch": 2048, "sync_items_s": 1.0, "engine_us_per_batch": 1.0},  # an executor row: not an engine
    ]
    doc = {"device": "GPU X", "driver": "1", "versions": {"torch": "t"}, "peak": "P", "rows": rows}
    (folder / "linear_head.json").write_text(json.dumps(doc))
    prof = {"buckets": [{"batch": 2048, "kernel_us_sum": 190.0, "gemm_us": 160.0}]}
    (folder / "profiles" / "linear_head-served.json").write_text(json.dumps(prof))


def test_summary_compares_the_served_engine_with_the_engine_before_at_the_largest_batch(tmp_path: Path) -> None:
    _write(tmp_path)
    folder = tmp_path / "results" / "engine-heads"
    s = heads_results.head_summary(
        json.loads((folder / "linear_head.json").read_text()),
        json.loads((folder / "profiles" / "linear_head-served.json").read_text()),
    )
    assert s["batch"] == 2048 and s["served_us"] == 200.0 and s["before_us"] == 400.0
    assert s["speedup"] == 2.0 and s["over_floor"] == 2.5
    assert abs(s["gemm_share"] - 160 / 190) < 1e-12 and s["gemm_floor_fraction"] == 0.5


def test_section_prints_the_figures_of_the_files_and_says_gemm_bound(tmp_path: Path) -> None:
    _write(tmp_path)
    text = "\n".join(heads_results.SECTION.lines(tmp_path))
    assert "| linear_head | 2048 | eager, fused (served), fp16 | 200.0 | 400.0 | 2.00x | 2.50 | 84% |" in text
    assert "linear_head at 2048: GEMM-bound, 84% of its kernel time in GEMM kernels" in text
    assert "GPU X, driver 1, torch t" in text
    assert "sync" not in text.split("linear_head:")[1]  # executor rows stay out of the engine table


def test_no_section_without_files(tmp_path: Path) -> None:
    assert heads_results.SECTION.lines(tmp_path) == []
