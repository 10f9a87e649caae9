"""Issue 53's report: capacity per round from a served file's windows, and the committed sittings' summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inflight.lab import gpu_bound_results as g
from inflight.lab.sections import decision, glance

ROOT = Path(__file__).resolve().parents[2]


def _run(label: str, rnd: int, rate: float, p99: float, answered: float = 1.0) -> dict[str, object]:
    gen = {"achieved_rps": answered * rate, "answered_fraction": answered, "late_fraction": 0.0}
    return {"variant": label, "round": rnd, "rate": rate, "latency_ms": {"p99": p99}, "valid": True, "generator": gen}


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


def test_a_window_whose_backlog_grew_misses_the_slo_whatever_its_p99_as_the_runner_judges_it() -> None:
    # 5,000 answered 80% of the requests due: the runner's rule (openloop.slo_failures) misses it, so the lab does
    doc = {"runs": [_run("A", r, 3000, 20) for r in (1, 2, 3)] + [_run("A", r, 5000, 60, 0.8) for r in (1, 2, 3)]}
    assert g.capacity_per_round(doc, "A", 100.0) == [3000, 3000, 3000]


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
    # delay_us= variants are configurations beside it, not the default, and so is an import that asked its batch
    built = [v for v in vs if g.as_built(v)]
    assert len(built) > 1 and default is built[-1]
    assert not [v for v in built if "instances" in v["overrides"] or "delay_us" in v["overrides"]]
    # 2026-11-29 afternoon: the import asked no batch and the rule took 2,048; the 512 import beside it asked its own
    assert default["spec"].startswith("minilm_inflight@") and default["max_batch"] == 2048
    assert g.imported_batch_asked(default["path"], "minilm") == (True, None)
    beside = [v for v in vs if v["path"] == default["path"] and v["kind"] == "inflight" and v is not default]
    assert [v["max_batch"] for v in beside] == [g.DEFAULT_MAX_BATCH_SIZE] and not g.as_built(beside[0])
    # sittings that recorded no import ran when the importer's default was 512: an import of 2,048 then was asked
    unrecorded = [v for v in vs if v["kind"] == "inflight" and not g.imported_batch_asked(v["path"], "minilm")[0]]
    assert {v["max_batch"] for v in unrecorded if g.as_built(v)} == {g.DEFAULT_MAX_BATCH_SIZE}
    assert any(v["max_batch"] == 2048 and not g.as_built(v) for v in unrecorded)  # minilm2k
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
    # the activity is the capture of the summary's own GPU at the highest rate its generator held, or none: no
    # figure of another card, and none of a server saturated under the profiler (2026-11-28 23:43: the default at
    # 5,600 req/s, 34% of sends over 10 ms late, 100% busy)
    saturated = [c for c in caps if not g.kept_schedule(c)]
    assert saturated and all(c["very_late_fraction"] > 0.01 for c in saturated)
    assert all(g.kept_schedule(c) for c in caps if c["very_late_fraction"] is None)
    mine = [
        c
        for c in caps
        if c["device"] in (summary["device"], None) and c["very_late_fraction"] is not None and g.kept_schedule(c)
    ]
    if mine:
        top = max(c["rate"] for c in mine)
        chosen = [c for c in mine if c["rate"] == top][-1]
        assert summary["gpu_activity"] == chosen["gpu_activity"] and summary["gpu_activity_at_rps"] == top
        assert summary["gpu_activity_capture"].endswith("/" + chosen["name"])
    else:
        assert summary["gpu_activity"] is None and summary["gpu_activity_at_rps"] is None


def _doc(
    started: str, device: str, variants: list[dict[str, object]], runs: list[dict[str, object]]
) -> dict[str, object]:
    return {
        "started": started,
        "device": {"name": device},
        "load": {"open_loop": {"slo_p99_ms": 100.0}, "cpu_sets": {"server": "0-7", "client": "8-15"}},
        "variants": variants,
        "runs": runs,
    }


def _variant(label: str, spec: str, kind: str, max_batch: int, **overrides: str) -> dict[str, object]:
    config = {"max_batch_size": max_batch, "instance_group": [{"count": 8}], "dynamic_batching": {}}
    return {"label": label, "spec": spec, "variant": kind, "overrides": overrides, "config": config}


def test_figures_of_two_gpus_are_never_pooled_and_the_default_is_the_importers_batch(tmp_path: Path) -> None:
    h100 = _doc(
        "2026-11-28T08:00:00",
        "H100",
        [_variant("A", "m_inflight", "inflight", 512), _variant("B", "m_sync@instances=1", "sync", 512, instances="1")],
        [_run("A", 1, 9000, 20), _run("B", 1, 3000, 20)],
    )
    h200 = _doc(
        "2026-11-28T10:00:00",
        "H200",
        [
            _variant("A", "m_inflight", "inflight", 512),
            _variant("B", "m2k_inflight", "inflight", 2048),
            _variant("C", "m_sync@instances=1", "sync", 512, instances="1"),
        ],
        [_run("A", r, 5000, 20) for r in (1, 2, 3)]
        + [_run("B", r, 5500, 20) for r in (1, 2)]
        + [_run("C", 1, 2000, 20), _run("C", 1, 2400, 150)],
    )
    for name, doc in (("a/ab-1.json", h100), ("b/interrupted-ab-2.json", h200)):
        f = tmp_path / "results" / "gpu-bound" / name
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps(doc))
    vs = g.variants(tmp_path)
    assert len(vs) == 5, "an interrupted run's file counts with the rounds it finished"
    mine = g.on_device(vs)
    assert {v["device"] for v in mine} == {"H200"} and len(mine) == 3
    # the H100's 9,000 is not the best of the H200's sitting
    assert g.pick(mine, "inflight")["capacity"] == 5500
    # the 2,048-sequence import is a configuration beside the default, not the default
    default = g.default_as_built(mine)
    assert default is not None and default["spec"] == "m_inflight" and default["capacity"] == 5000
    sync = g.pick(mine, "sync")
    assert sync is not None and sync["capacity"] == 2000 and sync["bounded"] and sync["top"] == 2400
    # the default's top is its own highest rate (5,000: unbounded), not the sitting's (5,500)
    assert not default["bounded"]


def test_the_headline_judges_each_target_of_the_block() -> None:
    block = {
        "engine_tokens_per_s": 16.4e6,
        "engine_mixed_over_uniform": 0.94,
        "served_capacity_rps": 5000.0,
        "engine_bound_rps": 6579.0,
        "gpu_activity": 0.81,
        "gpu_activity_at_rps": 4500.0,
        "gpu_activity_capture": "s/default4500",
        "one_instance_pipelined_over_sync": None,
        "default_over_best": 0.8,
        "default_oom_failures": 0,
        "plain_rps": 1000.0,
    }
    rows = {r[0]: r[1:] for r in glance.gpu_bound_rows({**block, "device": "NVIDIA H100 80GB HBM3"})}
    assert rows["engine, fp16, [2048, 64] (tokens/s, NVIDIA H100 80GB HBM3)"][2] == "met"
    assert rows["best served capacity at p99 <= 100 ms / engine bound"][:1] == ["76%"]
    assert rows["best served capacity at p99 <= 100 ms / engine bound"][2] == "**missed**"
    label = "GPU activity at the highest rate a capture held (nsys, `s/default4500`, 4,500 req/s)"
    assert rows[label][2] == "**missed**"
    assert rows["one auto instance / one sync instance at the SLO"] == ["n/a", ">= 1.3x", "n/a"]
    # a measured pair names the import's batch it ran at (the default's 512 and 2,048 differ: 1.14x and 1.67x)
    paired = {**block, "one_instance_pipelined_over_sync": 1.67, "one_instance_max_batch": 2048}
    rows2 = {r[0]: r[1:] for r in glance.gpu_bound_rows(paired)}
    label = "one auto instance / one sync instance at the SLO (max_batch_size 2,048)"
    assert rows2[label] == ["1.67x", ">= 1.3x", "met"]
    assert rows["requests failed for GPU memory, default as built"][2] == "met"
    # the default's own capacity (0.8 x 5,000) over plain's: 4.0x, under 5x
    assert rows["default as built / plain Python backend at the SLO"] == ["4.0x", ">= 5x", "**missed**"]
    # no text sitting: its row says so; with one, its best capacity over the same engine bound
    assert rows["the same requests as text: best capacity at p99 <= 100 ms / engine bound"] == ["n/a", ">= 85%", "n/a"]
    text = {"best_rps": 4500.0, "tokenizer_bound_rps": 6000.0}
    rows = {r[0]: r[1:] for r in glance.gpu_bound_rows({**block, "text": text})}
    want = (
        "the same requests as text: best capacity at p99 <= 100 ms / engine bound (tokenizing's own bound: 6,000 req/s)"
    )
    assert rows[want] == ["68%", ">= 85%", "**missed**"]  # 4,500 / 6,579
    # a sitting that held none of its rates reads 0%, and says why (not a text path that answers nothing)
    rows = {r[0]: r[1:] for r in glance.gpu_bound_rows({**block, "text": {**text, "best_rps": 0.0}})}
    assert rows[want] == ["0% (its newest as-built sitting held none of the rates it tried)", ">= 85%", "**missed**"]
    assert glance.gpu_bound_rows(None) == []


def test_the_text_path_bound_is_reported_apart_and_never_ranked_as_a_configuration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``minilm_text@encoder=minilm_null`` answers without the GPU: its capacity is the text path's bound."""
    sitting = tmp_path / "results" / "gpu-bound-text" / "s"

    def v(spec: str, overrides: dict[str, str], cap: float, kind: str = "inflight") -> dict[str, Any]:
        return {
            "path": sitting / "ab.json",
            "spec": spec,
            "overrides": overrides,
            "capacity": cap,
            "capacities": [cap] * 3,
            "device": "NVIDIA H200",
            "kind": kind,
            "bounded": kind != "null",  # the null variants met the SLO at every rate tried
        }

    built = v("minilm_text@capture_at_load=false", {"capture_at_load": "false"}, 4500.0)
    tuned = v("minilm_text@tokenizer_instances=4", {"tokenizer_instances": "4"}, 4800.0)
    path = v("minilm_text@encoder=minilm_null", {"encoder": "minilm_null"}, 7000.0, kind="null")
    # another real encoder in the step's place is a configuration like any other
    sync = v("minilm_text@encoder=minilm_sync", {"encoder": "minilm_sync"}, 3900.0, kind="sync")
    null = v("minilm_null@rates=1000", {"rates": "1000"}, 9000.0, kind="null")
    monkeypatch.setattr(g, "variants", lambda root, folder: [built, tuned, path, sync, null])
    monkeypatch.setattr(g, "tokenizer_bounds", lambda root: [])
    got = g.text_summary(tmp_path)
    assert got is not None
    assert (got["capacity_rps"], got["best_rps"], got["text_path_bound_rps"]) == (4500.0, 4800.0, 7000.0)
    assert got["text_path_bound_is_lower"] is True
    label = [r[0] for r in glance.gpu_bound_rows({"engine_bound_rps": 6916.0, "text": got}) if "as text" in r[0]]
    assert label and "the null model as encoder: >= 7,000 req/s" in label[0]
    # without the bound's variant: none; with no text configuration but the bound and the null model: no best
    monkeypatch.setattr(g, "variants", lambda root, folder: [built, tuned, sync])
    assert g.text_summary(tmp_path)["text_path_bound_rps"] is None  # type: ignore[index]
    monkeypatch.setattr(g, "variants", lambda root, folder: [path, null])
    assert g.text_summary(tmp_path)["best_rps"] is None  # type: ignore[index]


