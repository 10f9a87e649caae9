"""Issue 53's figures: a real encoder where the GPU is the bound, from the files its sittings wrote.

Reads ``results/engine-minilm-*/encoder-engine-*.json`` (``scripts/lab/encoder_engine.py``: the engine
alone, by rewrite), ``results/gpu-bound/*/ab-*.json`` (``scripts/lab/gpu_bound.sh``: the served
workload, 32 sequences a request of lengths 16-128, variants interleaved over rounds, p99 SLO 100
ms) and ``results/gpu-bound/*/nsys/*/summary.json`` (``scripts/lab/gpu_bound_nsys.sh``: the whole server
under Nsight Systems at a fixed offered rate). :func:`summary` is ``summary.json["gpu_bound"]``;
RESULTS' section is ``inflight.lab.sections.gpu_bound``, the README's row ``inflight.lab.sections.decision``.
The same requests as text are other sittings, in ``results/gpu-bound-text/*/`` (``TOKENS=text bash
scripts/lab/gpu_bound.sh``: the ensemble ``NAME_text`` and the tokenizer's own bound on the server's cores,
``tokenizer.json``); :func:`text_summary` is the block's ``text``.

The default as built is the ``inflight`` variant whose overrides change nothing the build wrote
(:data:`AS_BUILT_KEYS` only: how it is measured, not what it serves) and whose import asked no
``max_batch_size`` (another import of the same checkpoint is a configuration beside it; :func:`as_built`), from
the newest sitting that has one: the build's rule changed between sittings. The one-instance ratio is taken in the
newest file that ran both one-instance variants. Figures of different GPUs are never pooled: the summary and
the decision row are the newest sitting's device's (:func:`on_device`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inflight.lab.entries import read_ab
from inflight.loadtest import openloop as ol
from inflight.loadtest.rategen import fell_behind, read_summary_line
from inflight.loadtest.runner.window import rate_point
from inflight.models.architecture import Architecture
from inflight.models.bert import BertShape
from inflight.server.ensemble import ENCODER
from inflight.variants import DEFAULT_MAX_BATCH_SIZE, base_name

#: The H100's own 8192^3 fp16 GEMM (issue 53's measurement, the same host kind): the dense roof of a token's FLOPs.
H100_DENSE_FLOPS = 749e12
#: Overrides that leave a variant as built: the gauges, capture at load or later, its rates, where the load goes.
AS_BUILT_KEYS = frozenset({"cupti", "capture_at_load", "rates", "via"})
#: Sequences a request of the served workload carries.
ITEMS = 32
#: The folders of ``results/`` the served sittings are in: token ids, and the same requests as text.
IDS_FOLDER = "gpu-bound"
TEXT_FOLDER = "gpu-bound-text"


def _engine_files(root: Path) -> list[Path]:
    return sorted((root / "results").glob("engine-minilm-*/encoder-engine-*.json"))


def ab_docs(root: Path, folder: str = IDS_FOLDER) -> list[tuple[Path, dict[str, Any]]]:
    """The served sittings' files and their documents (each read once), in the order they ran (``started``).

    A run stopped by its time limit (``interrupted-ab-*.json``) counts with the rounds it finished.
    """
    base = root / "results" / folder
    paths = [*base.glob("*/ab-*.json"), *base.glob("*/interrupted-ab-*.json")]
    docs = [(p, read_ab(p)) for p in paths]
    return sorted(docs, key=lambda pd: str(pd[1].get("started", "")))


def nsys_files(root: Path) -> list[Path]:
    """Each capture's own summary (``nsys/<name>/summary.json``), oldest sitting first."""
    return sorted((root / "results").glob("gpu-bound/*/nsys/*/summary.json"))


