"""``inflight results-report``: docs/RESULTS.md generated from the JSON files under ``results/`` only.

Every figure in the page is read from a result file written by a command (the engine bench,
``inflight ab``, the nsys summary); the page names the file and the command that reproduces it.
Nothing is typed by hand.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from inflight.lab import (
    cost_results,
    faults,
    gpu_bound_results,
    heads_results,
    models_results,
    modes_results,
    open_loop_results,
    two_gpu_results,
)
from inflight.lab.open_loop_results import markdown_table, report_file
from inflight.loadtest import report
from inflight.variants import parse_variant_arg


def _fmt(v: Any, spec: str = ",.0f", suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{format(v, spec)}{suffix}"


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


#: The column headers of :func:`_load_cells`.
_LOAD_HEADERS = ["req/s", "items/s", "p50 ms", "p95 ms", "p99 ms"]


def _load_cells(s: dict[str, Any]) -> list[str]:
    """req/s, items/s, p50, p95 and p99 ms of one A/B summary entry, as table cells (headers: ``_LOAD_HEADERS``)."""
    lat = s.get("latency_ms") or {}
    return [
        _fmt(s.get("rps")),
        _fmt(s.get("items_per_s")),
        *(_fmt(lat.get(p), ",.1f") for p in ("p50", "p95", "p99")),
    ]


def _span(values: Iterable[float]) -> str:
    """``1.20x`` for one value (or equal ones), ``1.10x to 1.20x`` for several."""
    v = list(values)
    lo, hi = f"{min(v):.2f}x", f"{max(v):.2f}x"
    return lo if lo == hi else f"{lo} to {hi}"


def engine_section(path: Path, root: Path) -> list[str]:
    """The engine-level benchmark table."""
    doc = json.loads(path.read_text())
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
    for r in open_loop_results.executor_rows(doc):  # the engine variants' rows come below
        rows.append(
            [
                str(r["batch"]),
                _fmt(r["engine_bound_items_s"]),
                _fmt(r["sync_items_s"]),
                _fmt(r["pipelined_items_s"]) + f" ({r.get('pipelined_wait_mode', '?')})",
                _pct(r["pipelined_fraction_of_bound"]),
                _pct(r.get("engine_bound_gpu_activity")),
                _pct(r.get("sync_gpu_activity")),
                _pct(r.get("pipelined_gpu_activity")),
                _pct((r.get("traced_over_untraced_throughput") or {}).get("pipelined")),
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


def engine_variants_section(doc: Mapping[str, Any]) -> list[str]:
    """The engines compared by one bench (rows with ``engine`` and ``engine_us_per_batch``) and the targets."""
    rows = [
        r
        for r in doc.get("rows", [])
        if not open_loop_results.is_executor_row(r) and r.get("engine_us_per_batch") is not None
    ]
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
                _fmt(r["engine_us_per_batch"], ",.1f"),
                _fmt(r.get("floor_us_per_batch"), ",.1f"),
                _fmt(r.get("max_abs_error_vs_fp32_cpu"), ".2e"),
                _fmt(r.get("load_s"), ",.1f"),
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
            f"{_fmt(m.get('graph_memory_mb'), ',.0f')} MB)."
        )
        lines += _not_served_lines(m)
    lines.append("")
    return lines


def _not_served_lines(m: Mapping[str, Any]) -> list[str]:
    """The same batches through the packed and the unpadded models (measured, not served), with verdicts."""
    rows: list[list[str]] = []
    served_uniform = (m.get("uniform") or {}).get("tokens_per_s")
    if served_uniform:
        rows.append(["served engine, uniform 64", _fmt(m["uniform"]["seconds_per_batch"] * 1e6, ",.1f"), "1.000", ""])
        rows.append(
            [
                "served engine, mixed, grouped per bucket",
                _fmt(m["mixed"]["seconds_per_batch"] * 1e6, ",.1f"),
                _fmt(m["mixed"]["tokens_per_s"] / served_uniform, ".3f"),
                "",
            ]
        )
    pk = m.get("packed")
    if pk and served_uniform:
        rows.append(
            [
                f"packed rows of {pk['row_len']} (not served), mixed",
                _fmt(pk["seconds_per_batch"] * 1e6, ",.1f"),
                _fmt(pk["tokens_per_s"] / served_uniform, ".3f"),
                _fmt(pk.get("max_abs_error_vs_fp32_cpu"), ".2e"),
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
                    _fmt(r["seconds_per_batch"] * 1e6, ",.1f"),
                    _fmt(r["tokens_per_s"] / served_uniform, ".3f"),
                    _fmt(r.get("max_abs_error_vs_fp32_cpu"), ".2e"),
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


def _lane_line(path: Path) -> list[str]:
    """Where a part ran when scripts/lab/run_experiments_lanes.sh ran several side by side (its lane.json)."""
    f = path.parent / "lane.json"
    if not f.is_file():
        return []
    lane = json.loads(f.read_text())
    return [
        f"Ran in lane {lane.get('lane')} of {lane.get('lanes')} on a host of several GPUs "
        f"(CUDA_VISIBLE_DEVICES={lane.get('cuda_visible_devices')}, cores {lane.get('cpus')}), beside the other "
        "lanes' parts: compare the variants of this table first, across tables second.",
        "",
    ]


def _unload_lines(doc: dict[str, Any]) -> list[str]:
    """How each run's unload went (stalled, slow or in time), where the runner recorded it."""
    runs = doc.get("runs", [])
    if not any(r.get("unload_s") is not None for r in runs):
        return []
    parts = []
    for r in runs:
        tag = f"{r.get('variant')}{r.get('round', '')}"
        if r.get("unload_stalled"):
            q = (r.get("requests_at_stall") or {}).get("pending")
            parts.append(
                f"{tag} **not unloaded within {r.get('unload_s')} s** of the request"
                + ("" if q is None else f" (Triton's queue held {q} requests then)")
            )
        elif r.get("unload_slow"):
            parts.append(f"{tag} unloaded in {r.get('unload_s')} s (past --unload-timeout)")
        else:
            parts.append(f"{tag} unloaded in {r.get('unload_s')} s")
    return ["Unload after each window: " + "; ".join(parts) + ".", ""]


