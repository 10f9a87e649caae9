"""Sync against pipelined per core budget and per model: the figures of ``summary.json["modes"]``.

Everything is read from the sittings under ``results/modes`` (:mod:`inflight.lab.modes_select` picks the runs):

* per core budget (the server's cores), from its newest sitting that searched both modes: the best sync
  and the best pipelined capacity at the p99 SLO, the searches behind them, and the pipelined / sync p99
  ratio at every rate both ran side by side (every sitting's paired rounds pooled beside it);
* per model beyond bert-tiny (the regime where the device's time per batch is comparable to the
  host's): one instance of each mode, the instances each needs for 95% of its best capacity, and the
  GPU memory its server's processes held, and what ``auto`` chose there.

Sittings on different devices are not compared with each other. ``python -m inflight.lab.modes_results SITTING``
says whether a sitting's host is steady enough to compare the modes on (:func:`~inflight.lab.modes_select.steady_main`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from inflight.lab.entries import Entry, device, instances, model, server_cores
from inflight.lab.modes_select import (
    DEPLOYMENT_NEUTRAL,
    NEEDED_FRACTION,
    best_capacity,
    by_file,
    by_sitting,
    collect,
    gpu_memory_mib,
    is_default,
    is_pipelined,
    is_sync,
    needed_instances,
    newest_comparison,
    newest_sitting_of,
    overrides_only,
    p99_by_rate,
    p99s_by_rate,
    plain_for,
    search_ran,
    searched,
    searches,
    sitting_of,
    stalling_plain_shares,
    stalls,
    started,
    steady_main,
    sync_beside,
    valid_windows,
)
from inflight.lab.stats import capacity_ratio, median_ratios, permutation_p, share_of_best, sign_p

#: Issue 30's targets: pipelined capacity over sync's, the worst p99 ratio, the default over the best, one instance.
TARGET_CAPACITY_RATIO = 1.0
TARGET_P99_RATIO = 1.1
TARGET_DEFAULT_SHARE = NEEDED_FRACTION
TARGET_ONE_INSTANCE_RATIO = 1.3


def core_budget(es: list[Entry]) -> dict[str, Any] | None:
    """One core budget's figures, from its newest sitting that searched both modes (:func:`newest_comparison`).

    The best sync capacity is a bracketed search's; the best pipelined one may be a lower bound (its search's
    high end met the SLO, ``best_pipelined_is_lower_bound``). The p99 ratios come from that sitting's files
    that ran both at the same rates (the fixed part), else from the newest sitting of the core budget that ran
    the two side by side (``p99_sitting``), else from the two searches' windows at common rates.
    """
    every = es
    es = newest_comparison(every)
    sync = best_capacity(e for e in es if is_sync(e) and searched(e))
    pipe = best_capacity(e for e in es if is_pipelined(e) and search_ran(e))
    if sync is None or pipe is None:
        return None
    # the p99 targets are read at fixed rates, interleaved rounds: from this sitting's fixed part, else from the
    # newest sitting of this core budget that ran the same two variants side by side (its rates are 20/50/80% of
    # its own sync capacity); only where none did, from the two searches' windows (p99_ratios)
    at_fixed = es if _side_by_side(es, sync, pipe) else newest_sitting_of(every, lambda g: _side_by_side(g, sync, pipe))
    at_fixed = at_fixed or es
    ratios = p99_ratios(at_fixed, sync, pipe)
    p99_p = worst_p99_p(at_fixed, sync, pipe)
    sync_rounds = p99_rounds(at_fixed, sync.summary["spec"])
    default = best_capacity(e for e in es if is_default(e) and search_ran(e))
    sync_caps, pipe_caps, default_caps = searches_of(es, sync, pipe, default)
    plain = plain_for(every, es)
    plain_sync = sync_beside(every, plain) if plain is not None else None
    return {
        "server_cpus": server_cores(sync),
        "device": device(sync),
        "sitting": sitting_of(sync),
        "best_pipelined_is_lower_bound": not searched(pipe),
        "best_sync": sync,
        "best_pipelined": pipe,
        "best_sync_rps": sync.capacity,
        "best_pipelined_rps": pipe.capacity,
        "sync_searches_rps": sync_caps,
        "pipelined_searches_rps": pipe_caps,
        "capacity_ratio": capacity_ratio(sync_caps, pipe_caps),
        "capacity_p": permutation_p(sync_caps, pipe_caps),
        "default": default,
        "default_rps": default.capacity if default is not None else None,
        "default_searches_rps": default_caps,
        "default_share": default_share(sync_caps, pipe_caps, default_caps),
        "plain": plain,
        "plain_rps": plain.capacity if plain is not None else None,
        "plain_sitting": sitting_of(plain) if plain is not None else None,
        # sync's capacity in the plain search's own sitting (the figure the plain one is read against)
        "plain_sync": plain_sync,
        "plain_stalling_shares": stalling_plain_shares(every, plain),
        "p99_ratios": ratios,
        "p99_p": p99_p,
        "p99_sitting": sitting_of(at_fixed[0]),
        "p99_sync_spread": p99_spread(at_fixed, sync.summary["spec"]),
        "p99_pooled": pooled_p99(every, sync.summary["spec"], pipe.summary["spec"]),
        # the fewest of sync's rounds behind one of the ratios (each side's p99 is its median over them)
        "p99_rounds": min((len(sync_rounds.get(r, [])) for r in ratios), default=0),
    }


#: The shares of sync's capacity a fixed-rate part must reach down and up to for item 2's targets (20/50/80%).
FIXED_SHARES_SPAN = (0.35, 0.65)


def _side_by_side(es: Iterable[Entry], sync: Entry, other: Entry) -> bool:
    """Whether ``es`` ran ``sync``'s spec and ``other``'s side by side at fixed rates spanning item 2's load points.

    One file must hold both specs (a fixed-rate part), at rates from at most ``FIXED_SHARES_SPAN[0]`` to at
    least ``FIXED_SHARES_SPAN[1]`` of the best sync capacity searched in ``es``: the 20/50/80% rounds count,
    a knee-only part (90/100%) does not.
    """
    es = list(es)
    want = {sync.summary["spec"], other.summary["spec"]}
    caps = [e.capacity for e in es if e.summary.get("spec") == sync.summary["spec"] and searched(e) and e.capacity]
    if not caps:
        return False
    rates: list[float] = []
    for here in by_file(es):
        if want <= {str(e.summary.get("spec")) for e in here} and not any(search_ran(e) for e in here):
            rates += [r for e in here if e.summary.get("spec") == sync.summary["spec"] for r in p99s_by_rate(e)]
    low, high = FIXED_SHARES_SPAN
    return bool(rates) and min(rates) <= low * max(caps) and max(rates) >= high * max(caps)


def searches_of(
    es: Iterable[Entry], sync: Entry | None, pipe: Entry | None, default: Entry | None
) -> tuple[list[float], list[float], list[float]]:
    """The comparable searches of the chosen sync (bracketed ones), pipelined and default variants ([] for None)."""
    es = list(es)

    def of(e: Entry | None, bracketed: bool) -> list[float]:
        return searches(es, e.summary["spec"], bracketed=bracketed) if e is not None else []

    return of(sync, True), of(pipe, False), of(default, False)


def default_share(sync: Sequence[float], pipelined: Sequence[float], default: Sequence[float]) -> float | None:
    """The default's capacity over the best mode's (sync or pipelined), as ``stats.judged`` reads them."""
    read = share_of_best(default, sync, pipelined)
    return read[0] if read is not None else None


def p99_ratios(es: Iterable[Entry], sync: Entry, other: Entry) -> dict[float, float]:
    """``other``'s p99 over ``sync``'s per rate, pooled over every file of ``es`` that ran both specs at that rate.

    Each side's p99 at a rate is the median over every round of it in those files (a sitting's fixed parts
    may come from several device calls, each of a few interleaved rounds). Where no file ran both (no
    fixed-rate part), from the two searches' own windows at the rates both visited.
    """
    rounds = p99_rounds_side_by_side(es, sync, other)
    if rounds:
        return median_ratios(rounds)
    return searches_p99_ratios(sync, other)


def searches_p99_ratios(sync: Entry, other: Entry) -> dict[float, float]:
    """``other``'s p99 over ``sync``'s at each rate both variants' own windows visited (:func:`p99_by_rate`)."""
    s99m, p99m = p99_by_rate(sync), p99_by_rate(other)
    return {rate: p99m[rate] / s99m[rate] for rate in sorted(set(s99m) & set(p99m))}


