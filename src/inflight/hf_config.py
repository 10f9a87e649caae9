"""What a Hugging Face checkpoint folder's JSON files say: the BERT shape, the pooling, the longest sequence.

Part of :mod:`inflight.hf_import`: ``config.json`` (with transformers' ``BertConfig`` defaults for
the keys it leaves out), sentence-transformers' ``modules.json``, ``1_Pooling/config.json`` and
``sentence_bert_config.json``. Whatever the engine cannot compute faithfully is refused with a
:class:`CheckpointError` that names the key, the value found, what is supported and what to do.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inflight.models.bert import BertShape
from inflight.tool_errors import CheckpointError

if TYPE_CHECKING:
    pass


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
