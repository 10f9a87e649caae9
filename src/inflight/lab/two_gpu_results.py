"""Two GPUs against one at equal server cores per GPU (issue 33): ``summary.json["two_gpu"]`` and RESULTS' section.

``scripts/lab/two_gpu.sh`` writes one sitting under ``results/two-gpu/<date>-<device>``, one layout per device
call, each a capacity search at p99 <= 50 ms per variant in a folder ``<time>-cap-<layout>-<n>-<model>``:

* ``one``: one GPU with C server cores;
* ``two``: one server with instances on both GPUs and 2C cores;
* ``perserver``: one server per GPU, C cores each;

and the generator's proof (``<time>-generator``: the null model at rates up to twice the two-GPU capacity,
on schedule). Everything printed here is read from those files; the two-GPU capacity is the best of the
two layouts of two GPUs, over the best of one GPU.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from inflight.lab.modes_results import server_cores
from inflight.lab.open_loop_results import (
    GENERATOR_MARGIN,
    Entry,
    best_entry,
    entries,
    fmt,
    generator_verified,
    markdown_table,
    merge_summary,
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


def _ref(e: Entry | None, root: Path) -> dict[str, Any] | None:
    if e is None:
        return None
    return {
        "layout": layout(e),
        "spec": e.summary["spec"],
        "capacity_rps": e.capacity,
        "capacity_bounded": bool(e.summary.get("capacity_bounded")),
        "comparable": e.comparable,
        "server_cpus": ((e.doc.get("load") or {}).get("cpu_sets") or {}).get("server"),
        "client_cpus": ((e.doc.get("load") or {}).get("cpu_sets") or {}).get("client"),
        "cores_per_gpu": (server_cores(e) or 0) / (2 if layout(e) in ("two", "perserver") else 1) or None,
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
    return {
        "sitting": str(sitting.relative_to(root)),
        "device": str((one.doc.get("device") or {}).get("name")),
        "slo_p99_ms": float(((one.doc.get("load") or {}).get("open_loop") or {}).get("slo_p99_ms") or 50.0),
        "one_gpu": _ref(one, root),
        "two_gpu": _ref(two, root),
        "per_layout": {
            name: _ref(best_entry(e for e in es if layout(e) == name), root) for name in ("one", "two", "perserver")
        },
        "two_gpu_capacity_rps": two.capacity,
        "two_over_one": ratio,
        "target_ratio": TARGET_RATIO,
        "target_met": ratio >= TARGET_RATIO,
        "generator_verified_rps": gen[0] if gen else None,
        "generator_file": str(gen[1].path.relative_to(root)) if gen else None,
        "generator_covers": None if gen is None else gen[0] >= GENERATOR_MARGIN * two.capacity,
    }


def summary(root: Path) -> dict[str, Any] | None:
    """The newest sitting's figures under ``results/two-gpu`` (None when none has both layouts measured)."""
    for sitting in reversed(sittings(root / "results", TWO_GPU_DIR)):
        block = sitting_summary(root, sitting)
        if block is not None:
            return block
    return None


def write_summary(root: Path) -> dict[str, Any] | None:
    """Set ``two_gpu`` in ``results/summary.json``; return it.

    ``open_loop.two_gpu_capacity_rps`` and ``open_loop.generator_verified_rps`` come from the same sitting
    (``results_report`` hands :func:`summary` to ``open_loop_results.summary``).
    """
    block = summary(root)
    if block is not None:
        merge_summary(root, "two_gpu", block)
    return block


def section(root: Path) -> list[str]:
    """RESULTS' section: capacity per layout, two over one, the generator's proof (empty without a sitting)."""
    block = summary(root)
    if block is None:
        return []
    rows = []
    for name, ref in block["per_layout"].items():
        if ref is None:
            continue
        rows.append(
            [
                name,
                f"`{ref['spec']}`",
                str(ref["server_cpus"]),
                str(ref["client_cpus"]),
                f"{ref['cores_per_gpu']:g}" if ref["cores_per_gpu"] is not None else "n/a",
                fmt(ref["capacity_rps"]) + ("" if ref["capacity_bounded"] else " (lower bound)"),
                "yes" if ref["comparable"] else "no",
            ]
        )
    gen = block["generator_verified_rps"]
    return [
        f"## Two GPUs against one at equal cores per GPU (`{block['sitting']}`)",
        "",
        f"{block['device']}; capacity at p99 <= {block['slo_p99_ms']:g} ms (Poisson, open loop); layouts: "
        "`one` GPU with C server cores, "
        "`two` GPUs in one server with 2C, one server per GPU (`perserver`, C each); the generator on its own "
        "cores (`scripts/lab/two_gpu.sh`).",
        "",
        *markdown_table(
            [
                "layout",
                "best variant",
                "server cores",
                "generator cores",
                "cores per GPU",
                "capacity req/s",
                "comparable",
            ],
            rows,
        ),
        "",
        f"Two GPUs / one GPU: {fmt(block['two_over_one'], '.2f')} (target >= {TARGET_RATIO:g}: "
        f"{'met' if block['target_met'] else '**missed**'}). Generator on schedule against the null model up to "
        f"{fmt(gen) if gen is not None else 'not measured'} req/s"
        + (
            ""
            if block["generator_covers"] is None
            else f" ({'at least' if block['generator_covers'] else '**below**'} {GENERATOR_MARGIN:g}x the two-GPU "
            "capacity)"
        )
        + ".",
        "",
    ]