def _pair_in(here: Iterable[Entry], sync_spec: str, other_spec: str) -> tuple[Entry, Entry] | None:
    """The sync and the other variant of one A/B file's entries (None unless the file ran both specs)."""
    here = list(here)
    s = next((e for e in here if e.summary.get("spec") == sync_spec), None)
    o = next((e for e in here if e.summary.get("spec") == other_spec), None)
    return None if s is None or o is None else (s, o)


def p99_rounds_side_by_side(
    es: Iterable[Entry], sync: Entry, other: Entry
) -> dict[float, tuple[list[float], list[float]]]:
    """Per rate, sync's and ``other``'s p99 in every round of the files of ``es`` that ran both (empty: none did)."""
    rounds: dict[float, tuple[list[float], list[float]]] = {}
    for here in by_file(list(es)):
        pair = _pair_in(here, sync.summary["spec"], other.summary["spec"])
        if pair is None:
            continue
        s99, p99 = p99s_by_rate(pair[0]), p99s_by_rate(pair[1])
        for rate in set(s99) & set(p99):
            mine, theirs = rounds.setdefault(rate, ([], []))
            mine.extend(s99[rate])
            theirs.extend(p99[rate])
    return dict(sorted(rounds.items()))


def worst_p99_p(es: Iterable[Entry], sync: Entry, other: Entry) -> tuple[float | None, int, int]:
    """:func:`permutation_p` of the rounds at the rate of the largest p99 ratio, with each side's round count.

    (None, n, m) where that rate had fewer than two rounds a side, or no round ran side by side.
    """
    rounds = p99_rounds_side_by_side(es, sync, other)
    if not rounds:
        return None, 0, 0
    ratios = median_ratios(rounds)
    s, p = rounds[max(ratios, key=lambda rate: ratios[rate])]
    return permutation_p(s, p), len(s), len(p)


