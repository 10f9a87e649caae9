"""The JSON document of an A/B run: what was run where, every window's record and a summary per variant."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import importlib.metadata
import json
import logging
import math
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import inflight
from inflight.loadtest import cpu
from inflight.loadtest import openloop as ol
from inflight.loadtest import stats as st
from inflight.loadtest import workload as wl
from inflight.loadtest.runner.config import LOGGER_NAME, AbConfig, Endpoints, Variant, route_of
from inflight.loadtest.runner.fleet import ServerFleet
from inflight.loadtest.runner.plan import LOCUST_CPU_VISIBLE_S, LoadPlan
from inflight.loadtest.runner.window import rate_point
from inflight.server import control

LOGGER = logging.getLogger(LOGGER_NAME)

SCHEMA = "inflight-ab/1"


def document(
    *,
    run_id: str,
    started: str,
    data: Path,
    config: AbConfig,
    variants: Sequence[Variant],
    plan: LoadPlan,
    fleet: ServerFleet,
    endpoints: Sequence[Endpoints],
    runs: list[dict[str, Any]],
    started_server: bool,
) -> dict[str, Any]:
    """The run's JSON document (the servers' exits and logs are added later): every window, a summary per variant.

    Args:
        run_id: ``ab-<timestamp>``.
        started: When the run started (ISO 8601).
        data: The run's data folder.
        config: The run's configuration.
        variants: The variants, in order.
        plan: The load plan.
        fleet: The servers.
        endpoints: Where the load went.
        runs: Every window's record, in the order measured (their ``_latencies`` are taken out).
        started_server: Whether the runner started the server(s).
    """
    s = config.shape
    summary = []
    for v in variants:
        mine = [r for r in runs if r["variant"] == v.label]
        lat = np.concatenate([r.pop("_latencies") for r in mine]) if mine else np.empty(0)
        rps = [r["locust"]["rps"] for r in mine if r.get("locust")]
        breakdowns = [st.ServerBreakdown(**r["server"]) for r in mine if r.get("server")]
        samples = [x for r in mine for x in r["gpu_samples"]]
        requests = sum(r["locust"]["requests"] for r in mine if r.get("locust"))
        failures = sum(r["locust"]["failures"] for r in mine if r.get("locust"))
        mean_rps = float(np.mean(rps)) if rps else math.nan
        entry_open: dict[str, Any] = {}
        if plan.open_loop:
            entry_open = open_loop_summary(mine, config)
            lat = np.empty(0)  # latencies pooled across offered rates mean nothing: see the sweep
        summary.append(
            {
                "variant": v.label,
                "spec": v.spec,
                "model_name": v.name,
                "runs": len(mine),
                "valid": all(r["valid"] for r in mine),
                "client_limited": any(r.get("client_limited") for r in mine),
                "rps": mean_rps,
                "rps_runs": rps,
                "items_per_s": mean_rps * s.items,
                "requests": requests,
                "failures": failures,
                "latency_ms": st.latency_summary(lat),
                "server": st.sum_breakdowns(breakdowns).to_dict() if breakdowns else None,
                "gpu_activity": st.summarize_gauge([x.get("gpu_activity") for x in samples]),
                "sync_share": st.summarize_gauge([x.get("sync_share") for x in samples]),
                "cpu": cpu.combine(
                    [r.get("cpu") or {} for r in mine], [(r.get("server") or {}).get("requests") or 0 for r in mine]
                ),
                **entry_open,
                **({"route": route_of(v, config)} if fleet.plans else {}),
            }
        )
    problems = [f"{r['variant']} round {r['round']}: {p}" for r in runs for p in r["problems"]]
    caveats = [f"{r['variant']} round {r['round']}: {c}" for r in runs for c in r.get("caveats", [])]
    return {
        "schema": SCHEMA,
        "id": run_id,
        "started": started,
        "finished": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": device_info(),
        "host": {"hostname": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "versions": versions(endpoints[0].http),
        "server": fleet.block(endpoints, runs, started_server),
        "preset": config.preset,
        "load": {
            **s.to_dict(),
            "repeat": config.repeat,
            "closed_loop": not plan.open_loop,
            "open_loop": (
                {
                    "rates": list(config.rates),
                    "search": list(config.search) if config.search else None,
                    "slo_p99_ms": config.slo_ms,
                    "rate_tolerance": ol.RATE_TOLERANCE,
                    "search_tolerance": config.search_tolerance,
                    "search_steps": config.search_steps,
                    "late_threshold_ms": ol.LATE_THRESHOLD_MS,
                    "limit_late_ms": ol.LIMIT_LATE_MS,
                    "check_every": s.check_every,
                    "max_late_fraction": ol.MAX_LATE_FRACTION,
                    "latency_from": "the scheduled send time (a late send counts its lateness)",
                }
                if plan.open_loop
                else None
            ),
            "cpu_sets": fleet.cpu_sets.to_dict(),
            "user_class": plan.user_class,
            "generator": plan.generator,
            "locust_run_time_s": math.ceil(s.window_s + s.ramp_s),
            "order": [f"{r['variant']}{r['round']}" for r in runs],
        },
        "variants": [
            {
                "label": v.label,
                "spec": v.spec,
                "model_name": v.name,
                "model": v.config.spec.name,
                "variant": v.config.variant,
                "overrides": v.overrides,
                "config": json.loads(v.config.to_json()),
                **({"route": route_of(v, config)} if fleet.plans else {}),
                **({"rates": list(v.rates)} if v.rates else {}),
                **(
                    {
                        "ensemble": {
                            "encoder": v.config.model_name,
                            "steps": {name: json.loads(c) for name, c in v.ensemble.steps},
                        }
                    }
                    if v.ensemble is not None
                    else {}
                ),
            }
            for v in variants
        ],
        "percentiles": (
            "exact nearest-rank percentiles of the raw per-request latencies (float64 ms) written by every "
            "Locust process, counted from the end of spawning; Locust's own percentiles are rounded"
        ),
        "notes": document_notes(config, variants, fleet),
        "runs": runs,
        "summary": summary,
        "valid": not problems,
        "problems": problems,
        "caveats": caveats,
        "data_dir": str(data),
    }


def open_loop_summary(records: Sequence[Mapping[str, Any]], config: AbConfig) -> dict[str, Any]:
    """Sweep, capacity at the SLO and whether the generator kept up, for one variant's windows."""
    rows = open_loop_points(records)
    return {
        "sweep": rows,
        "soak": soak_summary(records) if config.rate_repeat > 1 else None,
        **capacity_fields(rows, config.slo_ms),
    }


