"""What the lab reads from ``results/``: the variants of the A/B files, grouped by sitting, and summary.json.

An :class:`Entry` is one variant of one A/B file. A *sitting* is a first-level folder under a results folder
(``<date>-<time>-<name>``): the runs of one session on one host, the only scope a ratio is taken in. The
executor figures of a variant are the runtime's ``finalized`` record combined over instances: their names come
from :mod:`inflight.runtime.record`, never from a list kept here.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inflight.loadtest.runner.document import capacity_fields
from inflight.runtime import record

OPEN_LOOP_DIR = "open-loop"
#: The generator must be proven at this multiple of the highest rate published.
GENERATOR_MARGIN = 2.0

#: ``auto``'s in-band batch counters of the ``finalized`` record: ``auto`` counts every batch once, deferred
#: (``auto_deferred``) or answered in-band for one of its reasons, which are the record's other summed ``auto_``
#: counts (its times end in ``_s``; the retired ``auto_explored`` of older files included).
IN_BAND_BATCHES = tuple(
    name
    for name, how in {**record.FIGURES, **record.RETIRED}.items()
    if name.startswith("auto_") and how == "sum" and name != "auto_deferred" and not name.endswith("_s")
)


def in_band_batches(executor: Mapping[str, Any]) -> int:
    """The batches ``auto`` answered in-band, from a variant's ``executor`` block (:data:`IN_BAND_BATCHES`)."""
    return sum(int(executor.get(k) or 0) for k in IN_BAND_BATCHES)


@dataclass(frozen=True)
class Entry:
    """One variant of one open-loop A/B file."""

    path: Path
    doc: Mapping[str, Any]
    summary: Mapping[str, Any]
    variant: Mapping[str, Any]

    @property
    def kind(self) -> str:
        """``sync``, ``pipelined`` or ``null``."""
        return {"inflight": "pipelined"}.get(str(self.variant.get("variant")), str(self.variant.get("variant")))

    @property
    def gpus(self) -> int:
        """GPUs the instances were placed on (``gpus=``); every GPU of the device when not set."""
        group = ((self.variant.get("config") or {}).get("instance_group") or [{}])[0]
        named = group.get("gpus") or []
        return len(named) if named else len((self.doc.get("device") or {}).get("gpus") or [None])

    @property
    def mode(self) -> str:
        """The inflight backend's ``mode`` parameter (``pipelined`` when unset); the kind for other models."""
        if self.kind != "pipelined":
            return self.kind
        return self.parameter("mode") or "pipelined"

    def parameter(self, key: str) -> str:
        """A parameter of the variant's model config (``parameters { key ... }``), "" when unset."""
        params = (self.variant.get("config") or {}).get("parameters") or {}
        return str((params.get(key) or {}).get("string_value") or "")

    @property
    def capacity(self) -> float | None:
        """Capacity at the SLO (req/s), or None."""
        c = self.summary.get("capacity_rps")
        return float(c) if isinstance(c, (int, float)) and math.isfinite(c) else None

    @property
    def comparable(self) -> bool:
        """True when no window at or below the capacity was generator-limited."""
        return bool(self.summary.get("comparable"))


def read_ab(path: Path) -> dict[str, Any]:
    """An A/B file's document, parsed once per version of the file in this process; callers must not modify it.

    A render of the result pages reads each A/B file three to five times (about 250 MB of JSON, 65 MB of it
    distinct); a version is the file's inode, modification time and size.
    """
    st = path.stat()
    return _parsed(str(path.resolve()), st.st_ino, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=2048)
def _parsed(path: str, inode: int, mtime_ns: int, size: int) -> dict[str, Any]:
    del inode, mtime_ns, size  # the key: another version of the file is parsed again
    return json.loads(Path(path).read_text())


