"""One construction path for an instance: sequence buckets, layout, engine, buckets, runner, then its mode.

``InflightModel`` builds through :func:`assemble`, :func:`build_mode` and :func:`capture_at_load`,
and ``inflight bench-engine`` through the first and the last, so what the bench measures is what the
server runs: the same bucket arithmetic, the same engine options (precision, compile, graphs,
unpadded launches) and the same graphs captured at load.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inflight.errors import ConfigError, InflightError
from inflight.model_config import BackendParameters
from inflight.models.architecture import token_cost_scale
from inflight.models.packing import UNPAD_COST_TOKENS
from inflight.models.spec import ModelSpec
from inflight.runtime.batch import (
    EAGER_FROM_TOKENS,
    GPU_LAUNCH_COST_TOKENS,
    Buckets,
    Layout,
    pow2_buckets,
    token_buckets,
)
from inflight.runtime.engines.base import DeviceEngine, Engine, HostEngine
from inflight.runtime.modes import Answering, AutoMode, Mode, OverlapMode, PipelinedMode, SyncMode
from inflight.runtime.pipeline import AutoPolicy, OverlapExecutor, PipelinedExecutor, SyncExecutor
from inflight.runtime.runners import CpuRunner, CudaRunner, Runner

LOGGER = logging.getLogger(__name__)


def ring_slots(params: BackendParameters) -> int:
    """The slots an instance makes: the sync executor's one in sync mode, ``slots`` otherwise."""
    return SyncExecutor.SLOTS if params.mode == "sync" else params.slots


def make_host_engine(params: BackendParameters, spec: ModelSpec, version_dir: Path) -> HostEngine:
    """Build the CPU instance's engine (Torch, fp32).

    Raises:
        ConfigError: when the configuration asks for TensorRT, which needs a GPU.
        EngineError: when the artifact is missing or cannot be loaded.
    """
    from inflight.runtime.engines.torch_engine import TorchHostEngine

    if params.engine == "tensorrt":
        raise ConfigError(
            "engine=tensorrt needs a GPU instance (instance_group kind KIND_GPU); use engine=torch on CPU"
        )
    return TorchHostEngine(version_dir / params.artifact, spec, compile=params.compile)


def graph_tokens_for(params: BackendParameters, spec: ModelSpec) -> int:
    """Kept tokens past which unpadded launches run eagerly at their own count (``graph_tokens``; 0: by model)."""
    if params.graph_tokens:
        return params.graph_tokens
    return max(1, round(EAGER_FROM_TOKENS * token_cost_scale(spec.extra.get("architecture"))))


def make_device_engine(
    params: BackendParameters, spec: ModelSpec, version_dir: Path, device_id: int, *, graph_tokens: int
) -> DeviceEngine:
    """Build the GPU instance's configured engine (``auto``: TensorRT when possible, else Torch).

    ``graph_tokens`` is :func:`graph_tokens_for` of the same parameters, which the caller's buckets share.

    Raises:
        EngineError: when the engine cannot be created (missing artifact, no TensorRT...).
    """
    from inflight.runtime.engines.torch_engine import TorchEngine

    engine = params.engine
    if engine in ("tensorrt", "auto"):
        from inflight.runtime.engines.tensorrt_engine import TensorRTEngine, import_tensorrt

        plan = version_dir / params.plan
        if engine == "tensorrt" or (import_tensorrt() is not None and plan.is_file()):
            try:
                return TensorRTEngine(
                    plan,
                    spec,
                    device_id=device_id,
                    slots=ring_slots(params),
                    cuda_graphs=params.cuda_graphs,
                )
            except InflightError as e:
                if engine == "tensorrt":
                    raise
                LOGGER.warning("engine=auto: TensorRT not usable (%s); using the Torch engine", e)
    return TorchEngine(
        version_dir / params.artifact,
        spec,
        device_id=device_id,
        precision=params.precision,
        cuda_graphs=params.cuda_graphs,
        max_graphs=params.max_graphs,
        compile=params.compile,
        # the budget applies to every capture at load; without capture_at_load only the warm-up
        # bucket is captured there (InflightModel), the others on first use
        graph_memory_mb=params.graph_memory_mb,
        unpad=params.unpad,
        graph_tokens=graph_tokens,
    )


