"""Sync against pipelined per core budget and per model: the RESULTS section and ``summary.json["modes"]``.

``scripts/lab/gpu_session.sh modes`` writes one sitting per call under ``results/modes/<date>-<device>-<what>``:
open-loop A/B files (fixed rates and capacity searches) whose server ran on its own cores
(``load.cpu_sets``). Everything printed here is read from those files:

* per core budget (the server's cores), from its newest sitting that searched both modes: the best sync
  and the best pipelined capacity at the p99 SLO (a pipelined mode is any of ``pipelined``, ``overlap``,
  ``auto``), and at every rate both were measured at there, the pipelined / sync p99 ratio (of the
  pipelined variant with the best capacity);
* per model beyond bert-tiny (the regime where the device's time per batch is comparable to the
  host's): one instance of each mode, the instances each needs for 95% of its best capacity, and the
  GPU memory its server's processes held (``gpu_memory`` of each window);
* per variant: the executor's per-batch figures (host time in ``execute()``, between calls, device
  wait) and the overlap bound they allow, cycle / (cycle - device wait).

Sittings on different devices are not compared with each other: each table names its device.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from inflight.lab.open_loop_results import Entry, entries, fmt, markdown_table, merge_summary
from inflight.lab.open_loop_results import sittings as open_loop_sittings
from inflight.variants import parse_variant_arg

MODES_DIR = "modes"
#: The fraction of a mode's best capacity that "the instances it needs" must reach.
NEEDED_FRACTION = 0.95


def sittings(results: Path) -> list[Path]:
    """The sittings under ``results/modes``, oldest first."""
    return open_loop_sittings(results, MODES_DIR)


def server_cores(e: Entry) -> int | None:
    """How many cores the server of this run had (from ``load.cpu_sets``), or None when not pinned."""
    spec = ((e.doc.get("load") or {}).get("cpu_sets") or {}).get("server")
    if not spec:
        return None
    n = 0
    for part in str(spec).split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def instances(e: Entry) -> int:
    """Instances of the variant (its instance group's count)."""
    group = ((e.variant.get("config") or {}).get("instance_group") or [{}])[0]
    return int(group.get("count") or 1)


def model(e: Entry) -> str:
    """The model served (``bert_tiny``...)."""
    return str(e.variant.get("model") or e.summary.get("model_name") or "?")


def device(e: Entry) -> str:
    """The GPU's name."""
    return str((e.doc.get("device") or {}).get("name") or "?")


def gpu_memory_mib(e: Entry) -> float | None:
    """The most GPU memory the server's processes held at the end of a window of this variant (MiB)."""
    used = [float((r.get("gpu_memory") or {}).get("used_mib") or 0) for r in _runs(e)]
    return max(used) if used and max(used) > 0 else None


def _runs(e: Entry) -> list[Mapping[str, Any]]:
    return [r for r in e.doc.get("runs", []) if r.get("variant") == e.summary.get("variant")]


def _windows(e: Entry) -> list[Mapping[str, Any]]:
    """The variant's valid windows with a p99, not generator-limited (what they measured is the server's)."""
    return [
        w
        for w in e.summary.get("sweep") or []
        if w.get("valid") and not w.get("generator_limited") and w.get("p99_ms") is not None
    ]


def _p99s_by_rate(e: Entry) -> dict[float, list[float]]:
    """p99s (ms) of the variant's :func:`_windows` by offered rate (one per round)."""
    by_rate: dict[float, list[float]] = {}
    for w in _windows(e):
        by_rate.setdefault(float(w["offered_rps"]), []).append(float(w["p99_ms"]))
    return by_rate


def p99_by_rate(e: Entry) -> dict[float, float]:
    """p99 (ms) at each offered rate of the variant's valid windows, not generator-limited.

    Where several rounds ran at one rate (``--repeat``), their median: one window's p99 moves with a
    single stall of the host, and the rounds are interleaved with the other variant's.
    """
    return {rate: statistics.median(p99s) for rate, p99s in _p99s_by_rate(e).items()}


#: p99 over p50 of a search's lowest-rate window from which the host's stalls, not a queue, are taken to set the
#: tail. The bracketed sync searches of results/modes (2026-11-27) show 1.6-3.8 there on hosts that kept their p99
#: in hand and 6.2-16.3, at a p50 of about 3 ms, on hosts that stalled (20261126-h100-4cores-slowhost,
#: 20261127-h100-4cores-plain): nothing in between.
STALL_SPREAD = 5.0


def tail_spread(e: Entry) -> tuple[float, float] | None:
    """(offered rate, p99 / p50) of the variant's lowest-rate window (:func:`_windows`, with a p50); None without one.

    At the lowest rate a search tries, no queue forms on a host that keeps up, so a p99 many times the p50
    there is the host stalling: a capacity found on such a host is set by its stalls, not by the mode.
    """
    windows = [w for w in _windows(e) if w.get("p50_ms")]
    if not windows:
        return None
    low = min(windows, key=lambda w: float(w["offered_rps"]))
    return float(low["offered_rps"]), float(low["p99_ms"]) / float(low["p50_ms"])


def stalls(e: Entry | None) -> bool:
    """Whether ``e``'s search ran on a host whose stalls set its tail (:data:`STALL_SPREAD`)."""
    spread = tail_spread(e) if e is not None else None
    return spread is not None and spread[1] >= STALL_SPREAD


def sync_tail_spreads(sitting: Path) -> list[tuple[str, float, float]]:
    """(spec, lowest rate, p99 / p50) of each sync search of ``sitting`` (:func:`tail_spread`), in file order.

    What a sitting's first sync search says of the host before the rest of a device call is spent on it: one
    at or over :data:`STALL_SPREAD` ran on a host whose stalls set the tail, where a comparison measures the
    host, not the modes.
    """
    out = []
    for e in entries(sitting.parent, sitting):
        spread = tail_spread(e) if _is_sync(e) and _search_ran(e) else None
        if spread is not None:
            out.append((str(e.summary.get("spec")), *spread))
    return out


def steady_main(argv: Sequence[str] | None = None) -> int:
    """``python -m inflight.lab.modes_results SITTING``: whether the sitting's host is steady enough to compare on.

    Exit 0 when steady, 3 (saying why) when a sync search of the sitting ran on a host that stalls, 4 when the
    sitting holds no sync search to judge the host by (codes a crash's 1 and a usage error's 2 cannot be taken for).
    """
    import argparse

    p = argparse.ArgumentParser(prog="python -m inflight.lab.modes_results", description=steady_main.__doc__)
    p.add_argument("sitting", type=Path, help="A sitting folder, e.g. results/modes/<date>-<device>-4cores.")
    args = p.parse_args(argv)
    spreads = sync_tail_spreads(args.sitting.resolve())
    if not spreads:
        print(f"{args.sitting}: no sync search with a window to judge the host by; run the sync search first")  # noqa: T201
        return 4
    bad = [(spec, rate, spread) for spec, rate, spread in spreads if spread >= STALL_SPREAD]
    for spec, rate, spread in bad:
        print(  # noqa: T201 - the command's output
            f"{args.sitting}: the host stalls: {spec}'s p99 is {spread:.1f}x its p50 at {rate:,.0f} req/s, its lowest "
            f"rate (>= {STALL_SPREAD:g}x: its stalls, not a queue, set the tail); compare the modes on another host"
        )
    if not bad:
        worst = max(spread for _, _, spread in spreads)
        print(f"{args.sitting}: steady: sync's p99 at most {worst:.1f}x its p50 at its lowest rate")  # noqa: T201
    return 3 if bad else 0


def overlap_bound(e: Entry) -> float | None:
    """Cycle / (cycle - device wait) from the variant's executor figures, or None."""
    ex = e.summary.get("executor") or {}
    try:
        cycle = float(ex["execute_ms"]) + float(ex["between_executes_ms"])
        wait = float(ex["device_wait_ms"])
    except (KeyError, TypeError, ValueError):
        return None
    return cycle / (cycle - wait) if cycle > wait > 0 else None


def _best(es: Iterable[Entry]) -> Entry | None:
    ranked = [e for e in es if e.capacity is not None]
    return max(ranked, key=lambda e: e.capacity or 0.0) if ranked else None


#: The executor counters of auto's in-band batches (``auto_explored``: files before 2026-11-26).
_IN_BAND = ("auto_inline", "auto_explored", "auto_reference", "auto_no_gain", "auto_unsaturated")


def _is_sync(e: Entry) -> bool:
    return e.mode == "sync"


def _is_pipelined(e: Entry) -> bool:
    """An inflight variant that may defer batches (``auto`` made in-band only is the sync path, not pipelining)."""
    return e.kind == "pipelined" and not _in_band_only(e)


def _in_band_only(e: Entry) -> bool:
    """Whether the variant is ``auto`` with ``auto_bound_min=inf``: every batch in-band, none ever deferred.

    Such a variant isolates what ``auto``'s in-band path costs against sync's (the same sync path on the
    pipelined executor's ring); it is neither mode's best configuration, so no capacity row counts it.
    """
    if e.kind != "pipelined" or e.mode != "auto":
        return False
    try:
        return math.isinf(float(e.parameter("auto_bound_min") or "0"))
    except ValueError:
        return False


#: Overrides that do not change what is deployed: a variant measured with only these is the repository's default.
_DEPLOYMENT_NEUTRAL = frozenset({"gpus", "capture_at_load", "kind"})


def _is_default(e: Entry) -> bool:
    """Whether this is ``<model>_inflight`` as ``inflight build-models`` wrote it for the server's cores."""
    return _overrides_only(e, _DEPLOYMENT_NEUTRAL)


def _overrides_only(e: Entry, allowed: frozenset[str]) -> bool:
    """Whether this is ``<model>_inflight`` measured with no overrides but ``allowed``."""
    name, overrides = parse_variant_arg(str(e.summary.get("spec") or ""))
    return name.endswith("_inflight") and overrides.keys() <= allowed


def _is_plain(e: Entry) -> bool:
    return e.kind == "plain"


def _search_ran(e: Entry) -> bool:
    """Whether a capacity search ran on the variant (bracketed, or a lower bound when its high end met the SLO)."""
    return any(r.get("capacity_search") for r in _runs(e))


def _searched(e: Entry) -> bool:
    """Whether the variant's capacity came from a search that bracketed it (not only rates that all met the SLO)."""
    return bool(e.summary.get("capacity_bounded"))


def sitting_of(e: Entry) -> Path:
    """The sitting folder of an entry (``results/modes/<sitting>/<run>/ab-*.json``)."""
    return e.path.parents[1]


def _started(e: Entry) -> str:
    """When the entry's A/B run started (ISO 8601, so its order is time's; empty when not recorded)."""
    return str(e.doc.get("started") or "")


def _compares(es: list[Entry]) -> bool:
    """Whether a sitting's entries hold a bracketed sync search and a pipelined search (a lower bound will do)."""
    return any(_is_sync(e) and _searched(e) for e in es) and any(
        _is_pipelined(e) and _search_ran(e) and e.capacity is not None for e in es
    )


def newest_comparison(es: list[Entry]) -> list[Entry]:
    """The entries of the newest sitting that searched both modes (``[]`` when none did).

    Ratios hold within one sitting only (one host, one day, one rule of the code measured), so a core
    budget's figures come from its newest complete sitting, not from the best of every sitting.
    """
    return _newest_sitting(es, _compares)


def _by_sitting(es: Iterable[Entry]) -> dict[Path, list[Entry]]:
    """The entries of ``es`` grouped by their sitting (:func:`sitting_of`)."""
    groups: dict[Path, list[Entry]] = {}
    for e in es:
        groups.setdefault(sitting_of(e), []).append(e)
    return groups


def _newest_sitting(es: Iterable[Entry], complete: Callable[[list[Entry]], bool]) -> list[Entry]:
    """The entries of ``es`` in the newest sitting whose entries are ``complete`` (``[]`` when none are)."""
    groups = [group for group in _by_sitting(es).values() if complete(group)]
    return max(groups, key=lambda g: max(map(_started, g))) if groups else []


def sync_beside(every: Iterable[Entry], e: Entry) -> Entry | None:
    """The best bracketed sync search of ``e``'s sitting: what a plain figure from another sitting is read against.

    Of ``e``'s instance count where the sitting searched one, else of any.
    """
    syncs = [x for x in every if sitting_of(x) == sitting_of(e) and _is_sync(x) and _searched(x)]
    return _best([x for x in syncs if instances(x) == instances(e)] or syncs)


def plain_for(every: list[Entry], here: list[Entry]) -> Entry | None:
    """The plain Python backend's best bracketed search in ``here``, else in the newest sitting of ``every`` with one.

    The plain baseline is compared with nothing in its row but read beside it, so where the sitting of the
    row did not search it, the newest search of it on the same device and cores stands in (its sitting named),
    from a sitting that also searched sync (bracketed): the row reads it as a share of that sync.
    """
    mine = _best(e for e in here if _is_plain(e) and _searched(e))
    if mine is not None:
        return mine
    # a plain search counts only beside a bracketed sync search of its own sitting: the plain figure is read as a
    # share of that sync (hosts of one device differ by 3x in what they hold at the SLO: results/modes/
    # 20261126-h100-4cores-slowhost against 20261126-h100-4cores-inband-rounds)
    anchored = {sitting_of(e) for e in every if _is_sync(e) and _searched(e)}
    others = [e for e in every if _is_plain(e) and _searched(e) and sitting_of(e) in anchored]
    if not others:
        return None
    # a sitting on a host that kept its tail in hand before one whose stalls set both capacities (:func:`stalls`)
    steady = [e for e in others if not stalls(sync_beside(every, e))]
    newest = sitting_of(max(steady or others, key=_started))
    return _best(e for e in others if sitting_of(e) == newest)


def stalling_plain_shares(every: list[Entry], plain: Entry | None) -> list[float]:
    """Plain over sync, one per sitting of ``every`` that searched both on a host that stalls, oldest first.

    Empty unless ``plain`` itself comes from such a host (:func:`plain_for` found no steady one): then every
    such sitting is shown, not the newest alone, since there the two searches rank by the host's stalls (on two
    H100s that stalled, 2026-11-27: 0.88x and 1.93x).
    """
    if plain is None or not stalls(sync_beside(every, plain)):
        return []
    shares: dict[Path, tuple[str, float]] = {}
    for e in sorted(every, key=_started):
        sync = sync_beside(every, e) if _is_plain(e) and _searched(e) else None
        if sync is not None and stalls(sync) and sync.capacity and e.capacity is not None:
            share = e.capacity / sync.capacity
            if sitting_of(e) not in shares or share > shares[sitting_of(e)][1]:
                shares[sitting_of(e)] = (_started(e), share)
    return [share for _, share in sorted(shares.values())]


def core_budget(es: list[Entry]) -> dict[str, Any] | None:
    """One core budget's figures, from its newest sitting that searched both modes (:func:`newest_comparison`).

    The best sync capacity is a bracketed search's; the best pipelined one may be a lower bound (its search's
    high end met the SLO, ``best_pipelined_is_lower_bound``). The p99 ratios come from that sitting's files
    that ran both at the same rates (the fixed part), else from the newest sitting of the core budget that ran
    the two side by side (``p99_sitting``), else from the two searches' windows at common rates.
    """
    every = es
    es = newest_comparison(every)
    sync = _best(e for e in es if _is_sync(e) and _searched(e))
    pipe = _best(e for e in es if _is_pipelined(e) and _search_ran(e))
    if sync is None or pipe is None:
        return None
    # the p99 targets are read at fixed rates, interleaved rounds: from this sitting's fixed part, else from the
    # newest sitting of this core budget that ran the same two variants side by side (its rates are 20/50/80% of
    # its own sync capacity); only where none did, from the two searches' windows (p99_ratios)
    at_fixed = es if _side_by_side(es, sync, pipe) else _newest_sitting(every, lambda g: _side_by_side(g, sync, pipe))
    at_fixed = at_fixed or es
    ratios = p99_ratios(at_fixed, sync, pipe)
    p99_p = worst_p99_p(at_fixed, sync, pipe)
    sync_rounds = p99_rounds(at_fixed, sync.summary["spec"])
    default = _best(e for e in es if _is_default(e) and _search_ran(e))
    sync_caps, pipe_caps, default_caps = _searches_of(es, sync, pipe, default)
    plain = plain_for(every, es)
    plain_sync = sync_beside(every, plain) if plain is not None else None
    return {
        "server_cpus": server_cores(sync),
        "device": device(sync),
        "sitting": sitting_of(sync),
        "best_pipelined_is_lower_bound": not _searched(pipe),
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


def _by_file(es: Iterable[Entry]) -> list[list[Entry]]:
    """The entries of each A/B file (the variants one file ran side by side), in path order."""
    files: dict[Path, list[Entry]] = {}
    for e in es:
        files.setdefault(e.path, []).append(e)
    return [files[path] for path in sorted(files)]


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
    caps = [e.capacity for e in es if e.summary.get("spec") == sync.summary["spec"] and _searched(e) and e.capacity]
    if not caps:
        return False
    rates: list[float] = []
    for here in _by_file(es):
        if want <= {str(e.summary.get("spec")) for e in here} and not any(_search_ran(e) for e in here):
            rates += [r for e in here if e.summary.get("spec") == sync.summary["spec"] for r in _p99s_by_rate(e)]
    low, high = FIXED_SHARES_SPAN
    return bool(rates) and min(rates) <= low * max(caps) and max(rates) >= high * max(caps)


def searches(es: Iterable[Entry], spec: str, *, bracketed: bool) -> list[float]:
    """Every comparable capacity search of one variant in ``es``, in the order they ran (bracketed only, if asked).

    A search whose generator fell behind at or below its capacity (``comparable`` false) is left out: its late
    sends count in its latencies, so its figure is neither the server's capacity nor a bound on it to compare.
    """
    ran = [
        e for e in es if e.summary.get("spec") == spec and _search_ran(e) and e.capacity is not None and e.comparable
    ]
    return [float(e.capacity or 0.0) for e in sorted(ran, key=_started) if _searched(e) or not bracketed]


def _searches_of(
    es: Iterable[Entry], sync: Entry | None, pipe: Entry | None, default: Entry | None
) -> tuple[list[float], list[float], list[float]]:
    """The comparable searches of the chosen sync (bracketed ones), pipelined and default variants ([] for None)."""
    es = list(es)

    def of(e: Entry | None, bracketed: bool) -> list[float]:
        return searches(es, e.summary["spec"], bracketed=bracketed) if e is not None else []

    return of(sync, True), of(pipe, False), of(default, False)


def judged(*sides: Sequence[float]) -> tuple[list[float], bool]:
    """Each side's capacity as the reports read it (its median, or its best search) and whether medians were read.

    Medians where every side was searched at least twice, else each side's best search.

    One search moves with the host (two searches of the default in `20261126-h100-4cores-abba`: 4,750 and
    6,000), so where a sitting searched each side several times, interleaved, the medians are compared; with
    one search a side, the best ones. Every side must hold a search.
    """
    medians = all(len(side) >= 2 for side in sides)
    return [statistics.median(side) if medians else max(side) for side in sides], medians


def capacity_ratio(sync: Sequence[float], pipelined: Sequence[float]) -> float | None:
    """Pipelined over sync capacity, as :func:`judged` reads them (None when a side was not searched)."""
    if not sync or not pipelined:
        return None
    (s, p), _ = judged(sync, pipelined)
    return p / s


#: Most relabellings :func:`permutation_p` enumerates (C(16, 8) = 12,870: eight searches or rounds a side).
PERMUTATIONS_MAX = 20_000


def permutation_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided exact permutation p of the difference between the medians of ``a`` and ``b``.

    The share of all ways to split the pooled values into groups of ``len(a)`` and ``len(b)`` whose medians
    differ by at least as much as the two measured groups do: how often labelling the same searches (or
    rounds) at random gives a gap as large. The measured split and its mirror always count, so two searches a
    side give no p under 1/3 (three a side: 1/10; four: 1/35, and medians that ignore the extremes make even
    fully separated groups 2/35). None when a side holds fewer than two values or the splits exceed
    :data:`PERMUTATIONS_MAX`.
    """
    if len(a) < 2 or len(b) < 2 or math.comb(len(a) + len(b), len(a)) > PERMUTATIONS_MAX:
        return None
    pooled = [*a, *b]
    observed = abs(statistics.median(a) - statistics.median(b))
    hits = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(a)):
        picked = set(chosen)
        x = [pooled[i] for i in chosen]
        y = [v for i, v in enumerate(pooled) if i not in picked]
        total += 1
        hits += abs(statistics.median(x) - statistics.median(y)) >= observed * (1 - 1e-9)
    return hits / total


def default_share(sync: Sequence[float], pipelined: Sequence[float], default: Sequence[float]) -> float | None:
    """The default's capacity over the best mode's (sync or pipelined), as :func:`judged` reads them."""
    read = _default_reading(sync, pipelined, default)
    return read[0] if read is not None else None


def _default_reading(
    sync: Sequence[float], pipelined: Sequence[float], default: Sequence[float]
) -> tuple[float, bool] | None:
    """:func:`default_share` and whether it compared medians (None when the default or both modes were not searched)."""
    modes = [side for side in (sync, pipelined) if side]
    if not default or not modes:
        return None
    (d, *m), medians = judged(default, *modes)
    return d / max(m), medians


def needed_instances(es: list[Entry], sync: bool, target: float) -> Entry | None:
    """The variant of the fewest instances (of one mode) whose capacity reaches ``target`` req/s, or None."""
    mine = [e for e in es if (_is_sync(e) if sync else _is_pipelined(e)) and e.capacity is not None]
    enough = [e for e in mine if (e.capacity or 0.0) >= target]
    return min(enough, key=lambda e: (instances(e), -(e.capacity or 0.0))) if enough else None


def p99_ratios(es: Iterable[Entry], sync: Entry, other: Entry) -> dict[float, float]:
    """``other``'s p99 over ``sync``'s per rate, pooled over every file of ``es`` that ran both specs at that rate.

    Each side's p99 at a rate is the median over every round of it in those files (a sitting's fixed parts
    may come from several device calls, each of a few interleaved rounds). Where no file ran both (no
    fixed-rate part), from the two searches' own windows at the rates both visited.
    """
    rounds = p99_rounds_side_by_side(es, sync, other)
    if rounds:
        return _median_ratios(rounds)
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
    for here in _by_file(list(es)):
        pair = _pair_in(here, sync.summary["spec"], other.summary["spec"])
        if pair is None:
            continue
        s99, p99 = _p99s_by_rate(pair[0]), _p99s_by_rate(pair[1])
        for rate in set(s99) & set(p99):
            mine, theirs = rounds.setdefault(rate, ([], []))
            mine.extend(s99[rate])
            theirs.extend(p99[rate])
    return dict(sorted(rounds.items()))


def _median_ratios(rounds: Mapping[float, tuple[list[float], list[float]]]) -> dict[float, float]:
    """Per rate, the median of the other side's rounds over the median of sync's."""
    return {rate: statistics.median(p) / statistics.median(s) for rate, (s, p) in sorted(rounds.items())}


def worst_p99_p(es: Iterable[Entry], sync: Entry, other: Entry) -> tuple[float | None, int, int]:
    """:func:`permutation_p` of the rounds at the rate of the largest p99 ratio, with each side's round count.

    (None, n, m) where that rate had fewer than two rounds a side, or no round ran side by side.
    """
    rounds = p99_rounds_side_by_side(es, sync, other)
    if not rounds:
        return None, 0, 0
    ratios = _median_ratios(rounds)
    s, p = rounds[max(ratios, key=lambda rate: ratios[rate])]
    return permutation_p(s, p), len(s), len(p)


#: Item 2's load points, as shares of a sitting's sync capacity (the median of its bracketed searches of the
#: sync spec): a fixed rate counts for the nearest one within :data:`POOL_SHARE_TOLERANCE`, so a rate at the
#: knee (0.95 or more) counts for none.
P99_LOAD_POINTS = (0.2, 0.5, 0.8)
POOL_SHARE_TOLERANCE = 0.15


def _p99_by_round(e: Entry) -> dict[tuple[float, int], float]:
    """p99 (ms) of the variant's :func:`_windows` by (offered rate, round)."""
    return {(float(w["offered_rps"]), int(w.get("round") or 0)): float(w["p99_ms"]) for w in _windows(e)}


def sign_p(above: int, below: int) -> float | None:
    """Two-sided exact sign test: how likely a split at least this uneven is when either side is as likely."""
    n = above + below
    if n == 0:
        return None
    k = max(above, below)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n)


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
    for sitting, group in _by_sitting(every).items():
        caps = searches(group, sync_spec, bracketed=True)
        if not caps:
            continue
        reference = statistics.median(caps)
        for here in _by_file(group):
            if any(_search_ran(e) for e in here):
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
            for rate, p99s in _p99s_by_rate(e).items():
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
    one = [e for e in es if instances(e) == 1 and _search_ran(e) and e.capacity]

    def is_auto(e: Entry) -> bool:
        return e.mode == "auto"

    def is_sync(e: Entry) -> bool:  # a bracketed search: a lower bound would make the ratio neither bound
        return _is_sync(e) and _searched(e)

    group = _newest_sitting(one, lambda g: any(map(is_auto, g)) and any(map(is_sync, g)))
    if not group:
        return None
    autos = [e for e in group if is_auto(e)]
    # the repository's own auto where the sitting ran it (only placement and instances overridden), else the newest
    auto = max([e for e in autos if _overrides_only(e, _DEPLOYMENT_NEUTRAL | {"instances"})] or autos, key=_started)
    sync = max((e for e in group if is_sync(e)), key=_started)
    assert auto.capacity and sync.capacity
    return {
        "auto": auto,
        "sync": sync,
        "sitting": sitting_of(auto),
        "ratio": auto.capacity / sync.capacity,
        "is_lower_bound": not _searched(auto),
        "p99_ratios": p99_ratios([e for e in es if sitting_of(e) == sitting_of(auto)], sync, auto),
    }


def regime(es: list[Entry]) -> dict[str, Any] | None:
    """One model's regime figures: one instance of each mode, instances and GPU memory at 95% of best."""
    every = es
    es = [e for e in es if _search_ran(e)]
    one_sync = _best(e for e in es if _is_sync(e) and instances(e) == 1)
    one_pipe = _best(e for e in es if _is_pipelined(e) and instances(e) == 1)
    best_sync = _best(e for e in es if _is_sync(e))
    if one_sync is None or one_pipe is None or best_sync is None or best_sync.capacity is None:
        return None
    # the issue's comparison: the instances (and GPU memory) each mode needs for 95% of sync's best capacity;
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
        "one_instance_ratio_is_lower_bound": not _searched(one_pipe),
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


def collect(root: Path) -> dict[str, Any]:
    """Every sitting's entries, grouped: ``budgets`` (bert_tiny, per core budget and device) and ``regimes``."""
    budgets: dict[tuple[str, int | None], list[Entry]] = {}
    regimes: dict[tuple[str, str], list[Entry]] = {}
    everything: list[Entry] = []
    for sitting in sittings(root / "results"):
        for e in entries(root / "results", sitting):
            if e.kind == "null":
                everything.append(e)
                continue
            everything.append(e)
            if model(e) == "bert_tiny":
                budgets.setdefault((device(e), server_cores(e)), []).append(e)
            else:
                regimes.setdefault((device(e), model(e)), []).append(e)
    return {"budgets": budgets, "regimes": regimes, "entries": everything}


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


