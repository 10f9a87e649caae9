"""Typed model configurations: generate config.pbtxt, parse it back, and override it.

config.pbtxt is produced from tritonclient's ``model_config_pb2.ModelConfig`` with protobuf's
``text_format``, never from string templates. Three variants exist per model:

* ``<model>_inflight``: our backend, pipelined mode (several batches in flight per instance);
* ``<model>_sync``: our backend, stock-equivalent mode (one batch at a time, wait after each);
* ``<model>_trt``: the stock TensorRT backend (``platform: "tensorrt_plan"``), for NGC containers.

The same object also yields the JSON that Triton's model-control API accepts as a config
override, which is how the A/B runner loads a variant with other instance counts or batching.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from inflight.errors import ConfigError
from inflight.models.packing import UNPAD_TOKEN_COST
from inflight.models.registry import get_model
from inflight.models.spec import ModelSpec

Variant = Literal["inflight", "sync", "trt", "null"]
Kind = Literal["auto", "gpu", "cpu"]
VARIANTS: tuple[Variant, ...] = ("inflight", "sync", "trt", "null")
"""``null``: the control model of ``backends/null`` (Triton's Python backend answering zeros, no inflight code)."""

_KINDS = {
    "auto": mc.ModelInstanceGroup.KIND_AUTO,
    "gpu": mc.ModelInstanceGroup.KIND_GPU,
    "cpu": mc.ModelInstanceGroup.KIND_CPU,
}


@dataclass(kw_only=True)
class BatchingConfig:
    """Dynamic batching and instance placement, shared by all variants.

    Attributes:
        instances: Model instances (one stub process each for our backend).
        kind: ``auto`` (GPU when the server sees one, else CPU), ``gpu`` or ``cpu``.
        max_queue_delay_us: Dynamic batcher queue delay.
        preferred_batch_sizes: Preferred batch sizes; empty for none.
        cuda_graphs: For ``_trt``: TensorRT backend CUDA graphs (``optimization.cuda.graphs``).
        gpus: GPUs the instances go on (``instance_group.gpus``); Triton places ``instances``
            instances on *each* of them. Empty: every GPU the server sees.
    """

    instances: int = 1
    kind: Kind = "auto"
    max_queue_delay_us: int = 500
    preferred_batch_sizes: tuple[int, ...] = ()
    cuda_graphs: bool = False
    gpus: tuple[int, ...] = ()


#: Execution modes of the inflight backend (see ``BackendParameters.mode``).
Mode = Literal["pipelined", "sync", "overlap", "auto"]


@dataclass(kw_only=True)
class BackendParameters:
    """Parameters of the ``inflight`` backend (the ``parameters`` map of config.pbtxt).

    Attributes:
        mode: ``sync`` (stock-equivalent: wait for the GPU after each batch, return the
            responses), ``pipelined`` (execute returns once the batch is enqueued; every response
            goes through ``send()``), ``overlap`` (the batch in chunks overlapped on the GPU inside
            one execute, every response returned) or ``auto`` (``overlap``, deferring a batch's
            last chunk through ``send()`` when the measured wait for it exceeds the measured
            cost of its sends).
        engine: ``torch``, ``tensorrt`` or ``auto`` (TensorRT when a plan exists and runs here).
        slots: Batches in flight per instance (ring size), pipelined mode; chunks and deferred
            chunks in flight, overlap and auto modes (at least 2).
        chunk_items: Items a chunk aims for (overlap and auto modes); a batch below 1.5 times
            this runs as one chunk.
        max_chunks: Most chunks per batch (overlap and auto modes).
        auto_send_prior_us: ``auto``: the cost of one ``send()`` assumed until it is measured.
        auto_explore_every: ``auto``: batches between explorations of the other branch while a
            choice is new, to keep both estimates current (0: never).
        auto_explore_max: ``auto``: the longest period between explorations once a choice has
            held (it doubles from ``auto_explore_every`` at each exploration that confirms it).
        auto_busy_min: ``auto``: the execute thread's CPU share between two ``execute()`` calls
            (a moving average) under which no batch is deferred: the instance is waiting for
            requests or for a core, so deferring cannot gain (0: defer whatever the share).
        response_threads: Threads that send responses concurrently (pipelined mode).
        response_backlog: Batches whose responses may wait for the sender threads at once
            (pipelined mode); beyond it the completion side waits, and back-pressure reaches
            Triton's queue.
        response_yield: Sender threads build responses only while ``execute()`` is not running
            (pipelined mode), so the issue path does not queue for the GIL behind them.
        gil_switch_interval_us: ``sys.setswitchinterval`` for the stub process, in microseconds
            (0 keeps Python's 5000). The sender threads hand the GIL back and forth once per
            response; a shorter interval bounds how long one waits for a thread that computes.
        completion_wait: ``blocking`` (blocking-sync events) or ``poll`` (cudaEventQuery).
        precision: ``fp16``, ``bf16`` or ``fp32`` on the GPU (the CPU always runs fp32).
        compile: ``auto`` (on a GPU the model's measured choice, ``ModelSpec.gpu_compile``: none
            for linear_head, inductor for the others; none on the CPU), ``inductor``
            (``torch.compile``),
            ``max-autotune`` (inductor choosing each GEMM among cuBLAS and its own templates by
            timing them: a longer first compile) or ``none`` (Torch engine).
        cuda_graphs: Capture and replay CUDA graphs per (batch, sequence) bucket.
        batch_buckets: Batch sizes graphs are captured for; a launch is padded up to one (a
            group that would waste more than 1/8 of its bucket is cut into smaller launches).
            Empty means powers of two up to max_batch_size.
        seq_buckets: Sequence lengths graphs are captured for (variable-length models); each
            request is zero-padded to the smallest that holds it, and a batch runs one launch
            per sequence bucket its requests fall in.
        max_graphs: Graphs kept per instance; beyond it the least recently used is dropped.
        unpad: Leave masked tokens out (Torch engine on a GPU, models that support it: bert_tiny):
            a batch's requests of every length run as one launch, and a launch whose kept tokens,
            padded to a token bucket (8 per doubling), cost less than its padded rows runs without
            its masked tokens, FlashAttention's variable-length kernel doing each sequence's
            attention; the others run padded as before.
        unpad_token_cost: What a token of an unpadded launch costs in tokens of a padded one: a
            launch runs unpadded when its token bucket at this price, plus a fixed
            ``inflight.models.packing.UNPAD_COST_TOKENS``, is less than its padded tokens (bucket
            rows x bucket length). The default, ``inflight.models.packing.UNPAD_TOKEN_COST``, was
            measured on the H200; 0 unpads every launch whose first tokens are all unmasked.
        capture_at_load: Capture every (batch, sequence) bucket at initialize, within
            ``graph_memory_mb``; otherwise only the ``warmup_seq_len`` bucket, the others on
            their first use.
        graph_memory_mb: GPU memory (weights, static tensors, graph pool) up to which buckets are
            captured at initialize; the rest are captured on their first use.
        warmup_seq_len: The sequence bucket captured first at initialize.
        artifact: Torch artifact, relative to the model version folder.
        plan: TensorRT plan, relative to the model version folder.
        metrics: Export live metrics at Triton's metrics endpoint.
        cupti: Measure GPU temporal activity and sync share live with CUPTI.
        nvtx: Emit NVTX ranges (free when no profiler is attached).
        gil_probe: Diagnostics: sample how long a sleeping thread waits for the GIL (finalize log).
        gc_freeze: After the load (warm-up and captures done), collect once and ``gc.freeze()`` what
            is alive, so later collections of the oldest generation do not walk the model, torch
            and the engine with the GIL held (their pauses are counted either way: ``gc_*`` in the
            finalize log).
        drain_timeout_s: How long finalize() waits for in-flight batches before failing them.
    """

    mode: Mode = "pipelined"
    engine: Literal["torch", "tensorrt", "auto"] = "torch"
    slots: int = 4
    chunk_items: int = 512
    max_chunks: int = 8
    auto_send_prior_us: float = 200.0
    auto_explore_every: int = 32
    auto_explore_max: int = 1024
    auto_busy_min: float = 0.5
    response_threads: int = 8
    response_backlog: int = 8
    response_yield: bool = True
    gil_switch_interval_us: int = 0
    completion_wait: Literal["blocking", "poll"] = "blocking"
    precision: Literal["fp16", "bf16", "fp32"] = "fp16"
    compile: Literal["auto", "inductor", "max-autotune", "none"] = "auto"
    cuda_graphs: bool = True
    batch_buckets: tuple[int, ...] = ()
    seq_buckets: tuple[int, ...] = (16, 32, 48, 64, 80, 96, 112, 128, 192, 256, 384, 512)
    max_graphs: int = 512
    unpad: bool = True
    unpad_token_cost: float = UNPAD_TOKEN_COST
    capture_at_load: bool = True
    graph_memory_mb: int = 4096
    warmup_seq_len: int = 64
    artifact: str = "model.pt2"
    plan: str = "model.plan"
    metrics: bool = True
    cupti: bool = False
    nvtx: bool = True
    gil_probe: bool = False
    gc_freeze: bool = False
    drain_timeout_s: float = 10.0

    def to_parameters(self, *, full: bool = True) -> dict[str, str]:
        """The parameters as strings, as config.pbtxt stores them.

        Args:
            full: All parameters; otherwise the main knobs and those that differ from the defaults.
        """
        out: dict[str, str] = {}
        default = BackendParameters()
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not full and f.name not in _SHOWN and v == getattr(default, f.name):
                continue
            if isinstance(v, bool):
                out[f.name] = "true" if v else "false"
            elif isinstance(v, tuple):
                out[f.name] = ",".join(str(x) for x in v)
            else:
                out[f.name] = str(v)
        return out

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> BackendParameters:
        """Parse the config's parameters map, with errors that name the bad key and its choices.

        Raises:
            ConfigError: on an unknown key or a value of the wrong form.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - set(fields))
        if unknown:
            raise ConfigError(f"unknown inflight parameter(s) {unknown}; known: {sorted(fields)}")
        kwargs: dict[str, Any] = {}
        default = cls()
        choices = {
            "mode": ("pipelined", "sync", "overlap", "auto"),
            "engine": ("torch", "tensorrt", "auto"),
            "completion_wait": ("blocking", "poll"),
            "precision": ("fp16", "bf16", "fp32"),
            "compile": ("auto", "inductor", "max-autotune", "none"),
        }
        for key, raw in params.items():
            raw = raw.strip()
            current = getattr(default, key)
            try:
                if key in choices:
                    if raw not in choices[key]:
                        raise ValueError(f"choose one of {list(choices[key])}")
                    kwargs[key] = raw
                elif isinstance(current, bool):
                    if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                        raise ValueError("use true or false")
                    kwargs[key] = raw.lower() in ("true", "1", "yes")
                elif isinstance(current, int):
                    kwargs[key] = int(raw)
                elif isinstance(current, float):
                    kwargs[key] = float(raw)
                elif isinstance(current, tuple):
                    kwargs[key] = tuple(int(x) for x in raw.replace(" ", "").split(",") if x)
                else:
                    kwargs[key] = raw
            except ValueError as e:
                raise ConfigError(f"parameter {key}={raw!r} is invalid: {e}") from None
        p = cls(**kwargs)
        p.check()
        return p

    def check(self) -> None:
        """Reject values out of range.

        Raises:
            ConfigError: naming the parameter and the accepted range.
        """
        if self.slots < 1 or self.slots > 64:
            raise ConfigError(f"slots={self.slots}: use 1..64 batches in flight per instance")
        if self.mode in ("overlap", "auto") and self.slots < 2:
            raise ConfigError(
                f"slots={self.slots}: mode={self.mode} needs at least 2 (a chunk is launched before the previous "
                "one is finished)"
            )
        if self.chunk_items < 1 or self.max_chunks < 1 or self.max_chunks > 64:
            raise ConfigError(
                f"chunk_items={self.chunk_items}, max_chunks={self.max_chunks}: use chunk_items >= 1 and "
                "max_chunks 1..64"
            )
        if (
            self.auto_send_prior_us <= 0
            or self.auto_explore_every < 0
            or self.auto_explore_max < self.auto_explore_every
        ):
            raise ConfigError(
                f"auto_send_prior_us={self.auto_send_prior_us}, auto_explore_every={self.auto_explore_every}, "
                f"auto_explore_max={self.auto_explore_max}: use a positive prior, an interval >= 0 and a longest "
                "interval at least that"
            )
        if not 0.0 <= self.auto_busy_min <= 1.0:
            raise ConfigError(
                f"auto_busy_min={self.auto_busy_min}: use a CPU share in 0..1 (0 lets auto defer however idle the "
                "instance is)"
            )
        if self.response_threads < 1 or self.response_threads > 256:
            raise ConfigError(f"response_threads={self.response_threads}: use 1..256")
        if self.response_backlog < 1 or self.response_backlog > 1024:
            raise ConfigError(f"response_backlog={self.response_backlog}: use 1..1024 batches")
        if self.gil_switch_interval_us < 0 or self.gil_switch_interval_us > 1_000_000:
            raise ConfigError(
                f"gil_switch_interval_us={self.gil_switch_interval_us}: use 0 (Python's default) or 1..1000000"
            )
        if any(b < 1 for b in self.batch_buckets) or list(self.batch_buckets) != sorted(set(self.batch_buckets)):
            raise ConfigError(f"batch_buckets={self.batch_buckets}: use increasing positive sizes")
        if any(s < 1 for s in self.seq_buckets) or list(self.seq_buckets) != sorted(set(self.seq_buckets)):
            raise ConfigError(f"seq_buckets={self.seq_buckets}: use increasing positive lengths")
        if self.max_graphs < 1:
            raise ConfigError(f"max_graphs={self.max_graphs}: must be at least 1")
        if self.graph_memory_mb < 0:
            raise ConfigError(f"graph_memory_mb={self.graph_memory_mb}: must be >= 0 (0 captures at load nothing)")
        if self.drain_timeout_s < 0:
            raise ConfigError(f"drain_timeout_s={self.drain_timeout_s}: must be >= 0")


@dataclass(kw_only=True)
class VariantConfig:
    """One model variant: which model, which execution path, batching and parameters."""

    model: str
    variant: Variant
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    params: BackendParameters = field(default_factory=BackendParameters)
    max_batch_size: int | None = None
    name: str | None = None
    sleep_us: int = 0
    """``null`` variant only: microseconds the control model sleeps per batch (its stand-in device wait)."""
    sender_threads: int = 0
    """``null`` variant only: 0 returns the responses from ``execute()``; N > 0 defers them to N threads
    that send each through its request's response sender (the pipelined response path, no inflight code)."""

    @property
    def spec(self) -> ModelSpec:
        """The model's registry entry."""
        return get_model(self.model)

    @property
    def model_name(self) -> str:
        """The name Triton serves this variant under."""
        return self.name or f"{self.model}_{self.variant}"

    def to_proto(self) -> mc.ModelConfig:
        """Build the ``ModelConfig`` protobuf."""
        spec = self.spec
        cfg = mc.ModelConfig(name=self.model_name, max_batch_size=self.max_batch_size or spec.max_batch_size)
        if self.variant == "trt":
            cfg.platform = "tensorrt_plan"
        elif self.variant == "null":
            cfg.backend = "null"
        else:
            cfg.backend = "inflight"
        # the inflight backend groups a batch's requests by sequence bucket itself, so the dynamic
        # batcher may put requests of different lengths into one batch (without it, it batches
        # only equal shapes, and a mix of lengths fragments into small batches)
        ragged = self.variant in ("inflight", "sync")
        for t in spec.inputs:
            cfg.input.add(
                name=t.name,
                data_type=mc.DataType.Value(t.triton_type),
                dims=list(t.dims),
                allow_ragged_batch=ragged and t.variable,
            )
        for t in spec.outputs:
            cfg.output.add(name=t.name, data_type=mc.DataType.Value(t.triton_type), dims=list(t.dims))
        b = self.batching
        cfg.dynamic_batching.max_queue_delay_microseconds = b.max_queue_delay_us
        cfg.dynamic_batching.preferred_batch_size.extend(b.preferred_batch_sizes)
        # instances placed on named GPUs are GPU instances (KIND_AUTO would also accept a CPU-only server)
        kind = "gpu" if self.variant == "trt" or (b.gpus and b.kind == "auto") else b.kind
        group = cfg.instance_group.add(count=b.instances, kind=_KINDS[kind])
        if b.gpus:
            group.gpus.extend(b.gpus)
        if self.variant == "trt":
            if b.cuda_graphs:
                cfg.optimization.cuda.graphs = True
        elif self.variant == "null":
            cfg.parameters["sleep_us"].string_value = str(self.sleep_us)
            if self.sender_threads:
                cfg.parameters["sender_threads"].string_value = str(self.sender_threads)
        else:
            # the variant decides sync or not; an inflight variant keeps its own non-sync mode
            mode: Mode = self.params.mode if self.params.mode != "sync" else "pipelined"
            if self.variant == "sync":
                mode = "sync"
            p = dataclasses.replace(self.params, mode=mode)
            for k, v in p.to_parameters(full=False).items():
                cfg.parameters[k].string_value = v
        return cfg

    def to_pbtxt(self) -> str:
        """config.pbtxt text."""
        return _HEADER + text_format.MessageToString(self.to_proto())

    def to_json(self) -> str:
        """The JSON form Triton's model-control ``load`` accepts as a ``config`` override."""
        return json_format.MessageToJson(self.to_proto(), preserving_proto_field_name=True, indent=None)

    def write(self, repository: Path) -> Path:
        """Write ``<repository>/<name>/config.pbtxt`` and the version folder ``1/``."""
        d = repository / self.model_name
        (d / "1").mkdir(parents=True, exist_ok=True)
        (d / "config.pbtxt").write_text(self.to_pbtxt())
        return d


_SHOWN = frozenset({"mode", "engine", "slots", "response_threads", "precision", "cuda_graphs"})
_HEADER = "# Generated by `inflight build-models` from inflight.model_config; edit the generator, not this file.\n"


def parse_pbtxt(text: str) -> mc.ModelConfig:
    """Parse config.pbtxt text into a ``ModelConfig``.

    Raises:
        ConfigError: with protobuf's position of the syntax error.
    """
    try:
        return text_format.Parse(text, mc.ModelConfig())
    except text_format.ParseError as e:
        raise ConfigError(f"config.pbtxt does not parse: {e}") from None


def proto_from_json(config_json: str | Mapping[str, Any]) -> mc.ModelConfig:
    """Parse the JSON model config Triton hands the backend (``args["model_config"]``)."""
    text = config_json if isinstance(config_json, str) else json.dumps(config_json)
    return json_format.Parse(text, mc.ModelConfig(), ignore_unknown_fields=True)


def parameters_of(cfg: mc.ModelConfig) -> dict[str, str]:
    """The ``parameters`` map as plain strings."""
    return {k: v.string_value for k, v in cfg.parameters.items()}


def variant_from_proto(cfg: mc.ModelConfig) -> VariantConfig:
    """Rebuild a ``VariantConfig`` from a parsed config (inverse of ``to_proto``)."""
    spec = get_model(cfg.name)
    variant: Variant
    sleep_us = sender_threads = 0
    if cfg.platform == "tensorrt_plan" or cfg.backend == "tensorrt":
        variant = "trt"
    elif cfg.backend == "null":
        variant = "null"
        given = parameters_of(cfg)

        def integer(key: str, unit: str = "") -> int:
            raw = given.get(key) or "0"
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"{cfg.name}: parameter {key}={raw!r} is not an integer{unit}") from None

        sleep_us = integer("sleep_us", " (microseconds)")
        sender_threads = integer("sender_threads")
    else:
        params = BackendParameters.from_parameters(parameters_of(cfg))
        variant = "sync" if params.mode == "sync" else "inflight"
    kinds = {v: k for k, v in _KINDS.items()}
    group = cfg.instance_group[0] if cfg.instance_group else mc.ModelInstanceGroup(count=1)
    batching = BatchingConfig(
        instances=group.count or 1,
        kind=kinds.get(group.kind, "auto"),  # type: ignore[arg-type]
        max_queue_delay_us=cfg.dynamic_batching.max_queue_delay_microseconds,
        preferred_batch_sizes=tuple(cfg.dynamic_batching.preferred_batch_size),
        cuda_graphs=cfg.optimization.cuda.graphs,
        gpus=tuple(group.gpus),
    )
    vc = VariantConfig(
        model=spec.name,
        variant=variant,
        batching=batching,
        max_batch_size=cfg.max_batch_size,
        name=cfg.name,
        sleep_us=sleep_us,
        sender_threads=sender_threads,
    )
    if variant not in ("trt", "null"):
        vc.params = BackendParameters.from_parameters(parameters_of(cfg))
    return vc