def ab_section(path: Path, root: Path) -> list[str]:
    """One A/B result: the side-by-side figures."""
    doc = json.loads(path.read_text())
    load = doc.get("load", {})
    dev = doc.get("device", {})
    summary = doc["summary"]
    base = summary[0].get("rps") or math.nan
    lines = [
        f"### `{path.relative_to(root)}`",
        "",
        f"{dev.get('name', '?')}, driver {dev.get('driver', '?')}; {load.get('users')} users x {load.get('items')} "
        f"items, seq {load.get('seq_len')}, {str(load.get('protocol', 'http')).upper()}, "
        f"{load.get('window_s')} s window after {load.get('warmup_s')} s warm-up, "
        f"{load.get('processes')} Locust processes, order {', '.join(load.get('order', []))}; "
        f"status {'valid' if doc.get('valid') else 'INVALID'}.",
        "",
        *_lane_line(path),
        "Reproduce: `inflight ab "
        + " ".join(f"'{s['spec']}'" for s in summary)
        + f" --preset {doc.get('preset')} --window {load.get('window_s')} --warmup {load.get('warmup_s')}"
        + (f" --protocol {load.get('protocol')}" if load.get("protocol", "http") != "http" else "")
        + (f" --repeat {load.get('repeat')}" if load.get("repeat", 1) > 1 else "")
        + "`",
        "",
    ]
    rows = []
    for s in summary:
        server = s.get("server") or {}
        gpu = s["gpu_activity"].get("mean") if isinstance(s.get("gpu_activity"), dict) else None
        sync = s["sync_share"].get("mean") if isinstance(s.get("sync_share"), dict) else None
        rows.append(
            [
                f"{s['variant']}: `{s['spec']}`",
                *_load_cells(s),
                str(s.get("failures")),
                _fmt(server.get("avg_batch_items"), ",.0f"),
                _pct(gpu),
                _pct(sync),
                _pct((s.get("cpu") or {}).get("host_busy")),
                _fmt((s.get("cpu") or {}).get("server_us_per_request"), ",.0f"),
                _fmt((s.get("rps") or math.nan) / base, ".2f", "x"),
            ]
        )
    lines += markdown_table(
        [
            "variant",
            *_LOAD_HEADERS,
            "failures",
            "avg batch",
            "GPU activity (live)",
            "sync share (live)",
            "cores busy",
            "server CPU µs / request",
            "req/s vs A",
        ],
        rows,
    )
    lines.append("")
    lines += _unload_lines(doc)
    execs = [(s, s.get("executor")) for s in summary if s.get("executor")]
    if execs:
        lines += [
            "Where each instance's time went (the backend's own counters, logged at unload; per execute() "
            "call or per batch, averaged over instances and rounds):",
            "",
        ]
        lines += markdown_table(
            [
                "variant",
                "execute() ms",
                "between execute() calls ms",
                "gather ms",
                "launch ms",
                "device wait ms",
                "send() µs / response",
                "deepest pipeline",
            ],
            (
                [
                    f"{s['variant']}",
                    _fmt(e.get("execute_ms"), ".2f"),
                    _fmt(e.get("between_executes_ms"), ".2f"),
                    _fmt(e.get("gather_ms"), ".2f"),
                    _fmt(e.get("launch_ms"), ".2f"),
                    _fmt(e.get("device_wait_ms"), ".2f"),
                    _fmt(e.get("send_call_us_per_response"), ",.0f"),
                    _fmt(e.get("max_depth"), ".0f"),
                ]
                for s, e in execs
            ),
        )
        lines.append("")
    return lines


def nsys_section(paths: list[Path], root: Path, title: str, reproduce: str) -> list[str]:
    """Nsys summaries side by side, under ``title``, with the command that ``reproduce``s them."""
    entries = []
    for p in paths:
        for f in json.loads(p.read_text()).get("files", []):
            run = p.parent / "run.json"
            meta = json.loads(run.read_text()) if run.is_file() else {}
            entries.append((p, f, meta))
    if not entries:
        return []
    lines = [f"## {title}", ""]
    for p, f, meta in entries:
        load = " ".join(str(meta.get("load", "?")).split())
        lines.append(
            f"- `{f['label']}`: server `{meta.get('server', '?')}`; load `{load}`; "
            f"capture {meta.get('window_s', '?')} s after {meta.get('delay_s', '?')} s of load "
            f"({meta.get('nsys_version', 'nsys')}); summary `{p.relative_to(root)}`"
        )
    lines.append("")
    keys = [
        ("GPU activity (union / wall)", lambda s: _pct(s.get("gpu_activity"))),
        ("sync share of CUDA API time", lambda s: _pct(s.get("sync_share"))),
        ("sync share on the threads that launch", lambda s: _pct(s.get("issue_sync_share"))),
        ("launch share of CUDA API time", lambda s: _pct(s.get("launch_share"))),
        ("dispatches / s", lambda s: _fmt(s.get("dispatches_per_s"))),
        ("dispatch median (µs)", lambda s: _fmt(s.get("dispatch_median_us"), ",.1f")),
        ("H2D average (bytes)", lambda s: _fmt(s.get("h2d_avg_bytes"))),
        ("idle gaps (median µs)", lambda s: _fmt(s.get("gap_median_us"), ",.1f")),
        ("sync calls", lambda s: _fmt(s.get("sync_calls"))),
        ("regime", lambda s: (s.get("verdict") or {}).get("regime", "n/a")),
        ("why", lambda s: (s.get("verdict") or {}).get("reason", "n/a")),
    ]
    header = ["figure", *[f["label"] for _, f, _ in entries]]
    rows = [[name, *[get(f["summary"]) for _, f, _ in entries]] for name, get in keys]
    lines += markdown_table(header, rows)
    lines += ["", f"Reproduce: `{reproduce}` on the GPU host.", ""]
    return lines