def capacity_fields(rows: Sequence[Mapping[str, Any]], slo_ms: float) -> dict[str, Any]:
    """A variant summary's capacity keys, from its sweep rows (:func:`open_loop_points`).

    ``capacity_rps`` and ``capacity_upper_rps`` are :func:`capacity_of_rows`'; ``capacity_point`` (and ``rps``,
    ``latency_ms``) the window at the capacity of the median p99 over the rounds. The lab recomputes these keys
    with this function for files written before the rounds were taken apart.
    """
    capacity, upper = capacity_of_rows(rows, slo_ms)

    def p99(row: Mapping[str, Any]) -> float:
        v = float(row.get("p99_ms", math.nan))
        return v if math.isfinite(v) else math.inf

    at = sorted((row for row in rows if capacity is not None and row["offered_rps"] == capacity), key=p99)
    point = at[(len(at) - 1) // 2] if at else None
    limited = [row["offered_rps"] for row in rows if row["generator_limited"]]
    return {
        "capacity_rps": capacity,
        "capacity_upper_rps": upper,
        "capacity_bounded": upper is not None,
        "capacity_point": point,
        "generator_limited_rates": limited,
        # a ratio between variants is valid only where the generator kept its schedule up to the capacity
        "comparable": capacity is not None and not any(x <= capacity for x in limited),
        "rps": point["achieved_rps"] if point else math.nan,
        "latency_ms": ({"p50": point["p50_ms"], "p95": point["p95_ms"], "p99": point["p99_ms"]} if point else {}),
    }


def document_notes(config: AbConfig, variants: Sequence[Variant], fleet: ServerFleet) -> list[str]:
    """The document's notes: how to read its figures (servers per GPU, Locust's CPU warning, --check)."""
    from inflight.loadtest.report import deployment_line

    notes = []
    if fleet.plans:
        notes.append(
            f"One tritonserver per GPU ({deployment_line(fleet.plans_dict())}): every variant was loaded on each "
            "server with the same config, and the generator's sources were spread over the servers (source i "
            "sent to server i mod n), so each server got about 1/n of the offered rate. Triton's statistics and "
            "request counters, the CPU figures, the stubs' memory and the executor counters are summed over the "
            "servers; the GPU gauges are means over every server's instances."
        )
    if fleet.front is not None:
        notes.append(
            f"A load balancer in front of the servers ({fleet.front.plan.kind}, round robin, keep-alive connections "
            f"to every server; on {fleet.front.plan.rule}): a variant's route says where its load went: 'balancer' "
            "(every request to the balancer's one endpoint, which spread them over the servers), 'direct' (the "
            "generator's sources spread over the servers as above) or 'gpu<N>' (the server of GPU N alone: one GPU "
            "and its share of the server cores; the other servers idle). Each window's balancer_cpu gives the cores "
            "nginx kept busy and its CPU microseconds per request; the same spec through the balancer and direct "
            "(they share one load of the model) shows the balancer's own cost."
        )
    if config.shape.window_s + config.shape.ramp_s < LOCUST_CPU_VISIBLE_S:
        notes.append(
            f"Locust samples its own CPU every 10 s and its first sample is only a baseline, so a "
            f"{config.shape.window_s:g} s window cannot show its 'CPU usage above 90%' warning; only windows of "
            f"{LOCUST_CPU_VISIBLE_S:g} s or more are checked for a Locust-bound run."
        )
    if config.shape.check:
        notes.append(
            "--check compared every response with the model run in PyTorch on the CPU (fp32): "
            + ", ".join(
                f"{m}: rtol {t.rtol:g}, atol {t.atol:g}{' x max|ref|' if t.scale_by_max else ''}"
                for m, t in sorted({v.config.spec.name: wl.tolerance_for(v.name) for v in variants}.items())
            )
            + "."
        )
    return notes


def device_info() -> dict[str, Any]:
    """The GPU (name, driver, memory) from nvidia-smi, or ``{"name": "cpu"}`` without one."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run(
                [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            gpus = [
                dict(zip(("name", "driver", "memory"), (x.strip() for x in line.split(",")), strict=False))
                for line in r.stdout.strip().splitlines()
            ]
            if gpus:
                return {"name": gpus[0]["name"], "driver": gpus[0].get("driver"), "gpus": gpus}
        except (OSError, subprocess.SubprocessError) as e:
            LOGGER.warning("nvidia-smi failed (%s); recording the device as cpu", e)
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"name": "cpu", "driver": None, "cpu_model": cpu, "cpus": os.cpu_count()}


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (None when it is not installed)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions(http_url: str | None) -> dict[str, str | None]:
    """Versions of tritonserver (asked from the server), locust, torch, inflight and friends."""
    server: str | None = None
    if http_url:
        client = control.http_client(http_url)
        try:
            server = str(client.get_server_metadata().get("version"))
        except Exception as e:  # any client failure: the version is then unknown, not fatal
            LOGGER.warning("could not ask %s for its version: %s", http_url, e)
        finally:
            client.close()
    return {
        "tritonserver": server,
        "locust": package_version("locust"),
        "torch": package_version("torch"),
        "inflight": inflight.__version__,
        "tritonclient": package_version("tritonclient"),
        "numpy": package_version("numpy"),
        "python": platform.python_version(),
    }


_SERVED = re.compile(r"\[inflight\.runtime\.triton_model\] (\S+) \((\S+)\): (.*? mode.*?ready in [0-9.]+ s)")


def attach_served(doc: dict[str, Any], log: str) -> None:
    """Record under each variant what its instances said they serve with, from the server log.

    Mode, engine, device, precision and graphs as they served, where the config only says what was
    asked for (a CPU instance runs fp32 without CUDA graphs whatever ``precision`` and ``cuda_graphs`` say).
    """
    served: dict[str, list[str]] = {}
    for m in _SERVED.finditer(log):
        line = f"{m.group(2)}: {m.group(3)}"
        if line not in served.setdefault(m.group(1), []):
            served[m.group(1)].append(line)
    for v in doc.get("variants", []):
        v["served"] = served.get(v["model_name"], [])


def capacity_of_rows(rows: Sequence[Mapping[str, Any]], slo_ms: float) -> tuple[float | None, float | None]:
    """Capacity at the SLO and the lowest rate missed above it, from a variant's sweep rows (each round apart).

    The rows are :func:`open_loop_points`' (a window's :class:`~inflight.loadtest.openloop.RatePoint` and its
    round), as written in the run document's ``sweep``: :func:`~inflight.loadtest.openloop.capacity_over_rounds`.
    """
    names = [f.name for f in dataclasses.fields(ol.RatePoint)]
    rounds: dict[Any, list[ol.RatePoint]] = {}
    for row in rows:
        rounds.setdefault(row.get("round"), []).append(ol.RatePoint(**{k: row[k] for k in names if k in row}))
    return ol.capacity_over_rounds(list(rounds.values()), slo_ms)


def open_loop_points(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The sweep of one variant: a row per open-loop window, by offered rate (JSON-ready)."""
    rows = []
    for r in records:
        if r.get("rate") is None:
            continue
        p = rate_point(r)
        rows.append(
            {
                **p.to_dict(),
                "round": r.get("round"),
                "generator_limited": bool(r.get("generator_limited")),
                "slo_misses": list(r.get("slo_misses") or []),
                "avg_batch_requests": (r.get("server") or {}).get("avg_batch_requests"),
                "avg_batch_items": (r.get("server") or {}).get("avg_batch_items"),
                "server_cores": (r.get("cpu") or {}).get("server_cores"),
                "server_us_per_request": (r.get("cpu") or {}).get("server_us_per_request"),
                "host_busy": (r.get("cpu") or {}).get("host_busy"),
                "host_steal": (r.get("cpu") or {}).get("host_steal"),
                "client_busy": (r.get("cpu") or {}).get("client_busy"),
                "generator": r.get("generator"),
            }
        )
    return sorted(rows, key=lambda x: (x["offered_rps"], x.get("round") or 0))