def load_ab(path: Path) -> dict[str, Any]:
    """An A/B file, each open-loop variant's capacity keys computed by the runner's current rule.

    Files written before 2026-11-28 pooled the rounds' windows into one curve, so a rate one round met and the
    others missed could stand as the capacity (:func:`inflight.loadtest.openloop.capacity_over_rounds`); their
    sweep rows hold every window, so the keys are recomputed here from them.
    """
    doc = dict(read_ab(path))  # a copy: the summary is replaced below
    if is_open_loop(doc):
        slo = float(doc["load"]["open_loop"]["slo_p99_ms"])
        doc["summary"] = [{**s, **capacity_fields(s["sweep"], slo)} if s.get("sweep") else s for s in doc["summary"]]
    return doc


def sittings(results: Path, folder: str = OPEN_LOOP_DIR) -> list[Path]:
    """The sittings under ``results/<folder>`` (first-level folders holding A/B runs), oldest first."""
    root = results / folder
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.is_dir() and any(d.rglob("ab-*.json")))


def newest_sitting(results: Path) -> Path | None:
    """The newest sitting under ``results/open-loop`` (None when there is none)."""
    all_sittings = sittings(results)
    return all_sittings[-1] if all_sittings else None


def entries(results: Path, sitting: Path | None = None) -> list[Entry]:
    """Every variant of every open-loop A/B file of one sitting (default: the newest), oldest file first."""
    sitting = sitting or newest_sitting(results)
    if sitting is None:
        return []
    out = []
    for path in sorted(sitting.rglob("ab-*.json")):
        doc = load_ab(path)
        if not is_open_loop(doc):
            continue
        variants = {v["label"]: v for v in doc.get("variants", [])}
        for s in doc.get("summary", []):
            out.append(Entry(path, doc, s, variants.get(s["variant"], {})))
    return out


def generator_verified(es: Iterable[Entry]) -> tuple[float, Entry] | None:
    """The highest rate the null model met the SLO at with the generator on schedule, and its entry."""
    best: tuple[float, Entry] | None = None
    for e in es:
        if e.kind != "null":
            continue
        for row in e.summary.get("sweep") or []:
            on_schedule = not row.get("slo_misses") and not row.get("generator_limited")
            if on_schedule and (best is None or float(row["offered_rps"]) > best[0]):
                best = (float(row["offered_rps"]), e)
    return best


def is_open_loop(doc: Mapping[str, Any]) -> bool:
    """Whether an A/B file's load was open loop (arrivals at rates) rather than closed loop."""
    return not (doc.get("load") or {}).get("closed_loop", True)


def open_loop_files(results: Path) -> list[Path]:
    """Every open-loop A/B file anywhere under ``results`` (also those outside ``results/open-loop``)."""
    return [p for p in sorted(results.rglob("ab-*.json")) if is_open_loop(read_ab(p))]


def best_entry(candidates: Iterable[Entry]) -> Entry | None:
    """The entry of the highest capacity (a comparable one on a tie), or None when none has a capacity."""
    pool = [e for e in candidates if e.capacity is not None]
    return max(pool, key=lambda e: (e.capacity or 0.0, e.comparable)) if pool else None


def summary_block(root: Path, key: str) -> dict[str, Any] | None:
    """``key`` of ``results/summary.json`` (None when the file or the key is missing)."""
    path = root / "results" / "summary.json"
    block = (json.loads(path.read_text()) if path.is_file() else {}).get(key)
    return block or None


def is_executor_row(row: Mapping[str, Any]) -> bool:
    """Whether an engine bench row is one the executors measured (bucket, engine-only bound, sync items/s).

    A bench of several engines also has one row per engine variant, without executor figures.
    """
    return "sync_items_s" in row


def executor_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An engine bench's executor rows, by bucket."""
    return sorted((r for r in doc.get("rows", []) if is_executor_row(r)), key=lambda r: r["bucket"])


def bound_row(doc: Mapping[str, Any], items_per_batch: float) -> dict[str, Any] | None:
    """The executor row of the bucket a batch of ``items_per_batch`` items pads to (the largest if none fits)."""
    rows = executor_rows(doc)
    return next((r for r in rows if r["bucket"] >= items_per_batch), rows[-1] if rows else None)


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
