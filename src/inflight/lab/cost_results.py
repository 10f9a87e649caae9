"""CPU cost results: the ``cpu_per_request`` block of ``results/summary.json``.

Read from the closed-loop A/B files under ``results/cpu-cost`` (``scripts/lab/gpu_session.sh cost``):
the server's CPU per successful request (tritonserver and its stubs, the server's own cores) and
req/s of every variant, all variants of one file measured in one sitting. The block's figures come
from the newest file that holds the null model, one sync instance and several sync instances, so
every ratio in it is of one sitting.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from inflight.lab.entries import entries, read_ab
from inflight.variants import parse_variant_arg

COST_DIR = "cpu-cost"
#: The issue's targets.
TARGET_CPU_RATIO = 1.1
TARGET_ONE_INSTANCE_RATIO = 1.1


def overlap_bound(executor: dict[str, Any] | None) -> dict[str, float] | None:
    """The most any overlap can raise one instance's rate, from a sync instance's ``executor`` block.

    An instance's cycle is ``execute_ms`` (our work, the device wait included) plus
    ``between_executes_ms`` (Triton's and the stub's own per-batch work, serial per instance). A
    pipelined instance can at best hide the device wait, so its rate is at most
    ``cycle / (cycle - device_wait_ms)`` times the sync instance's: the launches, waits and copies
    of chunks and the responses' cost only take from that. None when the block lacks a figure.
    """
    ex = executor or {}
    try:
        execute, between, wait = (float(ex[k]) for k in ("execute_ms", "between_executes_ms", "device_wait_ms"))
    except (KeyError, TypeError):
        return None
    cycle = execute + between
    if cycle <= wait or wait < 0:
        return None
    return {
        "value": cycle / (cycle - wait),
        "execute_ms": execute,
        "between_executes_ms": between,
        "device_wait_ms": wait,
    }


def reproduce_command(doc: dict[str, Any]) -> str:
    """The ``scripts/lab/gpu_session.sh cost`` line that re-runs an A/B file's sitting.

    Built from what the file recorded: its CPU sets, Locust processes, window, warm-up, rounds and
    variants (in their order), so the line cannot drift from the run it reproduces.
    """
    load = doc.get("load") or {}
    sets = load.get("cpu_sets") or {}
    env = []
    if sets.get("server") and sets.get("client"):
        env.append(f'AB_CPUS="--server-cpus {sets["server"]} --client-cpus {sets["client"]}"')
    for name, key in (("PROCS", "processes"), ("WINDOW", "window_s"), ("WARMUP", "warmup_s"), ("REPEAT", "repeat")):
        v = load.get(key)
        if v is not None:
            env.append(f"{name}={v:g}" if isinstance(v, float) else f"{name}={v}")
    specs = " ".join(f"'{s['spec']}'" for s in doc.get("summary", []))
    return " ".join([*env, "bash scripts/lab/gpu_session.sh cost", specs]).strip()


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    variants = {v["label"]: v for v in doc.get("variants", [])}
    for s in doc.get("summary", []):
        v = variants.get(s["variant"], {})
        params = (v.get("config") or {}).get("parameters") or {}
        mode = (params.get("mode") or {}).get("string_value") or ("null" if v.get("variant") == "null" else "?")
        _, overrides = parse_variant_arg(s["spec"])
        out.append(
            {
                "spec": s["spec"],
                "mode": mode,
                "instances": int(overrides.get("instances", 1)),
                "rps": float(s["rps"]),
                "avg_batch_items": (s.get("server") or {}).get("avg_batch_items"),
                "us_per_request": float((s.get("cpu") or {}).get("server_us_per_request") or float("nan")),
                "valid": bool(s.get("valid", True)) and not s.get("client_limited"),
                "overlap_bound": overlap_bound(s.get("executor")) if mode == "sync" else None,
            }
        )
    return out


def summary(root: Path) -> dict[str, Any] | None:
    """The ``cpu_per_request`` block (None when no file has the null model, one and many sync instances).

    Keys the issue names: ``device``, ``sync_us`` and ``pipelined_us`` (CPU per request of the best
    sync and the best non-sync configuration by req/s), ``null_us``, ``best_sync_rps``,
    ``best_pipelined_rps``, ``one_instance_ratio`` (the best one-instance non-sync mode over one sync
    instance). Beside them: the file, every row, and the targets with their verdicts.
    """
    loaded = []
    for path in sorted((root / "results" / COST_DIR).rglob("ab-*.json")):
        doc = read_ab(path)
        loaded.append((path, doc, [r for r in _rows(doc) if r["valid"]]))
    chosen: tuple[Path, dict[str, Any], list[dict[str, Any]]] | None = None
    for path, doc, rows in loaded:
        modes = {(r["mode"], r["instances"] > 1) for r in rows}
        if {("null", True), ("sync", False), ("sync", True)} <= modes:
            chosen = (path, doc, rows)
    if chosen is None:
        return None
    path, doc, rows = chosen
    sync = [r for r in rows if r["mode"] == "sync"]
    pipe = [r for r in rows if r["mode"] not in ("sync", "null")]
    best_sync = max(sync, key=lambda r: r["rps"])
    best_pipe = max(pipe, key=lambda r: r["rps"])
    null = max((r for r in rows if r["mode"] == "null"), key=lambda r: r["rps"])
    one_sync = max((r for r in sync if r["instances"] == 1), key=lambda r: r["rps"])
    one_pipe = max((r for r in pipe if r["instances"] == 1), key=lambda r: r["rps"], default=None)
    out: dict[str, Any] = {
        "device": str((doc.get("device") or {}).get("name")),
        "sync_us": best_sync["us_per_request"],
        "pipelined_us": best_pipe["us_per_request"],
        "null_us": null["us_per_request"],
        "best_sync_rps": best_sync["rps"],
        "best_pipelined_rps": best_pipe["rps"],
        "one_instance_ratio": one_pipe["rps"] / one_sync["rps"] if one_pipe else None,
        "one_instance_overlap_bound": one_sync["overlap_bound"],
        "best_sync": best_sync["spec"],
        "best_pipelined": best_pipe["spec"],
        "one_instance_pipelined": one_pipe["spec"] if one_pipe else None,
        "file": str(path.relative_to(root)),
        "cpu_sets": (doc.get("load") or {}).get("cpu_sets"),
        "reproduce": reproduce_command(doc),
        "rows": rows,
    }
    # every sitting that compared a sync and a non-sync configuration (the window-to-window spread)
    sittings = []
    for other, _, rs in loaded:
        s_rows = [r for r in rs if r["mode"] == "sync" and r["instances"] > 1]
        p_rows = [r for r in rs if r["mode"] not in ("sync", "null") and r["instances"] > 1]
        if s_rows and p_rows:
            bs, bp = max(s_rows, key=lambda r: r["rps"]), max(p_rows, key=lambda r: r["rps"])
            sittings.append(
                {
                    "file": str(other.relative_to(root)),
                    "best_sync": bs["spec"],
                    "best_pipelined": bp["spec"],
                    "rps_ratio": bp["rps"] / bs["rps"],
                    "cpu_ratio": bp["us_per_request"] / bs["us_per_request"],
                }
            )
    out["sittings"] = sittings
    out["open_loop"] = open_loop_strategies(root)
    cpu_ratio = out["pipelined_us"] / out["sync_us"]
    out["targets"] = [
        {
            "figure": "best pipelined CPU/request over best sync",
            "value": cpu_ratio,
            "target": "<= 1.1",
            "met": cpu_ratio <= TARGET_CPU_RATIO,
        },
        {
            "figure": "best pipelined req/s over best sync",
            "value": out["best_pipelined_rps"] / out["best_sync_rps"],
            "target": ">= 1.0",
            "met": out["best_pipelined_rps"] >= out["best_sync_rps"],
        },
        {
            "figure": "one pipelined instance over one sync instance",
            "value": out["one_instance_ratio"],
            "target": ">= 1.1",
            "met": (out["one_instance_ratio"] or 0.0) >= TARGET_ONE_INSTANCE_RATIO,
            "bound": (one_sync["overlap_bound"] or {}).get("value"),
        },
    ]
    ol = out["open_loop"]
    if ol is not None:
        out["targets"].append(
            {
                "figure": "open-loop capacity at p99 <= 50 ms, new strategy (overlap/auto) over the deferred one",
                "value": ol["ratio"],
                "target": ">= 1.0",
                "met": ol["ratio"] is not None and ol["ratio"] >= 1.0,
            }
        )
    return out


def open_loop_strategies(root: Path) -> dict[str, Any] | None:
    """Capacity at the SLO of the best ``overlap``/``auto`` configuration and of the best deferred one.

    Both from the newest open-loop sitting on one GPU (None when it has not both).
    """
    es = [e for e in entries(root / "results") if e.gpus == 1 and e.capacity is not None]
    new = max((e for e in es if e.mode in ("overlap", "auto")), key=lambda e: e.capacity or 0.0, default=None)
    old = max((e for e in es if e.mode == "pipelined"), key=lambda e: e.capacity or 0.0, default=None)
    if new is None or old is None:
        return None
    return {
        "new": {"spec": new.summary["spec"], "capacity_rps": new.capacity, "file": str(new.path.relative_to(root))},
        "deferred": {
            "spec": old.summary["spec"],
            "capacity_rps": old.capacity,
            "file": str(old.path.relative_to(root)),
        },
        "ratio": (new.capacity or 0.0) / old.capacity if old.capacity else None,
        "comparable": new.comparable and old.comparable,
    }


def table(root: Path) -> list[str]:
    """Markdown rows of every cost file: sitting, variant, mode, instances, req/s, server CPU per request.

    The last column is :func:`overlap_bound` of each one-instance sync row: the most one pipelined
    instance of that sitting could serve over it.
    """
    lines = [
        "| sitting | variant | mode | instances | req/s | server CPU µs/request | overlap bound |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in sorted((root / "results" / COST_DIR).rglob("ab-*.json")):
        for r in _rows(read_ab(path)):
            bound = r["overlap_bound"] if r["instances"] == 1 else None
            bound_cell = "" if bound is None else f"{bound['value']:.3f}"
            lines.append(
                f"| `{path.parent.name}` | `{r['spec']}` | {r['mode']} | {r['instances']} | {r['rps']:,.0f} "
                f"| {r['us_per_request']:,.0f} | {bound_cell} |"
            )
    return lines


if __name__ == "__main__":  # print the table for docs/LAB.md
    sys.stdout.write("\n".join(table(Path("."))) + "\n")
