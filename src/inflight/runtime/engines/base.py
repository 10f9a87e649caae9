"""The engine interfaces: a device engine (bind, enqueue on a stream, capture graphs) or a host engine (run)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from inflight.runtime.batch import Group


@dataclass(frozen=True)
class SlotBuffers:
    """Device ``(address, bytes)`` of one slot's flat input and output buffers, per tensor name.

    ``rows``: the items the buffers hold (0: not stated).
    """

    inputs: Mapping[str, tuple[int, int]]
    outputs: Mapping[str, tuple[int, int]]
    rows: int = 0


class Engine(ABC):
    """What every engine has: a name, a log line and a release.

    An engine is one of two kinds, and the runner that drives it says which: a
    :class:`DeviceEngine` puts a batch's compute on a CUDA stream without waiting (``CudaRunner``),
    a :class:`HostEngine` computes from host arrays into host arrays (``CpuRunner``).
    """

    #: ``torch`` or ``tensorrt``
    kind: str = ""

    @abstractmethod
    def describe(self) -> str:
        """One line for the server log: engine, device, precision, graphs."""

    @abstractmethod
    def close(self) -> None:
        """Release graphs, contexts and weights."""


class DeviceEngine(Engine):
    """An engine on a CUDA device.

    Bound to each slot's device buffers once (``bind``); ``enqueue`` then puts one launch of a
    batch on a stream without waiting, and ``capture`` records a CUDA graph for a ``(batch, seq)``
    bucket that later ``enqueue`` calls replay.
    """

    @abstractmethod
    def bind(self, slot: int, buffers: SlotBuffers) -> None:
        """Remember (and wrap) a slot's device buffers."""

    @abstractmethod
    def enqueue(self, slot: int, group: Group, stream_ptr: int) -> bool:
        """Enqueue one launch of a slot's batch on ``stream_ptr``; never waits.

        Returns:
            True when the launch replayed a CUDA graph, False when it ran without one.
        """

    def capture(self, slot: int, rows: int, seq: int | None, stream_ptr: int) -> bool:
        """Capture a CUDA graph for the bucket; False when graphs are off or capture failed."""
        return False

    @property
    def unpads(self) -> bool:
        """True when the engine runs launches marked unpadded (``Group.tokens``) without their masked tokens."""
        return False

    def capture_unpadded(self, seq: int, tokens: int, stream_ptr: int) -> bool:
        """Capture the graph of an unpadded launch (``Group.tokens``); False when the engine does not unpad."""
        return False

    def graphs(self) -> int:
        """Number of captured graphs."""
        return 0

    def graph_memory_mb(self) -> float:
        """GPU memory the engine holds beyond what was reserved before it (0 when it does not say)."""
        return 0.0


class HostEngine(Engine):
    """An engine on the host's CPU: computes synchronously from host arrays into host arrays."""

    @abstractmethod
    def run(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        """Compute one launch from ``inputs`` (views of a slot's host buffers) into ``outputs``."""
