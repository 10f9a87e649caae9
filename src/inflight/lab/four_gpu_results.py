"""Four GPUs against one (issue 54): ``summary.json["four_gpu"]`` from the sittings of ``scripts/lab/four_gpu.sh``.

One sitting (``results/four-gpu/<date>-<device>``) holds the files of one device call:

* ``perserver/ab-*.json``: one tritonserver per GPU behind nginx (``--balancer nginx``), interleaved rounds of the
  model through the balancer (four GPUs), the same model ``via=gpu<N>`` (one GPU and its share of the cores),
  and the null model through the balancer and ``via=direct`` (the balancer's own cost; the generator on schedule);
* ``oneserver/ab-*.json``: one tritonserver over the four GPUs, the same model.

Each variant's capacity is the runner's (``summary[].capacity_rps``: the highest offered rate at which its
windows met the p99 SLO); the four-GPU capacity is the better of the two layouts, over one GPU's. Every figure
is read from those files (RESULTS' section: ``sections.four_gpu``).

GPU activity: the windows record the backend's live CUPTI gauge of every instance (``gpu_activity_by_gpu``: the
mean over a GPU's instances of each stub's own kernel time over wall time). That is not the GPU's activity when
several processes share a GPU: their kernels' intervals overlap in wall time under time-slicing (on 2026-11-28
one server's eight instances on a GPU averaged 0.36, eight times that is 2.9), and an idle server's gauge keeps
its last value (it is published from ``execute()``). So the block reports the gauge as ``instance_gauge_min``,
and ``gpu_activity_min`` is the driver's figure for the whole GPU where the windows have it (``gpu_util``,
:mod:`inflight.loadtest.gpu_util`: nvidia-smi's utilization.gpu, sampled in the window), else None.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from inflight.lab.entries import Entry, best_entry, entries, generator_verified, sittings

FOUR_GPU_DIR = "four-gpu"
#: The issue's targets: four GPUs' capacity over one GPU's, and every GPU's activity at that capacity.
TARGET_RATIO = 3.6
TARGET_ACTIVITY = 0.9


def route(e: Entry) -> str:
    """Where a variant's load went: ``balancer``, ``direct``, ``gpu<N>`` or ``server`` (one server, no balancer)."""
    return str(e.summary.get("route") or "server")


def layout(e: Entry) -> str:
    """The server layout of the variant's file (``one-server``, ``per-gpu-servers+nginx`` ...)."""
    return str((e.doc.get("server") or {}).get("layout") or "one-server")


def _windows_at(e: Entry, rate: float) -> list[Mapping[str, Any]]:
    return [r for r in e.doc["runs"] if r["variant"] == e.summary["variant"] and r.get("rate") == rate]


def _server_index(e: Entry) -> int | None:
    """The index of the server a ``via=gpu<N>`` variant was sent to among the run's servers (None otherwise)."""
    r = route(e)
    if not r.startswith("gpu"):
        return None
    servers = (e.doc.get("server") or {}).get("per_gpu_servers") or []
    return next((i for i, s in enumerate(servers) if str(s.get("gpu")) == r[3:]), None)


def _medians(
    e: Entry, rate: float, figures: Callable[[Mapping[str, Any]], Mapping[str, Any]], keep: Callable[[str], bool]
) -> dict[str, float] | None:
    """Each kept key's median over the variant's windows at ``rate`` of ``figures(window)[key]["mean"]``.

    None when no window has any.
    """
    per: dict[str, list[float]] = {}
    for w in _windows_at(e, rate):
        for key, fig in figures(w).items():
            if isinstance(fig, Mapping) and keep(key):
                per.setdefault(key, []).append(float(fig["mean"]))
    return {k: statistics.median(v) for k, v in sorted(per.items())} or None


def instance_gauge_by_gpu(e: Entry, rate: float) -> dict[str, float] | None:
    """Each GPU's instance gauge at ``rate``: the median over the variant's windows there of the window mean.

    Keys are ``<server>:<gpu>`` (the window's ``gpu_activity_by_gpu``), only the addressed server's for a
    ``via=gpu<N>`` variant (the others idled and kept their last value); None when no window has them (the live
    CUPTI gauges were off). What the gauge is, and is not: the module's docstring.
    """
    own = _server_index(e)
    return _medians(
        e, rate, lambda w: w.get("gpu_activity_by_gpu") or {}, lambda k: own is None or k.startswith(f"{own}:")
    )


