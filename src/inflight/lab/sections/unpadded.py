"""RESULTS' "Unpadded launches through the server" section (issue 16), from ``results/unpadded-serving``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inflight.lab.sections import Section, fmt, markdown_table
from inflight.lab.sections.one_instance import read_runs

TITLE = "Unpadded launches through the server"

#: A/B runs of the same variant with and without unpadded launches (issue 16, through the server)
UNPADDED_SERVING_DIR = "unpadded-serving"


def collect(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Each A/B file under ``results/unpadded-serving`` (its path from ``root``) and its document."""
    return read_runs(root, UNPADDED_SERVING_DIR)


def render(runs: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """Each run: per variant and window, throughput, p99 and what its launches computed."""
    rows = []
    for p, doc in runs:
        load = doc.get("load") or {}
        for v in doc.get("summary", []):
            closed = {"achieved_rps": v.get("rps"), "p99_ms": (v.get("latency_ms") or {}).get("p99")}
            windows = v.get("sweep") or [closed]
            ex = v.get("executor") or {}
            launches = ex.get("launches")
            for w in windows:
                rows.append(
                    [
                        f"[`{p.stem}`](../{p})",
                        "closed" if load.get("closed_loop", True) else f"open, {fmt(w.get('offered_rps'))} offered",
                        f"`{v['spec']}`",
                        fmt(w.get("achieved_rps")),
                        fmt(w.get("p99_ms"), ",.1f"),
                        "n/a" if launches is None else f"{ex.get('unpadded_launches', 0):,} of {launches:,}",
                        fmt(ex.get("computed_over_real_tokens"), ".2f"),
                        fmt(ex.get("device_wait_ms"), ".2f"),
                        fmt(ex.get("execute_ms"), ".2f"),
                    ]
                )
    return [
        f"## Unpadded launches through the server (`results/{UNPADDED_SERVING_DIR}`)",
        "",
        "The same variant with `unpad` on (the default) and off, under the load test's `--length-dist uniform` "
        "requests (50 items of 64 tokens, each item's length uniform in 1..64, the rest masked), server and "
        "generator on disjoint cores (each run's JSON records them). The executor columns are per batch, over "
        "the variant's whole run (warm-up included; n/a where the run predates those counters). "
        '`docs/LAB.md` ("The compiled engine: measurements") reads them.',
        "",
        *markdown_table(
            [
                "run",
                "loop",
                "variant",
                "req/s",
                "p99 ms",
                "unpadded launches",
                "computed / request tokens",
                "device wait ms",
                "execute ms",
            ],
            rows,
        ),
        "",
    ]


SECTION = Section(title=TITLE, collect=collect, render=render)