#: Issue 30's targets: pipelined capacity over sync's, the worst p99 ratio, the default over the best, one instance.
TARGET_CAPACITY_RATIO = 1.0
TARGET_P99_RATIO = 1.1
TARGET_DEFAULT_SHARE = NEEDED_FRACTION
TARGET_ONE_INSTANCE_RATIO = 1.3


def _pooled_cell(pooled: Mapping[Any, Mapping[str, Any]]) -> str:
    """``pooled_p99`` as one cell: per load point, the median ratio (rounds in sittings; sign p).

    The load points are shares as :func:`pooled_p99` returns them, or their text as ``summary.json`` holds them.
    """
    return ", ".join(
        f"{float(point):.0%}: {v['ratio']:.2f} ({v['rounds']} in {v['sittings']}; p {v['sign_p']:.2f})"
        for point, v in pooled.items()
        if v.get("sign_p") is not None
    )


def headline_rows(block: Mapping[str, Any] | None) -> list[list[str]]:
    """RESULTS' "At a glance" rows of the ``modes`` block: [figure, value, target, verdict] per core budget and model.

    One row per core budget holds its three targets (capacity, p99 at 20/50/80%, the default as built); the
    verdict names the ones missed. A pipelined capacity that is a lower bound counts as at least its value.
    """
    if not block:
        return []
    rows = []
    for c in block.get("capacity") or []:
        at_least = ">= " if c.get("best_pipelined_is_lower_bound") else ""
        # the ratios as core_budget judged them (None: a side held no comparable search, so no verdict of met)
        cap = c.get("capacity_ratio")
        p99 = c.get("p99_ratio_max")
        share = c.get("default_share")
        checks = {
            "capacity": cap is not None and cap >= TARGET_CAPACITY_RATIO,
            "p99": p99 is not None and p99 <= TARGET_P99_RATIO,
            "default": share is not None and share >= TARGET_DEFAULT_SHARE,
        }
        missed = [k for k, ok in checks.items() if not ok]
        verdict = "met" if not missed else f"**missed** ({', '.join(missed)})"
        spread = c.get("p99_sync_spread_max")
        if not checks["p99"] and p99 is not None and spread is not None and p99 <= spread:
            # the ratio is not read as a mode's cost where sync against itself differs by more
            verdict += f"; p99 ratio within sync's own spread over rounds ({spread:.2f})"
        # how often a random labelling of the same searches (rounds) is as far apart (permutation_p)
        chances = [
            f"{what} p {c[key]:.2f}"
            for key, what in (("capacity_ratio_p", "capacity"), ("p99_ratio_max_p", "p99"))
            if not checks[what] and c.get(key) is not None
        ]
        if chances:
            verdict += "; as far apart under a random labelling of the same runs: " + ", ".join(chances)
        pooled = c.get("p99_pooled") or {}
        if not checks["p99"] and pooled:
            verdict += "; p99 ratio over every sitting's paired rounds " + _pooled_cell(pooled)
        rows.append(
            [
                f"bert-tiny, {c['device']}, {c['server_cpus']} server cores: pipelined / sync capacity"
                f"{_basis(c)}; worst p99 ratio at 20/50/80%; default as built / best",
                (f"{at_least}{cap:.2f}x" if cap is not None else "n/a") + f"; {fmt(p99, '.2f')}; {fmt(share, '.0%')}",
                f">= {TARGET_CAPACITY_RATIO:g}x; <= {TARGET_P99_RATIO:g}x; >= {TARGET_DEFAULT_SHARE:.0%}",
                verdict,
            ]
        )
    reg = block.get("regime")
    if reg:
        where = f"({reg['model']}, {reg['device']})"
        kinds = [("one_instance_ratio", "one pipelined instance")]
        if reg.get("auto_one_instance_ratio") is not None:  # what the repository as built chose there (item 7)
            kinds.append(("auto_one_instance_ratio", f"one `{reg['model']}_inflight` instance as built (`auto`)"))
        for key, what in kinds:
            ratio = reg[key]
            rows.append(
                [
                    f"{what} / one sync instance {where}",
                    (">= " if reg.get(f"{key}_is_lower_bound") else "") + f"{ratio:.2f}x",
                    f">= {TARGET_ONE_INSTANCE_RATIO:g}x",
                    "met" if ratio >= TARGET_ONE_INSTANCE_RATIO else "**missed**",
                ]
            )
    return rows


