"""The executors' counters: ``ExecutorStats``, each field described once, and where it is published."""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

#: How a field of ``ExecutorStats`` is published: ``counter`` (its increase), ``gauge`` (its value) or
#: ``histogram`` (observations the publisher drains).
MetricKind = Literal["counter", "gauge", "histogram"]
#: How a figure of the ``finalized`` record combines over a model's instances: summed, the largest, or the
#: mean over instances (``inflight.runtime.record``).
Aggregation = Literal["sum", "max", "mean"]


@dataclass(frozen=True)
class StatMetric:
    """Where a counter of ``ExecutorStats`` shows at Triton's metrics endpoint.

    Attributes:
        name: The metric family's name.
        kind: How it is published.
    """

    name: str
    kind: MetricKind


def _meta(
    doc: str, metric: str | None = None, kind: MetricKind = "counter", agg: Aggregation = "sum"
) -> dict[str, Any]:
    """A field's metadata: what it counts (``doc``, its one description), where it is published, how it combines.

    ``metric`` and ``kind`` name the published metric (None: logged only); ``agg`` says how the field
    combines over a model's instances in the ``finalized`` records (``inflight.runtime.record``).
    """
    return {"doc": doc, "metric": StatMetric(metric, kind) if metric else None, "agg": agg}


def stat_field(
    doc: str, metric: str | None = None, kind: MetricKind = "counter", default: float = 0, agg: Aggregation = "sum"
) -> Any:
    """A number field of a ``Counters`` dataclass (see ``_meta``)."""
    return field(default=default, metadata=_meta(doc, metric, kind, agg))


class Counters:
    """A dataclass of counters whose fields each carry their one description (``stat_field`` metadata).

    ``published()`` lists the fields a metrics publisher loops over, ``aggregations()`` how each number
    combines over instances, ``snapshot()`` the values for the ``finalized`` record.
    """

    #: Fields that are not single numbers (left out of ``aggregations`` and handled by ``snapshot``).
    NOT_NUMBERS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def published(cls, kind: MetricKind) -> list[tuple[str, StatMetric, str]]:
        """``(field, metric, description)`` of every field published as ``kind``."""
        return [
            (f.name, f.metadata["metric"], f.metadata["doc"])
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.metadata["metric"] is not None and f.metadata["metric"].kind == kind
        ]

    @classmethod
    def aggregations(cls) -> dict[str, Aggregation]:
        """How each number field combines over instances."""
        return {
            f.name: f.metadata["agg"]
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.name not in cls.NOT_NUMBERS
        }

    def snapshot(self) -> dict[str, Any]:
        """A plain-dict copy of the number fields (for logs and tests)."""
        return {k: v for k, v in self.__dict__.items() if k not in self.NOT_NUMBERS}


