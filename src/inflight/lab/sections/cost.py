"""RESULTS' "Pipelining at the sync mode's cost" section: server CPU per request, from ``results/cpu-cost``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.cost_results import summary
from inflight.lab.entries import bound_row, summary_block
from inflight.lab.sections import Section

TITLE = "Pipelining at the sync mode's cost"


def _binding_limit(root: Path, block: dict[str, Any]) -> str | None:
    """Closed loop: which limit the best sync configuration is nearer to.

    Its req/s against the engine-only bound (``results/engine_bench.json``, at the bucket its batches pad
    to) and against the null model of the same sitting.
    """
    path = root / "results" / "engine_bench.json"
    best = next((r for r in block.get("rows", []) if r["spec"] == block.get("best_sync")), None)
    if not path.is_file() or best is None or not best.get("avg_batch_items"):
        return None
    doc = json.loads(path.read_text())
    row = bound_row(doc, best["avg_batch_items"])
    items = int(((doc.get("config") or {}).get("items_per_request")) or 50)
    if row is None:
        return None
    bound = row["engine_bound_items_s"] / items
    null = next((r["rps"] for r in block["rows"] if r["mode"] == "null"), None)
    of_null = f"{block['best_sync_rps'] / null:.2f}x the null model's req/s" if null else "n/a of the null model"
    return (
        f"- Which limit binds (closed loop): the best sync serves {100 * block['best_sync_rps'] / bound:.0f}% of the "
        f"engine-only bound at the {row['bucket']}-item bucket its batches pad to ({bound:,.0f} req/s, "
        f"`results/engine_bench.json`) and {of_null} (the request path with a fixed wait per batch, same sitting)."
    )


def cost_verdict(target: dict[str, Any]) -> str:
    """A target's verdict cell: met, or missed with the bound the files put on it when there is one."""
    if target["met"]:
        return "met"
    bound = target.get("bound")
    return "**missed**" if bound is None else f"**missed** (overlap bound {bound:.3f})"


def _cores(block: dict[str, Any]) -> str:
    sets = block.get("cpu_sets") or {}
    if not sets.get("server"):
        return ""
    return f" (server cores {sets['server']}, load generator cores {sets.get('client')})"


def collect(root: Path) -> dict[str, Any] | None:
    """The ``cpu_per_request`` block of ``results/summary.json`` and which limit binds its best sync."""
    block = summary_block(root, "cpu_per_request")
    return {"block": block, "binds": _binding_limit(root, block)} if block else None


def render(data: Mapping[str, Any]) -> list[str]:
    """The section: the targets, the best of each mode, every sitting, one instance's bound, the limit."""
    block = data["block"]
    lines = [
        "## Pipelining at the sync mode's cost: server CPU per request (`results/cpu-cost`)",
        "",
        f"{block['device']}; closed loop (published load), server on its own cores{_cores(block)}; one sitting: "
        f"`{block['file']}` (server CPU = tritonserver and its stubs per successful request). The open-loop "
        "figure comes from the newest open-loop sitting. Reproduce (on the GPU host, from the file's own settings): "
        f"`{block.get('reproduce') or 'bash scripts/lab/gpu_session.sh cost'}`. "
        "Source: the `cpu_per_request` block of `results/summary.json`.",
        "",
        "| figure | value | target | verdict |",
        "|---|---|---|---|",
    ]
    for t in block.get("targets", []):
        v = t["value"]
        value = "n/a" if v is None else f"{v:.3f}"
        lines.append(f"| {t['figure']} | {value} | {t['target']} | {cost_verdict(t)} |")
    lines += [
        "",
        f"- Best sync `{block['best_sync']}`: {block['best_sync_rps']:,.0f} req/s at {block['sync_us']:,.0f} µs of "
        f"server CPU per request; best pipelined `{block['best_pipelined']}`: {block['best_pipelined_rps']:,.0f} "
        f"req/s at {block['pipelined_us']:,.0f} µs; the null model {block['null_us']:,.0f} µs.",
    ]
    for s in block.get("sittings", []):
        lines.append(
            f"- Sitting `{s['file']}`: best pipelined / best sync {s['rps_ratio']:.3f}x req/s, "
            f"{s['cpu_ratio']:.3f}x CPU per request (`{s['best_pipelined']}` vs `{s['best_sync']}`)."
        )
    ob = block.get("one_instance_overlap_bound")
    if ob:
        lines.append(
            f"- One instance: the sync instance's cycle is {ob['execute_ms']:.2f} ms inside `execute()` plus "
            f"{ob['between_executes_ms']:.2f} ms between two calls (Triton's and the stub's own work), of which "
            f"{ob['device_wait_ms']:.2f} ms is the wait for the device: overlapping can hide at most that wait, so one "
            f"pipelined instance serves at most {ob['value']:.3f}x one sync instance here (its `executor` block)."
        )
    if data["binds"]:
        lines.append(data["binds"])
    ol = block.get("open_loop")
    if ol:
        lines.append(
            f"- Open loop: `{ol['new']['spec']}` {ol['new']['capacity_rps']:,.0f} req/s against the deferred "
            f"`{ol['deferred']['spec']}` {ol['deferred']['capacity_rps']:,.0f} req/s at the SLO "
            f"(`{ol['new']['file']}`, `{ol['deferred']['file']}`)."
        )
    lines.append("")
    return lines


SECTION = Section(title=TITLE, collect=collect, render=render, summary_key="cpu_per_request", summarize=summary)
