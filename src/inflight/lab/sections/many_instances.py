"""RESULTS-ab-runs' "Many instances: the deferred response path's ceiling", from ``results/pipelined-ceiling``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.sections import Section, fmt, markdown_table, pct, span
from inflight.lab.sections.one_instance import kind_label, kind_of, read_runs

TITLE = "Many instances: the deferred response path's ceiling"


#: Where the many-instance A/Bs with the CPU accounting and the deferred null model are kept.
PIPELINED_CEILING_DIR = "pipelined-ceiling"


def _cpu_sets_cell(doc: Mapping[str, Any]) -> str:
    """``server / Locust`` cores of an A/B that pinned them apart, else ``shared``."""
    sets = (doc.get("load") or {}).get("cpu_sets") or {}
    return f"{sets['server']} / {sets['client']}" if sets.get("isolated") else "shared"


def collect(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Each A/B file under ``results/pipelined-ceiling`` (its path from ``root``) and its document."""
    return read_runs(root, PIPELINED_CEILING_DIR)


def render(runs: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """Many instances: each variant's req/s beside the sync one of its A/B, with the server's CPU per request.

    A/Bs that hold a sync variant: every variant's ratio to the best sync of the same file (same
    server, same lane, consecutive windows), its instances, what it is (the null model returning or
    deferring its responses, sync, pipelined) and the CPU figures of the runner (``inflight.loadtest.cpu``).
    The verdict on "the best pipelined configuration serves more than the best sync one" is computed
    per file, and the deferred null model at the sync's instance count shows what a pipelined executor
    of zero cost would serve.
    """
    from inflight.loadtest.stats import config_instances

    rows: list[list[str]] = []
    best_ratios: list[float] = []
    deferred_ratios: list[float] = []
    rankings: list[tuple[str, ...]] = []
    for path, doc in runs:
        variants = {v["label"]: v for v in doc.get("variants", [])}
        summary = [x for x in doc.get("summary", []) if x.get("rps") and x.get("variant") in variants]
        kinds = {label: kind_of(v) for label, v in variants.items()}
        syncs = [x for x in summary if kinds[x["variant"]] == "sync"]
        if not syncs:
            continue
        best_sync = max(syncs, key=lambda x: float(x["rps"]))
        sync_n = config_instances(variants[best_sync["variant"]].get("config") or {})
        cpu_by_kind: dict[str, float] = {}
        pipes = [x for x in summary if kinds[x["variant"]] == "pipelined"]
        if pipes:
            best_ratios.append(max(float(x["rps"]) for x in pipes) / float(best_sync["rps"]))
        for x in summary:
            v = variants[x["variant"]]
            cfg = v.get("config") or {}
            n = config_instances(cfg)
            ratio = float(x["rps"]) / float(best_sync["rps"])
            kind = kinds[x["variant"]]
            if kind == "deferred null" and n == sync_n:
                deferred_ratios.append(ratio)
            cpu = x.get("cpu") or {}
            us = cpu.get("server_us_per_request")
            if kind in ("sync", "deferred null", "pipelined") and isinstance(us, (int, float)) and math.isfinite(us):
                cpu_by_kind[kind] = min(cpu_by_kind.get(kind, math.inf), float(us))
            rows.append(
                [
                    f"`{path}`",
                    str((doc.get("load") or {}).get("protocol", "?")),
                    f"`{x['spec']}`",
                    kind_label(v),
                    str(n),
                    fmt(x["rps"]),
                    fmt(ratio, ".2f", "x"),
                    fmt(cpu.get("server_us_per_request"), ",.0f"),
                    fmt(cpu.get("stub_cores"), ".1f"),
                    fmt(cpu.get("other_cores"), ".1f"),
                    pct(cpu.get("host_busy")) + (f" of {cpu['host_cores']}" if cpu.get("host_cores") else ""),
                    _cpu_sets_cell(doc),
                    "yes" if x.get("client_limited") else "no",
                ]
            )
        if len(cpu_by_kind) > 1:
            rankings.append(tuple(sorted(cpu_by_kind, key=lambda k: cpu_by_kind[k])))
    if not rows:
        return []
    lines = [
        f"## Many instances: the deferred response path's ceiling (`results/{PIPELINED_CEILING_DIR}`)",
        "",
        "Each A/B ran under the published load on one GPU: the 2026-11-21 ones on one lane of a two-GPU host (16 "
        "cores for the server and Locust together), later ones with the server and Locust pinned to disjoint cores "
        "(*CPU sets*: server / Locust; then *busy* and *rest* are the server's cores'). *vs best sync* divides by the "
        "best sync variant of the same file. The null model with "
        "`sender_threads` defers every response to sender threads after a stand-in device time (`sleep_us` per batch, "
        "batches one after another): a pipelined executor whose own work costs nothing. *server CPU* is the CPU "
        "time of tritonserver and its stub processes per successful request over the window; *stubs* and *rest* "
        "(Locust, the runner) are in cores; *busy* is the lane's cores' busy share (`inflight.loadtest.cpu`). "
        "*client-limited*: Locust's CPU passed 90% at some point of the window.",
        "",
    ]
    lines += markdown_table(
        [
            "A/B",
            "protocol",
            "variant",
            "what it is",
            "instances",
            "req/s",
            "vs best sync",
            "server CPU µs / request",
            "stubs (cores)",
            "rest (cores)",
            "cores busy",
            "CPU sets",
            "client-limited",
        ],
        rows,
    )
    lines.append("")
    if best_ratios:
        lines.append(
            f"- Target: the best pipelined configuration serves more than the best sync one. Measured (per A/B, best "
            f"pipelined / best sync): {span(best_ratios)}; "
            f"**{'met' if min(best_ratios) > 1 else 'missed'}**."
        )
    if deferred_ratios:
        lines.append(
            f"- The deferred null model at the sync's instance count serves {span(deferred_ratios)} the best sync: "
            "a pipelined executor of zero cost on Triton 2.51's "
            "response-sender path "
            + (
                "serves less than the sync baseline, so no executor on this path can beat it here."
                if max(deferred_ratios) <= 1.0
                else "at best ties the sync baseline, so beating it needs an executor within a few percent of zero "
                "cost, which ours is not."
                if max(deferred_ratios) < 1.1
                else "passes the sync baseline; the gap to it is the executor's own cost."
            )
        )
    if rankings:
        longest = max(rankings, key=len)
        consistent = all(
            [k for k in longest if k in r] == list(r) for r in rankings
        )  # every file orders the kinds it has as the longest ranking does
        lines.append(
            "- Server CPU per request, least first (the lowest of each kind in an A/B): "
            + (
                f"{' < '.join(longest)} in every A/B that has them ({len(rankings)})."
                if consistent
                else "; ".join(" < ".join(r) for r in rankings) + " (not the same order in every A/B)."
            )
        )
    lines.append("")
    return lines


SECTION = Section(title=TITLE, collect=collect, render=render)