def live_window_section(path: Path, root: Path) -> list[str]:
    """The nsys summary and the live metrics scraped inside the same capture window (``gpu_session.sh samewindow``)."""
    from inflight.profiling.nsys_summary import LIVE_METRICS_FILE, live_gauge_text, read_live_metrics

    files = json.loads(path.read_text()).get("files", [])
    if not files:
        return []
    cols = []
    for f in files:
        folder = path.parent / f["label"]
        live = read_live_metrics(folder / LIVE_METRICS_FILE) or {}
        run = folder / "run.json"
        cols.append((f, live, json.loads(run.read_text()) if run.is_file() else {}))

    def gauge(live: dict[str, Any], key: str) -> str:
        return live_gauge_text(live, key, _pct)

    lines = [f"## nsys and live metrics over the same window (`{path.parent.relative_to(root)}/`)", ""]
    for f, _, meta in cols:
        lines.append(
            f"- `{f['label']}`: server `{meta.get('server', '?')}`, capture {meta.get('window_s', '?')} s "
            f"after {meta.get('delay_s', '?')} s of load; Triton's metrics scraped every second of it"
        )
    lines.append("")
    rows = [
        ["GPU activity (nsys: union of graph/kernel/copy intervals / wall)",
         *[_pct(f["summary"].get("gpu_activity")) for f, _, _ in cols]],
        ["GPU utilization, live (Triton `nv_gpu_utilization`, NVML)",
         *[gauge(live, "triton_gpu_utilization") for _, live, _ in cols]],
        ["GPU activity, live (backend CUPTI gauge)", *[gauge(live, "gpu_activity") for _, live, _ in cols]],
        ["sync share of CUDA API time (nsys)", *[_pct(f["summary"].get("sync_share")) for f, _, _ in cols]],
        ["sync share on the launching threads (nsys)",
         *[_pct(f["summary"].get("issue_sync_share")) for f, _, _ in cols]],
        ["sync share, live (backend CUPTI gauge)", *[gauge(live, "sync_share") for _, live, _ in cols]],
        ["batches between first and last scrape (backend counter)",
         *[_fmt(live.get("batches")) for _, live, _ in cols]],
        ["items per batch (backend counters)", *[_fmt(live.get("mean_batch_items")) for _, live, _ in cols]],
        ["regime (nsys)", *[(f["summary"].get("verdict") or {}).get("regime", "n/a") for f, _, _ in cols]],
    ]  # fmt: skip
    lines += markdown_table(["figure", *[f["label"] for f, _, _ in cols]], rows)
    notes = sorted({n for f, _, _ in cols for n in f.get("notes", []) if "live CUPTI" in n})
    lines += [""] + [f"- {n}" for n in notes]
    lines += [
        "",
        "The backend's CUPTI gauges cannot run under nsys: CUPTI takes one subscriber per process and nsys "
        "holds it (the backend logs the refusal above and serves on without them). Triton's NVML "
        "utilization gauge has no such limit, so it is the live figure measured over the same seconds.",
        "",
        "Reproduce: `bash scripts/lab/gpu_session.sh samewindow` on the GPU host.",
        "",
    ]
    return lines


#: The main page (headline first) and the page of every closed-loop A/B run it links, from the root.
MAIN_PAGE = "docs/RESULTS.md"
AB_RUNS_PAGE = "docs/RESULTS-ab-runs.md"


def render(root: Path) -> str:
    """Every page for the repository at ``root``, the main one first (one text: what the index searches)."""
    return "\n".join(render_pages(root).values())


def render_pages(root: Path) -> dict[str, str]:
    """The generated pages by path from ``root``: :data:`MAIN_PAGE`, then :data:`AB_RUNS_PAGE`."""
    results = root / "results"
    lines = [
        "# Results",
        "",
        "Generated by `inflight results-report` from the JSON files under `results/`; do not edit by hand.",
        "",
    ]
    sj = results / "summary.json"
    lines += headline_section(results)
    lines += BASELINE
    if sj.is_file():
        lines += summary_section(sj, root)
    lines += models_results.section(root)
    lines += gpu_bound_results.section(root)
    lines += open_loop_results.section(root)
    lines += modes_results.section(root)
    lines += faults.section(root)
    lines += cost_results.section(root)
    lines += per_gpu_servers_section(results / PER_GPU_SERVERS_DIR, root)
    lines += two_gpu_results.section(root)
    lines += unpadded_serving_section(results / UNPADDED_SERVING_DIR, root)
    # the engine level, the diagnostic sections, the plan's runs and the heads go on the detail page, linked
    # from here (the main page stays within 400 lines)
    eb = results / "engine_bench.json"
    detail = engine_section(eb, root) if eb.is_file() else []
    detail += stalls_section(results / STALLS_DIR, root)
    exp = results / "experiments"
    if exp.is_dir():
        detail += experiments_section(exp, root, json.loads(sj.read_text()) if sj.is_file() else None)
    detail += heads_results.section(root)
    ceiling = results / "per-instance-ceiling"
    if ceiling.is_dir():
        detail += ceiling_section(sorted(ceiling.rglob("ab-*.json")), root)
    many = results / PIPELINED_CEILING_DIR
    if many.is_dir():
        detail += pipelined_ceiling_section(sorted(many.rglob("ab-*.json")), root)
    # open-loop runs have their own section (above): capacity at an SLO, not a closed-loop A/B
    open_loop = set(open_loop_results.open_loop_files(results))
    stalls = set((results / STALLS_DIR).rglob("ab-*.json")) | set((results / PER_GPU_SERVERS_DIR).rglob("ab-*.json"))
    abs_ = sorted(p for p in results.rglob("ab-*.json") if p not in open_loop and p not in stalls)
    runs = [
        "# Results in detail: the diagnostic sections and every closed-loop A/B run",
        "",
        "Generated by `inflight results-report` with [RESULTS.md](RESULTS.md) from the JSON files under `results/`; "
        "do not edit by hand. First the sections RESULTS links, then one table per closed-loop run, its "
        "configuration and how to reproduce it, in path order.",
        "",
        *detail,
    ]
    titles = [line[3:].split(" (`", 1)[0] for line in detail if line.startswith("## ")]
    if titles:
        lines += [
            "## In detail",
            "",
            "On [RESULTS-ab-runs.md](RESULTS-ab-runs.md), generated with this page: "
            + "; ".join(f'"{t}"' for t in titles)
            + ".",
            "",
        ]
    if abs_:
        runs += ["## Every closed-loop A/B run", ""]
        lines += [
            "## Through the server: A/B load tests",
            "",
            f"The {len(abs_)} closed-loop A/B runs under `results/` (those the sections above do not "
            f"tabulate too), one table each with its configuration and how to reproduce it: "
            f"[RESULTS-ab-runs.md](RESULTS-ab-runs.md).",
            "",
        ]
        for p in abs_:
            runs += ab_section(p, root)
    modes_nsys = sorted(results.glob("nsys-modes/*/summary.json"))
    if modes_nsys:
        from inflight.lab.experiments import nsys_spec

        specs = {p.parent.name: str(nsys_spec(p.parent / "run.json")) for p in modes_nsys}
        named = [f"{name}={spec}" for name, spec in specs.items()]
        # the models to build: each variant's model name less its variant suffix (bert_small_sync -> bert_small)
        models = sorted({parse_variant_arg(spec)[0].rsplit("_", 1)[0] for spec in specs.values()})
        lines += nsys_section(
            modes_nsys,
            root,
            title="Both modes under nsys, current engine (`results/nsys-modes/`)",
            reproduce=f"PROFILE_ROOT=results/nsys-modes PROFILE_MODELS='{' '.join(models)}' "
            f"PROFILE_VARIANTS='{' '.join(named)}' bash scripts/lab/gpu_session.sh profile",
        )
    live = results / "nsys-live" / "summary.json"
    if live.is_file():
        lines += live_window_section(live, root)
    return {MAIN_PAGE: "\n".join(lines) + "\n", AB_RUNS_PAGE: "\n".join(runs) + "\n"}