def util_by_gpu(e: Entry, rate: float) -> dict[str, float] | None:
    """Each GPU's utilization at ``rate`` (nvidia-smi, physical index): the median over the windows there.

    Only the addressed GPU for a ``via=gpu<N>`` variant; None when no window sampled it.
    """
    r = route(e)
    own = r[3:] if r.startswith("gpu") else None
    return _medians(e, rate, lambda w: (w.get("gpu_util") or {}).get("by_gpu") or {}, lambda k: own is None or k == own)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _at_capacity(e: Entry, rate: float) -> dict[str, Any]:
    """Medians over the variant's windows at ``rate``, and the generator's largest late fraction there.

    The medians: p50 and p99, the busy cores of the server cores, and nginx's cores and CPU a request when the load
    went through it.
    """
    ws = _windows_at(e, rate)
    lat = [r.get("latency_ms") or {} for r in ws]
    nginx = [r["balancer_cpu"] for r in ws if isinstance(r.get("balancer_cpu"), Mapping) and route(e) == "balancer"]
    late = [float((r.get("generator") or {}).get("late_fraction") or 0.0) for r in ws]
    return {
        "p50_ms": _median([float(x["p50"]) for x in lat if "p50" in x]),
        "p99_ms": _median([float(x["p99"]) for x in lat if "p99" in x]),
        "server_cores_busy": _median(
            [float(r["cpu"]["host_busy_cores"]) for r in ws if "host_busy_cores" in (r.get("cpu") or {})]
        ),
        "nginx_cores": _median([float(b["nginx_cores"]) for b in nginx]),
        "nginx_us_per_request": _median([float(b["us_per_request"]) for b in nginx]),
        "late_fraction_max": max(late, default=None),
    }


def next_rate(e: Entry) -> float | None:
    """The lowest rate above the capacity the variant tried (it missed the SLO there), None when none was."""
    cap = e.capacity or 0.0
    above = [float(row["offered_rps"]) for row in e.summary.get("sweep") or [] if float(row["offered_rps"]) > cap]
    return min(above, default=None)


def _ref(e: Entry | None, root: Path) -> dict[str, Any] | None:
    if e is None:
        return None
    cap = e.capacity
    cpus = (e.doc.get("load") or {}).get("cpu_sets") or {}
    own = _server_index(e)
    server_cpus = cpus.get("server")
    if own is not None:  # one GPU: its server's share of the cores
        server_cpus = (e.doc["server"]["per_gpu_servers"][own] or {}).get("cpus") or server_cpus
    return {
        "spec": e.summary["spec"],
        "layout": layout(e),
        "route": route(e),
        "capacity_rps": cap,
        "capacity_bounded": bool(e.summary.get("capacity_bounded")),
        "comparable": e.comparable,
        "server_cpus": server_cpus,
        "client_cpus": cpus.get("client"),
        **(_at_capacity(e, cap) if cap else {}),
        "util_by_gpu": util_by_gpu(e, cap) if cap else None,
        "instance_gauge_by_gpu": instance_gauge_by_gpu(e, cap) if cap else None,
        "file": str(e.path.relative_to(root)),
    }


def sitting_summary(root: Path, sitting: Path) -> dict[str, Any] | None:
    """One sitting's block (None when it measured no one-GPU or no four-GPU capacity)."""
    es = entries(root / "results", sitting)
    models = [e for e in es if e.kind != "null"]
    one = best_entry([e for e in models if route(e).startswith("gpu")])
    layouts = {
        "per-gpu servers behind nginx": best_entry([e for e in models if route(e) == "balancer"]),
        "one server over the GPUs": best_entry([e for e in models if layout(e) == "one-server"]),
    }
    four_name, four = max(
        ((name, e) for name, e in layouts.items() if e is not None and e.capacity is not None),
        key=lambda ne: ne[1].capacity or 0.0,
        default=(None, None),
    )
    if one is None or not one.capacity or four is None or four.capacity is None:
        return None
    nulls = [e for e in es if e.kind == "null"]
    gen = generator_verified([e for e in nulls if route(e) in ("direct", "server")] or nulls)
    gauge = instance_gauge_by_gpu(four, four.capacity)
    util = util_by_gpu(four, four.capacity)
    ratio = four.capacity / one.capacity
    floor = four.capacity / nxt if (nxt := next_rate(one)) else None
    null_by_route = {route(e): _ref(e, root) for e in nulls}
    return {
        "sitting": str(sitting.relative_to(root)),
        "device": str((four.doc.get("device") or {}).get("name")),
        "slo_p99_ms": float(((four.doc.get("load") or {}).get("open_loop") or {}).get("slo_p99_ms") or 100.0),
        "one_gpu_rps": one.capacity,
        "four_gpu_rps": four.capacity,
        "layout": four_name,
        "four_over_one": ratio,
        # one GPU missed at its next rate: the ratio is at least this, whatever lies between; judged on it
        "four_over_one_floor": floor,
        "target_ratio": TARGET_RATIO,
        "target_met": (floor if floor is not None else ratio) >= TARGET_RATIO,
        "gpu_activity_min": min(util.values()) if util else None,  # nvidia-smi's, where sampled (docstring)
        "target_activity": TARGET_ACTIVITY,
        "instance_gauge_min": min(gauge.values()) if gauge else None,
        "generator_verified_rps": gen[0] if gen else None,
        "one_gpu": _ref(one, root),
        "per_layout": {name: _ref(e, root) for name, e in layouts.items()},
        "null_model": null_by_route,
    }


def summary(root: Path) -> dict[str, Any] | None:
    """The newest sitting's block under ``results/four-gpu`` (None when none measured one GPU and four)."""
    for sitting in reversed(sittings(root / "results", FOUR_GPU_DIR)):
        block = sitting_summary(root, sitting)
        if block is not None:
            return block
    return None