def test_a_newer_sitting_of_other_splits_alone_leaves_the_text_row_to_the_last_as_built_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A sitting that served only other tokenizer/encoder splits is an experiment: the row keeps the as-built one."""
    root = tmp_path / "results" / "gpu-bound-text"

    def v(sitting: str, spec: str, overrides: dict[str, str], cap: float, kind: str = "inflight") -> dict[str, Any]:
        return {
            "path": root / sitting / "ab.json",
            "spec": spec + "".join(f"@{k}={x}" for k, x in overrides.items()),
            "overrides": overrides,
            "capacity": cap,
            "capacities": [cap] * 3,
            "device": "NVIDIA H200",
            "kind": kind,
            "bounded": kind != "null",
        }

    older = v("1400", "minilm_text", {"capture_at_load": "false"}, 4500.0)
    path = v("1400", "minilm_text", {"encoder": "minilm_null"}, 5900.0, kind="null")
    built = v("1800", "minilm_text", {"capture_at_load": "false"}, 5200.0)
    four = v("1800", "minilm_text", {"tokenizer_instances": "4"}, 4000.0)
    six = v("1808", "minilm_text", {"instances": "6"}, 4100.0)
    # the token path's as-built encoder in the newest sitting is not the ensemble as built
    encoder = v("1808", "minilm_inflight", {}, 6000.0)
    newer_path = v("1810", "minilm_text", {"encoder": "minilm_null"}, 6500.0, kind="null")
    monkeypatch.setattr(g, "tokenizer_bounds", lambda root: [])
    monkeypatch.setattr(g, "variants", lambda root, folder: [older, path, built, four, six, encoder, newer_path])
    got = g.text_summary(tmp_path)
    assert got is not None
    assert (got["capacity_rps"], got["best_rps"]) == (5200.0, 5200.0)  # the newest as-built sitting, not the oldest
    assert got["text_path_bound_rps"] == 6500.0  # the path's bound of the newest sitting that ran it
    # with no as-built sitting at all, the newest sitting is still read (and has no as-built figure)
    monkeypatch.setattr(g, "variants", lambda root, folder: [four, six, encoder])
    got = g.text_summary(tmp_path)
    assert got is not None and (got["capacity_rps"], got["best_rps"]) == (None, 4100.0)


def test_a_tie_in_capacity_goes_to_the_variant_that_held_it_in_more_rounds() -> None:
    """minilm2k at 2 and at 8 instances both reached 5,600 (2026-11-28); the 2-instance one missed it in a round."""
    two = {"kind": "inflight", "capacity": 5600.0, "capacities": [5600.0, 0.0, 5600.0]}
    eight = {"kind": "inflight", "capacity": 5600.0, "capacities": [5600.0, 5600.0, 5600.0]}
    lower = {"kind": "inflight", "capacity": 5300.0, "capacities": [5300.0, 5300.0, 5300.0, 5300.0]}
    assert g.pick([two, eight, lower], "inflight") is eight
    assert g.pick([eight, two], "inflight") is eight
    assert g.pick([lower], "sync") is None


def test_a_variant_an_interrupted_run_never_reached_is_left_out(tmp_path: Path) -> None:
    """The 18:55 probe's time limit cut its run before the second variant's first window: it measured nothing."""
    name = "20261129-1855-h200-minilm-text-pipelined-probe/interrupted-ab-20261129-185541.json"
    src = ROOT / "results" / g.TEXT_FOLDER / name
    dst = tmp_path / "results" / g.TEXT_FOLDER / name
    dst.parent.mkdir(parents=True)
    dst.write_bytes(src.read_bytes())
    assert len(json.loads(src.read_text())["variants"]) == 2
    got = g.variants(tmp_path, g.TEXT_FOLDER)
    assert [v["spec"] for v in got] == ["minilm_text@capture_at_load=false,mode=pipelined"]
    assert got[0]["capacities"] == [0.0]  # one window, p99 361 ms: it held nothing, which is a measurement


def _engine_row(variant: str, tokens_per_s: float) -> dict[str, object]:
    timed = {"seconds": 1.0, "real_tokens": 1, "tokens_per_s": tokens_per_s}
    return {"variant": variant, "uniform": timed, "mixed": timed, "unpadded": timed, "cosine_min_vs_fp32": 0.9997}


def test_the_engine_table_shows_the_newest_fp8_rows_and_a_real_checkpoints_fp8_cost(tmp_path: Path) -> None:
    from inflight.lab.sections import gpu_bound

    shape = {"layers": 6, "hidden": 384, "heads": 12, "ffn": 1536}
    for folder, variants in (
        ("engine-minilm-1", [_engine_row("fp8", 1.0e6), _engine_row("served", 2.0e6)]),
        ("engine-minilm-2", [_engine_row("served", 17.0e6), _engine_row("fp8", 16.0e6)]),
    ):
        f = tmp_path / "results" / folder / "encoder-engine-x.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps({"device": "H200", "shape": shape, "rows": 2048, "variants": variants}))
    cost = {"cosine_min": 0.99, "cosine_mean": 0.997, "same_nearest_neighbour": 0.92}
    acc = {"checkpoint": "/x/ckpt/model", "texts": {"calibration": 5, "evaluated": 6}, "fp8": cost}
    (tmp_path / "results" / "engine-minilm-2" / "fp8-accuracy-cpu.json").write_text(json.dumps(acc))
    e = g.engine(tmp_path)
    assert e is not None and set(e["fp8"]) == {"fp8"} and e["fp8"]["fp8"]["uniform"]["tokens_per_s"] == 16.0e6
    data = gpu_bound.collect(tmp_path)
    assert data is not None
    text = "\n".join(gpu_bound.render(data))
    assert "| fp8, calibrated scales (`fp8`) | 16.00M |" in text, "the newest file's fp8 row"
    assert "per-call scales" not in text, "a variant never measured has no row"
    assert "`fp8` cosine min 0.990000, mean 0.997000, the same nearest other text for 92%" in text
    assert "6 sentences" in text and "`ckpt`" in text
