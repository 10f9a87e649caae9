"""Engines behind one small interface: Torch (CUDA graphs) and TensorRT (enqueueV3)."""

from inflight.runtime.engines.base import Engine, SlotBuffers

__all__ = ["Engine", "SlotBuffers"]
