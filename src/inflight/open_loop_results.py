"""Open-loop results: the ``open_loop`` block of ``results/summary.json`` and its RESULTS.md section.

Read from the open-loop A/B files under ``results/open-loop/`` (written by ``inflight ab --rate/--search``,
see ``scripts/gpu_session.sh capacity`` and ``soak``) and the engine-bound file the ``capacity`` step
writes beside them. Nothing is typed by hand: every figure, ratio and verdict is computed here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OPEN_LOOP_DIR = "open-loop"

#: Targets of the open-loop issue (GPU host, server on its own cores, p99 <= 50 ms).
TARGET_PIPELINED_RPS = 15_000.0
TARGET_FRACTION_OF_ENGINE_BOUND = 0.70
TARGET_PIPELINED_OVER_SYNC = 1.5
TARGET_TWO_GPU_SCALING = 1.8
#: The generator must be proven at this multiple of the highest rate published.
GENERATOR_MARGIN = 2.0


@dataclass(frozen=True)
class Entry:
    """One variant of one open-loop A/B file."""

    path: Path
    doc: Mapping[str, Any]
    summary: Mapping[str, Any]
    variant: Mapping[str, Any]

    @property
    def kind(self) -> str:
        """``sync``, ``pipelined`` or ``null``."""
        return {"inflight": "pipelined"}.get(str(self.variant.get("variant")), str(self.variant.get("variant")))

    @property
    def gpus(self) -> int:
        """GPUs the instances were placed on (``gpus=``); every GPU of the device when not set."""
        group = ((self.variant.get("config") or {}).get("instance_group") or [{}])[0]
        named = group.get("gpus") or []
        return len(named) if named else len((self.doc.get("device") or {}).get("gpus") or [None])

    @property
    def capacity(self) -> float | None:
        """Capacity at the SLO (req/s), or None."""
        c = self.summary.get("capacity_rps")
        return float(c) if isinstance(c, (int, float)) and math.isfinite(c) else None

    @property
    def comparable(self) -> bool:
        """True when no window at or below the capacity was generator-limited."""
        return bool(self.summary.get("comparable"))


def entries(results: Path) -> list[Entry]:
    """Every variant of every open-loop A/B file under ``results/open-loop``, oldest file first."""
    out = []
    for path in sorted((results / OPEN_LOOP_DIR).rglob("ab-*.json")):
        doc = json.loads(path.read_text())
        if not is_open_loop(doc):
            continue
        variants = {v["label"]: v for v in doc.get("variants", [])}
        for s in doc.get("summary", []):
            out.append(Entry(path, doc, s, variants.get(s["variant"], {})))
    return out


def is_open_loop(doc: Mapping[str, Any]) -> bool:
    """Whether an A/B file's load was open loop (arrivals at rates) rather than closed loop."""
    return not (doc.get("load") or {}).get("closed_loop", True)


def open_loop_files(results: Path) -> list[Path]:
    """Every open-loop A/B file anywhere under ``results`` (also those outside ``results/open-loop``)."""
    return [p for p in sorted(results.rglob("ab-*.json")) if is_open_loop(json.loads(p.read_text()))]


def merge_summary(root: Path, key: str, block: Mapping[str, Any], *, allow_nan: bool = True) -> None:
    """Set ``key`` of ``results/summary.json`` to ``block``, keeping every other key."""
    path = root / "results" / "summary.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    doc[key] = block
    path.write_text(json.dumps(doc, indent=1, allow_nan=allow_nan) + "\n")


def _best(candidates: Iterable[Entry]) -> Entry | None:
    pool = [e for e in candidates if e.capacity is not None]
    return max(pool, key=lambda e: (e.capacity or 0.0, e.comparable)) if pool else None


def _engine_bound(root: Path, items_per_batch: float | None, items_per_request: int) -> dict[str, Any] | None:
    """The engine-only bound (req/s) at the batch bucket that ``items_per_batch`` pads to (newest bench file)."""
    files = sorted((root / "results" / OPEN_LOOP_DIR).glob("engine-bound-*.json"))
    if not files or not items_per_batch:
        return None
    doc = json.loads(files[-1].read_text())
    # the executor rows (a bucket and its engine-only bound); a bench of several engines has other rows too
    rows = sorted(
        (r for r in doc.get("rows", []) if "bucket" in r and "engine_bound_items_s" in r), key=lambda r: r["bucket"]
    )
    row = next((r for r in rows if r["bucket"] >= items_per_batch), rows[-1] if rows else None)
    if row is None:
        return None
    return {
        "file": str(files[-1].relative_to(root)),
        "bucket": row["bucket"],
        "items_per_s": row["engine_bound_items_s"],
        "rps": row["engine_bound_items_s"] / items_per_request,
    }


