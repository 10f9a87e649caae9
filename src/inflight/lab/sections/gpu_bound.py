"""RESULTS' "Where the GPU is the bound" section: all-MiniLM-L6-v2's engine by rewrite, then served."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.gpu_bound_results import (
    FP8_VARIANTS,
    H100_DENSE_FLOPS,
    TEXT_FOLDER,
    ab_docs,
    engine,
    fp8_accuracy,
    kept_schedule,
    nsys_captures,
    summary,
    token_flops,
    tokenizer_bounds,
    variants,
)
from inflight.lab.sections import Section
from inflight.loadtest import openloop as ol

TITLE = "Where the GPU is the bound"


def _median(v: Mapping[str, Any]) -> str:
    """A variant's median capacity over rounds, ">=" when every rate it tried met the SLO."""
    return f"{'' if v['bounded'] else '>= '}{v['capacity']:,.0f}"


def capacity_cell(v: Mapping[str, Any] | None) -> str:
    """A variant's capacity cell: the median over rounds (">=" when unbounded), instances and every round."""
    if v is None:
        return "not measured"
    rounds = "/".join(f"{c:,.0f}" for c in v["capacities"])
    return f"{_median(v)} ({v['instances']} inst.; rounds {rounds})"


def _capacity_cells(v: Mapping[str, Any]) -> str:
    """A served variant's "capacity per round | median | achieved at the top rate" cells."""
    ach = "" if v["achieved_at_top"] is None else f"{v['achieved_at_top']:,.0f} of {v['top']:,.0f}"
    return f"{', '.join(f'{c:,.0f}' for c in v['capacities'])} | {_median(v)} | {ach}"


def collect(root: Path) -> dict[str, Any] | None:
    """The engine rows, the served variants, the nsys captures and the served files (None: no sitting yet)."""
    e, vs = engine(root), variants(root)
    if e is None and not vs:
        return None
    return {
        "root": root,
        "engine": e,
        "fp8_accuracy": fp8_accuracy(root),
        "variants": vs,
        "captures": nsys_captures(root),
        "docs": ab_docs(root),
        "text_variants": variants(root, TEXT_FOLDER),
        "text_docs": ab_docs(root, TEXT_FOLDER),
        "tokenizer": tokenizer_bounds(root),
    }


def _fp8_lines(root: Path, acc: Mapping[str, Any] | None) -> list[str]:
    """What fp8 costs a real checkpoint's embeddings, from ``encoder_engine.py --fp8-accuracy``'s file."""
    if acc is None:
        return []
    rel = acc["path"].relative_to(root)
    cost = "; ".join(
        f"`{name}` cosine min {acc[name]['cosine_min']:.6f}, mean {acc[name]['cosine_mean']:.6f}, the same nearest "
        f"other text for {acc[name]['same_nearest_neighbour']:.0%}"
        for name in ("fp16", *FP8_VARIANTS)
        if name in acc
    )
    return [
        f"What fp8 costs a real checkpoint ([`{rel}`]({rel}), on the CPU: `{Path(acc['checkpoint']).parent.name}`'s "
        f"embeddings of {acc['texts']['evaluated']} sentences of this repository's docs against its fp32 ones, fp8 "
        f"scales calibrated on {acc['texts']['calibration']} others): {cost}. The cosine column above is random "
        "weights', which hide that cost. fp8 is slower here and costs accuracy, so it is not offered.",
        "",
    ]


