"""The four-GPU block and section (issue 54) from a dry run of scripts/lab/four_gpu.sh on the CPU host.

The fixture is that run's two files as the script packs them (bert_tiny on the CPU, two fake GPUs, SLO 2,000 ms:
``MODEL=bert_tiny ... RATES1=4 RATES4=8 NULL_RATES=40 WINDOW=3 ROUNDS=1 SLO=2000``, the script header's line).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from inflight.lab.four_gpu_results import summary
from inflight.lab.sections import four_gpu

FIXTURE = Path(__file__).parent / "fixtures" / "four-gpu-dry"


def _fixture_copy(tmp_path: Path) -> tuple[Path, dict[str, Any], str, str]:
    """The fixture copied to ``tmp_path``: its per-GPU servers' file, that file's document, and the labels of the
    four-GPU variant and of the one-GPU one (``via=gpu0``)."""
    shutil.copytree(FIXTURE, tmp_path, dirs_exist_ok=True)
    (path,) = tmp_path.rglob("perserver/ab-*.json")
    doc = json.loads(path.read_text())
    four = next(v["label"] for v in doc["variants"] if v["spec"].endswith("rates=8"))
    one = next(v["label"] for v in doc["variants"] if "via=gpu0" in v["spec"])
    return path, doc, four, one


def test_the_block_reads_one_gpu_four_gpus_the_layouts_and_the_null_model_by_route() -> None:
    block = summary(FIXTURE)
    assert block is not None
    assert (block["one_gpu_rps"], block["four_gpu_rps"], block["four_over_one"]) == (4.0, 8.0, 2.0)
    assert block["layout"] == "per-gpu servers behind nginx" and not block["target_met"]
    assert block["one_gpu"]["route"] == "gpu0" and block["device"] == "cpu" and block["slo_p99_ms"] == 2000.0
    assert set(block["per_layout"]) == {"per-gpu servers behind nginx", "one server over the GPUs"}
    assert block["per_layout"]["one server over the GPUs"]["layout"] == "one-server"
    assert set(block["null_model"]) == {"balancer", "direct"} and block["generator_verified_rps"] == 40.0
    assert block["gpu_activity_min"] is None and block["instance_gauge_min"] is None  # no CUPTI on the CPU
    assert block["per_layout"]["per-gpu servers behind nginx"]["nginx_cores"] is not None
    assert block["one_gpu"]["nginx_cores"] is None and block["null_model"]["direct"]["nginx_cores"] is None
    text = "\n".join(four_gpu.SECTION.lines(FIXTURE))
    assert text.startswith("## Four GPUs against one") and "**missed**" in text and "not measured" in text


def test_the_instances_gauge_is_reported_as_such_and_never_as_the_gpus_activity(tmp_path: Path) -> None:
    path, doc, four, one = _fixture_copy(tmp_path)
    for r in doc["runs"]:  # what a window of the GPU host records with cupti=true
        if r["variant"] == four:
            r["gpu_activity_by_gpu"] = {"0:0": {"mean": 0.95}, "1:0": {"mean": 0.85}}
        if r["variant"] == one:  # server 1 idled under via=gpu0 and kept its last value
            r["gpu_activity_by_gpu"] = {"0:0": {"mean": 0.5}, "1:0": {"mean": 0.85}}
    path.write_text(json.dumps(doc))
    block = summary(tmp_path)
    assert block is not None and block["instance_gauge_min"] == pytest.approx(0.85)
    assert block["gpu_activity_min"] is None  # eight processes' gauges on a GPU are not its activity
    assert block["per_layout"]["per-gpu servers behind nginx"]["instance_gauge_by_gpu"] == {"0:0": 0.95, "1:0": 0.85}
    assert block["one_gpu"]["instance_gauge_by_gpu"] == {"0:0": 0.5}
    assert block["one_gpu"]["server_cpus"] == doc["server"]["per_gpu_servers"][0]["cpus"]
    text = "\n".join(four_gpu.SECTION.lines(tmp_path))
    assert "**not measured**" in text and "0:0 95.0%, 1:0 85.0%" in text


def test_the_gpus_activity_is_nvidia_smis_utilization_where_the_windows_sampled_it(tmp_path: Path) -> None:
    path, doc, four, one = _fixture_copy(tmp_path)
    for r in doc["runs"]:  # what a window records on a host with nvidia-smi (inflight.loadtest.gpu_util)
        if r["variant"] in (four, one):
            busy = {"0": 0.97, "1": 0.93} if r["variant"] == four else {"0": 0.96, "1": 0.0}
            r["gpu_util"] = {"source": "nvidia-smi", "by_gpu": {g: {"mean": m} for g, m in busy.items()}}
    path.write_text(json.dumps(doc))
    block = summary(tmp_path)
    assert block is not None and block["gpu_activity_min"] == pytest.approx(0.93)
    assert block["one_gpu"]["util_by_gpu"] == {"0": 0.96}  # its own GPU, not the idle one
    text = "\n".join(four_gpu.SECTION.lines(tmp_path))
    assert "the least busy GPU 93.0% by nvidia-smi (met)" in text and "GPU 0 97.0%, GPU 1 93.0%" in text


def test_no_sitting_no_block(tmp_path: Path) -> None:
    assert summary(tmp_path) is None
    assert four_gpu.SECTION.lines(tmp_path) == []
