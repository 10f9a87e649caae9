"""``inflight build-models``: the built-in models' configs and artifacts, rebuilt when stale."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inflight.build.checkpoint import SHIPPED, import_checkpoint, shipped_checkpoint
from inflight.build.configs import write_configs
from inflight.build.export import _link_or_copy, _sha256, export_onnx, export_torch
from inflight.errors import ConfigError
from inflight.model_config import BackendParameters
from inflight.models.registry import MODELS
from inflight.variants import (
    VARIANTS,
    BatchingConfig,
    Kind,
)

LOGGER = logging.getLogger(__name__)


def build_model(
    repository: Path,
    name: str,
    *,
    seed: int = 0,
    onnx: bool = True,
    batching: BatchingConfig | None = None,
    params: BackendParameters | None = None,
    configs_only: bool = False,
    server_cpus: int | None = None,
    gpus: int | None = None,
) -> dict[str, Any]:
    """Build one model's configs and artifacts; return a summary.

    ``server_cpus``, ``gpus``: see :func:`write_configs`.

    Raises:
        ConfigError: for an unknown model name.
    """
    if name not in MODELS:
        raise ConfigError(
            f"unknown model {name!r}; choose from {sorted([*MODELS, *SHIPPED])}, or import your own checkpoint "
            "with `inflight import-hf DIR --name NAME`"
        )
    spec = MODELS[name]
    t0 = time.perf_counter()
    write_configs(repository, spec, batching=batching, params=params, server_cpus=server_cpus, gpus=gpus)
    summary: dict[str, Any] = {"model": name, "configs": [f"{name}_{v}" for v in VARIANTS]}
    if configs_only:
        return summary
    module = spec.build_module(seed)
    pt2 = repository / f"{name}_inflight" / "1" / "model.pt2"
    export_torch(spec, module, pt2)
    _link_or_copy(pt2, repository / f"{name}_sync" / "1" / "model.pt2")
    summary["torch_artifact"] = str(pt2)
    meta = {
        "model": name,
        "source": source_digest(),
        "seed": seed,
        "parameters": int(sum(p.numel() for p in module.parameters())),
        "sha256": _sha256(pt2),
    }
    # the usual deployment's artifact: the reference build (plain PyTorch operators, the whole last layer)
    export_torch(
        spec, spec.build_module(seed, **spec.reference_options), repository / f"{name}_plain" / "1" / "model.pt2"
    )
    if onnx:
        path = repository / f"{name}_trt" / "1" / "model.onnx"
        # the same weights without the fused operators, which ONNX cannot express
        export_onnx(spec, spec.build_module(seed, **spec.portable_options), path)
        summary["onnx"] = str(path)
        meta["onnx_sha256"] = _sha256(path)
    if spec.unpadded and "architecture" in spec.extra:  # the engine rebuilds it for unpadded launches
        meta["architecture"] = spec.extra["architecture"].to_json()
    (pt2.parent / "model.json").write_text(json.dumps(meta, indent=2) + "\n")
    _link_or_copy(pt2.parent / "model.json", repository / f"{name}_sync" / "1" / "model.json")
    summary.update(meta)
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    LOGGER.info("built %s in %.1f s", name, summary["seconds"])
    return summary


def build_models(
    repository: Path,
    models: Sequence[str] | None = None,
    *,
    kind: Kind = "auto",
    instances: int = 1,
    seed: int = 0,
    onnx: bool = True,
    configs_only: bool = False,
    server_cpus: int | None = None,
    gpus: int | None = None,
) -> list[dict[str, Any]]:
    """Build several models (all by default): ``instances`` for each variant but ``_inflight`` (one per core).

    ``server_cpus``, ``gpus``: see :func:`write_configs`.
    """
    batching = BatchingConfig(kind=kind, instances=instances)
    names = list(models) if models else list(MODELS)
    out = []
    for n in names:
        if n in SHIPPED:
            path = shipped_checkpoint(n)
            out.append(
                import_checkpoint(
                    repository, path, n, onnx=onnx, server_cpus=server_cpus, gpus=gpus, configs_only=configs_only
                )
            )
            continue
        out.append(
            build_model(
                repository,
                n,
                seed=seed,
                onnx=onnx,
                batching=batching,
                params=BackendParameters(warmup_seq_len=MODELS[n].default_seq_len or 64) if n in MODELS else None,
                configs_only=configs_only,
                server_cpus=server_cpus,
                gpus=gpus,
            )
        )
    return out


def source_digest() -> str:
    """Digest of the model definitions; artifacts built from other sources are stale."""
    from inflight import models

    h = hashlib.sha256()
    for f in sorted(Path(models.__file__).parent.glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def artifacts_current(repository: Path, name: str, *, seed: int = 0, onnx: bool = False) -> bool:
    """True when ``name``'s artifacts exist and were built from the current model sources and ``seed``."""
    meta_path = repository / f"{name}_inflight" / "1" / "model.json"
    if not all((repository / f"{name}_{v}" / "1" / "model.pt2").is_file() for v in ("inflight", "sync", "plain")):
        return False
    if onnx and not (repository / f"{name}_trt" / "1" / "model.onnx").is_file():
        return False
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return False
    return bool(meta.get("source") == source_digest() and meta.get("seed") == seed)


def ensure_built(
    repository: Path,
    names: Sequence[str] | None = None,
    *,
    seed: int = 0,
    onnx: bool = False,
    server_cpus: int | None = None,
) -> list[str]:
    """Build the models (all by default) whose artifacts are missing or stale; return those built.

    See ``artifacts_current``: a model counts as current when its artifacts exist and were built
    from the current model sources and ``seed``. Every model's configs are written again either way
    (``server_cpus``: see :func:`write_configs`).
    """
    built = []
    for name in names or list(MODELS):
        if name in SHIPPED:
            if not (repository / f"{name}_inflight" / "1" / "model.pt2").is_file():
                import_checkpoint(repository, shipped_checkpoint(name), name, onnx=onnx, server_cpus=server_cpus)
                built.append(name)
            continue
        if not artifacts_current(repository, name, seed=seed, onnx=onnx):
            build_model(repository, name, seed=seed, onnx=onnx, server_cpus=server_cpus)
            built.append(name)
        else:  # the configs are cheap and follow the generator (a new variant, another deployment rule)
            write_configs(repository, MODELS[name], server_cpus=server_cpus)
    return built
