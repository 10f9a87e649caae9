"""What Triton hands an instance, read against its model's spec.

At load: the model the Triton model name serves (:func:`resolve_spec`) and whether the config's
tensors are that model's (:func:`check_tensors`). Per request: its input arrays
(:class:`RequestReader`, the ``read`` of ``inflight.runtime.modes.Answering``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inflight.errors import ConfigError
from inflight.models.registry import get_model
from inflight.models.spec import ModelSpec


def resolve_spec(model_name: str) -> ModelSpec:
    """The registry entry for the Triton model ``model_name`` (a variant name such as ``bert_tiny_sync``).

    Raises:
        ConfigError: when the model is unknown.
    """
    try:
        return get_model(model_name)
    except KeyError as e:
        raise ConfigError(
            f"{e.args[0]}; name the model <model>_inflight or <model>_sync (or <model>_inflight_<tag>)"
        ) from None


def check_tensors(spec: ModelSpec, config: Any) -> None:
    """Check that every input and output of the model config (``ModelConfig``) is a tensor of ``spec``.

    Raises:
        ConfigError: naming the first tensor that is not, and how to fix it.
    """
    want = {t.name for t in (*spec.inputs, *spec.outputs)}
    for t in (*config.input, *config.output):
        if t.name not in want:
            raise ConfigError(
                f"config tensor {t.name!r} is not a tensor of model {spec.name!r} "
                f"(it has {sorted(want)}); regenerate the config with `inflight build-models`"
            )


class RequestReader:
    """Reads one request's inputs and checks their shapes and types (their values: ``partition_values``, per batch).

    Args:
        pb_utils: The ``triton_python_backend_utils`` module.
        spec: The model.
        max_batch: The most items a request may hold.
    """

    def __init__(self, pb_utils: Any, spec: ModelSpec, max_batch: int) -> None:
        self.pb = pb_utils
        self.spec = spec
        self.max_batch = max_batch

    def __call__(self, request: Any) -> tuple[dict[str, np.ndarray], int, int | None]:
        """The request's arrays by input name, its item count and its sequence length (None: fixed shapes).

        Raises:
            ValidationError: with a message that says what is wrong and how to fix it.
        """
        inputs: dict[str, np.ndarray] = {}
        for t in self.spec.inputs:
            tensor = self.pb.get_input_tensor_by_name(request, t.name)
            if tensor is not None:
                inputs[t.name] = tensor.as_numpy()
        count = self.spec.validate(inputs, max_batch_size=self.max_batch, check_values=False)
        seq = None
        if self.spec.variable_seq:
            seq = int(inputs[self.spec.inputs[0].name].shape[1])
        return inputs, count, seq
