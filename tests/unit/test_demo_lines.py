"""The demo explains its pipelined / sync ratio from the run's own CPU figures."""

from __future__ import annotations

from typing import Any

from inflight.cli.measure import demo_ratio_lines


def _doc(busy: float, isolated: bool) -> dict[str, Any]:
    def s(spec: str, rps: float) -> dict[str, Any]:
        cpu = {
            "server_cores": 1.2,
            "server_us_per_request": 900.0,
            "other_cores": 0.7,
            "host_cores": 2,
            "host_busy": busy,
        }
        return {"spec": spec, "rps": rps, "cpu": cpu}

    sets = {"isolated": isolated, "server": "0-15" if isolated else "", "client": "16-31" if isolated else ""}
    return {"summary": [s("bert_tiny_sync", 100.0), s("bert_tiny_inflight", 260.0)], "load": {"cpu_sets": sets}}


def test_shared_busy_cores_make_the_ratio_a_smoke_check() -> None:
    lines = demo_ratio_lines(_doc(0.97, isolated=False))
    assert lines[0] == "pipelined / sync: 2.60x"
    assert "the server used 1.20 cores (900 us of CPU per request), the rest (Locust, the runner) 0.70" in lines[1]
    assert "2 cores were 97% busy" in lines[1]
    assert "Locust shared the server's cores and kept them busy" in lines[-1]
    assert "not what pipelining gains" in lines[-1]


def test_isolated_or_idle_cores_say_so() -> None:
    assert "Locust on 16-31" in demo_ratio_lines(_doc(0.97, isolated=True))[-1]
    assert "not saturated" in demo_ratio_lines(_doc(0.3, isolated=False))[-1]
    assert demo_ratio_lines({"summary": [], "load": {}}) == []
