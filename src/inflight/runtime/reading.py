"""What Triton hands an instance, read against its model's spec.

At load the spec is what the config says (``inflight.model_spec.spec_from_config``). Per request:
its input arrays (:class:`RequestReader`, the ``read`` of ``inflight.runtime.modes.Answering``);
per batch, its texts tokenized at once (:meth:`RequestReader.tokenize`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from inflight.errors import ValidationError
from inflight.model_config import ModelParameters
from inflight.models.spec import ModelSpec

if TYPE_CHECKING:
    from inflight.runtime.batch import Item
    from inflight.runtime.text import TextEncoder


def text_encoder(spec: ModelSpec, params: ModelParameters, version_dir: Path, max_seq: int) -> TextEncoder | None:
    """The tokenizer of the model's text input (None without one), truncating to ``max_seq`` tokens.

    Raises:
        ConfigError: when the tokenizer file is missing or unreadable, or ``tokenizers`` is not installed.
    """
    if spec.text_input is None:
        return None
    from inflight.runtime.text import TextEncoder

    return TextEncoder(
        version_dir / params.tokenizer,
        max_len=max_seq,
        max_bytes=params.max_text_bytes,
        word_cache=params.tokenizer_word_cache,
    )


class RequestReader:
    """Reads one request's inputs and checks their shapes and types (their values: ``partition_values``, per batch).

    A request of a model with a text input sends either the text or the token inputs; the texts of a
    batch are tokenized together (:meth:`tokenize`) before its values are checked.

    Args:
        pb_utils: The ``triton_python_backend_utils`` module.
        spec: The model.
        max_batch: The most items a request may hold.
        text: The text input's tokenizer (None: no text input).
    """

    def __init__(self, pb_utils: Any, spec: ModelSpec, max_batch: int, text: TextEncoder | None = None) -> None:
        self.pb = pb_utils
        self.spec = spec
        self.max_batch = max_batch
        self.text = text
        #: seconds spent tokenizing, all batches (the finalize log's ``tokenize_s``), and the longest batch's
        self.tokenize_s = 0.0
        self.tokenize_max_s = 0.0
        self._seq_axis = spec.seq_input or (spec.inputs[0].name if spec.variable_seq else None)

    def __call__(self, request: Any) -> tuple[dict[str, np.ndarray], int, int | None]:
        """The request's arrays by input name, its item count and its sequence length (None: fixed shapes).

        A text request gives its text array alone (item count, no length yet): :meth:`tokenize` turns it
        into token arrays.

        Raises:
            ValidationError: with a message that says what is wrong and how to fix it.
        """
        inputs: dict[str, np.ndarray] = {}
        for t in self.spec.inputs:
            tensor = self.pb.get_input_tensor_by_name(request, t.name)
            if tensor is not None:
                inputs[t.name] = tensor.as_numpy()
        if self.spec.text_input is not None:
            tensor = self.pb.get_input_tensor_by_name(request, self.spec.text_input)
            if tensor is not None:
                if inputs:
                    raise ValidationError(
                        f"this request sends both {self.spec.text_input!r} and {sorted(inputs)}; send the text or "
                        "the token inputs, not both",
                        "text_and_tokens",
                    )
                texts = tensor.as_numpy()
                count = int(texts.shape[0]) if texts.ndim else 0
                if count == 0:
                    raise ValidationError(
                        "empty request: the batch dimension is 0; send at least one text", "empty_batch"
                    )
                if count > self.max_batch:
                    raise ValidationError(
                        f"request has {count} texts but max_batch_size is {self.max_batch}; split it", "batch_too_large"
                    )
                return {self.spec.text_input: texts}, count, None
        count = self.spec.validate(inputs, max_batch_size=self.max_batch, check_values=False)
        seq = int(inputs[self._seq_axis].shape[1]) if self._seq_axis is not None else None
        return inputs, count, seq

    def tokenize(self, items: Sequence[Item]) -> list[tuple[Item, ValidationError]]:
        """Tokenize the batch's text requests at once, in place (their inputs become token arrays); return the bad.

        One ``encode_batch`` over every text of the batch; a request whose text is bad (not UTF-8,
        empty, too long) or too long after tokenizing fails alone.
        """
        name = self.spec.text_input
        texts = [it for it in items if name is not None and name in it.inputs]
        if not texts or self.text is None:
            return []
        t0 = time.perf_counter()
        bad: list[tuple[Item, ValidationError]] = []
        encoded = self.text.encode_batch([it.inputs[name] for it in texts])  # type: ignore[index]
        tokens, mask = self.spec.token_input or "", self.spec.mask_input or ""
        for it, result in zip(texts, encoded, strict=True):
            if isinstance(result, ValidationError):
                bad.append((it, result))
                continue
            ids, keep = result
            arrays = {tokens: ids.astype(self.spec.input(tokens).dtype, copy=False)}
            arrays[mask] = keep.astype(self.spec.input(mask).dtype, copy=False)
            try:
                it.count = self.spec.validate(arrays, max_batch_size=self.max_batch, check_values=False)
            except ValidationError as e:
                bad.append((it, e))
                continue
            it.inputs = arrays
            it.seq = int(ids.shape[1])
        took = time.perf_counter() - t0
        self.tokenize_s += took
        self.tokenize_max_s = max(self.tokenize_max_s, took)
        return bad
