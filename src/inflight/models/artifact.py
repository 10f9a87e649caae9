"""Loading a model's ``torch.export`` artifact: one path for the engines, the references and the load test."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from inflight.errors import ConfigError, EngineError

if TYPE_CHECKING:
    from inflight.models.spec import ModelSpec


def load_module(artifact: Path, device: str = "cpu", spec: ModelSpec | None = None) -> Any:
    """Load a ``torch.export`` artifact (``.pt2``) as a module on ``device``.

    Exported graphs record the device and dtype they were traced with: devices in op arguments
    (moved with ``move_to_device_pass``) and ``_assert_tensor_metadata`` checks before ``.to()``
    calls, which would reject the same graph run on the GPU or in fp16. The checks are removed
    (they guard tracing assumptions, not results).

    Args:
        artifact: The ``.pt2`` file.
        device: Where the module runs.
        spec: The model its config describes: the program's inputs and outputs are checked against it
            (:func:`check_program`).

    Raises:
        EngineError: when the file is missing or not an exported program, saying how to build it.
        ConfigError: when the program's signature is not the config's.
    """
    import torch

    import inflight.models.kernels  # noqa: F401  (registers the fused operators an artifact may call)

    if not artifact.is_file():
        raise EngineError(
            f"Torch artifact {artifact} not found; build it with `inflight build-models` (it writes "
            "<model>_inflight/1/model.pt2) or set the `artifact` parameter"
        )
    try:
        ep = torch.export.load(str(artifact))
    except Exception as e:
        raise EngineError(f"{artifact} is not a loadable torch.export program ({type(e).__name__}: {e})") from None
    if spec is not None:
        check_program(ep, spec, artifact)
    if device != "cpu":
        from torch.export.passes import move_to_device_pass

        ep = move_to_device_pass(ep, device)
    gm = ep.module()
    assert_op = torch.ops.aten._assert_tensor_metadata.default
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is assert_op:
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


def _dtype_name(val: Any) -> str:
    """Numpy's name of a traced value's dtype (``torch.float32`` -> ``float32``)."""
    return str(getattr(val, "dtype", "?")).removeprefix("torch.")


def check_program(ep: Any, spec: ModelSpec, artifact: Path) -> None:
    """Check an exported program's inputs and outputs against the model's config (``spec``).

    The program's user inputs must be the config's (non-text) inputs in order, with their datatype
    and rank (batch first); it must have as many outputs as the config, each of the config's rank.
    Floating-point outputs may be of any float type (the engine writes them as the config's type).

    Raises:
        ConfigError: naming the first mismatch and the two ways to fix it.
    """
    fix = "make the config's input/output list match the program's signature, or export the program to match"
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    user = list(ep.graph_signature.user_inputs)
    if len(user) != len(spec.inputs):
        raise ConfigError(
            f"{artifact} takes {len(user)} input(s) {user}; the config gives {len(spec.inputs)} "
            f"{[t.name for t in spec.inputs]}: {fix}"
        )
    for name, t in zip(user, spec.inputs, strict=True):
        val = placeholders[name].meta.get("val") if name in placeholders else None
        if val is None:
            continue
        if _dtype_name(val) != t.dtype or val.dim() != len(t.dims) + 1:
            raise ConfigError(
                f"{artifact}: input {name!r} is {_dtype_name(val)} of rank {val.dim()}; config input {t.name!r} is "
                f"{t.triton_type} [batch, {', '.join(map(str, t.dims))}] (rank {len(t.dims) + 1}): {fix}"
            )
    out = next((n for n in reversed(ep.graph.nodes) if n.op == "output"), None)
    values = out.args[0] if out is not None else ()
    values = values if isinstance(values, (tuple, list)) else (values,)
    if len(values) != len(spec.outputs):
        raise ConfigError(
            f"{artifact} returns {len(values)} output(s); the config gives {len(spec.outputs)} "
            f"{[t.name for t in spec.outputs]}: {fix}"
        )
    for node, t in zip(values, spec.outputs, strict=True):
        val = getattr(node, "meta", {}).get("val")
        if val is None:
            continue
        same_kind = val.is_floating_point() == (t.dtype in ("float32", "float16"))
        if val.dim() != len(t.dims) + 1 or not same_kind:
            dims = ", ".join(map(str, t.dims))
            raise ConfigError(
                f"{artifact}: output {spec.outputs.index(t)} is {_dtype_name(val)} of rank {val.dim()}; config "
                f"output {t.name!r} is {t.triton_type} [batch, {dims}]: {fix}"
            )
        fixed = [int(d) for d in val.shape[1:] if isinstance(d, int) or str(d).isdigit()]
        if len(fixed) == len(t.dims) and fixed != list(t.dims):
            raise ConfigError(
                f"{artifact}: output {t.name!r} has dims {fixed} per item; the config says {list(t.dims)}: {fix}"
            )