def _searches(caps: Sequence[float]) -> str:
    """A variant's capacity searches in one cell: "10,625" or "11,500 / 13,250"."""
    return " / ".join(fmt(x) for x in caps) or "n/a"


def _basis(c: Mapping[str, Any], short: bool = False, p: float | None = None) -> str:
    """How a capacity ratio of ``c`` was read: " (medians of N and M searches)", or nothing (one search a side).

    With ``p`` (:func:`permutation_p` of the searches), it follows: " (medians, N/M; p 0.63)".
    """
    n, m = len(c.get("sync_searches_rps") or []), len(c.get("pipelined_searches_rps") or [])
    if n < 2 or m < 2:
        return ""
    chance = f"; p {p:.2f}" if p is not None else ""
    return f" (medians, {n}/{m}{chance})" if short else f" (medians of {n} and {m} searches{chance})"


def write_summary(root: Path) -> dict[str, Any] | None:
    """Merge :func:`summary` into ``results/summary.json`` under ``modes``; return it."""
    block = summary(root)
    if block is not None:
        merge_summary(root, "modes", block)
    return block


def _inst(e: Entry | None) -> str:
    return str(instances(e)) if e is not None else "none measured"


def _mem(e: Entry | None) -> str:
    return fmt(gpu_memory_mib(e)) if e is not None else "n/a"


