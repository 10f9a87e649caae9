"""Model registry: every model this project serves, by name.

Each model module defines its :class:`~inflight.models.spec.ModelSpec`; this module lists them and
resolves variant names (``bert_tiny_sync``, ``bert_tiny_inflight_auto``) to their model.
"""

from __future__ import annotations

import dataclasses

from inflight.models import bert, heads
from inflight.models.architecture import Architecture
from inflight.models.spec import ModelSpec


def _build_registry() -> dict[str, ModelSpec]:
    # bert-tiny's architecture goes into its model.json: the engine rebuilds the module from it for unpadded launches
    tiny = dataclasses.replace(bert.SPEC, extra={**bert.SPEC.extra, "architecture": Architecture(shape=bert.TINY)})
    specs = [tiny, bert.SMALL_SPEC, heads.LINEAR_SPEC, heads.STACKED_SPEC, heads.SEQLEN_SPEC]
    return {s.name: s for s in specs}


MODELS: dict[str, ModelSpec] = _build_registry()


def get_model(name: str) -> ModelSpec:
    """The model called ``name``.

    ``name`` is a base name, a variant name such as ``bert_tiny_sync``, or a variant name with a
    tag of the deployer's (``bert_tiny_inflight_auto``: several configurations of one variant
    side by side in one repository).
    """
    if name in MODELS:
        return MODELS[name]
    for suffix in ("_inflight", "_sync", "_trt", "_null", "_plain"):
        if name.endswith(suffix) and name[: -len(suffix)] in MODELS:
            return MODELS[name[: -len(suffix)]]
        base, sep, tag = name.partition(suffix + "_")
        if sep and tag and base in MODELS:
            return MODELS[base]
    raise KeyError(f"unknown model {name!r}; known models: {sorted(MODELS)}")