@dataclass
class ExecutorStats(Counters):
    """Counters of one executor (cumulative; read by the metrics publisher on the execute thread).

    Each field is described once, in its metadata: ``doc`` (what it counts, also the metric's
    description) and ``metric`` (a ``StatMetric``, or None where it is only logged). ``published()``
    lists the published ones; the metrics publisher loops over them. The ``auto`` policy's counters are
    its own (``inflight.runtime.pipeline.auto.AutoStats``).
    """

    NOT_NUMBERS: ClassVar[tuple[str, ...]] = ("depth_launches", "batch_sizes")

    batches: int = stat_field("Batches launched.", "inflight_batches_total")
    requests: int = stat_field("Requests launched.")
    items: int = stat_field("Items (rows) launched, without padding.", "inflight_items_total")
    padded_items: int = stat_field("Rows launched including bucket padding.", "inflight_padded_items_total")
    launches: int = stat_field(
        "Engine launches (a batch is one per sequence bucket, or more when cut; see ``Group``).",
        "inflight_launches_total",
    )
    real_tokens: int = stat_field(
        "Items x their own lengths (variable-length models; items otherwise).", "inflight_real_tokens_total"
    )
    padded_tokens: int = stat_field(
        "Tokens the launches computed: bucket rows x bucket length, or the token bucket of an unpadded "
        "launch; ``padded_tokens / real_tokens - 1`` is the padding waste (below 0 when unpadded launches "
        "left the requests' masked tokens out).",
        "inflight_padded_tokens_total",
    )
    unpadded_launches: int = stat_field(
        "Launches run unpadded (masked tokens left out on the device).", "inflight_unpadded_launches_total"
    )
    mixed_length_batches: int = stat_field(
        "Batches whose requests fell in more than one sequence bucket.", "inflight_mixed_length_batches_total"
    )
    graph_replays: int = stat_field("Launches replayed from a CUDA graph.", "inflight_graph_replays_total")
    eager_launches: int = stat_field(
        "Launches run eagerly (no graph: graphs off, capture failed, or the first use of a bucket captured lazily).",
        "inflight_eager_launches_total",
    )
    failed_batches: int = stat_field("Batches that failed on the device.", "inflight_failed_batches_total")
    responses: int = stat_field("Responses sent through ``send()`` (outputs).")
    error_responses: int = stat_field("Error responses sent through ``send()``.", "inflight_error_responses_total")
    depth_launches: list[int] = field(
        default_factory=lambda: [0] * 65,
        metadata=_meta(
            "How many launches found k batches in flight (index k = depth incl. itself); published as a uniform "
            "sample of at most 8 launches per publication.",
            "inflight_launch_depth",
            "histogram",
        ),
    )
    max_depth: int = stat_field("Deepest pipeline seen.", agg="max")
    slot_waits: int = stat_field("Times ``execute()`` found every slot busy.", "inflight_slot_waits_total")
    slot_wait_s: float = stat_field(
        "Time ``execute()`` waited for a free slot.", "inflight_slot_wait_seconds_total", default=0.0
    )
    gather_s: float = stat_field("Issue-path time copying request inputs into slots.", default=0.0)
    slot_s: float = stat_field(
        "Execute-thread time taking and returning in-band batches' slots (the ring's ``acquire`` and "
        "``release``; the sync executor's depth count): what auto's in-band path costs over sync's.",
        default=0.0,
    )
    launch_s: float = stat_field("Issue-path time enqueueing copies and compute.", default=0.0)
    # the longest of each step of one batch (where an execute() over 10 ms spent it)
    parse_max_s: float = stat_field("Longest reading of one batch's requests (``Mode.take``).", default=0.0, agg="max")
    gather_max_s: float = stat_field("Longest gather of one batch.", default=0.0, agg="max")
    launch_max_s: float = stat_field("Longest launch of one batch.", default=0.0, agg="max")
    wait_max_s: float = stat_field("Longest in-band wait for the device of one batch.", default=0.0, agg="max")
    build_max_s: float = stat_field("Longest building of one in-band batch's responses.", default=0.0, agg="max")
    send_s: float = stat_field(
        "Time spent in response ``send()`` calls (summed over sender threads).",
        "inflight_send_seconds_total",
        default=0.0,
    )
    send_waits: int = stat_field(
        "Times a completed batch waited because ``response_backlog`` batches awaited their responses.",
        "inflight_response_backlog_waits_total",
    )
    send_wait_s: float = stat_field(
        "Total time of those waits.", "inflight_response_backlog_wait_seconds_total", default=0.0
    )
    respond_latency_s: float = stat_field(
        "Summed time from a batch's outputs on the host to its last response sent.",
        "inflight_respond_seconds_total",
        default=0.0,
    )
    device_wait_s: float = stat_field(
        "Time the completion side waited for the device.", "inflight_device_wait_seconds_total", default=0.0
    )
    chunks: int = stat_field(
        "Chunks launched (overlap mode; each is one batch in a slot, counted in ``batches`` too).",
        "inflight_chunks_total",
    )
    overlap_batches: int = stat_field("Batches (``execute()`` calls) the overlap executor ran.")
    inline_wait_s: float = stat_field(
        "Time the execute thread waited for the device (every batch answered in-band: sync, overlap, auto's).",
        default=0.0,
    )
    batch_sizes: deque[int] = field(
        default_factory=lambda: deque(maxlen=100_000),
        metadata=_meta(
            "Items per executed batch, before padding (recent batches, bounded; drained by the metrics publisher, "
            "which publishes a uniform sample of at most 8 of them per publication: exact totals are "
            "inflight_batches_total and inflight_items_total).",
            "inflight_batch_size",
            "histogram",
        ),
    )

    def snapshot(self) -> dict[str, Any]:
        """A plain-dict copy (for logs and tests)."""
        d = super().snapshot()
        d["depth_launches"] = {i: n for i, n in enumerate(self.depth_launches) if n}
        return d
