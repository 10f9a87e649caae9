"""What Triton hands an instance, read against its model's spec: the model name, the config's tensors, a request."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from inflight.errors import ConfigError, ValidationError
from inflight.models import MODELS
from inflight.runtime.reading import RequestReader, check_tensors, resolve_spec


def test_a_variant_name_resolves_to_its_model_and_an_unknown_one_says_how_to_name_it() -> None:
    assert resolve_spec("bert_tiny_inflight_auto") is MODELS["bert_tiny"]
    with pytest.raises(ConfigError, match=r"unknown model 'nope'.*name the model <model>_inflight or <model>_sync"):
        resolve_spec("nope")


def test_a_config_tensor_the_model_lacks_is_refused() -> None:
    spec = MODELS["bert_tiny"]
    config = SimpleNamespace(input=[SimpleNamespace(name="input_ids")], output=[SimpleNamespace(name="cls")])
    check_tensors(spec, config)
    config.output.append(SimpleNamespace(name="logits"))
    with pytest.raises(ConfigError, match=r"config tensor 'logits' is not a tensor of model 'bert_tiny'"):
        check_tensors(spec, config)


class _Pb:
    """The one call of ``triton_python_backend_utils`` the reader makes; a request is a dict of arrays."""

    @staticmethod
    def get_input_tensor_by_name(request: dict[str, np.ndarray], name: str) -> Any:
        a = request.get(name)
        return None if a is None else SimpleNamespace(as_numpy=lambda: a)


def test_a_request_is_read_with_its_items_and_sequence_length() -> None:
    read = RequestReader(_Pb(), MODELS["bert_tiny"], max_batch=4)
    ids = np.ones((3, 7), np.int64)
    inputs, count, seq = read({"input_ids": ids, "attention_mask": ids})
    assert inputs["input_ids"] is ids and count == 3 and seq == 7
    _, count, seq = RequestReader(_Pb(), MODELS["linear_head"], max_batch=4)(
        {"features": np.zeros((2, 1024), np.float32)}
    )
    assert (count, seq) == (2, None)
    with pytest.raises(ValidationError):
        read({"input_ids": np.ones((5, 7), np.int64), "attention_mask": np.ones((5, 7), np.int64)})  # over max_batch
    with pytest.raises(ValidationError, match="missing input"):
        read({"input_ids": ids})
