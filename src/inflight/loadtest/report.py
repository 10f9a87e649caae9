"""The A/B report, drawn from the runner's JSON alone (``inflight ab-report`` regenerates it).

Writes ``<stem>.md`` (a side-by-side table with ratios to A, the set-up, every run, problems) and
PNG plots next to it: throughput over time (Locust's stats history, one line per run), latency
percentiles per variant (exact, from the raw latencies), and GPU activity / sync share per variant
when the backend published them (model parameter ``cupti=true``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inflight.errors import ConfigError
from inflight.loadtest.rategen_answers import BIN_S, SILENT_SHARE, STALL_MS
from inflight.loadtest.report_plots import plot_gpu, plot_latency, plot_open_loop, plot_throughput
from inflight.loadtest.report_tables import _fmt, _num, _pct, comparison_table, runs_table, steps_table

LOGGER = logging.getLogger(__name__)


def load(path: Path) -> dict[str, Any]:
    """Read an A/B JSON written by the runner.

    Raises:
        ConfigError: when the file is missing or is not an A/B result.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"cannot read {path}: {e}; pass a results/ab-<timestamp>.json written by `inflight ab`"
        ) from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("inflight-ab/"):
        raise ConfigError(f"{path} is not an A/B result (no inflight-ab schema); pass a file written by `inflight ab`")
    return doc


#: Backend parameters that act only on a GPU: a CPU instance runs fp32, without CUDA graphs or unpadding.
GPU_ONLY_PARAMETERS = (
    "precision",
    "cuda_graphs",
    "capture_at_load",
    "graph_memory_mb",
    "max_graphs",
    "unpad",
    "unpad_token_cost",
    "graph_tokens",
)


def served_on_cpu(v: dict[str, Any]) -> bool:
    """True when every instance of the variant reported at load that it runs on the CPU."""
    served = v.get("served") or []
    return bool(served) and all(" on CPU " in line for line in served)


def _config_line(v: dict[str, Any]) -> str:
    """The variant's configuration; on the CPU (as its instances reported) without the GPU-only parameters."""
    cfg = v.get("config", {})
    group = (cfg.get("instance_group") or [{}])[0]
    batching = cfg.get("dynamic_batching", {})
    params = {k: p.get("string_value") for k, p in (cfg.get("parameters") or {}).items()}
    parts = [
        f"instances={group.get('count', 1)}",
        f"kind={group.get('kind', 'KIND_AUTO').removeprefix('KIND_').lower()}",
        f"max_batch={cfg.get('max_batch_size')}",
        f"delay_us={batching.get('max_queue_delay_microseconds', 0)}",
    ]
    if batching.get("preferred_batch_size"):
        parts.append("preferred=" + "/".join(str(x) for x in batching["preferred_batch_size"]))
    idle = sorted(k for k in params if k in GPU_ONLY_PARAMETERS) if served_on_cpu(v) else []
    parts += [f"{k}={params[k]}" for k in sorted(params) if k not in idle]
    line = ", ".join(parts)
    if idle:
        line += (
            " (on the CPU, as its instances reported, so not in effect: "
            + ", ".join(f"{k}={params[k]}" for k in idle)
            + ")"
        )
    return line


def _processes(n: int) -> str:
    if n <= 0:
        return "one plain Locust process"
    return f"{n} Locust worker process{'es' if n > 1 else ''} (--processes {n})"