#: Item 2's load points, as shares of a sitting's sync capacity (the median of its bracketed searches of the
#: sync spec): a fixed rate counts for the nearest one within :data:`POOL_SHARE_TOLERANCE`, so a rate at the
#: knee (0.95 or more) counts for none.
P99_LOAD_POINTS = (0.2, 0.5, 0.8)


POOL_SHARE_TOLERANCE = 0.15


def _p99_by_round(e: Entry) -> dict[tuple[float, int], float]:
    """p99 (ms) of the variant's :func:`valid_windows` by (offered rate, round)."""
    return {(float(w["offered_rps"]), int(w.get("round") or 0)): float(w["p99_ms"]) for w in valid_windows(e)}


def pooled_p99(every: Iterable[Entry], sync_spec: str, other_spec: str) -> dict[float, dict[str, Any]]:
    """Per load point of item 2, ``other_spec``'s p99 over ``sync_spec``'s round by round, over every sitting.

    One sitting's few rounds at a rate rank the two either way (sync against itself spreads 5x at 80% of
    its capacity on four H200 cores), so beside the newest sitting's ratios this pools the paired rounds of
    every sitting of the core budget that searched ``sync_spec`` and ran both specs side by side at fixed
    rates: each round's two p99s (the same file, the same round) give one ratio, and each rate counts for
    the load point nearest its share of that sitting's median sync search (:data:`P99_LOAD_POINTS`). A
    sitting measured the rule of its day's code; where the pipelined variant answered in-band throughout,
    what it ran is sync's path (the reports show how many batches each deferred).

    Returns:
        Per load point with a round: ``ratio`` (the median of the round ratios), ``rounds``, ``sittings``,
        ``above`` (rounds where ``other_spec``'s p99 was the higher) and ``sign_p`` (:func:`sign_p`).
    """
    ratios: dict[float, list[float]] = {}
    sittings: dict[float, set[Path]] = {}
    for sitting, group in by_sitting(every).items():
        caps = searches(group, sync_spec, bracketed=True)
        if not caps:
            continue
        reference = statistics.median(caps)
        for here in by_file(group):
            if any(search_ran(e) for e in here):
                continue
            pair = _pair_in(here, sync_spec, other_spec)
            if pair is None:
                continue
            mine, theirs = _p99_by_round(pair[0]), _p99_by_round(pair[1])
            for key in sorted(set(mine) & set(theirs)):
                share = key[0] / reference
                point = min(P99_LOAD_POINTS, key=lambda x: abs(x - share))
                if abs(point - share) > POOL_SHARE_TOLERANCE or mine[key] <= 0:
                    continue
                ratios.setdefault(point, []).append(theirs[key] / mine[key])
                sittings.setdefault(point, set()).add(sitting)
    out = {}
    for point in sorted(ratios):
        r = ratios[point]
        above, below = sum(x > 1 for x in r), sum(x < 1 for x in r)
        out[point] = {
            "ratio": statistics.median(r),
            "rounds": len(r),
            "sittings": len(sittings[point]),
            "above": above,
            "sign_p": sign_p(above, below),
        }
    return out


