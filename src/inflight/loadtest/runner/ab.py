"""The A/B run in order: :class:`AbRunner` runs every round and variant and writes the document and the report."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inflight.errors import ConfigError
from inflight.loadtest import cpu
from inflight.loadtest import openloop as ol
from inflight.loadtest import stats as st
from inflight.loadtest import workload as wl
from inflight.loadtest.runner.config import (
    LOGGER_NAME,
    AbConfig,
    Endpoints,
    Variant,
    load_groups,
    resolve_variants,
    round_order,
    route_of,
)
from inflight.loadtest.runner.document import attach_served, document, finite
from inflight.loadtest.runner.fleet import ServerFleet
from inflight.loadtest.runner.plan import LoadPlan, cpu_sets_for, run_locust
from inflight.loadtest.runner.window import WindowMeter, rate_point

LOGGER = logging.getLogger(LOGGER_NAME)


class _TermAsExit:
    """While alive, SIGTERM (e.g. from ``timeout``) raises SystemExit, so the runner's cleanup runs.

    The server is then stopped and its log copied next to the results instead of being lost.
    """

    def __init__(self) -> None:
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._raise)

    @staticmethod
    def _raise(signum: int, frame: object) -> None:
        LOGGER.warning(
            "SIGTERM: stopping the A/B run and the server; the windows measured so far go to interrupted-ab-*.json"
        )
        raise SystemExit(128 + signum)

    def restore(self) -> None:
        """Put the previous SIGTERM handler back."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


