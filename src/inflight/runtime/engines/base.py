"""The engine interface: bind a slot's buffers, enqueue on a stream, capture graphs."""

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
    """Runs a model on one device.

    GPU engines are bound to each slot's device buffers once (``bind``), then ``enqueue`` puts
    one batch's compute on a stream without waiting; ``capture`` records a CUDA graph for a
    ``(batch, seq)`` bucket that later ``enqueue`` calls replay. CPU engines implement
    ``run_host`` instead.
    """

    #: ``torch`` or ``tensorrt``
    kind: str = ""

    @property
    @abstractmethod
    def on_gpu(self) -> bool:
        """True when the engine runs on a CUDA device."""

    @abstractmethod
    def describe(self) -> str:
        """One line for the server log: engine, device, precision, graphs."""

    def bind(self, slot: int, buffers: SlotBuffers) -> None:
        """Remember (and wrap) a slot's device buffers (GPU engines)."""
        raise NotImplementedError(f"{type(self).__name__} does not run on the GPU")

    def enqueue(self, slot: int, group: Group, stream_ptr: int) -> bool:
        """Enqueue one launch of a slot's batch on ``stream_ptr``; never waits (GPU engines).

        Returns:
            True when the launch replayed a CUDA graph, False when it ran without one.
        """
        raise NotImplementedError(f"{type(self).__name__} does not run on the GPU")

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

    def run_host(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        """Compute synchronously from host arrays into host arrays (CPU engines)."""
        raise NotImplementedError(f"{type(self).__name__} does not run on the CPU")

    @abstractmethod
    def close(self) -> None:
        """Release graphs, contexts and weights."""
