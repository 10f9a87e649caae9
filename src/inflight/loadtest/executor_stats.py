"""The inflight executor's own counters, read from the server log: the records each instance logs when finalized.

Each instance logs one ``finalized`` record at unload (``ExecutorStats``); a run's breakdown says
where its execute-thread and response time went, over its instances.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inflight.runtime.record import combine

_FINALIZED = re.compile(r"\] (?P<model>\S+) \((?P<instance>[^)]*)\) finalized \((?P<state>[^)]*)\): (?P<json>\{.*\})")


def executor_stats_from_log(text: str) -> list[dict[str, Any]]:
    """The ``finalized`` records the inflight backend logs at unload, in log order.

    Returns:
        ``[{"model", "instance", "drained", "stats"}]``; lines that do not parse are skipped.
    """
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _FINALIZED.search(line.replace('\\"', '"'))
        if m is None:
            continue
        try:
            stats = json.loads(m.group("json"))
        except json.JSONDecodeError:
            continue
        drained = m.group("state") == "drained"
        out.append({"model": m.group("model"), "instance": m.group("instance"), "drained": drained, "stats": stats})
    return out


#: The steps of one batch whose longest time each instance logs (``<step>_max_s``; ``ExecutorStats``).
_STEPS = ("parse", "gather", "launch", "wait", "build")


def executor_breakdown(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Where one run's execute-thread and response time went, over its instances.

    Per batch (``_ms``) and per response (``_us``) figures, from the backend's cumulative counters
    (warm-up included, as they cover the model's whole life), each combined over the instances as
    its owner declares (``inflight.runtime.record``: summed, the longest, or the mean).

    Returns:
        None when the records carry no batches.
    """
    tot = combine([r["stats"] for r in records])
    depth: dict[str, int] = {}
    for r in records:
        for k, v in (r["stats"].get("depth_launches") or {}).items():
            depth[k] = depth.get(k, 0) + int(v)
    batches = tot.get("batches", 0.0)
    if batches <= 0:
        return None
    executes = max(tot.get("executes", 0.0), 1.0)
    responses = tot.get("responses", 0.0) or tot.get("requests", 0.0)

    def per_batch(key: str) -> float | None:
        return tot[key] / batches * 1e3 if key in tot else None

    return {
        "instances": len(records),
        "batches": int(batches),
        "requests_per_batch": tot.get("requests", 0.0) / batches,
        "execute_ms": tot["execute_s"] / executes * 1e3 if "execute_s" in tot else None,
        "between_executes_ms": tot["between_executes_s"] / executes * 1e3 if "between_executes_s" in tot else None,
        "parse_ms": tot["parse_s"] / executes * 1e3 if "parse_s" in tot else None,
        "gather_ms": per_batch("gather_s"),
        "launch_ms": per_batch("launch_s"),
        "device_wait_ms": per_batch("device_wait_s"),
        "slot_wait_ms": per_batch("slot_wait_s"),
        # what auto's in-band path adds to sync's: taking and returning a slot of the ring (sync: its depth
        # count), per batch; the policy's decision and measurement, per execute (auto only)
        "slot_us": tot["slot_s"] / batches * 1e6 if "slot_s" in tot else None,
        "auto_policy_us": tot["auto_policy_s"] / executes * 1e6 if tot.get("auto_policy_s") else None,
        "respond_ms": per_batch("respond_latency_s"),
        "build_us_per_response": tot["build_s"] / responses * 1e6 if "build_s" in tot and responses else None,
        "send_call_us_per_response": (
            tot["send_call_s"] / tot["responses"] * 1e6 if tot.get("send_call_s") and tot.get("responses") else None
        ),
        "slot_waits": int(tot.get("slot_waits", 0)),
        "backlog_waits": int(tot.get("send_waits", 0)),
        "max_depth": max((int(k) for k in depth), default=0),
        "depth_launches": dict(sorted(depth.items(), key=lambda kv: int(kv[0]))),
        "gil_probe_mean_late_us": (tot.get("gil_probe_mean_late_us")),
        # overlap mode: chunks per batch; auto: the batches of each path and the overlap bound it measured
        "chunks_per_execute": tot["chunks"] / executes if tot.get("chunks") else None,
        "inline_wait_ms": tot["inline_wait_s"] / executes * 1e3 if tot.get("chunks") else None,
        "auto_inline": int(tot.get("auto_inline", 0)),
        "auto_deferred": int(tot.get("auto_deferred", 0)),
        "auto_explored": int(tot.get("auto_explored", 0)),  # before 2026-11-26: in-band while deferring
        "auto_reference": int(tot.get("auto_reference", 0)),
        "auto_no_gain": int(tot.get("auto_no_gain", 0)),
        "auto_unsaturated": int(tot.get("auto_unsaturated", 0)),
        "auto_busy": tot["auto_busy"] if tot.get("auto_busy") else None,
        "auto_bound": tot["auto_bound"] if tot.get("auto_bound") else None,
        "auto_gain": tot["auto_gain"] if tot.get("auto_gain") else None,
        "deferred_requests": int(tot.get("deferred_requests", 0)),
        # launches, and those run unpadded (masked tokens left out); computed over real tokens
        "launches": int(tot["launches"]) if "launches" in tot else None,
        "unpadded_launches": int(tot["unpadded_launches"]) if "unpadded_launches" in tot else None,
        "computed_over_real_tokens": (
            tot["padded_tokens"] / tot["real_tokens"] if tot.get("real_tokens") and "padded_tokens" in tot else None
        ),
        # stalls: the longest execute() and the stubs' garbage-collector pauses (their longest, and the
        # time per execute they took), over every instance's life
        "execute_max_ms": tot.get("execute_max_ms"),
        "executes_over_10ms": int(tot["executes_over_10ms"]) if "executes_over_10ms" in tot else None,
        "gc_max_ms": tot.get("gc_max_ms"),
        "gc_gen2": int(tot["gc_gen2"]) if "gc_gen2" in tot else None,
        "gc_ms_per_execute": tot["gc_s"] / executes * 1e3 if "gc_s" in tot else None,
        # the live metrics' calls on the execute thread (each a round trip to the server): per execute, and the
        # longest time one execute() spent publishing
        "metric_calls_per_execute": tot["metric_calls"] / executes if "metric_calls" in tot else None,
        "publish_ms_per_execute": tot["publish_s"] / executes * 1e3 if "publish_s" in tot else None,
        "publish_max_ms": tot.get("publish_max_ms"),
        # the longest of each step of one batch, over every instance: where the executes over 10 ms went
        **{f"{step}_max_ms": tot[f"{step}_max_s"] * 1e3 if f"{step}_max_s" in tot else None for step in _STEPS},
    }


def config_instances(config: Mapping[str, Any]) -> int:
    """Model instances of a variant's config as the A/B JSON records it (``instance_group`` counts summed)."""
    return sum(int(g.get("count", 1)) for g in config.get("instance_group", [{}]))


def _loads(runs: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The runs grouped by the load that served them: consecutive runs of one variant, round and ``load_s``.

    A run without ``load_s`` (files before the fixed-rate rounds) is a load of its own.
    """
    loads: list[list[dict[str, Any]]] = []
    for run in runs:
        if loads and run.get("load_s") is not None and _load_key(run) == _load_key(loads[-1][0]):
            loads[-1].append(run)
        else:
            loads.append([run])
    return loads


def _load_key(run: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return run.get("variant"), run.get("round"), run.get("load_s")


def _mean_breakdown(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in runs[0].items():
        vals = [r.get(k) for r in runs]
        if all(isinstance(x, (int, float)) for x in vals):
            out[k] = float(np.mean([float(x) for x in vals if x is not None]))
        else:
            out[k] = v
    return out