def capture_order(seq_buckets: tuple[int, ...] | None, warmup_seq_len: int) -> list[int | None]:
    """Sequence buckets in the order graphs are captured at load.

    The warm-up length's bucket first, then the others from the shortest (a memory budget cuts the
    longest, most memory-hungry ones).
    """
    if seq_buckets is None:
        return [None]
    warm = Buckets((1,), seq_buckets).seq_bucket(min(warmup_seq_len, seq_buckets[-1]))
    return [warm, *(s for s in seq_buckets if s != warm)]


def seq_buckets_for(spec: ModelSpec, params: BackendParameters) -> tuple[int, ...] | None:
    """The configured sequence buckets up to the model's longest sequence, which is always one (None: fixed shapes)."""
    if not spec.variable_seq:
        return None
    limit = spec.max_seq_len or max(params.seq_buckets)
    seq_buckets = tuple(s for s in params.seq_buckets if s <= limit)
    if not seq_buckets or seq_buckets[-1] < limit:
        seq_buckets = (*seq_buckets, limit)
    return seq_buckets


@dataclass(eq=False)
class InstanceParts:
    """What :func:`assemble` builds for one instance; the runner owns the engine (``runner.close()``).

    Attributes:
        layout: The slot buffers' layout (items, longest sequence).
        buckets: Batch, sequence and token buckets of the launches.
        runner: The device's streams and buffers (CUDA) or compute thread (CPU), with the engine.
        seq_buckets: The sequence buckets (None for fixed-shape models).
    """

    layout: Layout
    buckets: Buckets
    runner: Runner
    seq_buckets: tuple[int, ...] | None

    @property
    def engine(self) -> Engine:
        """The runner's engine."""
        return self.runner.engine


def assemble(
    params: BackendParameters, spec: ModelSpec, *, max_batch: int, version_dir: Path, device_id: int | None
) -> InstanceParts:
    """Build the layout, engine, buckets and runner of one instance as ``params`` configure them.

    On the CPU every launch is exactly what arrived (a bucket per size and length); on a GPU the
    batch buckets are ``batch_buckets`` (powers of two by default) up to ``max_batch``, the
    sequence buckets :func:`seq_buckets_for`, and token buckets when the engine runs unpadded
    launches. No slot exists yet: the executor makes them, then :func:`capture_at_load`.

    Raises:
        InflightError: when the engine cannot be built (see :func:`make_host_engine`, :func:`make_device_engine`).
    """
    seq_buckets = seq_buckets_for(spec, params)
    max_seq = seq_buckets[-1] if seq_buckets else None
    layout = Layout(spec, max_batch, max_seq)
    runner: Runner
    if device_id is None:
        # the CPU computes exactly what arrived: no padding to buckets
        buckets = Buckets(tuple(range(1, max_batch + 1)), tuple(range(1, max_seq + 1)) if max_seq else None)
        runner = CpuRunner(make_host_engine(params, spec, version_dir), layout, buckets)
    else:
        graph_tokens = graph_tokens_for(params, spec)
        engine = make_device_engine(params, spec, version_dir, device_id, graph_tokens=graph_tokens)
        batch_buckets = params.batch_buckets or pow2_buckets(max_batch)
        if batch_buckets[-1] < max_batch:
            batch_buckets = (*batch_buckets, max_batch)
        scale = token_cost_scale(spec.extra.get("architecture"))
        # token buckets up to the largest launch replayed from a graph; larger ones run at their own count
        largest = max_batch * max_seq if max_seq else 0
        eager_from = graph_tokens if engine.unpads and max_seq else 0
        buckets = Buckets(
            batch_buckets,
            seq_buckets,
            max(1, round(GPU_LAUNCH_COST_TOKENS * scale)),
            tokens=token_buckets(min(largest, eager_from)) if eager_from else (),
            unpad_token_cost=params.unpad_token_cost,
            unpad_cost_tokens=max(1, round(UNPAD_COST_TOKENS * scale)),
            exact_from=eager_from if 0 < eager_from < largest else 0,
        )
        runner = CudaRunner(engine, layout, buckets, device_id=device_id, wait_mode=params.completion_wait)
    return InstanceParts(layout=layout, buckets=buckets, runner=runner, seq_buckets=seq_buckets)