def markdown(doc: dict[str, Any], images: Sequence[Path] = ()) -> str:
    """The whole report as Markdown (``images`` are linked by file name)."""
    load_ = doc["load"]
    dev = doc.get("device", {})
    ver = doc.get("versions", {})
    out = [f"# A/B load test {doc['id']}\n"]
    if doc.get("valid"):
        fails = sum(int(s.get("failures") or 0) for s in doc["summary"])
        out.append("**Status: valid**" + (f", but {fails} requests failed (see below)." if fails else ".") + "\n")
    else:
        out.append("**Status: INVALID** — these figures must not be compared:\n")
        out += [f"- {p}" for p in doc.get("problems", [])]
        out.append("")
    if doc.get("caveats"):
        out.append("**Caveats** — valid, but read these figures with them:\n")
        out += [f"- {c}" for c in doc["caveats"]]
        out.append("")
    device = dev.get("name", "?") + (f", driver {dev['driver']}" if dev.get("driver") else "")
    if dev.get("name") == "cpu" and dev.get("cpu_model"):
        device += f" ({dev['cpu_model']}, {dev.get('cpus')} cores)"
    out += [
        f"- started {doc.get('started')}, finished {doc.get('finished')}; device: {device}",
        f"- versions: tritonserver {ver.get('tritonserver')}, locust {ver.get('locust')}, torch {ver.get('torch')}, "
        f"inflight {ver.get('inflight')}, tritonclient {ver.get('tritonclient')}, numpy {ver.get('numpy')}, "
        f"Python {ver.get('python')}",
        f"- load{' (preset ' + doc['preset'] + ')' if doc.get('preset') else ''}: "
        + (
            f"{load_['users']} closed-loop users "
            if load_.get("closed_loop", True)
            else f"open loop, {load_.get('arrival', 'poisson')} arrivals from {load_['users']} sources "
        )
        + f"({load_['protocol']}, {load_['user_class']}), {load_['items']} items/request"
        + (f", seq {load_['seq_len']} ({load_['token_dist']} tokens, {load_['length_dist']} lengths)")
        + f", {_fmt(load_['window_s'], 0)} s window after {_fmt(load_['warmup_s'], 0)} s warm-up, spawn rate "
        f"{_fmt(load_['spawn_rate'], 0)}/s, {_processes(load_['processes'])}, seed {load_['seed']}, "
        f"pool {load_['pool']}, check {'on' if load_.get('check') else 'off'}",
        f"- order: {', '.join(load_.get('order', []))} (repeat {load_.get('repeat', 1)})",
        f"- CPU sets: {_cpu_sets_line(load_.get('cpu_sets'))}",
        *_deployment_lines(doc),
    ]
    srv_args = [*((doc.get("server") or {}).get("server_args") or ())]
    srv_args += [f"--backend-config={b}" for b in (doc.get("server") or {}).get("backend_config") or ()]
    if srv_args:
        out.append("- server arguments: " + " ".join(f"`{a}`" for a in srv_args))
    out += [
        "",
        "## Variants\n",
    ]
    for v in doc["variants"]:
        served = v.get("served") or []
        out.append(f"- **{v['label']}** `{v['spec']}` → {v['model_name']}")
        if served:
            # what the instances reported at load, first: the config says what was asked for
            out.append(
                f"  - served as (its instances at load, server log): {served[0]}"
                + (f" (+{len(served) - 1} more)" if len(served) > 1 else "")
            )
        else:
            out.append("  - served as: not reported at load (only the inflight backend logs what it serves with)")
        out.append(f"  - configuration: {_config_line(v)}")
    if not load_.get("closed_loop", True):
        out += ["", open_loop_section(doc)]
    out += ["", "## Side by side\n", comparison_table(doc)]
    out.append(
        "Latency percentiles are exact (nearest rank) over the raw per-request latencies every Locust process "
        "wrote; Locust's own percentiles round response times to whole milliseconds below 100 ms (and coarser "
        "above), so they are not used. Server times are per request, from the difference of two "
        "`/v2/models/<m>/stats` snapshots around the window; in pipelined mode `compute_infer` ends when "
        "`execute()` returns, before the responses are sent. GPU activity and sync share are the backend's "
        "live gauges (model parameter `cupti=true`), averaged over the samples taken during the window.\n"
    )
    out += [f"Note: {n}\n" for n in doc.get("notes", [])]
    out += ["## Runs\n", runs_table(doc)]
    if steps := steps_table(doc):
        out += ["## The ensembles' steps\n", "Triton's statistics of each step's model over the window.\n", steps]
    messages = [(r, f) for r in doc["runs"] for f in r.get("failure_messages") or []]
    by_status = [(r, r["failures_by_status"]) for r in doc["runs"] if r.get("failures_by_status")]
    if messages or by_status:
        out.append("## Failures\n")
        if by_status:
            out.append(
                "Per run, by what answered: an HTTP status (a refusal by Triton or the backend; Triton counts its "
                "own refusals in no statistic or metric and the backend's as successes, README \"Counting failed "
                'requests"), or `other` (no answer in time, a connection error, a wrong output):\n'
            )
            out += [
                f"- {r['variant']} round {r['round']}: " + ", ".join(f"{k}: {n}" for k, n in counts.items())
                for r, counts in by_status
            ]
            out.append("\nThe most frequent messages:\n")
        out += [f"- {r['variant']} round {r['round']}: {f['occurrences']} x {f['error']}" for r, f in messages]
        out.append("")
    if images:
        out.append("## Plots\n")
        out += [f"![{p.stem}]({p.name})\n" for p in images]
    return "\n".join(out).rstrip() + "\n"


