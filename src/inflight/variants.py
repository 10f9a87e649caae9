"""Model variants for the tools: generate config.pbtxt, parse it back, and override it.

config.pbtxt is produced from tritonclient's ``model_config_pb2.ModelConfig`` with protobuf's
``text_format``, never from string templates. Five variants exist per model:

* ``<model>_inflight``: our backend, pipelined mode (several batches in flight per instance);
* ``<model>_sync``: our backend, stock-equivalent mode (one batch at a time, wait after each);
* ``<model>_trt``: the stock TensorRT backend (``platform: "tensorrt_plan"``), for NGC containers;
* ``<model>_null``: the null control model of ``backends/null``;
* ``<model>_plain``: the usual deployment, ``backends/plain`` (Triton's Python backend running the
  Torch module eagerly in fp16, one batch at a time): the baseline every gain is measured against.

The same object also yields the JSON that Triton's model-control API accepts as a config
override, which is how the A/B runner loads a variant with other instance counts or batching.
This is a tool module: the backend itself reads its parameters through ``inflight.model_config``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from inflight.errors import ConfigError
from inflight.model_config import DEFAULT_WORD_CACHE, BackendParameters, Mode, ModelParameters, parameters_of
from inflight.model_spec import TEXT_TYPE, spec_from_config
from inflight.models.registry import get_model
from inflight.models.spec import ModelSpec
from inflight.sizing import InstanceMemory, instances_that_fit

Variant = Literal["inflight", "sync", "trt", "null", "plain"]
Kind = Literal["auto", "gpu", "cpu"]
VARIANTS: tuple[Variant, ...] = get_args(Variant)
"""``null``: the control model of ``backends/null`` (Triton's Python backend answering zeros, no inflight code);
``plain``: ``backends/plain``, the model as the Python backend's examples serve it (eager fp16, no graphs)."""
#: Imports' ``max_batch_size`` without a GPU or a larger fit (``inflight.build.configs.import_batch_size``).
DEFAULT_MAX_BATCH_SIZE = 512

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
    model_spec: ModelSpec | None = None
    """The model's tensors and value checks (a config read back, an imported checkpoint); None: the built-in
    model ``model`` of the registry."""
    tokenizer: str = "tokenizer.json"
    """The tokenizer file in the version folder, for a model with a text input."""
    tokenizer_word_cache: int = DEFAULT_WORD_CACHE
    """Words the text input's word cache holds (``ModelParameters.tokenizer_word_cache``; 0: the library alone)."""

    @property
    def spec(self) -> ModelSpec:
        """The model: ``model_spec``, or the registry's built-in ``model``."""
        return self.model_spec if self.model_spec is not None else get_model(self.model)

    def model_parameters(self) -> ModelParameters:
        """What config.pbtxt says of the model itself (``inflight.model_config.ModelParameters``)."""
        spec = self.spec
        return ModelParameters(
            token_input=spec.token_input or "input_ids",
            vocab_size=spec.vocab_size or 0,
            mask_input=spec.mask_input or "",
            max_seq_len=spec.max_seq_len or 0,
            tokenizer=self.tokenizer if spec.text_input else "",
            tokenizer_word_cache=self.tokenizer_word_cache if spec.text_input else DEFAULT_WORD_CACHE,
        )

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
        elif self.variant in ("null", "plain"):
            cfg.backend = self.variant
        else:
            cfg.backend = "inflight"
        # the inflight backend groups a batch's requests by sequence bucket itself, so the dynamic
        # batcher may put requests of different lengths into one batch (without it, it batches
        # only equal shapes, and a mix of lengths fragments into small batches); the null control batches alike, or
        # in an ensemble's encoder step (each request as long as its longest text) it would run batches of one
        ragged = self.variant in ("inflight", "sync", "null")
        # a text input is an alternative to the token inputs: each of them is optional then (the null model takes
        # it too, and answers zeros: Triton's request path for a text workload)
        text = spec.text_input if self.variant in ("inflight", "sync", "plain", "null") else None
        for t in spec.inputs:
            cfg.input.add(
                name=t.name,
                data_type=mc.DataType.Value(t.triton_type),
                dims=list(t.dims),
                allow_ragged_batch=ragged and t.variable,
                optional=text is not None,
            )
        if text is not None:
            cfg.input.add(name=text, data_type=mc.DataType.Value(TEXT_TYPE), dims=[1], optional=True)
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
        elif self.variant in ("inflight", "sync"):
            # the variant decides sync or not; an inflight variant keeps its own non-sync mode
            mode: Mode = self.params.mode if self.params.mode != "sync" else "pipelined"
            if self.variant == "sync":
                mode = "sync"
            p = dataclasses.replace(self.params, mode=mode)
            if p.compile == "auto" and spec.gpu_compile == "none":  # the built-in model's measured choice
                p = dataclasses.replace(p, compile="none")
            for k, v in p.to_parameters(full=False).items():
                cfg.parameters[k].string_value = v
        # the backends that read the model's own keys; the null model carries them with a text input, which its
        # config names only with them (``spec_of``)
        if self.variant in ("inflight", "sync", "plain") or (self.variant == "null" and text is not None):
            for k, v in self.model_parameters().to_parameters().items():
                if not (k == "tokenizer" and text is None):
                    cfg.parameters[k].string_value = v
        return cfg

    def to_pbtxt(self) -> str:
        """config.pbtxt text."""
        return config_text(self.to_proto())

    def to_json(self) -> str:
        """The JSON form Triton's model-control ``load`` accepts as a ``config`` override."""
        return json_format.MessageToJson(self.to_proto(), preserving_proto_field_name=True, indent=None)

    def write(self, repository: Path) -> Path:
        """Write ``<repository>/<name>/config.pbtxt`` and the version folder ``1/``."""
        return write_config(repository, self.to_proto())


def write_config(repository: Path, cfg: mc.ModelConfig) -> Path:
    """Write ``<repository>/<cfg.name>/config.pbtxt`` (generated) and the version folder ``1/``; return the folder."""
    d = repository / cfg.name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(config_text(cfg))
    return d


def config_text(cfg: mc.ModelConfig) -> str:
    """config.pbtxt's text of ``cfg``, under the header that says it is generated."""
    return _HEADER + text_format.MessageToString(cfg)


_HEADER = "# Generated by `inflight build-models` from inflight.variants; edit the generator, not this file.\n"


def text_pipeline(
    spec: ModelSpec, name: str, *, tokenizer: str = "tokenizer.json", instances: int = 2, encoder: str | None = None
) -> tuple[mc.ModelConfig, mc.ModelConfig]:
    """``<name>_tokenizer`` (CPU instances of ``backends/tokenizer``) and ``<name>_text``: text -> embedding.

    The ensemble's first step tokenizes in stubs of its own, on the server's cores; its second runs the
    encoder (``encoder``, default ``<name>_inflight``) on the token ids. So text is tokenized off the
    encoder's execute thread, where the encoder's own ``text`` input would tokenize it.

    Raises:
        ConfigError: when the model has no text input.
    """
    if spec.text_input is None or spec.token_input is None or spec.mask_input is None:
        raise ConfigError(f"{name}: a text pipeline needs a model with a text input, token ids and a mask")
    mp = ModelParameters(max_seq_len=spec.max_seq_len or 0, tokenizer=tokenizer)
    tok = mc.ModelConfig(name=f"{name}_tokenizer", backend="tokenizer", max_batch_size=spec.max_batch_size)
    tok.input.add(name=spec.text_input, data_type=mc.DataType.Value(TEXT_TYPE), dims=[1])
    for t in (spec.input(spec.token_input), spec.input(spec.mask_input)):
        tok.output.add(name=t.name, data_type=mc.DataType.Value(t.triton_type), dims=list(t.dims))
    tok.instance_group.add(count=instances, kind=_KINDS["cpu"])
    tok.dynamic_batching.max_queue_delay_microseconds = 500
    for k, v in mp.to_parameters().items():
        tok.parameters[k].string_value = v
    ens = mc.ModelConfig(name=f"{name}_text", platform="ensemble", max_batch_size=spec.max_batch_size)
    ens.input.add(name=spec.text_input, data_type=mc.DataType.Value(TEXT_TYPE), dims=[1])
    for t in spec.outputs:
        ens.output.add(name=t.name, data_type=mc.DataType.Value(t.triton_type), dims=list(t.dims))
    first = ens.ensemble_scheduling.step.add(model_name=tok.name, model_version=-1)
    first.input_map[spec.text_input] = spec.text_input
    second = ens.ensemble_scheduling.step.add(model_name=encoder or f"{name}_inflight", model_version=-1)
    for key in (spec.token_input, spec.mask_input):
        first.output_map[key] = f"_{key}"
        second.input_map[key] = f"_{key}"
    for t in spec.outputs:
        second.output_map[t.name] = t.name
    return tok, ens


def inflight_deployment(
    server_cpus: int, params: BackendParameters, gpus: int = 1, memory: InstanceMemory | None = None
) -> tuple[int, BackendParameters]:
    """The instances and parameters ``<model>_inflight`` is written with for a server of ``server_cpus`` cores.

    The rule (issue 30, item 3), from the open-loop sittings under ``results/modes`` (capacity at
    p99 <= 50 ms, Poisson arrivals, server and generator on disjoint cores):

    * **one instance per server core.** Each instance is one stub process whose Python thread
      bounds what it serves (under one core while saturated); fewer instances than cores leave
      cores idle, more only add processes that take turns on them. The best sync configuration
      in those sittings is also one instance per core.
    * **``mode=auto``.** Each instance answers a batch in-band, on the sync mode's path, unless
      the overlap bound its in-band batches measure reaches ``auto_bound_min`` (1.4) and a probe
      of the saturated instance measured a gain of ``auto_gain_min`` (from ``auto_bound_high``,
      1.5: no loss; ``AutoPolicy``): then it defers batches as the pipelined mode does.
      bert-tiny's bound at capacity was 1.07-1.24 (sync wins there, and auto stays in-band);
      bert-small's 1.7-3.0 (one instance: pipelined 1.65x sync, auto 1.11x). Slots and response
      threads keep their defaults.

    * **split over the GPUs.** Triton places an instance group's ``count`` on *each* GPU the server
      sees, so with ``gpus`` GPUs the count is the cores divided among them (at least one per GPU):
      one instance per core in all.
    * **no more than fit the GPU's memory** (issue 53): with ``memory`` measured on the GPU,
      :func:`inflight.sizing.instances_that_fit` caps the count so that every instance can run
      its largest launch at once (bert-small's 8 instances of batches up to 2,048 x 512 tokens ran
      an 80 GB H100 out of memory and failed requests).

    ``RESULTS.md`` ("Sync against pipelined") has the measured default beside the best sync and
    pipelined configurations per core budget.

    Args:
        server_cpus: Cores the server and its stubs will run on (``taskset``/``--cpus``).
        params: The parameters to start from (e.g. the model's warm-up length).
        gpus: GPUs the server will see (0 or 1: one GPU, or instances on the CPU).
        memory: What one instance holds and the GPU has free (None: not measured, cores only).

    Returns:
        The instance count (per GPU, as ``instance_group.count``) and the parameters for ``<model>_inflight``.

    Raises:
        ConfigError: when ``server_cpus`` < 1 or ``gpus`` < 0.
    """
    if server_cpus < 1:
        raise ConfigError(f"server_cpus={server_cpus}: give the number of cores the server will run on (>= 1)")
    if gpus < 0:
        raise ConfigError(f"gpus={gpus}: give the number of GPUs the server will see (0 for none)")
    per_gpu = max(1, server_cpus // max(gpus, 1))
    return instances_that_fit(per_gpu, memory), dataclasses.replace(params, mode="auto")


def parse_pbtxt(text: str) -> mc.ModelConfig:
    """Parse config.pbtxt text into a ``ModelConfig``.

    Raises:
        ConfigError: with protobuf's position of the syntax error.
    """
    try:
        return text_format.Parse(text, mc.ModelConfig())
    except text_format.ParseError as e:
        raise ConfigError(f"config.pbtxt does not parse: {e}") from None


def variant_from_proto(cfg: mc.ModelConfig) -> VariantConfig:
    """Rebuild a ``VariantConfig`` from a parsed config (inverse of ``to_proto``): any model a config describes."""
    spec = spec_of(cfg)
    variant: Variant
    sleep_us = sender_threads = 0
    if cfg.platform == "tensorrt_plan" or cfg.backend == "tensorrt":
        variant = "trt"
    elif cfg.backend == "plain":
        variant = "plain"
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
    model_params = ModelParameters.from_parameters(parameters_of(cfg))
    vc = VariantConfig(
        model=base_name(cfg.name),
        variant=variant,
        batching=batching,
        max_batch_size=cfg.max_batch_size,
        name=cfg.name,
        sleep_us=sleep_us,
        sender_threads=sender_threads,
        model_spec=spec,
        tokenizer=model_params.tokenizer or "tokenizer.json",
        tokenizer_word_cache=model_params.tokenizer_word_cache,
    )
    if variant in ("inflight", "sync"):
        vc.params = BackendParameters.from_parameters(parameters_of(cfg))
    return vc


def apply_overrides(vc: VariantConfig, overrides: Mapping[str, str]) -> VariantConfig:
    """Return a copy of ``vc`` with ``key=value`` overrides applied.

    Keys: ``instances``, ``kind``, ``delay_us``, ``preferred`` (``512/1024/2000``), ``gpus`` (``0/1``:
    ``instances`` instances on each listed GPU), ``graphs``
    (TensorRT backend CUDA graphs), ``name``, ``tokenizer_word_cache`` (a model with a text input), any backend
    parameter (``slots``, ``response_threads``, ``cuda_graphs``...) and, for the ``null`` control model only,
    ``sleep_us`` and ``sender_threads``.

    Raises:
        ConfigError: for an unknown key or a bad value.
    """
    b = dataclasses.replace(vc.batching)
    params = dict(vc.params.to_parameters()) if vc.variant in ("inflight", "sync") else {}
    name = vc.name
    sleep_us = vc.sleep_us
    sender_threads = vc.sender_threads
    word_cache = vc.tokenizer_word_cache
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
            elif key == "tokenizer_word_cache":
                if vc.spec.text_input is None:
                    raise ValueError(f"{vc.model_name} has no text input to tokenize")
                word_cache = int(value)
                if word_cache < 0:
                    raise ValueError("must be >= 0 (words; 0: the tokenizers library alone)")
            elif key in params:
                params[key] = value
            else:
                raise ValueError(
                    "unknown key; use instances, kind, delay_us, preferred, gpus, graphs, name, "
                    "tokenizer_word_cache or "
                    + (
                        f"a backend parameter ({', '.join(sorted(params))})"
                        if params
                        else "sleep_us or sender_threads (null variant)"
                        if vc.variant == "null"
                        else "nothing else (this variant has no backend parameters)"
                    )
                )
        except ValueError as e:
            raise ConfigError(f"override {key}={value!r}: {e}") from None
    return dataclasses.replace(
        vc,
        batching=b,
        params=BackendParameters.from_parameters(params) if params else vc.params,
        name=name,
        sleep_us=sleep_us,
        sender_threads=sender_threads,
        tokenizer_word_cache=word_cache,
    )


def spec_of(cfg: mc.ModelConfig, version_dir: Path | None = None) -> ModelSpec:
    """The model a config describes (``spec_from_config``), named by the model its name serves (``base_name``)."""
    return dataclasses.replace(spec_from_config(cfg, version_dir=version_dir), name=base_name(cfg.name))


def base_name(name: str) -> str:
    """The model a variant name serves: ``bert_tiny_sync`` -> ``bert_tiny``, ``minilm_inflight_auto`` -> ``minilm``."""
    for variant in VARIANTS:
        base, sep, _ = name.partition(f"_{variant}")
        if sep and base and (name == f"{base}_{variant}" or name.startswith(f"{base}_{variant}_")):
            return base
    return name


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


def repository_spec(repository: Path, name: str) -> ModelSpec:
    """The model ``name`` (a base or variant name) serves: the built-in model, else what its repository says.

    A model that is not built in is read from ``<repository>/<base>_inflight`` (its config.pbtxt and
    the architecture beside its artifact), named by its base name.

    Raises:
        ConfigError: when the model is neither built in nor in the repository.
    """
    from inflight.models.registry import MODELS

    base = base_name(name)
    if base in MODELS:
        return MODELS[base]
    d = Path(repository) / f"{base}_inflight"
    if not (d / "config.pbtxt").is_file():
        raise ConfigError(
            f"model {name!r} is not built in ({sorted(MODELS)}) and {d / 'config.pbtxt'} does not exist: import it "
            "with `inflight import-hf DIR --name NAME` or pass --repository"
        )
    return spec_of(parse_pbtxt((d / "config.pbtxt").read_text()), d / "1")
