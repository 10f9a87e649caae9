"""RESULTS-ab-runs' "The three heads' engines" section, from ``results/engine-heads``.

``scripts/lab/gpu_session.sh heads`` writes one ``inflight bench-engine --model <head>`` file per
head (every engine compared, per batch size, with the floor of the batch's FLOPs and bytes) and,
under ``profiles/``, the kernels of the served engine and of the engine before at batch 2048
(``scripts/lab/profile_engine.py``: GPU time in GEMM kernels vs the others). Everything printed
here is read from those files.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.entries import is_executor_row
from inflight.lab.sections import Section, fmt, markdown_table

TITLE = "The three heads' engines"

HEADS_DIR = "engine-heads"
HEADS = ("linear_head", "stacked_head", "seqlen_head")


def _over(us: float, floor: float | None) -> float | None:
    return us / floor if floor else None


def engine_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows of a bench file that time one engine (not the executors' rows)."""
    return [r for r in doc.get("rows", []) if not is_executor_row(r) and r.get("engine_us_per_batch") is not None]


def head_summary(doc: Mapping[str, Any], profile: Mapping[str, Any] | None) -> dict[str, Any]:
    """At the bench's largest batch: the served engine, the engine before, and where the time goes.

    Returns:
        ``batch``, ``served`` and ``before`` (engine labels), ``served_us``, ``before_us``,
        ``speedup`` (before / served), ``over_floor`` (served / floor) and, from the served
        engine's profile at that batch when there is one, ``gemm_share`` (GEMM kernels' share of
        the kernel time) and ``gemm_floor_fraction`` (the batch's floor over the time in GEMM
        kernels: the fraction of the tensor peak the GEMMs reach when the FLOPs set the floor).
    """
    rows = engine_rows(doc)
    batch = max(r["batch"] for r in rows)
    at = {r["engine"]: r for r in rows if r["batch"] == batch}
    served = next(e for e in at if "(served)" in e)
    before = next(e for e in at if "the engine before" in e)
    s, b = at[served], at[before]
    out: dict[str, Any] = {
        "batch": batch,
        "served": served,
        "before": before,
        "served_us": s["engine_us_per_batch"],
        "before_us": b["engine_us_per_batch"],
        "speedup": b["engine_us_per_batch"] / s["engine_us_per_batch"],
        "floor_us": s.get("floor_us_per_batch"),
        "over_floor": _over(s["engine_us_per_batch"], s.get("floor_us_per_batch")),
        "gemm_share": None,
        "gemm_floor_fraction": None,
    }
    bucket = next((k for k in (profile or {}).get("buckets", []) if k.get("batch") == batch), None)
    if bucket and bucket.get("kernel_us_sum"):
        out["gemm_share"] = bucket["gemm_us"] / bucket["kernel_us_sum"]
        if out["floor_us"] and bucket["gemm_us"]:
            out["gemm_floor_fraction"] = out["floor_us"] / bucket["gemm_us"]
    return out


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def collect(root: Path) -> dict[str, Any] | None:
    """Each head's bench file, its summary at the largest batch and the trial logs (None: no head measured)."""
    folder = root / "results" / HEADS_DIR
    docs = {h: _load(folder / f"{h}.json") for h in HEADS}
    present = {h: d for h, d in docs.items() if d and engine_rows(d)}
    if not present:
        return None
    summaries = {h: head_summary(d, _load(folder / "profiles" / f"{h}-served.json")) for h, d in present.items()}
    return {"present": present, "summaries": summaries, "trials": _trial_logs(folder / "trials", root)}


def render(data: Mapping[str, Any]) -> list[str]:
    """The section: each head's served engine against the engine before, its floor and its GEMM share."""
    present, summaries = data["present"], data["summaries"]
    first = next(iter(present.values()))
    lines = [
        f"## The three heads' engines (`results/{HEADS_DIR}`)",
        "",
        f"{first.get('device')}, driver {first.get('driver')}, torch {(first.get('versions') or {}).get('torch')}; "
        "`inflight bench-engine --model <head>` per head (one CUDA graph replayed back to back per batch size; "
        f"floor = the larger of the batch's FLOPs at the tensor peak and its bytes at the memory bandwidth, peaks: "
        f"{first.get('peak')}); kernels at the largest batch from `scripts/lab/profile_engine.py` "
        f"(`results/{HEADS_DIR}/profiles`). Reproduce: `bash scripts/lab/gpu_session.sh heads`. "
        "*The engine before* is the published head compiled with inductor, as `compile=auto` served every model "
        "before the heads were measured.",
        "",
    ]
    lines += markdown_table(
        ["head", "batch", "served engine", "µs", "engine before µs", "speed-up", "x floor", "GEMM share of kernels"],
        (
            [
                h,
                str(s["batch"]),
                s["served"],
                fmt(s["served_us"], ",.1f"),
                fmt(s["before_us"], ",.1f"),
                f"{s['speedup']:.2f}x",
                fmt(s["over_floor"], ".2f"),
                "n/a" if s["gemm_share"] is None else f"{100 * s['gemm_share']:.0f}%",
            ]
            for h, s in summaries.items()
        ),
    )
    lines.append("")
    for h, s in summaries.items():
        if s["gemm_share"] is not None and s["gemm_floor_fraction"] is not None:
            bound = "GEMM-bound" if s["gemm_share"] >= 0.5 else "not GEMM-bound"
            lines.append(
                f"- {h} at {s['batch']}: {bound}, {100 * s['gemm_share']:.0f}% of its kernel time in GEMM kernels, "
                f"which take {1 / s['gemm_floor_fraction']:.2f}x the batch's floor "
                f"({100 * s['gemm_floor_fraction']:.0f}% of the tensor peak when the FLOPs set the floor)."
            )
    lines.append("")
    for h, d in present.items():
        lines += [f"{h}:", ""]
        lines += markdown_table(
            ["engine", "batch", "µs per batch", "floor µs", "x floor", "max abs error", "load s"],
            (
                [
                    r["engine"],
                    str(r["batch"]),
                    fmt(r["engine_us_per_batch"], ",.1f"),
                    fmt(r.get("floor_us_per_batch"), ",.1f"),
                    fmt(_over(r["engine_us_per_batch"], r.get("floor_us_per_batch")), ".2f"),
                    fmt(r.get("max_abs_error_vs_fp32_cpu"), ".2e"),
                    fmt(r.get("load_s"), ",.1f"),
                ]
                for r in engine_rows(d)
            ),
        )
        lines.append("")
    trials = data["trials"]
    if trials:
        lines += [
            "Rewrites tried and not served (their bench and profile logs, from the runs that measured them): "
            + ", ".join(f"`{t}`" for t in trials)
            + ". LAB.md says why each was dropped.",
            "",
        ]
    return lines


def _trial_logs(trials: Path, root: Path) -> list[str]:
    """The trial logs under ``trials``: each ``*.log``, and each log packed in ``logs.tar.gz`` (named inside it)."""
    if not trials.is_dir():
        return []
    names = [str(p.relative_to(root)) for p in sorted(trials.glob("*.log"))]
    packed = trials / "logs.tar.gz"
    if packed.is_file():
        with tarfile.open(packed) as tar:
            inside = sorted(m.name for m in tar.getmembers() if m.isfile() and m.name.endswith(".log"))
        names += [f"{n} in {packed.relative_to(root)}" for n in inside]
    return names


SECTION = Section(title=TITLE, collect=collect, render=render)
