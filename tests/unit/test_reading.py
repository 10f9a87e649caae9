"""What Triton hands an instance, read against its model's spec: a request (the spec itself: test_model_spec.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from inflight.errors import ValidationError
from inflight.models import MODELS
from inflight.runtime.reading import RequestReader


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
