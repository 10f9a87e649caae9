"""The plain Python object behind ``backends/inflight/model.py``.

It parses ``args["model_config"]`` once, builds the engine and the runner (``assemble``) and the
mode (``build_mode``: sync, pipelined, overlap or auto; see ``inflight.runtime.modes``), hands every
``execute()`` to the mode, keeps the instance's metrics, and releases everything in ``finalize()``.
The mode reads requests with ``inflight.runtime.reading.RequestReader`` and validates them before
anything is enqueued; a bad request gets its own error response and the rest of its batch runs
normally. The diagnostics for the finalize log and a profiler are ``inflight.runtime.probes``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inflight.log import gpu_metrics_provider, install_stack_dump, route_to_triton
from inflight.model_config import BackendParameters, ModelParameters, parameters_of, proto_from_json
from inflight.model_spec import spec_from_config
from inflight.runtime.assembly import assemble, build_mode, capture_at_load, seq_buckets_for
from inflight.runtime.gcwatch import GcWatch
from inflight.runtime.modes import REJECT_LOG_INTERVAL_S, Answering, Rejections, TritonSink
from inflight.runtime.probes import ExecuteTiming, GilProbe, NvtxRanges
from inflight.runtime.reading import RequestReader, text_encoder

LOGGER = logging.getLogger(__name__)


class InflightModel:
    """One model instance of the inflight backend: its configuration, lifecycle and metrics.

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
        self.params = p = BackendParameters.from_parameters(parameters_of(cfg))
        version_dir = Path(args["model_repository"]) / str(args.get("model_version", "1"))
        # the model is what its config and the files of its version folder say (inflight.model_spec)
        self.spec = spec_from_config(cfg, version_dir=version_dir)
        if p.gil_switch_interval_us > 0:
            # the stub process runs this one instance: the setting is ours to make
            sys.setswitchinterval(p.gil_switch_interval_us / 1e6)
        self.max_batch = self.spec.max_batch_size
        kind = args.get("model_instance_kind", "CPU")
        self.device_id = int(args.get("model_instance_device_id", "0")) if kind == "GPU" else None
        self.sink = TritonSink(pb_utils)
        self.ranges = NvtxRanges(p.nvtx, "inflight")
        self.rejections = Rejections(self.sink, self.model_name)
        self._failure_logged: dict[str, float] = {}
        # before the engine: a missing tokenizer fails the load with nothing to release
        max_seq = (seq_buckets_for(self.spec, p) or (0,))[-1]
        if self.spec.variable_seq and self.spec.max_seq_len is None:  # the longest bucket is the limit
            self.spec = dataclasses.replace(self.spec, max_seq_len=max_seq)
        text = text_encoder(self.spec, ModelParameters.from_parameters(parameters_of(cfg)), version_dir, max_seq)
        parts = assemble(p, self.spec, max_batch=self.max_batch, version_dir=version_dir, device_id=self.device_id)
        self.runner = parts.runner
        self.reader = read = RequestReader(pb_utils, self.spec, self.max_batch, text)
        answering = Answering(
            self.spec, read, self.sink, self.rejections, self.ranges, tokenize=read.tokenize if text else None
        )
        self.mode = build_mode(p, parts.runner, answering)
        graphs, graph_note = capture_at_load(parts, p)  # after the mode's executor made its slots
        self.metrics = self._make_metrics()
        # where the execute thread's time goes (finalize logs it next to the executor's counters)
        self.timing = ExecuteTiming()
        self._gil_probe = GilProbe() if p.gil_probe else None
        # last: the freeze keeps what the load built (engine, graphs, warm-up) out of later collections
        self._gc = GcWatch(freeze=p.gc_freeze)
        LOGGER.info(
            "%s (%s): %s; %s%s; %d CUDA graph(s)%s; ready in %.1f s",
            self.model_name,
            self.instance,
            self.mode.describe(),
            self.runner.describe(),
            f"; text input {self.spec.text_input!r}: {text.describe()}" if text is not None else "",
            graphs,
            graph_note,
            time.perf_counter() - t_start,
        )

    def _make_metrics(self) -> Any:
        """The instance's ``MetricsPublisher`` (None when ``metrics`` is off or unavailable); starts CUPTI if asked."""
        self._cupti: Any = None
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
                gpu=self.device_id,
                stats=self.mode.stats,
                more=self.mode.counters()[1:],
                in_flight=self.mode.in_flight,
                slots=self.mode.slots,
                gpu_figures=gpu_figures,
                calls_per_execute=self.params.metric_calls_per_execute,
                rejected=self.rejections.counts,
            )
        except Exception as e:  # metrics must not stop the model from serving
            LOGGER.warning("custom metrics unavailable (%s: %s); serving without them", type(e).__name__, e)
            return None

    def execute(self, requests: Sequence[Any]) -> list[Any] | None:
        """Run one batch of requests through the mode (see ``inflight.runtime.modes``)."""
        gap = self.timing.enter()
        failures = self._failures()
        if gap is not None:
            self.mode.between_executes(gap)
        try:
            return self._execute(requests)
        except Exception as e:  # the last line of defence: every request still gets an answer
            return self._fail_execute(requests, e)
        finally:
            self.timing.exit()
            if self.metrics is not None and self._failures() != failures:
                self._publish_now()

    def _failures(self) -> int:
        """Requests refused and error responses counted so far (cheap: compared around each ``execute()``)."""
        st = self.mode.stats
        return self.rejections.total + st.error_responses + st.failed_batches

    def _publish_now(self) -> None:
        """Publish this call's refusals and errors at once, so the endpoint is current on an idle server."""
        try:
            self.metrics.publish_failures()
        except Exception as e:  # metrics must not fail the requests
            LOGGER.warning("publishing metrics failed (%s: %s)", type(e).__name__, e)

    def _execute(self, requests: Sequence[Any]) -> list[Any] | None:
        with self.ranges.range("execute"):
            if self.metrics is not None:
                self.metrics.publish()
            return self.mode.execute(requests)

    def _fail_execute(self, requests: Sequence[Any], error: Exception) -> list[Any] | None:
        """Answer the requests of an ``execute()`` call that raised with an error that says what failed.

        The mode answers them (``Mode.fail``: its returned responses, or through the senders, skipping
        what was answered already). Logged with the traceback, at most every ``REJECT_LOG_INTERVAL_S``
        per exception type; counted as ``execute_failures``.
        """
        kind = type(error).__name__
        failures = self.timing.failed()
        now = time.monotonic()
        if now - self._failure_logged.get(kind, -math.inf) >= REJECT_LOG_INTERVAL_S:
            LOGGER.error(
                "%s (%s): execute() failed for %d requests (%d failures so far)",
                self.model_name,
                self.instance,
                len(requests),
                failures,
                exc_info=error,
            )
            self._failure_logged[kind] = now
        message = (
            f"{self.model_name}: the backend failed on this request's batch ({kind}: {error}); the request was not "
            "run. The server log has the traceback; please report it with the log"
        )
        return self.mode.fail(requests, message)

    def finalize(self) -> None:
        """Drain or fail in-flight batches, then release every resource."""
        t0 = time.perf_counter()
        drained = self.mode.close(self.params.drain_timeout_s)
        close_s = time.perf_counter() - t0
        stats = self._final_stats()
        if self._cupti is not None:
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

    def _final_stats(self) -> dict[str, Any]:
        """The finalize log's figures (the executor's, the execute thread's, the engine's...); stops the probes.

        Each number is declared once, by its owner, in ``inflight.runtime.record.FIGURES`` (the figures added
        here in ``INSTANCE_FIGURES``), which the load-test parser reads them through.
        """
        stats: dict[str, Any] = {}
        for owned in self.mode.counters():
            stats.update(owned.snapshot())
        stats.update(self.timing.figures, parse_s=self.mode.parse_s)
        if self.reader.text is not None:
            stats.update(
                tokenize_s=self.reader.tokenize_s,
                tokenize_max_s=self.reader.tokenize_max_s,
                tokenize_library_texts=self.reader.text.library_texts,
            )
        stats.update(build_s=self.sink.build_s, send_call_s=self.sink.call_s, rejected=dict(self.rejections.counts))
        counters = getattr(self.runner.engine, "counters", None)
        if counters is not None:
            stats.update(engine=dict(counters))
        if self._gil_probe is not None:
            stats.update(self._gil_probe.stop())
        stats.update(self._gc.stop())
        if self.metrics is not None:
            stats.update(self.metrics.figures)
        return stats
