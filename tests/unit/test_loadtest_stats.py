"""Unit tests of the A/B figures: statistics deltas, exact percentiles, Locust files, the report.

The fixtures under ``fixtures/`` were recorded from real runs on the CPU host (tritonserver 2.51 from
the nvidia-pytriton wheel, Locust 2.47): ``ab-smoke.json`` is the JSON ``inflight ab bert_tiny_sync
bert_tiny_inflight@slots=2 --users 20 --items 4 --seq-len 16 --window 10 --warmup 2 --check`` wrote,
``model-stats-*.json`` are its statistics snapshots, ``locust-A-r1_*.csv`` and ``locust-clean.log``
its Locust output for A, ``locust-cpu-warning.log`` a real Locust run whose users burned the CPU,
``locust-404_failures.csv`` a run against a model that was not loaded, and
``metrics-bert_tiny_inflight.txt`` the metrics endpoint under load.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inflight.errors import ConfigError
from inflight.loadtest import executor_stats, prometheus, report, report_plots, report_tables
from inflight.loadtest import stats as st
from inflight.loadtest.runner.document import attach_served, finite
from inflight.loadtest.runner.window import progress_time

FIXTURES = Path(__file__).parent / "fixtures"


def snapshots(model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    d = json.loads((FIXTURES / f"model-stats-{model}.json").read_text())
    return d["before"], d["after"]


def recorded() -> dict[str, Any]:
    return json.loads((FIXTURES / "ab-smoke.json").read_text())


# -- statistics deltas ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["bert_tiny_sync", "bert_tiny_inflight"])
def test_delta_of_recorded_snapshots(model: str) -> None:
    before, after = snapshots(model)
    d = st.stats_delta(before, after)

    def diff(*path: str) -> int:
        a, b = after, before
        for k in path:
            a, b = a[k], b[k]
        return int(a) - int(b)

    ok = diff("inference_stats", "success", "count")
    assert d.requests == ok > 0
    assert d.failures == diff("inference_stats", "fail", "count") == 0
    assert d.inferences == diff("inference_count")
    assert d.executions == diff("execution_count") > 0
    assert d.avg_batch_items == pytest.approx(d.inferences / d.executions)
    assert d.avg_batch_requests == pytest.approx(ok / d.executions)
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        expected = diff("inference_stats", phase, "ns") / diff("inference_stats", phase, "count") / 1e3
        assert getattr(d, f"{phase}_us") == pytest.approx(expected)
    # every request carried the same number of items (the load test sends --items 4)
    assert d.inferences == 4 * d.requests
    # the phases are parts of the request's time in the server
    assert d.queue_us + d.compute_input_us + d.compute_infer_us + d.compute_output_us <= d.request_us * 1.01


def test_delta_agrees_with_locust() -> None:
    doc = recorded()
    for run in doc["runs"]:
        d = st.stats_delta(run["stats_before"], run["stats_after"])
        assert d.to_dict() == pytest.approx(run["server"], nan_ok=True)
        # the server also saw the ramp and the requests in flight at the stop; Locust counts after the reset
        assert run["locust"]["requests"] <= d.requests <= run["locust"]["requests"] * 1.05


def test_delta_rejects_reload_and_other_model() -> None:
    before, after = snapshots("bert_tiny_sync")
    with pytest.raises(st.StatsError, match=r"went backwards.*reloaded"):
        st.stats_delta(after, before)
    _, other = snapshots("bert_tiny_inflight")
    with pytest.raises(st.StatsError, match="different models"):
        st.stats_delta(before, other)


def test_empty_window_gives_nan_times() -> None:
    before, _ = snapshots("bert_tiny_sync")
    d = st.stats_delta(before, before)
    assert d.requests == d.executions == 0
    assert math.isnan(d.queue_us) and math.isnan(d.avg_batch_items)


def test_sum_breakdowns_weights_by_requests() -> None:
    parts = [st.stats_delta(*snapshots(m)) for m in ("bert_tiny_sync", "bert_tiny_inflight")]
    total = st.sum_breakdowns(parts)
    assert total.requests == sum(p.requests for p in parts)
    assert total.executions == sum(p.executions for p in parts)
    assert total.avg_batch_items == pytest.approx(sum(p.inferences for p in parts) / total.executions)
    expected = sum(p.queue_us * p.requests for p in parts) / total.requests
    assert total.queue_us == pytest.approx(expected)
    assert st.sum_breakdowns(parts[:1]) == parts[0]
    with pytest.raises(st.StatsError):
        st.sum_breakdowns([])


# -- exact percentiles ---------------------------------------------------------------------------


def test_exact_percentiles_nearest_rank() -> None:
    a = np.arange(1.0, 101.0)
    np.random.default_rng(0).shuffle(a)
    assert st.exact_percentiles(a) == {"p50": 50.0, "p95": 95.0, "p99": 99.0}
    assert st.exact_percentiles(np.array([7.25]))["p99"] == 7.25
    assert all(math.isnan(v) for v in st.exact_percentiles(np.empty(0)).values())


@pytest.mark.parametrize("n", [1, 2, 3, 10, 999, 1000, 1001, 54321])
def test_exact_percentiles_match_definition(n: int) -> None:
    lat = np.random.default_rng(n).lognormal(3.0, 1.0, n)
    s = np.sort(lat)
    for q in (50.0, 95.0, 99.0, 99.9, 100.0):
        rank = max(1, math.ceil(q / 100.0 * n))  # smallest value with >= q% of requests at or below it
        assert st.exact_percentiles(lat, [q])[f"p{q:g}"] == s[rank - 1]
        assert np.mean(lat <= s[rank - 1]) >= q / 100.0


def test_exact_percentiles_versus_locust_rounding() -> None:
    for run in recorded()["runs"]:
        lat, locust = run["latency_ms"], run["locust"]
        assert lat["count"] == locust["requests"]
        # below 100 ms Locust rounds every response time to a whole millisecond before its percentiles
        assert abs(lat["p50"] - locust["p50_ms"]) <= 1.0
        assert lat["p50"] != locust["p50_ms"]
        assert lat["curve"]["50"] == lat["p50"] and lat["curve"]["100"] == lat["max"]


def test_raw_latency_files(tmp_path: Path) -> None:
    parts = [np.random.default_rng(i).random(100 + i) * 50 for i in range(3)]
    for i, p in enumerate(parts):
        p.astype("<f8").tofile(tmp_path / f"latencies-host-{i}.f64")
    got = st.read_raw_latencies(tmp_path)
    assert np.array_equal(np.sort(got), np.sort(np.concatenate(parts)))
    summary = st.latency_summary(got)
    assert summary["count"] == got.size and summary["max"] == got.max()
    with pytest.raises(st.StatsError, match="--raw-latency-dir"):
        st.read_raw_latencies(tmp_path / "none")


# -- Locust output ---------------------------------------------------------------------------------


def test_cpu_warning_detected_in_real_log() -> None:
    lines = st.cpu_warnings((FIXTURES / "locust-cpu-warning.log").read_text())
    assert any("CPU usage above 90%" in line for line in lines)
    assert any("exceeded cpu threshold" in line for line in lines)


def test_no_cpu_warning_in_clean_log() -> None:
    assert st.cpu_warnings((FIXTURES / "locust-clean.log").read_text()) == []


def test_locust_csv_files_agree_with_recorded_run() -> None:
    run = recorded()["runs"][0]
    figures = st.read_locust_stats(FIXTURES / "locust-A-r1_stats.csv")
    assert figures == pytest.approx(run["locust"])
    history = st.read_locust_history(FIXTURES / "locust-A-r1_stats_history.csv")
    assert finite(history) == run["history"]  # the JSON holds null where the CSV gives NaN
    assert history[-1]["total_requests"] == figures["requests"]
    # the counted throughput at the end of the window is close to Locust's average rate
    assert history[-1]["rps_counted"] == pytest.approx(figures["rps"], rel=0.3)
    assert st.current_rps(FIXTURES / "locust-A-r1_stats_history.csv") == history[-1]["rps_counted"]
    assert st.read_locust_failures(FIXTURES / "locust-A-r1_failures.csv") == []
    with pytest.raises(st.StatsError, match="Locust wrote no statistics"):
        st.read_locust_stats(FIXTURES / "missing_stats.csv")


def test_failure_messages_are_unwrapped() -> None:
    (top,) = st.read_locust_failures(FIXTURES / "locust-404_failures.csv")
    assert top["error"].startswith("HTTP 404: Request for unknown model")
    assert "is the model loaded" in top["error"] and top["occurrences"] > 0
    assert st.read_locust_failures_by_status(FIXTURES / "locust-404_failures.csv") == {"HTTP 404": top["occurrences"]}
    assert st.read_locust_failures_by_status(FIXTURES / "locust-A-r1_failures.csv") == {}


def test_failures_are_counted_per_http_status() -> None:
    from inflight.loadtest.checks import failure_status, failures_by_status

    assert failure_status("HTTP 400: inference input 'input_ids' data-type is 'INT32'") == "HTTP 400"
    assert failure_status("gRPC INVALID_ARGUMENT: expected 2 inputs") == "gRPC INVALID_ARGUMENT"
    assert failure_status("no HTTP response: ConnectionRefusedError(111)") == "other"
    assert failure_status("undecodable response (ValueError: x)") == "other"
    assert failure_status("wrong output: HTTP 400: quoted") == "other"  # only a message that starts with it
    counts = [("HTTP 500: a", 2), ("HTTP 400: b", 3), ("HTTP 400: c", 4), ("timed out", 1)]
    assert list(failures_by_status(counts).items()) == [("HTTP 400", 7), ("HTTP 500", 2), ("other", 1)]


# -- metrics endpoint ------------------------------------------------------------------------------


def test_metric_values_from_recorded_endpoint() -> None:
    text = (FIXTURES / "metrics-bert_tiny_inflight.txt").read_text()
    assert len(prometheus.metric_values(text, "inflight_in_flight", "bert_tiny_inflight")) == 1
    assert prometheus.metric_values(text, "inflight_in_flight", "bert_tiny_sync") == []
    # histogram series (_count/_sum/_bucket) are not the metric itself
    assert prometheus.metric_values(text, "inflight_batch_size", "bert_tiny_inflight") == []
    # no cupti=true on the CPU host: the GPU gauges are absent
    assert st.gpu_gauges(text, "bert_tiny_inflight") == {"gpu_activity": None, "sync_share": None}
    assert st.summarize_gauge([None, None]) == "not available"


def test_gpu_gauges_read_like_any_gauge() -> None:
    # the recorded in-flight gauge line, renamed to the GPU gauges the backend publishes with cupti=true
    text = (FIXTURES / "metrics-bert_tiny_inflight.txt").read_text()
    line = next(x for x in text.splitlines() if x.startswith("inflight_in_flight{"))
    value = float(line.rsplit(" ", 1)[1])
    fake = "\n".join(
        [line.replace("inflight_in_flight", name) for name in st.GPU_GAUGES.values()]
        + [line.replace("inflight_in_flight", "inflight_gpu_activity").replace("_0_0", "_1_0")]
    )
    assert st.gpu_gauges(fake, "bert_tiny_inflight") == {"gpu_activity": value, "sync_share": value}
    assert st.summarize_gauge([value, None, value / 2]) == {
        "mean": pytest.approx(0.75 * value),
        "min": value / 2,
        "max": value,
        "n": 2,
    }


# -- the report ------------------------------------------------------------------------------------


def test_report_from_recorded_json(tmp_path: Path) -> None:
    src = tmp_path / "ab-smoke.json"
    shutil.copy(FIXTURES / "ab-smoke.json", src)
    md, images = report.write_report(src)
    assert md == tmp_path / "ab-smoke.md"
    assert sorted(p.name for p in images) == ["ab-smoke-latency.png", "ab-smoke-throughput.png"]
    for p in images:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    text = md.read_text()
    doc = recorded()
    a, b = doc["summary"]
    assert "**Status: valid**" in text
    assert f"| A: `{a['spec']}` | B: `{b['spec']}` | B/A |" in text
    assert (
        f"| req/s | {report_tables._fmt(a['rps'])} | {report_tables._fmt(b['rps'])} | {b['rps'] / a['rps']:.2f}x |"
        in text
    )
    assert f"| p99 latency (ms, exact) | {a['latency_ms']['p99']:.2f} | {b['latency_ms']['p99']:.2f} |" in text
    assert "| GPU activity | not available | not available | n/a |" in text
    assert "tritonserver 2.51.0" in text and "Locust" in text
    assert "exact (nearest rank)" in text
    assert "![ab-smoke-throughput](ab-smoke-throughput.png)" in text
    # regenerating gives the same report
    assert report.write_report(src)[0].read_text() == text


SERVED_LOG = (
    'I1125 10:39:49.261815 6880 log.py:34] "[inflight.runtime.triton_model] bert_tiny_sync (bert_tiny_sync_0_0): '
    'sync mode, 1 slot(s); torch.export engine on CPU (fp32, eager, 2 threads); 0 CUDA graph(s); ready in 5.3 s"\n'
)


def test_report_configuration_follows_what_the_instances_reported() -> None:
    """A CPU instance runs fp32 without graphs: the report must not say precision=fp16, cuda_graphs=true."""
    doc = recorded()
    v = doc["variants"][0]
    v["model_name"] = "bert_tiny_sync"
    v["config"]["parameters"] = {
        "precision": {"string_value": "fp16"},
        "cuda_graphs": {"string_value": "true"},
        "slots": {"string_value": "4"},
    }
    attach_served(doc, SERVED_LOG)
    assert v["served"] == [
        "bert_tiny_sync_0_0: sync mode, 1 slot(s); torch.export engine on CPU (fp32, eager, 2 threads); "
        "0 CUDA graph(s); ready in 5.3 s"
    ]
    text = report.markdown(doc)
    served_at = text.index("  - served as (its instances at load, server log): bert_tiny_sync_0_0: sync mode")
    config_at = text.index("  - configuration: instances=")
    assert served_at < config_at
    config = text[config_at:].splitlines()[0]
    assert "slots=4" in config
    assert config.endswith(
        "(on the CPU, as its instances reported, so not in effect: cuda_graphs=true, precision=fp16)"
    )
    assert "precision=fp16, " not in config.split(" (on the CPU")[0]
    # a variant with no load line says so instead of assuming
    assert "  - served as: not reported at load" in text


def test_runs_table_says_what_each_rate_was_counted_over() -> None:
    doc = recorded()
    text = report_tables.runs_table(doc)
    for r in doc["runs"]:
        span = r["locust"]["requests"] / r["locust"]["rps"]
        assert f"| {report_tables._fmt(r['locust']['requests'], 0)} | {report_tables._fmt(span, 1)} |" in text
    assert "compare req/s, not request counts" in text
    assert report_tables.counted_span_s({"requests": 10, "rps": 0}) is None


def test_report_counts_failures_per_status() -> None:
    doc = recorded()
    run = doc["runs"][0]
    run["failures_by_status"] = {"HTTP 400": 7, "HTTP 500": 2, "other": 1}
    run["failure_messages"] = [{"error": "HTTP 400: b", "occurrences": 4}]
    text = report.markdown(doc)
    assert "## Failures" in text and "Triton counts its own refusals in no statistic or metric" in text
    assert f"- {run['variant']} round {run['round']}: HTTP 400: 7, HTTP 500: 2, other: 1" in text
    assert f"- {run['variant']} round {run['round']}: 4 x HTTP 400: b" in text


def test_report_marks_invalid_runs(tmp_path: Path) -> None:
    doc = recorded()
    warning = st.cpu_warnings((FIXTURES / "locust-cpu-warning.log").read_text())[0]
    doc["valid"] = False
    doc["problems"] = [f"A round 1: Locust's CPU was above 90%: {warning!r}"]
    text = report.markdown(doc)
    assert "**Status: INVALID**" in text and "CPU usage above 90%" in text


def test_gpu_plot_only_with_gauges(tmp_path: Path) -> None:
    doc = recorded()
    assert report_plots.plot_gpu(doc, tmp_path / "gpu.png") is None
    samples = [0.5, 0.75, 1.0]  # what the runner keeps of gauge samples, here for two variants
    for s in doc["summary"]:
        s["gpu_activity"] = st.summarize_gauge(samples)
        s["sync_share"] = st.summarize_gauge([1 - x for x in samples])
    assert report_plots.plot_gpu(doc, tmp_path / "gpu.png") == tmp_path / "gpu.png"
    assert "| GPU activity | 75.0% | 75.0% | 1.00x |" in report.markdown(doc)


def test_report_rejects_other_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        report.load(tmp_path / "none.json")
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(ConfigError, match="not an A/B result"):
        report.load(other)


def test_executor_counters_from_a_real_server_log_go_to_the_right_runs() -> None:
    """Two lines of a real tritonserver log (H200): bert_tiny_sync then bert_tiny_inflight, one instance each."""
    from inflight.loadtest.executor_stats import executor_stats_from_log
    from inflight.loadtest.stats import attach_executor_stats

    text = (FIXTURES / "finalize-lines.log").read_text()
    recs = executor_stats_from_log(text + "\nunrelated line\n")
    assert [r["model"] for r in recs] == ["bert_tiny_sync", "bert_tiny_inflight"]
    assert all(r["drained"] for r in recs)
    sync, pipe = (r["stats"] for r in recs)
    doc = {
        "variants": [
            {"label": "A", "config": {"instance_group": [{"count": 1}]}},
            {"label": "B", "config": {"instance_group": [{"count": 1}]}},
        ],
        # runs in the opposite order of the log, to check matching by model name
        "runs": [
            {"variant": "B", "model_name": "bert_tiny_inflight"},
            {"variant": "A", "model_name": "bert_tiny_sync"},
        ],
        "summary": [{"variant": "A"}, {"variant": "B"}],
    }
    assert attach_executor_stats(doc, text) == 2
    a = doc["summary"][0]["executor"]
    b = doc["summary"][1]["executor"]
    assert a["batches"] == sync["batches"] and a["max_depth"] == 1 and a["send_call_us_per_response"] is None
    assert a["execute_ms"] == pytest.approx(sync["execute_s"] / sync["executes"] * 1e3)
    assert b["gather_ms"] == pytest.approx(pipe["gather_s"] / pipe["batches"] * 1e3)
    assert b["send_call_us_per_response"] == pytest.approx(pipe["send_call_s"] / pipe["responses"] * 1e6)
    assert b["max_depth"] == max(int(k) for k in pipe["depth_launches"])


def test_executor_breakdown_takes_the_longest_stall_over_instances_and_sums_the_rest() -> None:
    def record(execute_max: float, gc_max: float, gc_s: float) -> dict[str, Any]:
        stats = {"batches": 10, "requests": 20, "executes": 10, "execute_s": 0.03, "execute_max_ms": execute_max}
        stats |= {"executes_over_10ms": 1, "gc_max_ms": gc_max, "gc_s": gc_s, "gc_gen2": 1}
        return {"model": "m", "instance": "i", "drained": True, "stats": stats}

    got = executor_stats.executor_breakdown([record(12.0, 3.0, 0.002), record(40.0, 1.0, 0.004)])
    assert got is not None
    assert got["execute_max_ms"] == 40.0 and got["gc_max_ms"] == 3.0
    assert got["executes_over_10ms"] == 2 and got["gc_gen2"] == 2
    assert got["gc_ms_per_execute"] == pytest.approx(6.0 / 20)
    old = record(1.0, 1.0, 0.0)
    for k in ("execute_max_ms", "executes_over_10ms", "gc_max_ms", "gc_s", "gc_gen2"):
        del old["stats"][k]
    got = executor_stats.executor_breakdown([old])  # records of an older backend: the keys are None
    assert got is not None and got["execute_max_ms"] is None and got["gc_ms_per_execute"] is None
    assert got["wait_max_ms"] is None and got["publish_max_ms"] is None and got["metric_calls_per_execute"] is None
    assert got["slot_us"] is None and got["auto_policy_us"] is None


def test_executor_breakdown_gives_what_autos_in_band_path_adds_per_batch_and_per_execute() -> None:
    def record(slot_s: float, policy_s: float) -> dict[str, Any]:
        stats = {"batches": 100, "requests": 800, "executes": 100, "slot_s": slot_s, "auto_policy_s": policy_s}
        return {"model": "m", "instance": "i", "drained": True, "stats": stats}

    got = executor_stats.executor_breakdown([record(0.0011, 0.0015), record(0.0009, 0.0017)])
    assert got is not None
    assert got["slot_us"] == pytest.approx(0.002 / 200 * 1e6)  # 10 us a batch
    assert got["auto_policy_us"] == pytest.approx(0.0032 / 200 * 1e6)  # 16 us an execute
    sync = executor_stats.executor_breakdown([record(0.0006, 0.0)])
    assert sync is not None and sync["slot_us"] == pytest.approx(6.0) and sync["auto_policy_us"] is None


def test_executor_breakdown_gives_each_steps_longest_and_the_metrics_cost() -> None:
    """Where an execute() over 10 ms went: each step's longest over the instances, and the publications' share."""

    def record(parse: float, launch: float, publish_max: float) -> dict[str, Any]:
        stats = {"batches": 10, "requests": 20, "executes": 10, "parse_max_s": parse, "launch_max_s": launch}
        stats |= {"gather_max_s": 0.001, "wait_max_s": 0.002, "build_max_s": 0.0005}
        stats |= {"metric_calls": 6, "publish_s": 0.004, "publish_max_ms": publish_max}
        return {"model": "m", "instance": "i", "drained": True, "stats": stats}

    got = executor_stats.executor_breakdown([record(0.0105, 0.004, 7.7), record(0.003, 0.0147, 2.5)])
    assert got is not None
    assert got["parse_max_ms"] == pytest.approx(10.5) and got["launch_max_ms"] == pytest.approx(14.7)
    assert got["gather_max_ms"] == pytest.approx(1.0) and got["build_max_ms"] == pytest.approx(0.5)
    assert got["publish_max_ms"] == 7.7
    assert got["metric_calls_per_execute"] == pytest.approx(12 / 20) and got["publish_ms_per_execute"] == 0.4


def test_executor_breakdown_sums_auto_choices_and_averages_its_gauges() -> None:
    def record(reference: int, no_gain: int, deferred: int, gain: float) -> dict[str, Any]:
        stats = {"batches": 100, "requests": 400, "executes": 100, "auto_inline": 100 - reference - no_gain - deferred}
        stats |= {"auto_reference": reference, "auto_no_gain": no_gain, "auto_deferred": deferred}
        stats |= {"auto_bound": 1.5, "auto_gain": gain}
        return {"model": "m", "instance": "i", "drained": True, "stats": stats}

    got = executor_stats.executor_breakdown([record(10, 80, 0, 0.9), record(10, 0, 60, 1.3)])
    assert got is not None
    assert (got["auto_reference"], got["auto_no_gain"], got["auto_deferred"]) == (20, 80, 60)
    assert got["auto_inline"] == 200 - 20 - 80 - 60
    assert got["auto_gain"] == pytest.approx(1.1) and got["auto_bound"] == pytest.approx(1.5)
    # a record of the rule before the probe (2026-11-26) has none of the new keys
    got = executor_stats.executor_breakdown(
        [{"model": "m", "instance": "i", "drained": True, "stats": {"batches": 5, "auto_explored": 2}}]
    )
    assert got is not None and got["auto_explored"] == 2 and got["auto_no_gain"] == 0 and got["auto_gain"] is None


def test_stalls_table_lists_each_asyncio_window() -> None:
    run = {
        "variant": "A",
        "rate": 40000.0,
        "latency_ms": {"p50": 6.04, "p99": 83.6},
        "server": {"request_us": 4470.0, "queue_us": 350.0},
        "generator_run": {
            "connection_waits": 12,
            "generator_gc": {"max_ms": 1.5},
            "stalls": {
                "sources": 11,
                "slow_bins": 30,
                "slow_bins_most_sources": 25,
                "slow_bins_one_source": 2,
                "silent_episodes": {"count": 3, "longest_ms": 90.0},
            },
        },
    }
    table = report.stalls_table({"runs": [run, {"variant": "B", "rate": 1.0, "generator_run": None}]})
    header = next(ln for ln in table.splitlines() if ln.startswith("| variant"))
    rule = next(ln for ln in table.splitlines() if ln.startswith("|---"))
    row = next(ln for ln in table.splitlines() if ln.startswith("| A "))
    assert header.count("|") == rule.count("|") == row.count("|")
    assert "| A | 40,000 | 6.0 | 83.6 | 4.47 | 0.35 | 30 | 25 | 2 | 3 | 90 | 1.5 | 12 | n/a | - |" in table
    run["cpu"] = {
        "host_steal": 0.125,
        "threads": {"busiest": [["tritonserver/http", 0.97], ["stub/python", 0.5]], "over_80": 1},
    }
    assert "| 12 | 12.5% | tritonserver/http 97%, stub/python 50%; 1 over 80% |" in report.stalls_table({"runs": [run]})
    assert report.stalls_table({"runs": [{"variant": "B", "generator_run": {}}]}) == ""


def test_progress_line_counts_locust_start_up_in_the_plan() -> None:
    """The demo once read "15s / 11s": the elapsed time included Locust's start-up, the plan did not."""
    line = progress_time(15.0, 10.0, 1.0)
    assert line == "15s of about 15s (Locust start-up ~4s, ramp-up 1s, window 10s)"
    assert progress_time(5.0, 10.0, 1.0).startswith("5s of about 15s")
    late = progress_time(19.0, 10.0, 1.0)
    assert late.startswith("19s, past the planned 15s (") and late.endswith("waiting for Locust to finish")


