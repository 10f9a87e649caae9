"""What one custom-metric call costs a Python-backend model: a round trip to the server process.

Starts a tritonserver (the project's launcher, free ports) on a temporary repository holding one Python
model whose ``execute()`` times ``N`` calls each of ``Metric.observe`` (histogram), ``Metric.increment``
(counter) and ``Metric.set`` (gauge), and an empty loop, and returns the microseconds per call. Writes a
JSON (host, versions, rounds) and prints one line per round. Every call of ``MetricsPublisher`` costs
this on the execute thread, which is why a publication is bounded (``inflight.runtime.metrics``).

Usage (any host with tritonserver): python3 scripts/lab/metric_call_cost.py --out cost.json [--calls 5000]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

CONFIG = """name: "metric_cost"
backend: "python"
max_batch_size: 0
input [ { name: "N", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "US", data_type: TYPE_FP64, dims: [ 4 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

MODEL = """import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        mf = pb_utils.MetricFamily
        labels = {"model": "metric_cost"}
        # the families must outlive their metrics
        self.families = [
            mf(name="cost_histogram", description="h", kind=mf.HISTOGRAM),
            mf(name="cost_counter", description="c", kind=mf.COUNTER),
            mf(name="cost_gauge", description="g", kind=mf.GAUGE),
        ]
        self.h = self.families[0].Metric(labels=labels, buckets=[1.0, 2.0, 4.0])
        self.c = self.families[1].Metric(labels=labels)
        self.g = self.families[2].Metric(labels=labels)

    def execute(self, requests):
        out = []
        for r in requests:
            n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
            t = [time.perf_counter()]
            for _ in range(n):
                self.h.observe(2.0)
            t.append(time.perf_counter())
            for _ in range(n):
                self.c.increment(1.0)
            t.append(time.perf_counter())
            for _ in range(n):
                self.g.set(3.0)
            t.append(time.perf_counter())
            for _ in range(n):
                pass
            t.append(time.perf_counter())
            us = np.diff(np.array(t)) / n * 1e6
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("US", us)]))
        return out
"""


def main() -> int:
    """Run the rounds and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import tritonclient.http as http

    from inflight.loadtest.runner.document import versions
    from inflight.server.config import ServerConfig
    from inflight.server.launcher import TritonServer

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        (repo / "metric_cost" / "1").mkdir(parents=True)
        (repo / "metric_cost" / "config.pbtxt").write_text(CONFIG)
        (repo / "metric_cost" / "1" / "model.py").write_text(MODEL)
        server = TritonServer(ServerConfig.on_free_ports(repo, Path(tmp) / "logs", models=["metric_cost"]))
        server.start()
        rounds = []
        try:
            found = versions(server.http_url)
            client = http.InferenceServerClient(server.http_url.replace("http://", ""))
            try:
                for _ in range(args.rounds):
                    n = http.InferInput("N", [1], "INT32")
                    n.set_data_from_numpy(np.array([args.calls], dtype=np.int32))
                    us = client.infer("metric_cost", [n]).as_numpy("US")
                    row = dict(
                        zip(("observe_us", "increment_us", "set_us", "empty_loop_us"), map(float, us), strict=True)
                    )
                    rounds.append(row)
                    print(
                        "us per call: histogram observe {observe_us:.2f}, counter increment {increment_us:.2f}, "
                        "gauge set {set_us:.2f}, empty loop {empty_loop_us:.3f}".format(**row)
                    )
            finally:
                client.close()
        finally:
            code = server.stop()
    doc = {
        "what": "microseconds per custom-metric call inside a Python-backend model's execute()",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
        "versions": found,
        "calls_per_round": args.calls,
        "rounds": rounds,
        "server_exit": code,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
