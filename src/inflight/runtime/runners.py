"""Runners own an instance's device resources and move a slot's batch through the device.

``CudaRunner``: three streams (host-to-device copies, compute, device-to-host copies) ordered with
per-slot events, so batch k+1's input copy and batch k-1's output copy overlap batch k's compute.
``launch`` only enqueues; ``wait`` (completion thread, or the sync executor) blocks on the slot's
final event, either sleeping in ``cudaEventSynchronize`` on a blocking-sync event or polling
``cudaEventQuery``.

``CpuRunner``: the same contract on the CPU: ``launch`` hands the slot to one compute thread
(torch releases the GIL while it computes) and ``wait`` waits for that slot's result.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from inflight.errors import ClosedError, EngineError
from inflight.runtime import cuda
from inflight.runtime.batch import Buckets, Layout, Slot
from inflight.runtime.engines.base import DeviceEngine, Engine, HostEngine, SlotBuffers

LOGGER = logging.getLogger(__name__)

R = TypeVar("R", bound="Runner")


class Runner(ABC):
    """Device resources of one model instance, shared by its slots.

    A runner is a context manager: leaving the block closes it, and making slots or launching
    after ``close()`` raises ``ClosedError`` (as Polygraphy's ``BaseRunner`` refuses inference
    outside its activation). ``close()`` may be called again: it does nothing the second time.
    """

    layout: Layout
    engine: Engine
    buckets: Buckets
    #: Whether launches may replay CUDA graphs (the executors count replays and eager launches then).
    replays_graphs: bool = False
    #: Set by ``close()``.
    closed: bool = False

    def __enter__(self: R) -> R:
        self.check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_open(self) -> None:
        """Raise ``ClosedError`` when the runner was closed."""
        if self.closed:
            raise ClosedError(f"{type(self).__name__} used after close(): its device resources are released")

    @abstractmethod
    def make_slots(self, n: int) -> list[Slot]:
        """Allocate ``n`` slots (buffers, events) once."""

    @abstractmethod
    def launch(self, slot: Slot) -> int:
        """Start the slot's batch; never blocks on the device.

        Returns:
            How many of the slot's launches (``slot.groups``) replayed a CUDA graph.
        """

    @abstractmethod
    def wait(self, slot: Slot) -> None:
        """Block until the slot's outputs are in its host buffers.

        Raises:
            EngineError: when the batch failed on the device.
        """

    @abstractmethod
    def close(self) -> None:
        """Release every resource (after all slots completed or were abandoned)."""

    def describe(self) -> str:
        """One line for the log."""
        return self.engine.describe()


# ----------------------------------------------------------------------------------------- CUDA
@dataclass(eq=False)
class _CudaSlotState:
    pinned_in: dict[str, cuda.PinnedBuffer]
    pinned_out: dict[str, cuda.PinnedBuffer]
    dev_in: dict[str, cuda.DeviceBuffer]
    dev_out: dict[str, cuda.DeviceBuffer]
    h2d_done: cuda.Event
    compute_done: cuda.Event
    done: cuda.Event
    closed: bool = field(default=False)


class CudaRunner(Runner):
    """Streams, pinned/device buffers and events on one GPU.

    Args:
        engine: The device engine.
        layout: Buffer layout (max items, max sequence).
        buckets: Batch/sequence buckets (graphs are captured per bucket).
        device_id: The GPU.
        wait_mode: ``blocking`` or ``poll``.
    """

    def __init__(
        self, engine: DeviceEngine, layout: Layout, buckets: Buckets, *, device_id: int, wait_mode: str = "blocking"
    ) -> None:
        cuda.require_device(device_id)
        self.replays_graphs = True
        self.engine: DeviceEngine = engine
        self.layout = layout
        self.buckets = buckets
        self.device_id = device_id
        self.wait_mode = wait_mode
        self.h2d = cuda.Stream()
        self.compute = cuda.Stream()
        self.d2h = cuda.Stream()
        self.slots: list[Slot] = []

    def make_slots(self, n: int) -> list[Slot]:
        """Allocate pinned host and device buffers and three events per slot; bind them to the engine."""
        self.check_open()
        spec = self.layout.spec
        for i in range(n):
            pin_in = {t.name: cuda.PinnedBuffer(self.layout.nbytes(t)) for t in spec.inputs}
            pin_out = {t.name: cuda.PinnedBuffer(self.layout.nbytes(t)) for t in spec.outputs}
            dev_in = {t.name: cuda.DeviceBuffer(self.layout.nbytes(t)) for t in spec.inputs}
            dev_out = {t.name: cuda.DeviceBuffer(self.layout.nbytes(t)) for t in spec.outputs}
            state = _CudaSlotState(
                pinned_in=pin_in,
                pinned_out=pin_out,
                dev_in=dev_in,
                dev_out=dev_out,
                h2d_done=cuda.Event(cuda.EventOptions(blocking_sync=False)),
                compute_done=cuda.Event(cuda.EventOptions(blocking_sync=False)),
                # blocking-sync so cudaEventSynchronize sleeps; poll mode queries it instead
                done=cuda.Event(cuda.EventOptions(blocking_sync=True)),
            )
            slot = Slot(
                index=i,
                host_in={t.name: pin_in[t.name].view(t.dtype) for t in spec.inputs},
                host_out={t.name: pin_out[t.name].view(t.dtype) for t in spec.outputs},
                state=state,
            )
            self.engine.bind(
                i,
                SlotBuffers(
                    inputs={k: (b.ptr, b.nbytes) for k, b in dev_in.items()},
                    outputs={k: (b.ptr, b.nbytes) for k, b in dev_out.items()},
                    rows=self.layout.max_items,
                ),
            )
            self.slots.append(slot)
        return self.slots

    def warmup(self, seqs: Sequence[int | None], batch_buckets: tuple[int, ...] | None = None) -> int:
        """Capture graphs for every batch bucket at each sequence bucket in ``seqs``, in order; synchronizes.

        The engine may decline a bucket (graph memory budget); it is then captured on first use.

        Returns:
            The number of graphs the engine holds afterwards.
        """
        for seq in seqs:
            for b in batch_buckets or self.buckets.batch:
                for slot in self.slots:  # engines that share graphs across slots capture once
                    self.engine.capture(slot.index, b, seq, self.compute.ptr)
        self.compute.synchronize()
        return self.engine.graphs()

    def warmup_unpadded(self, seq: int) -> int:
        """Capture the unpadded launches' graph of every token bucket at length ``seq``; synchronizes.

        Returns:
            The number of graphs the engine holds afterwards.
        """
        for tokens in self.buckets.tokens:
            if tokens <= self.layout.max_items * seq:
                self.engine.capture_unpadded(seq, tokens, self.compute.ptr)
        self.compute.synchronize()
        return self.engine.graphs()

    def launch(self, slot: Slot) -> int:
        """H2D on the copy stream, the launches after it, D2H after them; record the slot's events.

        Returns:
            How many of the slot's launches replayed a CUDA graph.
        """
        self.check_open()
        st: _CudaSlotState = slot.state
        assert slot.batch is not None
        for t in self.layout.spec.inputs:
            nbytes = slot.in_elements[t.name] * np.dtype(t.dtype).itemsize
            cuda.copy_h2d(st.dev_in[t.name], st.pinned_in[t.name], nbytes, self.h2d)
        self.h2d.record(st.h2d_done)
        self.compute.wait(st.h2d_done)
        replays = 0
        for group in slot.groups:
            replays += self.engine.enqueue(slot.index, group, self.compute.ptr)
        self.compute.record(st.compute_done)
        self.d2h.wait(st.compute_done)
        real = slot.rows
        for t in self.layout.spec.outputs:
            nbytes = real * self.layout.per_item(t, None) * np.dtype(t.dtype).itemsize
            # the groups' output rows are contiguous from the start of the buffer
            cuda.copy_d2h(st.pinned_out[t.name], st.dev_out[t.name], nbytes, self.d2h)
        self.d2h.record(st.done)
        return replays

    def wait(self, slot: Slot) -> None:
        """Sleep in cudaEventSynchronize (blocking mode) or poll cudaEventQuery (poll mode)."""
        ev: cuda.Event = slot.state.done
        if self.wait_mode == "blocking":
            ev.synchronize()
            return
        spins = 0
        while not ev.query():
            spins += 1
            # yield the GIL; back off to 50 us sleeps once a batch takes long
            time.sleep(0 if spins < 64 else 5e-5)

    def close(self) -> None:
        """Wait for the streams to drain, then free buffers, events, streams and the engine (once)."""
        if self.closed:
            return
        self.closed = True
        for s in (self.h2d, self.compute, self.d2h):
            try:
                s.synchronize()
            except EngineError as e:
                LOGGER.error("stream did not drain cleanly: %s", e)
        self.engine.close()
        for slot in self.slots:
            st: _CudaSlotState = slot.state
            if st.closed:
                continue
            slot.host_in.clear()
            slot.host_out.clear()
            for b in (*st.pinned_in.values(), *st.pinned_out.values()):
                b.close()
            for d in (*st.dev_in.values(), *st.dev_out.values()):
                d.close()
            for ev in (st.h2d_done, st.compute_done, st.done):
                ev.close()
            st.closed = True
        for s in (self.h2d, self.compute, self.d2h):
            s.close()


# ------------------------------------------------------------------------------------------ CPU
@dataclass(eq=False)
class _CpuSlotState:
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class CpuRunner(Runner):
    """One compute thread runs slots in launch order; the same contract as ``CudaRunner``."""

    def __init__(self, engine: HostEngine, layout: Layout, buckets: Buckets) -> None:
        self.engine: HostEngine = engine
        self.layout = layout
        self.buckets = buckets
        self.slots: list[Slot] = []
        self._queue: queue.SimpleQueue[Slot | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="inflight-cpu-compute", daemon=True)
        self._thread.start()

    def make_slots(self, n: int) -> list[Slot]:
        """Allocate host buffers (plain memory) per slot."""
        self.check_open()
        spec = self.layout.spec
        for i in range(n):
            self.slots.append(
                Slot(
                    index=i,
                    host_in={t.name: np.zeros(self.layout.capacity(t), t.dtype) for t in spec.inputs},
                    host_out={t.name: np.zeros(self.layout.capacity(t), t.dtype) for t in spec.outputs},
                    state=_CpuSlotState(),
                )
            )
        return self.slots

    def launch(self, slot: Slot) -> int:
        """Queue the slot for the compute thread (no graphs on the CPU: returns 0)."""
        self.check_open()
        st: _CpuSlotState = slot.state
        st.done.clear()
        st.error = None
        self._queue.put(slot)
        return 0

    def _loop(self) -> None:
        spec, layout = self.layout.spec, self.layout
        while True:
            slot = self._queue.get()
            if slot is None:
                return
            st: _CpuSlotState = slot.state
            try:
                for g in slot.groups:
                    seq = g.bucket[1]
                    ins = {
                        t.name: layout.view(slot.host_in[t.name][g.in_offset[t.name] :], t, g.rows, seq)
                        for t in spec.inputs
                    }
                    outs = {
                        t.name: layout.view(slot.host_out[t.name][g.out_offset[t.name] :], t, g.rows, seq)
                        for t in spec.outputs
                    }
                    self.engine.run(ins, outs)
            except BaseException as e:  # reported to the batch's requests by wait()
                st.error = e
            finally:
                st.done.set()

    def wait(self, slot: Slot) -> None:
        """Wait for the compute thread to finish this slot."""
        st: _CpuSlotState = slot.state
        st.done.wait()
        if st.error is not None:
            raise EngineError(f"batch failed on the CPU: {type(st.error).__name__}: {st.error}") from st.error

    def close(self) -> None:
        """Stop the compute thread (after queued slots) and release the engine (once)."""
        if self.closed:
            return
        self.closed = True
        self._queue.put(None)
        self._thread.join(timeout=60)
        if self._thread.is_alive():
            LOGGER.error("CPU compute thread did not stop within 60 s")
        self.engine.close()
        for slot in self.slots:
            slot.host_in.clear()
            slot.host_out.clear()
