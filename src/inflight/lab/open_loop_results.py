"""Open-loop results: the ``open_loop`` block of ``results/summary.json`` (its section: ``sections.open_loop``).

Read from the open-loop A/B files under ``results/open-loop/`` (written by ``inflight ab --rate/--search``,
see ``scripts/lab/gpu_session.sh campaign``) and the engine-bound file written beside them. The files are
grouped by *sitting*: each first-level folder of ``results/open-loop/`` (``<date>-<time>-<name>``) holds
the runs of one session on the GPU host, and ratios are only taken within one sitting. The summary
block describes the newest sitting; the RESULTS section adds one line per earlier sitting (each one's block). Nothing is
typed by hand: every figure, ratio and verdict is computed here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.entries import (
    GENERATOR_MARGIN,
    Entry,
    best_entry,
    bound_row,
    entries,
    executor_rows,
    generator_verified,
    is_executor_row,
    newest_sitting,
)
from inflight.lab.two_gpu_results import summary as two_gpu_summary

#: Re-exported for ``inflight bench-engine``'s report (``inflight.cli``).
__all__ = ["executor_rows", "is_executor_row", "summary", "summary_with_two_gpu", "targets"]

#: Targets of the open-loop issue (GPU host, server on its own cores, p99 <= 50 ms).
TARGET_PIPELINED_RPS = 15_000.0
TARGET_FRACTION_OF_ENGINE_BOUND = 0.70
TARGET_PIPELINED_OVER_SYNC = 1.5
TARGET_TWO_GPU_SCALING = 1.8


def _engine_bound(
    root: Path, sitting: Path, items_per_batch: float | None, items_per_request: int
) -> dict[str, Any] | None:
    """The engine-only bound (req/s) at the batch bucket that ``items_per_batch`` pads to (the sitting's bench)."""
    files = sorted(sitting.glob("engine-bound-*.json"))
    if not files or not items_per_batch:
        return None
    row = bound_row(json.loads(files[-1].read_text()), items_per_batch)
    if row is None:
        return None
    return {
        "file": str(files[-1].relative_to(root)),
        "bucket": row["bucket"],
        "items_per_s": row["engine_bound_items_s"],
        "rps": row["engine_bound_items_s"] / items_per_request,
        "engine_ms_per_batch": row.get("engine_ms_per_batch"),
        "sync_executor_ms_per_batch": row.get("sync_ms_per_batch"),
    }


#: The backend's per-batch means (ms) that say where an execute() call's time goes.
EXECUTOR_KEYS = (
    "requests_per_batch",
    "execute_ms",
    "parse_ms",
    "gather_ms",
    "launch_ms",
    "device_wait_ms",
    "respond_ms",
)


def _executor_means(e: Entry) -> dict[str, Any] | None:
    """The variant's executor counters over all its windows (logged by each instance at unload), per batch."""
    ex = e.summary.get("executor")
    if not ex:
        return None
    out = {k: ex.get(k) for k in EXECUTOR_KEYS}
    build, rpb = ex.get("build_us_per_response"), ex.get("requests_per_batch")
    out["build_ms"] = build * rpb / 1000.0 if build is not None and rpb is not None else None
    return out


def _generator_headroom(e: Entry) -> list[dict[str, Any]]:
    """Per window of the null model's sweep: offered, answered, and how busy the generator itself was."""
    out = []
    for run in e.doc.get("runs", []):
        if run.get("variant") != e.summary.get("variant") or run.get("rate") is None:
            continue
        own = run.get("generator_run") or {}
        gen = run.get("generator") or {}
        out.append(
            {
                "offered_rps": run["rate"],
                "achieved_rps": gen.get("achieved_rps"),
                "p99_ms": (run.get("latency_ms") or {}).get("p99"),
                "very_late_fraction": gen.get("very_late_fraction"),
                "peak_inflight": gen.get("peak_inflight"),
                "generator_busy_max": own.get("busy_max"),
                "generator_us_per_request": own.get("us_per_request"),
                "generator_connections": own.get("peak_connections"),
                "connection_waits": own.get("connection_waits"),
            }
        )
    return sorted(out, key=lambda r: r["offered_rps"])


def summary(root: Path, sitting: Path | None = None, two_gpu: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The ``open_loop`` block of ``results/summary.json`` for one sitting (default: the newest; None: no results).

    Keys the issue names: ``device``, ``slo_p99_ms``, ``best_sync`` and ``best_pipelined`` (``spec``,
    ``capacity_rps``; one GPU), ``engine_bound_rps`` (engine-only bound at the batch the best pipelined
    configuration formed at its capacity), ``two_gpu_capacity_rps`` (best of any mode on two GPUs),
    ``generator_verified_rps`` (the highest rate the null model met the SLO at with the generator on
    schedule). Beside them: where each figure comes from, whether it is comparable (no generator-limited
    window at or below it), the soak, and the targets with their verdicts.
    """
    results = root / "results"
    sitting = sitting or newest_sitting(results)
    if sitting is None:
        return None
    es = entries(results, sitting)
    if not es:
        return None
    one = [e for e in es if e.gpus == 1]
    best_sync = best_entry(e for e in one if e.kind == "sync")
    best_pipe = best_entry(e for e in one if e.kind == "pipelined")
    two = best_entry(e for e in es if e.gpus == 2 and e.kind in ("sync", "pipelined"))
    null = best_entry(e for e in one if e.kind == "null")
    verified = generator_verified(es)
    items = int((es[0].doc.get("load") or {}).get("items") or 50)
    point = (best_pipe.summary.get("capacity_point") or {}) if best_pipe else {}
    bound = _engine_bound(root, sitting, point.get("avg_batch_items"), items)
    headroom = _generator_headroom(null) if null else []
    soaks = [e for e in es if e.summary.get("soak")]
    soak = soaks[-1] if soaks else None

    def ref(e: Entry | None) -> dict[str, Any] | None:
        if e is None:
            return None
        return {
            "spec": e.summary["spec"],
            "capacity_rps": e.capacity,
            "capacity_upper_rps": e.summary.get("capacity_upper_rps"),
            "comparable": e.comparable,
            "avg_batch_items": (e.summary.get("capacity_point") or {}).get("avg_batch_items"),
            "file": str(e.path.relative_to(root)),
            "executor": _executor_means(e),
        }

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    sync_cap = best_sync.capacity if best_sync else None
    pipe_cap = best_pipe.capacity if best_pipe else None
    two_cap = two.capacity if two else None
    one_of_two = best_entry(e for e in one if two is not None and e.kind == two.kind)
    highest = max((c for c in (sync_cap, pipe_cap, two_cap) if c is not None), default=None)
    gen = verified[0] if verified else None
    device = str(((best_pipe or best_sync or es[-1]).doc.get("device") or {}).get("name"))
    out: dict[str, Any] = {
        "sitting": str(sitting.relative_to(root)),
        "generator": str((es[-1].doc.get("load") or {}).get("generator") or "locust"),
        "device": device,
        "slo_p99_ms": float(((es[-1].doc.get("load") or {}).get("open_loop") or {}).get("slo_p99_ms") or 50.0),
        "best_sync": ref(best_sync),
        "best_pipelined": ref(best_pipe),
        "engine_bound_rps": bound["rps"] if bound else None,
        "two_gpu_capacity_rps": two_cap,
        "generator_verified_rps": gen,
        "engine_bound": bound,
        "two_gpu": ref(two),
        # the request path alone (Triton and the Python backend, a fixed wait per batch, none of our code)
        "null_model": ref(null),
        "sync_fraction_of_null": ratio(sync_cap, null.capacity if null else None),
        "pipelined_fraction_of_null": ratio(pipe_cap, null.capacity if null else None),
        "two_gpu_over_one_gpu": ratio(two_cap, one_of_two.capacity if one_of_two else None),
        "pipelined_over_sync": ratio(pipe_cap, sync_cap),
        "pipelined_fraction_of_engine_bound": ratio(pipe_cap, bound["rps"] if bound else None),
        "generator_file": str(verified[1].path.relative_to(root)) if verified else None,
        "generator_covers": (None if gen is None or highest is None else bool(gen >= GENERATOR_MARGIN * highest)),
        "generator_headroom": headroom,
        "soak": dict(soak.summary["soak"], spec=soak.summary["spec"], file=str(soak.path.relative_to(root)))
        if soak
        else None,
    }
    # issue 33: two GPUs at equal server cores per GPU (``two_gpu``: two_gpu_results.summary, from
    # results/two-gpu), when given, replaces this sitting's two-GPU figure (whose second GPU got no cores of
    # its own) and adds its generator proof
    if two_gpu is not None:
        out["two_gpu_capacity_rps"] = two_gpu["two_gpu_capacity_rps"]
        out["two_gpu"] = two_gpu["two_gpu"]
        out["two_gpu_over_one_gpu"] = two_gpu["two_over_one"]
        out["two_gpu_source"] = two_gpu["sitting"]
        if two_gpu["generator_verified_rps"] is not None and two_gpu["generator_verified_rps"] > (gen or 0.0):
            out["generator_verified_rps"] = two_gpu["generator_verified_rps"]
            out["generator_file"] = two_gpu["generator_file"]
        highest = max(highest or 0.0, two_gpu["two_gpu_capacity_rps"])
        top = out["generator_verified_rps"]
        out["generator_covers"] = None if top is None else bool(top >= GENERATOR_MARGIN * highest)
    out["targets"] = targets(out)
    return out


def targets(s: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The open-loop issue's targets: figure, value, target, verdict (True, False, or None: not measured)."""

    def at_least(value: Any, target: float) -> bool | None:
        return None if not isinstance(value, (int, float)) else bool(value >= target)

    pipe = (s.get("best_pipelined") or {}).get("capacity_rps")
    frac = s.get("pipelined_fraction_of_engine_bound")
    over = s.get("pipelined_over_sync")
    two = s.get("two_gpu_over_one_gpu")
    soak = s.get("soak") or {}
    rows = [
        (
            "best pipelined capacity at p99 <= 50 ms (req/s)",
            pipe,
            f">= {TARGET_PIPELINED_RPS:,.0f}",
            at_least(pipe, TARGET_PIPELINED_RPS),
        ),
        (
            "pipelined capacity / engine-only bound",
            frac,
            f">= {TARGET_FRACTION_OF_ENGINE_BOUND:.0%}",
            at_least(frac, TARGET_FRACTION_OF_ENGINE_BOUND),
        ),
        (
            "pipelined / best sync capacity",
            over,
            f">= {TARGET_PIPELINED_OVER_SYNC:g}x",
            at_least(over, TARGET_PIPELINED_OVER_SYNC),
        ),
        ("two GPUs / one GPU capacity", two, f">= {TARGET_TWO_GPU_SCALING:g}x", at_least(two, TARGET_TWO_GPU_SCALING)),
        (
            "5-minute soak at 80% of capacity",
            soak.get("passed"),
            "0 failures, p99 within 20%, memory flat",
            soak.get("passed") if soak else None,
        ),
        (
            "generator proven at 2x the highest capacity published",
            s.get("generator_verified_rps"),
            "null model on schedule at >= 2x",
            s.get("generator_covers"),
        ),
    ]
    units = ("rps", "fraction", "ratio", "ratio", "bool", "rps")
    return [
        {"figure": f, "value": v, "unit": u, "target": t, "met": m} for (f, v, t, m), u in zip(rows, units, strict=True)
    ]


def summary_with_two_gpu(root: Path) -> dict[str, Any] | None:
    """The ``open_loop`` block of the newest sitting, its two-GPU figures from ``results/two-gpu`` where measured."""
    return summary(root, two_gpu=two_gpu_summary(root))
