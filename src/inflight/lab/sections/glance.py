"""RESULTS' "At a glance": every target the issues set, its newest figure and verdict, and the section behind it.

The live questions' rows are read from their blocks of ``results/summary.json``, so the verdicts here are the ones
the sections below and the README's decision rows are computed from; the closed questions' rows are the ones their
sections gave when they were frozen (:mod:`inflight.lab.archive`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab import archive
from inflight.lab.sections import Section, markdown_table

TITLE = "At a glance"


def gpu_bound_rows(block: Mapping[str, Any] | None) -> list[list[str]]:
    """RESULTS' "At a glance" rows of the ``gpu_bound`` block: [figure, value, target, verdict] per issue 53 target."""
    if not block:
        return []

    def ratio(num: str, den: str) -> float | None:
        a, b = block.get(num), block.get(den)
        return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None

    def row(figure: str, value: float | None, fmt: str, target: str, ok: bool | None) -> list[str]:
        shown = "n/a" if value is None else fmt.format(value)
        return [figure, shown, target, "n/a" if ok is None else ("met" if ok else "**missed**")]

    def at_least(value: float | None, floor: float) -> bool | None:
        return None if value is None else value >= floor

    tokens = block.get("engine_tokens_per_s")
    mixed = block.get("engine_mixed_over_uniform")
    served = ratio("served_capacity_rps", "engine_bound_rps")
    activity = block.get("gpu_activity")
    one = block.get("one_instance_pipelined_over_sync")
    default = block.get("default_over_best")
    oom = block.get("default_oom_failures")
    best_over_plain = ratio("served_capacity_rps", "plain_rps")
    plain = best_over_plain * default if best_over_plain is not None and default is not None else None
    at = block.get("gpu_activity_at_rps")
    text = block.get("text") or {}
    text_best, bound = text.get("best_rps"), block.get("engine_bound_rps")
    text_served = text_best / bound if isinstance(text_best, (int, float)) and bound else None
    return [
        row(
            f"engine, fp16, [2048, 64] (tokens/s, {block.get('device', 'n/a')})",
            tokens,
            "{:,.0f}",
            ">= 16M",
            at_least(tokens, 16e6),
        ),
        row("engine, unpadded lengths 16-128 / uniform", mixed, "{:.2f}", ">= 0.9", at_least(mixed, 0.9)),
        row("best served capacity at p99 <= 100 ms / engine bound", served, "{:.0%}", ">= 85%", at_least(served, 0.85)),
        row(
            f"GPU activity at the highest rate a capture held (nsys, `{block.get('gpu_activity_capture')}`, "
            f"{at:,.0f} req/s)"
            if at
            else "GPU activity at the highest rate a capture held (nsys: no such capture on this GPU)",
            activity,
            "{:.1%}",
            ">= 95%",
            at_least(activity, 0.95),
        ),
        row(
            "one auto instance / one sync instance at the SLO"
            + (f" (max_batch_size {block['one_instance_max_batch']:,})" if block.get("one_instance_max_batch") else ""),
            one,
            "{:.2f}x",
            ">= 1.3x",
            at_least(one, 1.3),
        ),
        row("default as built / best configuration", default, "{:.1%}", ">= 95%", at_least(default, 0.95)),
        row("requests failed for GPU memory, default as built", oom, "{:.0f}", "0", None if oom is None else oom == 0),
        row("default as built / plain Python backend at the SLO", plain, "{:.1f}x", ">= 5x", at_least(plain, 5.0)),
        row(
            "the same requests as text: best capacity at p99 <= 100 ms / engine bound"
            + (
                f" (tokenizing's own bound: {text['tokenizer_bound_rps']:,.0f} req/s)"
                if text.get("tokenizer_bound_rps")
                else ""
            )
            + (
                f" (the text path with the null model as encoder: "
                f"{'>= ' if text.get('text_path_bound_is_lower') else ''}{text['text_path_bound_rps']:,.0f} req/s)"
                if text.get("text_path_bound_rps")
                else ""
            ),
            text_served,
            "{:.0%}" + (" (its newest as-built sitting held none of the rates it tried)" if text_best == 0 else ""),
            ">= 85%",
            at_least(text_served, 0.85),
        ),
    ]


def collect(root: Path) -> dict[str, Any] | None:
    """``results/summary.json`` and the frozen rows of the archive (None when there is neither)."""
    sj = root / "results" / "summary.json"
    d = json.loads(sj.read_text()) if sj.is_file() else {}
    frozen = archive.glance_rows(root)
    return {"summary": d, "frozen": frozen} if d or frozen else None


def render(data: Mapping[str, Any]) -> list[str]:
    """One screen: every target of the issues with its newest figure and verdict, and where it comes from."""
    d = data["summary"]
    rows = list(data["frozen"])
    rows += [["GPU-bound (MiniLM)", *r, "Where the GPU is the bound"] for r in gpu_bound_rows(d.get("gpu_bound"))]
    if not rows:
        return []
    met = sum(r[4] == "met" for r in rows)
    return [
        "## At a glance",
        "",
        f"Every target the issues set, with its newest figure ({met} of {len(rows)} met); the last column names the "
        "section that holds the run, its configuration and how to reproduce it: below, or, marked (archive), on "
        f"[{Path(archive.ARCHIVE_PAGE).name}]({Path(archive.ARCHIVE_PAGE).name}), where the questions whose issues "
        "have ended were rendered for the last time.",
        "",
        *markdown_table(["area", "figure", "value", "target", "verdict", "section"], rows),
        "",
        "The first closed-loop targets (the published experiment plan, 2026-11-21, on the engine before the "
        "compiled one) are not shown: no run of the current engine re-measured them. The current figures of the "
        "same questions are the open-loop rows above (capacity at the p99 SLO, pipelined against sync, the "
        "engine-only bound) and the modes' rows; the old plan's files stay in `results/experiments` and its "
        "top-level keys in `results/summary.json`.",
        "",
    ]


SECTION = Section(title=TITLE, collect=collect, render=render)
