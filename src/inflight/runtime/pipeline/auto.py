"""``AutoPolicy``: how the ``auto`` mode answers each batch, in-band or deferred (why each rule: docs/LAB.md)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inflight.runtime.pipeline.stats import Counters, stat_field


@dataclass
class _Tally:
    """What one window of ``AutoPolicy`` measured (its first quarter left out)."""

    cycle_s: float = 0.0
    execute_s: float = 0.0  # the part of cycle_s inside execute() (the rest: the gaps between them)
    requests: int = 0
    batches: int = 0
    fill: float = 0.0  # summed over the batches (the reference window's in-band ones)

    def add(self, cycle_s: float, execute_s: float, requests: int, fill: float) -> None:
        self.cycle_s += cycle_s
        self.execute_s += execute_s
        self.requests += requests
        self.batches += 1
        self.fill += fill

    def busy(self) -> float:
        """The share of the measured cycles spent inside ``execute()``."""
        return self.execute_s / self.cycle_s if self.cycle_s > 0 else 0.0

    def per_request_s(self) -> float:
        return self.cycle_s / self.requests


@dataclass
class AutoStats(Counters):
    """The ``auto`` policy's counters, owned and written by its ``AutoPolicy`` (execute thread only).

    Each field is described once, in its metadata, as ``ExecutorStats``' are; the metrics publisher
    and the ``finalized`` record take them beside the executor's.
    """

    auto_policy_s: float = stat_field(
        "auto: execute-thread time deciding each batch's path and measuring it (``AutoPolicy.choose``, ``ran``, "
        "``deferred``, the counters they set).",
        default=0.0,
    )
    deferred_requests: int = stat_field(
        "Requests of the batches auto deferred, answered through ``send()``.", "inflight_deferred_requests_total"
    )
    auto_inline: int = stat_field(
        "auto: batches answered in-band, the sync mode's path, because the measured overlap bound is under "
        "``auto_bound_min`` (or not measured yet).",
        "inflight_auto_inline_batches_total",
    )
    auto_unsaturated: int = stat_field(
        "auto: batches answered in-band because the period's reference window found the instance unsaturated "
        "(its busy share under ``auto_busy_min`` and its batch fill under ``auto_fill_min``; ``AutoPolicy``).",
        "inflight_auto_unsaturated_batches_total",
    )
    auto_reference: int = stat_field(
        "auto: batches answered in-band in a reference window (the start of each probe period, while the "
        "overlap bound is at ``auto_bound_min`` or over; under it they count as inline; ``AutoPolicy``).",
        "inflight_auto_reference_batches_total",
    )
    auto_no_gain: int = stat_field(
        "auto: batches answered in-band because the period's probe did not gain ``auto_gain_min`` by deferring "
        "(from ``auto_bound_high``: measured a loss).",
        "inflight_auto_no_gain_batches_total",
    )
    auto_deferred: int = stat_field(
        "auto: batches deferred, the pipelined mode's path (in a probe window, or after a probe that gained).",
        "inflight_auto_deferred_batches_total",
    )
    auto_bound: float = stat_field(
        "auto: the overlap bound measured on in-band batches (moving average; see ``AutoPolicy``).",
        "inflight_auto_overlap_bound",
        "gauge",
        default=0.0,
        agg="mean",
    )
    auto_gain: float = stat_field(
        "auto: the last probe's gain, the execute thread's cycle per request in-band over deferred (0: none yet).",
        "inflight_auto_gain",
        "gauge",
        default=0.0,
        agg="mean",
    )
    auto_busy: float = stat_field(
        "auto: the last reference window's busy share, the execute thread's time in ``execute()`` over its cycle "
        "(0: none yet; ``AutoPolicy``).",
        "inflight_auto_busy_share",
        "gauge",
        default=0.0,
        agg="mean",
    )


#: The ``AutoStats`` counter of each in-band reason ``AutoPolicy.decide`` gives (``unmeasured``: ``auto_inline``).
_IN_BAND_COUNTER = {"reference": "auto_reference", "no_gain": "auto_no_gain", "unsaturated": "auto_unsaturated"}


@dataclass
class AutoPolicy:
    """How ``auto`` answers each batch: in-band, the sync mode's path, or deferred, the pipelined mode's.

    Every in-band batch measures the **overlap bound** ``cycle / (cycle - device wait)`` (moving
    average), the most a deferral could add; under ``bound_min`` every batch is in-band. Above it the
    host's clock (``clock``, the same for every instance) cuts time into periods of ``period_s``, each
    starting with an in-band reference window and, when that window found the instance saturated
    (``busy_min`` or ``fill_min``), a deferred probe window of ``window_s``; the rest of the period is
    deferred when the probe **gained** ``gain_min`` (``reference / probe`` cycle per request) or, from
    ``bound_high``, unless it measured a **loss** (``gain < 1 / gain_min``), skipping the windows of the
    next 1, 2, 4 ... ``max_skip`` periods; under ``bound_high`` a loss quiets as many periods (in-band).
    Why each rule, and the runs that set it: docs/LAB.md, "The auto policy: why each rule".

    Attributes:
        bound_min: The overlap bound from which deferring is considered (1: as soon as measured).
        bound_high: The overlap bound from which a saturated instance defers unless its probe
            measured a loss (below it, only when the probe measured a gain).
        gain_min: The measured gain from which the rest of a period is deferred (0: no probe, and
            no saturation, needed: deferred whenever the bound allows).
        period_s: Length of a period (reference window, probe window, then the decision).
        window_s: Length of the reference window and of the probe window.
        min_batches: Batches each window must measure for a decision to defer (4: a model whose
            full batch takes 90 ms still gives that many in the measured 0.375 s of a window).
        fill_min: Mean batch fill (items over the largest batch) of the reference window from
            which the instance counts as saturated and probes.
        busy_min: Share of the reference window's cycles spent inside ``execute()`` from which
            the instance counts as saturated and probes (either this or ``fill_min`` will do).
        max_skip: Most periods a high-bound deferral skips the windows of, and a loss under the high
            bound quiets.
        alpha: Weight of a new measurement in the bound's moving average.
        clock: Wall-clock seconds (the same on every process of the host).
        bound: The measured overlap bound (moving average); None until an in-band batch measured it.
        gain: The last period's measured gain; None until one was measured.
        busy: The last reference window's busy share; None until one was judged.
        gap_s: The gap before the current ``execute()`` (``between``).
        stats: The policy's counters (``choose``, ``ran`` and ``deferred`` count, and time themselves).
    """

    bound_min: float = 1.4
    bound_high: float = 1.5
    gain_min: float = 1.15
    period_s: float = 10.0
    window_s: float = 0.5
    min_batches: int = 4
    fill_min: float = 0.5
    busy_min: float = 0.7
    max_skip: int = 32
    alpha: float = 0.1
    clock: Callable[[], float] = time.time
    bound: float | None = None
    gain: float | None = None
    busy: float | None = None
    gap_s: float = 0.0
    stats: AutoStats = field(default_factory=AutoStats)
    _period: int = -1
    _window: str = ""
    _counts: bool = False
    _tallies: dict[str, _Tally] = field(default_factory=dict)
    _defer_rest: bool | None = None
    _saturated: bool | None = None
    _streak: int = 0
    _skip_until: float = -math.inf  # the first period that probes again after a skip
    _quiet_streak: int = 0
    _quiet_until: float = -math.inf  # under bound_high, the first period that probes again after a measured loss
    _at: float = 0.0  # where in its period the clock was at the last decision
    _probe_at: float = 0.0  # where in the period the probe window starts (window_s, or earlier from the high bound)
    _watch: _Tally = field(default_factory=_Tally)  # an unsaturated period's in-band batches since _watch_from
    _watch_from: float = 0.0

    def __post_init__(self) -> None:
        if self.period_s < 2 * self.window_s or self.window_s <= 0:
            raise ValueError(
                f"period_s={self.period_s}, window_s={self.window_s}: a period holds two windows "
                "(period >= 2 x window > 0)"
            )

    def between(self, gap_s: float) -> None:
        """The execute thread spent ``gap_s`` between the previous ``execute()``'s return and this one."""
        self.gap_s = max(0.0, gap_s)

    def _where(self) -> str:
        """Which window the clock is in (``reference``, ``probe``, ``rest``, ``skip``); a new period resets the sums."""
        t = self.clock()
        period = int(t // self.period_s)
        at = t - period * self.period_s
        self._at = at
        if period != self._period:
            if period < self._period:  # the clock stepped back: forget the skips it would stretch
                self._skip_until, self._streak = -math.inf, 0
                self._quiet_until, self._quiet_streak = -math.inf, 0
            self._period = period
            self._tallies = {"reference": _Tally(), "probe": _Tally()}
            self._defer_rest = None
            self._saturated = None
            self._probe_at = self.window_s
            self._watch = _Tally()
        if period < self._skip_until:
            self._counts = False
            return "skip"
        window = "reference" if at < self._probe_at else "probe" if at < self._probe_at + self.window_s else "rest"
        start = 0.0 if window == "reference" else self._probe_at
        self._counts = window != "rest" and at - start >= self.window_s / 4
        return window

    def _saturated_by(self, tally: _Tally) -> bool:
        """Whether a window's in-band batches show a saturated instance (``busy_min`` or ``fill_min``)."""
        full = tally.fill >= self.fill_min * tally.batches
        busy = self.busy_min < 1.0 and tally.busy() >= self.busy_min  # busy_min 1: by fill alone
        return tally.batches >= self.min_batches and (full or busy)

    def _is_high(self) -> bool:
        """Whether the measured bound reached ``bound_high``."""
        return self.bound is not None and self.bound >= self.bound_high

    def _loss_under(self) -> float:
        """The gain under which a probe measured a loss: 1 / ``gain_min`` (with ``gain_min`` under 1: ``gain_min``)."""
        return min(self.gain_min, 1.0 / self.gain_min)

    def _high_and_no_loss(self) -> bool:
        """From ``bound_high``, with no loss measured by the last probe (the rule that defers by default)."""
        if not self._is_high() or self.gain_min <= 0:
            return False
        return self.gain is None or self.gain >= self._loss_under()

    def inline(self) -> bool:
        """Whether the next batch takes the fast in-band path (``decide``'s ``inline``): bound under ``bound_min``.

        No window can defer under ``bound_min`` (a skip follows a deferral from ``bound_high``, and a skipped
        period measures no bound), so the clock's windows are not read and ``ran`` counts nothing; a bound that
        rises to ``bound_min`` mid-period finds that period's reference window uncounted (unsaturated: in-band
        until the next period's window measures it).
        """
        if self.bound is not None and self.bound < self.bound_min:
            self._window = ""
            return True
        return False

    def choose(self) -> bool:
        """Whether to defer the next batch (``inline``'s fast path, else ``decide``), counted by its reason."""
        t0 = time.perf_counter()
        st = self.stats
        if self.inline():
            st.auto_inline += 1
        else:
            defer, why = self.decide()
            st.auto_gain = self.gain or 0.0
            st.auto_busy = self.busy or 0.0
            if defer:
                st.auto_policy_s += time.perf_counter() - t0
                return True
            counter = _IN_BAND_COUNTER.get(why, "auto_inline")
            setattr(st, counter, getattr(st, counter) + 1)
        st.auto_policy_s += time.perf_counter() - t0
        return False

    def decide(self) -> tuple[bool, str]:
        """Whether to defer the next batch.

        Returns:
            The decision and its reason: in-band ``reference`` (the period's reference window),
            ``unmeasured``, ``inline`` (bound under ``bound_min``, in any window: the fast path, which
            reads no clock and counts nothing), ``unsaturated`` (the reference
            window under ``busy_min`` and ``fill_min``) or ``no_gain`` (the probe did not gain
            ``gain_min``, or from ``bound_high`` measured a loss, or measured too few batches; or a
            period quieted by a loss under ``bound_high``);
            deferred ``probe`` or ``deferred`` (also every batch of a skipped period).
        """
        if self.inline():
            return False, "inline"
        self._window = self._where()
        if self._window == "skip":
            return True, "deferred"
        if self._period < self._quiet_until and not self._is_high():
            return False, "no_gain"  # a probe under bound_high measured a loss: in-band, no window, for a while
        if self._window == "reference":
            return False, "reference"
        if self.bound is None:
            return False, "unmeasured"
        if self.gain_min <= 0:
            return True, "deferred"
        if self._saturated is None:
            ref = self._tallies["reference"]
            self.busy = ref.busy()
            self._saturated = self._saturated_by(ref)
            if not self._saturated:
                self._streak = 0
        if not self._saturated:
            return False, "unsaturated"
        if self._window == "probe" and self._defer_rest is None:
            return True, "probe"
        if self._defer_rest is None:
            self._defer_rest = self._judge()
        return (True, "deferred") if self._defer_rest else (False, "no_gain")

    def _judge(self) -> bool:
        """Whether the rest of the period is deferred: a gain of ``gain_min`` under ``bound_high``, no loss from it."""
        high = self._is_high()
        ref, probe = self._tallies["reference"], self._tallies["probe"]
        measured = ref.requests and probe.requests and probe.cycle_s
        # the probe's batches a decision needs: min_batches below the high bound; from it one will do (a
        # deferred path too slow to finish min_batches in the window is the loss the rule looks for)
        enough = ref.batches >= self.min_batches and probe.batches >= (1 if high else self.min_batches)
        if not enough or not measured:
            defer = False
        else:
            self.gain = ref.per_request_s() / probe.per_request_s()
            defer = self.gain >= (self._loss_under() if high else self.gain_min)
        # from the high bound, a deferring period skips the windows of the next ones: 1, 2, 4 ... max_skip;
        # the count goes on only from the period its last skip ended at (not across idle or in-band ones)
        follows = self._period == self._skip_until
        self._streak = min(self._streak + 1 if follows else 1, 64) if defer and high else 0
        if self._streak:
            self._skip_until = self._period + 1 + min(2 ** (self._streak - 1), self.max_skip)
        # under the high bound, a measured loss quiets the next 1, 2, 4 ... max_skip periods (in-band, no window):
        # each probe that loses costs its window's batches and the queue they leave behind
        lost = not high and self.gain is not None and bool(enough and measured) and self.gain < self._loss_under()
        follows = self._period == self._quiet_until
        self._quiet_streak = min(self._quiet_streak + 1 if follows else 1, 64) if lost else 0
        if self._quiet_streak:
            self._quiet_until = self._period + 1 + min(2 ** (self._quiet_streak - 1), self.max_skip)
        return defer

    def _count(self, window: str, cycle_s: float, execute_s: float, requests: int, fill: float) -> None:
        if self._counts and self._window == window and requests > 0:
            self._tallies[window].add(cycle_s, execute_s, requests, fill)

    def ran(self, execute_s: float, wait_s: float, requests: int = 1, fill: float = 1.0) -> None:
        """An in-band ``execute()`` of ``requests`` took ``execute_s``, ``wait_s`` of it waiting for the device.

        ``fill`` is the batch's items over the largest batch the instance takes.
        """
        t0 = time.perf_counter()
        self._ran(execute_s, wait_s, requests, fill)
        self.stats.auto_bound = self.bound or 0.0
        self.stats.auto_policy_s += time.perf_counter() - t0

    def _ran(self, execute_s: float, wait_s: float, requests: int, fill: float) -> None:
        cycle = self.gap_s + execute_s
        if cycle <= 0:
            return
        sample = cycle / max(cycle - min(wait_s, cycle), 1e-9)
        self.bound = sample if self.bound is None else self.bound + self.alpha * (sample - self.bound)
        if not self._window:  # decided on the fast in-band path (or not decided): no window to count in
            return
        self._count("reference", cycle, execute_s, requests, fill)
        if self._window == "skip" or not self._high_and_no_loss():
            return
        w = self.window_s
        if self._window == "reference":
            # from the high bound an in-band reference window above the in-band capacity builds a queue: it
            # ends once it has measured a saturated instance (min_batches after its first quarter)
            if self._probe_at == w and self._counts and self._saturated_by(self._tallies["reference"]):
                self._probe_at = max(self._at, w / 4)
        elif self._saturated is False and requests > 0:
            # an unsaturated period whose load rose: the rest is deferred once window_s of in-band batches
            # shows a saturated instance (the next period's probe measures the gain)
            if self._watch.batches == 0:
                self._watch_from = self._at
            self._watch.add(cycle, execute_s, requests, fill)
            if self._at - self._watch_from >= w:
                if self._saturated_by(self._watch):
                    self._saturated, self._defer_rest, self.busy = True, True, self._watch.busy()
                self._watch = _Tally()

    def deferred(self, execute_s: float, requests: int) -> None:
        """A deferring ``execute()`` of ``requests`` returned after ``execute_s``."""
        t0 = time.perf_counter()
        self.stats.auto_deferred += 1
        self.stats.deferred_requests += requests
        self._count("probe", self.gap_s + execute_s, execute_s, requests, 0.0)
        self.stats.auto_policy_s += time.perf_counter() - t0
