"""``inflight ab NAME_text``: an ensemble resolves to its encoder (the spec's keys) and its other steps, in order."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from inflight.errors import ConfigError
from inflight.loadtest.runner.config import resolve_variants
from inflight.server import ensemble as ens
from inflight.variants import VariantConfig, write_config


def _repository(tmp_path: Path, *, encoder: str = "bert_tiny_inflight") -> Path:
    """An ensemble ``demo_text``: ``demo_tokenizer`` (2 CPU instances), then ``encoder``."""
    write_config(tmp_path, VariantConfig(model="bert_tiny", variant="inflight").to_proto())
    write_config(tmp_path, VariantConfig(model="bert_tiny", variant="null").to_proto())
    tok = mc.ModelConfig(name="demo_tokenizer", backend="tokenizer", max_batch_size=8)
    tok.instance_group.add(count=2, kind=mc.ModelInstanceGroup.KIND_CPU)
    write_config(tmp_path, tok)
    e = mc.ModelConfig(name="demo_text", platform="ensemble", max_batch_size=8)
    e.ensemble_scheduling.step.add(model_name="demo_tokenizer", model_version=-1)
    step = e.ensemble_scheduling.step.add(model_name=encoder, model_version=-1)
    for key in ("input_ids", "attention_mask"):
        step.input_map[key] = f"_{key}"
    step.output_map["cls"] = "cls"
    write_config(tmp_path, e)
    return tmp_path


def test_the_spec_keys_go_to_the_encoder_and_tokenizer_instances_to_the_tokenizer(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    (v,) = resolve_variants(["demo_text@instances=3,delay_us=700,tokenizer_instances=5"], repo)
    assert v.name == "demo_text" and v.config.model_name == "bert_tiny_inflight"
    assert v.config.batching.instances == 3 and v.config.batching.max_queue_delay_us == 700
    assert v.ensemble is not None
    (name, cfg), (last, _) = v.ensemble.after_encoder()
    assert name == "demo_tokenizer" and json.loads(cfg)["instance_group"] == [{"count": 5, "kind": "KIND_CPU"}]
    assert last == "demo_text"
    assert ens.unload_order(v.config, v.ensemble) == ["demo_text", "demo_tokenizer", "bert_tiny_inflight"]
    # without the key the tokenizer keeps what its config says
    (w,) = resolve_variants(["demo_text"], repo)
    assert w.ensemble is not None and json.loads(w.ensemble.steps[0][1])["instance_group"][0]["count"] == 2
    # a model that is not an ensemble loads alone, as before
    (plain,) = resolve_variants(["bert_tiny_inflight"], repo)
    assert plain.ensemble is None and ens.unload_order(plain.config, None) == ["bert_tiny_inflight"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("demo_text@tokenizer_instances=0", "tokenizer_instances='0': give a positive number"),
        ("demo_text@tokenizer_instances=two", "tokenizer_instances='two': give a positive number"),
        ("demo_text@name=other", "name= would serve the encoder under another name"),
        ("demo_text@bogus=1", "bogus"),
        ("demo_text@encoder=absent_null", "encoder='absent_null' has no config.pbtxt"),
        ("demo_text@encoder=demo_tokenizer", "encoder='demo_tokenizer' is an ensemble or a tokenizer"),
        ("demo_text@encoder=demo_text", "encoder='demo_text' is an ensemble or a tokenizer"),
        ("bert_tiny_inflight@encoder=bert_tiny_null", "replaces an ensemble's encoder step; bert_tiny_inflight is not"),
        ("demo_text@encoder=odd", "encoder='odd' must have the input 'input_ids' of type TYPE_INT64"),
        ("demo_text@encoder=odd_out", "encoder='odd_out' must have the output 'cls' of type TYPE_FP32"),
    ],
)
def test_bad_keys_say_what_to_change(tmp_path: Path, spec: str, message: str) -> None:
    repo = _repository(tmp_path)
    odd = mc.ModelConfig(name="odd", backend="python", max_batch_size=8)  # takes none of the encoder's inputs
    odd.input.add(name="x", data_type=mc.TYPE_FP32, dims=[-1])
    write_config(repo, odd)
    odd_out = mc.ModelConfig(name="odd_out", backend="python", max_batch_size=8)  # the inputs, another output type
    for key in ("input_ids", "attention_mask"):
        odd_out.input.add(name=key, data_type=mc.TYPE_INT64, dims=[-1])
    odd_out.output.add(name="cls", data_type=mc.TYPE_FP16, dims=[128])
    write_config(repo, odd_out)
    with pytest.raises(ConfigError, match=re.escape(message) if "encoder='odd" in message else message):
        resolve_variants([spec], repo)


def test_encoder_puts_another_model_in_the_encoder_steps_place_with_the_specs_keys(tmp_path: Path) -> None:
    """``NAME_text@encoder=NAME_null``: the text path's own bound (the tokenizer and the ensemble, no GPU work)."""
    (v,) = resolve_variants(
        ["demo_text@encoder=bert_tiny_null,instances=2,tokenizer_instances=3"], _repository(tmp_path)
    )
    assert v.name == "demo_text" and v.config.model_name == "bert_tiny_null" and v.config.batching.instances == 2
    assert v.ensemble is not None
    (tok, tok_cfg), (last, cfg) = v.ensemble.after_encoder()
    assert tok == "demo_tokenizer" and json.loads(tok_cfg)["instance_group"][0]["count"] == 3
    steps = [s["model_name"] for s in json.loads(cfg)["ensemble_scheduling"]["step"]]
    assert last == "demo_text" and steps == ["demo_tokenizer", "bert_tiny_null"]
    assert v.ensemble.step_models() == steps  # the models whose statistics each window records, in order
    assert ens.unload_order(v.config, v.ensemble) == ["demo_text", "demo_tokenizer", "bert_tiny_null"]
    # the repository's own ensemble still names its encoder
    (w,) = resolve_variants(["demo_text"], tmp_path)
    assert w.config.model_name == "bert_tiny_inflight"


