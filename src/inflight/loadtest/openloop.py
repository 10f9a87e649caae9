"""Open-loop load: arrivals at a rate, capacity at a latency SLO, disjoint CPU sets.

Real clients do not wait for each other's answers: requests *arrive* at a rate. A closed-loop test
(N users, each sending its next request when the last one returned) keeps the server's queue full
and hides what happens to latency when requests arrive faster than they are served. This module
holds the parts of the open-loop test that do not need a server:

* :class:`~inflight.loadtest.schedule.Schedule` (its own module): the send times of one generator
  source, Poisson (exponential gaps) or constant, reproducible from a seed; several sources (one per
  Locust process) superpose to the target rate (independent Poisson sources sum to a Poisson
  process of the summed rate);
* :class:`Lateness`: how late each request left against its schedule. Latency is always counted
  from the *scheduled* send time, so a generator that falls behind adds its lateness to the
  latency instead of hiding it (no coordinated omission); the lateness says whether it fell behind;
* :class:`RatePoint`, :func:`meets_slo`, :func:`capacity_of` (:func:`capacity_over_rounds` for rates
  repeated over rounds) and :func:`bisect_capacity`: the highest offered rate whose p99 is within the
  SLO with no failure and the achieved rate within 2% of the offered one (perf_analyzer's
  ``--request-rate-range`` with ``--latency-threshold``, with a bisection instead of a fixed step);
* :func:`split_cpus`: disjoint CPU sets for the server and the load generator; :func:`share_cpus`: the
  server's cores cut into one contiguous share per server (one server per GPU).

The CPU, GPU and rate lists of the command line are parsed in :mod:`inflight.loadtest.list_options`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inflight.errors import ConfigError
from inflight.loadtest.list_options import parse_cpus

#: A send later than this behind its schedule counts as late (gevent sleeps through epoll, whose timeout
#: has millisecond granularity: up to 1 ms late is the timer, not a busy generator).
LATE_THRESHOLD_MS = 2.0

#: A send later than this counts as *very* late: a fifth of the default SLO, the most a generator may add
#: to a p99 it judges.
LIMIT_LATE_MS = 10.0

#: The achieved rate must be within this fraction of the offered one for a point to meet the SLO.
RATE_TOLERANCE = 0.02

#: A generator is taken to have kept its schedule when at most this fraction of sends were very late
#: (over ``LIMIT_LATE_MS``), so its lateness moves a p99 by less than ``LIMIT_LATE_MS``.
MAX_LATE_FRACTION = 0.01

#: Default p99 latency SLO, milliseconds.
DEFAULT_SLO_MS = 50.0


@dataclass
class Lateness:
    """Counts of one source over its window: requests due, sent late, answered, and how late.

    The window runs from :meth:`reset` (or creation) to :meth:`stop`, on the caller's clock
    (``time.perf_counter()`` seconds). Answers after the stop are not counted as achieved; requests
    still unanswered at the stop are counted in ``inflight`` (and their latency so far recorded by
    the caller as a lower bound).

    Attributes:
        started: Clock reading when the window started.
        span_s: Seconds from the start to :meth:`stop` (0 until then).
        scheduled: Requests whose send time came.
        late: Requests sent more than ``LATE_THRESHOLD_MS`` after their send time.
        very_late: Requests sent more than ``LIMIT_LATE_MS`` after their send time.
        max_late_ms: The latest send, milliseconds behind schedule.
        sum_late_ms: Sum of the lateness of every send (for the mean).
        completed: Requests answered (successfully or not) before the stop.
        ok: Requests answered successfully before the stop.
        peak_inflight: Most requests sent and not yet answered at once.
        inflight: Requests sent and not yet answered now.
        stopped: True once :meth:`stop` was called.
    """

    started: float = 0.0
    span_s: float = 0.0
    scheduled: int = 0
    late: int = 0
    very_late: int = 0
    max_late_ms: float = 0.0
    sum_late_ms: float = 0.0
    completed: int = 0
    ok: int = 0
    peak_inflight: int = 0
    inflight: int = 0
    stopped: bool = False

    def sent(self, late_s: float) -> None:
        """Record a send ``late_s`` seconds after its scheduled time (negative: early, counted 0)."""
        ms = max(late_s, 0.0) * 1000.0
        self.scheduled += 1
        self.sum_late_ms += ms
        self.max_late_ms = max(self.max_late_ms, ms)
        if ms > LATE_THRESHOLD_MS:
            self.late += 1
            if ms > LIMIT_LATE_MS:
                self.very_late += 1
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)

    def done(self, ok: bool) -> None:
        """Record an answer (``ok``: a successful one) for a sent request."""
        self.inflight -= 1
        if not self.stopped:
            self.completed += 1
            self.ok += int(ok)

    def reset(self, now: float) -> None:
        """Start the window afresh at ``now``, keeping the requests still in flight."""
        inflight = self.inflight
        for f in dataclasses.fields(self):
            setattr(self, f.name, f.default)
        self.inflight = self.peak_inflight = inflight
        self.started = now

    def stop(self, now: float) -> None:
        """End the window at ``now``: later answers are not counted as achieved."""
        if not self.stopped:
            self.span_s = max(now - self.started, 0.0)
            self.stopped = True

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON)."""
        return dataclasses.asdict(self)

    @staticmethod
    def combine(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Sum the counts of several sources (as written by :meth:`to_dict`); derived figures added.

        Returns:
            ``scheduled``, ``late``, ``very_late``, ``completed``, ``ok``, ``unanswered`` (sent, no
            answer by the stop), ``late_fraction``, ``very_late_fraction``, ``mean_late_ms``,
            ``max_late_ms``, ``peak_inflight`` (sum of the sources' peaks: an upper bound of the peak of
            all), ``span_s`` (mean of the sources' windows), ``achieved_rps`` (successful answers
            within the windows per second), ``answered_fraction`` (those answers over the requests due) and ``sources``.
        """
        scheduled = sum(int(p.get("scheduled", 0)) for p in parts)
        late = sum(int(p.get("late", 0)) for p in parts)
        very_late = sum(int(p.get("very_late", 0)) for p in parts)
        ok = sum(int(p.get("ok", 0)) for p in parts)
        spans = [float(p.get("span_s", 0.0)) for p in parts if float(p.get("span_s", 0.0)) > 0]
        span = sum(spans) / len(spans) if spans else math.nan
        return {
            "sources": len(parts),
            "scheduled": scheduled,
            "late": late,
            "completed": sum(int(p.get("completed", 0)) for p in parts),
            "ok": ok,
            "unanswered": sum(int(p.get("inflight", 0)) for p in parts),
            "late_fraction": late / scheduled if scheduled else math.nan,
            "very_late": very_late,
            "very_late_fraction": very_late / scheduled if scheduled else math.nan,
            "mean_late_ms": sum(float(p.get("sum_late_ms", 0.0)) for p in parts) / scheduled if scheduled else math.nan,
            "max_late_ms": max((float(p.get("max_late_ms", 0.0)) for p in parts), default=math.nan),
            "peak_inflight": sum(int(p.get("peak_inflight", 0)) for p in parts),
            "span_s": span,
            "achieved_rps": ok / span if spans else math.nan,
            "answered_fraction": ok / scheduled if scheduled else math.nan,
        }


@dataclass(kw_only=True)
class RatePoint:
    """What one open-loop window at one offered rate measured.

    Attributes:
        offered_rps: The target arrival rate.
        achieved_rps: Requests answered successfully per second of the window.
        requests: Requests answered (successes + failures).
        failures: Failed requests.
        p50_ms: Median latency from the scheduled send time.
        p95_ms: 95th percentile.
        p99_ms: 99th percentile.
        late_fraction: Fraction of sends later than ``LATE_THRESHOLD_MS`` (NaN: unknown).
        answered_fraction: Successful answers inside the window over the requests due in it (NaN:
            unknown). Unlike ``achieved_rps / offered_rps`` it carries no Poisson noise of the
            arrival count, so a short window can still tell a backlog.
        valid: False when the window itself failed (Locust error, no request answered).
    """

    offered_rps: float
    achieved_rps: float
    requests: int
    failures: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    late_fraction: float = math.nan
    answered_fraction: float = math.nan
    valid: bool = True

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON)."""
        return dataclasses.asdict(self)


def slo_failures(point: RatePoint, slo_ms: float, tolerance: float = RATE_TOLERANCE) -> list[str]:
    """Why ``point`` misses the SLO (empty: it meets it).

    A point meets the SLO when its window was valid, no request failed, the p99 latency (from the
    scheduled send time) is at most ``slo_ms`` and the achieved rate is within ``tolerance`` of the
    offered one (otherwise a backlog grew, whatever the percentiles of the answered requests say).
    The achieved rate is judged by ``answered_fraction`` where it is known (answers over requests
    due in the window), else by ``achieved_rps / offered_rps``.
    """
    why = []
    if not point.valid:
        why.append("the window was invalid")
    if point.failures:
        why.append(f"{point.failures} failed requests")
    if not point.p99_ms <= slo_ms:  # NaN fails too
        why.append(f"p99 {point.p99_ms:.1f} ms > {slo_ms:g} ms")
    if math.isfinite(point.answered_fraction):
        if not point.answered_fraction >= 1.0 - tolerance:
            why.append(
                f"{100 * point.answered_fraction:.1f}% of the requests due were answered in the window "
                f"(< {100 * (1 - tolerance):.0f}%; achieved {point.achieved_rps:,.0f} of "
                f"{point.offered_rps:,.0f} req/s)"
            )
    elif not point.achieved_rps >= (1.0 - tolerance) * point.offered_rps:
        why.append(
            f"achieved {point.achieved_rps:,.0f} req/s < {100 * (1 - tolerance):.0f}% of the offered "
            f"{point.offered_rps:,.0f}"
        )
    return why


def meets_slo(point: RatePoint, slo_ms: float, tolerance: float = RATE_TOLERANCE) -> bool:
    """True when ``point`` meets the SLO (see :func:`slo_failures`)."""
    return not slo_failures(point, slo_ms, tolerance)


def capacity_of(points: Sequence[RatePoint], slo_ms: float, tolerance: float = RATE_TOLERANCE) -> float | None:
    """The highest offered rate that meets the SLO, counting only rates below the first that missed it.

    A rate that passes above one that failed is taken as noise: capacity is where the curve first
    crosses the SLO. None when the lowest rate already misses it.
    """
    best: float | None = None
    for p in sorted(points, key=lambda p: p.offered_rps):
        if not meets_slo(p, slo_ms, tolerance):
            break
        best = p.offered_rps
    return best


def capacity_over_rounds(
    rounds: Sequence[Sequence[RatePoint]], slo_ms: float, tolerance: float = RATE_TOLERANCE
) -> tuple[float | None, float | None]:
    """Capacity at the SLO over rounds of the same rates: the median of each round's :func:`capacity_of`.

    The lower middle one of an even count; a round that met no rate counts lowest. One curve of all the windows
    let one lucky window carry a rate (an H100, 2026-11-28: 5,250 req/s met in one round of three, p99 98.7 ms).

    Returns:
        ``(capacity, upper)``: capacity None when the median round met no rate; upper the lowest rate above it
        that missed in any round (None: none did).
    """
    caps = sorted((capacity_of(r, slo_ms, tolerance) for r in rounds if r), key=lambda c: -math.inf if c is None else c)
    if not caps:
        return None, None
    cap = caps[(len(caps) - 1) // 2]
    missed = [p.offered_rps for r in rounds for p in r if not meets_slo(p, slo_ms, tolerance)]
    return cap, min((x for x in missed if cap is None or x > cap), default=None)


@dataclass(kw_only=True)
class Capacity:
    """The outcome of a capacity search.

    Attributes:
        capacity_rps: Highest offered rate measured to meet the SLO (None: none did).
        upper_rps: Lowest offered rate measured to miss it (None: every rate tried met it, so
            the capacity is at least ``capacity_rps``).
        points: Every point measured, in the order measured.
    """

    capacity_rps: float | None
    upper_rps: float | None
    points: list[RatePoint] = field(default_factory=list)

    @property
    def bounded(self) -> bool:
        """True when a missed rate above the capacity was measured (the figure is not a lower bound)."""
        return self.upper_rps is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON)."""
        return {
            "capacity_rps": self.capacity_rps,
            "upper_rps": self.upper_rps,
            "bounded": self.bounded,
            "points": [p.to_dict() for p in self.points],
        }


def bisect_capacity(
    measure: Callable[[float], RatePoint],
    lo: float,
    hi: float,
    *,
    slo_ms: float = DEFAULT_SLO_MS,
    rel_tol: float = 0.05,
    max_steps: int = 8,
    tolerance: float = RATE_TOLERANCE,
) -> Capacity:
    """Find the highest rate in ``[lo, hi]`` that meets the SLO by bisection.

    ``hi`` is measured first: if it meets the SLO the capacity is at least ``hi`` (unbounded).
    Then ``lo``: if it misses, the rate is halved until one passes (at most ``max_steps`` times).
    Then the interval is halved until its width is within ``rel_tol`` of its lower end or
    ``max_steps`` measurements of the midpoint were made.

    Args:
        measure: Runs one window at the given offered rate.
        lo: Lowest rate of the search (> 0).
        hi: Highest rate (> lo).
        slo_ms: p99 latency SLO.
        rel_tol: Stop when ``(upper - capacity) / capacity`` is at most this.
        max_steps: Most midpoint measurements.
        tolerance: Achieved-vs-offered tolerance (see :func:`slo_failures`).

    Raises:
        ConfigError: for ``lo <= 0`` or ``hi <= lo``.
    """
    if not 0 < lo < hi:
        raise ConfigError(f"capacity search {lo:g}..{hi:g} req/s: give 0 < low < high")
    points: list[RatePoint] = []

    def ok(rate: float) -> bool:
        p = measure(rate)
        points.append(p)
        return meets_slo(p, slo_ms, tolerance)

    if ok(hi):
        return Capacity(capacity_rps=hi, upper_rps=None, points=points)
    upper = hi
    good: float | None = None
    rate = lo
    for _ in range(max_steps + 1):
        if ok(rate):
            good = rate
            break
        upper = rate
        rate /= 2.0
    if good is None:
        return Capacity(capacity_rps=None, upper_rps=upper, points=points)
    for _ in range(max_steps):
        if (upper - good) <= rel_tol * good:
            break
        mid = (good + upper) / 2.0
        if ok(mid):
            good = mid
        else:
            upper = mid
    return Capacity(capacity_rps=good, upper_rps=upper, points=points)


def format_cpus(cpus: Sequence[int]) -> str:
    """The shortest ``taskset -c`` form of ``cpus`` (``[0, 1, 2, 5]`` -> ``0-2,5``)."""
    out: list[str] = []
    xs = sorted(set(cpus))
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


#: Fewest cores for which the runner splits them between the server and the load generator.
MIN_SPLIT_CPUS = 8


@dataclass(frozen=True)
class CpuSets:
    """The cores of the server (tritonserver and every stub) and of the load generator.

    Attributes:
        server: Server cores (empty: not pinned).
        client: Load generator cores (empty: not pinned).
        reason: How they were chosen (recorded with the results).
    """

    server: tuple[int, ...]
    client: tuple[int, ...]
    reason: str

    @property
    def isolated(self) -> bool:
        """True when the server and the generator run on disjoint, non-empty core sets."""
        return bool(self.server) and bool(self.client) and not set(self.server) & set(self.client)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON): the sets in ``taskset -c`` form."""
        return {
            "server": format_cpus(self.server),
            "client": format_cpus(self.client),
            "isolated": self.isolated,
            "reason": self.reason,
        }


def split_cpus(
    available: Sequence[int], server: str | None = None, client: str | None = None, *, isolate: bool = True
) -> CpuSets:
    """Choose disjoint core sets for the server and the load generator.

    With neither given and at least ``MIN_SPLIT_CPUS`` available cores, the server gets the first
    half (as the NUMA layout usually numbers a socket's cores together) and the generator the
    rest. Given ones are checked against the available cores and each other; one given alone gets
    the rest for the other side. With fewer cores nothing is pinned (and the report says that the
    generator shared the server's cores). With ``isolate`` False and the server's set alone given,
    the server is pinned to it and the generator is not pinned at all (it shares every core).

    Raises:
        ConfigError: for sets outside the available cores or overlapping each other.
    """
    avail = sorted(set(available))
    if not isolate and server is not None and client is None:
        pinned = parse_cpus(server)
        if not set(pinned) <= set(avail):
            raise ConfigError(
                f"--server-cpus {format_cpus(pinned)}: not all of these cores are available to this process "
                f"(available: {format_cpus(avail)})"
            )
        return CpuSets(
            tuple(pinned),
            (),
            f"server on cores {format_cpus(pinned)} (--server-cpus); the load generator not pinned (--no-isolate): "
            "it shares every core",
        )
    if server is None and client is None:
        if len(avail) < MIN_SPLIT_CPUS:
            return CpuSets(
                (),
                (),
                f"not pinned: {len(avail)} cores available, fewer than {MIN_SPLIT_CPUS} to split; the load generator "
                "shares the server's cores, so ratios include its CPU cost",
            )
        half = len(avail) // 2
        return CpuSets(tuple(avail[:half]), tuple(avail[half:]), f"split by default: {half} cores each of {len(avail)}")
    s = parse_cpus(server) if server is not None else None
    c = parse_cpus(client) if client is not None else None
    for name, cpus in (("--server-cpus", s), ("--client-cpus", c)):
        if cpus is not None and not set(cpus) <= set(avail):
            raise ConfigError(
                f"{name} {format_cpus(cpus)}: not all of these cores are available to this process "
                f"(available: {format_cpus(avail)})"
            )
    if s is None:
        assert c is not None
        s = [x for x in avail if x not in set(c)]
    if c is None:
        c = [x for x in avail if x not in set(s)]
    if not s or not c:
        raise ConfigError("the server and the load generator each need at least one core; give both CPU sets")
    if set(s) & set(c):
        raise ConfigError(
            f"--server-cpus {format_cpus(s)} and --client-cpus {format_cpus(c)} overlap on "
            f"{format_cpus(sorted(set(s) & set(c)))}: give disjoint sets"
        )
    return CpuSets(tuple(s), tuple(c), "given on the command line")


def share_cpus(cpus: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    """Cut the server's cores into ``parts`` disjoint contiguous shares of nearly equal size (one per server).

    The cores are taken in increasing order; the first ``len(cpus) % parts`` shares get one core more
    (``0-19`` in two: ``0-9`` and ``10-19``; ``0-4`` in two: ``0-2`` and ``3-4``). No cores (the server
    not pinned) gives ``parts`` empty shares: every server then runs unpinned.

    Raises:
        ConfigError: for fewer than one part, or more parts than cores.
    """
    if parts < 1:
        raise ConfigError(f"cannot share cores among {parts} servers; start at least one")
    xs = sorted(set(cpus))
    if not xs:
        return [() for _ in range(parts)]
    if parts > len(xs):
        raise ConfigError(
            f"{parts} servers but only {len(xs)} server core{'s' if len(xs) > 1 else ''} ({format_cpus(xs)}): give "
            "each server at least one core; widen --server-cpus or start fewer servers"
        )
    size, extra = divmod(len(xs), parts)
    out: list[tuple[int, ...]] = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(tuple(xs[start:end]))
        start = end
    return out
