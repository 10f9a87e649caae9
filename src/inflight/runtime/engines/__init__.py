"""Engines behind two small interfaces: on a device (Torch with CUDA graphs, TensorRT) or on the host (Torch)."""

from inflight.runtime.engines.base import DeviceEngine, Engine, HostEngine, SlotBuffers

__all__ = ["DeviceEngine", "Engine", "HostEngine", "SlotBuffers"]
