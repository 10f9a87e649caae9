"""RESULTS-ab-runs' "Above capacity: where the p99 goes" section, from ``results/stalls``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inflight.lab.sections import Section
from inflight.lab.sections.one_instance import read_runs
from inflight.loadtest import report

TITLE = "Above capacity: where the p99 goes"

#: Folder of the stall diagnoses (open-loop windows above capacity, with the generator's timeline).
STALLS_DIR = "stalls"


def collect(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Each A/B file under ``results/stalls`` (its path from ``root``) and its document."""
    return read_runs(root, STALLS_DIR)


def render(runs: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """Above capacity: where each diagnosed window's slow answers came from, one table per run."""
    lines = [
        f"## Above capacity: where the p99 goes (`results/{STALLS_DIR}`)",
        "",
        "Open-loop windows around and above the capacity, with the asyncio generator's timeline (which "
        "sources saw the slow answers, and when), Triton's own request and queue times, and the server's "
        'busiest threads. `docs/LAB.md` ("Above capacity") reads them.',
        "",
    ]
    for p, doc in runs:
        args = " ".join(f"`{a}`" for a in (doc.get("server") or {}).get("server_args") or ()) or "none"
        lines += [
            f"### [`{p}`](../{p})",
            "",
            "Variants: "
            + "; ".join(f"{v['label']} `{v['spec']}`" for v in doc.get("variants", []))
            + f". Server arguments: {args}.",
            "",
        ]
        # the table's explanation is on the run's own page
        lines += [report.stalls_table(doc, explain=False)]
    return lines


SECTION = Section(title=TITLE, collect=collect, render=render)
