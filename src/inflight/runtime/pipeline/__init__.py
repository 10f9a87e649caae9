"""Executors: the stock-equivalent sync loop, the pipelined ring of slots, the overlapped chunks.

Every executor reports each request's outcome (its outputs, or an error) to one ``ResponseSink``, by
the request's handle; the modes (``inflight.runtime.modes``) turn outcomes into Triton responses.

``SyncExecutor`` (the baseline): gather, launch, wait for the device, report the outputs to the sink
before ``run`` returns; one batch at a time, the caller blocked throughout, like Triton's stock backends.

``PipelinedExecutor``: ``submit`` gathers a batch into a free slot, launches it and returns at
once; several batches are in flight. A completion thread waits for slots in launch order,
copies each batch's outputs out of the slot, frees the slot, and hands the responses to a pool
of sender threads, because every Python-backend ``send()`` is a blocking round trip to the
server process (docs/LAB.md, "Toolchain facts": sent one after another they made a pipelined instance slower than
the sync one). When every slot is busy, ``submit`` waits for one (back-pressure), and when too
many batches wait for their responses the completion thread waits; both waits are counted.

``PipelinedExecutor.run`` is the sync executor's path over one slot of the ring (gather, launch,
wait, report the outputs): the ``auto`` mode answers a batch in-band through it, or defers it
through ``submit``, batch by batch (``AutoPolicy``).

``OverlapExecutor`` (mode ``overlap``): the sync mode's return path with the GPU hidden inside one
``execute()``. The batch is cut into chunks at request boundaries; chunk i+1 is gathered and
launched while the GPU runs chunk i, and chunk i's responses are built while the GPU runs chunk
i+1; all of them go back in ``execute()``'s returned list (one message per batch, no ``send()``).

The parts, one owner each, one module each:

* ``stats``: ``Counters`` (fields described once) and ``ExecutorStats``, the executors' counters;
* ``contract``: the ``ResponseSink`` and ``Ranges`` protocols and every failure text an executor writes;
* ``base``: ``ExecutorBase``, the issue path every executor shares (gather, launch, in-band run);
* ``ring``: ``SlotRing``, free and busy slots, back-pressure;
* ``gate``: ``IssueGate``, which holds the sender threads off while the issue path runs;
* ``completion``: ``collect`` (wait for a slot, copy its outputs out) and the ``Completion`` thread;
* ``responses``: ``ResponsePool``, the sender threads and their bounded backlog;
* ``sync``, ``pipelined``, ``overlap``: the executors, each composed of the parts above;
* ``auto``: ``AutoPolicy``, the ``auto`` mode's rule, and ``AutoStats``, the counters it owns.

Stages hand work forward through what they were built with: the completion thread gets the ring's
``release`` and the pool's ``dispatch``, the ring and the pool get the executor's ``IssueGate``; none
calls back into the executor that owns it. No executor checks request values: the mode partitions a
batch into valid and bad requests once, before anything is submitted
(``inflight.runtime.batch.partition_values``).
"""

from inflight.errors import EngineError
from inflight.runtime.pipeline.auto import AutoPolicy, AutoStats
from inflight.runtime.pipeline.completion import Completion, collect
from inflight.runtime.pipeline.contract import Build, NoRanges, Ranges, ResponseSink, Returned, failed_on_device
from inflight.runtime.pipeline.gate import IssueGate
from inflight.runtime.pipeline.overlap import OverlapExecutor, chunk_bounds
from inflight.runtime.pipeline.pipelined import PipelinedExecutor
from inflight.runtime.pipeline.responses import ResponsePool
from inflight.runtime.pipeline.ring import SlotRing
from inflight.runtime.pipeline.stats import Counters, ExecutorStats, MetricKind, StatMetric
from inflight.runtime.pipeline.sync import SyncExecutor

__all__ = [
    "AutoPolicy",
    "AutoStats",
    "Build",
    "Completion",
    "Counters",
    "EngineError",
    "ExecutorStats",
    "IssueGate",
    "MetricKind",
    "NoRanges",
    "OverlapExecutor",
    "PipelinedExecutor",
    "Ranges",
    "ResponsePool",
    "ResponseSink",
    "Returned",
    "SlotRing",
    "StatMetric",
    "SyncExecutor",
    "chunk_bounds",
    "collect",
    "failed_on_device",
]
