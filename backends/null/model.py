"""Triton entry point of the ``null`` Python-based backend: Triton's request path with no model.

A control for measurements, not part of the inflight execution model, and on purpose it imports
nothing of the ``inflight`` package. Per batch it does what any Python-backend model must do and
nothing more: it reads every request's inputs, sleeps ``sleep_us`` with the GIL released (as a
backend waiting for its GPU would), and returns one response per request with zeros in the
output shapes of the model config. So it measures

* what one instance of Triton's Python backend can serve at all (``sleep_us`` 0: no device work,
  the ceiling of any Python-backend instance, pipelined or not);
* what a stock-style loop costs when its only work besides the request path is a device wait of a
  known length (``sleep_us`` = the engine's time per batch);
* whether a defect seen with the inflight backend also happens without any of its code.

Deploy it like ``inflight`` (``backends/null/`` beside ``python/``; ``inflight serve`` does it) and
load ``<model>_null`` (``inflight build-models`` writes those configs). At unload each instance logs
its counters in the same ``finalized`` line format as the inflight backend, so the A/B reports put
them beside the inflight ones.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """One instance of the null model."""

    def initialize(self, args: dict[str, str]) -> None:
        """Read the output shapes and ``sleep_us`` from the model config."""
        cfg = json.loads(args["model_config"])
        self.model = str(cfg.get("name", args.get("model_name", "?")))
        self.instance = args.get("model_instance_name", "?")
        self.inputs = [str(i["name"]) for i in cfg.get("input", [])]
        self.outputs: list[tuple[str, Any, list[int]]] = [
            (str(o["name"]), pb_utils.triton_string_to_numpy(o["data_type"]), [int(d) for d in o.get("dims", [])])
            for o in cfg.get("output", [])
        ]
        params = {k: v.get("string_value", "") for k, v in (cfg.get("parameters") or {}).items()}
        try:
            sleep_us = int(params.get("sleep_us") or 0)
        except ValueError:
            raise pb_utils.TritonModelException(
                f"{self.model}: parameter sleep_us={params.get('sleep_us')!r} is not an integer; "
                "give microseconds to sleep per batch, e.g. 1900"
            ) from None
        if sleep_us < 0:
            raise pb_utils.TritonModelException(f"{self.model}: sleep_us={sleep_us} must be >= 0")
        self.sleep_s = sleep_us / 1e6
        self.stats: dict[str, float] = {
            "batches": 0,
            "requests": 0,
            "items": 0,
            "responses": 0,
            "executes": 0,
            "execute_s": 0.0,
            "between_executes_s": 0.0,
            "parse_s": 0.0,
            "device_wait_s": 0.0,
            "build_s": 0.0,
        }
        self._t_last_exit = 0.0

    def _zeros(self, n: int, seq: int) -> list[Any]:
        tensors = []
        for name, dtype, dims in self.outputs:
            shape = [n, *(seq if d < 0 else d for d in dims)]
            tensors.append(pb_utils.Tensor(name, np.zeros(shape, dtype=dtype)))
        return tensors

    def execute(self, requests: list[Any]) -> list[Any]:
        """Read the inputs, sleep ``sleep_us`` once for the batch, answer zeros."""
        t0 = time.perf_counter()
        s = self.stats
        if self._t_last_exit:
            s["between_executes_s"] += t0 - self._t_last_exit
        shapes: list[tuple[int, int]] = []
        for r in requests:
            n, seq = 1, 1
            for name in self.inputs:
                t = pb_utils.get_input_tensor_by_name(r, name)
                if t is None:
                    continue
                a = t.as_numpy()
                n = int(a.shape[0]) if a.ndim else 1
                seq = int(a.shape[1]) if a.ndim > 1 else 1
            shapes.append((n, seq))
        t1 = time.perf_counter()
        if self.sleep_s:
            time.sleep(self.sleep_s)
        t2 = time.perf_counter()
        responses = [pb_utils.InferenceResponse(output_tensors=self._zeros(n, seq)) for n, seq in shapes]
        t3 = time.perf_counter()
        s["batches"] += 1
        s["executes"] += 1
        s["requests"] += len(requests)
        s["responses"] += len(responses)
        s["items"] += sum(n for n, _ in shapes)
        s["parse_s"] += t1 - t0
        s["device_wait_s"] += t2 - t1
        s["build_s"] += t3 - t2
        self._t_last_exit = time.perf_counter()
        s["execute_s"] += self._t_last_exit - t0
        return responses

    def finalize(self) -> None:
        """Log the counters in the inflight backend's ``finalized`` line format."""
        # the counts start as int 0 and only ever add ints, so they stay ints in the JSON
        record = {**self.stats, "pid": os.getpid(), "sleep_us": round(self.sleep_s * 1e6)}
        pb_utils.Logger.log_info(f"[null] {self.model} ({self.instance}) finalized (drained): {json.dumps(record)}")
