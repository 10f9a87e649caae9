"""The plain Python object behind ``backends/inflight/model.py``.

It parses ``args["model_config"]`` once, builds the engine, the runner and the executor, and
turns Triton requests into batches:

* **sync** mode returns the batch's responses from ``execute()`` after waiting for the device
  (the stock-equivalent baseline);
* **pipelined** mode returns ``None`` as soon as the batch is enqueued; each request later gets
  exactly one response (``TRITONSERVER_RESPONSE_COMPLETE_FINAL``) through its response sender,
  from the executor's sender threads. The default transaction policy is kept, so plain HTTP and
  gRPC clients work (decoupled models would be refused by them);
* **overlap** mode runs the batch in chunks overlapped on the GPU and returns every response
  (the sync mode's one message per batch); **auto** mode does the same but may defer a batch's
  last chunk, returning ``None`` for its requests and answering them through their response
  senders (the Python backend accepts a list that mixes responses and ``None``).

Requests are validated before anything is enqueued; a bad request gets its own error response
and the rest of its batch runs normally.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inflight.errors import ConfigError, ShuttingDownError, ValidationError
from inflight.log import gpu_metrics_provider, install_stack_dump, route_to_triton
from inflight.model_config import BackendParameters, parameters_of, proto_from_json
from inflight.models.registry import get_model
from inflight.models.spec import ModelSpec
from inflight.runtime.assembly import assemble, capture_at_load
from inflight.runtime.batch import Batch, Item
from inflight.runtime.executor import AutoPolicy, OverlapExecutor, PipelinedExecutor, SyncExecutor
from inflight.runtime.gcwatch import GcWatch

LOGGER = logging.getLogger(__name__)

#: Seconds between two log lines about rejected requests of one reason (each line is a round trip).
REJECT_LOG_INTERVAL_S = 10.0


class TritonSink:
    """Sends one final response per request through its ``InferenceResponseSender``."""

    def __init__(self, pb_utils: Any) -> None:
        self.pb = pb_utils
        self.final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        self._lock = threading.Lock()
        self.build_s = 0.0
        self.call_s = 0.0

    def response(self, outputs: Mapping[str, np.ndarray] | None, error: str | None, code: Any = None) -> Any:
        """Build an ``InferenceResponse`` with outputs or an error."""
        pb = self.pb
        if error is not None:
            err = pb.TritonError(error) if code is None else pb.TritonError(error, code)
            return pb.InferenceResponse(output_tensors=[], error=err)
        assert outputs is not None
        return pb.InferenceResponse(output_tensors=[pb.Tensor(name, a) for name, a in outputs.items()])

    def send(self, handle: Any, outputs: Mapping[str, np.ndarray] | None, error: str | None) -> None:
        """Send the final response for the request whose sender is ``handle``.

        The time spent building the response object and inside ``send()`` are added to
        ``build_s`` and ``call_s`` (diagnostics in the finalize log).
        """
        t0 = time.perf_counter()
        response = self.response(outputs, error)
        t1 = time.perf_counter()
        handle.send(response, flags=self.final)
        t2 = time.perf_counter()
        with self._lock:
            self.build_s += t1 - t0
            self.call_s += t2 - t1


class GilProbe:
    """Diagnostics: how late a thread that sleeps 0.5 ms wakes up, i.e. how long it waits for the GIL.

    Enabled by the ``gil_probe`` parameter; ``stop()`` returns its figures.
    """

    def __init__(self, period_s: float = 0.0005) -> None:
        self.period_s = period_s
        self.samples = 0
        self.late_s = 0.0
        self.max_late_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inflight-gil-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            time.sleep(self.period_s)
            late = time.perf_counter() - t0 - self.period_s
            self.samples += 1
            self.late_s += late
            self.max_late_s = max(self.max_late_s, late)

    def stop(self) -> dict[str, float]:
        """Stop sampling; return ``gil_probe_samples``, ``gil_probe_mean_late_us``, ``gil_probe_max_late_us``."""
        self._stop.set()
        self._thread.join(timeout=1.0)
        n = max(1, self.samples)
        return {
            "gil_probe_samples": self.samples,
            "gil_probe_mean_late_us": self.late_s / n * 1e6,
            "gil_probe_max_late_us": self.max_late_s * 1e6,
        }


class _Nvtx:
    """NVTX ranges through the ``nvtx`` package; free when no profiler is attached."""

    def __init__(self, enabled: bool, domain: str) -> None:
        self._nvtx: Any = None
        if enabled:
            try:
                import nvtx
            except ImportError:
                LOGGER.info("nvtx is not installed; NVTX ranges are off (pip install nvtx)")
            else:
                self._nvtx = nvtx
                self._domain = domain

    def range(self, name: str) -> Any:
        import contextlib

        if self._nvtx is None:
            return contextlib.nullcontext()
        return self._nvtx.annotate(name, domain=self._domain)


def resolve_spec(model_name: str, params: BackendParameters) -> ModelSpec:
    """The registry entry for this model.

    Raises:
        ConfigError: when the model is unknown.
    """
    try:
        return get_model(model_name)
    except KeyError as e:
        raise ConfigError(
            f"{e.args[0]}; name the model <model>_inflight or <model>_sync (or <model>_inflight_<tag>)"
        ) from None


class InflightModel:
    """One model instance of the inflight backend.

    Args:
        args: The ``args`` dict Triton passes to ``initialize``.
        pb_utils: The ``triton_python_backend_utils`` module.

    Raises:
        InflightError: with a message that says what to fix (the adapter turns it into
            ``TritonModelException``).
    """

    def __init__(self, args: Mapping[str, str], pb_utils: Any) -> None:
        route_to_triton(pb_utils)
        install_stack_dump()  # SIGUSR2: every thread's Python stack to the server log (see inflight/lab/stalls.py)
        t_start = time.perf_counter()
        self.pb = pb_utils
        cfg = proto_from_json(args["model_config"])
        self.model_name = args["model_name"]
        self.instance = args.get("model_instance_name", self.model_name)
        self.params = BackendParameters.from_parameters(parameters_of(cfg))
        self.spec = resolve_spec(self.model_name, self.params)
        if self.params.gil_switch_interval_us > 0:
            # the stub process runs this one instance: the setting is ours to make
            sys.setswitchinterval(self.params.gil_switch_interval_us / 1e6)
        self._check_tensors(cfg)
        self.max_batch = int(cfg.max_batch_size) or self.spec.max_batch_size
        kind = args.get("model_instance_kind", "CPU")
        self.device_id = int(args.get("model_instance_device_id", "0")) if kind == "GPU" else None
        version_dir = Path(args["model_repository"]) / str(args.get("model_version", "1"))
        self.sink = TritonSink(pb_utils)
        self.ranges = _Nvtx(self.params.nvtx, "inflight")
        self.rejected: Counter[str] = Counter()  # requests answered with INVALID_ARG, by reason
        self._reject_logged: dict[str, float] = {}

        spec, p = self.spec, self.params
        parts = assemble(p, spec, max_batch=self.max_batch, version_dir=version_dir, device_id=self.device_id)
        self.layout = parts.layout
        runner = self.runner = parts.runner
        self.executor: SyncExecutor | PipelinedExecutor
        if p.mode == "sync":
            self.executor = SyncExecutor(runner, self.ranges)
            slots = 1
        elif p.mode in ("overlap", "auto"):
            policy = None
            if p.mode == "auto":
                policy = AutoPolicy(
                    send_us=p.auto_send_prior_us,
                    explore_every=p.auto_explore_every,
                    explore_max=p.auto_explore_max,
                    busy_min=p.auto_busy_min,
                )
            self.executor = OverlapExecutor(
                runner,
                self.sink,
                slots=p.slots,
                chunk_items=p.chunk_items,
                max_chunks=p.max_chunks,
                policy=policy,
                response_threads=p.response_threads if policy is not None else 1,
                response_backlog=p.response_backlog,
                ranges=self.ranges,
            )
            slots = p.slots
        else:
            self.executor = PipelinedExecutor(
                runner,
                self.sink,
                slots=p.slots,
                response_threads=p.response_threads,
                response_backlog=p.response_backlog,
                yield_to_issue=p.response_yield,
                ranges=self.ranges,
            )
            slots = p.slots
        graphs, graph_note = capture_at_load(parts, p)  # after the executor made its slots
        self.metrics = self._make_metrics(slots)
        # where the execute thread's time goes (finalize logs it next to the executor's counters)
        self.timing: dict[str, float] = {
            "executes": 0,
            "execute_s": 0.0,
            "between_executes_s": 0.0,
            "parse_s": 0.0,
            "execute_max_ms": 0.0,
            "executes_over_10ms": 0,
            "execute_failures": 0,
        }
        self._t_last_exit = 0.0
        self._cpu_last_exit = 0.0
        self._gil_probe = GilProbe() if p.gil_probe else None
        # last: the freeze keeps what the load built (engine, graphs, warm-up) out of later collections
        self._gc = GcWatch(freeze=p.gc_freeze)
        LOGGER.info(
            "%s (%s): %s mode, %d slot(s)%s; %s; %d CUDA graph(s)%s; ready in %.1f s",
            self.model_name,
            self.instance,
            p.mode,
            slots,
            f", {p.response_threads} response threads" if p.mode in ("pipelined", "auto") else "",
            runner.describe(),
            graphs,
            graph_note,
            time.perf_counter() - t_start,
        )

    def _check_tensors(self, cfg: Any) -> None:
        want = {t.name: t for t in (*self.spec.inputs, *self.spec.outputs)}
        have = [*cfg.input, *cfg.output]
        for t in have:
            spec = want.get(t.name)
            if spec is None:
                raise ConfigError(
                    f"config tensor {t.name!r} is not a tensor of model {self.spec.name!r} "
                    f"(it has {sorted(want)}); regenerate the config with `inflight build-models`"
                )

    def _make_metrics(self, slots: int) -> Any:
        if not self.params.metrics:
            return None
        from inflight.runtime.metrics import MetricsPublisher

        gpu_figures = None
        if self.params.cupti and self.device_id is not None:
            try:
                self._cupti = gpu_metrics_provider("cupti")()
                gpu_figures = self._cupti.figures
            except Exception as e:
                LOGGER.warning("cupti=true but live CUPTI metrics are unavailable: %s", e)
        try:
            return MetricsPublisher(
                self.pb,
                model=self.model_name,
                instance=self.instance,
                stats=self.executor.stats,
                in_flight=getattr(self.executor, "in_flight", lambda: 0),
                slots=slots,
                gpu_figures=gpu_figures,
                rejected=self.rejected,
            )
        except Exception as e:  # metrics must not stop the model from serving
            LOGGER.warning("custom metrics unavailable (%s: %s); serving without them", type(e).__name__, e)
            return None

    # -- requests ------------------------------------------------------------------------
    def _parse(self, request: Any) -> tuple[dict[str, np.ndarray], int, int | None]:
        inputs: dict[str, np.ndarray] = {}
        for t in self.spec.inputs:
            tensor = self.pb.get_input_tensor_by_name(request, t.name)
            if tensor is not None:
                inputs[t.name] = tensor.as_numpy()
        # token ids and masks are checked once per batch by the executor (see ModelSpec.validate)
        count = self.spec.validate(inputs, max_batch_size=self.max_batch, check_values=False)
        seq = None
        if self.spec.variable_seq:
            seq = int(inputs[self.spec.inputs[0].name].shape[1])
        return inputs, count, seq

    def execute(self, requests: Sequence[Any]) -> list[Any] | None:
        """Run one batch of requests (see the module docstring for the two modes)."""
        t0 = time.perf_counter()
        if self._t_last_exit:
            gap = t0 - self._t_last_exit
            self.timing["between_executes_s"] += gap
            # the stub receives this batch on this thread: its CPU share in the gap says how busy we are
            self.executor.between_executes(gap, time.thread_time() - self._cpu_last_exit)
        try:
            return self._execute(requests)
        except Exception as e:  # the last line of defence: every request still gets an answer
            return self._fail_execute(requests, e)
        finally:
            self._cpu_last_exit = time.thread_time()
            self._t_last_exit = time.perf_counter()
            took = self._t_last_exit - t0
            t = self.timing
            t["execute_s"] += took
            t["executes"] += 1
            t["execute_max_ms"] = max(t["execute_max_ms"], took * 1e3)
            if took > 0.010:
                t["executes_over_10ms"] += 1

    def _fail_execute(self, requests: Sequence[Any], error: Exception) -> list[Any] | None:
        """Answer the requests of an ``execute()`` call that raised with an error that says what failed.

        The modes that return their responses return one error response per request, except the
        requests an ``auto`` batch had already deferred (its completion thread answers those); the
        pipelined mode sends the error through each request's sender, skipping those already
        answered (their sender is closed and says so). Logged with the traceback, at most every
        ``REJECT_LOG_INTERVAL_S`` per exception type; counted as ``execute_failures``.
        """
        kind = type(error).__name__
        self.timing["execute_failures"] += 1
        now = time.monotonic()
        if now - self._reject_logged.get(f"execute:{kind}", -math.inf) >= REJECT_LOG_INTERVAL_S:
            LOGGER.error(
                "%s (%s): execute() failed for %d requests (%d failures so far)",
                self.model_name,
                self.instance,
                len(requests),
                self.timing["execute_failures"],
                exc_info=error,
            )
            self._reject_logged[f"execute:{kind}"] = now
        message = (
            f"{self.model_name}: the backend failed on this request's batch ({kind}: {error}); the request was not "
            "run. The server log has the traceback; please report it with the log"
        )
        executor = self.executor
        if isinstance(executor, PipelinedExecutor) and not isinstance(executor, OverlapExecutor):
            for r in requests:
                try:
                    r.get_response_sender().send(self.sink.response(None, message), flags=self.sink.final)
                except Exception:  # already answered: its sender is closed
                    continue
            return None
        deferred: set[int] = executor.deferred_handles() if isinstance(executor, OverlapExecutor) else set()
        out: list[Any] = []
        for r in requests:
            if deferred and id(r.get_response_sender()) in deferred:
                out.append(None)
            else:
                out.append(self.sink.response(None, message))
        return out

    def _execute(self, requests: Sequence[Any]) -> list[Any] | None:
        with self.ranges.range("execute"):
            if self.metrics is not None:
                self.metrics.publish()
            if isinstance(self.executor, SyncExecutor):
                return self._execute_sync(requests)
            if isinstance(self.executor, OverlapExecutor):
                with self.executor.issuing():
                    return self._execute_overlap(requests, self.executor)
            with self.executor.issuing():
                self._execute_pipelined(requests)
            return None

    def _parse_requests(
        self,
        requests: Sequence[Any],
        handle_of: Callable[[int, Any], Any],
        reject: Callable[[int, Any, ValidationError], None],
    ) -> list[tuple[int, Item]]:
        """Parse every request: ``reject(index, request, error)`` each invalid one; the others as (index, Item).

        ``handle_of(index, request)`` is what the executor answers the item through.
        """
        parsed: list[tuple[int, Item]] = []
        t0 = time.perf_counter()
        for i, r in enumerate(requests):
            try:
                inputs, count, seq = self._parse(r)
            except ValidationError as e:
                reject(i, r, e)
                continue
            except Exception as e:  # not a known bad input: this request fails alone, the batch runs
                LOGGER.exception("%s: could not read a request", self.model_name)
                reject(i, r, ValidationError(f"could not read this request ({type(e).__name__}: {e})", "unreadable"))
                continue
            parsed.append((i, Item(inputs=inputs, count=count, seq=seq, handle=handle_of(i, r))))
        self.timing["parse_s"] += time.perf_counter() - t0
        return parsed

    def _execute_sync(self, requests: Sequence[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)

        def reject(index: int, error: ValidationError) -> None:
            responses[index] = self._invalid(error)

        items = [item for _, item in self._parse_requests(requests, lambda i, r: i, lambda i, r, e: reject(i, e))]
        if items:
            try:
                try:
                    outs = self._run_sync(items)
                except ValidationError:
                    # a token id or mask value in the batch is out of range: fail those requests alone
                    items = self._split_bad_values(items, reject)
                    outs = self._run_sync(items) if items else []
            except Exception as e:
                LOGGER.error("batch failed: %s", e)
                for item in items:
                    responses[item.handle] = self.sink.response(None, f"batch failed on the device: {e}")
            else:
                t0 = time.perf_counter()
                for item, out in zip(items, outs, strict=True):
                    responses[item.handle] = self.sink.response(out, None)
                self.sink.build_s += time.perf_counter() - t0
        return responses

    def _execute_overlap(self, requests: Sequence[Any], executor: OverlapExecutor) -> list[Any]:
        """Overlap and auto modes: every request's response in the returned list, or None where deferred."""
        responses: list[Any] = [None] * len(requests)

        def reject(index: int, request: Any, error: ValidationError) -> None:
            responses[index] = self._invalid(error)

        with self.ranges.range("parse"):
            # the response sender answers the request if auto defers its chunk (a plain getter)
            parsed = self._parse_requests(requests, lambda i, r: r.get_response_sender(), reject)
        index = [i for i, _ in parsed]
        items = [item for _, item in parsed]
        if items:
            built = executor.run(Batch(items), self.sink.response, self._invalid)
            for i, response in zip(index, built, strict=True):
                responses[i] = response
        return responses

    def _run_sync(self, items: list[Item]) -> list[dict[str, np.ndarray]]:
        executor = self.executor
        assert isinstance(executor, SyncExecutor)
        return executor.run(Batch(items))

    def _invalid(self, error: ValidationError) -> Any:
        """The error response for a bad request (``INVALID_ARG``); counted by reason, logged now and then.

        Triton counts a request its backend answers with an error as a success (``/stats``,
        ``nv_inference_request_success``), so the backend keeps its own count, published as
        ``inflight_rejected_requests_total{reason=...}`` and logged at most every
        ``REJECT_LOG_INTERVAL_S`` per reason (execute thread only).
        """
        reason = error.reason
        self.rejected[reason] += 1
        now = time.monotonic()
        if now - self._reject_logged.get(reason, -math.inf) >= REJECT_LOG_INTERVAL_S:
            LOGGER.warning(
                "%s: rejected a request (%s, %d so far): %s", self.model_name, reason, self.rejected[reason], error
            )
            self._reject_logged[reason] = now
        return self.sink.response(None, str(error), self.pb.TritonError.INVALID_ARG)

    def _split_bad_values(self, items: list[Item], reject: Any) -> list[Item]:
        """After the batch-level value check failed: ``reject(handle, msg)`` each offender; return the rest."""
        good: list[Item] = []
        for item in items:
            try:
                self.spec.check_values(item.inputs)
            except ValidationError as e:
                reject(item.handle, e)
            else:
                good.append(item)
        return good

    def _execute_pipelined(self, requests: Sequence[Any]) -> None:
        executor = self.executor
        assert isinstance(executor, PipelinedExecutor)
        with self.ranges.range("parse"):
            parsed = self._parse_requests(
                requests,
                lambda i, r: r.get_response_sender(),
                lambda i, r, e: self._pipelined_reject(r.get_response_sender(), e),
            )
        items = [item for _, item in parsed]
        if not items:
            return
        try:
            try:
                executor.submit(Batch(items))
            except ValidationError:
                # a token id or mask value in the batch is out of range: fail those requests alone
                items = self._split_bad_values(items, self._pipelined_reject)
                if items:
                    executor.submit(Batch(items))
        except ShuttingDownError as e:
            for item in items:
                self.sink.send(item.handle, None, str(e))

    def _pipelined_reject(self, sender: Any, error: ValidationError) -> None:
        sender.send(self._invalid(error), flags=self.sink.final)
        assert isinstance(self.executor, PipelinedExecutor)
        self.executor.stats.error_responses += 1

    def finalize(self) -> None:
        """Drain or fail in-flight batches, then release every resource."""
        t0 = time.perf_counter()
        drained = self.executor.close(self.params.drain_timeout_s)
        close_s = time.perf_counter() - t0
        stats = self.executor.stats.snapshot()
        stats.update(self.timing)
        stats.update(build_s=self.sink.build_s, send_call_s=self.sink.call_s, rejected=dict(self.rejected))
        counters = getattr(self.runner.engine, "counters", None)
        if counters is not None:
            stats.update(engine=dict(counters))
        if self._gil_probe is not None:
            stats.update(self._gil_probe.stop())
        stats.update(self._gc.stop())
        if getattr(self, "_cupti", None) is not None:
            self._cupti.stop()
        if self.metrics is not None:
            self.metrics.close()
        # how long finalize() itself took (Triton finalizes a model's instances one after another)
        stats.update(close_s=round(close_s, 3), finalize_s=round(time.perf_counter() - t0, 3))
        LOGGER.info(
            "%s (%s) finalized (%s): %s",
            self.model_name,
            self.instance,
            "drained" if drained is not False else "NOT drained: in-flight requests were failed",
            json.dumps(stats, default=str),
        )
