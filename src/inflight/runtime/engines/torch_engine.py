"""The Torch engines: a ``torch.export`` artifact, compiled by inductor, replayed from CUDA graphs.

``TorchEngine`` runs on a GPU, ``TorchHostEngine`` on the CPU (fp32). On the GPU the module runs in
fp16, bf16 or fp32, compiled with ``torch.compile`` (inductor, dynamic batch and sequence axes: one
program for every bucket), on static tensors the engine owns. A launch copies its rows from the
slot's device buffers into them, replays the graph of its ``(batch bucket, seq bucket)``, and
copies the output rows back, all on the runner's compute stream. Graphs are captured with torch's
CUDA graph API on that stream (``torch.cuda.ExternalStream``), one per bucket for every slot, and
share one memory pool: replays are serialized on that stream and everything a graph allocates is
scratch, so they can share it.

With ``unpad`` (models whose module has ``forward_unpadded``, see ``ModelSpec.unpadded``), a launch
the batch plan marks unpadded (``Group.tokens``) leaves its masked tokens out on the device: the
graph of its ``(sequence bucket, token bucket)`` lays the kept tokens of the static rows end to end
(``inflight.models.packing.unpad_rows``) and runs the module over them, FlashAttention's
variable-length kernel doing each row's attention. The module is the artifact's weights in the
model's own ``make_module`` (an exported program has one ``forward`` only), compiled once.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, get_args

import numpy as np

from inflight.errors import EngineError
from inflight.model_config import CompileMode
from inflight.models.artifact import load_module
from inflight.models.spec import ModelSpec
from inflight.runtime.batch import Group, Layout
from inflight.runtime.engines.base import DeviceEngine, HostEngine, SlotBuffers

LOGGER = logging.getLogger(__name__)


#: Compile modes of ``TorchEngine``, from ``CompileMode`` (``auto``: the model's ``gpu_compile`` on a GPU, none on the
#: CPU; ``max-autotune``: inductor timing its GEMM templates against cuBLAS, without its own CUDA graphs, which the
#: engine captures itself).
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)

_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


class GraphKey(NamedTuple):
    """The launch one CUDA graph replays.

    Attributes:
        rows: Batch bucket of a padded launch; the static rows of an unpadded one.
        seq: Sequence bucket (None: fixed shapes).
        tokens: Token bucket of an unpadded launch (masked tokens left out); None for a padded one.
    """

    rows: int
    seq: int | None
    tokens: int | None = None

    def __str__(self) -> str:
        """The key as the log names it."""
        if self.tokens is not None:
            return f"unpadded bucket (seq {self.seq}, {self.tokens} tokens)"
        return f"bucket (batch {self.rows}, seq {self.seq})"


def _compile_mode(compile: str, spec: ModelSpec, on_gpu: bool) -> str:
    """``inductor``, ``max-autotune`` or ``none`` for a ``compile`` parameter.

    ``auto`` is the model's measured choice on a GPU (``spec.gpu_compile``: none for linear_head,
    whose layers are one cuBLASLt GEMM-bias-ReLU kernel each, inductor for the others) and none on
    the CPU.
    """
    if compile not in COMPILE_MODES:
        raise EngineError(f"compile={compile!r}: choose one of {list(COMPILE_MODES)}")
    if compile == "auto":
        return spec.gpu_compile if on_gpu else "none"
    return compile


def _compiled(module: Any, mode: str) -> Any:
    """``module`` through ``torch.compile`` (dynamic batch and sequence axes) unless ``mode`` is ``none``."""
    if mode == "none":
        return module
    import torch

    # dynamic: one compiled program for every bucket (a static one would recompile per shape); the
    # engine captures its own CUDA graphs, so max-autotune runs without inductor's
    return torch.compile(module, dynamic=True, mode="max-autotune-no-cudagraphs" if mode == "max-autotune" else None)


def _forward(module: Any, spec: ModelSpec, dtype: Any, inputs: Mapping[str, Any]) -> Any:
    """Call ``module`` on the spec's inputs in order, floating-point ones cast to ``dtype``."""
    args = []
    for t in spec.inputs:
        x = inputs[t.name]
        if x.is_floating_point() and x.dtype != dtype:
            x = x.to(dtype)
        args.append(x)
    return module(*args)


