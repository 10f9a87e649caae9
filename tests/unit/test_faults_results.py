"""The faults driver's tallies, memory and metrics readers, and its printed lines, from a small file."""

from __future__ import annotations

import json
from pathlib import Path

from inflight.lab import faults

FIXTURE = Path(__file__).parent / "fixtures" / "faults.json"


def test_tally_counts_every_kind_and_keeps_the_messages() -> None:
    out = [
        faults.Outcome(0.0, 0.1, 200, None),
        faults.Outcome(0.2, 1.2, 500, "HTTP 500: stub not healthy"),
        faults.Outcome(0.3, 30.3, None, "lost: no answer within 30 s"),
        faults.Outcome(0.4, 0.4, None, None, dropped=True),
        faults.Outcome(5.0, 5.1, None, "connection: ConnectionRefusedError: refused"),
    ]
    t = faults.tally(out, fault_at=1.0)
    assert (t["sent"], t["answered"], t["failed"], t["lost"], t["dropped"]) == (5, 1, 2, 1, 1)
    assert t["failures_by_status"] == {"500": 1, "no HTTP status": 1}
    assert t["failures_by_kind"] == {"HTTP 500: stub not healthy": 1, "connection: ConnectionRefusedError: refused": 1}
    # done before the fault: the first only (the second ended after it; the dropped one is not counted)
    assert (t["sent_before_fault"], t["answered_before_fault"]) == (1, 1)
    assert abs(t["slowest_s"] - 30.0) < 1e-9
    assert t["lost_sent_after_fault"] == 0  # the lost one was sent before the fault
    late = faults.tally([*out, faults.Outcome(2.5, 32.5, None, "lost: no answer within 30 s")], fault_at=1.0)
    assert late["lost"] == 2 and late["lost_sent_after_fault"] == 1


def test_rss_is_flat_only_within_the_bound() -> None:
    flat = faults.rss_flat({"m_0_0": [400.0] * 6 + [410.0] * 6 + [415.0] * 6})
    assert flat["flat"] and flat["stubs"]["m_0_0"]["growth_mib"] == 15.0
    grew = faults.rss_flat({"m_0_0": [400.0] * 6, "m_0_1": [400.0, 401.0, 402.0, 430.0, 431.0, 432.0]})
    assert not grew["flat"] and grew["stubs"]["m_0_1"]["growth_mib"] == 31.0
    assert not faults.rss_flat({})["flat"]  # no samples: not shown flat


def test_samples_reads_the_metrics_of_one_model() -> None:
    text = "\n".join(
        [
            "# HELP inflight_in_flight Batches in flight",
            'inflight_in_flight{instance="m_0_0",model="m",pid="7"} 0',
            'inflight_in_flight{instance="m_0_1",model="m",pid="8"} 4',
            'inflight_in_flight{instance="x_0_0",model="x",pid="9"} 1',
            'nv_inference_pending_request_count{model="m",version="1"} 2',
        ]
    )
    assert faults.samples(text, "inflight_in_flight", "m") == {"instance=m_0_0,pid=7": 0.0, "instance=m_0_1,pid=8": 4.0}
    assert faults.samples(text, "nv_inference_pending_request_count", "m") == {"": 2.0}


def test_the_driver_prints_one_line_per_fault_of_its_file() -> None:
    doc = json.loads(FIXTURE.read_text())
    lines = faults.section_rows(doc)
    assert len(lines) == len(doc["faults"]) == 4
    first = doc["faults"][0]
    assert lines[0].startswith(f"({first['fault']}) {first['name']}: sent {first['sent']}, ")
    assert all(", lost " in line and "; recovered " in line for line in lines)


def test_a_sitting_records_its_host_versions_and_configuration(tmp_path: Path) -> None:
    """``faults.json`` opens with the host (the load test's device record), the versions and the configuration."""
    cfg = faults.FaultConfig(repository=tmp_path / "repo", workdir=tmp_path / "work", server_cpus="0")
    doc = json.loads(faults.run_sitting(cfg, tmp_path / "out", keys=[]).read_text())
    assert doc["faults"] == [] and doc["config"]["serve_model_arg"] == cfg.spec
    host = doc["host"]
    assert host["cpu_count"] >= 1 and host["device"] == host["device_info"]["name"]
    assert doc["cpu_sets"] == {"client": host["client_cpus"], "server": "0"} and host["client_cpus"][0].isdigit()
    want = {"python", "torch", "numpy", "tritonclient", "inflight", "nvidia_pytriton", "git_commit"}
    assert want <= set(doc["versions"]), doc["versions"]