def p99_rounds(es: Iterable[Entry], spec: str) -> dict[float, list[float]]:
    """One variant's p99s by offered rate over every file of ``es`` (one per round), for the spread and the count."""
    by_rate: dict[float, list[float]] = {}
    for e in es:
        if e.summary.get("spec") == spec:
            for rate, p99s in p99s_by_rate(e).items():
                by_rate.setdefault(rate, []).extend(p99s)
    return dict(sorted(by_rate.items()))


def p99_spread(es: Iterable[Entry], spec: str) -> float | None:
    """The largest max / min of one variant's own p99s over the rounds it ran at one rate (None: no repeated rate).

    What two windows of the same variant at the same rate differ by: a p99 ratio between two variants
    under it is within that sitting's noise. Rounds at one rate are pooled over the sitting's files.
    """
    spreads = []
    for p99s in p99_rounds(es, spec).values():
        v = [x for x in p99s if x > 0]
        if len(v) > 1:
            spreads.append(max(v) / min(v))
    return max(spreads) if spreads else None


def newest_auto(es: list[Entry]) -> dict[str, Any] | None:
    """One ``auto`` instance against one sync instance, from the newest sitting that searched both.

    Newest, not best: each sitting measured the rule of its day's code (``AutoPolicy``), so the figures of
    the rule as it is come from the latest sitting; the p99 ratios from that sitting's fixed-rate files.
    """
    one = [e for e in es if instances(e) == 1 and search_ran(e) and e.capacity]

    def is_auto(e: Entry) -> bool:
        return e.mode == "auto"

    def is_bracketed_sync(e: Entry) -> bool:  # a bracketed search: a lower bound would make the ratio neither bound
        return is_sync(e) and searched(e)

    group = newest_sitting_of(one, lambda g: any(map(is_auto, g)) and any(map(is_bracketed_sync, g)))
    if not group:
        return None
    autos = [e for e in group if is_auto(e)]
    # the repository's own auto where the sitting ran it (only placement and instances overridden), else the newest
    auto = max([e for e in autos if overrides_only(e, DEPLOYMENT_NEUTRAL | {"instances"})] or autos, key=started)
    sync = max((e for e in group if is_bracketed_sync(e)), key=started)
    assert auto.capacity and sync.capacity
    return {
        "auto": auto,
        "sync": sync,
        "sitting": sitting_of(auto),
        "ratio": auto.capacity / sync.capacity,
        "is_lower_bound": not searched(auto),
        "p99_ratios": p99_ratios([e for e in es if sitting_of(e) == sitting_of(auto)], sync, auto),
    }


