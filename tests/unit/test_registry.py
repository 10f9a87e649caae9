from __future__ import annotations

import numpy as np
import pytest

from inflight.errors import ValidationError
from inflight.models import MODELS, get_model


def test_parameter_counts_match_the_published_architectures() -> None:
    import torch

    counts = {n: sum(p.numel() for p in s.make_module(0).parameters()) for n, s in MODELS.items()}
    assert 4.3e6 < counts["bert_tiny"] < 4.5e6
    for head in ("linear_head", "stacked_head", "seqlen_head"):
        assert 20.9e6 < counts[head] < 21.3e6, (head, counts[head])
    m = MODELS["bert_tiny"].make_module(0)
    x = MODELS["bert_tiny"].example_inputs(2, seq_len=9)
    with torch.inference_mode():
        y = m(*(torch.from_numpy(v) for v in x.values()))
    assert y.shape == (2, 128) and y.dtype == torch.float32


def test_weights_are_seeded() -> None:
    import torch

    a = MODELS["bert_tiny"].make_module(3).state_dict()
    b = MODELS["bert_tiny"].make_module(3).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_variant_names_resolve() -> None:
    assert get_model("bert_tiny_sync") is MODELS["bert_tiny"]
    assert get_model("linear_head_inflight") is MODELS["linear_head"]
    assert get_model("bert_tiny_inflight_auto") is MODELS["bert_tiny"]
    with pytest.raises(KeyError):
        get_model("bert_tiny_inflight_")
    with pytest.raises(KeyError, match="unknown model 'nope'"):
        get_model("nope")


def test_validate_accepts_good_input_and_counts_items() -> None:
    spec = MODELS["bert_tiny"]
    assert spec.validate(spec.example_inputs(5, seq_len=12)) == 5


@pytest.mark.parametrize(
    ("mutate", "pattern", "reason"),
    [
        (lambda x: x.pop("attention_mask"), r"missing input\(s\) \['attention_mask'\]", "missing_input"),
        (lambda x: x.update(input_ids=x["input_ids"].astype(np.int32)), r"datatype INT32; send INT64", "dtype"),
        (lambda x: x.update(input_ids=x["input_ids"][..., None]), r"expected \[batch, seq\]", "shape"),
        (lambda x: x.update(attention_mask=x["attention_mask"][:1]), r"disagree on the batch dimension", "shape"),
        (lambda x: x.update(attention_mask=x["attention_mask"][:, :4]), r"disagree on the sequence length", "shape"),
        (lambda x: x["input_ids"].__setitem__((0, 0), 30522), r"token id 30522 is outside", "token_out_of_range"),
        (lambda x: x["input_ids"].__setitem__((0, 0), -1), r"token id -1 is outside", "token_out_of_range"),
        (lambda x: x["attention_mask"].__setitem__((0, 0), 2), r"only 0 and 1", "mask_value"),
        (
            lambda x: x.update(input_ids=x["input_ids"][:0], attention_mask=x["attention_mask"][:0]),
            "empty",
            "empty_batch",
        ),
        (
            lambda x: x.update(input_ids=x["input_ids"][:, :0], attention_mask=x["attention_mask"][:, :0]),
            "sequence length is 0",
            "empty_sequence",
        ),
    ],
)
def test_validate_rejects_with_clear_messages(mutate: object, pattern: str, reason: str) -> None:
    spec = MODELS["bert_tiny"]
    x = spec.example_inputs(2, seq_len=8)
    mutate(x)  # type: ignore[operator]
    with pytest.raises(ValidationError, match=pattern) as e:
        spec.validate(x)
    assert e.value.reason == reason  # the label of the backend's rejected-requests counter


def test_validate_limits() -> None:
    bert = MODELS["bert_tiny"]
    with pytest.raises(ValidationError, match="exceeds the model's limit of 512 tokens") as e:
        bert.validate(bert.example_inputs(1, seq_len=513))
    assert e.value.reason == "sequence_too_long"
    head = MODELS["linear_head"]
    with pytest.raises(ValidationError, match="max_batch_size is 2048") as e:
        head.validate({"features": np.zeros((2049, 1024), np.float32)})
    assert e.value.reason == "batch_too_large"
    with pytest.raises(ValidationError, match="max_batch_size is 16"):
        head.validate({"features": np.zeros((17, 1024), np.float32)}, max_batch_size=16)
    with pytest.raises(ValidationError, match="empty request"):
        head.validate({"features": np.zeros((0, 1024), np.float32)})
    with pytest.raises(ValidationError, match="dimension 1 must be 1024"):
        head.validate({"features": np.zeros((1, 1000), np.float32)})
