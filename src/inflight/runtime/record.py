"""The ``finalized`` record an instance logs at unload: each figure, its owner, and how it combines.

``InflightModel.finalize`` logs one JSON record per instance (``<model> (<instance>) finalized (drained): {...}``).
Its figures come from their owners: the executor's counters (``ExecutorStats``, each described in its
field's metadata), the ``auto`` policy's (``AutoStats``, likewise), the execute thread's timing
(``ExecuteTiming``), the garbage collector's pauses (``GcWatch``), the GIL probe (``GilProbe``), the
metrics publisher (``MetricsPublisher``) and the instance itself (:data:`INSTANCE_FIGURES`).
:data:`FIGURES` is their union, which the load-test parser (``inflight.loadtest.stats.executor_breakdown``)
reads through :func:`combine`: a figure renamed or dropped here fails the parser's tests rather than
reading as zero.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from inflight.runtime.gcwatch import GcWatch
from inflight.runtime.metrics import MetricsPublisher
from inflight.runtime.pipeline.auto import AutoStats
from inflight.runtime.pipeline.stats import Aggregation, ExecutorStats
from inflight.runtime.probes import ExecuteTiming, GilProbe

#: The figures ``InflightModel._final_stats`` adds itself: the requests' reading and tokenizing (with the texts
#: the ``tokenizers`` library encoded, not the word cache: ``TextEncoder.library_texts``), the responses' building
#: and ``send()`` calls, and how long the unload took.
INSTANCE_FIGURES: dict[str, Aggregation] = {
    "parse_s": "sum",
    "tokenize_s": "sum",
    "tokenize_max_s": "max",
    "tokenize_library_texts": "sum",
    "build_s": "sum",
    "send_call_s": "sum",
    "close_s": "sum",
    "finalize_s": "sum",
}

#: Every number of the record, by owner, and how it combines over instances.
FIGURES: dict[str, Aggregation] = {
    **ExecutorStats.aggregations(),
    **AutoStats.aggregations(),
    **ExecuteTiming.FIGURES,
    **GcWatch.FIGURES,
    **GilProbe.FIGURES,
    **MetricsPublisher.FIGURES,
    **INSTANCE_FIGURES,
}

#: Figures the runtime no longer logs that older records carry (read from results files): ``auto_explored``
#: counted ``auto``'s in-band batches while it deferred, before 2026-11-26.
RETIRED: dict[str, Aggregation] = {"auto_explored": "sum"}


class Combined(Mapping[str, float]):
    """A model's figures over its instances (a read-only mapping of the figures present in any record).

    Reading a figure that is not in :data:`FIGURES` is a programming error and raises ``KeyError``
    naming it, whether or not a record carried it.
    """

    def __init__(self, values: dict[str, float]) -> None:
        self._values = values

    def __getitem__(self, key: str) -> float:
        _declared(key)
        return self._values[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The figure, or ``default`` where no record carried it."""
        _declared(key)
        return self._values.get(key, default)

    def __contains__(self, key: object) -> bool:
        _declared(str(key))
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def _declared(key: str) -> None:
    if key not in FIGURES and key not in RETIRED:
        raise KeyError(f"{key!r} is not a figure of the finalized record (inflight.runtime.record.FIGURES)")


def combine(records: Sequence[Mapping[str, object]]) -> Combined:
    """Each number of the records, combined over them as :data:`FIGURES` says.

    ``sum`` adds the instances' values, ``max`` takes the largest, ``mean`` divides the sum by the
    number of records (an instance that lacks the figure counts as 0). A number the runtime does not
    declare (an older file's) is summed.
    """
    tot: dict[str, float] = {}
    peak: dict[str, float] = {}
    for r in records:
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                tot[k] = tot.get(k, 0.0) + float(v)
                peak[k] = max(peak.get(k, float(v)), float(v))
    out: dict[str, float] = {}
    for k, total in tot.items():
        agg = FIGURES.get(k) or RETIRED.get(k, "sum")
        out[k] = peak[k] if agg == "max" else total / len(records) if agg == "mean" else total
    return Combined(out)