def render(data: Mapping[str, Any]) -> list[str]:
    """The section: the engine by rewrite, then the served variants with the limits beside them."""
    root, e, vs = data["root"], data["engine"], data["variants"]
    lines = ["## Where the GPU is the bound: all-MiniLM-L6-v2", ""]
    if e is not None:
        s = e["served"]
        rel = s["path"].relative_to(root)
        roof = H100_DENSE_FLOPS / token_flops(s["doc"]["shape"])
        lines += [
            f"The engine alone ({s['doc']['device']}, fp16, CUDA-graph replays, `scripts/lab/encoder_engine.py`, "
            f"[`{rel}`]({rel})): 2,048 sequences of 64 tokens, and 2,048 of lengths 16-128 padded to 128 or unpadded.",
            "",
            "| engine | tokens/s at [2048, 64] | mixed, padded | mixed, unpadded | unpadded / uniform | "
            "cosine vs fp32 |",
            "|---|---|---|---|---|---|",
        ]
        fp8 = e["fp8"]
        rows = [
            ("before issue 53 (`opaque_ffn`)", e["before"]),
            ("served now", s),
            ("fp8, calibrated scales (`fp8`)", fp8.get("fp8")),
            ("fp8, per-call scales (`fp8_dynamic`)", fp8.get("fp8_dynamic")),
        ]
        for name, v in rows:
            if v is None:
                continue
            if v["path"] != s["path"]:
                name += f" ([`{v['path'].parent.name}`]({v['path'].relative_to(root)}))"
            un = v["unpadded"].get("tokens_per_s", 0.0)
            lines.append(
                f"| {name} | {v['uniform']['tokens_per_s'] / 1e6:.2f}M | {v['mixed']['tokens_per_s'] / 1e6:.2f}M | "
                f"{un / 1e6:.2f}M | {un / v['uniform']['tokens_per_s']:.2f} | {v['cosine_min_vs_fp32']:.6f} |"
            )
        lines += [
            "",
            f"The dense roof at {H100_DENSE_FLOPS / 1e12:.0f} TFLOP/s is {roof / 1e6:.1f}M tokens/s; the engine is at "
            f"{s['uniform']['tokens_per_s'] / roof:.0%} of it.",
            "",
        ]
        lines += _fp8_lines(root, data["fp8_accuracy"])
    if vs:
        lines += [
            f"Served on one-GPU hosts ({', then '.join(dict.fromkeys(v['device'] for v in vs))}: each file's "
            "folder names the card; server cores 0-7, asyncio open-loop generator on 8-15), 32 sequences "
            "a request of lengths 16-128, each variant at each rate in each of three interleaved rounds; capacity "
            "= the highest rate whose p99 <= 100 ms, median over rounds. The default as built is the newest sitting's "
            "`inflight` variant that overrides only how it is measured (`cupti`, `capture_at_load`, `rates`, `via`); "
            "the build's rule changed between sittings: the batcher delay was 500 µs until the 2026-11-27 22:39 "
            "sitting (10 ms: a full batch at the longest length), then a full batch at the typical length "
            "(`inflight.sizing.batcher_delay_us`: 3,272 µs, then 4,667 µs on 2026-11-28). The CUPTI gauge is "
            "each instance's own kernel time over wall time, averaged over instances; the GPU's activity is the "
            "nsys captures' below.",
            "",
            "| file | variant | instances | batcher delay (µs) | capacity per round | median | "
            "achieved at the top rate (median) | CUPTI gauge at capacity |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for v in vs:
            rel = v["path"].relative_to(root)
            gauge = "" if v["gauge_activity_at_capacity"] is None else f"{v['gauge_activity_at_capacity']:.2f}"
            lines.append(
                f"| [`{rel.name}`]({rel}) | `{v['spec']}` | {v['instances']} | {v['delay_us']:,} | "
                f"{_capacity_cells(v)} | {gauge} |"
            )
    caps = data["captures"]
    if caps:
        lines += [
            "",
            "The whole server under Nsight Systems (`scripts/lab/gpu_bound_nsys.sh`: tritonserver and every "
            "instance's stub, 5 s captured after 12 s of load at a fixed offered rate; GPU activity = union of "
            "kernel and copy intervals over the window, sync share = `*Synchronize` time over all CUDA API time; "
            f"sent late = the generator's sends more than {ol.LIMIT_LATE_MS:.0f} ms behind schedule: past "
            f"{ol.MAX_LATE_FRACTION:.0%} the server was saturated under the profiler and the capture is not taken "
            "for the offered rate):",
            "",
            "| capture | offered (req/s) | achieved | sent late | GPU activity | sync share |",
            "|---|---|---|---|---|---|",
        ]
        for c in caps:
            rel = c["path"].relative_to(root)
            ach = "" if c["achieved_rps"] is None else f"{c['achieved_rps']:,.0f}"
            late = "" if c["very_late_fraction"] is None else f"{c['very_late_fraction']:.2%}"
            if not kept_schedule(c):
                late += " (saturated)"
            act = "" if c["gpu_activity"] is None else f"{c['gpu_activity']:.1%}"
            sync = "" if c["sync_share"] is None else f"{c['sync_share']:.1%}"
            lines.append(f"| [`{c['name']}`]({rel}) | {c['rate'] or 0:,.0f} | {ach} | {late} | {act} | {sync} |")
    lines += _text(root, data)
    for f, doc in [*data["docs"], *data["text_docs"]]:
        nulls = [r for r in doc["runs"] if r["model_name"].endswith("_null")]
        for letter in sorted({r["variant"] for r in nulls}):  # each null variant at its own lowest rate
            low = min(r["rate"] for r in nulls if r["variant"] == letter)
            at = [r for r in nulls if r["variant"] == letter and r["rate"] == low]
            p99 = ", ".join(f"{r['latency_ms']['p99']:.1f}" for r in at if isinstance(r["latency_ms"], Mapping))
            specs = {v["variant"]: v["spec"] for v in doc.get("summary") or []}
            which = f" (`{specs.get(letter, letter)}`)" if len({r["variant"] for r in nulls}) > 1 else ""
            if p99:
                lines += [
                    "",
                    f"Host steadiness in `{f.name}`: the null model's{which} p99 at {low:,.0f} req/s, by round: "
                    f"{p99} ms.",
                ]
    return [*lines, ""]


def _text(root: Path, data: Mapping[str, Any]) -> list[str]:
    """The same requests as text: the tokenizer's bound on the server's cores, then the served variants."""
    bounds, vs = data["tokenizer"], data["text_variants"]
    if not vs and not bounds:
        return []
    lines = [
        "",
        "### The same requests as text",
        "",
        "The same 32 sequences a request, sent as text (`--token-dist text`: common words, one token each, so a "
        "text's tokens are its words + 2): `NAME_text` is the ensemble users deploy for text (`NAME_tokenizer`'s CPU "
        "instances, then the encoder as built); `minilm_inflight` takes the text itself (tokenized in its "
        "`execute()`). First what the server's cores tokenize at most, with the backend's own `TextEncoder` on the "
        "workload's texts (`scripts/lab/tokenizer_bound.py`, each sitting's `tokenizer.json`). `word_cache` is the "
        "encoder as the backends build it (text through the word cache), `encode_batch_fast` the `tokenizers` "
        "library alone (`tokenizer_word_cache` 0; every text before the word cache):",
        "",
        "| file | CPU | tokenizers | call | one process, all cores (req/s) | one process a core (req/s) "
        "| µs a text a core |",
        "|---|---|---|---|---|---|---|",
    ]
    for b in bounds:
        rel = b["path"].relative_to(root)
        head = f"| [`{rel.parent.name}`]({rel}) | {b['cpu_model']}, {b['cores']} cores ({b['cpus']})"
        for call in ("word_cache", "encode_batch_fast"):
            rows = {r["layout"]: r for r in b["rows"] if r["call"] == call}
            one, per = rows.get("one process"), rows.get("per core")
            if one and per:
                lines.append(
                    f"{head} | {b['tokenizers']} | `{call}` | {one['requests_per_s']:,.0f} "
                    f"| {per['requests_per_s']:,.0f} | {per['us_per_text_per_core']} |"
                )
    if vs:
        lines += [
            "",
            "| file | variant | encoder instances | tokenizer instances | capacity per round | median | "
            "achieved at the top rate (median) |",
            "|---|---|---|---|---|---|---|",
        ]
        for v in vs:
            rel = v["path"].relative_to(root)
            tok = "" if v["tokenizer_instances"] is None else str(v["tokenizer_instances"])
            lines.append(
                f"| [`{rel.parent.name}`]({rel}) | `{v['spec']}` | {v['instances']} | {tok} | {_capacity_cells(v)} |"
            )
    return lines


SECTION = Section(title=TITLE, collect=collect, render=render, summary_key="gpu_bound", summarize=summary)