def summary(root: Path) -> dict[str, Any] | None:
    """The ``open_loop`` block of ``results/summary.json`` (None when there are no open-loop results).

    Keys the issue names: ``device``, ``slo_p99_ms``, ``best_sync`` and ``best_pipelined`` (``spec``,
    ``capacity_rps``; one GPU), ``engine_bound_rps`` (engine-only bound at the batch the best pipelined
    configuration formed at its capacity), ``two_gpu_capacity_rps`` (best of any mode on two GPUs),
    ``generator_verified_rps`` (the highest rate the null model met the SLO at with the generator on
    schedule). Beside them: where each figure comes from, whether it is comparable (no generator-limited
    window at or below it), the soak, and the targets with their verdicts.
    """
    results = root / "results"
    es = entries(results)
    if not es:
        return None
    one = [e for e in es if e.gpus == 1]
    best_sync = _best(e for e in one if e.kind == "sync")
    best_pipe = _best(e for e in one if e.kind == "pipelined")
    two = _best(e for e in es if e.gpus == 2 and e.kind in ("sync", "pipelined"))
    verified: tuple[float, Entry] | None = None
    for e in es:
        if e.kind != "null":
            continue
        for row in e.summary.get("sweep") or []:
            on_schedule = not row.get("slo_misses") and not row.get("generator_limited")
            if on_schedule and (verified is None or row["offered_rps"] > verified[0]):
                verified = (float(row["offered_rps"]), e)
    items = int((es[0].doc.get("load") or {}).get("items") or 50)
    point = (best_pipe.summary.get("capacity_point") or {}) if best_pipe else {}
    bound = _engine_bound(root, point.get("avg_batch_items"), items)
    soaks = [e for e in es if e.summary.get("soak")]
    soak = soaks[-1] if soaks else None

    def ref(e: Entry | None) -> dict[str, Any] | None:
        if e is None:
            return None
        return {
            "spec": e.summary["spec"],
            "capacity_rps": e.capacity,
            "capacity_upper_rps": e.summary.get("capacity_upper_rps"),
            "comparable": e.comparable,
            "avg_batch_items": (e.summary.get("capacity_point") or {}).get("avg_batch_items"),
            "file": str(e.path.relative_to(root)),
        }

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    sync_cap = best_sync.capacity if best_sync else None
    pipe_cap = best_pipe.capacity if best_pipe else None
    two_cap = two.capacity if two else None
    one_of_two = _best(e for e in one if two is not None and e.kind == two.kind)
    highest = max((c for c in (sync_cap, pipe_cap, two_cap) if c is not None), default=None)
    gen = verified[0] if verified else None
    device = str(((best_pipe or best_sync or es[-1]).doc.get("device") or {}).get("name"))
    out: dict[str, Any] = {
        "device": device,
        "slo_p99_ms": float(((es[-1].doc.get("load") or {}).get("open_loop") or {}).get("slo_p99_ms") or 50.0),
        "best_sync": ref(best_sync),
        "best_pipelined": ref(best_pipe),
        "engine_bound_rps": bound["rps"] if bound else None,
        "two_gpu_capacity_rps": two_cap,
        "generator_verified_rps": gen,
        "engine_bound": bound,
        "two_gpu": ref(two),
        "two_gpu_over_one_gpu": ratio(two_cap, one_of_two.capacity if one_of_two else None),
        "pipelined_over_sync": ratio(pipe_cap, sync_cap),
        "pipelined_fraction_of_engine_bound": ratio(pipe_cap, bound["rps"] if bound else None),
        "generator_file": str(verified[1].path.relative_to(root)) if verified else None,
        "generator_covers": (None if gen is None or highest is None else bool(gen >= GENERATOR_MARGIN * highest)),
        "soak": dict(soak.summary["soak"], spec=soak.summary["spec"], file=str(soak.path.relative_to(root)))
        if soak
        else None,
    }
    out["targets"] = targets(out)
    return out


def targets(s: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The open-loop issue's targets: figure, value, target, verdict (True, False, or None: not measured)."""

    def at_least(value: Any, target: float) -> bool | None:
        return None if not isinstance(value, (int, float)) else bool(value >= target)

    pipe = (s.get("best_pipelined") or {}).get("capacity_rps")
    frac = s.get("pipelined_fraction_of_engine_bound")
    over = s.get("pipelined_over_sync")
    two = s.get("two_gpu_over_one_gpu")
    soak = s.get("soak") or {}
    rows = [
        (
            "best pipelined capacity at p99 <= 50 ms (req/s)",
            pipe,
            f">= {TARGET_PIPELINED_RPS:,.0f}",
            at_least(pipe, TARGET_PIPELINED_RPS),
        ),
        (
            "pipelined capacity / engine-only bound",
            frac,
            f">= {TARGET_FRACTION_OF_ENGINE_BOUND:.0%}",
            at_least(frac, TARGET_FRACTION_OF_ENGINE_BOUND),
        ),
        (
            "pipelined / best sync capacity",
            over,
            f">= {TARGET_PIPELINED_OVER_SYNC:g}x",
            at_least(over, TARGET_PIPELINED_OVER_SYNC),
        ),
        ("two GPUs / one GPU capacity", two, f">= {TARGET_TWO_GPU_SCALING:g}x", at_least(two, TARGET_TWO_GPU_SCALING)),
        (
            "5-minute soak at 80% of capacity",
            soak.get("passed"),
            "0 failures, p99 within 20%, memory flat",
            soak.get("passed") if soak else None,
        ),
        (
            "generator proven at 2x the highest capacity published",
            s.get("generator_verified_rps"),
            "null model on schedule at >= 2x",
            s.get("generator_covers"),
        ),
    ]
    units = ("rps", "fraction", "ratio", "ratio", "bool", "rps")
    return [
        {"figure": f, "value": v, "unit": u, "target": t, "met": m} for (f, v, t, m), u in zip(rows, units, strict=True)
    ]


def write_summary(root: Path) -> dict[str, Any] | None:
    """Merge the ``open_loop`` block into ``results/summary.json``, keeping every other key."""
    block = summary(root)
    if block is not None:
        merge_summary(root, "open_loop", block, allow_nan=False)
    return block


def _fmt(v: Any, spec: str = ",.0f") -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec)