def nsys_captures(root: Path) -> list[dict[str, Any]]:
    """Each capture: its name, GPU, the rate offered and achieved, the generator's lateness, GPU activity, sync share.

    ``achieved_rps`` and ``very_late_fraction``: from the generator's summary line in ``load.log``
    (``rategen.read_summary_line``; None where the line is missing). A generator that fell behind
    (``rategen.fell_behind``) means the server was past its capacity under the profiler: the capture is of a
    saturated server, not of the offered rate.
    """
    out = []
    for p in nsys_files(root):
        files = json.loads(p.read_text()).get("files", [])
        run = p.parent / "run.json"
        load = json.loads(run.read_text()).get("load", "") if run.is_file() else ""
        words = str(load).split()
        rate = float(words[words.index("--rate") + 1]) if "--rate" in words else None
        log = p.parent / "load.log"
        load = read_summary_line(log.read_text()) if log.is_file() else None
        for f in files:
            out.append(
                {
                    "path": p,
                    "name": p.parent.name,
                    "device": (f.get("gpu_names") or [None])[0],
                    "rate": rate,
                    "achieved_rps": load["rps"] if load else None,
                    "very_late_fraction": load["very_late_fraction"] if load else None,
                    "gpu_activity": f["summary"].get("gpu_activity"),
                    "sync_share": f["summary"].get("sync_share"),
                }
            )
    return out


def token_flops(shape: Mapping[str, int], length: int = 64) -> float:
    """FLOPs of one token at ``length``: the GEMMs (``Architecture.token_flops``) and attention's two products."""
    s = BertShape(layers=shape["layers"], hidden=shape["hidden"], heads=shape["heads"], ffn=shape["ffn"])
    return Architecture(shape=s).token_flops() + 4 * length * s.hidden * s.layers


#: The fp8 variants of ``scripts/lab/encoder_engine.py`` (every linear layer in fp8 e4m3), newest of each shown.
FP8_VARIANTS = ("fp8", "fp8_dynamic")


def engine(root: Path, device: str | None = None) -> dict[str, Any] | None:
    """The newest ``served`` engine row with an unpadded figure, the before (``opaque_ffn``) and fp8 rows beside it.

    Args:
        root: The repository.
        device: Only files of this GPU (its name as the files give it); None: any.

    Returns:
        ``served``, ``before`` and ``fp8`` (variant -> its newest row; only those measured), or None: no served row.
    """
    served = before = None
    fp8: dict[str, dict[str, Any]] = {}
    for f in _engine_files(root):
        doc = json.loads(f.read_text())
        if device is not None and doc["device"] != device:
            continue
        for v in doc["variants"]:
            if "error" in v:
                continue
            if v["variant"] == "served" and "tokens_per_s" in v.get("unpadded", {}):
                served = {**v, "path": f, "doc": doc}
            if v["variant"] == "opaque_ffn":
                before = {**v, "path": f}
            if v["variant"] in FP8_VARIANTS:
                fp8[v["variant"]] = {**v, "path": f}
    if served is None:
        return None
    return {"served": served, "before": before, "fp8": fp8}


def fp8_accuracy(root: Path) -> dict[str, Any] | None:
    """The newest real checkpoint's fp8 cost (``encoder_engine.py --fp8-accuracy``), its ``path`` added; None: none."""
    files = sorted((root / "results").glob("engine-minilm-*/fp8-accuracy-*.json"))
    return {**json.loads(files[-1].read_text()), "path": files[-1]} if files else None


def _rounds(doc: Mapping[str, Any], label: str) -> list[list[ol.RatePoint]]:
    """A variant's windows as the runner reads them (:func:`rate_point`), a list per round in round order."""
    rounds: dict[int, list[ol.RatePoint]] = {}
    for r in doc["runs"]:
        if r["variant"] == label and r.get("rate") is not None:
            rounds.setdefault(r["round"], []).append(rate_point(r))
    return [pts for _, pts in sorted(rounds.items())]


def _capacities(rounds: Sequence[Sequence[ol.RatePoint]], slo_ms: float) -> list[float]:
    return [ol.capacity_of(pts, slo_ms) or 0.0 for pts in rounds]


