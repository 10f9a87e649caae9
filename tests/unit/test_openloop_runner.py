"""The open-loop parts of the A/B runner and its report, on synthetic window records."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from inflight.errors import ConfigError
from inflight.loadtest import openloop as ol
from inflight.loadtest import presets, report
from inflight.loadtest.runner.config import Endpoints, round_order
from inflight.loadtest.runner.document import SCHEMA, finite, open_loop_points, soak_summary
from inflight.loadtest.runner.plan import locust_command
from inflight.loadtest.runner.window import generator_limited, rate_point


def _record(
    rate: float,
    p99: float,
    *,
    answered: float = 1.0,
    very_late: float = 0.0,
    rss: int = 100 << 20,
    failures: int = 0,
    rnd: int = 1,
) -> dict[str, Any]:
    requests = int(rate * 10)
    return {
        "rate": rate,
        "round": rnd,
        "valid": True,
        "client_limited": False,
        "locust": {"requests": requests, "failures": failures, "rps": rate},
        "latency_ms": {"p50": p99 / 4, "p95": p99 / 2, "p99": p99},
        "generator": {
            "achieved_rps": rate * answered,
            "answered_fraction": answered,
            "late_fraction": very_late * 2,
            "very_late_fraction": very_late,
            "span_s": 10.0,
        },
        "server": {"avg_batch_requests": rate / 1000, "avg_batch_items": rate / 20},
        "cpu": {"server_cores": 2.0, "server_us_per_request": 300.0, "host_busy": 0.2, "client_busy": 0.3},
        "stub_memory": {"stubs": 4, "rss_bytes": rss},
    }


def test_rate_point_uses_the_generators_counts() -> None:
    p = rate_point(_record(4000, 12.0, answered=0.95))
    assert (p.offered_rps, p.p99_ms, p.answered_fraction) == (4000, 12.0, 0.95)
    assert p.achieved_rps == pytest.approx(3800)
    assert ol.slo_failures(p, 50) == [
        "95.0% of the requests due were answered in the window (< 98%; achieved 3,800 of 4,000 req/s)"
    ]
    # an older record without the generator's counts: Locust's rate, less its failures
    rec = _record(4000, 12.0)
    rec["generator"] = {}
    rec["locust"] = {"requests": 1000, "failures": 100, "rps": 4000}
    assert rate_point(rec).achieved_rps == pytest.approx(3600)


def test_generator_limited_by_very_late_sends_or_locusts_cpu_warning() -> None:
    assert not generator_limited(_record(1000, 5, very_late=0.009))
    assert generator_limited(_record(1000, 5, very_late=0.02))
    rec = _record(1000, 5)
    rec["client_limited"] = True
    assert generator_limited(rec)


def test_open_loop_points_sorted_by_rate_with_their_figures() -> None:
    recs = [_record(3000, 80), _record(1000, 5), {"variant": "A"}, _record(2000, 9)]
    for r in recs:
        if "rate" in r:
            r["slo_misses"] = ol.slo_failures(rate_point(r), 50)
    rows = open_loop_points(recs)
    assert [r["offered_rps"] for r in rows] == [1000, 2000, 3000]
    assert rows[2]["slo_misses"] and not rows[0]["slo_misses"]
    assert rows[0]["server_us_per_request"] == 300.0 and rows[0]["client_busy"] == 0.3


def test_soak_summary_compares_first_and_last_windows() -> None:
    ok = [_record(13000, 13.0 + 0.1 * i, rss=(100 << 20) + i * 1000) for i in range(5)]
    s = soak_summary(ok)
    assert s is not None and s["windows"] == 5 and s["passed"] and s["p99_steady"] and s["memory_flat"]
    assert s["p99_change"] == pytest.approx(13.4 / 13.0 - 1)
    grows = [_record(13000, 13.0, rss=(100 << 20) * (1 + i // 4)) for i in range(5)]  # last window 2x the first
    g = soak_summary(grows)
    assert g is not None and not g["memory_flat"] and not g["passed"]
    slow = [_record(13000, 13.0), _record(13000, 20.0)]  # +54% p99
    assert soak_summary(slow)["p99_steady"] is False  # type: ignore[index]
    failing = [_record(13000, 13.0), _record(13000, 13.0, failures=1)]
    assert soak_summary(failing)["passed"] is False  # type: ignore[index]
    assert soak_summary([_record(1000, 5), _record(2000, 5)]) is None  # a sweep, no repeated rate


def test_locust_command_for_an_open_loop_window(tmp_path: Path) -> None:
    shape = presets.smoke().replace(users=4, processes=4, rate=12000.0, arrival="constant", max_connections=64)
    cmd = locust_command(
        locustfile=tmp_path / "locustfile.py",
        shape=shape,
        model="bert_tiny_null",
        endpoints=Endpoints(http="127.0.0.1:8000", grpc="127.0.0.1:8001", metrics="m"),
        duration_s=8,
        pool_file=tmp_path / "pool.npz",
        repository=tmp_path,
    )
    joined = " ".join(cmd)
    for part in ("--rate 12000", "--arrival constant", "--max-connections 64", "--check-every 16", "-u 4"):
        assert part in joined
    assert cmd[-1] == "OpenLoopHttpUser"
    checked = locust_command(
        locustfile=tmp_path / "l.py",
        shape=shape.replace(check=True),
        model="bert_tiny_sync",
        endpoints=Endpoints(http="h:1", grpc="h:2", metrics="m"),
        duration_s=8,
        pool_file=tmp_path / "pool.npz",
        repository=tmp_path,
    )
    assert "--check-every 1" in " ".join(checked)  # --check decodes every answer


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"rate": -1.0}, "--rate"),
        ({"arrival": "bursty"}, "--arrival"),
        ({"max_connections": 0}, "--max-connections"),
        ({"check_every": 0}, "--check-every"),
    ],
)
def test_open_loop_shape_is_checked(changes: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        presets.smoke().replace(**changes).check_values()


def _doc(tmp_path: Path) -> Path:
    sweep_a = [_record(r, p) for r, p in ((1000, 4.0), (2000, 5.0), (4000, 6.0))]
    sweep_b = [_record(r, p, very_late=v) for r, p, v in ((1000, 4.0, 0), (2000, 70.0, 0), (4000, 900.0, 0.05))]
    for r in sweep_a + sweep_b:
        r["slo_misses"] = ol.slo_failures(rate_point(r), 50)
        r["generator_limited"] = generator_limited(r)
    summary = []
    for label, spec, recs in (("A", "bert_tiny_null", sweep_a), ("B", "bert_tiny_sync@instances=8", sweep_b)):
        rows = open_loop_points(recs)
        points = [rate_point(r) for r in recs]
        cap = ol.capacity_of(points, 50)
        summary.append(
            {
                "variant": label,
                "spec": spec,
                "model_name": spec.split("@")[0],
                "sweep": rows,
                "capacity_rps": cap,
                "capacity_upper_rps": None if label == "A" else 2000,
                "capacity_bounded": label == "B",
                "comparable": True,
                "rps": math.nan,
                "latency_ms": {},
                "requests": 1,
                "failures": 0,
            }
        )
    doc = {
        "schema": SCHEMA,
        "id": "ab-test",
        "valid": True,
        "variants": [
            {"label": s["variant"], "spec": s["spec"], "model_name": s["model_name"], "config": {}} for s in summary
        ],
        "runs": [{**r, "variant": "A"} for r in sweep_a] + [{**r, "variant": "B"} for r in sweep_b],
        "summary": summary,
        "load": {
            **presets.smoke().to_dict(),
            "closed_loop": False,
            "user_class": "OpenLoopHttpUser",
            "open_loop": {
                "slo_p99_ms": 50.0,
                "rate_tolerance": 0.02,
                "max_late_fraction": 0.01,
                "late_threshold_ms": 2.0,
                "limit_late_ms": 10.0,
            },
            "cpu_sets": ol.split_cpus(range(32)).to_dict(),
        },
    }
    path = tmp_path / "ab-test.json"
    path.write_text(json.dumps(finite(doc)))
    return path


def test_report_has_the_capacity_table_the_sweep_and_the_latency_plot(tmp_path: Path) -> None:
    md_path, images = report.write_report(_doc(tmp_path))
    md = md_path.read_text()
    assert "## Open loop: capacity at p99 <= 50 ms" in md
    assert "| A: `bert_tiny_null` | 4,000 (at least) | - | yes |" in md
    assert "| B: `bert_tiny_sync@instances=8` | 1,000 | 2,000 | yes |" in md
    assert (
        "| B | 4,000 | 4,000 | 100.0% | 225.00 | 450.00 | 900.00 | 0 | 4.0 | 2.00 | "
        "10.0% (generator-limited) | missed |" in md
    )
    assert "open loop, poisson arrivals from 20 sources" in md
    assert "server on cores 0-15, load generator on cores 16-31" in md
    plot = tmp_path / "ab-test-open-loop.png"
    assert plot in images and plot.read_bytes()[:4] == b"\x89PNG"


def test_rounds_reverse_the_variant_order_every_other_round() -> None:
    assert round_order(["A", "B", "C"], 1) == [(0, "A"), (0, "B"), (0, "C")]
    got = round_order(["A", "B"], 4)
    assert [v for _, v in got] == ["A", "B", "B", "A", "A", "B", "B", "A"]
    assert [r for r, _ in got] == [0, 0, 1, 1, 2, 2, 3, 3]
    # with an even number of rounds each variant runs first as often as last
    firsts = [got[i][1] for i in range(0, len(got), 2)]
    assert firsts.count("A") == firsts.count("B")


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"repeat": 0}, r"--repeat 0: run each variant at least once"),
        ({"rates": [100.0], "rate_repeat": 0}, r"--rate-repeat 0: measure each rate at least once"),
        ({"rates": [100.0], "slo_ms": 0.0}, r"--slo 0.0: give a p99 latency SLO > 0 milliseconds"),
        ({"search": (500.0, 100.0)}, r"--search 500,100: give LOW,HIGH requests per second with 0 < LOW < HIGH"),
        ({"rates": [100.0], "generator": "zmq"}, r"--generator 'zmq': choose one of locust, asyncio"),
        ({"generator": "asyncio"}, r"the asyncio generator sends open-loop load only"),
        ({"shape": presets.smoke().replace(users=0)}, r"--users 0: run at least one user"),
    ],
)
def test_the_configuration_checks_itself_when_made(changes: dict[str, Any], fragment: str) -> None:
    from inflight.loadtest.runner.config import AbConfig

    # no variant is resolved and no repository read: the configuration alone is wrong
    base: dict[str, Any] = {"variants": ["bert_tiny_null"], "shape": presets.smoke(), "repository": Path("nowhere")}
    with pytest.raises(ConfigError, match=fragment):
        AbConfig(**{**base, **changes})
    AbConfig(**base)  # the same without the change is accepted