def section(root: Path) -> list[str]:
    """The RESULTS.md section from ``results/summary.json``'s ``open_loop`` block and the files it names."""
    path = root / "results" / "summary.json"
    block = (json.loads(path.read_text()) if path.is_file() else {}).get("open_loop")
    if not block:
        return []
    lines = [
        "## Open loop: capacity at a p99 SLO (Poisson arrivals)",
        "",
        f"{block['device']}; requests of 50 items x seq 64 arrive at an offered rate whatever the answers "
        "(`inflight ab --rate/--search`, Locust `OpenLoopHttpUser`); latency counts from each request's "
        f"scheduled send time; capacity = the highest offered rate with p99 <= {block['slo_p99_ms']:g} ms, no "
        "failure and >= 98% of the requests due answered in the window. Server (tritonserver and every stub) "
        "and load generator on disjoint cores (each file records its CPU sets). Reproduce: "
        "`bash scripts/gpu_session.sh capacity` and `SOAK_RATE=R bash scripts/gpu_session.sh soak` on the "
        "2 x H200 host. Source: the `open_loop` block of `results/summary.json` (`inflight results-report`).",
        "",
        "| figure | value | target | verdict |",
        "|---|---|---|---|",
    ]
    for t in block.get("targets", []):
        v, unit = t["value"], t.get("unit")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and unit == "ratio":
            value = f"{v:.2f}x"
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and unit == "fraction":
            value = f"{100 * v:.1f}%"
        else:
            value = _fmt(v)
        verdict = "not measured" if t["met"] is None else ("met" if t["met"] else "**missed**")
        lines.append(f"| {t['figure']} | {value} | {t['target']} | {verdict} |")
    lines.append("")
    rows = []
    for label, key in (
        ("best sync, 1 GPU", "best_sync"),
        ("best pipelined, 1 GPU", "best_pipelined"),
        ("best on 2 GPUs", "two_gpu"),
    ):
        r = block.get(key)
        if r:
            rows.append(
                f"| {label} | `{r['spec']}` | {_fmt(r['capacity_rps'])} | {_fmt(r.get('capacity_upper_rps'))} | "
                f"{_fmt(r.get('avg_batch_items'), ',.0f')} | {'yes' if r['comparable'] else '**no**'} | "
                f"`{r['file']}` |"
            )
    lines += [
        "| configuration | spec | capacity (req/s) | first rate missed | items per batch there | comparable | file |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    bound = block.get("engine_bound")
    if bound:
        lines.append(
            f"- Engine-only bound at the {bound['bucket']}-item bucket the best pipelined configuration's batches "
            f"pad to: {_fmt(bound['items_per_s'])} items/s = {_fmt(bound['rps'])} req/s (`{bound['file']}`)."
        )
    if block.get("generator_verified_rps") is not None:
        lines.append(
            f"- The load generator met the SLO against the null model, on schedule, up to "
            f"{_fmt(block['generator_verified_rps'])} req/s (`{block.get('generator_file')}`)"
            + (
                "; that covers twice every capacity above."
                if block.get("generator_covers")
                else "; that is less than twice the highest capacity above, so the highest ones are lower "
                "bounds of the server (read them with their 'comparable' column)."
            )
        )
    soak = block.get("soak")
    if soak:
        lines.append(
            f"- Soak: `{soak['spec']}` at {_fmt(soak['rate'])} req/s for {soak['windows']} consecutive windows of "
            f"{_fmt(soak['window_s'][0], '.0f')} s: {soak['failures']} failures; p99 "
            + " -> ".join(f"{x:.1f}" for x in soak["p99_ms"])
            + f" ms ({100 * soak['p99_change']:+.1f}% last vs first); the stubs' resident memory "
            f"{soak['stub_rss_bytes'][0] / 2**20:,.1f} -> {soak['stub_rss_bytes'][-1] / 2**20:,.1f} MiB "
            f"({100 * soak['stub_rss_change']:+.2f}%) (`{soak['file']}`)."
        )
    lines += ["", "Every open-loop run, with its latency-against-rate table and plot:", ""]
    for p in open_loop_files(root / "results"):
        md = p.with_suffix(".md").relative_to(root)
        lines.append(f"- [`{md}`](../{md})")
    lines.append("")
    return lines
