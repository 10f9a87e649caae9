"""Triton entry point of the ``inflight`` Python-based backend.

A thin adapter, as in PyTriton's proxy: parse nothing here, hand every call to
``inflight.runtime.triton_model.InflightModel``, and turn our errors into
``TritonModelException`` so the server log says what to fix. Deploy by copying this folder to
``<backend-directory>/inflight/`` and installing the ``inflight`` package into the Python
environment the stub uses (``inflight serve`` does both).
"""

from __future__ import annotations

from typing import Any

import triton_python_backend_utils as pb_utils

try:
    from inflight.errors import InflightError
    from inflight.runtime.triton_model import InflightModel
except ImportError as e:  # the stub's Python cannot see the package
    raise pb_utils.TritonModelException(
        f"cannot import the inflight package ({e}); install it into the Python environment the Triton stub "
        "uses (the first python3 on PATH): `pip install inflight` there, or start the server with `inflight serve`"
    ) from None


class TritonPythonModel:
    """Triton's model interface; each instance owns one ``InflightModel``."""

    def initialize(self, args: dict[str, str]) -> None:
        """Build the engine, slots and threads for this instance."""
        try:
            self._model = InflightModel(args, pb_utils)
        except InflightError as e:
            raise pb_utils.TritonModelException(f"{args.get('model_name', '?')}: {e}") from None

    def execute(self, requests: list[Any]) -> list[Any] | None:
        """Sync mode returns the responses; pipelined mode returns None once the batch is enqueued."""
        return self._model.execute(requests)

    def finalize(self) -> None:
        """Drain or fail in-flight batches and release every resource."""
        model = getattr(self, "_model", None)
        if model is not None:
            model.finalize()
