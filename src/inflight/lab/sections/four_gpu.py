"""RESULTS' "Four GPUs against one" section (issue 54), from ``results/four-gpu``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.entries import GENERATOR_MARGIN
from inflight.lab.four_gpu_results import summary
from inflight.lab.sections import Section, capacity_cell, fmt, markdown_table, pct

TITLE = "Four GPUs against one"


def _gauge(ref: Mapping[str, Any] | None) -> str:
    act = None if ref is None else ref.get("instance_gauge_by_gpu")
    if not act:
        return "not measured"
    return ", ".join(f"{k} {pct(v)}" for k, v in act.items())


def _util(ref: Mapping[str, Any] | None) -> str:
    util = None if ref is None else ref.get("util_by_gpu")
    if not util:
        return "not sampled"
    return ", ".join(f"GPU {k} {pct(v)}" for k, v in util.items())


def _cap(ref: Mapping[str, Any] | None) -> str:
    """``capacity_cell``, "not run" also for a variant that met the SLO at none of its rates."""
    return capacity_cell(None if ref is None or ref.get("capacity_rps") is None else ref)


def collect(root: Path) -> dict[str, Any] | None:
    """The newest sitting that measured one GPU and four (None when there is none)."""
    return summary(root)


def render(block: Mapping[str, Any]) -> list[str]:
    """Capacity per layout, four over one, each GPU's activity at capacity, the balancer's cost, the generator."""
    rows = [["one GPU (its server alone, via the GPU's route)", *_row(block["one_gpu"])]]
    rows += [[name, *_row(ref)] for name, ref in block["per_layout"].items()]
    nulls = block["null_model"]
    rows += [[f"null model ({r})", *_row(ref)] for r, ref in nulls.items()]
    gen = block["generator_verified_rps"]
    lines = [
        f"## Four GPUs against one (`{block['sitting']}`)",
        "",
        f"{block['device']}; capacity at p99 <= {block['slo_p99_ms']:g} ms (Poisson, open loop, 32 sequences of "
        "real lengths 16-128 a request), equal server cores per GPU, the generator on cores of its own "
        "(`scripts/lab/four_gpu.sh`). Latency and nginx's CPU are medians over the rounds' windows at that rate; "
        "late: the largest fraction of a window's requests the generator sent late.",
        "",
        *markdown_table(
            [
                "layout",
                "server cores",
                "generator cores",
                "req/s at the SLO",
                "p50 / p99 there (ms)",
                "server cores busy there",
                "late (max)",
                "nginx there",
                "GPU utilization there (nvidia-smi)",
                "instances' CUPTI gauge",
            ],
            rows,
        ),
        "",
        f"Four GPUs ({block['layout']}) / one GPU: {fmt(block['four_over_one'], '.2f')} (target >= "
        f"{block['target_ratio']:g}: {'met' if block['target_met'] else '**missed**'})"
        + (
            f"; one GPU missed the SLO at its next rate, so the ratio is at least {block['four_over_one_floor']:.2f}"
            if block.get("four_over_one_floor")
            else ""
        )
        + ". GPU activity at that "
        f"capacity (target >= {pct(block['target_activity'])} on every GPU): "
        + (
            f"the least busy GPU {pct(block['gpu_activity_min'])} by nvidia-smi "
            f"({'met' if block['gpu_activity_min'] >= block['target_activity'] else '**missed**'})"
            if block["gpu_activity_min"] is not None
            else "**not measured**: this sitting's windows did not sample nvidia-smi, and the last column is the mean "
            "over a GPU's instances of each process's own kernel time over wall time, which is not the GPU's "
            "activity when eight processes share it (their intervals overlap under time-slicing; an idle server's "
            "gauge keeps its last value)"
        )
        + ".",
    ]
    if nulls:
        lines += [
            "",
            "The null model (Triton's request path, no model work) through nginx against direct to the servers is "
            "the balancer's own cost.",
        ]
    lines += [
        "",
        (
            f"Generator on schedule against the null model up to {fmt(gen)} req/s "
            f"({'at least' if gen >= GENERATOR_MARGIN * block['four_gpu_rps'] else '**below**'} "
            f"{GENERATOR_MARGIN:g}x the four-GPU capacity)."
        )
        if gen is not None
        else "Generator proof: the null model met the SLO at none of its rates.",
        "",
    ]
    return lines


def _row(ref: Mapping[str, Any] | None) -> list[str]:
    if ref is None:
        return ["n/a", "n/a", "not run", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a"]
    nginx = (
        f"{ref['nginx_cores']:.2f} cores, {ref['nginx_us_per_request']:.0f} µs/request"
        if ref.get("nginx_cores") is not None
        else "not in the path"
    )
    return [
        str(ref["server_cpus"]),
        str(ref["client_cpus"]),
        _cap(ref),
        f"{fmt(ref.get('p50_ms'), '.1f')} / {fmt(ref.get('p99_ms'), '.1f')}",
        fmt(ref.get("server_cores_busy"), ".1f"),
        pct(ref.get("late_fraction_max")),
        nginx,
        _util(ref),
        _gauge(ref),
    ]


SECTION = Section(title=TITLE, collect=collect, render=render, summary_key="four_gpu", summarize=summary)
