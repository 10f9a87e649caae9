"""RESULTS-ab-runs' "Every A/B run": every open-loop run linked by kind, then one row per closed-loop run.

Every ``ab-*.json`` under ``results/``. A run's full tables, its configuration and how to reproduce it are in its
JSON (``inflight ab-report FILE`` renders them); an open-loop run's latency-against-rate table and plot are in the
Markdown report beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.entries import is_open_loop, read_ab
from inflight.lab.sections import Section, fmt, markdown_table

TITLE = "Every A/B run"


def runs(root: Path) -> tuple[list[Path], list[tuple[Path, dict[str, Any]]]]:
    """Every A/B file under ``results/``, in path order: the open-loop ones' paths, the closed-loop ones' documents."""
    open_loop: list[Path] = []
    closed: list[tuple[Path, dict[str, Any]]] = []
    for p in sorted((root / "results").rglob("ab-*.json")):
        doc = read_ab(p)
        if is_open_loop(doc):
            open_loop.append(p.relative_to(root))
        else:
            closed.append((p.relative_to(root), doc))
    return open_loop, closed


def closed_loop_runs(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every closed-loop A/B file under ``results/``, in path order, with its document."""
    return runs(root)[1]


def collect(root: Path) -> dict[str, Any] | None:
    """Every open-loop report and every closed-loop run under ``results/`` (None when there is neither)."""
    files, closed = runs(root)
    return {"open_loop": files, "closed_loop": closed} if files or closed else None


def open_loop_lines(files: list[Path]) -> list[str]:
    """One line per kind of result (a folder of ``results/``) linking its open-loop reports, sittings apart."""
    by_sitting: dict[Path, list[Path]] = {}
    for md in files:
        by_sitting.setdefault(md.parents[1] if len(md.parents) > 3 else md.parent, []).append(md)
    by_kind: dict[Path, list[str]] = {}
    for sitting, mds in by_sitting.items():
        links = ", ".join(f"[{md.parent.name if md.parent != sitting else md.stem}](../{md})" for md in mds)
        kind = Path(*sitting.parts[:2])
        by_kind.setdefault(kind, []).append(links if sitting == kind else f"`{sitting.name}`: {links}")
    return [f"- `{kind}`: {'; '.join(parts)}" for kind, parts in by_kind.items()]


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


def render(data: Mapping[str, Any]) -> list[str]:
    """The open-loop runs by kind, then one row per closed-loop run: device, load, req/s and p99, the unloads."""
    rows = []
    for path, doc in data["closed_loop"]:
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
        "## Every A/B run",
        "",
        "Every open-loop run, with its latency-against-rate table and plot, one line per kind of result "
        "(its sittings separated by semicolons):",
        "",
        *open_loop_lines(data["open_loop"]),
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