def capacity_per_round(doc: Mapping[str, Any], label: str, slo_ms: float) -> list[float]:
    """Per round, the runner's capacity (:func:`~inflight.loadtest.openloop.capacity_of`; 0: no rate met the SLO)."""
    return _capacities(_rounds(doc, label), slo_ms)


def variants(root: Path, folder: str = IDS_FOLDER) -> list[dict[str, Any]]:
    """Each variant of each served file: its spec, instances, capacity per round and median, and gauges at it.

    A variant with no window (an interrupted run cut before it) is left out: it measured nothing.
    """
    out = []
    for f, doc in ab_docs(root, folder):
        slo = doc["load"]["open_loop"]["slo_p99_ms"]
        for v in doc["variants"]:
            own = [r for r in doc["runs"] if r["variant"] == v["label"]]
            if not own:
                continue
            top = max((r["rate"] for r in own), default=0.0)  # its own highest rate: above it, not tried
            rounds = _rounds(doc, v["label"])
            caps = _capacities(rounds, slo)
            cap = ol.capacity_over_rounds(rounds, slo)[0] or 0.0  # the runner's own rule
            act = [
                r["gpu_activity"]["mean"]
                for r in own
                if r["rate"] == cap and isinstance(r.get("gpu_activity"), Mapping)
            ]
            achieved = [
                r["generator"]["achieved_rps"]
                for r in own
                if r["rate"] == top and isinstance(r.get("generator"), Mapping)
            ]
            out.append(
                {
                    "path": f,
                    "memory_failures": sum(
                        1 for r in own for m in r.get("failure_messages") or [] if "memory" in str(m).lower()
                    ),
                    "device": doc["device"]["name"],
                    "spec": v["spec"],
                    "overrides": dict(v.get("overrides") or {}),
                    "kind": v["variant"],
                    "max_batch": int(v["config"].get("max_batch_size", 0)),
                    "instances": v["config"]["instance_group"][0]["count"],
                    "tokenizer_instances": next(
                        (c["instance_group"][0]["count"] for c in v.get("ensemble", {}).get("steps", {}).values()),
                        None,
                    ),
                    "delay_us": int(v["config"].get("dynamic_batching", {}).get("max_queue_delay_microseconds", 0)),
                    "capacities": caps,
                    "capacity": cap,
                    "bounded": cap < top,
                    "gauge_activity_at_capacity": statistics.median(act) if act else None,
                    "achieved_at_top": statistics.median(achieved) if achieved else None,
                    "top": top,
                    "cores": doc["load"]["cpu_sets"],
                }
            )
    return out


def rank(v: Mapping[str, Any]) -> tuple[float, float]:
    """How variants are ranked: capacity, then (a tie) the one that held it in more rounds."""
    return v["capacity"], sum(v["capacities"])