def deployment_line(servers: Sequence[Any]) -> str:
    """``2 servers, one per GPU: GPU 0 on cores 0-9, GPU 1 on cores 10-19``, from ``server.per_gpu_servers``."""

    def where(cpus: str) -> str:
        if not cpus:
            return "not pinned"
        return f"on core{'s' if '-' in cpus or ',' in cpus else ''} {cpus}"

    parts = [f"GPU {s['gpu']} {where(str(s.get('cpus') or ''))}" for s in servers]
    n = len(servers)
    return f"{n} server{'s' if n != 1 else ''}, one per GPU: " + ", ".join(parts)


def _deployment_lines(doc: dict[str, Any]) -> list[str]:
    """The header lines of a run with one server per GPU (none for one server)."""
    srv = doc.get("server") or {}
    servers = srv.get("per_gpu_servers") or []
    if not servers:
        return []
    flag = f"--server-per-gpu {','.join(str(s['gpu']) for s in servers)}"
    lines = [f"- deployment: {deployment_line(servers)} (`{flag}`)"]
    answered = srv.get("per_server_requests") or []
    if len(answered) == len(servers):
        total = sum(int(n or 0) for n in answered)
        lines.append(
            "- requests answered per server in the measured windows (Triton's success count): "
            + ", ".join(
                f"GPU {s['gpu']} {_fmt(n, 0)}" + (f" ({100 * int(n or 0) / total:.0f}%)" if total else "")
                for s, n in zip(servers, answered, strict=True)
            )
        )
    return lines


def _cpu_sets_line(sets: Any) -> str:
    if not isinstance(sets, dict):
        return "not recorded"
    if sets.get("isolated"):
        return f"server on cores {sets['server']}, load generator on cores {sets['client']} ({sets.get('reason')})"
    return str(sets.get("reason") or "not pinned")


