"""Open-loop results: the ``open_loop`` block of ``results/summary.json`` and its RESULTS.md section.

Read from the open-loop A/B files under ``results/open-loop/`` (written by ``inflight ab --rate/--search``,
see ``scripts/lab/gpu_session.sh campaign``) and the engine-bound file written beside them. The files are
grouped by *sitting*: each first-level folder of ``results/open-loop/`` (``<date>-<time>-<name>``) holds
the runs of one session on the GPU host, and ratios are only taken within one sitting. The summary
block describes the newest sitting; the RESULTS section adds one line per earlier sitting. Nothing is
typed by hand: every figure, ratio and verdict is computed here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inflight.loadtest.openloop import LIMIT_LATE_MS

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
    def mode(self) -> str:
        """The inflight backend's ``mode`` parameter (``pipelined`` when unset); the kind for other models."""
        if self.kind != "pipelined":
            return self.kind
        return self.parameter("mode") or "pipelined"

    def parameter(self, key: str) -> str:
        """A parameter of the variant's model config (``parameters { key ... }``), "" when unset."""
        params = (self.variant.get("config") or {}).get("parameters") or {}
        return str((params.get(key) or {}).get("string_value") or "")

    @property
    def capacity(self) -> float | None:
        """Capacity at the SLO (req/s), or None."""
        c = self.summary.get("capacity_rps")
        return float(c) if isinstance(c, (int, float)) and math.isfinite(c) else None

    @property
    def comparable(self) -> bool:
        """True when no window at or below the capacity was generator-limited."""
        return bool(self.summary.get("comparable"))


def sittings(results: Path, folder: str = OPEN_LOOP_DIR) -> list[Path]:
    """The sittings under ``results/<folder>`` (first-level folders holding A/B runs), oldest first."""
    root = results / folder
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.is_dir() and any(d.rglob("ab-*.json")))


def newest_sitting(results: Path) -> Path | None:
    """The newest sitting under ``results/open-loop`` (None when there is none)."""
    all_sittings = sittings(results)
    return all_sittings[-1] if all_sittings else None


def entries(results: Path, sitting: Path | None = None) -> list[Entry]:
    """Every variant of every open-loop A/B file of one sitting (default: the newest), oldest file first."""
    sitting = sitting or newest_sitting(results)
    if sitting is None:
        return []
    out = []
    for path in sorted(sitting.rglob("ab-*.json")):
        doc = json.loads(path.read_text())
        if not is_open_loop(doc):
            continue
        variants = {v["label"]: v for v in doc.get("variants", [])}
        for s in doc.get("summary", []):
            out.append(Entry(path, doc, s, variants.get(s["variant"], {})))
    return out


def generator_verified(es: Iterable[Entry]) -> tuple[float, Entry] | None:
    """The highest rate the null model met the SLO at with the generator on schedule, and its entry."""
    best: tuple[float, Entry] | None = None
    for e in es:
        if e.kind != "null":
            continue
        for row in e.summary.get("sweep") or []:
            on_schedule = not row.get("slo_misses") and not row.get("generator_limited")
            if on_schedule and (best is None or float(row["offered_rps"]) > best[0]):
                best = (float(row["offered_rps"]), e)
    return best


def report_file(path: Path) -> Path:
    """What a report links for an A/B file: the JSON itself.

    The ``.md`` an A/B run writes beside it is kept out of git (``.gitignore``; ``inflight ab-report``
    writes it again from the JSON), so a link to it would hold only on the machine that ran it.
    """
    return path


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


def summary_block(root: Path, key: str) -> dict[str, Any] | None:
    """``key`` of ``results/summary.json`` (None when the file or the key is missing)."""
    path = root / "results" / "summary.json"
    block = (json.loads(path.read_text()) if path.is_file() else {}).get(key)
    return block or None


def is_executor_row(row: Mapping[str, Any]) -> bool:
    """Whether an engine bench row is one the executors measured (bucket, engine-only bound, sync items/s).

    A bench of several engines also has one row per engine variant, without executor figures.
    """
    return "sync_items_s" in row


def executor_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An engine bench's executor rows, by bucket."""
    return sorted((r for r in doc.get("rows", []) if is_executor_row(r)), key=lambda r: r["bucket"])


def bound_row(doc: Mapping[str, Any], items_per_batch: float) -> dict[str, Any] | None:
    """The executor row of the bucket a batch of ``items_per_batch`` items pads to (the largest if none fits)."""
    rows = executor_rows(doc)
    return next((r for r in rows if r["bucket"] >= items_per_batch), rows[-1] if rows else None)


def best_entry(candidates: Iterable[Entry]) -> Entry | None:
    """The entry of the highest capacity (a comparable one on a tie), or None when none has a capacity."""
    pool = [e for e in candidates if e.capacity is not None]
    return max(pool, key=lambda e: (e.capacity or 0.0, e.comparable)) if pool else None


def _engine_bound(
    root: Path, sitting: Path, items_per_batch: float | None, items_per_request: int
) -> dict[str, Any] | None:
    """The engine-only bound (req/s) at the batch bucket that ``items_per_batch`` pads to (the sitting's bench)."""
    files = sorted(sitting.glob("engine-bound-*.json"))
    if not files or not items_per_batch:
        return None
    row = bound_row(json.loads(files[-1].read_text()), items_per_batch)
    if row is None:
        return None
    return {
        "file": str(files[-1].relative_to(root)),
        "bucket": row["bucket"],
        "items_per_s": row["engine_bound_items_s"],
        "rps": row["engine_bound_items_s"] / items_per_request,
        "engine_ms_per_batch": row.get("engine_ms_per_batch"),
        "sync_executor_ms_per_batch": row.get("sync_ms_per_batch"),
    }


#: The backend's per-batch means (ms) that say where an execute() call's time goes.
EXECUTOR_KEYS = (
    "requests_per_batch",
    "execute_ms",
    "parse_ms",
    "gather_ms",
    "launch_ms",
    "device_wait_ms",
    "respond_ms",
)


def _executor_means(e: Entry) -> dict[str, Any] | None:
    """The variant's executor counters over all its windows (logged by each instance at unload), per batch."""
    ex = e.summary.get("executor")
    if not ex:
        return None
    out = {k: ex.get(k) for k in EXECUTOR_KEYS}
    build, rpb = ex.get("build_us_per_response"), ex.get("requests_per_batch")
    out["build_ms"] = build * rpb / 1000.0 if build is not None and rpb is not None else None
    return out


def _generator_headroom(e: Entry) -> list[dict[str, Any]]:
    """Per window of the null model's sweep: offered, answered, and how busy the generator itself was."""
    out = []
    for run in e.doc.get("runs", []):
        if run.get("variant") != e.summary.get("variant") or run.get("rate") is None:
            continue
        own = run.get("generator_run") or {}
        gen = run.get("generator") or {}
        out.append(
            {
                "offered_rps": run["rate"],
                "achieved_rps": gen.get("achieved_rps"),
                "p99_ms": (run.get("latency_ms") or {}).get("p99"),
                "very_late_fraction": gen.get("very_late_fraction"),
                "peak_inflight": gen.get("peak_inflight"),
                "generator_busy_max": own.get("busy_max"),
                "generator_us_per_request": own.get("us_per_request"),
                "generator_connections": own.get("peak_connections"),
                "connection_waits": own.get("connection_waits"),
            }
        )
    return sorted(out, key=lambda r: r["offered_rps"])