def headline_section(results: Path) -> list[str]:
    """One screen: every target of the issues with its newest figure and verdict, and where it comes from."""
    rows: list[list[str]] = []
    sj = results / "summary.json"
    d = json.loads(sj.read_text()) if sj.is_file() else {}
    ol = d.get("open_loop") or {}
    for t in ol.get("targets", []):
        value, verdict = open_loop_results.target_cells(t)
        rows.append(["open loop", t["figure"], value, t["target"], verdict, "Open loop"])
    eb = results / "engine_bench.json"
    if eb.is_file():
        doc = json.loads(eb.read_text())
        engine_rows = [
            r
            for r in doc.get("rows", [])
            if not open_loop_results.is_executor_row(r) and r.get("engine_us_per_batch") is not None
        ]
        for f, v, w, ok in engine_targets(engine_rows, doc.get("mixed_length_token_ratio")):
            rows.append(["engine", f, v, w, _verdict(ok), "Engine level"])
    cost = d.get("cpu_per_request") or {}
    for t in cost.get("targets", []):
        v = t["value"]
        rows.append(
            [
                "pipelined cost",
                t["figure"],
                "n/a" if v is None else f"{v:.3f}",
                t["target"],
                cost_results.verdict(t),
                "Pipelining at the sync mode's cost",
            ]
        )
    rows += [["modes", *r, "Sync against pipelined"] for r in modes_results.headline_rows(d.get("modes"))]
    gpu_bound = gpu_bound_results.headline_rows(d.get("gpu_bound"))
    rows += [["GPU-bound (MiniLM)", *r, "Where the GPU is the bound"] for r in gpu_bound]
    if d:
        rows += [["closed loop (published)", *r, "Summary"] for r in closed_loop_rows(d)]
    if not rows:
        return []
    met = sum(r[4] == "met" for r in rows)
    modes_device = (d.get("modes") or {}).get("device")
    named = (ol.get("device"), cost.get("device"), d.get("device"), modes_device)
    devices = sorted({one for x in named if x for one in str(x).split(", ")})
    return [
        "## At a glance",
        "",
        f"Every target the issues set, with its newest figure ({met} of {len(rows)} met; measured on "
        f"{', '.join(devices) or 'the GPU host'}); the last column names the section below that holds the "
        "run, its configuration and how to reproduce it.",
        "",
        *markdown_table(["area", "figure", "value", "target", "verdict", "section"], rows),
        "",
    ]


#: Folder of the stall diagnoses (open-loop windows above capacity, with the generator's timeline).
STALLS_DIR = "stalls"
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


