"""RESULTS' "Faults under load" section: one table per sitting of ``python -m inflight.lab.faults``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.faults import FAULTS_DIR
from inflight.lab.sections import Section, fmt, markdown_table

TITLE = "Faults under load"


def sittings(results: Path) -> list[Path]:
    """The ``faults.json`` files under ``results/faults``, oldest sitting (by folder name) first."""
    return sorted((results / FAULTS_DIR).glob("*/faults.json"))


def _failures(f: Mapping[str, Any]) -> str:
    kinds = f.get("failures_by_kind") or {}
    if not kinds:
        return "none"
    return "; ".join(f"{n} x {k.replace('|', '/')}" for k, n in list(kinds.items())[:3]) + (
        f"; {len(kinds) - 3} more kinds" if len(kinds) > 3 else ""
    )


def _recovery(f: Mapping[str, Any]) -> str:
    rec = f.get("recovery") or {}
    if not rec:
        return "n/a"
    check = rec.get("check_replacement") or rec.get("check_after_reload") or rec.get("check") or {}
    n = f"{check.get('correct')}/{check.get('requests')}"
    took = f"; the reload took {fmt(f['reload_s'], '.0f')} s" if f.get("reload_s") is not None else ""
    return f"{fmt(rec.get('recovered'))} ({rec.get('how') or 'n/a'}; {n} correct{took})"


def _busy(f: Mapping[str, Any]) -> str:
    b = f.get("busy_after")
    if not b:
        return "n/a"
    return f"{fmt(b.get('busy'), '.0f')} ({len(b.get('probed_instances') or [])} instances probed)"


def _rss(f: Mapping[str, Any]) -> str:
    rss = f.get("rss")
    if not rss:
        return ""
    stubs = rss.get("stubs") or {}
    parts = [f"{fmt(v.get('start_mib'), '.0f')} -> {fmt(v.get('end_mib'), '.0f')}" for _, v in sorted(stubs.items())]
    return f"{'; '.join(parts)} MiB ({'flat' if rss.get('flat') else 'NOT flat'})"


def what_triton_did(f: Mapping[str, Any]) -> str:
    """Fault b in words, from the file: the killed stub, whether Triton replaced it, the model's readiness."""
    notes = f.get("notes") or {}
    killed = notes.get("killed") or {}
    if not killed:
        return ""
    before, after = notes.get("stubs_before") or {}, notes.get("stubs_after") or {}
    name = killed.get("instance")
    restarted = name in after and after[name] != killed.get("pid")
    rec = f.get("recovery") or {}
    stale = (f.get("busy_before_recovery") or {}).get("in_flight") or {}
    dead = [v for k, v in stale.items() if f"instance={name}," in k]
    parts = [
        f"killed `{name}`'s stub; Triton {'started a new stub' if restarted else 'did not restart it'} "
        f"({len(after)} of {len(before)} stubs alive after the load); the model stayed ready: "
        f"{fmt(notes.get('model_ready_after'))}",
    ]
    top = next(iter((f.get("failures_by_kind") or {}).items()), None)
    if top:
        parts.append(f"{top[1]} requests failed with `{top[0].replace('|', '/')}`")
    parts.append(
        f"{f.get('lost')} requests got neither an answer nor an error within 30 s"
        + (f" (the killed instance's last in-flight gauge: {dead[0]:.0f} batch(es))" if dead else "")
    )
    if rec.get("reload"):
        r = rec["reload"]
        parts.append(
            "the unload and reload "
            + ("worked" if r.get("ok") else f"failed ({r.get('error', '?')})")
            + f" after {fmt(r.get('seconds'), '.0f')} s"
        )
    server = f.get("server") or {}
    if rec.get("check_replacement"):
        parts.append(
            f"`inflight serve` then stopped with exit code {server.get('serve_exit_code')} and a new one "
            f"answered {rec['check_replacement'].get('correct')}/{rec['check_replacement'].get('requests')} correctly"
        )
    return "; ".join(parts)


def collect(root: Path) -> dict[str, Any] | None:
    """Each sitting's ``faults.json`` under ``results/faults`` by path, oldest first (None when there is none)."""
    files = sittings(root / "results")
    return {"root": root, "docs": [(p, json.loads(p.read_text())) for p in files]} if files else None


def render(data: Mapping[str, Any]) -> list[str]:
    """The section: one table per sitting, and what Triton did on (b)."""
    root = data["root"]
    lines = [
        "## Faults under load (`results/faults`)",
        "",
        "An open loop (Poisson arrivals) at half the capacity measured just before on the same server, while a "
        "fault hits it: (a) SIGTERM to `inflight serve`; (b) SIGKILL to one instance's Python-backend stub; "
        "(c) the model unloaded and loaded again; (d) 1% of the clients closing their connection before "
        "reading the answer. Lost = neither answered nor failed within 30 s (target 0); dropped = the "
        "deliberately abandoned requests of (d). Recovered: the server (for (a) a new one) answers correctly "
        "afterwards; busy slots: in-flight batches of the instances that ran the probes plus Triton's pending "
        "requests, after the load. Stub RSS: median of the first and last third of the samples "
        "(flat: at most 20 MiB growth).",
        "",
    ]
    for path, doc in data["docs"]:
        cfg, host = doc.get("config") or {}, doc.get("host") or {}
        lines += [
            f"### {path.parent.name}: {host.get('device', '?')}, {host.get('cpu_count', '?')} CPUs "
            f"(`{path.relative_to(root)}`)",
            "",
            f"`{cfg.get('serve_model_arg', '?')}`; Triton's Python-backend stub "
            + (
                f"from nvidia-pytriton {pt}; "
                if (pt := (doc.get("versions") or {}).get("nvidia_pytriton"))
                else "from a tritonserver not installed as the nvidia-pytriton package (the GPU host's kit); "
            )
            + f"`{doc.get('command', '?')}`.",
            "",
        ]
        rows = []
        for f in doc.get("faults") or []:
            rows.append(
                [
                    f"({f['fault']}) {f.get('name', '')}",
                    fmt(f.get("load_s"), ".0f"),
                    fmt(f.get("rate_rps"), ".1f"),
                    fmt(f.get("sent"), ",d"),
                    fmt(f.get("answered"), ",d"),
                    fmt(f.get("failed"), ",d"),
                    fmt(f.get("lost"), ",d"),
                    fmt(f.get("dropped"), ",d") if f.get("dropped") else "",
                    _failures(f),
                    _recovery(f),
                    _busy(f),
                    _rss(f),
                ]
            )
        lines += markdown_table(
            [
                "fault",
                "load s",
                "req/s",
                "sent",
                "answered",
                "failed",
                "lost",
                "dropped",
                "failures by kind",
                "recovered",
                "busy slots after",
                "stub RSS start -> end",
            ],
            rows,
        )
        did = [what_triton_did(f) for f in doc.get("faults") or [] if f.get("fault") == "b"]
        if did and did[0]:
            lines += ["", f"What Triton did on (b): {did[0]}."]
        lines += [""]
    return lines


SECTION = Section(title=TITLE, collect=collect, render=render)
