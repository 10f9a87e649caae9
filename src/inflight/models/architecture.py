"""What an encoder computes, as data: :class:`Architecture`, and the poolings of its output.

An artifact built from a user's checkpoint records its ``Architecture`` in ``model.json`` (key
``"architecture"``); the runtime rebuilds the module from it (:meth:`Architecture.make`) to run
unpadded launches, so :meth:`Architecture.to_json` and :meth:`Architecture.from_json` round-trip
exactly. The poolings themselves are :mod:`inflight.models.pooling`'s.

Importing this module does not import torch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from inflight.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from inflight.models.bert import BertShape

LOGGER = logging.getLogger(__name__)

#: Architectures :meth:`Architecture.make` can build.
KINDS: tuple[str, ...] = ("bert",)
#: Poolings of the last layer's token states: the first (CLS) token's, or the masked mean.
POOLINGS: tuple[str, ...] = ("cls", "mean")


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """An encoder's architecture: its kind, its sizes and how its output is pooled.

    Attributes:
        kind: ``"bert"``: :func:`inflight.models.bert.make_module`.
        shape: The encoder's sizes (layer-norm epsilon included).
        pooling: ``"cls"`` (the first token's final state) or ``"mean"`` (the masked mean of the
            last layer's token states).
        normalize: L2-normalize the pooled vector.
    """

    kind: str = "bert"
    shape: BertShape
    pooling: str = "cls"
    normalize: bool = False

    def __post_init__(self) -> None:
        """Refuse a kind or pooling :meth:`make` cannot build.

        Raises:
            ConfigError: naming the field and the values supported.
        """
        if self.kind not in KINDS:
            raise ConfigError(f"architecture kind={self.kind!r} is not supported; use one of {list(KINDS)}")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"architecture pooling={self.pooling!r} is not supported; use one of {list(POOLINGS)}")

    def token_flops(self) -> int:
        """The GEMM FLOPs of one token through every layer (QKV, output projection, both feed-forward GEMMs)."""
        h, f = self.shape.hidden, self.shape.ffn
        return 2 * self.shape.layers * (4 * h * h + 2 * h * f)

    def to_json(self) -> dict[str, Any]:
        """The architecture as JSON-serializable data (what :meth:`from_json` reads back)."""
        return {
            "kind": self.kind,
            "shape": dataclasses.asdict(self.shape),
            "pooling": self.pooling,
            "normalize": self.normalize,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Architecture:
        """Read what :meth:`to_json` wrote.

        Args:
            d: ``{"kind", "shape": {every BertShape field}, "pooling", "normalize"}``.

        Raises:
            ConfigError: naming the key that is missing, unknown or of the wrong type.
        """
        from inflight.models.bert import BertShape

        where = "model.json 'architecture'"
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where} must be an object, got {type(d).__name__}; rebuild the artifact")
        unknown = sorted(set(d) - {"kind", "shape", "pooling", "normalize"})
        if unknown:
            raise ConfigError(
                f"{where} has unknown key(s) {unknown}; expected kind, shape, pooling, normalize (rebuild the "
                "artifact with this version of inflight)"
            )
        kind = d.get("kind", "bert")
        if kind not in KINDS:
            raise ConfigError(f"{where} key 'kind' is {kind!r}; supported: {list(KINDS)}")
        pooling = d.get("pooling", "cls")
        if pooling not in POOLINGS:
            raise ConfigError(f"{where} key 'pooling' is {pooling!r}; supported: {list(POOLINGS)}")
        normalize = d.get("normalize", False)
        if not isinstance(normalize, bool):
            raise ConfigError(f"{where} key 'normalize' is {normalize!r}; use true or false")
        raw = d.get("shape")
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where} key 'shape' is {raw!r}; it must be an object of {_shape_fields()}")
        fields = {f.name: f for f in dataclasses.fields(BertShape)}
        missing = [name for name in fields if name not in raw]
        if missing:
            raise ConfigError(f"{where} 'shape' lacks key(s) {missing}; it needs every one of {list(fields)}")
        extra = sorted(set(raw) - set(fields))
        if extra:
            raise ConfigError(f"{where} 'shape' has unknown key(s) {extra}; expected {list(fields)}")
        values: dict[str, Any] = {}
        for name in fields:
            v = raw[name]
            if name == "eps":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                    raise ConfigError(f"{where} 'shape' key 'eps' is {v!r}; use a positive number")
                values[name] = float(v)
            else:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ConfigError(f"{where} 'shape' key {name!r} is {v!r}; use a positive integer")
                values[name] = v
        if values["hidden"] % values["heads"]:
            raise ConfigError(
                f"{where} 'shape': hidden={values['hidden']} does not divide by heads={values['heads']}; "
                "rebuild the artifact from a valid checkpoint"
            )
        return cls(kind=kind, shape=BertShape(**values), pooling=pooling, normalize=normalize)

    def make(self, seed: int = 0, **options: Any) -> torch.nn.Module:
        """Build the module (fp32, CPU, eval mode, weights from ``seed``; load a checkpoint's over them).

        Args:
            seed: Weight seed.
            **options: Further :func:`inflight.models.bert.make_module` options (``kernels``,
                ``attention``, ``cls_only``...).
        """
        from inflight.models.bert import make_module

        pooling = cast("Literal['cls', 'mean']", self.pooling)
        return make_module(seed, shape=self.shape, pooling=pooling, normalize=self.normalize, **options)


def _shape_fields() -> list[str]:
    from inflight.models.bert import BertShape

    return [f.name for f in dataclasses.fields(BertShape)]


def token_cost_scale(architecture: Architecture | None) -> float:
    """How many of this encoder's padded tokens cost what one of bert-tiny's does (1.0 without an architecture).

    The fixed costs of a launch (a graph replay and its copies; an unpadded launch's unpadding and
    pooling) were measured on bert-tiny in its padded tokens (``GPU_LAUNCH_COST_TOKENS``,
    ``UNPAD_COST_TOKENS``); they take about the same time for any encoder while a token costs its
    GEMM FLOPs, so for a heavier encoder they are that many fewer of its tokens.
    """
    if architecture is None:
        return 1.0
    from inflight.models.bert import TINY

    return Architecture(shape=TINY).token_flops() / architecture.token_flops()