def apply_overrides(vc: VariantConfig, overrides: Mapping[str, str]) -> VariantConfig:
    """Return a copy of ``vc`` with ``key=value`` overrides applied.

    Keys: ``instances``, ``kind``, ``delay_us``, ``preferred`` (``512/1024/2000``), ``gpus`` (``0/1``:
    ``instances`` instances on each listed GPU), ``graphs``
    (TensorRT backend CUDA graphs), ``name``, any backend parameter (``slots``,
    ``response_threads``, ``cuda_graphs``...) and, for the ``null`` control model only, ``sleep_us`` and
    ``sender_threads``.

    Raises:
        ConfigError: for an unknown key or a bad value.
    """
    b = dataclasses.replace(vc.batching)
    params = dict(vc.params.to_parameters()) if vc.variant != "null" else {}
    name = vc.name
    sleep_us = vc.sleep_us
    sender_threads = vc.sender_threads
    for key, value in overrides.items():
        try:
            if key == "sleep_us":
                if vc.variant != "null":
                    raise ValueError(f"only the null control model sleeps; {vc.model_name} is a {vc.variant} variant")
                sleep_us = int(value)
                if sleep_us < 0:
                    raise ValueError("must be >= 0 (microseconds per batch)")
            elif key == "sender_threads":
                if vc.variant != "null":
                    raise ValueError(
                        f"sender_threads belongs to the null control model; {vc.model_name} is a {vc.variant} "
                        "variant (its senders are response_threads)"
                    )
                sender_threads = int(value)
                if not 0 <= sender_threads <= 256:
                    raise ValueError("must be 0 (return from execute) to 256")
            elif key == "instances":
                b.instances = int(value)
            elif key == "kind":
                if value not in _KINDS:
                    raise ValueError(f"choose one of {list(_KINDS)}")
                b.kind = value  # type: ignore[assignment]
            elif key in ("delay_us", "max_queue_delay_us"):
                b.max_queue_delay_us = int(value)
            elif key == "preferred":
                b.preferred_batch_sizes = tuple(int(x) for x in value.replace(",", "/").split("/") if x)
            elif key == "gpus":
                b.gpus = tuple(int(x) for x in value.replace(",", "/").split("/") if x)
                if any(g < 0 for g in b.gpus) or len(set(b.gpus)) != len(b.gpus):
                    raise ValueError("list distinct GPU indices separated by '/', e.g. gpus=0/1")
            elif key == "graphs":
                b.cuda_graphs = value.lower() in ("true", "1", "yes")
            elif key == "name":
                name = value
            elif key in params:
                params[key] = value
            else:
                raise ValueError(
                    "unknown key; use instances, kind, delay_us, preferred, gpus, graphs, name or "
                    + (
                        f"a backend parameter ({', '.join(sorted(params))})"
                        if params
                        else "sleep_us or sender_threads (null variant)"
                    )
                )
        except ValueError as e:
            raise ConfigError(f"override {key}={value!r}: {e}") from None
    return VariantConfig(
        model=vc.model,
        variant=vc.variant,
        batching=b,
        params=BackendParameters.from_parameters(params) if params else vc.params,
        max_batch_size=vc.max_batch_size,
        name=name,
        sleep_us=sleep_us,
        sender_threads=sender_threads,
    )


def parse_variant_arg(arg: str) -> tuple[str, dict[str, str]]:
    """Split ``bert_tiny_sync@instances=4,delay_us=500`` into the model name and overrides.

    Raises:
        ConfigError: when an override is not ``key=value``.
    """
    name, _, rest = arg.partition("@")
    overrides: dict[str, str] = {}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        if not eq:
            raise ConfigError(f"variant {arg!r}: override {part!r} is not key=value")
        overrides[key.strip()] = value.strip()
    return name, overrides
