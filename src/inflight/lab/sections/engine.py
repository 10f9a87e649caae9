"""RESULTS-ab-runs' "Engine level" section: the engine-only bound, the executors, the engines and their targets."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.entries import executor_rows, is_executor_row
from inflight.lab.sections import Section, fmt, markdown_table, pct

TITLE = "Engine level"

#: The compiled-engine issue's targets (bert_tiny, seq 64, the served engine in fp16).
ENGINE_TARGET_US = {2048: 600.0, 512: 180.0}
ENGINE_TARGET_SPEEDUP = 3.0
ENGINE_TARGET_MAX_ERROR = 2e-2
ENGINE_TARGET_MIXED_RATIO = 0.8
ENGINE_TARGET_LOAD_S = 30.0


def engine_targets(rows: list[Mapping[str, Any]], mixed: float | None) -> list[tuple[str, str, str, bool | None]]:
    """The engine issue's targets from an engine bench's engine rows: (figure, value, wanted, met)."""
    served = [r for r in rows if "(served)" in r["engine"] and r.get("precision") == "fp16" and not r.get("workload")]
    masked = {r["batch"]: r for r in rows if "(served)" in r["engine"] and r.get("workload")}
    before = {r["batch"]: r for r in rows if "engine before" in r["engine"]}
    by_batch = {r["batch"]: r for r in served}
    targets: list[tuple[str, str, str, bool | None]] = []
    for batch, limit in sorted(ENGINE_TARGET_US.items(), reverse=True):
        r = by_batch.get(batch)
        if r is not None:
            us = r["engine_us_per_batch"]
            targets.append(
                (f"served engine, fp16, batch {batch} x 64", f"{us:,.1f} µs", f"<= {limit:,.0f} µs", us <= limit)
            )
    for batch, limit in sorted(ENGINE_TARGET_US.items(), reverse=True):
        r = masked.get(batch)
        if r is not None:
            us = r["engine_us_per_batch"]
            how = f"{r['unpadded_launches']} unpadded launch" if r.get("unpadded_launches") else "padded"
            targets.append(
                (
                    f"served engine, fp16, batch {batch} x 64, lengths 1-64 ({how})",
                    f"{us:,.1f} µs",
                    f"<= {limit:,.0f} µs",
                    us <= limit,
                )
            )
    if 2048 in by_batch and 2048 in before:
        x = before[2048]["engine_us_per_batch"] / by_batch[2048]["engine_us_per_batch"]
        targets.append(
            (
                "speed-up over the engine before, batch 2048",
                f"{x:.2f}x",
                f">= {ENGINE_TARGET_SPEEDUP:g}x",
                x >= ENGINE_TARGET_SPEEDUP,
            )
        )
    for r in rows:
        if "(served)" in r["engine"] and not r.get("workload") and r["batch"] == max(by_batch, default=0):
            err = r.get("max_abs_error_vs_fp32_cpu")
            if err is not None:
                targets.append(
                    (
                        f"max abs error, {r.get('precision')}",
                        f"{err:.2e}",
                        f"<= {ENGINE_TARGET_MAX_ERROR:g}",
                        err <= ENGINE_TARGET_MAX_ERROR,
                    )
                )
    if mixed is not None:
        targets.append(
            (
                "mixed lengths (16-128) / uniform 64 tokens per second, batch 2048",
                f"{mixed:.3f}",
                f">= {ENGINE_TARGET_MIXED_RATIO:g}",
                mixed >= ENGINE_TARGET_MIXED_RATIO,
            )
        )
    loads = [float(r["load_s"]) for r in served if r.get("load_s") is not None]
    if loads:
        targets.append(
            (
                "served engine load (compile + capture), s",
                f"{max(loads):.1f}",
                f"<= {ENGINE_TARGET_LOAD_S:g}",
                max(loads) <= ENGINE_TARGET_LOAD_S,
            )
        )
    return targets


def collect(root: Path) -> dict[str, Any] | None:
    """``results/engine_bench.json`` and where it is (None when it is missing)."""
    path = root / "results" / "engine_bench.json"
    return {"path": path, "root": root, "doc": json.loads(path.read_text())} if path.is_file() else None


def render(data: Mapping[str, Any]) -> list[str]:
    """The engine-level benchmark table, the engines compared and the engine issue's targets."""
    path, root, doc = data["path"], data["root"], data["doc"]
    cfg = doc.get("config", {})
    lines = [
        f"## Engine level: engine-only bound vs sync vs pipelined executor (`{path.relative_to(root)}`)",
        "",
        f"Device {doc['device']}, driver {doc.get('driver', '?')}, "
        + ", ".join(f"{k} {v}" for k, v in doc.get("versions", {}).items())
        + f"; model {cfg.get('model')}, seq {cfg.get('seq_len')}, {cfg.get('items_per_request')} items per request, "
        f"{cfg.get('iters')} batches per measurement, {cfg.get('slots')} slots, {cfg.get('response_threads')} "
        "sender threads (responses only counted: no server).",
        "",
        "Reproduce: `inflight bench-engine --repository model_repository` on the GPU host.",
        "",
    ]
    rows = []
    for r in executor_rows(doc):  # the engine variants' rows come below
        rows.append(
            [
                str(r["batch"]),
                fmt(r["engine_bound_items_s"]),
                fmt(r["sync_items_s"]),
                fmt(r["pipelined_items_s"]) + f" ({r.get('pipelined_wait_mode', '?')})",
                pct(r["pipelined_fraction_of_bound"]),
                pct(r.get("engine_bound_gpu_activity")),
                pct(r.get("sync_gpu_activity")),
                pct(r.get("pipelined_gpu_activity")),
                pct((r.get("traced_over_untraced_throughput") or {}).get("pipelined")),
            ]
        )
    lines += markdown_table(
        [
            "batch",
            "engine bound items/s",
            "sync items/s",
            "pipelined items/s (wait)",
            "pipelined / bound",
            "bound GPU activity",
            "sync GPU activity",
            "pipelined GPU activity",
            "pipelined traced / untraced",
        ],
        rows,
    )
    lines += [
        "",
        "Throughputs come from untraced passes; GPU activity (union of kernel, graph and copy intervals over "
        "the window, from CUPTI) from a traced pass of the same batches. *Bound GPU activity* is the activity of "
        "back-to-back graph replays alone: the gaps between the kernels inside one graph, which no executor can "
        "remove.",
        "",
    ]
    lines += engine_variants_section(doc)
    return lines


