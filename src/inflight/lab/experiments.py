"""The published experiment plan, in parts that each fit one GPU-host call, and its summary.

``scripts/lab/run_experiments.sh`` runs the parts (resumable: a finished part is skipped); this
module names the variants of each part, picks the best configuration of each execution mode
from the A/B results, lists the batch sizes the runs formed (for the engine-only bound) and
writes ``results/summary.json`` from the JSON files only.

The sync variants reproduce the published stock-TensorRT-backend configurations with our sync
mode (same engine, buffers and graphs as the pipelined mode, one batch at a time, wait after
each). "CUDA graphs" in the published plan is the TensorRT backend's graph option; here it is the
backend's ``cuda_graphs`` parameter (off in the configurations that had it off).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inflight.lab.entries import read_ab

#: part -> variant specs (``model@key=value,...``). Every part fits a 10-minute call at 60 s windows, with
#: room for a variant that is slow to unload (the published sync-a group is split in two for that). The plan ran
#: when ``<model>_inflight`` was written pipelined (one instance, 4 slots); it is written ``mode=auto`` now, so a
#: rerun of the pipelined parts needs ``mode=pipelined`` added to compare with the published figures.
PLAN: dict[str, tuple[str, ...]] = {
    "sync-a1": (
        "bert_tiny_sync@instances=4,delay_us=500,cuda_graphs=false",
        "bert_tiny_sync@instances=4,delay_us=500,preferred=512/1024/2000,cuda_graphs=false",
    ),
    "sync-a2": (
        "bert_tiny_sync@instances=4,delay_us=500,preferred=1024/1500/2000,cuda_graphs=false",
        "bert_tiny_sync@instances=8,delay_us=500,cuda_graphs=false",
    ),
    "sync-b": (
        "bert_tiny_sync@instances=6,delay_us=1000,cuda_graphs=false",
        "bert_tiny_sync@instances=6,delay_us=500,cuda_graphs=true",
        "bert_tiny_sync@instances=1,delay_us=500,cuda_graphs=true",
    ),
    "pipe-a": (
        "bert_tiny_inflight@instances=1,slots=2",
        "bert_tiny_inflight@instances=1,slots=4",
        "bert_tiny_inflight@instances=2,slots=2",
        "bert_tiny_inflight@instances=2,slots=4",
    ),
    "pipe-b": (
        "bert_tiny_inflight@instances=4,slots=2",
        "bert_tiny_inflight@instances=4,slots=4",
    ),
    "heads-a": (
        "linear_head_sync",
        "linear_head_inflight",
        "stacked_head_sync",
        "stacked_head_inflight",
    ),
    "heads-b": (
        "seqlen_head_sync",
        "seqlen_head_inflight",
    ),
}
#: parts whose A/B results compete for "best sync" / "best pipelined" (bert_tiny)
SYNC_PARTS = ("sync-a1", "sync-a2", "sync-b")
PIPELINED_PARTS = ("pipe-a", "pipe-b")


def latest_ab(folder: Path) -> Path | None:
    """The newest ``ab-*.json`` in ``folder`` (None when there is none)."""
    files = sorted(folder.glob("ab-*.json"))
    return files[-1] if files else None


def part_results(root: Path, parts: Sequence[str]) -> list[tuple[str, dict[str, Any], Path]]:
    """``(part, summary entry, file)`` for every variant of the newest A/B result of each part."""
    out: list[tuple[str, dict[str, Any], Path]] = []
    for part in parts:
        path = latest_ab(root / part)
        if path is None:
            continue
        doc = read_ab(path)
        out += [(part, s, path) for s in doc.get("summary", [])]
    return out


def best(root: Path, parts: Sequence[str]) -> tuple[str, dict[str, Any], Path] | None:
    """The variant with the most items/s among ``parts`` (valid runs only)."""
    entries = [e for e in part_results(root, parts) if e[1].get("valid") and _finite(e[1].get("items_per_s"))]
    return max(entries, key=lambda e: float(e[1]["items_per_s"])) if entries else None


def formed_batches(root: Path) -> list[int]:
    """Average batch sizes (items) the bert_tiny runs formed, rounded to 50 items, ascending."""
    sizes = set()
    for _, s, _ in part_results(root, (*SYNC_PARTS, *PIPELINED_PARTS)):
        items = (s.get("server") or {}).get("avg_batch_items")
        if isinstance(items, (int, float)) and math.isfinite(items) and items >= 1:
            sizes.add(max(50, round(float(items) / 50.0) * 50))
    return sorted(sizes)


def bound_at(bound_doc: Mapping[str, Any], items: float | None) -> float | None:
    """Engine-only bound (items/s) measured at the batch size closest to ``items``."""
    rows = bound_doc.get("rows", [])
    if not rows or items is None or not _finite(items):
        return None
    row = min(rows, key=lambda r: abs(int(r["batch"]) - float(items)))
    return float(row["engine_bound_items_s"])


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def summary(root: Path) -> dict[str, Any]:
    """``results/summary.json``: the best sync and best pipelined configurations, side by side.

    Args:
        root: The experiments folder (``results/experiments``).

    Raises:
        ValueError: when a part the summary needs has no result yet (it names the part to run).
    """
    bs, bp = best(root, SYNC_PARTS), best(root, PIPELINED_PARTS)
    if bs is None or bp is None:
        missing = [p for p in (*SYNC_PARTS, *PIPELINED_PARTS) if latest_ab(root / p) is None]
        raise ValueError(
            f"no valid A/B result for {missing or 'sync/pipelined'}; run scripts/lab/run_experiments.sh first"
        )
    (_, sync, sync_file), (_, pipe, pipe_file) = bs, bp
    bound_path = root / "engine_bound.json"
    bound_doc = json.loads(bound_path.read_text()) if bound_path.is_file() else {}
    pipe_items = (pipe.get("server") or {}).get("avg_batch_items")
    bound = bound_at(bound_doc, pipe_items) if bound_doc else None
    nsys_path = root / "nsys" / "summary.json"
    nsys = json.loads(nsys_path.read_text()) if nsys_path.is_file() else {}
    by_label = {f["label"]: f["summary"] for f in nsys.get("files", [])}
    pipe_nsys = by_label.get("best_pipelined") or {}
    sync_nsys = by_label.get("best_sync") or {}
    doc = json.loads(pipe_file.read_text())
    profiled = {mode: nsys_spec(root / "nsys" / f"best_{mode}" / "run.json") for mode in ("sync", "pipelined")}
    notes = [
        f"the nsys profile of the best {mode} configuration ran {profiled[mode]}, not {best_spec} (it was chosen "
        "from an earlier call's results); its figures describe the configuration it ran"
        for mode, best_spec in (("sync", sync["spec"]), ("pipelined", pipe["spec"]))
        if profiled[mode] is not None and profiled[mode] != best_spec
    ]
    return {
        "device": (doc.get("device") or {}).get("name", "unknown"),
        "pipelined_over_sync_items_per_s": float(pipe["items_per_s"]) / float(sync["items_per_s"]),
        "pipelined_gpu_temporal_activity": pipe_nsys.get("gpu_activity"),
        "pipelined_fraction_of_engine_bound": (float(pipe["items_per_s"]) / bound) if bound else None,
        "pipelined_p99_ms": (pipe.get("latency_ms") or {}).get("p99"),
        "sync_p99_ms": (sync.get("latency_ms") or {}).get("p99"),
        "detail": {
            "best_sync": {"spec": sync["spec"], "items_per_s": sync["items_per_s"], "file": str(sync_file)},
            "best_pipelined": {"spec": pipe["spec"], "items_per_s": pipe["items_per_s"], "file": str(pipe_file)},
            "sync_gpu_temporal_activity": sync_nsys.get("gpu_activity"),
            "engine_bound_items_per_s": bound,
            "engine_bound_file": str(bound_path) if bound_doc else None,
            "nsys_file": str(nsys_path) if nsys else None,
            "driver": (doc.get("device") or {}).get("driver"),
            "window_s": (doc.get("load") or {}).get("window_s"),
            "nsys_profiled": profiled,
            "notes": notes,
        },
    }


def nsys_spec(run_json: Path) -> str | None:
    """The variant (``model@key=value,...``) an nsys profile served, from its ``run.json``."""
    import shlex

    if not run_json.is_file():
        return None
    words = shlex.split(json.loads(run_json.read_text()).get("server", ""))
    words = words[words.index("serve") + 1 :] if "serve" in words else words  # past python's own -m
    for flag in ("-m", "--model"):
        if flag in words and words.index(flag) + 1 < len(words):
            return words[words.index(flag) + 1]
    return None
