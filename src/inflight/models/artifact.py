"""Loading a model's ``torch.export`` artifact: one path for the engines, the references and the load test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inflight.errors import EngineError


def load_module(artifact: Path, device: str = "cpu") -> Any:
    """Load a ``torch.export`` artifact (``.pt2``) as a module on ``device``.

    Exported graphs record the device and dtype they were traced with: devices in op arguments
    (moved with ``move_to_device_pass``) and ``_assert_tensor_metadata`` checks before ``.to()``
    calls, which would reject the same graph run on the GPU or in fp16. The checks are removed
    (they guard tracing assumptions, not results).

    Raises:
        EngineError: when the file is missing or not an exported program, saying how to build it.
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
