"""RESULTS' "One server per GPU" section (``inflight ab --server-per-gpu``), from ``results/per-gpu-servers``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.sections import Section, fmt, markdown_table
from inflight.lab.sections.one_instance import read_runs

TITLE = "One server per GPU"

#: Folder of the open-loop sittings that compare one server per GPU with one server (``--server-per-gpu``).
PER_GPU_SERVERS_DIR = "per-gpu-servers"


def deployment_cell(doc: Mapping[str, Any]) -> str:
    """How an A/B run's servers were laid out: one per GPU with their cores, or one with its cores."""
    servers = (doc.get("server") or {}).get("per_gpu_servers") or []
    if servers:
        return f"{len(servers)} server{'s' if len(servers) > 1 else ''}, one per GPU: " + ", ".join(
            f"GPU {x['gpu']} on cores {x['cpus'] or 'any'}" for x in servers
        )
    sets = (doc.get("load") or {}).get("cpu_sets") or {}
    return f"1 server on cores {sets.get('server') or 'any'}"


def collect(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Each A/B file under ``results/per-gpu-servers`` (its path from ``root``) and its document."""
    return read_runs(root, PER_GPU_SERVERS_DIR)


def render(runs: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """One server per GPU against one server: capacity at the SLO of every run."""
    rows = []
    for p, doc in runs:
        for v in doc.get("summary", []):
            at = v.get("capacity_point") or {}
            first_miss: dict[str, Any] = next(
                (w for w in sorted(v.get("sweep") or [], key=lambda w: w["offered_rps"]) if w.get("slo_misses")),
                {},
            )
            rows.append(
                [
                    f"[`{p.parent.name}`](../{p})",
                    deployment_cell(doc),
                    f"`{v['spec']}`",
                    fmt(v.get("capacity_rps")),
                    fmt(at.get("p99_ms"), ",.1f"),
                    fmt(at.get("avg_batch_requests"), ",.1f"),
                    fmt(at.get("server_us_per_request")),
                    fmt(first_miss.get("offered_rps")),
                    fmt(first_miss.get("p99_ms"), ",.1f"),
                    "yes" if v.get("comparable") else "no",
                ]
            )
    return [
        f"## One server per GPU (`results/{PER_GPU_SERVERS_DIR}`)",
        "",
        "Open-loop capacity at p99 <= 50 ms of one tritonserver per GPU (`inflight ab --server-per-gpu 0,1`: "
        "each server sees its GPU alone and runs on its half of the server cores, the generator's sources "
        "split evenly between them) beside one server on one GPU with all the server cores and with half of "
        "them, in one sitting. 'At capacity' columns are the window at the capacity; 'first miss' is the "
        'lowest rate tried that missed the SLO. `docs/LAB.md` ("One server per GPU") reads them.',
        "",
        *markdown_table(
            [
                "run",
                "deployment",
                "variant",
                "capacity req/s",
                "p99 ms at capacity",
                "batch (requests) at capacity",
                "server CPU us/request at capacity",
                "first miss req/s",
                "its p99 ms",
                "comparable",
            ],
            rows,
        ),
        "",
    ]


SECTION = Section(title=TITLE, collect=collect, render=render)