def regime(es: list[Entry]) -> dict[str, Any] | None:
    """One model's regime figures: one instance of each mode, instances and GPU memory at 95% of best."""
    every = es
    es = [e for e in es if search_ran(e)]
    one_sync = best_capacity(e for e in es if is_sync(e) and instances(e) == 1)
    one_pipe = best_capacity(e for e in es if is_pipelined(e) and instances(e) == 1)
    best_sync = best_capacity(e for e in es if is_sync(e))
    if one_sync is None or one_pipe is None or best_sync is None or best_sync.capacity is None:
        return None
    # the comparison: the instances (and GPU memory) each mode needs for 95% of sync's best capacity;
    # None for the pipelined mode when none of its variants measured got there
    target = NEEDED_FRACTION * best_sync.capacity
    need_sync, need_pipe = needed_instances(es, True, target), needed_instances(es, False, target)

    def ratio(a: float | None, b: float | None) -> float:
        return a / b if a is not None and b else math.nan

    return {
        "model": model(one_sync),
        "device": device(one_sync),
        "one_instance_ratio": ratio(one_pipe.capacity, one_sync.capacity),
        # a pipelined capacity that is a lower bound (its search's high end met the SLO) makes the ratio one too
        "one_instance_ratio_is_lower_bound": not searched(one_pipe),
        "instances_ratio": ratio(float(instances(need_pipe)), float(instances(need_sync)))
        if need_pipe is not None and need_sync is not None
        else None,
        "gpu_memory_ratio": ratio(gpu_memory_mib(need_pipe), gpu_memory_mib(need_sync))
        if need_pipe is not None and need_sync is not None
        else None,
        "target_rps": target,
        "auto": newest_auto(every),
        "one_sync": one_sync,
        "one_pipelined": one_pipe,
        "needed_sync": need_sync,
        "needed_pipelined": need_pipe,
    }


