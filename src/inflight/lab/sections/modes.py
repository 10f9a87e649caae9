"""RESULTS' "Sync against pipelined" section: core budgets, the regime models, what ``auto`` chose, the executors."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inflight.lab.entries import Entry, device, in_band_batches, instances, model, server_cores
from inflight.lab.modes_results import core_budget, plain_p99_over_sync, regime, summary
from inflight.lab.modes_select import (
    NEEDED_FRACTION,
    STALL_SPREAD,
    collect,
    gpu_memory_mib,
    is_plain,
    overlap_bound,
    searched,
    sitting_of,
    stalls,
    tail_spread,
)
from inflight.lab.sections import Section, fmt, markdown_table

TITLE = "Sync against pipelined"


def collect_modes(root: Path) -> dict[str, Any] | None:
    """Every sitting's entries, each core budget's figures (:func:`core_budget`) and each model's (:func:`regime`)."""
    c = collect(root)
    if not c["entries"]:
        return None
    budgets = []
    for (dev, cores), es in sorted(c["budgets"].items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        b = core_budget(es)
        if b is not None:
            budgets.append((dev, cores, b))
    regimes = [r for _, es in sorted(c["regimes"].items()) if (r := regime(es)) is not None]
    return {"entries": c["entries"], "budgets": budgets, "regimes": regimes}


def pooled_cell(pooled: Mapping[Any, Mapping[str, Any]]) -> str:
    """``pooled_p99`` as one cell: per load point, the median ratio (rounds in sittings; sign p).

    The load points are shares as :func:`pooled_p99` returns them, or their text as ``summary.json`` holds them.
    """
    return ", ".join(
        f"{float(point):.0%}: {v['ratio']:.2f} ({v['rounds']} in {v['sittings']}; p {v['sign_p']:.2f})"
        for point, v in pooled.items()
        if v.get("sign_p") is not None
    )


def _searches(caps: Sequence[float]) -> str:
    """A variant's capacity searches in one cell: "10,625" or "11,500 / 13,250"."""
    return " / ".join(fmt(x) for x in caps) or "n/a"


def basis(c: Mapping[str, Any], short: bool = False, p: float | None = None) -> str:
    """How a capacity ratio of ``c`` was read: " (medians of N and M searches)", or nothing (one search a side).

    With ``p`` (:func:`permutation_p` of the searches), it follows: " (medians, N/M; p 0.63)".
    """
    n, m = len(c.get("sync_searches_rps") or []), len(c.get("pipelined_searches_rps") or [])
    if n < 2 or m < 2:
        return ""
    chance = f"; p {p:.2f}" if p is not None else ""
    return f" (medians, {n}/{m}{chance})" if short else f" (medians of {n} and {m} searches{chance})"


def _inst(e: Entry | None) -> str:
    return str(instances(e)) if e is not None else "none measured"


def _mem(e: Entry | None) -> str:
    return fmt(gpu_memory_mib(e)) if e is not None else "n/a"


def _spec(e: Entry) -> str:
    return f"`{e.summary['spec']}`"


def cap_of(e: Entry | None) -> str:
    """Capacity with the instances it had, or "not measured"."""
    if e is None:
        return "not measured"
    return f"{_capacity(e)} ({instances(e)} inst.)"


def _capacity(e: Entry) -> str:
    """The capacity, with ">=" when it is a lower bound (the search's high end met the SLO)."""
    return ("" if searched(e) else ">= ") + fmt(e.capacity)


def deployment(e: Entry) -> str:
    """What to deploy, in words: the mode and the instances."""
    what = "the plain Python backend" if is_plain(e) else f"`{e.mode}`"
    return f"{what}, {instances(e)} instance{'s' if instances(e) != 1 else ''}"


def plain_cell(plain: Entry | None, own: bool, sync: Entry | None, stalling: Sequence[float] = ()) -> str:
    """The plain baseline's cell: its capacity and p99 against ``sync``'s; from another sitting, its share too.

    The p99 is :func:`plain_p99_over_sync`'s; the share (not ``own``) is of ``sync``'s capacity there.

    ``sync`` is what :func:`sync_beside` found in the plain search's sitting; ``stalling`` the shares of
    :func:`stalling_plain_shares` (two or more: each is shown, the newest host's figure being no better).
    """
    if plain is None:
        return "not measured beside sync"
    tail = plain_p99_over_sync(plain, sync)
    p99 = f"p99 {tail[1]:.2f}x sync's at {fmt(tail[0])} req/s" if tail else ""
    if own:
        return f"{cap_of(plain)} ({p99})" if p99 else cap_of(plain)
    if len(stalling) > 1:
        shares = ", ".join(f"{x:.2f}x" for x in stalling)
        return (
            f"not measured on a steady host; on {len(stalling)} hosts that stall (sync's p99 >= "
            f"{STALL_SPREAD:g}x its p50 at its lowest rate) {shares} sync there, newest `{sitting_of(plain).name}`"
        )
    share = f"{(plain.capacity or 0.0) / sync.capacity:.2f}x sync there, " if sync and sync.capacity else ""
    spread = tail_spread(sync) if sync is not None and stalls(sync) else None
    host = f"a host that stalls: sync's p99 {spread[1]:.0f}x its p50 at {fmt(spread[0])} req/s, " if spread else ""
    return f"{cap_of(plain)} ({share}{p99 + ', ' if p99 else ''}{host}`{sitting_of(plain).name}`)"


def render(data: Mapping[str, Any]) -> list[str]:
    """The section: core budgets, p99 ratios, the regime models, the executors' figures."""
    lines = [
        "## Sync against pipelined: core budgets and models (`results/modes`)",
        "",
        "Open loop (Poisson, 50 items x seq 64 for bert-tiny and bert-small), the server on its own cores and "
        "the asyncio generator on the others; capacity = the highest rate at p99 <= 50 ms by search. "
        "A pipelined variant is any of `pipelined`, `overlap`, `auto`. Each table compares runs of one device "
        "and one sitting; different devices are not compared.",
        "",
    ]
    rows = []
    current: set[Path] = set()  # the sittings the core-budget table reads
    shown: set[Path] = set()  # and the newest sittings of auto on the regime models
    for dev, cores, b in data["budgets"]:
        current.add(b["sitting"])
        worst = max(b["p99_ratios"].values()) if b["p99_ratios"] else math.nan
        at_least = ">= " if b["best_pipelined_is_lower_bound"] else ""
        rows.append(
            [
                dev,
                fmt(cores, "d") if cores else "n/a",
                f"`{b['sitting'].name}`",
                _searches(b["sync_searches_rps"]),
                at_least + _searches(b["pipelined_searches_rps"]),
                at_least + fmt(b["capacity_ratio"], ".2f") + basis(b, short=True, p=b["capacity_p"]),
                (", ".join(f"{r / 1e3:g}k: {v:.2f}" for r, v in b["p99_ratios"].items()) or "n/a")
                + (f" (`{b['p99_sitting'].name}`)" if b["p99_sitting"] != b["sitting"] else ""),
                fmt(worst, ".2f"),
                pooled_cell(b["p99_pooled"]) or "n/a",
                (
                    f"{b['p99_sync_spread']:.2f} ({b['p99_rounds']} rounds)"
                    if b["p99_sync_spread"] is not None
                    else "one round"
                ),
                _spec(b["best_pipelined"]),
                cap_of(b["default"]),
                plain_cell(b["plain"], b["plain_sitting"] == b["sitting"], b["plain_sync"], b["plain_stalling_shares"]),
            ]
        )
    if rows:
        lines += [
            "### bert-tiny per core budget",
            "",
            *markdown_table(
                [
                    "device",
                    "server cores",
                    "sitting (the newest that searched both)",
                    "best sync req/s (each search, in order)",
                    "best pipelined req/s (each search)",
                    "pipelined / sync (medians where each was searched twice or more; p: how often a random "
                    "labelling of the same searches gives medians as far apart)",
                    "p99 pipelined / sync by rate (from the sitting named where the searches' had no fixed part)",
                    "worst p99 ratio",
                    "p99 pipelined / sync by load point, every sitting's paired rounds pooled (median; rounds in "
                    "sittings; sign p: how likely a split of higher and lower rounds as uneven is by chance)",
                    "sync against itself: p99 max / min over rounds (fewest rounds at a rate)",
                    "best pipelined",
                    "default (as built) req/s",
                    "plain Python backend req/s",
                ],
                rows,
            ),
            "",
        ]
    reg_rows, auto_rows = [], []
    for r in data["regimes"]:
        reg_rows.append(
            [
                r["device"],
                r["model"],
                _capacity(r["one_sync"]),
                _capacity(r["one_pipelined"]),
                ("" if not r["one_instance_ratio_is_lower_bound"] else ">= ") + fmt(r["one_instance_ratio"], ".2f"),
                f"{_inst(r['needed_sync'])} / {_inst(r['needed_pipelined'])}",
                f"{_mem(r['needed_sync'])} / {_mem(r['needed_pipelined'])}",
                fmt(r["gpu_memory_ratio"], ".2f") if r["gpu_memory_ratio"] is not None else "n/a",
            ]
        )
        a = r["auto"]  # a model with an auto and a sync search has a regime row
        if a is None:
            continue
        shown.add(a["sitting"])
        ex = a["auto"].summary.get("executor") or {}
        auto_rows.append(
            [
                device(a["auto"]),
                model(a["auto"]),
                f"`{a['sitting'].name}`",
                _capacity(a["sync"]),
                _capacity(a["auto"]),
                ("" if not a["is_lower_bound"] else ">= ") + fmt(a["ratio"], ".2f"),
                ", ".join(f"{fmt(r, ',.0f')}: {fmt(v, '.2f')}" for r, v in a["p99_ratios"].items()) or "n/a",
                f"{int(ex.get('auto_deferred') or 0):,} / {in_band_batches(ex):,}",
            ]
        )
    if reg_rows:
        lines += [
            "### Where pipelining could win: models with more device time per batch",
            "",
            *markdown_table(
                [
                    "device",
                    "model",
                    "1 sync instance req/s",
                    "1 pipelined instance req/s",
                    "ratio",
                    f"instances for {NEEDED_FRACTION:.0%} of sync's best: sync / pipelined",
                    "GPU MiB there: sync / pipelined",
                    "GPU memory ratio",
                ],
                reg_rows,
            ),
            "",
        ]
    if auto_rows:
        lines += [
            "#### What `auto` chose there: one `<model>_inflight` instance (`mode=auto`), newest sitting",
            "",
            "Sync and auto from one sitting (the rule of that day's code); p99 ratios auto / sync at the sitting's "
            "fixed rates (else the searches' common rates); batches from the whole search.",
            "",
            *markdown_table(
                [
                    "device",
                    "model",
                    "sitting",
                    "1 sync instance req/s",
                    "1 auto instance req/s",
                    "ratio",
                    "p99 auto / sync by req/s",
                    "batches deferred / in-band",
                ],
                auto_rows,
            ),
            "",
        ]
    ex_rows = []
    for e in data["entries"]:
        ex = e.summary.get("executor") or {}
        # only files of one variant: the runner matches executor blocks to variants from the server log, and a
        # file of several variants whose log lacks one variant's finalize lines can misattribute them
        if not ex or e.kind == "null" or len(e.doc.get("variants", [])) != 1 or sitting_of(e) not in current | shown:
            continue
        ex_rows.append(
            [
                device(e),
                fmt(server_cores(e), "d") if server_cores(e) else "n/a",
                _spec(e),
                fmt(e.capacity) if e.capacity is not None else "n/a",
                fmt(ex.get("requests_per_batch"), ".1f"),
                fmt(ex.get("execute_ms"), ".2f"),
                fmt(ex.get("between_executes_ms"), ".2f"),
                fmt(ex.get("device_wait_ms"), ".2f"),
                fmt(overlap_bound(e), ".2f"),
                fmt(int(ex["auto_deferred"]), "d") if ex.get("auto_deferred") is not None else "n/a",
                # in-band batches: the auto of issue 30's overlap-bound rule only (it records auto_bound)
                fmt(in_band_batches(ex), "d") if ex.get("auto_bound") is not None else "n/a",
            ]
        )
    if ex_rows:
        lines += [
            "### Where each instance's time goes (per batch, means over the variant's windows)",
            "",
            "From the capacity searches (one variant per file) of the core-budget sittings and auto's newest ones.",
            "",
            "The overlap bound is the most pipelining could add to one instance: cycle / (cycle - device wait), "
            "cycle = time in `execute()` + time between calls (the Python stub receiving the next batch).",
            "",
            *markdown_table(
                [
                    "device",
                    "server cores",
                    "variant",
                    "capacity req/s",
                    "requests/batch",
                    "execute ms",
                    "between ms",
                    "device wait ms",
                    "overlap bound",
                    "auto deferred",
                    "auto in-band",
                ],
                ex_rows,
            ),
            "",
        ]
    return lines


SECTION = Section(title=TITLE, collect=collect_modes, render=render, summary_key="modes", summarize=summary)
