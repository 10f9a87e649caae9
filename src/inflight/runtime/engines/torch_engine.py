"""The Torch engine: a ``torch.export`` artifact run eagerly or replayed from CUDA graphs.

On the GPU the module runs in fp16 (or fp32) on static tensors that alias each slot's device
buffers, so a captured graph reads the slot's inputs and writes its outputs in place: replaying
it is the whole compute step. Graphs are captured per ``(slot, batch bucket, seq bucket)`` with
torch's CUDA graph API on our own compute stream (``torch.cuda.ExternalStream``) and share one
memory pool (replays are serialized on that stream, so their scratch memory can be shared).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from inflight.errors import EngineError
from inflight.models.registry import ModelSpec
from inflight.runtime.engines.base import Engine, SlotBuffers

LOGGER = logging.getLogger(__name__)


def load_module(artifact: Path, device: str = "cpu") -> Any:
    """Load a ``torch.export`` artifact (``.pt2``) as a module on ``device``.

    Exported graphs record the device and dtype they were traced with: devices in op arguments
    (moved with ``move_to_device_pass``) and ``_assert_tensor_metadata`` checks before ``.to()``
    calls, which would reject the same graph run on the GPU or in fp16. The checks are removed
    (they guard tracing assumptions, not results).

    Raises:
        EngineError: when the file is missing or not an exported program, saying how to build it.
    """
    import torch

    if not artifact.is_file():
        raise EngineError(
            f"Torch artifact {artifact} not found; build it with `inflight build-models` (it writes "
            "<model>_inflight/1/model.pt2) or set the `artifact` parameter"
        )
    try:
        ep = torch.export.load(str(artifact))
    except Exception as e:
        raise EngineError(f"{artifact} is not a loadable torch.export program ({type(e).__name__}: {e})") from None
    if device != "cpu":
        from torch.export.passes import move_to_device_pass

        ep = move_to_device_pass(ep, device)
    gm = ep.module()
    assert_op = torch.ops.aten._assert_tensor_metadata.default
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is assert_op:
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


class TorchEngine(Engine):
    """A ``torch.export`` module on the CPU (fp32) or a GPU (fp16/fp32, CUDA graphs).

    Args:
        artifact: The ``.pt2`` file.
        spec: The model's tensors.
        device_id: CUDA device, or None for the CPU.
        precision: ``fp16`` or ``fp32`` (GPU only; the CPU runs fp32).
        cuda_graphs: Capture graphs (GPU only).
        max_graphs: Cap on captured graphs; further buckets run eagerly.
    """

    kind = "torch"

    def __init__(
        self,
        artifact: Path,
        spec: ModelSpec,
        *,
        device_id: int | None,
        precision: str = "fp16",
        cuda_graphs: bool = True,
        max_graphs: int = 64,
    ) -> None:
        import torch

        self.spec = spec
        self.device_id = device_id
        self.cuda_graphs = cuda_graphs and device_id is not None
        self.max_graphs = max_graphs
        self._torch = torch
        if device_id is None:
            self.dtype = torch.float32
            self.device = torch.device("cpu")
            module = load_module(artifact)
        else:
            self.dtype = torch.float16 if precision == "fp16" else torch.float32
            self.device = torch.device(f"cuda:{device_id}")
            module = load_module(artifact, str(self.device)).to(self.device)
            if self.dtype == torch.float16:
                module = module.half()
        self.module = module
        self._views: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._graphs: dict[tuple[int, int, int | None], Any] = {}
        self._pool: Any = None
        self._capture_failed = False
        self._eager_buckets: set[tuple[int, int | None]] = set()
        self.precision = "fp32" if self.dtype == torch.float32 else "fp16"

    @property
    def on_gpu(self) -> bool:
        """True on a CUDA device."""
        return self.device_id is not None

    def describe(self) -> str:
        """Engine, device, precision and graph mode."""
        if self.device_id is None:
            return f"torch.export engine on CPU (fp32, {self._torch.get_num_threads()} threads)"
        name = self._torch.cuda.get_device_name(self.device_id)
        return (
            f"torch.export engine on GPU {self.device_id} ({name}, {self.precision}, "
            f"CUDA graphs {'on' if self.cuda_graphs else 'off'}, torch {self._torch.__version__})"
        )

    # -- compute --------------------------------------------------------------------------
    def _forward(self, inputs: Mapping[str, Any]) -> Any:
        args = []
        for t in self.spec.inputs:
            x = inputs[t.name]
            if x.is_floating_point() and x.dtype != self.dtype:
                x = x.to(self.dtype)
            args.append(x)
        return self.module(*args)

    def run_host(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        """Run on the CPU from numpy views into numpy views."""
        torch = self._torch
        with torch.inference_mode():
            y = self._forward({k: torch.from_numpy(v) for k, v in inputs.items()})
        name = self.spec.outputs[0].name
        np.copyto(outputs[name], y.numpy(), casting="same_kind")

    # -- GPU ------------------------------------------------------------------------------
    def bind(self, slot: int, buffers: SlotBuffers) -> None:
        """Wrap a slot's device buffers as flat torch tensors (no copy)."""
        from inflight.runtime.cuda import _CudaArray

        assert self.device_id is not None
        torch = self._torch

        def wrap(buf: tuple[int, int], dtype: str) -> Any:
            ptr, nbytes = buf
            count = nbytes // np.dtype(dtype).itemsize
            return torch.as_tensor(_CudaArray(ptr, (count,), np.dtype(dtype)), device=self.device)

        ins = {t.name: wrap(buffers.inputs[t.name], t.dtype) for t in self.spec.inputs}
        outs = {t.name: wrap(buffers.outputs[t.name], t.dtype) for t in self.spec.outputs}
        self._views[slot] = (ins, outs)

    def _step(self, slot: int, rows: int, seq: int | None) -> None:
        ins, outs = self._views[slot]
        args = {t.name: ins[t.name][: _numel(t.shape(rows, seq))].view(t.shape(rows, seq)) for t in self.spec.inputs}
        y = self._forward(args)
        t = self.spec.outputs[0]
        outs[t.name][: _numel(t.shape(rows, seq))].view(t.shape(rows, seq)).copy_(y)

    def capture(self, slot: int, rows: int, seq: int | None, stream_ptr: int) -> bool:
        """Capture the bucket's graph on ``stream_ptr`` (initialize time only: it synchronizes)."""
        if not self.cuda_graphs or self._capture_failed:
            return False
        key = (slot, rows, seq)
        if key in self._graphs:
            return True
        if len(self._graphs) >= self.max_graphs:
            return False
        torch = self._torch
        stream = torch.cuda.ExternalStream(stream_ptr, device=self.device)
        try:
            with torch.inference_mode(), torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: lazy init, cuBLAS handles, autotuning
                    self._step(slot, rows, seq)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            g = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(g, pool=self._pool, stream=stream):
                self._step(slot, rows, seq)
        except Exception as e:  # capture can fail on unsupported ops; fall back once, loudly
            self._capture_failed = True
            LOGGER.warning(
                "CUDA graph capture failed for bucket (batch %d, seq %s): %s: %s; running eagerly from now on",
                rows,
                seq,
                type(e).__name__,
                e,
            )
            torch.cuda.synchronize(self.device)
            return False
        self._graphs[key] = g
        return True

    def enqueue(self, slot: int, rows: int, seq: int | None, stream_ptr: int) -> None:
        """Replay the bucket's graph, or run eagerly, on ``stream_ptr``."""
        torch = self._torch
        g = self._graphs.get((slot, rows, seq))
        stream = torch.cuda.ExternalStream(stream_ptr, device=self.device)
        with torch.cuda.stream(stream):
            if g is not None:
                g.replay()
                return
            if (rows, seq) not in self._eager_buckets:
                self._eager_buckets.add((rows, seq))
                LOGGER.info("bucket (batch %d, seq %s) has no CUDA graph; running it eagerly", rows, seq)
            with torch.inference_mode():
                self._step(slot, rows, seq)

    def graphs(self) -> int:
        """Number of captured graphs."""
        return len(self._graphs)

    def close(self) -> None:
        """Drop graphs, views and weights, and return cached GPU memory."""
        self._graphs.clear()
        self._views.clear()
        self._pool = None
        self.module = None
        if self.device_id is not None:
            torch = self._torch
            torch.cuda.synchronize(self.device)
            # cuBLAS keeps a workspace per (handle, stream) outside the caching allocator's free list
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear is not None:
                clear()
            torch.cuda.empty_cache()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
