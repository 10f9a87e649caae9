"""The plan of ``--server-per-gpu``: one server per GPU, what each is shown as and its share of the cores.

Part of :mod:`~inflight.loadtest.runner.fleet`, which starts the servers these plans describe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inflight.errors import ConfigError
from inflight.loadtest import openloop as ol
from inflight.loadtest.runner.config import gpu_list


@dataclass(frozen=True, kw_only=True)
class GpuServerPlan:
    """One of the servers of ``--server-per-gpu``: its GPU, what it is shown as, and its cores.

    Attributes:
        gpu: The GPU index as listed (among the GPUs this run sees).
        visible_device: The server's ``CUDA_VISIBLE_DEVICES`` (the GPU's entry in the inherited one).
        cpus: Its cores (empty: not pinned).
    """

    gpu: int
    visible_device: str
    cpus: tuple[int, ...]

    @property
    def log_name(self) -> str:
        """File name of its log next to the results."""
        return f"tritonserver-gpu{self.gpu}.log"


def visible_device(gpu: int, inherited: str | None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` that shows a server GPU ``gpu`` of this run alone.

    GPU indices count the GPUs this run sees: without an inherited ``CUDA_VISIBLE_DEVICES`` that is
    ``str(gpu)``; with one (a lane of a shared host, ``2,3``) it is that list's ``gpu``-th entry.

    Raises:
        ConfigError: when the inherited list shows fewer GPUs.
    """
    if inherited is None:
        return str(gpu)
    shown = [x.strip() for x in inherited.split(",") if x.strip()]
    if gpu >= len(shown):
        raise ConfigError(
            f"--server-per-gpu: GPU {gpu} is not visible to this run: CUDA_VISIBLE_DEVICES={inherited!r} shows "
            f"{len(shown)} GPU{'s' if len(shown) != 1 else ''} (indices 0..{len(shown) - 1}); list GPUs among them or "
            "unset CUDA_VISIBLE_DEVICES"
        )
    return shown[gpu]


def plan_gpu_servers(gpus: Sequence[int], server_cpus: Sequence[int], inherited: str | None) -> list[GpuServerPlan]:
    """One server per GPU of ``gpus``, each on its contiguous share of ``server_cpus`` (see ``share_cpus``).

    Raises:
        ConfigError: for no GPU, a negative or repeated index, a GPU the inherited
            ``CUDA_VISIBLE_DEVICES`` does not show, or more servers than server cores.
    """
    if not gpus:
        raise ConfigError("--server-per-gpu names no GPU; list one or more, e.g. 0,1")
    bad = [g for g in gpus if g < 0]
    if bad:
        raise ConfigError(f"--server-per-gpu {gpu_list(gpus)}: {bad[0]} is not a GPU index (0, 1, ...)")
    twice = sorted({g for g in gpus if list(gpus).count(g) > 1})
    if twice:
        raise ConfigError(
            f"--server-per-gpu {gpu_list(gpus)}: GPU {', '.join(map(str, twice))} listed more than once; list each "
            "GPU once (one server per GPU)"
        )
    try:
        shares = ol.share_cpus(server_cpus, len(gpus))
    except ConfigError as e:
        raise ConfigError(f"--server-per-gpu {gpu_list(gpus)}: {e}") from None
    return [
        GpuServerPlan(gpu=g, visible_device=visible_device(g, inherited), cpus=cpus)
        for g, cpus in zip(gpus, shares, strict=True)
    ]
