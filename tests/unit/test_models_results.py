"""summary.json's "models" block and RESULTS' section, from the committed all-MiniLM-L6-v2 sitting."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from inflight.lab.sections import models as models_section

ROOT = Path(__file__).resolve().parents[2]
SITTING = ROOT / "results" / "models" / "20261127-h100-minilm"


def test_the_models_block_and_section_come_from_the_sittings_files(tmp_path: Path) -> None:
    shutil.copytree(SITTING, tmp_path / "results" / "models" / SITTING.name)
    (tmp_path / "results" / "summary.json").write_text(json.dumps({"modes": {"kept": True}}))
    block = models_section.SECTION.write_summary(tmp_path)
    assert block is not None
    m = block["minilm"]
    assert set(m) == {"device", "fp32_cosine_min", "fp16_cosine_min", "text_cosine_min", "load_s"}
    assert m["device"].startswith("NVIDIA") and m["fp32_cosine_min"] >= 0.9999 and m["text_cosine_min"] >= 0.9999
    assert m["fp16_cosine_min"] >= 0.999 and m["load_s"] > 0
    doc = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert doc["modes"] == {"kept": True} and doc["models"] == block  # the other keys are kept
    lines = "\n".join(models_section.SECTION.lines(tmp_path))
    assert "## A user's model: all-MiniLM-L6-v2" in lines
    assert "| >= 2,000 |" in lines  # every rate met the SLO: a lower bound, said as one
    assert lines.count("| text |") == 5 and "unpadded launches" in lines  # 3 CPU rows, 2 served runs


def test_nothing_is_written_without_both_the_cpu_check_and_the_gpu_figures(tmp_path: Path) -> None:
    d = tmp_path / "results" / "models" / "x"
    d.mkdir(parents=True)
    shutil.copy(SITTING / "minilm-fp16.jsonl", d)
    assert models_section.SECTION.write_summary(tmp_path) is None
    assert not (tmp_path / "results" / "summary.json").exists()