def summary(root: Path) -> dict[str, Any] | None:
    """The ``modes`` block of ``results/summary.json`` (None when no sitting exists).

    ``default_rps`` is the capacity of ``<model>_inflight`` as ``inflight build-models --server-cpus`` wrote it
    for that core budget (measured with no override but placement); ``plain_rps`` that of ``<model>_plain``
    (Triton's plain Python backend, the usual deployment). Either is None (null in the file) where that core
    budget has no search of it, as is a ratio whose pipelined side reached no target.
    """
    c = collect(root)
    caps = [b for b in (core_budget(es) for es in c["budgets"].values()) if b is not None]
    if not caps:
        return None
    ratios = [r for b in caps for r in b["p99_ratios"].values()]
    regs = [r for r in (regime(es) for es in c["regimes"].values()) if r is not None]
    reg = max(regs, key=lambda r: r["one_instance_ratio"]) if regs else None
    return {
        "device": ", ".join(sorted({b["device"] for b in caps})),
        "capacity": [
            {
                "server_cpus": b["server_cpus"],
                "device": b["device"],
                "best_sync_rps": b["best_sync_rps"],
                "best_pipelined_rps": b["best_pipelined_rps"],
                # every search of the two (and of the default) in the sitting; the ratios judged read their
                # medians where each side was searched at least twice (:func:`capacity_ratio`)
                "sync_searches_rps": b["sync_searches_rps"],
                "pipelined_searches_rps": b["pipelined_searches_rps"],
                "default_searches_rps": b["default_searches_rps"],
                "capacity_ratio": b["capacity_ratio"],
                # how often a random labelling of the same searches gives medians as far apart (permutation_p)
                "capacity_ratio_p": b["capacity_p"],
                "default_share": b["default_share"],
                "default_rps": b["default_rps"],
                "plain_rps": b["plain_rps"],
                "plain_sitting": str(b["plain_sitting"].relative_to(root)) if b["plain_sitting"] else None,
                "plain_sync_rps": b["plain_sync"].capacity if b["plain_sync"] is not None else None,
                # the plain search's host stalled (:func:`stalls`): its share of sync there says little of a steady host
                "plain_host_stalls": stalls(b["plain_sync"]),
                # where no steady host searched plain beside sync: its share on every host that stalls, oldest first
                "plain_shares_on_stalling_hosts": b["plain_stalling_shares"],
                # plain's p99 over sync's at the lowest rate both searches of that sitting measured
                "plain_p99_over_sync": _rate_ratio(plain_p99_over_sync(b["plain"], b["plain_sync"])),
                "default": b["default"].summary["spec"] if b["default"] is not None else None,
                "default_instances": instances(b["default"]) if b["default"] is not None else None,
                "best_sync": b["best_sync"].summary["spec"],
                "best_pipelined": b["best_pipelined"].summary["spec"],
                "best_pipelined_is_lower_bound": b["best_pipelined_is_lower_bound"],
                "p99_ratio_max": max(b["p99_ratios"].values()) if b["p99_ratios"] else None,
                # the same for the rounds at the rate of that ratio (None: under two rounds a side)
                "p99_ratio_max_p": b["p99_p"][0],
                # sync against itself: its own p99s over rounds at one rate, largest max / min (the noise)
                "p99_sync_spread_max": b["p99_sync_spread"],
                "p99_rounds": b["p99_rounds"],
                # every sitting's paired rounds pooled per load point (pooled_p99); the targets read the newest
                "p99_pooled": {f"{point:g}": v for point, v in b["p99_pooled"].items()},
                "p99_pooled_ratio_max": max((v["ratio"] for v in b["p99_pooled"].values()), default=None),
                "sitting": str(b["sitting"].relative_to(root)),
                # where the p99 ratios were measured (the sitting, or the newest one with a fixed-rate part)
                "p99_sitting": str(b["p99_sitting"].relative_to(root)),
                "file": str(b["best_pipelined"].path.relative_to(root)),
            }
            for b in sorted(caps, key=lambda b: (b["device"], b["server_cpus"] or 0))
        ],
        "p99_ratio_max": max(ratios) if ratios else None,
        "regime": None
        if reg is None
        else {
            "model": reg["model"],
            "device": reg["device"],
            "one_instance_ratio": reg["one_instance_ratio"],
            "one_instance_ratio_is_lower_bound": reg["one_instance_ratio_is_lower_bound"],
            "instances_ratio": reg["instances_ratio"],
            "gpu_memory_ratio": reg["gpu_memory_ratio"],
            # what `auto` itself chose there: one instance of it over one sync instance, newest sitting
            **_auto_keys(reg["auto"], root),
        },
    }


def _auto_keys(a: dict[str, Any] | None, root: Path) -> dict[str, Any]:
    if a is None:
        return dict.fromkeys(
            ("auto_one_instance_ratio", "auto_one_instance_ratio_is_lower_bound", "auto_p99_ratio_max", "auto_sitting")
        )
    return {
        "auto_one_instance_ratio": a["ratio"],
        "auto_one_instance_ratio_is_lower_bound": a["is_lower_bound"],
        "auto_p99_ratio_max": max(a["p99_ratios"].values()) if a["p99_ratios"] else None,
        "auto_sitting": str(a["sitting"].relative_to(root)),
    }


def plain_p99_over_sync(plain: Entry | None, sync: Entry | None) -> tuple[float, float] | None:
    """(rate, plain's p99 / sync's) at the lowest offered rate both searches measured, or None (no common rate).

    The lowest common rate of two searches of one sitting is the bracket's low end, where neither queues much:
    what the usual deployment's tail is beside sync's at equal load (capacity alone shows the queue's knee).
    """
    ratios = searches_p99_ratios(sync, plain) if plain is not None and sync is not None else {}
    return next(iter(ratios.items()), None)


def _rate_ratio(pair: tuple[float, float] | None) -> dict[str, float] | None:
    """``{"rate": ..., "ratio": ...}`` for ``summary.json`` (None stays None)."""
    return {"rate": pair[0], "ratio": pair[1]} if pair else None


if __name__ == "__main__":
    raise SystemExit(steady_main())