def _spec(e: Entry) -> str:
    return f"`{e.summary['spec']}`"


def _cap_of(e: Entry | None) -> str:
    """Capacity with the instances it had, or "not measured"."""
    if e is None:
        return "not measured"
    return f"{_capacity(e)} ({instances(e)} inst.)"


def _capacity(e: Entry) -> str:
    """The capacity, with ">=" when it is a lower bound (the search's high end met the SLO)."""
    return ("" if _searched(e) else ">= ") + fmt(e.capacity)


def _deployment(e: Entry) -> str:
    """What to deploy, in words: the mode and the instances."""
    what = "the plain Python backend" if _is_plain(e) else f"`{e.mode}`"
    return f"{what}, {instances(e)} instance{'s' if instances(e) != 1 else ''}"


def _deploy(es: list[Entry], *candidates: Entry | None) -> str | None:
    """The decision table's "deploy" cell: the candidate judged best, its mode, instances and capacity.

    Each candidate is read by :func:`judged` over its comparable searches in ``es`` (medians where every one was
    searched twice, else its best search); a tie goes to the earlier candidate (the pipelined mode, which the
    repository deploys by default). None when no candidate holds a search.
    """
    sides = [(e, searches(es, e.summary["spec"], bracketed=False)) for e in candidates if e is not None]
    sides = [(e, caps) for e, caps in sides if caps]
    if not sides:
        return None
    values, medians = judged(*(caps for _, caps in sides))
    k = max(range(len(sides)), key=lambda i: (values[i], -i))
    e = sides[k][0]
    at_least = "" if _searched(e) else ">= "
    return f"{_deployment(e)}: {at_least}{fmt(values[k])} req/s" + (" (median)" if medians else "")


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


def _plain_cell(plain: Entry | None, own: bool, sync: Entry | None, stalling: Sequence[float] = ()) -> str:
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
        return f"{_cap_of(plain)} ({p99})" if p99 else _cap_of(plain)
    if len(stalling) > 1:
        shares = ", ".join(f"{x:.2f}x" for x in stalling)
        return (
            f"not measured on a steady host; on {len(stalling)} hosts that stall (sync's p99 >= "
            f"{STALL_SPREAD:g}x its p50 at its lowest rate) {shares} sync there, newest `{sitting_of(plain).name}`"
        )
    share = f"{(plain.capacity or 0.0) / sync.capacity:.2f}x sync there, " if sync and sync.capacity else ""
    spread = tail_spread(sync) if sync is not None and stalls(sync) else None
    host = f"a host that stalls: sync's p99 {spread[1]:.0f}x its p50 at {fmt(spread[0])} req/s, " if spread else ""
    return f"{_cap_of(plain)} ({share}{p99 + ', ' if p99 else ''}{host}`{sitting_of(plain).name}`)"


#: The markers between which the README holds the generated decision table.
DECISION_BEGIN = "<!-- decision-table: generated by `inflight results-report` from results/modes; do not edit -->"
DECISION_END = "<!-- decision-table end -->"


