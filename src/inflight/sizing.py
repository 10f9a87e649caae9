"""What ``inflight build-models`` measures on the GPU: how many instances fit it, how long the batcher waits.

The cores give one instance per server core (:func:`inflight.variants.inflight_deployment`); the
GPU's memory caps that. One instance holds, besides what every process on a GPU holds
(``CONTEXT_MB``), the model's weights, its CUDA graphs (the engine stops capturing once it holds
``graph_memory_mb``; buckets past that run eagerly), and the activations of its largest launch
(``max_batch_size`` sequences of ``max_seq_len`` tokens, counted twice: see
:attr:`InstanceMemory.instance_mb`), measured here by running that launch once on the GPU.
``instances = min(cores, MEMORY_SHARE x free memory / one instance)``, so that every instance
can run its largest batch at once, at any offered rate, and still leave the rest of the card to
the server and the allocator's fragmentation.

Measured on an H100 (issue 53, ``results/engine-minilm-20261127``): the whole of a served
all-MiniLM-L6-v2 instance (one stub process) held 1,398-1,532 MiB, the server's own process 582 MiB.

The same launch, timed, sets the dynamic batcher's delay (:func:`batcher_delay_us`).
"""

from __future__ import annotations

import functools
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inflight.errors import ConfigError

if TYPE_CHECKING:
    from inflight.models.spec import ModelSpec

LOGGER = logging.getLogger(__name__)

#: MiB one instance's process holds on its GPU before any model: CUDA context, cuBLAS workspaces, Triton's
#: kernels, the slots' device buffers (the H100's served MiniLM stub held 1,398-1,532 MiB with its model).
CONTEXT_MB = 800
#: Share of the GPU's free memory the instances may hold together.
MEMORY_SHARE = 0.85
#: The dynamic batcher's delay where nothing was measured, and its floor (µs).
MIN_BATCHER_DELAY_US = 500
#: Its ceiling (µs): a tenth of the 100 ms p99 the sittings hold a model to.
MAX_BATCHER_DELAY_US = 10_000
#: Untimed runs of the full batch before it is timed, then timed runs (CUDA-graph replays) whose median is
#: ``batch_ms``: one eager timed run gave 2,717, 4,268 and 3,645 µs on one H200 across three imports of the same
#: checkpoint (2026-11-28).
WARMUP_RUNS = 2
TIMED_RUNS = 5


@dataclass(frozen=True)
class InstanceMemory:
    """What one instance of a model holds on its GPU, and what the GPU has free (MiB).

    Attributes:
        free_mb: The GPU's free memory when the repository was built.
        weights_mb: The model's weights in the served precision.
        peak_mb: Activations of the largest launch, run once eagerly.
        graph_mb: The engine's graph memory budget (``BackendParameters.graph_memory_mb``).
        batch_ms: One full batch's GPU time (``max_batch_size`` sequences of the typical length,
            ``warmup_seq_len``; its second eager run); None if not timed.
    """

    free_mb: float
    weights_mb: float
    peak_mb: float
    graph_mb: float
    batch_ms: float | None = None

    @property
    def instance_mb(self) -> float:
        """One instance: ``CONTEXT_MB`` + weights + graph budget + twice the largest launch's activations.

        Twice: the engine checks its budget before a capture, so its graph pool may end one
        launch's activations past it, and the launches past the budget run eagerly from the
        allocator's cache, which holds up to one more.
        """
        return CONTEXT_MB + self.weights_mb + self.graph_mb + 2 * self.peak_mb


