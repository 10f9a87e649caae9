"""A Hugging Face BERT checkpoint's weights under ``make_module``'s parameter names.

Part of :mod:`inflight.hf_import`: the tensors are read from ``model.safetensors`` (single or
sharded; a ``pytorch_model.bin`` pickle only when allowed), renamed to the engine's parameters
(query, key and value fused into ``qkv``), converted to fp32 and checked against the shapes the
module expects.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inflight.hf_config import _read_json
from inflight.models.bert import BertShape
from inflight.tool_errors import CheckpointError

if TYPE_CHECKING:
    import torch


LOGGER = logging.getLogger(__name__)

_LAYER = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)")

_EMBEDDINGS = {
    "embeddings.word_embeddings": "word",
    "embeddings.position_embeddings": "position",
    "embeddings.token_type_embeddings": "token_type",
    "embeddings.LayerNorm": "ln",
}

_LAYER_PARTS = {
    "attention.output.dense": "attn_out",
    "attention.output.LayerNorm": "ln1",
    "intermediate.dense": "ffn_in",
    "output.dense": "ffn_out",
    "output.LayerNorm": "ln2",
}

_QKV = ("query", "key", "value")

#: Tensors of a checkpoint the engine does not use: the pooler (BertModel's tanh head over CLS, not
#: what sentence-transformers or last_hidden_state compute), the position-ids buffer.
_DROPPED = ("pooler.", "embeddings.position_ids")


def expected_shapes(shape: BertShape) -> dict[str, tuple[int, ...]]:
    """Every parameter of ``make_module(shape=shape)`` and its shape."""
    h, f = shape.hidden, shape.ffn
    out: dict[str, tuple[int, ...]] = {
        "word.weight": (shape.vocab, h),
        "position.weight": (shape.positions, h),
        "token_type.weight": (shape.token_types, h),
        "ln.weight": (h,),
        "ln.bias": (h,),
    }
    for i in range(shape.layers):
        p = f"layers.{i}."
        out |= {
            p + "qkv.weight": (3 * h, h),
            p + "qkv.bias": (3 * h,),
            p + "attn_out.weight": (h, h),
            p + "attn_out.bias": (h,),
            p + "ln1.weight": (h,),
            p + "ln1.bias": (h,),
            p + "ffn_in.weight": (f, h),
            p + "ffn_in.bias": (f,),
            p + "ffn_out.weight": (h, f),
            p + "ffn_out.bias": (h,),
            p + "ln2.weight": (h,),
            p + "ln2.bias": (h,),
        }
    return out


def _read_weights(model_dir: Path, allow_pickle: bool, files: list[Path], source: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's tensors by their own names (safetensors, sharded safetensors or, if allowed, a pickle)."""
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    pickle = model_dir / "pytorch_model.bin"
    if single.is_file() or index.is_file():
        from safetensors.torch import load_file

        if single.is_file():
            shards = [single]
        else:
            weight_map = _read_json(index, files).get("weight_map", {})
            shards = [model_dir / name for name in sorted(set(weight_map.values()))]
        out: dict[str, Any] = {}
        for shard in shards:
            try:
                out.update(load_file(str(shard), device="cpu"))
            except Exception as e:  # any failure to read is the file's fault
                raise CheckpointError(f"cannot read {shard}: {e}; restore the file from the checkpoint's source") from e
            files.append(shard)
        source["weights"] = [s.name for s in shards]
        return out
    if pickle.is_file():
        if not allow_pickle:
            raise CheckpointError(
                f"{pickle} is a pickle, and unpickling runs code the file carries; the folder has no "
                "model.safetensors. Pass --allow-pickle (allow_pickle=True) if you trust the file, or convert it "
                "to model.safetensors"
            )
        import torch

        LOGGER.warning("reading %s, a pickle (allow_pickle=True)", pickle)
        try:
            sd = torch.load(pickle, map_location="cpu", weights_only=False)
        except Exception as e:  # any failure to read is the file's fault
            raise CheckpointError(f"cannot read {pickle}: {e}; restore the file from the checkpoint's source") from e
        if not isinstance(sd, Mapping):
            raise CheckpointError(
                f"{pickle} holds a {type(sd).__name__}, not a state dict; save the model's state_dict"
            )
        files.append(pickle)
        source["weights"] = [pickle.name]
        return dict(sd)
    raise CheckpointError(
        f"{model_dir} has no model.safetensors (nor model.safetensors.index.json or pytorch_model.bin); found "
        f"{sorted(p.name for p in model_dir.iterdir())}. Save the weights with save_pretrained(..., "
        "safe_serialization=True)"
    )


