"""Thin, owned CUDA objects over cuda-python's runtime bindings.

Shaped after ``cuda.core``: options are dataclasses, objects come from factories, ``close()``
releases explicitly, and every call's status is checked with an error that says how to fix it.
Each object has exactly one owner (a slot or an instance's runner) that closes it on finalize().

``cuda.bindings`` is imported lazily so importing this module needs no GPU.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from inflight.errors import EngineError, NoGPUError

LOGGER = logging.getLogger(__name__)

_rt: Any = None


def runtime() -> Any:
    """The ``cuda.bindings.runtime`` module (imported on first use).

    Raises:
        NoGPUError: when cuda-python is not installed.
    """
    global _rt
    if _rt is None:
        try:
            from cuda.bindings import runtime as rt
        except ImportError:
            try:
                from cuda import cudart as rt  # cuda-python < 12.6
            except ImportError:
                raise NoGPUError(
                    "cuda-python is not installed; `pip install cuda-python` (or 'inflight[cuda]') to run on the GPU"
                ) from None
        _rt = rt
    return _rt


def check(result: Any, what: str) -> Any:
    """Unpack a cuda-python ``(err, *values)`` result; raise on error.

    Raises:
        EngineError: naming the call and CUDA's error name and text.
    """
    if isinstance(result, tuple):
        err, *values = result
    else:
        err, values = result, []
    rt = runtime()
    if int(err) != int(rt.cudaError_t.cudaSuccess):
        _, name = rt.cudaGetErrorName(err)
        _, text = rt.cudaGetErrorString(err)
        raise EngineError(f"{what} failed: {name.decode()} ({text.decode()})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def device_count() -> int:
    """Number of CUDA devices visible (0 when there is no driver or cuda-python)."""
    try:
        rt = runtime()
        err, n = rt.cudaGetDeviceCount()
    except NoGPUError:
        return 0
    return int(n) if int(err) == 0 else 0


def require_device(device_id: int) -> None:
    """Make ``device_id`` current.

    Raises:
        NoGPUError: when no such device exists, saying what to do instead.
    """
    n = device_count()
    if n == 0:
        raise NoGPUError(
            "no CUDA device is visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides it); serve with "
            "instance_group kind KIND_CPU (inflight build-models --kind cpu) or run on a GPU host"
        )
    if device_id >= n:
        raise NoGPUError(
            f"GPU {device_id} requested but only {n} visible; fix instance_group gpus or CUDA_VISIBLE_DEVICES"
        )
    check(runtime().cudaSetDevice(device_id), f"cudaSetDevice({device_id})")


@dataclass(frozen=True, kw_only=True)
class StreamOptions:
    """Options of a CUDA stream.

    Attributes:
        nonblocking: Do not synchronize with the legacy default stream.
    """

    nonblocking: bool = True


@dataclass(frozen=True, kw_only=True)
class EventOptions:
    """Options of a CUDA event.

    Attributes:
        enable_timing: Record timestamps (slower); off for synchronization events.
        blocking_sync: ``cudaEventSynchronize`` sleeps the thread instead of spinning.
    """

    enable_timing: bool = False
    blocking_sync: bool = True


class Stream:
    """An owned CUDA stream."""

    def __init__(self, options: StreamOptions = StreamOptions()) -> None:
        rt = runtime()
        flags = rt.cudaStreamNonBlocking if options.nonblocking else rt.cudaStreamDefault
        self._handle: Any = check(rt.cudaStreamCreateWithFlags(flags), "cudaStreamCreateWithFlags")

    @property
    def handle(self) -> Any:
        """The ``cudaStream_t``."""
        if self._handle is None:
            raise EngineError("stream used after close()")
        return self._handle

    @property
    def ptr(self) -> int:
        """The stream handle as an integer (for torch.cuda.ExternalStream, TensorRT)."""
        return int(self.handle)

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol: ``(version 0, handle)``, a method as the protocol defines it."""
        return (0, self.ptr)

    def wait(self, event: Event) -> None:
        """Make future work on this stream wait for ``event``."""
        check(runtime().cudaStreamWaitEvent(self.handle, event.handle, 0), "cudaStreamWaitEvent")

    def record(self, event: Event) -> Event:
        """Record ``event`` on this stream and return it."""
        check(runtime().cudaEventRecord(event.handle, self.handle), "cudaEventRecord")
        return event

    def synchronize(self) -> None:
        """Block until all work on the stream is done (start-up and shutdown only)."""
        check(runtime().cudaStreamSynchronize(self.handle), "cudaStreamSynchronize")

    def close(self) -> None:
        """Destroy the stream (idempotent)."""
        if self._handle is not None:
            check(runtime().cudaStreamDestroy(self._handle), "cudaStreamDestroy")
            self._handle = None


