"""The model repository's config.pbtxt files, sized for the server's cores and GPUs, and tagged variants."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
from pathlib import Path

from inflight.build.export import _link_or_copy
from inflight.errors import ConfigError
from inflight.model_config import BackendParameters
from inflight.models.spec import ModelSpec
from inflight.sizing import InstanceMemory, batcher_delay_us, measure_instance_memory
from inflight.variants import (
    DEFAULT_MAX_BATCH_SIZE,
    VARIANTS,
    BatchingConfig,
    VariantConfig,
    inflight_deployment,
)

LOGGER = logging.getLogger(__name__)


#: The larger batches (sequences) an import tries before ``DEFAULT_MAX_BATCH_SIZE``, largest first
#: (:func:`import_batch_size`).
LARGER_BATCHES = (2048, 1024)


def probe(spec: ModelSpec, params: BackendParameters, gpus: int) -> InstanceMemory | None:
    """What one instance of ``spec`` at its ``max_batch_size`` holds on the GPU (None without one).

    The largest launch is ``max_batch_size`` sequences of the longest token bucket; the full batch is
    timed at ``params.warmup_seq_len`` (:func:`inflight.sizing.measure_instance_memory`).
    """
    if not gpus:
        return None
    from inflight.runtime.assembly import seq_buckets_for

    seqs = seq_buckets_for(spec, params)
    return measure_instance_memory(
        spec,
        spec.max_batch_size,
        seqs[-1] if seqs else None,
        params.graph_memory_mb,
        typical_seq=params.warmup_seq_len,
    )


def import_batch_size(
    spec: ModelSpec, params: BackendParameters, server_cpus: int, gpus: int
) -> tuple[int, InstanceMemory | None]:
    """The largest batch in :data:`LARGER_BATCHES` at which one instance a core still fits the GPU's memory.

    Larger launches serve a GPU-bound encoder better: on one H200, all-MiniLM-L6-v2 at 2,048-sequence
    batches held 6,050 req/s (87.8% of its engine bound) and one instance 1.67x one sync instance, against
    1.14x at 512 (issue 53, docs/LAB.md). They cost GPU memory (one MiniLM instance at 2,048: 11,150 MiB
    against 6,541 at 512) and, through :func:`inflight.sizing.batcher_delay_us`, a longer batcher delay. The
    rule keeps what the cores give (one instance a core, :func:`inflight.variants.inflight_deployment`) and
    takes the largest batch that leaves it whole. By the rule's arithmetic an H100's ~79 GB free hold six
    MiniLM instances at 2,048 and eight at 1,024, so eight cores get 1,024 there (not measured). Without a GPU
    (or no module to run) nothing is measured: ``DEFAULT_MAX_BATCH_SIZE``.

    Args:
        spec: The model (its ``max_batch_size`` is not read).
        params: The backend parameters the instances will run with.
        server_cpus: Cores the server will get.
        gpus: GPUs the server will see.

    Returns:
        ``max_batch_size`` for the configs, and one instance at it as :func:`probe` measured it (None where
        nothing was measured at that batch: pass it to :func:`write_configs`, which then measures).
    """
    if not gpus:
        return DEFAULT_MAX_BATCH_SIZE, None
    cores_give = inflight_deployment(server_cpus, params, gpus, None)[0]
    for batch in LARGER_BATCHES:
        try:
            memory = probe(dataclasses.replace(spec, max_batch_size=batch), params, gpus)
            if memory is None:  # no torch with CUDA here, or no module to build: nothing measured
                return DEFAULT_MAX_BATCH_SIZE, None
            fit = inflight_deployment(server_cpus, params, gpus, memory)[0]
        except ConfigError:  # not even one instance at this batch
            continue
        if fit >= cores_give:
            LOGGER.info("%s: max_batch_size %d (%d instance(s) of it fit the GPU)", spec.name, batch, fit)
            return batch, memory
    LOGGER.info("%s: max_batch_size %d (larger ones fit fewer instances than cores)", spec.name, DEFAULT_MAX_BATCH_SIZE)
    return DEFAULT_MAX_BATCH_SIZE, None


def write_configs(
    repository: Path,
    spec: ModelSpec,
    *,
    batching: BatchingConfig | None = None,
    params: BackendParameters | None = None,
    server_cpus: int | None = None,
    gpus: int | None = None,
    memory: InstanceMemory | None = None,
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
        memory: One instance of ``spec`` as :func:`probe` already measured it for these ``params`` and ``gpus``
            (:func:`import_batch_size` gives it). None: measured here.
    """
    batching = batching or BatchingConfig()
    params = params or BackendParameters(warmup_seq_len=spec.default_seq_len or 64)
    gpus = visible_gpus() if gpus is None else gpus
    if memory is None:
        memory = probe(spec, params, gpus)
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
