"""RESULTS-ab-runs' "Every closed-loop A/B run": one row per run, linking its JSON.

Every closed-loop run (every ``ab-*.json`` under ``results/`` but the open-loop files). A run's full tables, its
configuration and how to reproduce it are in its JSON (``inflight ab-report FILE`` renders them).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.entries import read_ab
from inflight.lab.sections import Section, fmt, markdown_table

TITLE = "Every closed-loop A/B run"


def collect(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every closed-loop A/B file under ``results/``, in path order."""
    out = []
    for p in sorted((root / "results").rglob("ab-*.json")):
        doc = read_ab(p)
        if (doc.get("load") or {}).get("closed_loop", True):
            out.append((p.relative_to(root), doc))
    return out


def unload_cell(doc: Mapping[str, Any]) -> str:
    """How the windows' unloads went: how many stalled (and Triton's queue then), or n/a where not recorded."""
    runs = [r for r in doc.get("runs", []) if r.get("unload_s") is not None]
    if not runs:
        return "n/a"
    stalled = [r for r in runs if r.get("unload_stalled")]
    if not stalled:
        return f"all {len(runs)} in time (at most {max(float(r['unload_s']) for r in runs):g} s)"
    queued = [q for r in stalled if (q := (r.get("requests_at_stall") or {}).get("pending")) is not None]
    held = f"; Triton's queue held {', '.join(map(str, queued))} requests then" if queued else ""
    return f"**{len(stalled)} of {len(runs)} not unloaded** within the timeout{held}"


def render(runs: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """One row per run: device, load, each variant's req/s and p99, failures, the unloads."""
    rows = []
    for path, doc in runs:
        load, dev = doc.get("load") or {}, doc.get("device") or {}
        variants = "; ".join(
            f"{s['variant']} `{s['spec']}` {fmt(s.get('rps'))} req/s, "
            f"p99 {fmt((s.get('latency_ms') or {}).get('p99'), ',.1f')}"
            for s in doc.get("summary", [])
        )
        rows.append(
            [
                f"[`{path}`](../{path})",
                str(dev.get("name", "?")),
                f"{load.get('users')} users x {load.get('items')} items, {str(load.get('protocol', 'http')).upper()}, "
                f"{load.get('window_s')} s",
                variants,
                fmt(sum(int(s.get("failures") or 0) for s in doc.get("summary", []))),
                "valid" if doc.get("valid") else "INVALID",
                unload_cell(doc),
            ]
        )
    return [
        "## Every closed-loop A/B run",
        "",
        "One row per closed-loop run under `results/`; its JSON holds every table, its configuration and how to "
        "reproduce it (`inflight ab-report FILE` writes them as Markdown).",
        "",
        *markdown_table(
            ["run", "device", "load", "variants: req/s, p99 ms", "failures", "status", "Unload after each window"],
            rows,
        ),
        "",
    ]


SECTION = Section(title=TITLE, collect=collect, render=render)