def open_loop_section(doc: dict[str, Any]) -> str:
    """Capacity at the SLO per variant, then latency against offered rate (every open-loop window)."""
    ol = doc["load"].get("open_loop") or {}
    slo = ol.get("slo_p99_ms")
    out = [
        f"## Open loop: capacity at p99 <= {_fmt(slo, 0)} ms\n",
        "Requests arrive at the offered rate whatever the answers; latency counts from each request's "
        "scheduled send time, so a late send adds its lateness. A rate meets the SLO when its p99 is within "
        f"{_fmt(slo, 0)} ms, no request failed and at least {100 * (1 - float(ol.get('rate_tolerance', 0.02))):.0f}% "
        "of the requests due in the window were answered in it. The capacity is the highest offered rate that "
        "met it below the first that did not. A window whose generator sent more than "
        f"{100 * float(ol.get('max_late_fraction', 0.01)):.0f}% of its requests over "
        f"{_fmt(ol.get('limit_late_ms'), 0)} ms late (or whose Locust warned of its CPU) is *generator-limited*; "
        "a capacity with such a window at or below it is not used for ratios. 'Late sends' counts sends over "
        f"{_fmt(ol.get('late_threshold_ms'), 0)} ms behind schedule.\n",
        "| variant | capacity (req/s) | first rate that missed | comparable |",
        "|---|---|---|---|",
    ]
    for s in doc["summary"]:
        cap = s.get("capacity_rps")
        out.append(
            f"| {s['variant']}: `{s['spec']}` | "
            + (_fmt(cap, 0) + ("" if s.get("capacity_bounded") else " (at least)") if cap is not None else "none")
            + f" | {_fmt(s.get('capacity_upper_rps'), 0) if s.get('capacity_upper_rps') is not None else '-'} | "
            + ("yes" if s.get("comparable") else "**no** (generator-limited)" if cap is not None else "no")
            + " |"
        )
    out += [
        "",
        "### Latency against offered rate\n",
        "| variant | offered req/s | achieved req/s | answered | p50 ms | p95 ms | p99 ms | failures | "
        "avg batch (requests) | server cores | late sends | SLO |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in doc["summary"]:
        for p in s.get("sweep") or []:
            late = p.get("late_fraction")
            out.append(
                f"| {s['variant']} | {_fmt(p['offered_rps'], 0)} | {_fmt(p['achieved_rps'], 0)} | "
                f"{_pct(p.get('answered_fraction'))} | {_fmt(p['p50_ms'], 2)} | {_fmt(p['p95_ms'], 2)} | "
                f"{_fmt(p['p99_ms'], 2)} | {p['failures']} | {_fmt(p.get('avg_batch_requests'), 1)} | "
                f"{_fmt(p.get('server_cores'), 2)} | {_pct(late)}"
                + (" (generator-limited)" if p.get("generator_limited") else "")
                + f" | {'met' if not p.get('slo_misses') else 'missed'} |"
            )
    stalls = stalls_table(doc)
    if stalls:
        out += ["", stalls]
    return "\n".join(out) + "\n"


def stalls_table(doc: dict[str, Any], *, explain: bool = True) -> str:
    """Where each window's slow answers came from (asyncio generator windows with a timeline), or ''.

    Args:
        doc: The A/B document.
        explain: Start with a heading and what the columns mean; otherwise the table alone.
    """
    rows = []
    for r in doc.get("runs", []):
        g = r.get("generator_run") or {}
        st = g.get("stalls")
        if not st or not st.get("sources"):
            continue
        srv = r.get("server") or {}
        sil = st.get("silent_episodes") or {}
        gc_ = g.get("generator_gc") or {}
        lat = r.get("latency_ms") or {}
        rows.append(
            f"| {r['variant']} | {_fmt(r.get('rate'), 0)} | {_fmt(lat.get('p50'), 1)} | {_fmt(lat.get('p99'), 1)} | "
            f"{_fmt(_ms(srv.get('request_us')), 2)} | "
            f"{_fmt(_ms(srv.get('queue_us')), 2)} | {st['slow_bins']} | {st['slow_bins_most_sources']} | "
            f"{st['slow_bins_one_source']} | {sil.get('count', 0)} | {_fmt(sil.get('longest_ms'), 0)} | "
            f"{_fmt(gc_.get('max_ms'), 1)} | {g.get('connection_waits', '-')} | "
            f"{_pct((r.get('cpu') or {}).get('host_steal'))} | {_threads_cell(r)} |"
        )
    if not rows:
        return ""
    head = [
        "### Where the slow answers came from\n",
        f"The generator bins each source's window in {BIN_S * 1e3:g} ms: a bin is *slow* when an answer "
        f"in it took over {STALL_MS:g} ms from its scheduled send. A stall of the server (or of anything "
        "every connection goes through) makes most sources slow in the same bins; a stall of one generator "
        f"process makes one. *Silent* episodes: consecutive bins where all sources together got under "
        f"{100 * SILENT_SHARE:g}% of the offered rate's answers while requests were outstanding. "
        "Triton's request and queue times are its own means over the window (from the request's arrival in "
        "the server to its response). A thread's busy share is over the CPU window, which also holds the "
        "generator's start and its grace (about 80% of it has load). Steal: the share of the server's cores' "
        "time the hypervisor ran something else (on a virtual host; 0 on bare metal), a stall no variant "
        "causes.\n",
    ]
    return (
        "\n".join(
            [
                *(head if explain else []),
                "| variant | offered req/s | p50 ms | p99 ms | Triton request ms | Triton queue ms | slow bins | "
                "most sources | one source | silent episodes | longest silence ms | generator GC max ms | "
                "waits for a connection | hypervisor steal (server cores) | "
                "busiest server threads (busy share of the CPU window; threads over 80%) |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
                *rows,
            ]
        )
        + "\n"
    )


def _threads_cell(run: dict[str, Any]) -> str:
    th = (run.get("cpu") or {}).get("threads") or {}
    top = th.get("busiest") or []
    if not top:
        return "-"
    return ", ".join(f"{n} {100 * float(b):.0f}%" for n, b in top[:3]) + f"; {th.get('over_80', 0)} over 80%"


def _ms(us: Any) -> float | None:
    x = _num(us)
    return None if x is None else x / 1e3


def write_report(json_path: Path) -> tuple[Path, list[Path]]:
    """Write ``<stem>.md`` and ``<stem>-*.png`` next to ``json_path``.

    Returns:
        The Markdown path and the PNGs written.

    Raises:
        ConfigError: when ``json_path`` is not an A/B result.
    """
    json_path = Path(json_path)
    doc = load(json_path)
    stem = json_path.with_suffix("")
    images: list[Path] = []
    for suffix, draw in (
        ("throughput", plot_throughput),
        ("latency", plot_latency),
        ("gpu", plot_gpu),
        ("open-loop", plot_open_loop),
    ):
        target = stem.parent / f"{stem.name}-{suffix}.png"
        made = draw(doc, target)
        if made is not None:
            images.append(made)
        elif target.exists():
            target.unlink()
    md = stem.with_suffix(".md")
    md.write_text(markdown(doc, images))
    LOGGER.info("wrote %s and %d plots", md, len(images))
    return md, images
