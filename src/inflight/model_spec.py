"""A model is what its config.pbtxt and its artifact say: the ``ModelSpec`` the backend serves, built from them.

Triton's stock backends read a model's tensors from config.pbtxt; so does this one. The config's
``input``/``output`` give names, datatypes and dims, ``max_batch_size`` the largest batch, and the
model's own ``parameters`` (``inflight.model_config.ModelParameters``) the value checks a type
cannot state (token range, mask, longest sequence) and the tokenizer of a text input. The artifact
is then checked against the result at load (``inflight.models.artifact``). What cannot be served
(an output of a variable dimension, a datatype without a numpy buffer, two variable dimensions in
one input) is refused here, at load, with what to change; nothing chooses a path by the model's name.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from inflight.errors import ConfigError
from inflight.model_config import ModelParameters, parameters_of
from inflight.models.spec import TRITON_TYPES, ModelSpec, TensorSpec

LOGGER = logging.getLogger(__name__)

#: config.pbtxt's ``TYPE_*`` name -> numpy dtype name, for the tensors the engines take.
NUMPY_TYPES: dict[str, str] = {v: k for k, v in TRITON_TYPES.items()}
#: The datatype of a text input (one UTF-8 string per item, tokenized in the backend).
TEXT_TYPE = "TYPE_STRING"


def _tensor(t: Any, model: str, role: str) -> TensorSpec:
    """One config tensor as a ``TensorSpec``; refuses what the engines cannot take."""
    type_name = mc.DataType.Name(t.data_type)
    dims = tuple(int(d) for d in t.dims)
    if t.reshape.shape:
        raise ConfigError(
            f"{model}: {role} {t.name!r} has a reshape; the inflight backend takes tensors as the config states "
            "them: remove `reshape` and give the artifact's own dims"
        )
    if type_name not in NUMPY_TYPES:
        raise ConfigError(
            f"{model}: {role} {t.name!r} is {type_name}; the inflight backend serves "
            f"{sorted(NUMPY_TYPES)} tensors (and one {TEXT_TYPE} input with a tokenizer): change its data_type"
        )
    if any(d == 0 or d < -1 for d in dims):
        raise ConfigError(f"{model}: {role} {t.name!r} has dims {list(dims)}; use positive sizes or -1")
    if role == "output" and -1 in dims:
        raise ConfigError(
            f"{model}: output {t.name!r} has a variable dimension (dims {list(dims)}); the backend's slots hold "
            "outputs of a fixed size per item: pool or cut the output to fixed dims in the model"
        )
    if dims.count(-1) > 1:
        raise ConfigError(
            f"{model}: input {t.name!r} has {dims.count(-1)} variable dimensions (dims {list(dims)}); the backend "
            "pads one (the sequence): fix the others in the config"
        )
    return TensorSpec(name=t.name, dtype=NUMPY_TYPES[type_name], dims=dims)


def architecture_of(version_dir: Path | None, params: ModelParameters) -> dict[str, Any] | None:
    """The ``architecture`` entry of the JSON file beside the artifact (``ModelParameters.architecture``), if any."""
    if version_dir is None or not params.architecture:
        return None
    path = version_dir / params.architecture
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not readable JSON ({e}); rebuild the model or remove the file") from None
    arch = meta.get("architecture") if isinstance(meta, dict) else None
    return arch if isinstance(arch, dict) else None


def spec_from_config(cfg: mc.ModelConfig, *, version_dir: Path | None = None) -> ModelSpec:
    """The model a config (and the architecture file in ``version_dir``, when there is one) describes.

    Args:
        cfg: The parsed config (Triton's ``args["model_config"]`` or a config.pbtxt).
        version_dir: The model's version folder: where ``ModelParameters.architecture`` is read
            (an encoder the engine can also run unpadded). None: not read.

    Raises:
        ConfigError: naming the tensor or parameter that cannot be served and how to fix it.
    """
    name = cfg.name or "model"
    mp = ModelParameters.from_parameters(parameters_of(cfg))
    if cfg.max_batch_size < 1:
        raise ConfigError(
            f"{name}: max_batch_size is {cfg.max_batch_size}; the inflight backend batches requests: set "
            "max_batch_size >= 1 (the first dimension of every tensor is then the batch)"
        )
    texts = [t for t in cfg.input if mc.DataType.Name(t.data_type) == TEXT_TYPE]
    inputs = tuple(_tensor(t, name, "input") for t in cfg.input if t not in texts)
    outputs = tuple(_tensor(t, name, "output") for t in cfg.output)
    if not inputs or not outputs:
        raise ConfigError(f"{name}: the config needs at least one (non-text) input and one output")
    names = {t.name for t in inputs}
    text_input = None
    if texts:
        t = texts[0]
        if len(texts) > 1 or list(t.dims) != [1] or not mp.tokenizer:
            raise ConfigError(
                f"{name}: a text input is one {TEXT_TYPE} input of dims [1] with the parameter `tokenizer` (a "
                f"tokenizer.json in the version folder); found {[x.name for x in texts]} with dims "
                f"{[list(x.dims) for x in texts]}, tokenizer={mp.tokenizer!r}"
            )
        if names != {mp.token_input, mp.mask_input} or not mp.vocab_size:
            raise ConfigError(
                f"{name}: text input {t.name!r} is tokenized into token_input={mp.token_input!r} and "
                f"mask_input={mp.mask_input!r}, which must be the config's other inputs (it has {sorted(names)}), "
                "and needs vocab_size"
            )
        text_input = t.name
    dtypes = {t.name: t.dtype for t in inputs}
    declared = {"token_input": mp.vocab_size > 0, "mask_input": bool(mp.mask_input)}  # the checks the config asks for
    for key, checked in declared.items():
        value = getattr(mp, key)
        if checked and dtypes.get(value) not in ("int64", "int32"):
            raise ConfigError(
                f"{name}: parameter {key}={value!r} must name an INT64 or INT32 input of the config (inputs: "
                f"{sorted(names)})"
            )
    variable = [t for t in inputs if t.variable]
    seq_input = mp.token_input if mp.token_input in {t.name for t in variable} else None
    if variable and seq_input is None:
        seq_input = variable[0].name
    arch = architecture_of(version_dir, mp)
    make_module = None
    extra: dict[str, Any] = {}
    if arch is not None:
        from inflight.models.architecture import Architecture

        architecture = Architecture.from_json(arch)  # refuses a kind it cannot build
        make_module = architecture.make
        extra["architecture"] = architecture
    max_seq = mp.max_seq_len or None
    return ModelSpec(
        name=name,
        description=f"{name} (from its config)",
        inputs=inputs,
        outputs=outputs,
        max_batch_size=int(cfg.max_batch_size),
        make_module=make_module,
        default_seq_len=min(64, max_seq) if max_seq else (64 if variable else None),
        max_seq_len=max_seq,
        vocab_size=mp.vocab_size or None,
        token_input=mp.token_input if mp.vocab_size else None,
        seq_input=seq_input,
        mask_input=mp.mask_input or None,
        unpadded=make_module is not None and bool(mp.mask_input),
        text_input=text_input,
        extra=extra,
    )