def decision_table(root: Path) -> list[str]:
    """The README's decision table: per device, model and server core budget, what served most at the SLO.

    One row per (device, model, server cores) that has a bracketed capacity search, from its newest sitting that
    searched both modes (every sitting's searches where none did): the best variant measured (its mode and
    instances), the best of each mode, the repository's default as built and the plain Python backend, so a
    reader sees which to deploy and what the default gives up. "default / best" is ``summary.json``'s
    ``default_share``: the default over the better mode, their medians where each was searched twice
    (:func:`judged`). Empty when nothing was measured.
    """
    c = collect(root)
    groups: dict[tuple[str, str, int | None], list[Entry]] = {}
    for e in c["entries"]:
        if e.kind != "null" and _search_ran(e) and e.capacity is not None:
            groups.setdefault((device(e), model(e), server_cores(e)), []).append(e)
    rows = []
    for (dev, mdl, cores), all_es in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        es = newest_comparison(all_es) or all_es
        plain = plain_for(all_es, es)
        if not any(_searched(e) for e in es):
            continue  # nothing bracketed: every search's high end met the SLO, so the rates rank nothing
        sync = _best(e for e in es if _is_sync(e))
        pipe = _best(e for e in es if _is_pipelined(e))
        default = _best(e for e in es if _is_default(e))
        # read as summary.json reads it: medians where every side was searched twice (judged)
        read = _default_reading(*_searches_of(es, sync, pipe, default))
        share_text = "n/a" if read is None else fmt(read[0], ".0%") + (" (medians)" if read[1] else "")
        deploy = _deploy(es, pipe, sync, plain if plain is not None and plain in es else None)
        if deploy is None:
            continue
        rows.append(
            [
                dev,
                mdl,
                fmt(cores, "d") if cores else "n/a",
                deploy,
                _cap_of(sync),
                _cap_of(pipe),
                _cap_of(default),
                share_text,
                _plain_cell(
                    plain,
                    plain in es,
                    sync_beside(all_es, plain) if plain is not None else None,
                    stalling_plain_shares(all_es, plain),
                ),
            ]
        )
    if not rows:
        return []
    return [
        DECISION_BEGIN,
        *markdown_table(
            [
                "device",
                "model",
                "server cores",
                "deploy (judged best: medians where each was searched twice)",
                "best sync",
                "best pipelined",
                "default as built",
                "default / best",
                "plain Python backend",
            ],
            rows,
        ),
        DECISION_END,
    ]


def replace_block(text: str, block: list[str]) -> str:
    """``text`` with the lines between the decision-table markers (markers included) replaced by ``block``.

    Raises:
        ValueError: when ``text`` lacks the markers.
    """
    start, end = text.find(DECISION_BEGIN), text.find(DECISION_END)
    if start < 0 or end < start:
        raise ValueError(f"the decision-table markers are missing; put {DECISION_BEGIN!r} and {DECISION_END!r} lines")
    return text[:start] + "\n".join(block) + text[end + len(DECISION_END) :]


def _fixed_part(e: Entry) -> bool:
    """Whether the file is a fixed part: sync, the default and at most the null model (or the null model alone)."""
    n = len(e.doc.get("variants", []))
    return (2 <= n <= 3 or (n == 1 and e.kind == "null")) and not _search_ran(e)


