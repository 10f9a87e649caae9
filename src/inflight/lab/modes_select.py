"""Which runs of ``results/modes`` the modes' figures read: the predicates over variants, sittings and searches.

``scripts/lab/gpu_session.sh modes`` writes one sitting per call under ``results/modes/<date>-<device>-<what>``:
open-loop A/B files (fixed rates and capacity searches) whose server ran on its own cores
(``load.cpu_sets``). A pipelined variant is any of ``pipelined``, ``overlap``, ``auto`` that may defer; the
newest sitting that searched both modes is the one a core budget's figures come from; a host whose sync
search shows its stalls setting the tail (:data:`STALL_SPREAD`) is not one to compare the modes on
(``python -m inflight.lab.modes_results SITTING`` says so before the rest of a device call is spent).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from inflight.lab.entries import Entry, device, entries, instances, model, server_cores
from inflight.lab.entries import sittings as open_loop_sittings
from inflight.variants import parse_variant_arg

MODES_DIR = "modes"


#: The fraction of a mode's best capacity that "the instances it needs" must reach.
NEEDED_FRACTION = 0.95


def sittings(results: Path) -> list[Path]:
    """The sittings under ``results/modes``, oldest first."""
    return open_loop_sittings(results, MODES_DIR)


def gpu_memory_mib(e: Entry) -> float | None:
    """The most GPU memory the server's processes held at the end of a window of this variant (MiB)."""
    used = [float((r.get("gpu_memory") or {}).get("used_mib") or 0) for r in variant_runs(e)]
    return max(used) if used and max(used) > 0 else None


def variant_runs(e: Entry) -> list[Mapping[str, Any]]:
    """The windows (runs) of ``e``'s variant in its file."""
    return [r for r in e.doc.get("runs", []) if r.get("variant") == e.summary.get("variant")]


def valid_windows(e: Entry) -> list[Mapping[str, Any]]:
    """The variant's valid windows with a p99, not generator-limited (what they measured is the server's)."""
    return [
        w
        for w in e.summary.get("sweep") or []
        if w.get("valid") and not w.get("generator_limited") and w.get("p99_ms") is not None
    ]


def p99s_by_rate(e: Entry) -> dict[float, list[float]]:
    """p99s (ms) of the variant's :func:`valid_windows` by offered rate (one per round)."""
    by_rate: dict[float, list[float]] = {}
    for w in valid_windows(e):
        by_rate.setdefault(float(w["offered_rps"]), []).append(float(w["p99_ms"]))
    return by_rate


def p99_by_rate(e: Entry) -> dict[float, float]:
    """p99 (ms) at each offered rate of the variant's valid windows, not generator-limited.

    Where several rounds ran at one rate (``--repeat``), their median: one window's p99 moves with a
    single stall of the host, and the rounds are interleaved with the other variant's.
    """
    return {rate: statistics.median(p99s) for rate, p99s in p99s_by_rate(e).items()}


#: p99 over p50 of a search's lowest-rate window from which the host's stalls, not a queue, are taken to set the
#: tail. The bracketed sync searches of results/modes (2026-11-27) show 1.6-3.8 there on hosts that kept their p99
#: in hand and 6.2-16.3, at a p50 of about 3 ms, on hosts that stalled (20261126-h100-4cores-slowhost,
#: 20261127-h100-4cores-plain): nothing in between.
STALL_SPREAD = 5.0


def tail_spread(e: Entry) -> tuple[float, float] | None:
    """(offered rate, p99 / p50) of the variant's lowest-rate valid window with a p50; None without one.

    At the lowest rate a search tries, no queue forms on a host that keeps up, so a p99 many times the p50
    there is the host stalling: a capacity found on such a host is set by its stalls, not by the mode.
    """
    windows = [w for w in valid_windows(e) if w.get("p50_ms")]
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
        spread = tail_spread(e) if is_sync(e) and search_ran(e) else None
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


