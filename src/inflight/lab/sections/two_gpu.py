"""RESULTS' "Two GPUs against one" section (issue 33), from ``results/two-gpu``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.entries import GENERATOR_MARGIN
from inflight.lab.sections import Section, capacity_cell, fmt, markdown_table
from inflight.lab.two_gpu_results import TARGET_RATIO, sitting_rows, summary

TITLE = "Two GPUs against one"


def collect(root: Path) -> dict[str, Any] | None:
    """The newest sitting's figures and every sitting's rows (None when no sitting measured one GPU and two)."""
    block = summary(root)
    return None if block is None else {"block": block, "sittings": sitting_rows(root)}


def render(data: Mapping[str, Any]) -> list[str]:
    """The section: capacity per layout and mode, two over one, the generator's proof, every sitting."""
    block = data["block"]
    rows = []
    for name, modes in block["per_layout_mode"].items():
        any_ref = next((r for r in modes.values() if r is not None), None)
        if any_ref is None:
            continue
        rows.append(
            [
                name,
                str(any_ref["server_cpus"]),
                str(any_ref["client_cpus"]),
                f"{any_ref['cores_per_gpu']:g}" if any_ref["cores_per_gpu"] is not None else "n/a",
                capacity_cell(modes["sync"]),
                capacity_cell(modes["pipelined"]),
            ]
        )
    gen = block["generator_verified_rps"]
    null = block.get("null_model")
    if gen is not None:
        proof = f"Generator on schedule against the null model up to {fmt(gen)} req/s" + (
            ""
            if block["generator_covers"] is None
            else f" ({'at least' if block['generator_covers'] else '**below**'} {GENERATOR_MARGIN:g}x the two-GPU "
            "capacity)"
        )
    elif null is not None:
        proof = (
            f"Generator proof **missed**: the null model met the SLO at none of the rates tried "
            f"({', '.join(fmt(r) for r in null['offered_rps'])} req/s, server on {null['server_cpus']}, generator on "
            f"{null['client_cpus']})"
        )
    else:
        proof = "Generator proof not run in this sitting"
    lines = [
        f"## Two GPUs against one at equal cores per GPU (`{block['sitting']}`)",
        "",
        f"{block['device']}; capacity at p99 <= {block['slo_p99_ms']:g} ms (Poisson, open loop, 50 items x seq 64); "
        "layouts: `one` GPU with C server cores, `two` GPUs in one server with 2C, one server per GPU "
        "(`perserver`, C each); sync is `<model>_sync` with C instances per GPU, pipelined is `<model>_inflight` "
        "as `inflight build-models` writes it for those cores and GPUs (`scripts/lab/two_gpu.sh`).",
        "",
        *markdown_table(
            ["layout", "server cores", "generator cores", "cores per GPU", "sync req/s", "pipelined req/s"], rows
        ),
        "",
        f"Two GPUs / one GPU: {fmt(block['two_over_one'], '.2f')} (target >= {TARGET_RATIO:g}: "
        f"{'met' if block['target_met'] else '**missed**'}). {proof}.",
    ]
    by_mode = {m: r for m, r in (block.get("two_over_one_by_mode") or {}).items() if r is not None}
    if by_mode:
        started = {
            m: sorted(
                r["started"] for lay in block["per_layout_mode"].values() if (r := lay.get(m)) and r.get("started")
            )
            for m in by_mode
        }
        lines += [
            "",
            "Per mode, its best two-GPU layout over its one GPU, and when its runs began (ratios hold within a lease): "
            + "; ".join(
                f"{m} {fmt(r, '.2f')}" + (f" (runs {started[m][0]} to {started[m][-1]})" if started[m] else "")
                for m, r in by_mode.items()
            )
            + ".",
        ]
    if null is not None and block.get("request_path_bound") is not None:
        lines += [
            "",
            f"The null model (Triton's request path, no model work) answered at most {fmt(null['max_answered_rps'])} "
            f"req/s on the two-GPU server's cores ({null['server_cpus']}): {fmt(block['request_path_bound'], '.2f')}x "
            "the one-GPU capacity, the most two GPUs could reach on those cores whatever the model does.",
        ]
    others = [b for b in data["sittings"] if b["sitting"] != block["sitting"]]
    if others:
        lines += [
            "",
            "Other sittings (the figures above are from the newest one that measured one GPU and two):",
            "",
            *markdown_table(
                [
                    "sitting",
                    "one GPU: server cores",
                    "one GPU: sync req/s",
                    "one GPU: pipelined req/s",
                    "two GPUs: best req/s",
                    "two / one",
                    "null model: cores, most answered/s",
                ],
                [
                    [
                        f"`{b['sitting']}`",
                        str(b["one_server_cpus"] or "n/a"),
                        capacity_cell(b["one"]["sync"]),
                        capacity_cell(b["one"]["pipelined"]),
                        capacity_cell(b["two"]),
                        "n/a" if b["two_over_one"] is None else fmt(b["two_over_one"], ".2f"),
                        "not run"
                        if b["null_model"] is None
                        else f"{b['null_model']['server_cpus']} (generator {b['null_model']['client_cpus']}, "
                        f"{b['null_model']['processes']} processes): {fmt(b['null_model']['max_answered_rps'])}",
                    ]
                    for b in others
                ],
            ),
        ]
    return [*lines, ""]


SECTION = Section(title=TITLE, collect=collect, render=render, summary_key="two_gpu", summarize=summary)