_HOW = {"inductor": "inductor-compiled", "max-autotune": "inductor-compiled (max-autotune)", "none": "eager"}


class TorchHostEngine(HostEngine):
    """A ``torch.export`` module on the CPU, fp32 (the CPU host's engine and the reference path).

    Args:
        artifact: The ``.pt2`` file.
        spec: The model's tensors.
        compile: ``inductor`` or ``max-autotune`` (``torch.compile``, dynamic batch and sequence
            axes), ``none``, or ``auto`` (none on the CPU).
    """

    kind = "torch"

    def __init__(self, artifact: Path, spec: ModelSpec, *, compile: str = "auto") -> None:
        import torch

        self.compile_mode = _compile_mode(compile, spec, on_gpu=False)
        self.compiled = self.compile_mode != "none"
        self.spec = spec
        self.precision = "fp32"
        self._torch = torch
        t0 = time.perf_counter()
        self.module: Any = _compiled(load_module(artifact, spec=spec), self.compile_mode)
        self.load_s = time.perf_counter() - t0

    def describe(self) -> str:
        """Engine, precision, compile mode and threads."""
        how = _HOW[self.compile_mode]
        return f"torch.export engine on CPU (fp32, {how}, {self._torch.get_num_threads()} threads)"

    def run(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        """Run from numpy views into numpy views."""
        torch = self._torch
        with torch.inference_mode():
            y = _forward(self.module, self.spec, torch.float32, {k: torch.from_numpy(v) for k, v in inputs.items()})
        np.copyto(outputs[self.spec.outputs[0].name], y.numpy(), casting="same_kind")

    def close(self) -> None:
        """Drop the module."""
        self.module = None


class TorchEngine(DeviceEngine):
    """A ``torch.export`` module on a GPU (fp16/bf16/fp32, compiled, CUDA graphs).

    Every launch runs on the engine's own static input and output tensors, sized for the largest
    bucket: the launch copies its rows in from the slot's device buffers, replays the ``(batch,
    seq)`` bucket's graph, and copies the rows out. Graphs are therefore shared by all slots (one
    per bucket, not one per slot and bucket), and a launch may start at any offset of the slot's
    buffers (a batch of several sequence buckets is several launches).

    Args:
        artifact: The ``.pt2`` file.
        spec: The model's tensors.
        device_id: CUDA device.
        precision: ``fp16``, ``bf16`` or ``fp32``.
        cuda_graphs: Capture graphs.
        max_graphs: Graphs kept at once; beyond it the least recently used is dropped.
        compile: ``inductor`` (``torch.compile``, dynamic batch and sequence axes), ``max-autotune``
            (the same, each GEMM chosen by timing inductor's templates against cuBLAS), ``none``, or
            ``auto`` (inductor).
        graph_memory_mb: Budget for graph memory (``capture`` returns False once the engine's GPU
            memory grew past it, and no bucket is captured on first use past it: those run eagerly).
        unpad: Run the launches the batch plan marks unpadded without their masked tokens (models
            with ``ModelSpec.unpadded``; ignored otherwise: ``unpads`` says).
        graph_tokens: Unpadded launches of more tokens run eagerly and are never captured (0: all
            may be captured; ``BackendParameters.graph_tokens``).
    """

    kind = "torch"

    def __init__(
        self,
        artifact: Path,
        spec: ModelSpec,
        *,
        device_id: int,
        precision: str = "fp16",
        cuda_graphs: bool = True,
        max_graphs: int = 256,
        compile: str = "auto",
        graph_memory_mb: int = 4096,
        unpad: bool = False,
        graph_tokens: int = 0,
    ) -> None:
        import torch

        self.compile_mode = _compile_mode(compile, spec, on_gpu=True)
        self.compiled = self.compile_mode != "none"
        self.spec = spec
        self.device_id = device_id
        self.cuda_graphs = cuda_graphs
        self.max_graphs = max_graphs
        self.graph_memory_bytes = graph_memory_mb << 20
        self.graph_tokens = graph_tokens
        self._torch = torch
        t0 = time.perf_counter()
        self.dtype = getattr(torch, _DTYPES[precision])
        self.device = torch.device(f"cuda:{device_id}")
        torch.cuda.set_device(self.device)
        self._mem0 = torch.cuda.memory_reserved(self.device)
        loaded = load_module(artifact, str(self.device), spec=spec).to(self.device)
        if self.dtype != torch.float32:
            loaded = loaded.to(self.dtype)
        self.module: Any = _compiled(loaded, self.compile_mode)
        self._unpad_fn: Any = None
        self._rows = 0  # items the slot buffers hold (the unpadded graphs' static rows)
        if unpad and spec.unpadded and spec.mask_input is not None and spec.make_module is not None:
            self._unpad_fn = self._compile_unpadded(loaded)
        self.precision = precision
        self._views: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._static_in: dict[str, Any] = {}
        self._static_out: dict[str, Any] = {}
        self._graphs: OrderedDict[GraphKey, Any] = OrderedDict()
        self._pool: Any = None
        self._capture_failed = False
        self._budget_logged = False
        self._eager_buckets: set[GraphKey] = set()
        #: cumulative: ``replays``, ``eager`` launches (``exact`` of them: unpadded past ``graph_tokens``),
        #: ``captures`` (at load and lazily), ``evictions``, ``unpadded`` launches, ``out_of_memory``
        #: (launches and captures the GPU had no memory for)
        self.counters: dict[str, int] = {
            "replays": 0,
            "eager": 0,
            "exact": 0,
            "captures": 0,
            "lazy_captures": 0,
            "evictions": 0,
            "unpadded": 0,
            "out_of_memory": 0,
        }
        self.load_s = time.perf_counter() - t0
        self.capture_s = 0.0

    def _compile_unpadded(self, loaded: Any) -> Any:
        """The model's own module with the artifact's weights, over padded rows unpadded on the device.

        Compiled (inductor, dynamic shapes: one program for every token bucket) when the engine compiles.
        """
        torch = self._torch
        from inflight.models.packing import forward_rows_unpadded

        base = self.spec.build_module(0)
        base.load_state_dict(loaded.state_dict(), strict=True)
        base = base.to(self.device).to(self.dtype).eval()

        def unpadded(input_ids: Any, attention_mask: Any, tokens: int) -> Any:
            return forward_rows_unpadded(base, input_ids, attention_mask, tokens)

        return torch.compile(unpadded, dynamic=True) if self.compiled else unpadded

    @property
    def unpads(self) -> bool:
        """True when launches marked unpadded run without their masked tokens."""
        return self._unpad_fn is not None

    def describe(self) -> str:
        """Engine, device, precision, compile and graph mode."""
        name = self._torch.cuda.get_device_name(self.device_id)
        return (
            f"torch.export engine on GPU {self.device_id} ({name}, {self.precision}, {_HOW[self.compile_mode]}, "
            f"CUDA graphs {'on' if self.cuda_graphs else 'off'}, "
            f"{'masked tokens left out where padding is large, ' if self.unpads else ''}"
            f"torch {self._torch.__version__})"
        )

    def graph_memory_mb(self) -> float:
        """GPU memory the engine holds beyond what was reserved before it (weights, static tensors, graphs)."""
        return (self._torch.cuda.memory_reserved(self.device) - self._mem0) / 2**20

    # -- GPU ------------------------------------------------------------------------------
    def bind(self, slot: int, buffers: SlotBuffers) -> None:
        """Wrap a slot's device buffers as flat torch tensors (no copy); size the static tensors."""
        from inflight.runtime.cuda import CudaArray

        torch = self._torch

        def wrap(buf: tuple[int, int], dtype: str) -> Any:
            ptr, nbytes = buf
            count = nbytes // np.dtype(dtype).itemsize
            return torch.as_tensor(CudaArray(ptr, (count,), np.dtype(dtype)), device=self.device)

        ins = {t.name: wrap(buffers.inputs[t.name], t.dtype) for t in self.spec.inputs}
        outs = {t.name: wrap(buffers.outputs[t.name], t.dtype) for t in self.spec.outputs}
        self._views[slot] = (ins, outs)
        self._rows = max(self._rows, buffers.rows)
        for name, v in ins.items():
            if name not in self._static_in or self._static_in[name].numel() < v.numel():
                self._static_in[name] = torch.zeros_like(v)  # zeros: valid ids and masks in padding rows
        for name, v in outs.items():
            if name not in self._static_out or self._static_out[name].numel() < v.numel():
                self._static_out[name] = torch.zeros_like(v)

    def _step(self, rows: int, seq: int | None) -> None:
        """The bucket's compute on the static tensors (what a graph records)."""
        args = {
            t.name: self._static_in[t.name][: _numel(t.shape(rows, seq))].view(t.shape(rows, seq))
            for t in self.spec.inputs
        }
        y = _forward(self.module, self.spec, self.dtype, args)
        t = self.spec.outputs[0]
        self._static_out[t.name][: _numel(t.shape(rows, seq))].view(t.shape(rows, seq)).copy_(y)

    def _step_unpadded(self, seq: int, tokens: int) -> None:
        """An unpadded launch's compute on the static tensors: every static row at ``seq``, ``tokens`` kept."""
        spec, r = self.spec, self._rows
        ids = self._static_in[spec.seq_input or spec.inputs[0].name][: r * seq].view(r, seq)
        mask = self._static_in[spec.mask_input or ""][: r * seq].view(r, seq)
        y = self._unpad_fn(ids, mask, tokens)
        t = spec.outputs[0]
        self._static_out[t.name][: _numel(t.shape(r, None))].view(t.shape(r, None)).copy_(y)

    def _run(self, key: GraphKey) -> None:
        if key.tokens is not None and key.seq is not None:
            self._step_unpadded(key.seq, key.tokens)
        else:
            self._step(key.rows, key.seq)

    def capture_unpadded(self, seq: int, tokens: int, stream_ptr: int) -> bool:
        """Capture the unpadded launch of ``tokens`` kept tokens at length ``seq`` (see ``capture``)."""
        if not self.unpads or self._rows == 0:
            return False
        return self._capture_at_load(GraphKey(self._rows, seq, tokens), stream_ptr)

    def capture(self, slot: int, rows: int, seq: int | None, stream_ptr: int) -> bool:
        """Capture the bucket's graph on ``stream_ptr`` (shared by every slot; synchronizes).

        Returns False when graphs are off, capture failed before, or the engine's memory already
        exceeds ``graph_memory_mb`` (that bucket then runs eagerly).
        """
        return self._capture_at_load(GraphKey(rows, seq), stream_ptr)

    def _within_budget(self, key: GraphKey) -> bool:
        """Whether graphs are on and the engine holds less than ``graph_memory_mb`` (else ``key`` runs eagerly)."""
        if not self.cuda_graphs or self._capture_failed:
            return False
        if self.graph_memory_mb() > self.graph_memory_bytes / 2**20:
            if not self._budget_logged:
                LOGGER.info(
                    "graph memory budget of %d MB reached (%.0f MB held); buckets from %s on run eagerly",
                    self.graph_memory_bytes >> 20,
                    self.graph_memory_mb(),
                    str(key),
                )
                self._budget_logged = True
            return False
        return True

    def _free_after_out_of_memory(self) -> None:
        """Return what the allocator cached for a launch or capture the GPU had no memory for, and count it."""
        self._torch.cuda.empty_cache()
        self.counters["out_of_memory"] += 1

    def _out_of_memory(self, key: GraphKey, e: BaseException) -> EngineError:
        """Return the cached memory the failed launch took and the error that fails its batch alone."""
        self._free_after_out_of_memory()
        return EngineError(
            f"GPU out of memory running {key} ({str(e).splitlines()[0]}); this batch failed and the instance "
            "serves the next one. Fewer instances or a smaller max_batch_size fit the card: rebuild with "
            "`inflight build-models` on the GPU host (it sizes both from the GPU's free memory)"
        )

    def _capture_at_load(self, key: GraphKey, stream_ptr: int) -> bool:
        if key in self._graphs:
            return True
        if not self._within_budget(key):
            return False
        torch = self._torch
        stream = torch.cuda.ExternalStream(stream_ptr, device=self.device)
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: compilation for the shape, cuBLAS handles, autotuning
                self._run(key)
        return self._capture(key, stream)

    def _capture(self, key: GraphKey, stream: Any) -> bool:
        torch = self._torch
        t0 = time.perf_counter()
        try:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            g = torch.cuda.CUDAGraph()
            # thread_local: the completion thread keeps querying events while this thread captures
            with (
                torch.inference_mode(),
                torch.cuda.graph(g, pool=self._pool, stream=stream, capture_error_mode="thread_local"),
            ):
                self._run(key)
        except torch.OutOfMemoryError as e:  # not this bucket's graph now; the launch itself ran
            self._free_after_out_of_memory()
            LOGGER.warning("no memory to capture %s (%s); it runs eagerly", str(key), str(e).splitlines()[0])
            return False
        except Exception as e:  # capture can fail on unsupported ops; fall back once, loudly
            self._capture_failed = True
            LOGGER.warning(
                "CUDA graph capture failed for %s: %s: %s; running eagerly from now on",
                str(key),
                type(e).__name__,
                e,
            )
            torch.cuda.synchronize(self.device)
            return False
        self._graphs[key] = g
        self.counters["captures"] += 1
        while len(self._graphs) > self.max_graphs:
            old, _ = self._graphs.popitem(last=False)
            self.counters["evictions"] += 1
            LOGGER.info("graph cap %d reached: dropped the least recently used bucket %s", self.max_graphs, old)
        self.capture_s += time.perf_counter() - t0
        return True

    def enqueue(self, slot: int, group: Group, stream_ptr: int) -> bool:
        """Copy the group's rows in, replay (or run) its bucket, copy its rows out, on ``stream_ptr``.

        A bucket without a graph runs eagerly once, is then captured (its first use; the capture
        synchronizes the device), and replays from then on; eager runs are counted and the first
        of each bucket is logged.

        Returns:
            True when the launch was a graph replay.
        """
        torch = self._torch
        rows, seq = group.bucket
        ins, outs = self._views[slot]
        stream = torch.cuda.ExternalStream(stream_ptr, device=self.device)
        key = GraphKey(rows, seq)
        with torch.cuda.stream(stream):
            for t in self.spec.inputs:
                n, o = group.rows * Layout.per_item(t, seq), group.in_offset[t.name]
                self._static_in[t.name][:n].copy_(ins[t.name][o : o + n])
            if group.tokens is not None and self.unpads and seq is not None:
                # the rows after the group's are padding: empty sequences (mask 0) in the unpadded graph
                mask_name = self.spec.mask_input or ""
                self._static_in[mask_name][group.rows * seq : self._rows * seq].zero_()
                key = GraphKey(self._rows, seq, group.tokens)
                self.counters["unpadded"] += 1
            g = self._graphs.get(key)
            if g is not None:
                self._graphs.move_to_end(key)
                g.replay()
                self.counters["replays"] += 1
            else:
                try:
                    with torch.inference_mode():
                        self._run(key)
                except torch.OutOfMemoryError as e:
                    raise self._out_of_memory(key, e) from None
                self.counters["eager"] += 1
                if self._exact(key):  # never captured: one graph per token count would not pay
                    self.counters["exact"] += 1
                else:
                    if key not in self._eager_buckets:
                        self._eager_buckets.add(key)
                        LOGGER.info("%s ran eagerly (no CUDA graph yet)", str(key))
                    if self._within_budget(key) and self._capture(key, stream):
                        self.counters["lazy_captures"] += 1
                        LOGGER.info("captured %s on first use", str(key))
            for t in self.spec.outputs:
                m, o = group.rows * Layout.per_item(t, seq), group.out_offset[t.name]
                outs[t.name][o : o + m].copy_(self._static_out[t.name][:m])
        return g is not None

    def _exact(self, key: GraphKey) -> bool:
        """Whether ``key`` is an unpadded launch past ``graph_tokens`` (run eagerly at its own token count)."""
        return bool(self.graph_tokens) and key.tokens is not None and key.tokens > self.graph_tokens

    def graphs(self) -> int:
        """Number of captured graphs."""
        return len(self._graphs)

    def close(self) -> None:
        """Drop graphs, views and weights, and return cached GPU memory."""
        self._graphs.clear()
        self._views.clear()
        self._static_in.clear()
        self._static_out.clear()
        self._pool = None
        self.module = None
        self._unpad_fn = None
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
