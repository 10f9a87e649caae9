"""The A/B load test: Locust against a real tritonserver, one variant after the other.

* ``workload``: the requests (inputs drawn from the model registry, KServe v2 binary bodies,
  gRPC requests), the response checks and the PyTorch reference used by ``--check``;
* ``stats``: server statistics deltas, exact latency percentiles, Locust CSV and log parsing;
* ``presets``: the ``published`` and ``smoke`` load shapes;
* ``runner``: loads each variant, warms it up, runs Locust for the window, collects figures;
* ``report``: the Markdown report and PNG plots, drawn from the runner's JSON alone;
* ``cli``: ``inflight ab`` and ``inflight ab-report``.

The Locust file itself is ``loadtest/locustfile.py`` at the top of the checkout.
"""