def _rename(raw: Mapping[str, Any], shape: BertShape, source: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under ``make_module``'s names, fp32, checked against ``shape``."""
    import torch

    prefixed = any(k.startswith("bert.") for k in raw)
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    qkv: dict[tuple[int, str, str], torch.Tensor] = {}
    dropped: list[str] = []
    extra: list[str] = []
    for key, tensor in raw.items():
        if not isinstance(tensor, torch.Tensor):
            extra.append(key)
            continue
        name = key
        if prefixed:
            if not key.startswith("bert."):
                # BertForPreTraining / BertForMaskedLM keep their MLM and NSP heads beside the encoder
                (dropped if key.startswith("cls.") else extra).append(key)
                continue
            name = key[len("bert.") :]
        if name.startswith(_DROPPED):
            dropped.append(key)
            continue
        t = tensor.detach().to(dtype=torch.float32, device="cpu")
        param = name.rsplit(".", 1)[-1]
        param = {"gamma": "weight", "beta": "bias"}.get(param, param)
        stem = name.rsplit(".", 1)[0]
        if stem in _EMBEDDINGS and (param in ("weight", "bias")):
            target = f"{_EMBEDDINGS[stem]}.{param}"
        else:
            m = _LAYER.fullmatch(name)
            if m is None:
                extra.append(key)
                continue
            layer, part = int(m.group(1)), m.group(2)
            if part.startswith("attention.self.") and part.split(".")[-1] in _QKV and param in ("weight", "bias"):
                qkv[(layer, part.split(".")[-1], param)] = t
                continue
            if part not in _LAYER_PARTS:
                extra.append(key)
                continue
            target = f"layers.{layer}.{_LAYER_PARTS[part]}.{param}"
        if target in out:
            raise CheckpointError(f"the checkpoint holds {origin[target]!r} and {key!r}, both {target}; keep one")
        out[target] = t
        origin[target] = key
    pre = "bert." if prefixed else ""
    layers = sorted({layer for layer, _, _ in qkv})
    for layer in layers:
        for param in ("weight", "bias"):
            parts = [qkv.get((layer, which, param)) for which in _QKV]
            absent = [
                f"{pre}encoder.layer.{layer}.attention.self.{w}.{param}" for w in _QKV if (layer, w, param) not in qkv
            ]
            if absent:
                raise CheckpointError(
                    f"the checkpoint lacks {absent}: every layer needs its query, key and value; re-save the "
                    "checkpoint with save_pretrained"
                )
            target = f"layers.{layer}.qkv.{param}"
            out[target] = torch.cat([p for p in parts if p is not None], 0)
            origin[target] = f"{pre}encoder.layer.{layer}.attention.self.{{query,key,value}}.{param}"
    want = expected_shapes(shape)
    extra += sorted(origin[k] for k in out if k not in want)
    if extra:
        raise CheckpointError(
            f"the checkpoint holds tensor(s) a BERT encoder of its config.json has no place for: {sorted(extra)[:8]}"
            f"{' ...' if len(extra) > 8 else ''}; the importer serves plain BERT encoders (BertModel, or "
            "BertForMaskedLM/BertForPreTraining whose heads are dropped): remove them or check config.json's "
            "num_hidden_layers"
        )
    missing = [k for k in want if k not in out]
    if missing:
        raise CheckpointError(
            f"the checkpoint lacks {len(missing)} tensor(s) the encoder needs, first {missing[:8]} "
            "(make_module names: word, position, token_type, ln, layers.N.{qkv, attn_out, ln1, ffn_in, ffn_out, "
            "ln2}); re-save the full model with save_pretrained"
        )
    for k, expect in want.items():
        if tuple(out[k].shape) != expect:
            raise CheckpointError(
                f"tensor {origin[k]!r} has shape {list(out[k].shape)} but config.json implies {list(expect)}; "
                "the config and the weights disagree: use the config.json saved with these weights"
            )
    if dropped:
        source["dropped"] = sorted(dropped)
    return {k: out[k].contiguous() for k in want}
