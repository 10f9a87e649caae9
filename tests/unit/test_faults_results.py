"""The faults driver's tallies and the RESULTS "Faults" section, from a small file and from the committed sittings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from inflight.lab import faults
from inflight.lab.sections import faults as faults_section

ROOT = Path(__file__).resolve().parents[2]
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


def test_the_section_renders_each_fault_from_the_file(tmp_path: Path) -> None:
    sitting = tmp_path / "results" / "faults" / "20990101-test"
    sitting.mkdir(parents=True)
    shutil.copy(FIXTURE, sitting / "faults.json")
    text = "\n".join(faults_section.SECTION.lines(tmp_path))
    assert "## Faults under load" in text and "results/faults/20990101-test/faults.json" in text
    rows = [line for line in text.splitlines() if line.startswith("| (")]
    assert len(rows) == 4
    a, b, c, d = (line.split(" | ") for line in rows)
    assert a[3:7] == ["101", "40", "61", "0"]  # sent, answered, failed, lost
    assert "61 x connection: ConnectionRefusedError" in a[8] and a[9].startswith("yes (a new inflight serve; 8/8")
    assert b[6] == "13" and "Stub process" in b[8] and b[9].startswith("yes (unload and reload failed")
    assert c[3:7] == ["300", "200", "100", "0"] and "100 x HTTP 404" in c[8]
    assert d[7] == "2" and d[8] == "none" and "400 -> 402; 401 -> 450 MiB (NOT flat)" in d[11]
    did = next(line for line in text.splitlines() if line.startswith("What Triton did on (b)"))
    assert "did not restart it" in did and "13 requests got neither" in did and "in-flight gauge: 4 batch(es)" in did
    assert "exit code 1 and a new one answered 8/8 correctly" in did


def test_no_sitting_no_section(tmp_path: Path) -> None:
    assert faults_section.SECTION.lines(tmp_path) == []


def test_the_results_page_holds_the_current_section() -> None:
    files = faults_section.sittings(ROOT / "results")
    assert files, "no sitting under results/faults"
    # a sitting may hold some of the faults (a device call's time ran out); the CPU host's holds all four
    for path in files:
        doc = json.loads(path.read_text())
        assert doc["faults"] and {f["fault"] for f in doc["faults"]} <= set(faults.FAULTS), path
    cpu = [json.loads(p.read_text()) for p in files if p.parent.name.endswith("-cpu")]
    assert cpu and {f["fault"] for f in cpu[-1]["faults"]} == set(faults.FAULTS)
    section = "\n".join(faults_section.SECTION.lines(ROOT))
    assert section and section in (ROOT / "docs" / "RESULTS.md").read_text()