def test_gpu_activity_by_gpu_keeps_each_servers_gpus_apart() -> None:
    """Each server's instances report their GPU (label ``gpu``): the window keeps one activity per server and GPU."""
    from inflight.loadtest.prometheus import means_by_label
    from inflight.loadtest.runner.window import _by_gpu

    def text(*rows: tuple[str, str, float]) -> str:
        return "\n".join(
            f'inflight_gpu_activity{{model="{m}",instance="{m}_0_{i}",pid="1",gpu="{g}"}} {v}'
            for i, (m, g, v) in enumerate(rows)
        )

    one = text(("m", "0", 0.9), ("m", "0", 0.7), ("m", "1", 0.5), ("other", "1", 0.1))
    assert means_by_label(one, "inflight_gpu_activity", "m", "gpu") == pytest.approx({"0": 0.8, "1": 0.5})
    two = text(("m", "0", 0.95))
    assert _by_gpu([one, None, two], "m") == {
        "gpu_activity_by_gpu": pytest.approx({"0:0": 0.8, "0:1": 0.5, "2:0": 0.95})
    }
    assert _by_gpu(['inflight_batches_total{model="m"} 3'], "m") == {}  # no gauges (cupti off): no key


def test_the_steps_table_shows_each_ensemble_steps_window_and_nothing_without_one() -> None:
    """A text ensemble's runs carry ``steps`` (tokenizer, encoder); the report tabulates them per run, in order."""
    tok = {"queue_us": 120.0, "compute_infer_us": 950.0, "avg_batch_requests": 1.5}
    enc = {"queue_us": 3100.0, "compute_infer_us": 8700.0, "avg_batch_requests": 14.5}
    runs = [
        {"variant": "A", "round": 1, "steps": {"m_tokenizer": tok, "m_inflight": enc}},
        {"variant": "B", "round": 1},
        {"variant": "A", "round": 2, "steps": {"m_tokenizer": {"error": "statistics of different models"}}},
    ]
    text = report_tables.steps_table({"runs": runs})
    rows = [line for line in text.splitlines() if line.startswith("| 1 ") or line.startswith("| 3 ")]
    assert rows == [
        "| 1 | A (round 1) | `m_tokenizer` | 120.0 | 950.0 | 1.5 |  |",
        "| 1 | A (round 1) | `m_inflight` | 3,100 | 8,700 | 14.5 |  |",
        "| 3 | A (round 2) | `m_tokenizer` | n/a | n/a | n/a | statistics of different models |",
    ]
    assert report_tables.steps_table({"runs": runs[1:2]}) == ""