def _over_rounds(rs: list[Mapping[str, Any]], path: tuple[str, ...], how: str) -> float | None:
    """The median (``how="median"``) or mean of ``path`` (keys into each run) over rounds that have it."""
    vals = []
    for r in rs:
        v: Any = r
        for key in path:
            v = v.get(key) if isinstance(v, Mapping) else None
        if v is not None:
            vals.append(float(v))
    if not vals:
        return None
    return statistics.median(vals) if how == "median" else statistics.fmean(vals)


def request_time_rows(es: Iterable[Entry]) -> list[list[str]]:
    """Where a request's time and the server's CPU go, per variant and rate, in the fixed-rate A/B files.

    Only ``modes_budget.sh``'s fixed parts (sync and the default at 20/50/80% of sync's capacity, with
    the null model as the request path's floor where it ran): latency from the generator, Triton's
    per-request queue and ``compute_infer`` time (the whole ``execute()`` a request rode in), the
    server's CPU per request, its stubs' threads and the cores their Python threads used. Where
    several rounds ran at a rate (in one file or in several fixed files of a sitting, pooled as the p99 ratios
    are), p50 and p99 are their medians and the rest their means.
    """
    rows = []
    groups: dict[tuple[Path, str], tuple[Entry, dict[float, list[Mapping[str, Any]]]]] = {}
    for e in es:
        if not _fixed_part(e):
            continue
        _, by_rate = groups.setdefault((sitting_of(e), e.summary.get("spec", "")), (e, {}))
        for run in _runs(e):
            if run.get("rate") is not None:
                by_rate.setdefault(float(run["rate"]), []).append(run)
    for e, by_rate in groups.values():
        for rate, rs in sorted(by_rate.items()):
            stub_threads = _over_rounds(rs, ("cpu", "threads", "count", "stub"), "mean")
            rows.append(
                [
                    device(e),
                    fmt(server_cores(e), "d") if server_cores(e) else "n/a",
                    _spec(e) + (f" ({len(rs)} rounds)" if len(rs) > 1 else ""),
                    fmt(rate),
                    fmt(_over_rounds(rs, ("latency_ms", "p50"), "median"), ".1f"),
                    fmt(_over_rounds(rs, ("latency_ms", "p99"), "median"), ".1f"),
                    fmt(_over_rounds(rs, ("server", "avg_batch_requests"), "mean"), ".1f"),
                    fmt(_over_rounds(rs, ("server", "queue_us"), "mean"), ".0f"),
                    fmt(_over_rounds(rs, ("server", "compute_infer_us"), "mean"), ".0f"),
                    fmt(_over_rounds(rs, ("cpu", "server_us_per_request"), "mean"), ".0f"),
                    fmt(round(stub_threads), "d") if stub_threads is not None else "n/a",
                    fmt(_over_rounds(rs, ("cpu", "threads", "by_name", "stub/triton_python_b"), "mean"), ".2f"),
                ]
            )
    return rows


def section(root: Path) -> list[str]:
    """The RESULTS.md section: core budgets, p99 ratios, the regime models, the executors' figures."""
    c = collect(root)
    if not c["entries"]:
        return []
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
    for (dev, cores), es in sorted(c["budgets"].items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        b = core_budget(es)
        if b is None:
            continue
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
                at_least + fmt(b["capacity_ratio"], ".2f") + _basis(b, short=True, p=b["capacity_p"]),
                (", ".join(f"{r / 1e3:g}k: {v:.2f}" for r, v in b["p99_ratios"].items()) or "n/a")
                + (f" (`{b['p99_sitting'].name}`)" if b["p99_sitting"] != b["sitting"] else ""),
                fmt(worst, ".2f"),
                _pooled_cell(b["p99_pooled"]) or "n/a",
                (
                    f"{b['p99_sync_spread']:.2f} ({b['p99_rounds']} rounds)"
                    if b["p99_sync_spread"] is not None
                    else "one round"
                ),
                _spec(b["best_pipelined"]),
                _cap_of(b["default"]),
                _plain_cell(
                    b["plain"], b["plain_sitting"] == b["sitting"], b["plain_sync"], b["plain_stalling_shares"]
                ),
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
    for (_dev, _m), es in sorted(c["regimes"].items()):
        r = regime(es)
        if r is None:
            continue
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
                f"{int(ex.get('auto_deferred') or 0):,} / {sum(int(ex.get(k) or 0) for k in _IN_BAND):,}",
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
    for e in c["entries"]:
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
                fmt(sum(int(ex.get(k) or 0) for k in _IN_BAND), "d") if ex.get("auto_bound") is not None else "n/a",
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
    # the fixed-rate parts of the sittings the core-budget table reads (older ones: RESULTS' list of every run)
    time_rows = request_time_rows(e for e in c["entries"] if sitting_of(e) in current)
    if time_rows:
        lines += [
            "### Where a request's time goes at fixed rates (sync against the default, the null model as the floor)",
            "",
            "From the sittings of the core-budget table above.",
            "",
            "Triton's queue and `compute_infer` per request (the latter: the whole `execute()` the request rode in); "
            "server CPU per request from the server's process tree; the stubs' threads, and the cores their Python "
            "threads (the execute thread, and a pipelined instance's completion and sender threads) used. The null "
            "model (Triton's request path and a fixed wait, none of our code) is the p99 no mode can go below on "
            "that host; over several interleaved rounds, p50 and p99 are medians, the rest means.",
            "",
            *markdown_table(
                [
                    "device",
                    "server cores",
                    "variant",
                    "offered req/s",
                    "p50 ms",
                    "p99 ms",
                    "requests/batch",
                    "queue µs",
                    "compute_infer µs",
                    "server CPU µs/request",
                    "stub threads",
                    "stub Python threads, cores",
                ],
                time_rows,
            ),
            "",
        ]
    return lines


if __name__ == "__main__":
    raise SystemExit(steady_main())
