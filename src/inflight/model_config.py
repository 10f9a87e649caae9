"""The backend's configuration: the ``inflight`` parameters of config.pbtxt, parsed and checked.

This is what the deployed backend reads: ``proto_from_json`` turns the model config Triton hands
``initialize()`` into a ``ModelConfig``, ``parameters_of`` takes its ``parameters`` map, and
``BackendParameters.from_parameters`` parses and range-checks it, with errors that name the key.
Generating config.pbtxt and the variants the tools load lives apart, in ``inflight.variants``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from inflight.errors import ConfigError
from inflight.models.packing import UNPAD_TOKEN_COST

#: Execution modes of the inflight backend (see ``BackendParameters.mode``).
Mode = Literal["pipelined", "sync", "overlap", "auto"]
#: Engines (see ``BackendParameters.engine``).
EngineKind = Literal["torch", "tensorrt", "auto"]
#: How the completion side waits for the device (see ``BackendParameters.completion_wait``).
CompletionWait = Literal["blocking", "poll"]
#: Precisions of the Torch engine on a GPU (see ``BackendParameters.precision``).
Precision = Literal["fp16", "bf16", "fp32"]
#: Compile modes of the Torch engine (see ``BackendParameters.compile``).
CompileMode = Literal["auto", "inductor", "max-autotune", "none"]


@dataclass(kw_only=True)
class BackendParameters:
    """Parameters of the ``inflight`` backend (the ``parameters`` map of config.pbtxt).

    Attributes:
        mode: ``sync`` (stock-equivalent: wait for the GPU after each batch, return the
            responses), ``pipelined`` (execute returns once the batch is enqueued; every response
            goes through ``send()``), ``overlap`` (the batch in chunks overlapped on the GPU inside
            one execute, every response returned) or ``auto`` (each batch in-band as ``sync``
            answers it, or deferred as ``pipelined`` does, by the overlap bound it measures:
            ``auto_bound_min``).
        engine: ``torch``, ``tensorrt`` or ``auto`` (TensorRT when a plan exists and runs here).
        slots: Batches in flight per instance (ring size), pipelined and auto modes; chunks in
            flight, overlap mode (at least 2).
        chunk_items: Items a chunk aims for (overlap mode); a batch below 1.5 times this runs as
            one chunk.
        max_chunks: Most chunks per batch (overlap mode).
        auto_bound_min: ``auto``: the overlap bound (the execute thread's cycle per batch over
            that cycle without the device wait, measured on in-band batches) from which batches
            are deferred; below it they are answered in-band (1: defer once measured; 0, the
            default: 1.4 on a GPU instance, in-band always on a CPU instance, whose compute
            shares the server's cores).
        auto_bound_high: ``auto``: the overlap bound from which a saturated instance defers unless
            its probe measured a loss (a gain under ``1 / auto_gain_min``); below it, only when the
            probe measured a gain of ``auto_gain_min``.
        auto_gain_min: ``auto``: the gain a probe must measure (the execute thread's cycle per
            request in-band over deferred) for the rest of the period to be deferred (0: defer
            whenever the bound allows).
        auto_probe_every_s: ``auto``: the probe period, by the host's clock (every instance probes
            in the same windows).
        auto_probe_s: ``auto``: the reference window (in-band) and the probe window (deferred) at
            the start of each period.
        auto_fill_min: ``auto``: the reference window's mean batch fill (items over the largest
            batch) from which the instance counts as saturated and probes (0: probe whenever the
            bound allows).
        auto_busy_min: ``auto``: the reference window's busy share (time inside ``execute()`` over
            the execute thread's cycle) from which the instance counts as saturated and probes,
            whatever its batches' fill (0: probe whenever the bound allows; 1: by fill alone).
        response_threads: Threads that send responses concurrently (pipelined and auto modes).
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
        graph_tokens: Unpadded launches of more kept tokens than this run eagerly at their own
            count (rounded up to 64) instead of replaying the graph of their token bucket: their
            kernels outlast the CPU's launching them, so a graph saves nothing there and the
            bucket's padding (up to 1/8 of the tokens) is saved. 0: from the model's size
            (``inflight.runtime.batch.EAGER_FROM_TOKENS`` bert-tiny tokens, scaled by the model's
            token FLOPs: about 2 ms of GPU time); a value at or above the largest launch replays a
            bucket's graph for every launch, as before.
        capture_at_load: Capture every (batch, sequence) bucket at initialize, within
            ``graph_memory_mb``; otherwise only the ``warmup_seq_len`` bucket, the others on
            their first use.
        graph_memory_mb: GPU memory the engine may hold (weights, static tensors, graph pool)
            while it captures buckets, at initialize or on their first use; past it the remaining
            buckets run eagerly (``inflight build-models`` counts it in each instance's memory).
        warmup_seq_len: The sequence bucket captured first at initialize.
        artifact: Torch artifact, relative to the model version folder.
        plan: TensorRT plan, relative to the model version folder.
        metrics: Export live metrics at Triton's metrics endpoint.
        metric_calls_per_execute: Metric calls one ``execute()`` makes at most; a publication (every
            0.5 s at most) is spread over the calls that follow it (0: all of it in one ``execute()``).
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
    engine: EngineKind = "torch"
    slots: int = 4
    chunk_items: int = 512
    max_chunks: int = 8
    auto_bound_min: float = 0.0
    auto_bound_high: float = 1.5
    auto_gain_min: float = 1.15
    auto_probe_every_s: float = 10.0
    auto_probe_s: float = 0.5
    auto_fill_min: float = 0.5
    auto_busy_min: float = 0.7
    response_threads: int = 8
    response_backlog: int = 8
    response_yield: bool = True
    gil_switch_interval_us: int = 0
    completion_wait: CompletionWait = "blocking"
    precision: Precision = "fp16"
    compile: CompileMode = "auto"
    cuda_graphs: bool = True
    batch_buckets: tuple[int, ...] = ()
    seq_buckets: tuple[int, ...] = (16, 32, 48, 64, 80, 96, 112, 128, 192, 256, 384, 512)
    max_graphs: int = 512
    unpad: bool = True
    unpad_token_cost: float = UNPAD_TOKEN_COST
    graph_tokens: int = 0
    capture_at_load: bool = True
    graph_memory_mb: int = 4096
    warmup_seq_len: int = 64
    artifact: str = "model.pt2"
    plan: str = "model.plan"
    metrics: bool = True
    metric_calls_per_execute: int = 4
    cupti: bool = False
    nvtx: bool = True
    gil_probe: bool = False
    gc_freeze: bool = False
    drain_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        """Check every choice against its ``Literal`` type and every value's range, where the options are built.

        Raises:
            ConfigError: naming the parameter and its choices or accepted range.
        """
        for key, allowed in choices().items():
            value = getattr(self, key)
            if value not in allowed:
                raise ConfigError(f"parameter {key}={value!r} is invalid: choose one of {list(allowed)}")
        self.check()

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
        shared = {f.name for f in dataclasses.fields(ModelParameters)}  # the model's own keys, parsed apart
        unknown = sorted(set(params) - set(fields) - shared)
        if unknown:
            raise ConfigError(f"unknown inflight parameter(s) {unknown}; known: {sorted({*fields, *shared})}")
        return cls(**_parse(cls(), {k: v for k, v in params.items() if k in fields}))

    def check(self) -> None:
        """Reject values out of range.

        Raises:
            ConfigError: naming the parameter and the accepted range.
        """
        if self.metric_calls_per_execute < 0:
            raise ConfigError(
                f"metric_calls_per_execute={self.metric_calls_per_execute}: use 0 (no bound) or a number of calls "
                "per execute()"
            )
        if self.slots < 1 or self.slots > 64:
            raise ConfigError(f"slots={self.slots}: use 1..64 batches in flight per instance")
        if self.mode == "overlap" and self.slots < 2:
            raise ConfigError(
                f"slots={self.slots}: mode={self.mode} needs at least 2 (a chunk is launched before the previous "
                "one is finished)"
            )
        if self.chunk_items < 1 or self.max_chunks < 1 or self.max_chunks > 64:
            raise ConfigError(
                f"chunk_items={self.chunk_items}, max_chunks={self.max_chunks}: use chunk_items >= 1 and "
                "max_chunks 1..64"
            )
        bound_ok = (self.auto_bound_min == 0.0 or self.auto_bound_min >= 1.0) and self.auto_bound_high >= 1.0
        windows_ok = self.auto_probe_s > 0 and 2 * self.auto_probe_s <= self.auto_probe_every_s
        if not bound_ok or self.auto_gain_min < 0 or not windows_ok:
            raise ConfigError(
                f"auto_bound_min={self.auto_bound_min}, auto_bound_high={self.auto_bound_high}, "
                f"auto_gain_min={self.auto_gain_min}, "
                f"auto_probe_every_s={self.auto_probe_every_s}, auto_probe_s={self.auto_probe_s}: use a bound >= 1 "
                "(or 0: by device), a high bound >= 1, a gain >= 0, and a period that holds its two windows "
                "(period >= 2 x window > 0)"
            )
        if not 0.0 <= self.auto_fill_min <= 1.0:
            raise ConfigError(
                f"auto_fill_min={self.auto_fill_min}: use a fraction of the largest batch, 0..1 (0: probe whenever the "
                "bound allows)"
            )
        if not 0.0 <= self.auto_busy_min <= 1.0:
            raise ConfigError(
                f"auto_busy_min={self.auto_busy_min}: use a share of the execute thread's cycle, 0..1 (0: probe "
                "whenever the bound allows; 1: by batch fill alone)"
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
        if self.graph_tokens < 0:
            raise ConfigError(
                f"graph_tokens={self.graph_tokens}: use 0 (from the model's size) or the kept tokens above which "
                "unpadded launches run eagerly at their own count"
            )
        if self.graph_memory_mb < 0:
            raise ConfigError(f"graph_memory_mb={self.graph_memory_mb}: must be >= 0 (0 captures at load nothing)")
        if self.drain_timeout_s < 0:
            raise ConfigError(f"drain_timeout_s={self.drain_timeout_s}: must be >= 0")


def _parse(default: Any, params: Mapping[str, str]) -> dict[str, Any]:
    """Each ``params`` string as the type of ``default``'s field of that name.

    Raises:
        ConfigError: naming the key whose value is of the wrong form.
    """
    kwargs: dict[str, Any] = {}
    for key, raw in params.items():
        raw = raw.strip()
        current = getattr(default, key)
        try:
            if isinstance(current, bool):
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
    return kwargs


#: Longest UTF-8 text of one item the backend tokenizes (``ModelParameters.max_text_bytes``). Far above
#: what ``max_seq_len`` tokens of any language need (about 4 bytes a character at worst x about 10
#: characters a token x 512 tokens is about 20 kB), and small enough that one request cannot keep the
#: tokenizer busy for long: text beyond the truncation point is still normalized before it is cut.
DEFAULT_MAX_TEXT_BYTES = 65536

#: Chunks a text encoder's word cache holds by default (``ModelParameters.tokenizer_word_cache``): more than the
#: common vocabulary of most English text; full, about 10 MB of a process's memory (64,377 chunks of 3-12 random
#: letters, ids held as bytes, measured with tracemalloc on 2026-11-29; 21 MB when they were lists).
DEFAULT_WORD_CACHE = 65536


@dataclass(frozen=True, kw_only=True)
class ModelParameters:
    """What config.pbtxt's ``parameters`` say of the model itself (not how to run it): its value checks and text.

    The tensors come from the config's ``input``/``output``; these keys add what a tensor's type
    cannot say. Every check is off unless its key is set. ``inflight build-models`` and ``inflight
    import-hf`` write them; the inflight and plain backends read them (``inflight.model_spec``).

    Attributes:
        token_input: The input that holds token ids (checked against ``vocab_size``; what a ``text``
            input is tokenized into).
        vocab_size: Token ids must lie in ``[0, vocab_size)``; 0: no check (a model without token ids).
        mask_input: The input that holds the attention mask (values 0 and 1 only; a masked token
            takes no part in the output, so the engine may pad with mask 0 and leave such tokens out);
            empty: no mask.
        max_seq_len: Longest sequence a request may send (tokens); 0: the longest sequence bucket.
        tokenizer: A Hugging Face ``tokenizers`` file (``tokenizer.json``), relative to the version
            folder, that the config's TYPE_STRING input is tokenized with (truncated to
            ``max_seq_len``; padded only to the batch's buckets).
        max_text_bytes: Longest text of one item in UTF-8 bytes; a longer one is refused (400).
        tokenizer_word_cache: Space-separated chunks of text whose ids the inflight and tokenizer backends
            remember, for a BERT WordPiece tokenizer (``inflight.runtime.wordpiece``: the library's ids,
            about ten times cheaper on English text); 0: every text through the ``tokenizers`` library. The plain
            backend always calls the library, as users' own Python models do.
        architecture: Where the model's architecture is described for the engine's unpadded
            launches (a JSON file beside the artifact, relative to the version folder; see
            ``inflight.models.bert.Architecture``); missing file: every launch runs padded.
    """

    token_input: str = "input_ids"
    vocab_size: int = 0
    mask_input: str = ""
    max_seq_len: int = 0
    tokenizer: str = ""
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES
    tokenizer_word_cache: int = DEFAULT_WORD_CACHE
    architecture: str = "model.json"

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> ModelParameters:
        """The model's keys of the config's parameters map (the others are the backend's or another backend's).

        Raises:
            ConfigError: naming a key whose value is of the wrong form or out of range.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        p = cls(**_parse(cls(), {k: v for k, v in params.items() if k in fields}))
        if p.vocab_size < 0 or p.max_seq_len < 0 or p.max_text_bytes < 1 or p.tokenizer_word_cache < 0:
            raise ConfigError(
                f"vocab_size={p.vocab_size}, max_seq_len={p.max_seq_len}, max_text_bytes={p.max_text_bytes}, "
                f"tokenizer_word_cache={p.tokenizer_word_cache}: use vocab_size >= 0 and max_seq_len >= 0 (0: no "
                "check), max_text_bytes >= 1 and tokenizer_word_cache >= 0 (0: off)"
            )
        return p

    def to_parameters(self) -> dict[str, str]:
        """The keys that differ from the defaults, as config.pbtxt stores them."""
        default = ModelParameters()
        return {
            f.name: str(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


@functools.cache
def choices() -> dict[str, tuple[str, ...]]:
    """The allowed values of each ``BackendParameters`` field typed with a ``Literal``, derived from that type."""
    hints = typing.get_type_hints(BackendParameters)
    return {name: typing.get_args(t) for name, t in hints.items() if typing.get_origin(t) is Literal}


_SHOWN = frozenset({"mode", "engine", "slots", "response_threads", "precision", "cuda_graphs"})


def proto_from_json(config_json: str | Mapping[str, Any]) -> mc.ModelConfig:
    """Parse the JSON model config Triton hands the backend (``args["model_config"]``)."""
    text = config_json if isinstance(config_json, str) else json.dumps(config_json)
    return json_format.Parse(text, mc.ModelConfig(), ignore_unknown_fields=True)


def parameters_of(cfg: mc.ModelConfig) -> dict[str, str]:
    """The ``parameters`` map as plain strings."""
    return {k: v.string_value for k, v in cfg.parameters.items()}