#: A soak's p99 is steady when its last window is within this fraction of its first.
SOAK_P99_TOLERANCE = 0.20
#: A soak's stub memory is flat when its last reading is within this fraction of its first.
SOAK_MEMORY_TOLERANCE = 0.05


def soak_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Consecutive windows at one rate: failures, p99 first vs last window, stub memory first vs last.

    Windows are taken in the order they ran, per offered rate (the first rate with more than one window).
    """
    by_rate: dict[float, list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("rate") is not None:
            by_rate.setdefault(float(r["rate"]), []).append(r)
    runs = next((rs for rs in by_rate.values() if len(rs) > 1), None)
    if runs is None:
        return None
    points = [rate_point(r) for r in runs]
    first, last = points[0], points[-1]
    mem = [int((r.get("stub_memory") or {}).get("rss_bytes") or 0) for r in runs]
    p99_change = last.p99_ms / first.p99_ms - 1.0 if first.p99_ms > 0 else math.nan
    mem_change = mem[-1] / mem[0] - 1.0 if mem[0] > 0 else math.nan
    failures = sum(p.failures for p in points)
    return {
        "rate": first.offered_rps,
        "windows": len(runs),
        "window_s": [round(float((r.get("generator") or {}).get("span_s") or math.nan), 1) for r in runs],
        "failures": failures,
        "p99_ms": [p.p99_ms for p in points],
        "achieved_rps": [p.achieved_rps for p in points],
        "stub_rss_bytes": mem,
        "p99_change": p99_change,
        "stub_rss_change": mem_change,
        "p99_steady": bool(abs(p99_change) <= SOAK_P99_TOLERANCE),
        "memory_flat": bool(abs(mem_change) <= SOAK_MEMORY_TOLERANCE),
        "passed": bool(
            failures == 0 and abs(p99_change) <= SOAK_P99_TOLERANCE and abs(mem_change) <= SOAK_MEMORY_TOLERANCE
        ),
    }


def finite(obj: Any) -> Any:
    """The document with NaN/inf replaced by None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj
