"""RESULTS-ab-runs' "One instance: the request path's ceiling" section, from ``results/per-instance-ceiling``.

One instance of each mode beside the null control model in one A/B: the null model does nothing but Triton's
Python-backend request path, so its req/s bounds what any executor can serve in one instance.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.entries import load_ab
from inflight.lab.sections import Section, fmt, markdown_table, span

TITLE = "One instance: the request path's ceiling"
CEILING_DIR = "per-instance-ceiling"


def read_runs(root: Path, folder: str) -> list[tuple[Path, dict[str, Any]]]:
    """Every A/B file under ``results/<folder>`` in path order: its path from ``root`` and its document."""
    return [(p.relative_to(root), load_ab(p)) for p in sorted((root / "results" / folder).rglob("ab-*.json"))]


PER_INSTANCE_TARGET = 2.0
"""Issue 3: one pipelined instance serves at least this many times the req/s of one sync instance."""


def param(cfg: Mapping[str, Any], key: str) -> int:
    """An integer parameter of a variant's config as the A/B JSON records it (0 when absent)."""
    return int((cfg.get("parameters") or {}).get(key, {}).get("string_value", "0") or 0)


def kind_of(variant: Mapping[str, Any]) -> str:
    """What an A/B variant is.

    ``sync``, ``pipelined``, ``null`` (the null model returning its responses from ``execute()``),
    ``deferred null`` (sending them through response senders from threads), or the variant name as
    recorded (``trt``).
    """
    kind = str(variant.get("variant"))
    if kind == "null":
        return "deferred null" if param(variant.get("config") or {}, "sender_threads") else "null"
    return {"inflight": "pipelined"}.get(kind, kind)


def _one_instance(variant: Mapping[str, Any]) -> str | None:
    """The :func:`kind_of` of a one-instance variant (a null model only when it sleeps 0), else None."""
    from inflight.loadtest.stats import config_instances

    cfg = variant.get("config") or {}
    if config_instances(cfg) != 1:
        return None
    kind = kind_of(variant)
    if kind in ("null", "deferred null"):
        return None if param(cfg, "sleep_us") else kind
    return kind if kind in ("sync", "pipelined") else None


def kind_label(variant: Mapping[str, Any]) -> str:
    """:func:`kind_of` in words: the null model's label says how many threads send its responses."""
    kind = kind_of(variant)
    if kind == "deferred null":
        return f"null, deferred to {param(variant.get('config') or {}, 'sender_threads')} sender threads"
    return "null, returned from execute()" if kind == "null" else kind


def _execute_and_between(s: Mapping[str, Any] | None) -> str:
    """``execute ms + between ms`` per batch from a summary row's executor counters."""
    e = (s or {}).get("executor") or {}
    return f"{fmt(e.get('execute_ms'), '.2f')} + {fmt(e.get('between_executes_ms'), '.2f')}"


def collect(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Each A/B file under ``results/per-instance-ceiling`` (its path from ``root``) and its document."""
    return read_runs(root, CEILING_DIR)


def render(runs: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """One instance of each mode beside the null control model, per A/B file: the request path's ceiling.

    The null model (``backends/null``, sleeping 0) does no work besides Triton's Python-backend
    request path, so its req/s bounds what any executor can serve in one instance; its ratio to the
    sync instance bounds what hiding the device wait can gain.
    """
    rows: list[list[str]] = []
    ceilings: list[float] = []
    ratios: list[float] = []
    deferred_ratios: list[float] = []
    for path, doc in runs:
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
                f"`{path}`",
                str((doc.get("load") or {}).get("protocol", "?")),
                str(int(null.get("runs", 1))),
                fmt(null["rps"]),
                fmt(sync["rps"]),
                fmt(pipe["rps"]) if pipe else "n/a",
                fmt(deferred["rps"]) if deferred else "n/a",
                fmt(ceiling, ".2f", "x"),
                fmt(deferred_ratio, ".2f", "x"),
                fmt(ratio, ".2f", "x"),
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
        + (span(ratios) if ratios else "no pipelined run")
        + f"; **{'met' if ratios and min(ratios) >= PER_INSTANCE_TARGET else 'missed'}**. The null instance, which "
        f"does no work at all, serves {span(ceilings)} one sync instance, "
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
            f"- The deferred null instance serves {span(deferred_ratios)} one sync "
            "instance: sending each response through its response sender (a blocking round trip to the server per "
            "request) costs more than returning them all from `execute()`, so the ceiling of a pipelined "
            "Python-backend instance is lower still than the null model's."
        )
    lines.append("")
    return lines


SECTION = Section(title=TITLE, collect=collect, render=render)
