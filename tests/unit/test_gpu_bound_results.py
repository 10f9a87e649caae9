"""Issue 53's report: capacity per round from a served file's windows, and the committed sittings' summary."""

from __future__ import annotations

import json
from pathlib import Path

from inflight.lab import gpu_bound_results as g
from inflight.lab.sections import decision, glance

ROOT = Path(__file__).resolve().parents[2]


def _run(label: str, rnd: int, rate: float, p99: float) -> dict[str, object]:
    return {"variant": label, "round": rnd, "rate": rate, "latency_ms": {"p99": p99}, "valid": True}


def test_a_rounds_capacity_is_the_highest_rate_up_to_which_every_window_met_the_slo() -> None:
    doc = {
        "runs": [
            _run("A", 1, 1000, 20),
            _run("A", 1, 3000, 80),
            _run("A", 1, 5000, 190),
            _run("A", 2, 1000, 20),
            _run("A", 2, 3000, 120),  # missed: 5,000 meeting it after does not count
            _run("A", 2, 5000, 90),
            _run("A", 3, 1000, 150),
        ]
    }
    assert g.capacity_per_round(doc, "A", 100.0) == [3000, 1000, 0]


def test_the_committed_sittings_give_the_summary_block_from_their_files() -> None:
    assert g.variants(ROOT), "results/gpu-bound has no served file"
    e = g.engine(ROOT)
    assert e is not None
    served = e["served"]
    assert served["uniform"]["tokens_per_s"] > 1e6 and served["unpadded"]["tokens_per_s"] > 0
    rows = decision.decision_rows(ROOT)
    assert rows[0] == decision.ROWS_BEGIN and rows[-1] == decision.ROWS_END and len(rows) == 5
    readme = (ROOT / "README.md").read_text()
    assert "\n".join(rows) in readme, "README's GPU-bound rows are stale: run `inflight results-report`"


def test_the_default_as_built_is_the_newest_sittings_unchanged_variant_and_its_capture_gives_the_activity() -> None:
    vs = g.variants(ROOT)
    default = g.default_as_built(vs)
    assert default is not None and set(default["overrides"]) <= g.AS_BUILT_KEYS
    # the newest sitting with an as-built variant, by the time it ran (not by file name); instances=1 and
    # delay_us= variants are configurations beside it, not the default
    built = [v for v in vs if v["kind"] == "inflight" and set(v["overrides"]) <= g.AS_BUILT_KEYS]
    assert len(built) > 1 and default is built[-1]
    assert not [v for v in built if "instances" in v["overrides"] or "delay_us" in v["overrides"]]
    pair = g.one_instance_pair(vs)
    assert pair is not None and pair[0]["path"] == pair[1]["path"]
    assert pair[0]["kind"] == "inflight" and pair[1]["kind"] == "sync"
    assert default["delay_us"] > 500  # the build's measured batcher delay, not Triton's usual
    caps = g.nsys_captures(ROOT)
    assert {"sync1", "auto1"} <= {c["name"] for c in caps}
    by_name = {c["name"]: c for c in caps}
    assert by_name["sync1"]["rate"] == by_name["auto1"]["rate"] == 1500  # equal load
    assert all(0 < c["gpu_activity"] <= 1 and 0 <= c["sync_share"] <= 1 for c in caps)
    summary = json.loads((ROOT / "results" / "summary.json").read_text())["gpu_bound"]
    newest = [c for c in caps if c["name"].startswith("default")][-1]
    assert summary["gpu_activity"] == newest["gpu_activity"] and summary["gpu_activity_at_rps"] == newest["rate"]


def test_the_headline_judges_each_target_of_the_block() -> None:
    block = {
        "engine_tokens_per_s": 16.4e6,
        "engine_mixed_over_uniform": 0.94,
        "served_capacity_rps": 5000.0,
        "engine_bound_rps": 6579.0,
        "gpu_activity": 0.81,
        "gpu_activity_at_rps": 4500.0,
        "one_instance_pipelined_over_sync": None,
        "default_over_best": 0.8,
        "default_oom_failures": 0,
        "plain_rps": 1000.0,
    }
    rows = {r[0]: r[1:] for r in glance.gpu_bound_rows(block)}
    assert rows["engine, fp16, [2048, 64] (tokens/s)"][2] == "met"
    assert rows["best served capacity at p99 <= 100 ms / engine bound"][:1] == ["76%"]
    assert rows["best served capacity at p99 <= 100 ms / engine bound"][2] == "**missed**"
    assert rows["GPU activity of the default as built (nsys, 4,500 req/s)"][2] == "**missed**"
    assert rows["one auto instance / one sync instance at the SLO"] == ["n/a", ">= 1.3x", "n/a"]
    assert rows["requests failed for GPU memory, default as built"][2] == "met"
    # the default's own capacity (0.8 x 5,000) over plain's: 4.0x, under 5x
    assert rows["default as built / plain Python backend at the SLO"] == ["4.0x", ">= 5x", "**missed**"]
    assert glance.gpu_bound_rows(None) == []