def pick(vs: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    """The variant of ``kind`` ranked first (:func:`rank`), or None."""
    cands = [v for v in vs if v["kind"] == kind]
    return max(cands, key=rank) if cands else None


def on_device(vs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The variants measured on the newest sitting's GPU (``vs`` in the order the sittings ran)."""
    return [v for v in vs if v["device"] == vs[-1]["device"]] if vs else []


def imported_batch_asked(ab_path: Path, model: str) -> tuple[bool, int | None]:
    """Whether the sitting of ``ab_path`` recorded ``model``'s import, and the ``--max-batch-size`` it asked (None).

    ``scripts/lab/minilm_gpu.sh`` writes ``import-NAME.json`` (``inflight import-hf``'s output) beside the runs.
    """
    f = ab_path.parent / f"import-{model}.json"
    if not f.is_file():
        return False, None
    return True, json.loads(f.read_text()).get("max_batch_size_asked")


def as_built(v: Mapping[str, Any]) -> bool:
    """Whether ``v`` is the ``inflight`` variant as the importer's defaults build it (see the module's docstring).

    Its import asked no ``--max-batch-size``; a sitting that recorded no import ran before the importer chose the
    batch, when its default was ``DEFAULT_MAX_BATCH_SIZE``.
    """
    if v["kind"] != "inflight" or not set(v["overrides"]) <= AS_BUILT_KEYS:
        return False
    recorded, asked = imported_batch_asked(Path(v["path"]), base_name(v["spec"].split("@")[0]))
    return asked is None if recorded else v["max_batch"] == DEFAULT_MAX_BATCH_SIZE


def default_as_built(vs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The as-built ``inflight`` variant of the newest sitting that has one (see the module's docstring)."""
    built = [v for v in vs if as_built(v)]
    return built[-1] if built else None


def one_instance_pair(vs: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """``(inflight, sync)`` at one instance each, from the newest file that ran both (None: none did)."""
    for path in reversed(list(dict.fromkeys(v["path"] for v in vs))):
        mine = [v for v in vs if v["path"] == path and v["overrides"].get("instances") == "1"]
        auto = pick(mine, "inflight")
        sync = pick(mine, "sync")
        if auto and sync:
            return auto, sync
    return None


def kept_schedule(capture: Mapping[str, Any]) -> bool:
    """Whether the generator held the offered rate during a capture (``rategen.fell_behind``; unknown: held)."""
    late = capture.get("very_late_fraction")
    return late is None or not fell_behind(late)


def activity_capture(root: Path, device: str) -> Mapping[str, Any] | None:
    """The capture of ``device`` at the highest offered rate the generator held (the newest of equals), or None.

    Only a capture whose ``load.log`` shows the generator on schedule counts (:func:`kept_schedule`): one past the
    server's capacity under the profiler shows a saturated GPU, not the activity at its rate.
    """
    caps = [
        c
        for c in nsys_captures(root)
        if c["gpu_activity"] is not None
        and c["device"] in (device, None)
        and c["very_late_fraction"] is not None
        and kept_schedule(c)
    ]
    return max(reversed(caps), key=lambda c: c["rate"] or 0.0) if caps else None


def tokenizer_bounds(root: Path) -> list[dict[str, Any]]:
    """Each text sitting's tokenizer bound (``scripts/lab/tokenizer_bound.py``), oldest first, with its path."""
    paths = sorted((root / "results" / TEXT_FOLDER).glob("*/tokenizer.json"))
    return [{**json.loads(p.read_text()), "path": p} for p in paths]


def _is_text(v: dict[str, Any]) -> bool:
    """Whether a variant serves ``NAME_text`` (the ensemble)."""
    return bool(v["spec"].split("@")[0].endswith("_text"))


def text_summary(root: Path) -> dict[str, Any] | None:
    """The newest text sitting that served the ensemble as built: it against the tokenizer's bound of the same call.

    A newer sitting that served only other splits (``tokenizer_instances``, ``instances``) is an experiment beside it.

    ``capacity_rps``: the as-built ``NAME_text`` (no key but how it is measured, :data:`AS_BUILT_KEYS`); ``best_rps``:
    the sitting's best variant; ``tokenizer_bound_rps``: requests a second the server's cores tokenize with the
    backends' encoder (one single-threaded process a core, the layout that tokenized most), measured in the same
    call or, when the sitting skipped it, in the newest sitting before it; ``text_path_bound_rps``: the ensemble
    with the null model in the encoder's place (``encoder=NAME_null``: tokenizer, ensemble, Triton) in the newest
    sitting that ran it (None if none did), and ``text_path_bound_is_lower`` when every rate met the SLO (the bound
    is at least that).
    """
    vs = variants(root, TEXT_FOLDER)
    if not vs:
        return None
    # the newest sitting that served the ensemble as built (a sitting of other splits alone is an experiment)
    ensembles_as_built = [v for v in vs if _is_text(v) and set(v["overrides"]) <= AS_BUILT_KEYS]
    last = (ensembles_as_built or vs)[-1]["path"].parent
    newest = [v for v in vs if v["path"].parent == last]
    # NAME_text@encoder=NAME_null: the text path's own bound (no GPU work), never a configuration to rank
    every_path = [v for v in vs if _is_text(v) and ENCODER in v["overrides"] and v["kind"] == "null"]
    paths = [v for v in every_path if v["path"].parent == every_path[-1]["path"].parent] if every_path else []
    texts = [v for v in newest if _is_text(v) and v not in every_path]
    built = [v for v in ensembles_as_built if v["path"].parent == last]
    # the sitting's own bound, else the newest measured before it (a sitting may skip it: TOKENIZER_BOUND=0)
    every = tokenizer_bounds(root)
    before = [b for b in every if b["path"].parent.name <= last.name]
    bounds = [b for b in every if b["path"].parent == last] or before[-1:]
    path = max(paths, key=rank) if paths else None
    # the encoder's own text input is a text configuration too; a null model or the path's bound never is
    candidates = texts or [v for v in newest if v not in every_path and v["kind"] != "null"]
    best = max(candidates, key=rank) if candidates else None
    return {
        "device": newest[0]["device"],
        "capacity_rps": built[-1]["capacity"] if built else None,
        "best_rps": best["capacity"] if best else None,
        "tokenizer_bound_rps": bounds[0]["bound_requests_per_s"] if bounds else None,
        "tokenizer_cores": bounds[0]["cores"] if bounds else None,
        "text_path_bound_rps": path["capacity"] if path else None,
        "text_path_bound_is_lower": not path["bounded"] if path else None,
    }


def summary(root: Path) -> dict[str, Any] | None:
    """``summary.json["gpu_bound"]``: issue 53's keys, and what each figure came from.

    ``gpu_activity``: :func:`activity_capture`'s, named by ``gpu_activity_capture``. ``one_instance_max_batch``:
    the ``max_batch_size`` of the import the one-instance pair ran.

    Every figure is the newest sitting's GPU's: the engine bound, the capacities and the capture of one kind of card.
    """
    vs = on_device(variants(root))
    if not vs:
        return None
    device = vs[-1]["device"]
    e = engine(root, device)
    if e is None:
        return None
    served = e["served"]
    per_request = ITEMS * served["unpadded"]["real_tokens"] / served["doc"]["rows"]
    bound = served["unpadded"]["tokens_per_s"] / per_request
    default = default_as_built(vs)
    pair = one_instance_pair(vs)
    plain = pick(vs, "plain")
    best = max((v for v in vs if v["kind"] in ("inflight", "sync")), key=rank)
    capture = activity_capture(root, device)
    block = {
        "model": "all-MiniLM-L6-v2 (seeded random weights of its shape)",
        "device": served["doc"]["device"],
        "engine_tokens_per_s": served["uniform"]["tokens_per_s"],
        "engine_mixed_over_uniform": served["unpadded"]["tokens_per_s"] / served["uniform"]["tokens_per_s"],
        "compute_roof_tokens_per_s": H100_DENSE_FLOPS / token_flops(served["doc"]["shape"]),
        "served_capacity_rps": best["capacity"],
        "engine_bound_rps": bound,
        "gpu_activity": capture["gpu_activity"] if capture else None,
        "gpu_activity_at_rps": capture["rate"] if capture else None,
        "gpu_activity_capture": f"{capture['path'].parents[2].name}/{capture['name']}" if capture else None,
        "one_instance_pipelined_over_sync": pair[0]["capacity"] / pair[1]["capacity"]
        if pair and pair[1]["capacity"]
        else None,
        "one_instance_max_batch": pair[0]["max_batch"] if pair else None,
        "default_over_best": default["capacity"] / best["capacity"] if default and best["capacity"] else None,
        "default_oom_failures": default["memory_failures"] if default else None,
        "plain_rps": plain["capacity"] if plain else None,
        "text": text_summary(root),
    }
    return block