def best_capacity(es: Iterable[Entry]) -> Entry | None:
    """The entry of the highest capacity (None when none has one)."""
    ranked = [e for e in es if e.capacity is not None]
    return max(ranked, key=lambda e: e.capacity or 0.0) if ranked else None


def is_sync(e: Entry) -> bool:
    """Whether the variant is the sync mode (``<model>_sync``)."""
    return e.mode == "sync"


def is_pipelined(e: Entry) -> bool:
    """An inflight variant that may defer batches (``auto`` made in-band only is the sync path, not pipelining)."""
    return e.kind == "pipelined" and not in_band_only(e)


def in_band_only(e: Entry) -> bool:
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
DEPLOYMENT_NEUTRAL = frozenset({"gpus", "capture_at_load", "kind"})


def is_default(e: Entry) -> bool:
    """Whether this is ``<model>_inflight`` as ``inflight build-models`` wrote it for the server's cores."""
    return overrides_only(e, DEPLOYMENT_NEUTRAL)


def overrides_only(e: Entry, allowed: frozenset[str]) -> bool:
    """Whether this is ``<model>_inflight`` measured with no overrides but ``allowed``."""
    name, overrides = parse_variant_arg(str(e.summary.get("spec") or ""))
    return name.endswith("_inflight") and overrides.keys() <= allowed


def is_plain(e: Entry) -> bool:
    """Whether the variant is Triton's plain Python backend (``<model>_plain``)."""
    return e.kind == "plain"


def search_ran(e: Entry) -> bool:
    """Whether a capacity search ran on the variant (bracketed, or a lower bound when its high end met the SLO)."""
    return any(r.get("capacity_search") for r in variant_runs(e))


def searched(e: Entry) -> bool:
    """Whether the variant's capacity came from a search that bracketed it (not only rates that all met the SLO)."""
    return bool(e.summary.get("capacity_bounded"))


def sitting_of(e: Entry) -> Path:
    """The sitting folder of an entry (``results/modes/<sitting>/<run>/ab-*.json``)."""
    return e.path.parents[1]


def started(e: Entry) -> str:
    """When the entry's A/B run started (ISO 8601, so its order is time's; empty when not recorded)."""
    return str(e.doc.get("started") or "")


def compares(es: list[Entry]) -> bool:
    """Whether a sitting's entries hold a bracketed sync search and a pipelined search (a lower bound will do)."""
    return any(is_sync(e) and searched(e) for e in es) and any(
        is_pipelined(e) and search_ran(e) and e.capacity is not None for e in es
    )


def newest_comparison(es: list[Entry]) -> list[Entry]:
    """The entries of the newest sitting that searched both modes (``[]`` when none did).

    Ratios hold within one sitting only (one host, one day, one rule of the code measured), so a core
    budget's figures come from its newest complete sitting, not from the best of every sitting.
    """
    return newest_sitting_of(es, compares)


def by_sitting(es: Iterable[Entry]) -> dict[Path, list[Entry]]:
    """The entries of ``es`` grouped by their sitting (:func:`sitting_of`)."""
    groups: dict[Path, list[Entry]] = {}
    for e in es:
        groups.setdefault(sitting_of(e), []).append(e)
    return groups


def newest_sitting_of(es: Iterable[Entry], complete: Callable[[list[Entry]], bool]) -> list[Entry]:
    """The entries of ``es`` in the newest sitting whose entries are ``complete`` (``[]`` when none are)."""
    groups = [group for group in by_sitting(es).values() if complete(group)]
    return max(groups, key=lambda g: max(map(started, g))) if groups else []


def sync_beside(every: Iterable[Entry], e: Entry) -> Entry | None:
    """The best bracketed sync search of ``e``'s sitting: what a plain figure from another sitting is read against.

    Of ``e``'s instance count where the sitting searched one, else of any.
    """
    syncs = [x for x in every if sitting_of(x) == sitting_of(e) and is_sync(x) and searched(x)]
    return best_capacity([x for x in syncs if instances(x) == instances(e)] or syncs)