def engine_variants_section(doc: Mapping[str, Any]) -> list[str]:
    """The engines compared by one bench (rows with ``engine`` and ``engine_us_per_batch``) and the targets."""
    rows = [r for r in doc.get("rows", []) if not is_executor_row(r) and r.get("engine_us_per_batch") is not None]
    if not rows:
        return []
    peak = doc.get("peak")
    lines = [
        "Engines compared (one CUDA graph replayed back to back per batch size; *floor* = the larger of the "
        f"batch's FLOPs at the tensor peak and its bytes at the memory bandwidth, peaks used: {peak}; error = "
        "max abs difference from the fp32 CPU reference; load = compile and capture at load):",
        "",
    ]
    lines += markdown_table(
        ["engine", "batch", "µs per batch", "floor µs", "max abs error", "load s"],
        (
            [
                r["engine"],
                str(r["batch"]),
                fmt(r["engine_us_per_batch"], ",.1f"),
                fmt(r.get("floor_us_per_batch"), ",.1f"),
                fmt(r.get("max_abs_error_vs_fp32_cpu"), ".2e"),
                fmt(r.get("load_s"), ",.1f"),
            ]
            for r in rows
        ),
    )
    targets = engine_targets(rows, doc.get("mixed_length_token_ratio"))
    lines += ["", "| target | value | wanted | verdict |", "|---|---|---|---|"]
    lines += [f"| {f} | {v} | {w} | {'met' if ok else '**missed**'} |" for f, v, w, ok in targets]
    m = doc.get("mixed_length") or {}
    if m:
        lines.append("")
        lines.append(
            f"Mixed lengths: a batch of {m.get('batch')} items of lengths uniform in {m.get('lengths')}, grouped per "
            f"sequence bucket, ran as {len((m.get('mixed') or {}).get('launches') or [])} launches with "
            f"{100 * (m.get('padding_waste') or 0):.1f}% padding waste ({m.get('graphs')} graphs, "
            f"{fmt(m.get('graph_memory_mb'), ',.0f')} MB)."
        )
        lines += _not_served_lines(m)
    lines.append("")
    return lines


def _not_served_lines(m: Mapping[str, Any]) -> list[str]:
    """The same batches through the packed and the unpadded models (measured, not served), with verdicts."""
    rows: list[list[str]] = []
    served_uniform = (m.get("uniform") or {}).get("tokens_per_s")
    if served_uniform:
        rows.append(["served engine, uniform 64", fmt(m["uniform"]["seconds_per_batch"] * 1e6, ",.1f"), "1.000", ""])
        rows.append(
            [
                "served engine, mixed, grouped per bucket",
                fmt(m["mixed"]["seconds_per_batch"] * 1e6, ",.1f"),
                fmt(m["mixed"]["tokens_per_s"] / served_uniform, ".3f"),
                "",
            ]
        )
    pk = m.get("packed")
    if pk and served_uniform:
        rows.append(
            [
                f"packed rows of {pk['row_len']} (not served), mixed",
                fmt(pk["seconds_per_batch"] * 1e6, ",.1f"),
                fmt(pk["tokens_per_s"] / served_uniform, ".3f"),
                fmt(pk.get("max_abs_error_vs_fp32_cpu"), ".2e"),
            ]
        )
    up = m.get("unpadded") or {}
    names = {
        "uniform_unmasked": "unpadded (not served), uniform 64, every token unmasked",
        "uniform": "unpadded (not served), uniform 64, the requests' masked tails left out",
        "mixed": "unpadded (not served), mixed, masked tokens left out",
    }
    for key, label in names.items():
        r = up.get(key)
        if r and served_uniform:
            rows.append(
                [
                    label,
                    fmt(r["seconds_per_batch"] * 1e6, ",.1f"),
                    fmt(r["tokens_per_s"] / served_uniform, ".3f"),
                    fmt(r.get("max_abs_error_vs_fp32_cpu"), ".2e"),
                ]
            )
    if not rows:
        return []
    lines = [
        "",
        f"The same batch of {m.get('batch')} items through each way of running it (one CUDA graph replayed back to "
        "back; tokens per second count the requests' tokens, masked ones included, so every row does the same "
        "job; *ratio* = tokens per second over the served engine's uniform batch):",
        "",
    ]
    lines += markdown_table(["engine and batch", "µs per batch", "ratio", "max abs error"], rows)
    ratio = m.get("unpadded_token_ratio")
    if ratio is not None:
        verdict = "met" if ratio >= ENGINE_TARGET_MIXED_RATIO else "**missed**"
        lines += [
            "",
            f"Unpadded model, mixed / uniform 64 at batch {m.get('batch')} (the engine issue's mixed-length target, "
            f"measured on the engine level, not served): {ratio:.3f} against >= {ENGINE_TARGET_MIXED_RATIO:g}, "
            f"{verdict}.",
        ]
    return lines


SECTION = Section(title=TITLE, collect=collect, render=render)
