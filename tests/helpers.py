"""Test doubles shared by several test modules."""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from inflight.models.spec import WIRE_TYPES, ModelSpec, TensorSpec

#: A toy model for the executor and mode tests on the CPU runner: ``x`` int64 [seq] -> ``y`` float32 [2].
TOY_SPEC = ModelSpec(
    name="toy",
    description="row sums",
    inputs=(TensorSpec(name="x", dtype="int64", dims=(-1,)),),
    outputs=(TensorSpec(name="y", dtype="float32", dims=(2,)),),
    max_batch_size=64,
    make_module=lambda seed: None,  # type: ignore[arg-type,return-value]
    max_seq_len=16,
    seq_input="x",
)


def ab_command(
    *args: str,
    repository: Path,
    out: Path,
    window: int,
    warmup: int = 1,
    items: int = 4,
    seq_len: int = 16,
    processes: int = 1,
) -> list[str]:
    """``inflight ab`` as the integration tests run it: small requests, short windows, this interpreter.

    Args:
        *args: The variants and any further options (``--rate``, ``--preset``, ``--check``...).
        repository: The model repository.
        out: The folder for the run's JSON and report.
        window: Seconds of each measured window.
        warmup: Seconds of warm-up before each window.
        items: Items per request (few, so that the 2-core host keeps up).
        seq_len: Tokens per item.
        processes: Locust (or generator) processes; 0 runs Locust in the runner's own process.
    """
    return [
        sys.executable,
        "-m",
        "inflight.loadtest.cli",
        "ab",
        *args,
        "--window",
        str(window),
        "--warmup",
        str(warmup),
        "--items",
        str(items),
        "--seq-len",
        str(seq_len),
        "--processes",
        str(processes),
        "--repository",
        str(repository),
        "--out",
        str(out),
    ]


def http_inputs(inputs: Mapping[str, np.ndarray]) -> list[Any]:
    """tritonclient HTTP inputs (binary tensor data) for ``inputs``."""
    import tritonclient.http as httpclient

    out = []
    for name, a in inputs.items():
        i = httpclient.InferInput(name, list(a.shape), WIRE_TYPES[a.dtype.name])
        i.set_data_from_numpy(a, binary_data=True)
        out.append(i)
    return out


def gpu_memory_mib(gpu: int = 0) -> tuple[int, int]:
    """GPU ``gpu``'s memory used and total, MiB (``nvidia-smi``)."""
    import subprocess

    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits", "-i", str(gpu)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    used, total = out.strip().splitlines()[0].split(",")
    return int(used), int(total)


def grpc_inputs(inputs: Mapping[str, np.ndarray]) -> list[Any]:
    """tritonclient gRPC inputs for ``inputs``."""
    import tritonclient.grpc as grpcclient

    out = []
    for name, a in inputs.items():
        i = grpcclient.InferInput(name, list(a.shape), WIRE_TYPES[a.dtype.name])
        i.set_data_from_numpy(a)
        out.append(i)
    return out


class Collect:
    """A response sink that keeps a copy of every response and fails on a second one per request."""

    def __init__(self) -> None:
        self.got: dict[int, tuple[dict[str, np.ndarray] | None, str | None]] = {}
        self.cond = threading.Condition()

    def send(self, handle: Any, outputs: Mapping[str, np.ndarray] | None, error: str | None) -> None:
        copy = None if outputs is None else {k: v.copy() for k, v in outputs.items()}
        with self.cond:
            assert handle not in self.got, "two responses for one request"
            self.got[handle] = (copy, error)
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = 120) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.got) >= n, timeout), f"{len(self.got)}/{n} responses"


def infer_or_message(http_url: str, model: str, inputs: Mapping[str, np.ndarray], output: str) -> np.ndarray | str:
    """One HTTP inference: the output's array, or the server's error message when the request failed."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    with httpclient.InferenceServerClient(http_url) as c:
        try:
            return c.infer(model, http_inputs(inputs)).as_numpy(output)
        except InferenceServerException as e:
            return e.message()


def in_band(executor: Any, batch: Any) -> list[dict[str, np.ndarray]]:
    """Run ``batch`` through an in-band executor's ``run`` into a ``Collect`` sink; each request's outputs, in order.

    Fails the test when any request got an error.
    """
    sink = Collect()
    executor.run(batch, sink)
    outs = []
    for item in batch.items:
        got, error = sink.got[item.handle]
        assert error is None and got is not None, error
        outs.append(got)
    return outs
