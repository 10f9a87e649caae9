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
* whether a defect seen with the inflight backend also happens without any of its code;
* with ``sender_threads`` N > 0, what the *deferred* response path costs by itself: ``execute()``
  reads the inputs, hands the batch to a completion thread and returns ``None``; that thread waits
  until the batch's stand-in device time has passed (batches queue one after another, as on one
  stream) and hands the requests' response senders to N threads, which each build a zeros response
  and ``send()`` it with ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``. That is every step a pipelined
  Python-backend executor cannot avoid, so its req/s bounds any executor built on response senders.

Deploy it like ``inflight`` (``backends/null/`` beside ``python/``; ``inflight serve`` does it) and
load ``<model>_null`` (``inflight build-models`` writes those configs). At unload each instance logs
its counters in the same ``finalized`` line format as the inflight backend, so the A/B reports put
them beside the inflight ones.
"""

from __future__ import annotations

import gc
import json
import os
import queue
import threading
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
        try:
            self.sender_threads = int(params.get("sender_threads") or 0)
        except ValueError:
            raise pb_utils.TritonModelException(
                f"{self.model}: parameter sender_threads={params.get('sender_threads')!r} is not an integer; "
                "give 0 (return the responses from execute) or the number of sender threads"
            ) from None
        if not 0 <= self.sender_threads <= 256:
            raise pb_utils.TritonModelException(f"{self.model}: sender_threads={self.sender_threads} must be 0..256")
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
            "send_call_s": 0.0,
            "send_errors": 0,
            "execute_max_ms": 0.0,
            "executes_over_10ms": 0,
        }
        # the stub's garbage-collector pauses (the inflight backend counts the same keys)
        self._gc_frozen = gc.get_freeze_count()
        self._gc_n = [0, 0, 0]
        self._gc_s = [0.0, 0.0, 0.0]
        self._gc_max_s = 0.0
        self._gc_t0 = 0.0
        gc.callbacks.append(self._gc_callback)
        self._t_last_exit = 0.0
        self._lock = threading.Lock()  # the senders' counters
        self._threads: list[threading.Thread] = []
        if self.sender_threads:
            self._device_free = 0.0  # when the stand-in device finishes the last batch handed to it
            self._batches: queue.SimpleQueue[tuple[float, list[Any], list[tuple[int, int]]] | None] = (
                queue.SimpleQueue()
            )
            self._chunks: queue.SimpleQueue[list[tuple[Any, int, int]] | None] = queue.SimpleQueue()
            self._threads.append(threading.Thread(target=self._complete, name="null-completion", daemon=True))
            self._threads += [
                threading.Thread(target=self._send, name=f"null-sender-{i}", daemon=True)
                for i in range(self.sender_threads)
            ]
            for t in self._threads:
                t.start()

    def _gc_callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
            return
        dt = time.perf_counter() - self._gc_t0
        gen = min(int(info.get("generation", 0)), 2)
        self._gc_n[gen] += 1
        self._gc_s[gen] += dt
        self._gc_max_s = max(self._gc_max_s, dt)

    def _zeros(self, n: int, seq: int) -> list[Any]:
        tensors = []
        for name, dtype, dims in self.outputs:
            shape = [n, *(seq if d < 0 else d for d in dims)]
            tensors.append(pb_utils.Tensor(name, np.zeros(shape, dtype=dtype)))
        return tensors

    def _complete(self) -> None:
        """Deferred mode: wait for each batch's stand-in device time, then share it among the senders."""
        while (job := self._batches.get()) is not None:
            done_at, senders, shapes = job
            wait = done_at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            n = self.sender_threads
            work = [(sender, k, seq) for sender, (k, seq) in zip(senders, shapes, strict=True)]
            for i in range(min(n, len(work))):
                self._chunks.put(work[i::n])
        for _ in range(self.sender_threads):
            self._chunks.put(None)

    def _send(self) -> None:
        """Deferred mode: build and send one final zeros response per request of a chunk."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        while (chunk := self._chunks.get()) is not None:
            build = send = 0.0
            errors = 0
            for sender, k, seq in chunk:
                t0 = time.perf_counter()
                response = pb_utils.InferenceResponse(output_tensors=self._zeros(k, seq))
                t1 = time.perf_counter()
                try:
                    sender.send(response, flags=final)
                except Exception:  # counted; the control model keeps serving
                    errors += 1
                t2 = time.perf_counter()
                build += t1 - t0
                send += t2 - t1
            with self._lock:
                self.stats["responses"] += len(chunk) - errors
                self.stats["send_errors"] += errors
                self.stats["build_s"] += build
                self.stats["send_call_s"] += send

    def execute(self, requests: list[Any]) -> list[Any] | None:
        """Read the inputs, sleep ``sleep_us`` once for the batch, answer zeros (or defer them)."""
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
        responses: list[Any] | None = None
        if self.sender_threads:
            # the responses go later, through the senders; the stand-in device runs batches one after another
            senders = [r.get_response_sender() for r in requests]
            self._device_free = max(t1, self._device_free) + self.sleep_s
            self._batches.put((self._device_free, senders, shapes))
        else:
            if self.sleep_s:
                time.sleep(self.sleep_s)
            t2 = time.perf_counter()
            responses = [pb_utils.InferenceResponse(output_tensors=self._zeros(n, seq)) for n, seq in shapes]
            s["responses"] += len(responses)
            s["device_wait_s"] += t2 - t1
            s["build_s"] += time.perf_counter() - t2
        # the senders only add to responses, send_errors, build_s and send_call_s, under the lock
        s["batches"] += 1
        s["executes"] += 1
        s["requests"] += len(requests)
        s["items"] += sum(n for n, _ in shapes)
        s["parse_s"] += t1 - t0
        self._t_last_exit = time.perf_counter()
        took = self._t_last_exit - t0
        s["execute_s"] += took
        s["execute_max_ms"] = max(s["execute_max_ms"], took * 1e3)
        if took > 0.010:
            s["executes_over_10ms"] += 1
        return responses

    def finalize(self) -> None:
        """Send what is still deferred, stop the threads, log the counters in inflight's ``finalized`` format."""
        state = "drained"
        if self._threads:
            self._batches.put(None)  # after every batch handed over: the completion thread drains them first
            deadline = time.monotonic() + 30
            for t in self._threads:
                t.join(max(0.0, deadline - time.monotonic()))
            if any(t.is_alive() for t in self._threads):
                state = "not drained: sender threads still running after 30 s"
        # the counts start as int 0 and only ever add ints, so they stay ints in the JSON
        if self._gc_callback in gc.callbacks:
            gc.callbacks.remove(self._gc_callback)
        record = {
            **self.stats,
            "gc_collections": sum(self._gc_n),
            "gc_gen2": self._gc_n[2],
            "gc_s": round(sum(self._gc_s), 6),
            "gc_gen2_s": round(self._gc_s[2], 6),
            "gc_max_ms": round(self._gc_max_s * 1e3, 3),
            "gc_frozen": self._gc_frozen,
            "pid": os.getpid(),
            "sleep_us": round(self.sleep_s * 1e6),
            "sender_threads": self.sender_threads,
        }
        pb_utils.Logger.log_info(f"[null] {self.model} ({self.instance}) finalized ({state}): {json.dumps(record)}")
