"""A model is what its config.pbtxt and its artifact say: the spec from a config, its refusals, the artifact check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from inflight.errors import ConfigError, ValidationError
from inflight.model_spec import spec_from_config
from inflight.models import MODELS
from inflight.variants import VariantConfig, parse_pbtxt, variant_from_proto


def _config(text: str) -> mc.ModelConfig:
    return parse_pbtxt(text)


GENERIC = """
name: "scorer"
backend: "inflight"
max_batch_size: 64
input [ { name: "x" data_type: TYPE_FP32 dims: [ 8 ] }, { name: "w" data_type: TYPE_FP32 dims: [ 8 ] } ]
output [ { name: "score" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


@pytest.mark.parametrize("model", ["bert_tiny", "bert_small", "linear_head", "seqlen_head"])
def test_every_built_in_model_is_what_its_generated_config_says(model: str) -> None:
    builtin = MODELS[model]
    for variant in ("inflight", "sync", "plain"):
        spec = spec_from_config(VariantConfig(model=model, variant=variant).to_proto())
        assert spec.inputs == builtin.inputs and spec.outputs == builtin.outputs
        assert spec.max_batch_size == builtin.max_batch_size
        assert (spec.vocab_size, spec.token_input, spec.mask_input) == (
            builtin.vocab_size,
            builtin.token_input,
            builtin.mask_input,
        )
        assert spec.max_seq_len == builtin.max_seq_len and spec.text_input is None


def test_a_generic_config_is_served_with_no_value_checks() -> None:
    spec = spec_from_config(_config(GENERIC))
    assert [t.name for t in spec.inputs] == ["x", "w"] and spec.outputs[0].dims == (1,)
    assert spec.vocab_size is None and spec.mask_input is None and not spec.variable_seq
    x = {"x": np.zeros((3, 8), np.float32), "w": np.zeros((3, 8), np.float32)}
    assert spec.validate(x) == 3
    with pytest.raises(ValidationError, match="dimension 1 must be 8"):
        spec.validate({"x": np.zeros((3, 7), np.float32), "w": np.zeros((3, 8), np.float32)})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("dims: [ 1 ] }", "dims: [ -1 ] }"), r"output 'score' has a variable dimension"),
        (("TYPE_FP32 dims: [ 8 ] }, {", "TYPE_FP64 dims: [ 8 ] }, {"), r"input 'x' is TYPE_FP64"),
        (("max_batch_size: 64", "max_batch_size: 0"), r"max_batch_size is 0"),
        (
            ('name: "x" data_type: TYPE_FP32 dims: [ 8 ]', 'name: "x" data_type: TYPE_FP32 dims: [ -1, -1 ]'),
            "2 variable",
        ),
        (('name: "w" data_type: TYPE_FP32', 'name: "w" data_type: TYPE_STRING'), r"a text input is one TYPE_STRING"),
    ],
)
def test_what_the_engines_cannot_take_is_refused_at_load(change: tuple[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        spec_from_config(_config(GENERIC.replace(*change)))


def test_value_checks_come_from_the_parameters_and_must_name_token_inputs() -> None:
    cfg = VariantConfig(model="bert_tiny", variant="inflight").to_proto()
    cfg.parameters["mask_input"].string_value = "nope"
    with pytest.raises(ConfigError, match=r"mask_input='nope' must name an INT64 or INT32 input"):
        spec_from_config(cfg)
    cfg.parameters["mask_input"].string_value = "attention_mask"
    cfg.parameters["vocab_size"].string_value = "100"
    spec = spec_from_config(cfg)
    ids = np.full((1, 4), 150, np.int64)
    with pytest.raises(ValidationError, match=r"token id 150 is outside the vocabulary \[0, 100\)"):
        spec.check_values({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    with pytest.raises(ValidationError, match="attention_mask must contain only 0 and 1"):
        spec.check_values({"input_ids": ids * 0, "attention_mask": ids})


def test_a_text_model_round_trips_through_its_config() -> None:
    import dataclasses

    text_spec = dataclasses.replace(MODELS["bert_tiny"], text_input="text", max_seq_len=256)
    cfg = VariantConfig(model="enc", variant="inflight", model_spec=text_spec).to_proto()
    assert [(t.name, t.optional) for t in cfg.input] == [("input_ids", True), ("attention_mask", True), ("text", True)]
    assert cfg.parameters["tokenizer"].string_value == "tokenizer.json"
    spec = spec_from_config(cfg)
    assert (
        spec.text_input == "text"
        and spec.max_seq_len == 256
        and [t.name for t in spec.inputs]
        == [
            "input_ids",
            "attention_mask",
        ]
    )
    with pytest.raises(ValidationError, match=r"or 'text' \(BYTES"):
        spec.validate({"input_ids": np.ones((1, 3), np.int64)})
    back = variant_from_proto(cfg)
    assert back.model == "enc" and back.to_proto() == cfg
    trt = VariantConfig(model="enc", variant="trt", model_spec=text_spec).to_proto()
    assert [t.name for t in trt.input] == ["input_ids", "attention_mask"]  # TensorRT cannot tokenize


def _export(path: Path, module: object, args: tuple[object, ...]) -> None:
    import torch

    batch = torch.export.Dim("batch", min=1, max=64)
    dims = tuple({0: batch} for _ in args)
    torch.export.save(torch.export.export(module, args, dynamic_shapes=dims), str(path))  # type: ignore[arg-type]


def test_the_artifact_is_checked_against_the_config(tmp_path: Path) -> None:
    import torch

    from inflight.models.artifact import load_module

    class Score(torch.nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return (x * w).sum(-1, keepdim=True)

    pt2 = tmp_path / "model.pt2"
    _export(pt2, Score(), (torch.zeros(2, 8), torch.zeros(2, 8)))
    spec = spec_from_config(_config(GENERIC))
    module = load_module(pt2, spec=spec)
    assert module(torch.ones(3, 8), torch.ones(3, 8)).shape == (3, 1)
    one_input = spec_from_config(_config(GENERIC.replace(', { name: "w" data_type: TYPE_FP32 dims: [ 8 ] }', "")))
    with pytest.raises(ConfigError, match=r"takes 2 input\(s\) \['x', 'w'\]; the config gives 1"):
        load_module(pt2, spec=one_input)
    ints = spec_from_config(_config(GENERIC.replace('"w" data_type: TYPE_FP32', '"w" data_type: TYPE_INT64')))
    with pytest.raises(ConfigError, match=r"input 'w' is float32 of rank 2; config input 'w' is TYPE_INT64"):
        load_module(pt2, spec=ints)
    wide = spec_from_config(_config(GENERIC.replace("dims: [ 1 ] }", "dims: [ 4 ] }")))
    with pytest.raises(ConfigError, match=r"output 'score' has dims \[1\] per item; the config says \[4\]"):
        load_module(pt2, spec=wide)


class _Plan:
    """The four ICudaEngine calls check_plan_io makes (TensorRT is importable on no host here: see LIMITS)."""

    def __init__(self, tensors: list[tuple[str, str, str, tuple[int, ...]]]) -> None:
        self.tensors = tensors
        self.num_io_tensors = len(tensors)

    def get_tensor_name(self, i: int) -> str:
        return self.tensors[i][0]

    def _t(self, name: str) -> tuple[str, str, str, tuple[int, ...]]:
        return next(t for t in self.tensors if t[0] == name)

    def get_tensor_mode(self, name: str) -> str:
        return f"TensorIOMode.{self._t(name)[1]}"

    def get_tensor_dtype(self, name: str) -> str:
        return f"DataType.{self._t(name)[2]}"

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._t(name)[3]


def test_a_tensorrt_plans_tensors_are_checked_against_the_config() -> None:
    from inflight.runtime.engines.tensorrt_engine import check_plan_io

    spec = spec_from_config(VariantConfig(model="bert_tiny", variant="trt").to_proto())
    ok = [
        ("input_ids", "INPUT", "INT64", (-1, -1)),
        ("attention_mask", "INPUT", "INT64", (-1, -1)),
        ("cls", "OUTPUT", "FLOAT", (-1, 128)),
    ]
    check_plan_io(_Plan(ok), spec, Path("model.plan"))
    with pytest.raises(ConfigError, match=r"has tensors \['attention_mask', 'cls', 'input_ids', 'logits'\]"):
        check_plan_io(_Plan([*ok, ("logits", "OUTPUT", "FLOAT", (-1, 2))]), spec, Path("model.plan"))
    wrong = [("input_ids", "INPUT", "INT32", (-1, -1)), *ok[1:]]
    with pytest.raises(ConfigError, match=r"input 'input_ids' is int32 of rank 2; the config's input is TYPE_INT64"):
        check_plan_io(_Plan(wrong), spec, Path("model.plan"))