def plain_for(every: list[Entry], here: list[Entry]) -> Entry | None:
    """The plain Python backend's best bracketed search in ``here``, else in the newest sitting of ``every`` with one.

    The plain baseline is compared with nothing in its row but read beside it, so where the sitting of the
    row did not search it, the newest search of it on the same device and cores stands in (its sitting named),
    from a sitting that also searched sync (bracketed): the row reads it as a share of that sync.
    """
    mine = best_capacity(e for e in here if is_plain(e) and searched(e))
    if mine is not None:
        return mine
    # a plain search counts only beside a bracketed sync search of its own sitting: the plain figure is read as a
    # share of that sync (hosts of one device differ by 3x in what they hold at the SLO: results/modes/
    # 20261126-h100-4cores-slowhost against 20261126-h100-4cores-inband-rounds)
    anchored = {sitting_of(e) for e in every if is_sync(e) and searched(e)}
    others = [e for e in every if is_plain(e) and searched(e) and sitting_of(e) in anchored]
    if not others:
        return None
    # a sitting on a host that kept its tail in hand before one whose stalls set both capacities (:func:`stalls`)
    steady = [e for e in others if not stalls(sync_beside(every, e))]
    newest = sitting_of(max(steady or others, key=started))
    return best_capacity(e for e in others if sitting_of(e) == newest)


def stalling_plain_shares(every: list[Entry], plain: Entry | None) -> list[float]:
    """Plain over sync, one per sitting of ``every`` that searched both on a host that stalls, oldest first.

    Empty unless ``plain`` itself comes from such a host (:func:`plain_for` found no steady one): then every
    such sitting is shown, not the newest alone, since there the two searches rank by the host's stalls (on two
    H100s that stalled, 2026-11-27: 0.88x and 1.93x).
    """
    if plain is None or not stalls(sync_beside(every, plain)):
        return []
    shares: dict[Path, tuple[str, float]] = {}
    for e in sorted(every, key=started):
        sync = sync_beside(every, e) if is_plain(e) and searched(e) else None
        if sync is not None and stalls(sync) and sync.capacity and e.capacity is not None:
            share = e.capacity / sync.capacity
            if sitting_of(e) not in shares or share > shares[sitting_of(e)][1]:
                shares[sitting_of(e)] = (started(e), share)
    return [share for _, share in sorted(shares.values())]


def by_file(es: Iterable[Entry]) -> list[list[Entry]]:
    """The entries of each A/B file (the variants one file ran side by side), in path order."""
    files: dict[Path, list[Entry]] = {}
    for e in es:
        files.setdefault(e.path, []).append(e)
    return [files[path] for path in sorted(files)]


def searches(es: Iterable[Entry], spec: str, *, bracketed: bool) -> list[float]:
    """Every comparable capacity search of one variant in ``es``, in the order they ran (bracketed only, if asked).

    A search whose generator fell behind at or below its capacity (``comparable`` false) is left out: its late
    sends count in its latencies, so its figure is neither the server's capacity nor a bound on it to compare.
    """
    ran = [e for e in es if e.summary.get("spec") == spec and search_ran(e) and e.capacity is not None and e.comparable]
    return [float(e.capacity or 0.0) for e in sorted(ran, key=started) if searched(e) or not bracketed]


def needed_instances(es: list[Entry], sync: bool, target: float) -> Entry | None:
    """The variant of the fewest instances (of one mode) whose capacity reaches ``target`` req/s, or None."""
    mine = [e for e in es if (is_sync(e) if sync else is_pipelined(e)) and e.capacity is not None]
    enough = [e for e in mine if (e.capacity or 0.0) >= target]
    return min(enough, key=lambda e: (instances(e), -(e.capacity or 0.0))) if enough else None


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
