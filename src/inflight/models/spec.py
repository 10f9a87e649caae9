"""Model specifications: each model's tensors, limits, Torch module factory and request validation.

A :class:`ModelSpec` is the single place that knows what a model accepts. The builder writes
configs and artifacts from it, the backend validates requests with it, the load test draws inputs
from it and the tests compare with references computed from it (the Polygraphy habit of pairing
each model with the function that checks it). The models themselves (``bert``, ``heads``) define
their specs; :mod:`inflight.models.registry` lists them by name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from inflight.errors import ValidationError

if TYPE_CHECKING:
    import torch

# numpy dtype name -> Triton type name (config.pbtxt) and KServe v2 datatype (wire protocol)
TRITON_TYPES: dict[str, str] = {
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "bool": "TYPE_BOOL",
}
WIRE_TYPES: dict[str, str] = {
    "int64": "INT64",
    "int32": "INT32",
    "float32": "FP32",
    "float16": "FP16",
    "bool": "BOOL",
}


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """One input or output tensor of a model, per item (the batch dimension is implicit).

    Attributes:
        name: Tensor name as clients send it.
        dtype: numpy dtype name (``"int64"``, ``"float32"``...).
        dims: Shape of one item; ``-1`` marks the variable sequence dimension.
    """

    name: str
    dtype: str
    dims: tuple[int, ...]

    @property
    def triton_type(self) -> str:
        """The ``TYPE_*`` name used in config.pbtxt."""
        return TRITON_TYPES[self.dtype]

    @property
    def wire_type(self) -> str:
        """The KServe v2 datatype name (``INT64``, ``FP32``...)."""
        return WIRE_TYPES[self.dtype]

    @property
    def variable(self) -> bool:
        """True when one dimension is the variable sequence length."""
        return -1 in self.dims

    def shape(self, batch: int, seq_len: int | None) -> tuple[int, ...]:
        """Concrete shape for ``batch`` items, with ``seq_len`` filling the variable dimension."""
        if self.variable and seq_len is None:
            raise ValueError(f"tensor {self.name!r} has a variable dimension: pass seq_len")
        dims = [int(seq_len) if d == -1 and seq_len is not None else d for d in self.dims]
        return (batch, *dims)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Everything the project knows about one model.

    Attributes:
        name: Base name; variants are ``<name>_inflight``, ``<name>_sync``, ``<name>_trt``.
        description: One line for logs and the README.
        inputs: Input tensors (per item).
        outputs: Output tensors (per item).
        max_batch_size: Largest batch the configs allow (items, not requests).
        default_seq_len: Sequence length used by load tests and warm-up (variable models only).
        max_seq_len: Longest sequence the model accepts (variable models only).
        vocab_size: Token ids must be below this (token models only).
        token_input: Name of the input that holds token ids (checked against ``vocab_size``; None:
            ``seq_input``).
        make_module: Builds the Torch module (fp32, CPU, eval mode): seeded random weights for a
            built-in model; for a served model, the architecture its artifact's ``model.json``
            describes (the engine loads the artifact's weights into it for unpadded launches); None
            when nothing but the artifact describes the model.
        seq_input: Name of the input whose variable dimension is the sequence length.
        mask_input: Name of the attention-mask input (token models): a token whose bit is 0 takes
            no part in the output.
        unpadded: The module ``make_module`` builds also has ``forward_unpadded(input_ids,
            position_ids, cu_seqlens, max_len)`` over sequences laid end to end without their
            masked tokens (see ``inflight.models.packing``); the Torch engine on a GPU then runs
            launches with much padding that way (``unpad`` parameter).
        text_input: Name of a text input (one string per item) that the backend tokenizes into
            ``token_input`` and ``mask_input``, as an alternative to sending them; None: no text.
        portable_options: ``make_module`` options for exports that take plain PyTorch ops only
            (ONNX): e.g. bert_tiny's ``kernels=False`` leaves its fused operators out.
        reference_options: ``make_module`` options that build the model without any of its
            output-preserving rewrites: the model every rewrite is checked against.
        gpu_compile: What the Torch engine's ``compile=auto`` means on a GPU for this model:
            ``inductor`` or ``none``, whichever ran faster in ``inflight bench-engine`` (the
            heads' choices are measured in ``results/engine-heads``).
    """

    name: str
    description: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    make_module: Callable[..., torch.nn.Module] | None = None
    default_seq_len: int | None = None
    max_seq_len: int | None = None
    vocab_size: int | None = None
    token_input: str | None = None
    seq_input: str | None = None
    mask_input: str | None = None
    unpadded: bool = False
    text_input: str | None = None
    portable_options: Mapping[str, Any] = field(default_factory=dict)
    reference_options: Mapping[str, Any] = field(default_factory=dict)
    gpu_compile: Literal["inductor", "none"] = "inductor"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def build_module(self, seed: int = 0, **options: Any) -> torch.nn.Module:
        """``make_module(seed, **options)``.

        Raises:
            ConfigError: when nothing but the artifact describes the model (no module to build).
        """
        if self.make_module is None:
            from inflight.errors import ConfigError

            raise ConfigError(
                f"model {self.name!r} is described by its artifact alone; this needs its architecture (a model.json "
                "beside the artifact, as `inflight import-hf` writes) or a built-in model"
            )
        return self.make_module(seed, **options)

    @property
    def variable_seq(self) -> bool:
        """True when the model takes a variable sequence length."""
        return any(t.variable for t in self.inputs)

    def input(self, name: str) -> TensorSpec:
        """The input called ``name``."""
        for t in self.inputs:
            if t.name == name:
                return t
        raise KeyError(f"model {self.name!r} has no input {name!r}; inputs: {[t.name for t in self.inputs]}")

    def example_inputs(
        self, batch: int, *, seq_len: int | None = None, rng: np.random.Generator | None = None
    ) -> dict[str, np.ndarray]:
        """Random valid inputs for ``batch`` items.

        Token models get ids uniform in ``[1, vocab)`` with a random number of trailing padding
        positions (mask 0, id 0) per item, so that masks matter in every check.
        """
        rng = rng if rng is not None else np.random.default_rng(0)
        if self.variable_seq:
            seq_len = seq_len if seq_len is not None else self.default_seq_len
        out: dict[str, np.ndarray] = {}
        if self.vocab_size is not None:
            assert seq_len is not None
            ids = rng.integers(1, self.vocab_size, size=(batch, seq_len), dtype=np.int64)
            lengths = rng.integers(max(1, seq_len // 2), seq_len + 1, size=batch)
            mask = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int64)
            ids *= mask
            out[self.token_input or "input_ids"] = ids
            if self.mask_input is not None:
                out[self.mask_input] = mask
            for t in self.inputs:  # any other input: zeros of its shape
                if t.name not in out:
                    out[t.name] = np.zeros(t.shape(batch, seq_len), t.dtype)
            return out
        for t in self.inputs:
            out[t.name] = rng.standard_normal(t.shape(batch, seq_len)).astype(t.dtype)
        return out

    @functools.cached_property
    def _checks(self) -> tuple[tuple[str, np.dtype[Any], int, tuple[int, ...]], ...]:
        # (name, dtype, ndim, per-item dims) of each input, computed once: validation runs per request
        return tuple((t.name, np.dtype(t.dtype), len(t.dims) + 1, t.dims) for t in self.inputs)

    def validate(
        self, inputs: Mapping[str, np.ndarray], *, max_batch_size: int | None = None, check_values: bool = True
    ) -> int:
        """Check one request's inputs; return its item count.

        This runs once per request on the issue path, so the common case costs a few attribute
        reads; the messages are built only on failure.

        Args:
            inputs: The request's arrays by input name.
            max_batch_size: Largest item count accepted (default: the model's).
            check_values: Also check token ids and masks (``check_values``). The backend passes
                False and checks the whole gathered batch at once instead (one reduction per input
                for the batch rather than per request), falling back to per-request checks to find
                the offenders when the batch check fails.

        Raises:
            ValidationError: with a message that says what is wrong and how to fix it.
        """
        limit = max_batch_size if max_batch_size is not None else self.max_batch_size
        batch = -1
        seq = -1
        for name, dtype, ndim, dims in self._checks:
            a = inputs.get(name)
            if a is None:
                alternative = f", or {self.text_input!r} (BYTES [-1, 1], one text per item)" if self.text_input else ""
                raise ValidationError(
                    f"missing input(s) {[t.name for t in self.inputs if t.name not in inputs]}; model "
                    f"{self.name!r} needs {[(t.name, t.wire_type, [-1, *t.dims]) for t in self.inputs]}{alternative}",
                    "missing_input",
                )
            if a.dtype != dtype:
                raise ValidationError(
                    f"input {name!r} has datatype {_wire(a.dtype)}; send {WIRE_TYPES[dtype.name]}", "dtype"
                )
            shape = a.shape
            if len(shape) != ndim:
                raise ValidationError(
                    f"input {name!r} has shape {list(shape)}; expected [batch, "
                    f"{', '.join('seq' if d == -1 else str(d) for d in dims)}]",
                    "shape",
                )
            if batch < 0:
                batch = shape[0]
            elif shape[0] != batch:
                raise ValidationError(
                    f"inputs disagree on the batch dimension: {name!r} has {shape[0]} items, "
                    f"others {batch}; send the same number of items in every input",
                    "shape",
                )
            for axis, d in enumerate(dims, start=1):
                if d == -1:
                    if seq < 0:
                        seq = shape[axis]
                    elif shape[axis] != seq:
                        raise ValidationError(
                            f"inputs disagree on the sequence length: {name!r} has {shape[axis]}, "
                            f"others {seq}; pad input_ids and attention_mask to the same length",
                            "shape",
                        )
                elif shape[axis] != d:
                    raise ValidationError(
                        f"input {name!r} has shape {list(shape)}; dimension {axis} must be {d}", "shape"
                    )
        if batch == 0:
            raise ValidationError("empty request: the batch dimension is 0; send at least one item", "empty_batch")
        if batch > limit:
            raise ValidationError(
                f"request has {batch} items but max_batch_size is {limit}; split it into requests "
                f"of at most {limit} items",
                "batch_too_large",
            )
        if seq >= 0:
            if seq == 0:
                raise ValidationError("sequence length is 0; send at least one token per item", "empty_sequence")
            if self.max_seq_len is not None and seq > self.max_seq_len:
                raise ValidationError(
                    f"sequence length {seq} exceeds the model's limit of {self.max_seq_len} tokens; "
                    f"truncate the input to {self.max_seq_len}",
                    "sequence_too_long",
                )
        if check_values:
            self.check_values(inputs)
        return int(batch)

    def check_values(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Check that token ids lie in the vocabulary and masks hold only 0 and 1.

        Works on one request's arrays or on a whole gathered batch (what the device would fault on,
        or silently read out of bounds, is refused before anything is enqueued).

        Raises:
            ValidationError: naming the offending value.
        """
        tokens = self.token_input or self.seq_input
        if self.vocab_size is not None and tokens is not None:
            self._check_ids(inputs[tokens], self.vocab_size)
        if self.mask_input is not None:
            mask = inputs[self.mask_input]
            if mask.size and int(mask.view(_UNSIGNED[mask.dtype.itemsize]).max()) > 1:
                raise ValidationError(f"{self.mask_input} must contain only 0 and 1", "mask_value")

    @staticmethod
    def _check_ids(ids: np.ndarray, vocab_size: int) -> None:
        # one reduction: seen as unsigned, a negative id is huge, so max() catches both ends
        if ids.size and int(ids.view(_UNSIGNED[ids.dtype.itemsize]).max()) >= vocab_size:
            lo, hi = int(ids.min()), int(ids.max())
            bad = hi if hi >= vocab_size else lo
            raise ValidationError(
                f"token id {bad} is outside the vocabulary [0, {vocab_size}); use the model's tokenizer",
                "token_out_of_range",
            )

    def dynamic_shapes(self) -> dict[str, dict[int, str]]:
        """Variable axes per input: batch always, and the sequence axis where there is one."""
        out: dict[str, dict[int, str]] = {}
        for t in self.inputs:
            axes = {0: "batch"}
            for axis, d in enumerate(t.dims, start=1):
                if d == -1:
                    axes[axis] = "seq"
            out[t.name] = axes
        return out


#: unsigned view of an integer array by item size (a negative value is then larger than any valid one)
_UNSIGNED: dict[int, type] = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _wire(dtype: np.dtype) -> str:
    return WIRE_TYPES.get(np.dtype(dtype).name, np.dtype(dtype).name)
