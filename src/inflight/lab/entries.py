"""What the lab reads from ``results/``: the A/B files (each parsed once) and the engine bench's rows."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inflight.loadtest.runner.document import capacity_fields


def read_ab(path: Path) -> dict[str, Any]:
    """An A/B file's document, parsed once per version of the file in this process; callers must not modify it.

    A render of the result pages reads each A/B file more than once (about 250 MB of JSON, 65 MB of it
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


def is_open_loop(doc: Mapping[str, Any]) -> bool:
    """Whether an A/B file's load was open loop (arrivals at rates) rather than closed loop."""
    return not (doc.get("load") or {}).get("closed_loop", True)


def is_executor_row(row: Mapping[str, Any]) -> bool:
    """Whether an engine bench row is one the executors measured (bucket, engine-only bound, sync items/s).

    A bench of several engines also has one row per engine variant, without executor figures.
    """
    return "sync_items_s" in row


def executor_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An engine bench's executor rows, by bucket."""
    return sorted((r for r in doc.get("rows", []) if is_executor_row(r)), key=lambda r: r["bucket"])