def instances_that_fit(cores: int, memory: InstanceMemory | None) -> int:
    """``min(cores, MEMORY_SHARE x free / one instance)``; ``cores`` when nothing was measured (no GPU).

    Raises:
        ConfigError: when not even one instance fits, saying what to lower.
    """
    if memory is None:
        return cores
    fit = int(MEMORY_SHARE * memory.free_mb // memory.instance_mb)
    if fit < 1:
        raise ConfigError(
            f"one instance needs {memory.instance_mb:.0f} MiB (largest launch {memory.peak_mb:.0f}, graphs "
            f"{memory.graph_mb:.0f}, weights {memory.weights_mb:.0f}, context {CONTEXT_MB}) and the GPU has "
            f"{memory.free_mb:.0f} MiB free: lower max_batch_size or max_seq_len, or graph_memory_mb"
        )
    return max(1, min(cores, fit))


def batcher_delay_us(memory: InstanceMemory | None) -> int:
    """How long the dynamic batcher may hold a batch open: one full batch's GPU time, within bounds.

    Where the GPU is the bound, a full batch arrives at capacity in about the time the GPU takes to
    compute one, so a delay of that length lets batches grow to ``max_batch_size`` as the load nears
    capacity, and adds at most one full batch's time to a request's latency at low load. The batch is
    timed at the model's typical length (``warmup_seq_len``), not its longest: at all-MiniLM-L6-v2's
    ``max_seq_len`` 256 a full batch took 12.7 ms on the H100, which would hold short requests for
    the ceiling. A model whose full batch takes under 500 µs keeps Triton's usual delay (the floor); on the
    H100 bert-tiny's 2,048 x 64 took 1.11 ms and bert-small's 8.21 ms. Measured on
    an H100 with all-MiniLM-L6-v2, 8 instances, 32 sequences a request of lengths 16-128 (issue 53,
    ``results/gpu-bound/20261127-2218-h100-minilm-batcher``): at 500 µs the batches held 3-4 requests
    and p99 <= 100 ms held to 4,000 req/s; at 4 ms they held 13-16 and p99 was 25-27 ms at 5,000;
    4 and 10 ms saturated alike (5,210 and 5,230 req/s), 10 ms costing 6 ms of p50 at 1,000 req/s.

    Args:
        memory: What the probe measured (None, or no time: the floor).

    Returns:
        ``max_queue_delay_microseconds`` in [``MIN_BATCHER_DELAY_US``, ``MAX_BATCHER_DELAY_US``].
    """
    if memory is None or memory.batch_ms is None:
        return MIN_BATCHER_DELAY_US
    return int(min(MAX_BATCHER_DELAY_US, max(MIN_BATCHER_DELAY_US, round(1000 * memory.batch_ms))))


def _graph_of(torch: Any, module: Any, args: list[Any]) -> Callable[[], Any] | None:
    """The module's forward on ``args`` captured into a CUDA graph (its ``replay``), or None where capture fails.

    The full batch is timed as replays: the GPU's own time, as the served engine's graphs run it. Timed
    eagerly, the CPU's launch gaps count too, and three processes on one H200 gave 2.06, 2.09 and 2.77 ms for
    bert_small's 512 x 64 where replays gave 1.95, 1.96 and 1.97 (2026-11-28).
    """
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            module(*args)  # capture warms up on a side stream, as torch.cuda.graphs asks
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            module(*args)
    except Exception as e:  # a module that cannot be captured (a host sync inside): time it eagerly
        LOGGER.info("the full batch is timed eagerly: CUDA graph capture failed (%s: %s)", type(e).__name__, e)
        torch.cuda.synchronize()
        return None
    return graph.replay


def measure_instance_memory(
    spec: ModelSpec,
    max_batch: int,
    max_seq: int | None,
    graph_mb: int,
    device_id: int = 0,
    typical_seq: int | None = None,
) -> InstanceMemory | None:
    """Run the model's largest launch on the GPU (fp16, seeded weights) for what it holds; time a full batch.

    Args:
        spec: The model.
        max_batch: Sequences of the largest launch (``max_batch_size``).
        max_seq: Their length (the largest bucket; None for a fixed-shape model).
        graph_mb: The engine's graph memory budget.
        device_id: The GPU.
        typical_seq: The length the full batch is timed at (``warmup_seq_len``); None: ``max_seq``.

    Returns:
        The measurement; None without a GPU or a module to build (the rule then counts cores only).
    """
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or spec.make_module is None:
        return None
    import numpy as np

    dev = torch.device(f"cuda:{device_id}")
    free, _ = torch.cuda.mem_get_info(dev)
    module = spec.build_module(0).to(dev).half().eval()
    weights = sum(p.numel() * p.element_size() for p in module.parameters())

    def inputs(seq: int | None) -> list[torch.Tensor]:
        x = spec.example_inputs(max_batch, seq_len=seq, rng=np.random.default_rng(0))
        # float inputs in the served precision, as the engine casts them
        args = [torch.from_numpy(x[t.name]).to(dev) for t in spec.inputs]
        return [a.half() if a.is_floating_point() else a for a in args]

    largest = inputs(max_seq)
    timed_seq = typical_seq if max_seq is not None and typical_seq is not None else max_seq
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    with torch.inference_mode():
        module(*largest)
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - base
        del largest
        typical = inputs(timed_seq)
        for _ in range(WARMUP_RUNS):  # the first runs include the libraries' set-up
            module(*typical)
        run = _graph_of(torch, module, typical) or functools.partial(module, *typical)
        times = []
        for _ in range(TIMED_RUNS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    del module, typical, run
    torch.cuda.empty_cache()
    m = InstanceMemory(
        free_mb=free / 2**20,
        weights_mb=weights / 2**20,
        peak_mb=peak / 2**20,
        graph_mb=graph_mb,
        batch_ms=statistics.median(times),
    )
    LOGGER.info(
        "%s on %s: one instance %.0f MiB (largest launch %d x %s: %.0f MiB, graphs %d, weights %.0f, "
        "context %d), %.0f MiB free; a full batch at length %s: %.2f ms, batcher delay %d us",
        spec.name,
        torch.cuda.get_device_name(dev),
        m.instance_mb,
        max_batch,
        max_seq,
        m.peak_mb,
        graph_mb,
        m.weights_mb,
        CONTEXT_MB,
        m.free_mb,
        timed_seq,
        m.batch_ms,
        batcher_delay_us(m),
    )
    return m