def test_the_stand_in_runs_the_encoders_instance_count_unless_told(tmp_path: Path) -> None:
    """One null instance in place of eight encoders measured the null model, not the text path (H200, 2026-11-29)."""
    repo = _repository(tmp_path)
    encoder = VariantConfig(model="bert_tiny", variant="inflight").to_proto()
    encoder.instance_group[0].count = 6
    write_config(repo, encoder)
    assert VariantConfig(model="bert_tiny", variant="null").to_proto().instance_group[0].count == 1
    (v,) = resolve_variants(["demo_text@encoder=bert_tiny_null"], repo)
    assert v.config.model_name == "bert_tiny_null" and v.config.batching.instances == 6
    (w,) = resolve_variants(["demo_text@encoder=bert_tiny_null,instances=2"], repo)
    assert w.config.batching.instances == 2


def test_a_step_missing_from_the_repository_is_named(tmp_path: Path) -> None:
    repo = _repository(tmp_path, encoder="absent_inflight")
    with pytest.raises(ConfigError, match=re.escape("step 'absent_inflight' has no config.pbtxt")):
        ens.resolve(repo, "demo_text", {})


def test_serve_loads_an_ensembles_steps_then_the_ensemble_and_a_model_alone(tmp_path: Path) -> None:
    """``inflight serve -m NAME@...`` loads what :func:`ens.load_plan` says, in its order."""
    repo = _repository(tmp_path)
    plan = ens.load_plan(repo, "demo_text@instances=2,tokenizer_instances=3")
    assert [name for name, _ in plan] == ["bert_tiny_inflight", "demo_tokenizer", "demo_text"]
    encoder, tokenizer, _ = (json.loads(c) for _, c in plan)
    assert encoder["instance_group"][0]["count"] == 2 and tokenizer["instance_group"][0]["count"] == 3
    (alone,) = ens.load_plan(repo, "bert_tiny_inflight@instances=5")
    assert alone[0] == "bert_tiny_inflight" and json.loads(alone[1])["instance_group"][0]["count"] == 5


def test_resolving_a_model_that_is_not_an_ensemble_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="bert_tiny_inflight is not an ensemble"):
        ens.resolve(_repository(tmp_path), "bert_tiny_inflight", {})
