"""Two GPUs against one at equal server cores per GPU (issue 33): ``summary.json["two_gpu"]`` and every sitting.

``scripts/lab/two_gpu.sh`` writes one sitting under ``results/two-gpu/<date>-<device>``, one layout per device
call, each a capacity search at p99 <= 50 ms per variant in a folder ``<time>-cap-<layout>-<n>-<model>``:

* ``one``: one GPU with C server cores;
* ``two``: one server with instances on both GPUs and 2C cores;
* ``perserver``: one server per GPU, C cores each;

and the generator's proof (``<time>-generator``: the null model at rates up to twice the two-GPU capacity,
on schedule). Every figure is read from those files (RESULTS' section: ``sections.two_gpu``); the two-GPU
capacity is the best of the two layouts of two GPUs, over the best of one GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.entries import (
    GENERATOR_MARGIN,
    Entry,
    best_entry,
    entries,
    generator_verified,
    server_cores,
    sittings,
)

TWO_GPU_DIR = "two-gpu"
#: The issue's target: two GPUs' capacity over one GPU's, at equal server cores per GPU.
TARGET_RATIO = 1.8
_LAYOUT = re.compile(r"-cap-(one|two|perserver)-\d+-")


def layout(e: Entry) -> str | None:
    """``one``, ``two`` or ``perserver`` from the run's folder name; None for other runs (the generator's)."""
    m = _LAYOUT.search(e.path.parent.name)
    return m.group(1) if m else None


def _cpus(e: Entry) -> Mapping[str, Any]:
    return (e.doc.get("load") or {}).get("cpu_sets") or {}


def _ref(e: Entry | None, root: Path) -> dict[str, Any] | None:
    if e is None:
        return None
    return {
        "layout": layout(e),
        "spec": e.summary["spec"],
        "capacity_rps": e.capacity,
        "capacity_bounded": bool(e.summary.get("capacity_bounded")),
        "comparable": e.comparable,
        "server_cpus": _cpus(e).get("server"),
        "client_cpus": _cpus(e).get("client"),
        "cores_per_gpu": (server_cores(e) or 0) / (2 if layout(e) in ("two", "perserver") else 1) or None,
        "file": str(e.path.relative_to(root)),
        "started": e.doc.get("started"),
    }


def _mode(e: Entry) -> str:
    """``sync`` for the sync mode (``<model>_sync``), ``pipelined`` for the inflight backend's other modes."""
    return "sync" if e.mode == "sync" else "pipelined"


def _best_by_mode(es: list[Entry], name: str, root: Path) -> dict[str, dict[str, Any] | None]:
    """Layout ``name``'s best sync and best pipelined runs (None where that mode did not run)."""
    return {
        mode: _ref(best_entry(e for e in es if layout(e) == name and _mode(e) == mode), root)
        for mode in ("sync", "pipelined")
    }


def _by_mode_ratio(per_layout_mode: Mapping[str, Mapping[str, Mapping[str, Any] | None]], mode: str) -> float | None:
    """One mode's best two-GPU capacity (either layout) over its one-GPU capacity, or None (from ``_best_by_mode``)."""
    one = per_layout_mode["one"][mode]
    twos = [r["capacity_rps"] for name in ("two", "perserver") if (r := per_layout_mode[name][mode])]
    return max(twos) / one["capacity_rps"] if one and one["capacity_rps"] and twos and max(twos) else None


def _null_ceiling(es: list[Entry], root: Path) -> dict[str, Any] | None:
    """The null model's rates in the sitting: what was offered, the most answered per second, and on what cores."""
    rows = [(e, row) for e in es if e.kind == "null" for row in e.summary.get("sweep") or []]
    if not rows:
        return None
    e, top = max(rows, key=lambda er: float(er[1].get("achieved_rps") or 0.0))
    cpus = _cpus(e)
    return {
        "offered_rps": sorted(float(r["offered_rps"]) for _, r in rows),
        "max_answered_rps": float(top.get("achieved_rps") or 0.0),
        "server_cpus": cpus.get("server"),
        "client_cpus": cpus.get("client"),
        "processes": (e.doc.get("load") or {}).get("processes"),
        "file": str(e.path.relative_to(root)),
    }


def sitting_summary(root: Path, sitting: Path) -> dict[str, Any] | None:
    """One sitting's figures (None when it has no capacity for one GPU or for two)."""
    es = entries(root / "results", sitting)
    one = best_entry(e for e in es if layout(e) == "one")
    two = best_entry(e for e in es if layout(e) in ("two", "perserver"))
    if one is None or two is None or not one.capacity or two.capacity is None:
        return None
    gen = generator_verified(es)
    ratio = two.capacity / one.capacity
    null = _null_ceiling(es, root)
    by_layout = {name: _best_by_mode(es, name, root) for name in ("one", "two", "perserver")}
    return {
        "sitting": str(sitting.relative_to(root)),
        "device": str((one.doc.get("device") or {}).get("name")),
        "slo_p99_ms": float(((one.doc.get("load") or {}).get("open_loop") or {}).get("slo_p99_ms") or 50.0),
        "one_gpu": _ref(one, root),
        "two_gpu": _ref(two, root),
        "per_layout": {
            name: _ref(best_entry(e for e in es if layout(e) == name), root) for name in ("one", "two", "perserver")
        },
        "per_layout_mode": by_layout,
        "two_gpu_capacity_rps": two.capacity,
        "two_over_one": ratio,
        # per mode: its best two-GPU layout over its one-GPU run (a mode's runs of a sitting share a device lease)
        "two_over_one_by_mode": {mode: _by_mode_ratio(by_layout, mode) for mode in ("sync", "pipelined")},
        "target_ratio": TARGET_RATIO,
        "target_met": ratio >= TARGET_RATIO,
        "generator_verified_rps": gen[0] if gen else None,
        "generator_file": str(gen[1].path.relative_to(root)) if gen else None,
        "generator_covers": None if gen is None else gen[0] >= GENERATOR_MARGIN * two.capacity,
        "null_model": null,
        # the request path's ceiling on the two-GPU server's cores over one GPU's capacity: the most two/one could be
        "request_path_bound": None if null is None else null["max_answered_rps"] / one.capacity,
    }


def sitting_rows(root: Path) -> list[dict[str, Any]]:
    """Every sitting under ``results/two-gpu``, oldest first: one GPU's best per mode, two GPUs' best, the null model.

    Unlike :func:`sitting_summary`, a sitting that measured one layout only is listed too (its ``two`` is None).
    """
    out = []
    for sitting in sittings(root / "results", TWO_GPU_DIR):
        es = entries(root / "results", sitting)
        two = best_entry(e for e in es if layout(e) in ("two", "perserver"))
        first_one = best_entry(e for e in es if layout(e) == "one")
        out.append(
            {
                "sitting": str(sitting.relative_to(root)),
                "one_server_cpus": None if first_one is None else _cpus(first_one).get("server"),
                "one": _best_by_mode(es, "one", root),
                "two": _ref(two, root),
                "two_over_one": (
                    two.capacity / first_one.capacity
                    if two and first_one and two.capacity and first_one.capacity
                    else None
                ),
                "null_model": _null_ceiling(es, root),
            }
        )
    return out


def summary(root: Path) -> dict[str, Any] | None:
    """The newest sitting's figures under ``results/two-gpu`` (None when none has both layouts measured)."""
    for sitting in reversed(sittings(root / "results", TWO_GPU_DIR)):
        block = sitting_summary(root, sitting)
        if block is not None:
            return block
    return None