def capture_at_load(parts: InstanceParts, params: BackendParameters) -> tuple[int, str]:
    """Capture the graphs the configuration asks for at load (once the slots exist); synchronizes.

    The warm-up length's batch buckets always, its unpadded token buckets when the engine unpads,
    and every other sequence bucket when ``capture_at_load`` (within ``graph_memory_mb``).

    Returns:
        The graphs the engine holds and a note for the load line (memory held, time taken); ``(0,
        "")`` on the CPU.
    """
    runner = parts.runner
    if not isinstance(runner, CudaRunner):
        return 0, ""
    seqs = capture_order(parts.seq_buckets, params.warmup_seq_len)
    t0 = time.perf_counter()
    graphs = runner.warmup(seqs[:1])
    if parts.buckets.tokens and seqs[0] is not None:  # unpadded launches at the warm-up length too
        graphs = runner.warmup_unpadded(seqs[0])
    if params.capture_at_load and len(seqs) > 1:
        graphs = runner.warmup(seqs[1:])
    held = runner.engine.graph_memory_mb()
    return graphs, f" ({held:.0f} MB held, captured in {time.perf_counter() - t0:.1f} s)"


def build_mode(params: BackendParameters, runner: Runner, answering: Answering) -> Mode[Any]:
    """The instance's mode over its executor, chosen once from ``params.mode``; its executor makes the slots.

    Args:
        params: The backend parameters (mode, ring, response threads, ``auto``'s policy).
        runner: The instance's runner (:func:`assemble`); the executor owns it from here.
        answering: How requests are read and answered.
    """
    p, sink, ranges = params, answering.sink, answering.ranges
    if p.mode == "sync":
        return SyncMode(SyncExecutor(runner, ranges), answering)
    if p.mode == "overlap":
        overlap = OverlapExecutor(
            runner, slots=ring_slots(p), chunk_items=p.chunk_items, max_chunks=p.max_chunks, ranges=ranges
        )
        return OverlapMode(overlap, answering)
    ring = PipelinedExecutor(
        runner,
        sink,
        slots=ring_slots(p),
        response_threads=p.response_threads,
        response_backlog=p.response_backlog,
        yield_to_issue=p.response_yield,
        ranges=ranges,
    )
    if p.mode == "pipelined":
        return PipelinedMode(ring, answering)
    policy = AutoPolicy(
        bound_min=auto_bound_min(p, on_device=isinstance(runner, CudaRunner)),
        bound_high=p.auto_bound_high,
        gain_min=p.auto_gain_min,
        period_s=p.auto_probe_every_s,
        window_s=p.auto_probe_s,
        fill_min=p.auto_fill_min,
        busy_min=p.auto_busy_min,
    )
    return AutoMode(ring, answering, policy)


#: ``auto``'s overlap bound from which a GPU instance defers, unless ``auto_bound_min`` sets one
#: (``AutoPolicy``). Every probe of bert-tiny on the H100s and H200s (4 and 8 server cores) measured a loss
#: (gains 0.1-0.77) at bounds of 1.06-1.29; bert-small and seqlen_head gained at 1.9-3.9. At 1.25, on one
#: H200 with 4 server cores, one instance whose bound wandered over it probed while the others could not
#: (under it), measured a gain of 1.72 and deferred 3,004 batches (32,373 responses through its senders, 31 s
#: of send calls on the server's four cores) in a search where the default held 0.89x the sync search
#: before it (``results/modes/20261127-h200-4cores-fast``): a gain one instance measures alone is not the
#: server's (the others share Triton's queue and cores). 1.4 keeps a margin over bert-tiny's bounds and
#: under the heavy models'.
AUTO_BOUND_MIN_GPU = 1.4


def auto_bound_min(params: BackendParameters, *, on_device: bool) -> float:
    """The overlap bound from which ``auto`` defers: ``auto_bound_min`` when set, else by where the instance runs.

    A GPU instance defers from ``AUTO_BOUND_MIN_GPU``. A CPU instance answers in-band (an infinite
    bound): its "device" is a compute thread on the server's own cores, so the wait a deferral
    would free is CPU the other threads need, not time another processor works.
    """
    if params.auto_bound_min:
        return params.auto_bound_min
    return AUTO_BOUND_MIN_GPU if on_device else math.inf