class AbRunner:
    """Runs an ``AbConfig`` and writes its JSON and report (see the package docstring).

    Attributes:
        config: The configuration (checked when it was made).
        shape: The load shape.
        variants: The variants, labelled A, B, ...
        plan: The load plan (closed or open loop, which generator), decided once.
        fleet: The servers.
        meter: Measures the windows.
        run_id: ``ab-<timestamp>``.
        started: When the run was made (ISO 8601).
        out: The results folder.
        data: The run's data folder in it.
    """

    def __init__(self, config: AbConfig) -> None:
        """Resolve the variants, decide the load plan and plan the servers.

        Raises:
            ConfigError: for bad variants, a check on the null model, a missing Locust file, or cores or
                GPUs that do not fit.
            ServerError: when a variant's config.pbtxt is missing (build the repository first).
        """
        self.config = config
        self.shape = config.shape
        self.variants = resolve_variants(config.variants, config.repository)
        nulls = [v.spec for v in self.variants if v.config.variant == "null"]
        if self.shape.check and nulls:
            raise ConfigError(
                f"--check compares responses with the model, but {', '.join(nulls)} is the null control model "
                "(it answers zeros); drop --check or the null variant"
            )
        ensembles = [v.spec for v in self.variants if v.ensemble is not None]
        if ensembles and self.shape.token_dist != "text":
            raise ConfigError(
                f"{', '.join(ensembles)} is an ensemble that takes text (its tokenizer makes the token ids); add "
                "--token-dist text"
            )
        self.plan = LoadPlan(config)
        now = dt.datetime.now()
        self.run_id = f"ab-{now:%Y%m%d-%H%M%S}"
        self.started = now.astimezone().isoformat(timespec="seconds")
        self.out = config.out
        self.data = self.out / self.run_id
        self.fleet = ServerFleet(config, self.variants, cpu_sets_for(config), self.data)
        self.meter = WindowMeter(config, self.plan, self.fleet, self.data)

    @property
    def open_loop(self) -> bool:
        """True when the load is open loop (see :class:`LoadPlan`)."""
        return self.plan.open_loop

    @property
    def json_path(self) -> Path:
        """``<out>/ab-<timestamp>.json``."""
        return self.out / f"{self.run_id}.json"

    def run(self) -> Path:
        """Run every round and variant; write the JSON and the report.

        Returns:
            The JSON path.

        Raises:
            ServerError: when the server cannot be started or reached, or a variant fails to load.
        """
        from inflight.loadtest import report

        self.data.mkdir(parents=True, exist_ok=True)
        pools = self._prepare_pools()
        # the server's backend folder (a copy of the Python backend) stays out of the results
        workdir = tempfile.TemporaryDirectory(prefix="inflight-ab-server-")
        stop_on_term = _TermAsExit()
        own_cores = cpu.run_cores()
        if self.fleet.cpu_sets.client:
            # this runner and every Locust process it starts run on the generator's cores
            os.sched_setaffinity(0, self.fleet.cpu_sets.client)
        LOGGER.info("CPU sets: %s", self.fleet.cpu_sets.to_dict())
        runs: list[dict[str, Any]] = []
        interrupted: BaseException | None = None
        try:
            if self.config.url is None:
                self.fleet.start(Path(workdir.name))
            endpoints = self.fleet.endpoints()
            try:
                self._run_all(endpoints, pools, runs)
            except (SystemExit, KeyboardInterrupt) as e:
                if not runs:
                    raise
                interrupted = e
                LOGGER.warning("interrupted: stopping the servers, then writing the %d windows measured", len(runs))
            doc = document(
                run_id=self.run_id,
                started=self.started,
                data=self.data,
                config=self.config,
                variants=self.variants,
                plan=self.plan,
                fleet=self.fleet,
                endpoints=endpoints,
                runs=runs,
                started_server=bool(self.fleet.servers),
            )
        finally:
            try:
                exits = self.fleet.stop()
            finally:
                workdir.cleanup()
                stop_on_term.restore()
                if self.fleet.cpu_sets.client:
                    os.sched_setaffinity(0, own_cores)
                if not self.config.keep_raw:  # the pools are reproducible from the seed
                    for path in pools.values():
                        path.unlink(missing_ok=True)
        if self.fleet.servers:
            self.fleet.attach_exits(doc, exits)
            # the backend logs its own counters when a variant is unloaded: where its time went
            texts = []
            for ex in exits:
                with contextlib.suppress(OSError):
                    texts.append((self.data / ex["log"]).read_text(errors="replace"))
            if texts:
                # one text per server: each server's log holds its own instances' records of every run
                n = st.attach_executor_stats(doc, texts[0] if len(texts) == 1 else texts)
                LOGGER.info("executor counters from the server log: %d of %d runs", n, len(doc["runs"]))
                attach_served(doc, "\n".join(texts))
        if interrupted is not None:
            # not a result: the plan was not carried out (no report, and a name the result readers do not glob)
            # a variant's run in a round is one window at each rate (or search step): count what finished in those
            done = len({(r["variant"], r["round"]) for r in runs})
            planned = len(round_order(self.variants, self.config.repeat))
            doc["interrupted"] = {"variant_runs": done, "planned_variant_runs": planned, "windows": len(runs)}
            doc["valid"] = False
            doc["problems"] = [
                *doc["problems"],
                f"interrupted after {done} of {planned} variant runs ({len(runs)} window(s))",
            ]
            path = self.json_path.with_name(f"interrupted-{self.json_path.name}")
            path.write_text(json.dumps(finite(doc), indent=1, allow_nan=False) + "\n")
            LOGGER.warning("wrote the windows measured before the interruption to %s", path)
            raise interrupted
        self.json_path.write_text(json.dumps(finite(doc), indent=1, allow_nan=False) + "\n")
        LOGGER.info("wrote %s", self.json_path)
        report.write_report(self.json_path)
        return self.json_path

    # -- set-up -----------------------------------------------------------------------------

    def _prepare_pools(self) -> dict[str, Path]:
        """One request pool per base model, shared by every variant of that model and every process."""
        pools: dict[str, Path] = {}
        s = self.shape
        for v in self.variants:
            base = v.config.spec.name
            if base in pools:
                continue
            # a model that is not built in travels as its config (in the pool file, to every generator process)
            w = dataclasses.replace(wl.Workload.of(v.name, s), config=wl.variant_config(v.config))
            path = self.data / f"pool-{base}.npz"
            wl.save_pool(wl.build_pool(w, repository=self.config.repository, check=s.check), path)
            pools[base] = path
        return pools

    # -- the runs ---------------------------------------------------------------------------

    def _run_all(self, endpoints: Sequence[Endpoints], pools: dict[str, Path], runs: list[dict[str, Any]]) -> None:
        """Every round and variant on ``endpoints`` (one server or one per GPU); each window's record into ``runs``.

        Consecutive variants of a round that differ only in where their load goes (``via=``) share one
        load of the model (:func:`~inflight.loadtest.runner.config.load_groups`). ``runs`` holds every
        finished group's records also when an interruption ends the loop.
        """
        order = round_order(self.variants, self.config.repeat)
        self.meter.planned_total = self.plan.planned_per_variant_s() * len(order)
        self.meter.t0 = time.monotonic()
        done = 0
        for group in load_groups(order, self.config):
            runs.extend(self._run_group(group, done, len(order), endpoints, pools))
            done += len(group)
            self.meter.planned_total = (time.monotonic() - self.meter.t0) / done * len(order)

    def _run_group(
        self,
        group: Sequence[tuple[int, Variant]],
        first: int,
        total: int,
        endpoints: Sequence[Endpoints],
        pools: dict[str, Path],
    ) -> list[dict[str, Any]]:
        """Load the group's model, measure each of its variants in turn, unload it: one record per window.

        The unload's figures go on the group's last record; every record of a shared load names the
        variants that shared it (``load_shared``).
        """
        rnd, head = group[0]
        tag = f"{head.label}-r{rnd + 1}"
        stalls: list[str] = []
        records: list[dict[str, Any]] = []
        unload: dict[str, Any] = {}
        load_s = self.fleet.load(endpoints, head)
        try:
            for k, (r, v) in enumerate(group):
                LOGGER.info(
                    "run %d/%d: %s = %s (round %d of %d)%s",
                    first + k + 1,
                    total,
                    v.label,
                    v.spec,
                    r + 1,
                    self.config.repeat,
                    f", load going to {route_of(v, self.config)}" if self.fleet.plans else "",
                )
                records += self._measure(v, r, first + k, total, endpoints, pools[v.config.spec.name], load_s)
        finally:
            unload = self.fleet.unload(head, tag, endpoints, stalls)
        if records:
            records[-1].update(unload)
        for rec in records:
            if len(group) > 1:
                rec["load_shared"] = [v.label for _, v in group]
            rec["caveats"] += [
                f"{m}; the window itself was measured in full, but this variant's instances may have stayed loaded "
                "(idle) through the later windows on this server"
                for m in stalls
            ]
        return records

    def _measure(
        self,
        v: Variant,
        rnd: int,
        index: int,
        total: int,
        endpoints: Sequence[Endpoints],
        pool: Path,
        load_s: float,
    ) -> list[dict[str, Any]]:
        """Warm ``v`` up and measure its window(s) on the loaded model: one record per window.

        Closed loop: one window. Open loop: one window per rate (the variant's own ``rates=``, else
        ``--rate``), then the capacity search's windows (each record carries its ``rate``; the search's
        outcome goes on the last).
        """
        s = self.shape
        tag = f"{v.label}-r{rnd + 1}"
        records: list[dict[str, Any]] = []
        rates = v.rates or tuple(self.config.rates)
        targets = self.fleet.targets(v, endpoints)
        if s.warmup_s > 0:
            warm_shape = s.replace(rate=v.rates[0] if v.rates else self.plan.first_rate()) if self.open_loop else s
            LOGGER.info(
                "%s: warming up for %.0f s%s",
                tag,
                s.warmup_s,
                f" at {warm_shape.rate:,.0f} req/s" if self.open_loop else "",
            )
            warm_raw = self.data / f"{tag}-warmup-raw"
            warm = run_locust(
                self.plan.command(v, warm_shape, targets, pool, s.warmup_s + s.ramp_s, raw_dir=warm_raw),
                log=self.data / f"{tag}-warmup.log",
                planned_s=s.warmup_s + s.ramp_s,
            )
            if not self.config.keep_raw:
                shutil.rmtree(warm_raw, ignore_errors=True)
            warmup = {"returncode": warm.returncode, "wall_s": round(warm.wall_s, 1), "log": str(warm.log)}
            # what the warm-up sent and the generator gave up on at its stop is still answered after it: the first
            # window starts once it is (six text requests of a warm-up were still in the ensemble when the window's
            # statistics started, on a 2-core host on 2026-12-02, and its steps' windows disagreed by them)
            warmup["drain_s"] = self.fleet.drain(endpoints, v)
        else:
            warmup = None

        def window(rate: float | None) -> dict[str, Any]:
            n = len(records)
            wtag = tag if not self.open_loop else f"{tag}-w{n + 1}"
            rec = self.meter.measure(v, wtag, index, total, endpoints, pool, rate)
            rec.update({"variant": v.label, "round": rnd + 1, "model_name": v.name, "load_s": round(load_s, 2)})
            if self.fleet.plans:
                rec["route"] = route_of(v, self.config)
                rec["targets"] = [e.http for e in targets]  # where the generator sent
            if warmup is not None:
                rec["warmup"] = warmup
                if warmup["returncode"] not in (0, 1):
                    rec["problems"].append(
                        f"the warm-up Locust run exited with {warmup['returncode']} (log: {warmup['log']})"
                    )
                    rec["valid"] = False
            records.append(rec)
            return rec

        if not self.open_loop:
            window(None)
            return records
        for rate in rates:
            for _ in range(self.config.rate_repeat):
                window(rate)
        if self.config.search is not None:
            lo, hi = self.config.search
            capacity = ol.bisect_capacity(
                lambda rate: rate_point(window(rate)),
                lo,
                hi,
                slo_ms=self.config.slo_ms,
                rel_tol=self.config.search_tolerance,
                max_steps=self.config.search_steps,
            )
            if records:
                records[-1]["capacity_search"] = capacity.to_dict()
        return records


def run_ab(config: AbConfig) -> Path:
    """Run an A/B test; return the JSON path (the report is written next to it).

    Raises:
        ConfigError: for bad variants or load options.
        ServerError: when the server cannot be started or reached or a variant does not load.
    """
    return AbRunner(config).run()