def summary(root: Path, sitting: Path | None = None, two_gpu: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The ``open_loop`` block of ``results/summary.json`` for one sitting (default: the newest; None: no results).

    Keys the issue names: ``device``, ``slo_p99_ms``, ``best_sync`` and ``best_pipelined`` (``spec``,
    ``capacity_rps``; one GPU), ``engine_bound_rps`` (engine-only bound at the batch the best pipelined
    configuration formed at its capacity), ``two_gpu_capacity_rps`` (best of any mode on two GPUs),
    ``generator_verified_rps`` (the highest rate the null model met the SLO at with the generator on
    schedule). Beside them: where each figure comes from, whether it is comparable (no generator-limited
    window at or below it), the soak, and the targets with their verdicts.
    """
    results = root / "results"
    sitting = sitting or newest_sitting(results)
    if sitting is None:
        return None
    es = entries(results, sitting)
    if not es:
        return None
    one = [e for e in es if e.gpus == 1]
    best_sync = best_entry(e for e in one if e.kind == "sync")
    best_pipe = best_entry(e for e in one if e.kind == "pipelined")
    two = best_entry(e for e in es if e.gpus == 2 and e.kind in ("sync", "pipelined"))
    null = best_entry(e for e in one if e.kind == "null")
    verified = generator_verified(es)
    items = int((es[0].doc.get("load") or {}).get("items") or 50)
    point = (best_pipe.summary.get("capacity_point") or {}) if best_pipe else {}
    bound = _engine_bound(root, sitting, point.get("avg_batch_items"), items)
    headroom = _generator_headroom(null) if null else []
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
            "executor": _executor_means(e),
        }

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    sync_cap = best_sync.capacity if best_sync else None
    pipe_cap = best_pipe.capacity if best_pipe else None
    two_cap = two.capacity if two else None
    one_of_two = best_entry(e for e in one if two is not None and e.kind == two.kind)
    highest = max((c for c in (sync_cap, pipe_cap, two_cap) if c is not None), default=None)
    gen = verified[0] if verified else None
    device = str(((best_pipe or best_sync or es[-1]).doc.get("device") or {}).get("name"))
    out: dict[str, Any] = {
        "sitting": str(sitting.relative_to(root)),
        "generator": str((es[-1].doc.get("load") or {}).get("generator") or "locust"),
        "device": device,
        "slo_p99_ms": float(((es[-1].doc.get("load") or {}).get("open_loop") or {}).get("slo_p99_ms") or 50.0),
        "best_sync": ref(best_sync),
        "best_pipelined": ref(best_pipe),
        "engine_bound_rps": bound["rps"] if bound else None,
        "two_gpu_capacity_rps": two_cap,
        "generator_verified_rps": gen,
        "engine_bound": bound,
        "two_gpu": ref(two),
        # the request path alone (Triton and the Python backend, a fixed wait per batch, none of our code)
        "null_model": ref(null),
        "sync_fraction_of_null": ratio(sync_cap, null.capacity if null else None),
        "pipelined_fraction_of_null": ratio(pipe_cap, null.capacity if null else None),
        "two_gpu_over_one_gpu": ratio(two_cap, one_of_two.capacity if one_of_two else None),
        "pipelined_over_sync": ratio(pipe_cap, sync_cap),
        "pipelined_fraction_of_engine_bound": ratio(pipe_cap, bound["rps"] if bound else None),
        "generator_file": str(verified[1].path.relative_to(root)) if verified else None,
        "generator_covers": (None if gen is None or highest is None else bool(gen >= GENERATOR_MARGIN * highest)),
        "generator_headroom": headroom,
        "soak": dict(soak.summary["soak"], spec=soak.summary["spec"], file=str(soak.path.relative_to(root)))
        if soak
        else None,
    }
    # issue 33: two GPUs at equal server cores per GPU (``two_gpu``: two_gpu_results.summary, from
    # results/two-gpu), when given, replaces this sitting's two-GPU figure (whose second GPU got no cores of
    # its own) and adds its generator proof
    if two_gpu is not None:
        out["two_gpu_capacity_rps"] = two_gpu["two_gpu_capacity_rps"]
        out["two_gpu"] = two_gpu["two_gpu"]
        out["two_gpu_over_one_gpu"] = two_gpu["two_over_one"]
        out["two_gpu_source"] = two_gpu["sitting"]
        if two_gpu["generator_verified_rps"] is not None and two_gpu["generator_verified_rps"] > (gen or 0.0):
            out["generator_verified_rps"] = two_gpu["generator_verified_rps"]
            out["generator_file"] = two_gpu["generator_file"]
        highest = max(highest or 0.0, two_gpu["two_gpu_capacity_rps"])
        top = out["generator_verified_rps"]
        out["generator_covers"] = None if top is None else bool(top >= GENERATOR_MARGIN * highest)
    out["targets"] = targets(out)
    return out


def target_cells(t: Mapping[str, Any]) -> tuple[str, str]:
    """(value, verdict) of one target entry of the ``open_loop`` block, as table cells."""
    v, unit = t["value"], t.get("unit")
    if isinstance(v, (int, float)) and not isinstance(v, bool) and unit == "ratio":
        value = f"{v:.2f}x"
    elif isinstance(v, (int, float)) and not isinstance(v, bool) and unit == "fraction":
        value = f"{100 * v:.1f}%"
    else:
        value = fmt(v)
    return value, "not measured" if t["met"] is None else ("met" if t["met"] else "**missed**")


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


def write_summary(root: Path, two_gpu: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Merge the ``open_loop`` block into ``results/summary.json``, keeping every other key.

    ``two_gpu``: see :func:`summary`.
    """
    block = summary(root, two_gpu=two_gpu)
    if block is not None:
        merge_summary(root, "open_loop", block, allow_nan=False)
    return block


def fmt(v: Any, spec: str = ",.0f") -> str:
    """A table cell: ``v`` formatted with ``spec``; ``yes``/``no`` for a bool, ``n/a`` when missing or not finite."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec)


def markdown_table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    """The lines of a Markdown table with ``header`` and ``rows`` (cells already formatted)."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _binding_limit(block: Mapping[str, Any]) -> str | None:
    """Which limit binds the best sync configuration: the engine-only bound or the null model's request path."""
    sync = (block.get("best_sync") or {}).get("capacity_rps")
    engine = block.get("engine_bound_rps")
    null = (block.get("null_model") or {}).get("capacity_rps")
    if not sync or not engine or not null:
        return None
    of_engine, of_null = sync / engine, sync / null
    which = "the request path (the null model's capacity)" if of_null > of_engine else "the engine-only bound"
    return (
        f"- Which limit binds: the best sync capacity is {100 * of_engine:.0f}% of the engine-only bound and "
        f"{100 * of_null:.0f}% of the null model's capacity (Triton's request path with a fixed wait per batch), "
        f"so the nearer limit is {which}."
    )


def section(root: Path) -> list[str]:
    """The RESULTS.md section from ``results/summary.json``'s ``open_loop`` block and the files it names."""
    block = summary_block(root, "open_loop")
    if not block:
        return []
    generator = (
        "the asyncio generator `inflight.loadtest.rategen`"
        if block.get("generator") == "asyncio"
        else "Locust `OpenLoopHttpUser`"
    )
    lines = [
        "## Open loop: capacity at a p99 SLO (Poisson arrivals)",
        "",
        f"{block['device']}, sitting `{block.get('sitting')}`; requests of 50 items x seq 64 arrive at an offered "
        f"rate whatever the answers (`inflight ab --rate/--search`, {generator}); latency counts from each "
        f"request's scheduled send time; capacity = the highest offered rate with p99 <= {block['slo_p99_ms']:g} ms, "
        "no failure and >= 98% of the requests due answered in the window. Server (tritonserver and every stub) "
        "and load generator on disjoint cores (each file records its CPU sets). Every figure below comes from "
        'this one sitting. Reproduce: `CAMPAIGN=results/open-loop/<date>-<name> PARTS="bound gen sync1 auto1 '
        'pipe1 sync2 auto2 soak" bash scripts/lab/gpu_session.sh campaign` on the 2 x H200 host. Source: the '
        "`open_loop` block of `results/summary.json` (`inflight results-report`).",
        "",
        "| figure | value | target | verdict |",
        "|---|---|---|---|",
    ]
    for t in block.get("targets", []):
        value, verdict = target_cells(t)
        lines.append(f"| {t['figure']} | {value} | {t['target']} | {verdict} |")
    lines.append("")
    rows = []
    for label, key in (
        ("best sync, 1 GPU", "best_sync"),
        ("best pipelined, 1 GPU", "best_pipelined"),
        ("best on 2 GPUs", "two_gpu"),
        ("null model (request path), 1 GPU", "null_model"),
    ):
        r = block.get(key)
        if r:
            rows.append(
                f"| {label} | `{r['spec']}` | {fmt(r['capacity_rps'])} | {fmt(r.get('capacity_upper_rps'))} | "
                f"{fmt(r.get('avg_batch_items'), ',.0f')} | {'yes' if r['comparable'] else '**no**'} | "
                f"`{r['file']}` |"
            )
    lines += [
        "| configuration | spec | capacity (req/s) | first rate missed | items per batch there | comparable | file |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    timed: list[tuple[str, dict[str, Any]]] = [
        (label, block[key])
        for label, key in (
            ("best sync, 1 GPU", "best_sync"),
            ("best pipelined, 1 GPU", "best_pipelined"),
            ("best on 2 GPUs", "two_gpu"),
            ("null model, 1 GPU", "null_model"),
        )
        if block.get(key) and block[key].get("executor")
    ]
    if timed:
        lines += [
            "Where an `execute()` call's time goes (ms per batch; the backend's counters, mean over every window of "
            "the variant, from the instances' unload lines; *device wait* is the time the execute thread waited "
            "for the GPU; the null model's is its stand-in `sleep_us`):",
            "",
            "| configuration | requests per batch | execute | parse | gather | launch | device wait "
            "| build responses |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for label, r in timed:
            x = r["executor"]
            lines.append(
                f"| {label} | {fmt(x.get('requests_per_batch'), '.1f')} | {fmt(x.get('execute_ms'), '.2f')} | "
                f"{fmt(x.get('parse_ms'), '.2f')} | {fmt(x.get('gather_ms'), '.2f')} | "
                f"{fmt(x.get('launch_ms'), '.2f')} | {fmt(x.get('device_wait_ms'), '.2f')} | "
                f"{fmt(x.get('build_ms'), '.2f')} |"
            )
        lines.append("")
    bound = block.get("engine_bound")
    if bound and bound.get("engine_ms_per_batch") is not None:
        lines.append(
            f"- The engine alone (no server, one process, CUDA graph replays back to back) takes "
            f"{fmt(bound['engine_ms_per_batch'], '.3f')} ms per {bound['bucket']}-item batch; the sync executor "
            f"around it (gather, copies, a wait per batch) {fmt(bound.get('sync_executor_ms_per_batch'), '.3f')} ms "
            f"(`{bound['file']}`)."
        )
    if bound:
        lines.append(
            f"- Engine-only bound at the {bound['bucket']}-item bucket the best pipelined configuration's batches "
            f"pad to: {fmt(bound['items_per_s'])} items/s = {fmt(bound['rps'])} req/s (`{bound['file']}`)."
        )
    binds = _binding_limit(block)
    if binds:
        lines.append(binds)
    if block.get("generator_verified_rps") is not None:
        lines.append(
            f"- The load generator met the SLO against the null model, on schedule, up to "
            f"{fmt(block['generator_verified_rps'])} req/s (`{block.get('generator_file')}`)"
            + (
                "; that covers twice every capacity above."
                if block.get("generator_covers")
                else "; that is less than twice the highest capacity above, so the highest ones are lower "
                "bounds of the server (read them with their 'comparable' column)."
            )
        )
    for h in block.get("generator_headroom") or []:
        if h.get("generator_busy_max") is None:
            continue
        lines.append(
            f"  - null model at {fmt(h['offered_rps'])} req/s offered: {fmt(h['achieved_rps'])} answered per "
            f"second, p99 {fmt(h['p99_ms'], ',.1f')} ms, {100 * (h['very_late_fraction'] or 0):.1f}% of sends "
            f"over {LIMIT_LATE_MS:g} ms late; the generator's busiest process "
            f"{100 * h['generator_busy_max']:.0f}% busy, "
            f"{fmt(h['generator_us_per_request'], '.0f')} us of its CPU per request, "
            f"{fmt(h['generator_connections'])} connections open at most"
            + (
                "."
                if h.get("connection_waits") is None
                else f", {fmt(h['connection_waits'])} sends waited for a free connection."
            )
        )
    soak = block.get("soak")
    if soak:
        lines.append(
            f"- Soak: `{soak['spec']}` at {fmt(soak['rate'])} req/s for {soak['windows']} consecutive windows of "
            f"{fmt(soak['window_s'][0], '.0f')} s: {soak['failures']} failures; p99 "
            + " -> ".join(f"{x:.1f}" for x in soak["p99_ms"])
            + f" ms ({100 * soak['p99_change']:+.1f}% last vs first); the stubs' resident memory "
            f"{soak['stub_rss_bytes'][0] / 2**20:,.1f} -> {soak['stub_rss_bytes'][-1] / 2**20:,.1f} MiB "
            f"({100 * soak['stub_rss_change']:+.2f}%) (`{soak['file']}`)."
        )
    lines += ["", "Every sitting (each row from its own files; ratios only within a row):", ""]
    lines += [
        "| sitting | generator | best sync, 1 GPU | best pipelined, 1 GPU | best on 2 GPUs | null model | "
        "engine-only bound | pipelined / sync |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sitting in sittings(root / "results"):
        b = summary(root, sitting)
        if b is None:
            continue

        def cap(key: str, b: Mapping[str, Any] = b) -> str:
            r = b.get(key)
            return f"{fmt(r['capacity_rps'])} (`{r['spec']}`)" if r else "n/a"

        over = b.get("pipelined_over_sync")
        lines.append(
            f"| `{sitting.name}` | {b.get('generator')} | {cap('best_sync')} | {cap('best_pipelined')} | "
            f"{cap('two_gpu')} | {cap('null_model')} | {fmt(b.get('engine_bound_rps'))} | "
            f"{'n/a' if over is None else f'{over:.2f}x'} |"
        )
    lines += [
        "",
        "Every open-loop run, with its latency-against-rate table and plot, one line per kind of result "
        "(its sittings separated by semicolons):",
        "",
    ]
    by_sitting: dict[Path, list[Path]] = {}
    for p in open_loop_files(root / "results"):
        md = report_file(p).relative_to(root)
        by_sitting.setdefault(md.parents[1] if len(md.parents) > 3 else md.parent, []).append(md)
    by_kind: dict[Path, list[str]] = {}
    for sitting, mds in by_sitting.items():
        links = ", ".join(f"[{md.parent.name if md.parent != sitting else md.stem}](../{md})" for md in mds)
        kind = Path(*sitting.parts[:2])
        by_kind.setdefault(kind, []).append(links if sitting == kind else f"`{sitting.name}`: {links}")
    lines += [f"- `{kind}`: {'; '.join(parts)}" for kind, parts in by_kind.items()]
    lines.append("")
    return lines
