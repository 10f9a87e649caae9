"""Freeze the closed questions' sections into docs/RESULTS-archive.md (issue 52, item 5): run once, at this commit.

``.venv/bin/python scripts/lab/freeze_archive.py`` renders them with the generators of this commit, records what
they read (``inflight.lab.archive.freeze``) and checks it. The next commit deletes the generators and this script.
"""

import subprocess
import sys

sys.path.insert(0, "src")
from pathlib import Path

from inflight.lab import archive
from inflight.lab.sections import (
    cost,
    engine,
    faults,
    four_gpu,
    glance,
    heads,
    many_instances,
    modes,
    one_instance,
    open_loop,
    two_gpu,
)

root = Path(".")
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
data = glance.collect(root)
data["summary"] = {k: v for k, v in data["summary"].items() if k != "gpu_bound"}
lines = glance.render(data)
rows = []
for line in lines:
    if line.startswith("| ") and not line.startswith("| area |"):
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 6, cells
        rows.append(cells)
print(len(rows), "glance rows;", sum(r[4] == "met" for r in rows), "met")
summary_keys = [
    "device",
    "pipelined_over_sync_items_per_s",
    "pipelined_gpu_temporal_activity",
    "pipelined_fraction_of_engine_bound",
    "pipelined_p99_ms",
    "sync_p99_ms",
    "detail",
    "open_loop",
    "cpu_per_request",
    "modes",
    "two_gpu",
    "four_gpu",
]
folders = [
    "open-loop",
    "two-gpu",
    "four-gpu",
    "modes",
    "faults",
    "cpu-cost",
    "engine_bench.json",
    "engine-heads",
    "per-instance-ceiling",
    "pipelined-ceiling",
]
page = archive.freeze(
    root,
    [
        open_loop.SECTION,
        modes.SECTION,
        faults.SECTION,
        cost.SECTION,
        two_gpu.SECTION,
        four_gpu.SECTION,
        engine.SECTION,
        heads.SECTION,
        one_instance.SECTION,
        many_instances.SECTION,
    ],
    folders=folders,
    summary_keys=summary_keys,
    glance_rows=rows,
    commit=commit,
)
print(page, len(page.read_text().splitlines()), "lines;", len(archive.manifest(root)["files"]), "files")
print(archive.check(root))
