"""RESULTS' "Open loop" section: capacity at a p99 SLO of the newest sitting, the limits beside it, every sitting."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.lab.entries import sittings, summary_block
from inflight.lab.open_loop_results import summary, summary_with_two_gpu
from inflight.lab.sections import Section, fmt
from inflight.loadtest.openloop import LIMIT_LATE_MS

TITLE = "Open loop"


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


def collect(root: Path) -> dict[str, Any] | None:
    """The ``open_loop`` block of ``results/summary.json`` and every sitting's own block."""
    block = summary_block(root, "open_loop")
    if not block:
        return None
    every = [(s.name, b) for s in sittings(root / "results") if (b := summary(root, s)) is not None]
    return {
        "block": block,
        "sittings": every,
    }


def render(data: Mapping[str, Any]) -> list[str]:
    """The section: the targets, the best configurations, the limits beside them, every sitting."""
    block = data["block"]
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
    for name, b in data["sittings"]:

        def cap(key: str, b: Mapping[str, Any] = b) -> str:
            r = b.get(key)
            return f"{fmt(r['capacity_rps'])} (`{r['spec']}`)" if r else "n/a"

        over = b.get("pipelined_over_sync")
        lines.append(
            f"| `{name}` | {b.get('generator')} | {cap('best_sync')} | {cap('best_pipelined')} | "
            f"{cap('two_gpu')} | {cap('null_model')} | {fmt(b.get('engine_bound_rps'))} | "
            f"{'n/a' if over is None else f'{over:.2f}x'} |"
        )
    lines.append("")
    return lines


SECTION = Section(
    title=TITLE,
    collect=collect,
    render=render,
    summary_key="open_loop",
    summarize=summary_with_two_gpu,
    summary_allows_nan=False,
)
