"""The models this project serves: their architecture, tensor specs and input validation."""

from inflight.models.registry import MODELS, get_model
from inflight.models.spec import ModelSpec, TensorSpec

__all__ = ["MODELS", "ModelSpec", "TensorSpec", "get_model"]