def per_gpu_servers_section(folder: Path, root: Path) -> list[str]:
    """One server per GPU against one server: capacity at the SLO of every run under ``folder``."""
    paths = sorted(folder.rglob("ab-*.json")) if folder.is_dir() else []
    if not paths:
        return []
    rows = []
    for p in paths:
        doc = json.loads(p.read_text())
        md = report_file(p)
        for v in doc.get("summary", []):
            at = v.get("capacity_point") or {}
            first_miss: dict[str, Any] = next(
                (w for w in sorted(v.get("sweep") or [], key=lambda w: w["offered_rps"]) if w.get("slo_misses")),
                {},
            )
            rows.append(
                [
                    f"[`{p.parent.name}`](../{md.relative_to(root)})",
                    deployment_cell(doc),
                    f"`{v['spec']}`",
                    _fmt(v.get("capacity_rps")),
                    _fmt(at.get("p99_ms"), ",.1f"),
                    _fmt(at.get("avg_batch_requests"), ",.1f"),
                    _fmt(at.get("server_us_per_request")),
                    _fmt(first_miss.get("offered_rps")),
                    _fmt(first_miss.get("p99_ms"), ",.1f"),
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


#: A/B runs of the same variant with and without unpadded launches (issue 16, through the server)
UNPADDED_SERVING_DIR = "unpadded-serving"


def unpadded_serving_section(folder: Path, root: Path) -> list[str]:
    """Each run under ``folder``: per variant and window, throughput, p99 and what its launches computed."""
    paths = sorted(folder.rglob("ab-*.json")) if folder.is_dir() else []
    if not paths:
        return []
    rows = []
    for p in paths:
        doc = json.loads(p.read_text())
        md = report_file(p)
        load = doc.get("load") or {}
        for v in doc.get("summary", []):
            closed = {"achieved_rps": v.get("rps"), "p99_ms": (v.get("latency_ms") or {}).get("p99")}
            windows = v.get("sweep") or [closed]
            ex = v.get("executor") or {}
            launches = ex.get("launches")
            for w in windows:
                rows.append(
                    [
                        f"[`{p.stem}`](../{md.relative_to(root)})",
                        "closed" if load.get("closed_loop", True) else f"open, {_fmt(w.get('offered_rps'))} offered",
                        f"`{v['spec']}`",
                        _fmt(w.get("achieved_rps")),
                        _fmt(w.get("p99_ms"), ",.1f"),
                        "n/a" if launches is None else f"{ex.get('unpadded_launches', 0):,} of {launches:,}",
                        _fmt(ex.get("computed_over_real_tokens"), ".2f"),
                        _fmt(ex.get("device_wait_ms"), ".2f"),
                        _fmt(ex.get("execute_ms"), ".2f"),
                    ]
                )
    return [
        f"## Unpadded launches through the server (`results/{UNPADDED_SERVING_DIR}`)",
        "",
        "The same variant with `unpad` on (the default) and off, under the load test's `--length-dist uniform` "
        "requests (50 items of 64 tokens, each item's length uniform in 1..64, the rest masked), server and "
        "generator on disjoint cores (each run's JSON records them). The executor columns are per batch, over "
        "the variant's whole run (warm-up included; n/a where the run predates those counters). "
        '`docs/LAB.md` ("The compiled engine: measurements") reads them.',
        "",
        *markdown_table(
            [
                "run",
                "loop",
                "variant",
                "req/s",
                "p99 ms",
                "unpadded launches",
                "computed / request tokens",
                "device wait ms",
                "execute ms",
            ],
            rows,
        ),
        "",
    ]


def stalls_section(folder: Path, root: Path) -> list[str]:
    """Above capacity: where each diagnosed window's slow answers came from, one table per run."""
    paths = sorted(folder.rglob("ab-*.json")) if folder.is_dir() else []
    if not paths:
        return []
    lines = [
        f"## Above capacity: where the p99 goes (`results/{STALLS_DIR}`)",
        "",
        "Open-loop windows around and above the capacity, with the asyncio generator's timeline (which "
        "sources saw the slow answers, and when), Triton's own request and queue times, and the server's "
        'busiest threads. `docs/LAB.md` ("Above capacity") reads them.',
        "",
    ]
    for p in paths:
        doc = json.loads(p.read_text())
        md = report_file(p)
        args = " ".join(f"`{a}`" for a in (doc.get("server") or {}).get("server_args") or ()) or "none"
        lines += [
            f"### [`{p.relative_to(root)}`](../{md.relative_to(root)})",
            "",
            "Variants: "
            + "; ".join(f"{v['label']} `{v['spec']}`" for v in doc.get("variants", []))
            + f". Server arguments: {args}.",
            "",
        ]
        # the table's explanation is on the run's own page
        lines += [report.stalls_table(doc, explain=False)]
    return lines


BASELINE = [
    "## What the sync baseline is",
    "",
    "The sync mode (`bert_tiny_sync`) is this backend with one slot: for each batch Triton hands to "
    "`execute()`, it copies the requests' inputs into a pinned buffer, enqueues the host-to-device copy, "
    "the engine (the same CUDA graphs as the pipelined mode) and the device-to-host copy, waits for the "
    "device (`cudaEventSynchronize`), and returns the responses from `execute()`. Nothing of the next "
    "batch happens until then. Triton's stock TensorRT backend differs: it is C++ (no Python or "
    "shared-memory round trip per request), and its loop stages the next batch's inputs while one "
    "computes; it still waits for each batch before responding. So the sync baseline measures the "
    "stock loop's *wait*, not the stock backend's per-request cost; neither figure here is a "
    "measurement of the TensorRT backend (TensorRT cannot run on the H100/H200 hosts of this project).",
    "",
]


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def closed_loop_rows(d: Mapping[str, Any]) -> list[list[str]]:
    """The first targets (closed loop, published load) in ``results/summary.json``: figure, value, target, verdict."""
    ratio = d.get("pipelined_over_sync_items_per_s")
    act = d.get("pipelined_gpu_temporal_activity")
    frac = d.get("pipelined_fraction_of_engine_bound")
    p99p, p99s = d.get("pipelined_p99_ms"), d.get("sync_p99_ms")

    rows = [
        [
            "pipelined / sync items/s",
            _fmt(ratio, ".2f", "x"),
            ">= 1.5x",
            _verdict(None if ratio is None else ratio >= 1.5),
        ],
        ["pipelined GPU temporal activity (nsys)", _pct(act), ">= 95%", _verdict(None if act is None else act >= 0.95)],
        ["pipelined / engine-only bound", _pct(frac), ">= 85%", _verdict(None if frac is None else frac >= 0.85)],
        [
            "p99 pipelined vs sync (ms)",
            f"{_fmt(p99p, '.1f')} vs {_fmt(p99s, '.1f')}",
            "pipelined <= sync",
            _verdict(None if p99p is None or p99s is None else p99p <= p99s),
        ],
    ]
    return rows


def summary_section(path: Path, root: Path) -> list[str]:
    """``results/summary.json``: the best configuration of each mode and the targets."""
    d = json.loads(path.read_text())
    det = d.get("detail", {})
    rows = closed_loop_rows(d)
    lines = [
        f"## Summary (`{path.relative_to(root)}`)",
        "",
        f"{d.get('device')}, driver {det.get('driver')}; {det.get('window_s')} s windows. Best sync: "
        f"`{(det.get('best_sync') or {}).get('spec')}`; "
        f"best pipelined: `{(det.get('best_pipelined') or {}).get('spec')}`. "
        "Reproduce: `bash scripts/lab/run_experiments.sh all` on the GPU host.",
        "",
    ]
    lines += markdown_table(["figure", "value", "target", ""], rows)
    lines.append("")
    lines += [f"- {n}" for n in det.get("notes", [])]
    if det.get("notes"):
        lines.append("")
    lines += _why_missed(d, root)
    return lines


PER_INSTANCE_TARGET = 2.0
"""Issue 3: one pipelined instance serves at least this many times the req/s of one sync instance."""


def _param(cfg: Mapping[str, Any], key: str) -> int:
    """An integer parameter of a variant's config as the A/B JSON records it (0 when absent)."""
    return int((cfg.get("parameters") or {}).get(key, {}).get("string_value", "0") or 0)


def _kind(variant: Mapping[str, Any]) -> str:
    """What an A/B variant is.

    ``sync``, ``pipelined``, ``null`` (the null model returning its responses from ``execute()``),
    ``deferred null`` (sending them through response senders from threads), or the variant name as
    recorded (``trt``).
    """
    kind = str(variant.get("variant"))
    if kind == "null":
        return "deferred null" if _param(variant.get("config") or {}, "sender_threads") else "null"
    return {"inflight": "pipelined"}.get(kind, kind)


def _one_instance(variant: Mapping[str, Any]) -> str | None:
    """The :func:`_kind` of a one-instance variant (a null model only when it sleeps 0), else None."""
    from inflight.loadtest.executor_stats import config_instances

    cfg = variant.get("config") or {}
    if config_instances(cfg) != 1:
        return None
    kind = _kind(variant)
    if kind in ("null", "deferred null"):
        return None if _param(cfg, "sleep_us") else kind
    return kind if kind in ("sync", "pipelined") else None


def _kind_label(variant: Mapping[str, Any]) -> str:
    """:func:`_kind` in words: the null model's label says how many threads send its responses."""
    kind = _kind(variant)
    if kind == "deferred null":
        return f"null, deferred to {_param(variant.get('config') or {}, 'sender_threads')} sender threads"
    return "null, returned from execute()" if kind == "null" else kind


def _execute_and_between(s: Mapping[str, Any] | None) -> str:
    """``execute ms + between ms`` per batch from a summary row's executor counters."""
    e = (s or {}).get("executor") or {}
    return f"{_fmt(e.get('execute_ms'), '.2f')} + {_fmt(e.get('between_executes_ms'), '.2f')}"


def ceiling_section(paths: list[Path], root: Path) -> list[str]:
    """One instance of each mode beside the null control model, per A/B file: the request path's ceiling.

    The null model (``backends/null``, sleeping 0) does no work besides Triton's Python-backend
    request path, so its req/s bounds what any executor can serve in one instance; its ratio to the
    sync instance bounds what hiding the device wait can gain.
    """
    rows: list[list[str]] = []
    ceilings: list[float] = []
    ratios: list[float] = []
    deferred_ratios: list[float] = []
    for path in paths:
        doc = json.loads(path.read_text())
        kinds = {v["label"]: _one_instance(v) for v in doc.get("variants", [])}
        by: dict[str, dict[str, Any]] = {}
        for s in doc.get("summary", []):
            k = kinds.get(s.get("variant"))
            if k and s.get("rps"):
                by[k] = s
        if not {"null", "sync"} <= by.keys():
            continue
        null, sync, pipe, deferred = by["null"], by["sync"], by.get("pipelined"), by.get("deferred null")
        ceiling = float(null["rps"]) / float(sync["rps"])
        ceilings.append(ceiling)
        ratio = float(pipe["rps"]) / float(sync["rps"]) if pipe else None
        if ratio is not None:
            ratios.append(ratio)
        deferred_ratio = float(deferred["rps"]) / float(sync["rps"]) if deferred else None
        if deferred_ratio is not None:
            deferred_ratios.append(deferred_ratio)

        rows.append(
            [
                f"`{path.relative_to(root)}`",
                str((doc.get("load") or {}).get("protocol", "?")),
                str(int(null.get("runs", 1))),
                _fmt(null["rps"]),
                _fmt(sync["rps"]),
                _fmt(pipe["rps"]) if pipe else "n/a",
                _fmt(deferred["rps"]) if deferred else "n/a",
                _fmt(ceiling, ".2f", "x"),
                _fmt(deferred_ratio, ".2f", "x"),
                _fmt(ratio, ".2f", "x"),
                _execute_and_between(null),
                _execute_and_between(sync),
                _execute_and_between(pipe),
            ]
        )
    if not rows:
        return []
    lines = [
        "## One instance: the request path's ceiling (`results/per-instance-ceiling`)",
        "",
        "Each A/B runs, on one server under the published load, one instance of the **null control model** "
        "(`backends/null`: Triton's Python backend reading the inputs and answering zeros, no device work and none "
        "of this project's code), one sync instance and one pipelined instance. The null instance's req/s is what "
        "*any* executor could serve in one Python-backend instance: the request path alone (shared memory, request "
        "and response objects, the frontend) sets it. *execute + between* = the instance's mean time inside "
        "`execute()` + between two calls, per batch (the backends' own counters). The **deferred null** instance "
        "(`sender_threads=8`) returns `None` from `execute()` and sends every response later through its request's "
        "response sender from eight threads, as a pipelined executor must: its req/s is what any *pipelined* "
        "executor could serve in one instance. Reproduce: `inflight ab "
        "'bert_tiny_null@instances=1' 'bert_tiny_null@instances=1,sender_threads=8' 'bert_tiny_sync@instances=1' "
        "'bert_tiny_inflight@instances=1,slots=4' "
        "--preset published --window 30 --warmup 5` (add `--protocol grpc`), or "
        "`bash scripts/lab/gpu_session.sh ceiling` "
        "(both protocols).",
        "",
    ]
    lines += markdown_table(
        [
            "A/B",
            "protocol",
            "rounds",
            "null req/s",
            "sync req/s",
            "pipelined req/s",
            "deferred null req/s",
            "null / sync (ceiling)",
            "deferred null / sync (pipelined ceiling)",
            "pipelined / sync",
            "null execute + between ms",
            "sync execute + between ms",
            "pipelined execute + between ms",
        ],
        rows,
    )
    lines.append("")
    top = max(ceilings)
    lines.append(
        f"- Target: one pipelined instance >= {PER_INSTANCE_TARGET:.0f}x one sync instance. Measured: "
        + (_span(ratios) if ratios else "no pipelined run")
        + f"; **{'met' if ratios and min(ratios) >= PER_INSTANCE_TARGET else 'missed'}**. The null instance, which "
        f"does no work at all, serves {_span(ceilings)} one sync instance, "
        + (
            f"so no executor can reach {PER_INSTANCE_TARGET:.0f}x here: even with zero cost per batch an instance "
            "pays the request path, and most of one sync instance's cycle is that path, not the device wait."
            if top < PER_INSTANCE_TARGET
            else f"so {PER_INSTANCE_TARGET:.0f}x needs an executor whose own work per batch is as cheap as the null "
            "model's (nothing but reading inputs and building responses): most of one sync instance's cycle is the "
            "request path, not the device wait."
        )
    )
    if deferred_ratios:
        lines.append(
            f"- The deferred null instance serves {_span(deferred_ratios)} one sync "
            "instance: sending each response through its response sender (a blocking round trip to the server per "
            "request) costs more than returning them all from `execute()`, so the ceiling of a pipelined "
            "Python-backend instance is lower still than the null model's."
        )
    lines.append("")
    return lines


#: Where the many-instance A/Bs with the CPU accounting and the deferred null model are kept.
PIPELINED_CEILING_DIR = "pipelined-ceiling"


def _cpu_sets_cell(doc: Mapping[str, Any]) -> str:
    """``server / Locust`` cores of an A/B that pinned them apart, else ``shared``."""
    sets = (doc.get("load") or {}).get("cpu_sets") or {}
    return f"{sets['server']} / {sets['client']}" if sets.get("isolated") else "shared"


def pipelined_ceiling_section(paths: list[Path], root: Path) -> list[str]:
    """Many instances: each variant's req/s beside the sync one of its A/B, with the server's CPU per request.

    A/Bs that hold a sync variant: every variant's ratio to the best sync of the same file (same
    server, same lane, consecutive windows), its instances, what it is (the null model returning or
    deferring its responses, sync, pipelined) and the CPU figures of the runner (``inflight.loadtest.cpu``).
    The verdict on "the best pipelined configuration serves more than the best sync one" is computed
    per file, and the deferred null model at the sync's instance count shows what a pipelined executor
    of zero cost would serve.
    """
    from inflight.loadtest.executor_stats import config_instances

    rows: list[list[str]] = []
    best_ratios: list[float] = []
    deferred_ratios: list[float] = []
    rankings: list[tuple[str, ...]] = []
    for path in paths:
        doc = json.loads(path.read_text())
        variants = {v["label"]: v for v in doc.get("variants", [])}
        summary = [x for x in doc.get("summary", []) if x.get("rps") and x.get("variant") in variants]
        kinds = {label: _kind(v) for label, v in variants.items()}
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
                    f"`{path.relative_to(root)}`",
                    str((doc.get("load") or {}).get("protocol", "?")),
                    f"`{x['spec']}`",
                    _kind_label(v),
                    str(n),
                    _fmt(x["rps"]),
                    _fmt(ratio, ".2f", "x"),
                    _fmt(cpu.get("server_us_per_request"), ",.0f"),
                    _fmt(cpu.get("stub_cores"), ".1f"),
                    _fmt(cpu.get("other_cores"), ".1f"),
                    _pct(cpu.get("host_busy")) + (f" of {cpu['host_cores']}" if cpu.get("host_cores") else ""),
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
            f"pipelined / best sync): {_span(best_ratios)}; "
            f"**{'met' if min(best_ratios) > 1 else 'missed'}**."
        )
    if deferred_ratios:
        lines.append(
            f"- The deferred null model at the sync's instance count serves {_span(deferred_ratios)} the best sync: "
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


def _why_missed(d: dict[str, Any], root: Path) -> list[str]:
    """What the data say about the targets: the ceiling the sync baseline leaves, and both profiles."""
    det = d.get("detail", {})
    bound = det.get("engine_bound_items_per_s")
    sync_items = (det.get("best_sync") or {}).get("items_per_s")
    out: list[str] = []
    if bound and sync_items:
        ceiling = float(bound) / float(sync_items)
        out.append(
            f"- **The ceiling this baseline leaves**: the engine-only bound ({float(bound):,.0f} items/s at the "
            f"pipelined run's batch size) is {ceiling:.2f}x the best sync configuration's items/s, so no executor "
            f"could reach {1.5:.1f}x here: that target assumes a sync loop far from the bound (the published stock "
            "runs: GPU busy 50-85%). Several sync instances overlap one another's waits on one GPU."
        )
    nsys_file = det.get("nsys_file")
    if nsys_file and (root / nsys_file).is_file():
        doc = json.loads((root / nsys_file).read_text())
        for f in doc.get("files", []):
            v = (f.get("summary") or {}).get("verdict") or {}
            if v:
                out.append(f"- **Profile of {f.get('label')}** ({v.get('regime')}): {v.get('reason')}")
    if out:
        out.append("")
        return ["### What the data say about the targets", "", *out]
    return out


def experiments_section(exp: Path, root: Path, summary: dict[str, Any] | None) -> list[str]:
    """The published plan's bert_tiny configurations in one table, with the profile of the best of each mode.

    One row per configuration (newest A/B result of each part), shaped like the published tables;
    the nsys columns are filled for the configurations that were profiled. Then the notes that
    qualify the figures: profiles of another configuration, client-limited runs, unload stalls and
    requests that never got a response.
    """
    from inflight.lab import experiments as ex

    bound_path = exp / "engine_bound.json"
    bound_doc = json.loads(bound_path.read_text()) if bound_path.is_file() else {}
    nsys_path = exp / "nsys" / "summary.json"
    nsys = json.loads(nsys_path.read_text()) if nsys_path.is_file() else {}
    by_label = {f["label"]: f for f in nsys.get("files", [])}
    profiled = {
        ex.nsys_spec(exp / "nsys" / label / "run.json"): by_label[label]
        for label in ("best_sync", "best_pipelined")
        if label in by_label
    }
    rows, stalls, lost, limited, lanes = [], [], [], [], set()
    queued: list[tuple[str, int]] = []
    for part in (*ex.SYNC_PARTS, *ex.PIPELINED_PARTS):
        path = ex.latest_ab(exp / part)
        if path is None:
            continue
        doc = json.loads(path.read_text())
        lane = exp / part / "lane.json"
        if lane.is_file():
            lanes.add(json.loads(lane.read_text()).get("lanes"))
        for s in doc.get("summary", []):
            mine = [r for r in doc.get("runs", []) if r.get("variant") == s.get("variant")]
            items = (s.get("server") or {}).get("avg_batch_items")
            bound = ex.bound_at(bound_doc, items) if bound_doc else None
            prof = (profiled.get(s["spec"]) or {}).get("summary") or {}
            flags = []
            if s.get("client_limited"):
                flags.append("client-limited")
                limited.append(s["spec"])
            if any(r.get("unload_stalled") for r in mine):
                flags.append("unload stalled")
                stalls.append(s["spec"])
                pending = [(r.get("requests_at_stall") or {}).get("pending") for r in mine if r.get("unload_stalled")]
                if any(p is not None for p in pending):
                    queued.append((s["spec"], sum(p or 0 for p in pending)))
            if s.get("failures"):
                lost.append((s["spec"], s["failures"]))
            rows.append(
                [
                    part,
                    f"`{s['spec']}`",
                    *_load_cells(s),
                    _fmt(s.get("failures")),
                    _fmt(items),
                    _fmt(prof.get("dispatch_median_us"), ",.0f"),
                    _fmt(prof.get("dispatches_per_s"), ",.0f"),
                    _pct(prof.get("sync_share")),
                    _fmt(None if prof.get("h2d_avg_bytes") is None else prof["h2d_avg_bytes"] / 1024, ",.0f"),
                    _pct(prof.get("gpu_activity")),
                    _pct(None if not bound else float(s["items_per_s"]) / bound),
                    ", ".join(flags) or "-",
                ]
            )
    if not rows:
        return []
    lines = [
        f"## The published experiment plan (`{exp.relative_to(root)}`)",
        "",
        "bert_tiny, 1000 closed-loop users x 50 items (seq 64), every configuration of the plan; newest result "
        "of each part. Reproduce: `bash scripts/lab/run_experiments.sh all` on one GPU host"
        + (
            ', or `bash scripts/lab/run_experiments_lanes.sh "sync-a1" "sync-a2" "sync-b" "pipe-a pipe-b"` '
            "then `bash scripts/lab/run_experiments.sh bound nsys summary` on a host of several GPUs (as here: the "
            "parts ran side by side, one GPU and 16 cores each; compare rows of one part first)"
            if lanes
            else ""
        )
        + ". The nsys columns are filled for the configurations that were profiled (5 s under the same load); "
        "GPU compute median = median graph-execution time per dispatch; % of bound = items/s over the "
        "engine-only bound (back-to-back graph replays) at the measured batch size nearest to the one the run "
        "formed (measured at "
        + ", ".join(_fmt(r.get("batch")) for r in bound_doc.get("rows", []))
        + f" items: `{bound_path.relative_to(root)}`).",
        "",
    ]
    lines += markdown_table(
        [
            "part",
            "configuration",
            *_LOAD_HEADERS,
            "failures",
            "avg batch (items)",
            "GPU compute median µs",
            "dispatches/s",
            "sync %",
            "H2D avg KiB",
            "GPU temporal activity",
            "% of engine bound",
            "caveats",
        ],
        rows,
    )
    lines.append("")
    notes = list((summary or {}).get("detail", {}).get("notes", []))
    if limited:
        notes.append(
            f"client-limited ({len(limited)}): Locust reported its CPU above 90% at some point of the window, so the "
            "client may have limited these figures; they are lower bounds for the server. Server and Locust shared "
            "the lane's 16 cores."
        )
    if stalls:
        notes.append(
            f"unload stalled ({len(stalls)}): after the window the configuration did not unload; its stubs sat idle "
            "(waiting for Triton's next message, never given finalize) and the server kept HTTP connections of "
            "requests that never got a response: Triton 2.51's HTTP frontend drops finished replies that overflow "
            "its per-thread socket buffer (README, *Known limits*; these runs predate the launcher's workaround)."
            + (
                " Requests in Triton's scheduler queue at the stall (nv_inference_pending_request_count): "
                + ", ".join(f"`{spec}` {n:,}" for spec, n in queued)
                + "."
                if queued
                else ""
            )
        )
    if lost:
        notes.append(
            "failures: "
            + ", ".join(f"`{spec}` {n:,}" for spec, n in lost)
            + " requests got no HTTP response within Locust's 60 s timeout (replies dropped by the HTTP frontend, the "
            "same defect)."
        )
    for label in ("best_sync", "best_pipelined"):
        v = ((by_label.get(label) or {}).get("summary") or {}).get("verdict") or {}
        if v.get("reason"):
            notes.append(f"profile of {label}: **{v.get('regime')}**: {v['reason']}")
    lines += [f"- {n}" for n in notes]
    lines.append("")
    return lines


def _tracked(root: Path, folder: str) -> list[Path]:
    """Files git tracks under ``folder`` (none when this is not a git checkout)."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", folder], cwd=root, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [root / p for p in out.decode().split("\0") if p]


def render_index(root: Path, page: str) -> str:
    """``results/README.md``: every entry of ``results/`` in git, what it holds, and which document cites it.

    Args:
        root: The repository root.
        page: The rendered ``docs/RESULTS.md`` (an entry is cited when its path appears in it).
    """
    docs = {name: root / "docs" / f"{name}.md" for name in ("DESIGN", "LAB")}
    texts = {name: path.read_text() if path.is_file() else "" for name, path in docs.items()}
    by_entry: dict[str, list[Path]] = {}
    for p in _tracked(root, "results"):
        top = p.relative_to(root / "results").parts[0]
        if top != "README.md":
            by_entry.setdefault(top, []).append(p)
    rows = []
    for name, files in sorted(by_entry.items()):
        rel = f"results/{name}"
        kinds = sorted({p.suffix.lstrip(".") or p.name for p in files})
        runs = sum(1 for p in files if p.name.startswith("ab-") and p.suffix == ".json")
        cited = [doc for doc, text in (("RESULTS", page), *texts.items()) if rel in text]
        rows.append(
            [
                f"[`{name}`]({name})",
                str(len(files)),
                f"{sum(p.stat().st_size for p in files if p.is_file()) / 2**20:,.1f}",
                str(runs),
                ", ".join(kinds[:6]) + (", ..." if len(kinds) > 6 else ""),
                ", ".join(cited) or "neither",
            ]
        )
    lines = [
        "# Results folder index",
        "",
        "Generated by `inflight results-report` with `docs/RESULTS.md`; do not edit by hand. Each entry of "
        "`results/` in git: its files, their size, the A/B runs in it, and which document cites it "
        "(`docs/RESULTS.md` and the A/B runs page it links, generated from these files, `docs/DESIGN.md` or "
        "the lab's page `docs/LAB.md`). An entry none cites holds "
        "runs no table reads: kept for what they record, superseded by the cited ones. Raw logs, request "
        "pools and open-loop plots of each run stay on the machine that ran it (git ignores them).",
        "",
        *markdown_table(["entry", "files", "MiB", "A/B runs", "kinds", "cited in"], rows),
        "",
    ]
    return "\n".join(lines)


def write(root: Path, out: Path | None = None) -> Path:
    """Write the pages (docs/RESULTS.md, the A/B runs page), results/README.md and the README's decision table.

    The ``open_loop`` and ``cpu_per_request`` blocks of ``results/summary.json`` are rewritten from
    their files first.

    Args:
        root: The repository root.
        out: A folder for the pages instead of ``docs/`` (``results/README.md`` is written in place).

    Returns:
        The main page's path.
    """
    two_gpu = two_gpu_results.write_summary(root)
    open_loop_results.write_summary(root, two_gpu)
    cost_results.write_summary(root)
    modes_results.write_summary(root)
    models_results.write_summary(root)
    gpu_bound_results.write_summary(root)
    pages = render_pages(root)
    written = []
    for rel, text in pages.items():
        path = (out / Path(rel).name) if out else root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    (root / "results" / "README.md").write_text(render_index(root, "\n".join(pages.values())))
    readme = root / "README.md"
    table = modes_results.decision_table(root)
    if table and readme.is_file() and modes_results.DECISION_BEGIN in readme.read_text():
        readme.write_text(modes_results.replace_block(readme.read_text(), table))
    rows = gpu_bound_results.decision_rows(root)
    if rows and readme.is_file():
        readme.write_text(gpu_bound_results.replace_rows(readme.read_text(), rows))
    return written[0]
