"""The models this project serves: their architecture, tensor specs and input validation."""

from inflight.models.registry import MODELS, ModelSpec, TensorSpec, get_model

__all__ = ["MODELS", "ModelSpec", "TensorSpec", "get_model"]
