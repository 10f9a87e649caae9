"""The model repository's config.pbtxt files, sized for the server's cores and GPUs, and tagged variants."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

from inflight.build.export import _link_or_copy
from inflight.errors import ConfigError
from inflight.model_config import BackendParameters
from inflight.models.spec import ModelSpec
from inflight.sizing import batcher_delay_us, measure_instance_memory
from inflight.variants import (
    VARIANTS,
    BatchingConfig,
    VariantConfig,
    inflight_deployment,
)


def write_configs(
    repository: Path,
    spec: ModelSpec,
    *,
    batching: BatchingConfig | None = None,
    params: BackendParameters | None = None,
    server_cpus: int | None = None,
    gpus: int | None = None,
) -> list[Path]:
    """Write every variant's config.pbtxt (and empty version folders), the null control model's included.

    Args:
        repository: The model repository.
        spec: The model.
        batching: Batching and instances of every variant but ``<model>_inflight``.
        params: Backend parameters of ``_inflight`` and ``_sync``.
        server_cpus: Cores the server will get: ``<model>_inflight`` is written by
            :func:`inflight.variants.inflight_deployment` for them, and for the GPU's free memory
            (:mod:`inflight.sizing`, measured here when a GPU is visible; the same launch's time
            sets its batcher's delay, :func:`inflight.sizing.batcher_delay_us`). None: the cores this
            process may run on.
        gpus: GPUs the server will see (the cores are split among them). None: :func:`visible_gpus`.
    """
    batching = batching or BatchingConfig()
    params = params or BackendParameters(warmup_seq_len=spec.default_seq_len or 64)
    gpus = visible_gpus() if gpus is None else gpus
    memory = None
    if gpus:
        from inflight.runtime.assembly import seq_buckets_for

        seqs = seq_buckets_for(spec, params)
        memory = measure_instance_memory(
            spec,
            spec.max_batch_size,
            seqs[-1] if seqs else None,
            params.graph_memory_mb,
            typical_seq=params.warmup_seq_len,
        )
    instances, deployed = inflight_deployment(server_cpus or default_server_cpus(), params, gpus, memory)
    # the batcher may wait as long as a full batch of the typical length takes on the GPU (never less than asked)
    delay = max(batching.max_queue_delay_us, batcher_delay_us(memory))
    sized = dataclasses.replace(batching, instances=instances, max_queue_delay_us=delay)
    out = []
    for variant in VARIANTS:
        inflight = variant == "inflight"
        vc = VariantConfig(
            model=spec.name,
            variant=variant,
            batching=sized if inflight else batching,
            params=deployed if inflight else params,
            model_spec=spec,
        )
        d = vc.write(repository)
        (d / "1" / ".gitkeep").touch()
        out.append(d)
    return out


def add_variant(repository: Path, spec: str, tag: str) -> Path:
    """Write a tagged copy of a built variant with overrides, to serve beside the original.

    ``add_variant(repo, "bert_tiny_inflight@mode=auto,slots=4", "auto")`` writes
    ``bert_tiny_inflight_auto/config.pbtxt`` (the original's config with the overrides) and links
    the original's artifacts into its version folder: two modes of one model in one server.

    Args:
        repository: A model repository written by ``build_models``.
        spec: ``<variant name>@key=value,...`` (see ``variants.apply_overrides``).
        tag: Appended to the variant's name (letters, digits, ``_`` and ``-``).

    Returns:
        The new model folder.

    Raises:
        ConfigError: for a bad tag, a variant that is not built, or a bad override.
    """
    from inflight.variants import apply_overrides, parse_pbtxt, parse_variant_arg, variant_from_proto

    if not tag or not all(c.isalnum() or c in "_-" for c in tag):
        raise ConfigError(f"tag {tag!r}: use letters, digits, '_' and '-'")
    name, overrides = parse_variant_arg(spec)
    src = repository / name
    if not (src / "config.pbtxt").is_file():
        raise ConfigError(f"{src / 'config.pbtxt'} not found; run `inflight build-models` first")
    vc = variant_from_proto(parse_pbtxt((src / "config.pbtxt").read_text()))
    vc = apply_overrides(vc, {**overrides, "name": f"{name}_{tag}"})
    d = vc.write(repository)
    for f in (src / "1").iterdir():
        if f.is_file():
            _link_or_copy(f, d / "1" / f.name)
    return d


def visible_gpus() -> int:
    """GPUs a server started from here would see: ``CUDA_VISIBLE_DEVICES`` when set, else ``nvidia-smi -L``'s count.

    0 where neither names any (no driver: the instances run on the CPU).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def default_server_cpus() -> int:
    """The cores this process may run on: what ``<model>_inflight`` is written for when none are given."""
    return len(os.sched_getaffinity(0))
