"""The TensorRT engine: ``enqueueV3`` (``execute_async_v3``) on our streams, one context per slot.

Works with the ``tensorrt`` module (TensorRT 10, NGC containers) and with ``tensorrt_rtx``
(TensorRT-RTX, same Builder/Runtime/IExecutionContext API). Each slot gets its own execution
context with its own optimization profile, as TensorRT requires for contexts that may run
concurrently; the plan must therefore hold at least ``slots`` profiles
(``scripts/build_engine.py --profiles N``).

Per slot and bucket: ``set_input_shape``, ``set_tensor_address`` (once per slot: addresses never
change), ``set_input_consumed_event`` and ``execute_async_v3(stream)``. With ``cuda_graphs``, the
first enqueue of a bucket is followed by a stream capture of a second one; later batches of that
bucket replay the graph after restoring the context's input shape.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from inflight.errors import EngineError
from inflight.models.spec import ModelSpec
from inflight.runtime import cuda
from inflight.runtime.batch import Group
from inflight.runtime.engines.base import DeviceEngine, SlotBuffers

if TYPE_CHECKING:
    import tensorrt as trt

LOGGER = logging.getLogger(__name__)


def import_tensorrt() -> ModuleType | None:
    """``tensorrt`` or ``tensorrt_rtx`` when one is importable *and* real (not only type stubs)."""
    import importlib

    for name in ("tensorrt", "tensorrt_rtx"):
        try:
            mod = importlib.import_module(name)
        except Exception:  # ImportError, or a broken install raising on import
            continue
        if hasattr(mod, "Runtime"):
            return mod
    return None


class TensorRTEngine(DeviceEngine):
    """A serialized TensorRT plan executed with ``execute_async_v3``.

    Args:
        plan: The ``.plan`` file.
        spec: The model's tensors.
        device_id: CUDA device.
        slots: Contexts to create (one per slot, each with its own profile).
        cuda_graphs: Capture and replay CUDA graphs per (slot, bucket).

    Raises:
        EngineError: when TensorRT is missing, the plan is missing or refused (the runtime's
            message is quoted: e.g. TensorRT-RTX refuses compute capability 9.0), or the plan
            has fewer profiles than slots.
    """

    kind = "tensorrt"

    def __init__(self, plan: Path, spec: ModelSpec, *, device_id: int, slots: int, cuda_graphs: bool = True) -> None:
        mod = import_tensorrt()
        if mod is None:
            raise EngineError(
                "TensorRT is not importable (neither `tensorrt` nor `tensorrt_rtx`); use engine=torch, or run in an "
                "NGC Triton container where TensorRT is installed"
            )
        self.trt: Any = mod
        self.spec = spec
        self.device_id = device_id
        self.cuda_graphs = cuda_graphs
        if not plan.is_file():
            raise EngineError(
                f"TensorRT plan {plan} not found; build it with `python scripts/build_engine.py --model {spec.name}` "
                "on the GPU that will run it"
            )
        self._log = _Logger(mod)
        self.runtime: trt.Runtime | None = mod.Runtime(self._log)
        assert self.runtime is not None
        engine: trt.ICudaEngine | None = self.runtime.deserialize_cuda_engine(plan.read_bytes())
        self.engine = engine
        if self.engine is None:
            raise EngineError(
                f"{mod.__name__} {getattr(mod, '__version__', '?')} refused plan {plan}: "
                f"{'; '.join(self._log.errors[-3:]) or 'no message'}; rebuild the plan on this GPU and TensorRT version"
            )
        check_plan_io(self.engine, spec, plan)
        profiles = int(self.engine.num_optimization_profiles)
        if profiles < slots:
            raise EngineError(
                f"plan {plan} has {profiles} optimization profile(s) but {slots} slots need one each; rebuild with "
                f"`scripts/build_engine.py --profiles {slots}` or set slots={profiles}"
            )
        self._contexts: dict[int, trt.IExecutionContext] = {}
        self._shapes: dict[int, tuple[int, int | None]] = {}
        self._consumed: dict[int, cuda.Event] = {}
        self._graphs: dict[tuple[int, int, int | None], Any] = {}
        self._buffers: dict[int, SlotBuffers] = {}

    def _engine(self) -> trt.ICudaEngine:
        if self.engine is None:
            raise EngineError("TensorRT engine used after close()")
        return self.engine

    def describe(self) -> str:
        """Engine, device and graph mode."""
        return (
            f"{self.trt.__name__} {getattr(self.trt, '__version__', '?')} engine on GPU {self.device_id} "
            f"({self._engine().num_optimization_profiles} profiles, CUDA graphs {'on' if self.cuda_graphs else 'off'})"
        )

    def bind(self, slot: int, buffers: SlotBuffers) -> None:
        """Create the slot's context on profile ``slot`` and set its tensor addresses."""
        ctx = self._engine().create_execution_context()
        if ctx is None:
            raise EngineError(f"TensorRT could not create an execution context for slot {slot} (out of GPU memory?)")
        stream = cuda.Stream()
        try:
            if not ctx.set_optimization_profile_async(slot, stream.ptr):
                raise EngineError(f"set_optimization_profile_async({slot}) failed")
            stream.synchronize()  # initialize time only
        finally:
            stream.close()
        for name, (ptr, _) in {**buffers.inputs, **buffers.outputs}.items():
            if not ctx.set_tensor_address(name, ptr):
                raise EngineError(f"plan has no tensor {name!r}; rebuild it from this model's ONNX file")
        ev = cuda.Event(cuda.EventOptions(blocking_sync=False))
        ctx.set_input_consumed_event(int(ev.handle))
        self._consumed[slot] = ev
        self._contexts[slot] = ctx
        self._buffers[slot] = buffers

    def _set_shapes(self, slot: int, rows: int, seq: int | None) -> None:
        if self._shapes.get(slot) == (rows, seq):
            return
        ctx = self._contexts[slot]
        for t in self.spec.inputs:
            if not ctx.set_input_shape(t.name, t.shape(rows, seq)):
                raise EngineError(
                    f"TensorRT rejected shape {t.shape(rows, seq)} for {t.name!r}: outside the plan's profile; "
                    "rebuild with a wider --max-batch/--max-seq"
                )
        self._shapes[slot] = (rows, seq)

    def enqueue(self, slot: int, group: Group, stream_ptr: int) -> bool:
        """Replay the bucket's graph or call ``execute_async_v3``.

        A launch at the start of the slot's buffers runs at its bucket (graph replay when
        captured). A later launch of a batch cut into groups runs at its real rows from its
        offsets, without a graph (graphs record the slot's base addresses), and the base
        addresses are restored after it.
        """
        rows, seq = group.bucket
        at_base = all(v == 0 for v in group.in_offset.values())
        if at_base:
            return self._launch(slot, rows, seq, stream_ptr)
        ctx = self._contexts[slot]
        buffers = self._buffers[slot]
        item = {t.name: np.dtype(t.dtype).itemsize for t in (*self.spec.inputs, *self.spec.outputs)}
        offsets = {**group.in_offset, **group.out_offset}
        try:
            for name, (ptr, _) in {**buffers.inputs, **buffers.outputs}.items():
                ctx.set_tensor_address(name, ptr + offsets[name] * item[name])
            self._set_shapes(slot, group.rows, seq)
            if not ctx.execute_async_v3(stream_ptr):
                raise EngineError(
                    f"execute_async_v3 failed for {group.rows} rows at seq {seq}: {self._log.errors[-1:]}"
                )
        finally:
            for name, (ptr, _) in {**buffers.inputs, **buffers.outputs}.items():
                ctx.set_tensor_address(name, ptr)
        return False

    def _launch(self, slot: int, rows: int, seq: int | None, stream_ptr: int) -> bool:
        self._set_shapes(slot, rows, seq)
        g = self._graphs.get((slot, rows, seq))
        if g is not None:
            rt = cuda.runtime()
            cuda.check(rt.cudaGraphLaunch(g, stream_ptr), "cudaGraphLaunch")
            return True
        if not self._contexts[slot].execute_async_v3(stream_ptr):
            raise EngineError(f"execute_async_v3 failed for bucket (batch {rows}, seq {seq}): {self._log.errors[-1:]}")
        return False

    def capture(self, slot: int, rows: int, seq: int | None, stream_ptr: int) -> bool:
        """Enqueue once (TensorRT's deferred set-up), then capture a second enqueue."""
        if not self.cuda_graphs:
            return False
        rt = cuda.runtime()
        self._launch(slot, rows, seq, stream_ptr)
        cuda.check(rt.cudaStreamSynchronize(stream_ptr), "cudaStreamSynchronize")
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        cuda.check(rt.cudaStreamBeginCapture(stream_ptr, mode), "cudaStreamBeginCapture")
        ok = self._contexts[slot].execute_async_v3(stream_ptr)
        graph = cuda.check(rt.cudaStreamEndCapture(stream_ptr), "cudaStreamEndCapture")
        if not ok:
            LOGGER.warning(
                "TensorRT enqueue could not be captured for bucket (batch %d, seq %s); not using a graph", rows, seq
            )
            return False
        exe = cuda.check(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        cuda.check(rt.cudaGraphDestroy(graph), "cudaGraphDestroy")
        self._graphs[(slot, rows, seq)] = exe
        return True

    def graphs(self) -> int:
        """Number of captured graphs."""
        return len(self._graphs)

    def close(self) -> None:
        """Destroy graphs, contexts, events, the engine and the runtime."""
        rt = cuda.runtime()
        for exe in self._graphs.values():
            cuda.check(rt.cudaGraphExecDestroy(exe), "cudaGraphExecDestroy")
        self._graphs.clear()
        self._contexts.clear()
        for ev in self._consumed.values():
            ev.close()
        self._consumed.clear()
        self.engine = None
        self.runtime = None


class _Logger:
    """A TensorRT ILogger that keeps errors (for messages) and forwards to ``logging``."""

    def __new__(cls, mod: Any) -> Any:
        base: Any = mod.ILogger

        class Logger(base):
            def __init__(self) -> None:
                base.__init__(self)
                self.errors: list[str] = []

            def log(self, severity: Any, msg: str) -> None:
                if severity <= mod.ILogger.Severity.ERROR:
                    self.errors.append(msg)
                    LOGGER.error("TensorRT: %s", msg)
                elif severity <= mod.ILogger.Severity.WARNING:
                    LOGGER.warning("TensorRT: %s", msg)

        return Logger()


#: numpy dtype name of each TensorRT ``DataType`` name the config's tensors may have.
_TRT_DTYPES = {"INT64": "int64", "INT32": "int32", "FLOAT": "float32", "HALF": "float16", "BOOL": "bool"}


def check_plan_io(engine: Any, spec: ModelSpec, plan: Path) -> None:
    """Check a plan's I/O tensors against the model's config: the same names, kinds, datatypes and ranks.

    Raises:
        ConfigError: naming the first mismatch and the fix.
    """
    from inflight.errors import ConfigError

    names = [engine.get_tensor_name(i) for i in range(int(engine.num_io_tensors))]
    want = {t.name: (t, "input") for t in spec.inputs} | {t.name: (t, "output") for t in spec.outputs}
    fix = "rebuild the plan from this model's ONNX file (scripts/build_engine.py) or correct config.pbtxt"
    if sorted(names) != sorted(want):
        raise ConfigError(f"plan {plan} has tensors {sorted(names)}; the config gives {sorted(want)}: {fix}")
    for name in names:
        t, role = want[name]
        mode = str(engine.get_tensor_mode(name)).rsplit(".", 1)[-1].lower()
        dtype = _TRT_DTYPES.get(str(engine.get_tensor_dtype(name)).rsplit(".", 1)[-1], "?")
        rank = len(engine.get_tensor_shape(name))
        if mode != role or (dtype != t.dtype and role == "input") or rank != len(t.dims) + 1:
            raise ConfigError(
                f"plan {plan}: {mode} {name!r} is {dtype} of rank {rank}; the config's {role} is {t.triton_type} "
                f"[batch, {', '.join(map(str, t.dims))}]: {fix}"
            )
