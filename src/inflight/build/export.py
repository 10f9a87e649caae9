"""A model's artifacts: the ``torch.export`` program and the ONNX file, with dynamic batch and sequence axes."""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from inflight.models.spec import ModelSpec


def export_torch(spec: ModelSpec, module: Any, path: Path) -> None:
    """Save ``module`` as a ``torch.export`` program with dynamic batch (and sequence) axes."""
    import torch

    args = _example_args(spec)
    dims = _dims(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(module, args, dynamic_shapes=dims)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(ep, str(path))


def export_onnx(spec: ModelSpec, module: Any, path: Path) -> None:
    """Save ``module`` as ONNX (torch's dynamo exporter) with the same dynamic axes."""
    import torch

    args = _example_args(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            args,
            dynamic_shapes=_dims(spec),
            input_names=[t.name for t in spec.inputs],
            output_names=[t.name for t in spec.outputs],
            dynamo=True,
            verbose=False,
        )
    assert program is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(path))
    _unclash_outputs(path)


def _unclash_outputs(path: Path) -> None:
    """Rename inner values that carry an output's name, so that the ONNX file loads.

    torch's exporter names ``aten.embedding``'s value ``embedding``; an output called ``embedding``
    then has two definitions, and onnxruntime and TensorRT refuse the file.
    """
    import onnx

    model = onnx.load(str(path))
    outputs = {o.name for o in model.graph.output}
    nodes = list(model.graph.node)
    last = {name: i for i, n in enumerate(nodes) for name in n.output if name in outputs}
    current: dict[str, str] = {}
    changed = False
    for i, n in enumerate(nodes):
        for k, name in enumerate(n.input):
            if name in current:
                n.input[k] = current[name]
        for k, name in enumerate(n.output):
            if name in outputs and last[name] != i:
                current[name] = n.output[k] = f"{name}__inner{i}"
                changed = True
            elif name in current:
                del current[name]
    if changed:
        for v in model.graph.value_info:
            if v.name in outputs:
                model.graph.value_info.remove(v)
        onnx.save(model, str(path))


def _example_args(spec: ModelSpec) -> tuple[Any, ...]:
    import torch

    x = spec.example_inputs(4, seq_len=16 if spec.variable_seq else None)
    return tuple(torch.from_numpy(x[t.name]) for t in spec.inputs)


def _dims(spec: ModelSpec) -> dict[str, dict[int, Any]]:
    import torch

    batch = torch.export.Dim("batch", min=1, max=spec.max_batch_size)
    seq = torch.export.Dim("seq", min=1, max=spec.max_seq_len or 512)
    return {
        name: {axis: batch if label == "batch" else seq for axis, label in axes.items()}
        for name, axes in spec.dynamic_shapes().items()
    }


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