class Event:
    """An owned CUDA event."""

    def __init__(self, options: EventOptions = EventOptions()) -> None:
        rt = runtime()
        flags = 0
        if not options.enable_timing:
            flags |= rt.cudaEventDisableTiming
        if options.blocking_sync:
            flags |= rt.cudaEventBlockingSync
        self.options = options
        self._handle: Any = check(rt.cudaEventCreateWithFlags(flags), "cudaEventCreateWithFlags")

    @property
    def handle(self) -> Any:
        """The ``cudaEvent_t``."""
        if self._handle is None:
            raise EngineError("event used after close()")
        return self._handle

    def synchronize(self) -> None:
        """Block the calling thread until the event completes."""
        check(runtime().cudaEventSynchronize(self.handle), "cudaEventSynchronize")

    def query(self) -> bool:
        """True when the work before the event has completed (never blocks)."""
        rt = runtime()
        (err,) = rt.cudaEventQuery(self.handle)
        if int(err) == int(rt.cudaError_t.cudaErrorNotReady):
            return False
        check((err,), "cudaEventQuery")
        return True

    def elapsed_ms(self, start: Event) -> float:
        """Milliseconds between ``start`` and this event.

        Raises:
            EngineError: when either event was created without timing; use
                EventOptions(enable_timing=True).
        """
        if not (self.options.enable_timing and start.options.enable_timing):
            raise EngineError("elapsed_ms needs events created with EventOptions(enable_timing=True)")
        return float(check(runtime().cudaEventElapsedTime(start.handle, self.handle), "cudaEventElapsedTime"))

    def close(self) -> None:
        """Destroy the event (idempotent)."""
        if self._handle is not None:
            check(runtime().cudaEventDestroy(self._handle), "cudaEventDestroy")
            self._handle = None


class PinnedBuffer:
    """Page-locked host memory (``cudaHostAlloc``), viewed as numpy arrays."""

    def __init__(self, nbytes: int) -> None:
        rt = runtime()
        self.nbytes = int(nbytes)
        self._ptr: int | None = int(
            check(rt.cudaHostAlloc(max(self.nbytes, 1), rt.cudaHostAllocPortable), f"cudaHostAlloc({self.nbytes} B)")
        )
        raw = (ctypes.c_uint8 * max(self.nbytes, 1)).from_address(self._ptr)
        self._bytes: np.ndarray | None = np.ctypeslib.as_array(raw)
        self._bytes[:] = 0

    @property
    def ptr(self) -> int:
        """Host address."""
        if self._ptr is None:
            raise EngineError("pinned buffer used after close()")
        return self._ptr

    def view(self, dtype: np.dtype | str, count: int | None = None) -> np.ndarray:
        """A flat numpy view of the first ``count`` elements (all when None)."""
        if self._bytes is None:
            raise EngineError("pinned buffer used after close()")
        a = self._bytes.view(np.dtype(dtype))
        return a if count is None else a[:count]

    def close(self) -> None:
        """Free the memory (idempotent); views must no longer be used."""
        if self._ptr is not None:
            self._bytes = None
            check(runtime().cudaFreeHost(self._ptr), "cudaFreeHost")
            self._ptr = None


class DeviceBuffer:
    """Device memory (``cudaMalloc``)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = int(nbytes)
        self._ptr: int | None = int(check(runtime().cudaMalloc(max(self.nbytes, 1)), f"cudaMalloc({self.nbytes} B)"))

    @property
    def ptr(self) -> int:
        """Device address."""
        if self._ptr is None:
            raise EngineError("device buffer used after close()")
        return self._ptr

    def close(self) -> None:
        """Free the memory (idempotent)."""
        if self._ptr is not None:
            check(runtime().cudaFree(self._ptr), "cudaFree")
            self._ptr = None


def copy_h2d(dst: DeviceBuffer, src: PinnedBuffer, nbytes: int, stream: Stream) -> None:
    """Asynchronous host-to-device copy of ``nbytes`` on ``stream``."""
    rt = runtime()
    check(
        rt.cudaMemcpyAsync(dst.ptr, src.ptr, nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream.handle),
        "cudaMemcpyAsync(H2D)",
    )


def copy_d2h(dst: PinnedBuffer, src: DeviceBuffer, nbytes: int, stream: Stream) -> None:
    """Asynchronous device-to-host copy of ``nbytes`` on ``stream``."""
    rt = runtime()
    check(
        rt.cudaMemcpyAsync(dst.ptr, src.ptr, nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream.handle),
        "cudaMemcpyAsync(D2H)",
    )


def mem_info() -> tuple[int, int]:
    """``(free, total)`` bytes of the current device."""
    free, total = check(runtime().cudaMemGetInfo(), "cudaMemGetInfo")
    return int(free), int(total)


def device_name(device_id: int = 0) -> str:
    """The device's marketing name."""
    props = check(runtime().cudaGetDeviceProperties(device_id), "cudaGetDeviceProperties")
    name = props.name
    return (name.decode() if isinstance(name, bytes) else str(name)).rstrip("\x00")


class CudaArray:
    """A device pointer seen as an array through ``__cuda_array_interface__`` (version 3), no copy.

    ``torch.as_tensor(CudaArray(ptr, shape, dtype), device=...)`` wraps device memory that this
    module allocated (a ``DeviceBuffer``); the buffer's owner keeps it alive.

    Args:
        ptr: The device address.
        shape: The array's shape (C order).
        dtype: Its element type.
    """

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": np.dtype(dtype).str,
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }
