"""The A/B runner: the same load against each variant in turn, on one tritonserver (or one per GPU).

For each variant (``bert_tiny_sync@instances=4,delay_us=500``...), in the order given and, with
``repeat``, interleaved with the order reversed every other round (A, B, B, A...):

1. load it under its name with its config override (``control.load_variant``);
2. warm up for ``warmup_s`` under the same load (a Locust run that is not measured);
3. snapshot the server statistics and the CPU times (``inflight.loadtest.cpu``); run Locust
   headless for the window (``--reset-stats``: the statistics start once every user is running)
   while sampling the backend's live GPU gauges and printing a progress line; snapshot again;
4. unload it.

Every variant sees the same load shape, seed, request pool and warm-up. A run is flagged
client-limited (kept, a lower bound for the server) when Locust reports its own CPU above 90%,
and marked invalid when Locust fails or no request succeeded. Results go to ``<out>/ab-<timestamp>.json`` (all
raw figures, the variant configs, versions and device) and the report next to it.

With ``server_gpus`` (``inflight ab --server-per-gpu 0,1``, open loop with the asyncio generator only)
the runner starts one tritonserver per listed GPU instead, each seeing only its GPU
(``CUDA_VISIBLE_DEVICES``) on its own contiguous share of the server cores
(:func:`~inflight.loadtest.openloop.share_cpus`), loads every variant on each, spreads the
generator's sources over them, and sums what the servers say (statistics, metrics, CPU, stub
memory, executor counters) into the figures of one deployment. With ``balancer`` (``--balancer nginx``)
nginx runs in front of them (on its own cores or the servers'), and each variant's load goes where its
``via=`` says: through the balancer (the default), spread over the servers directly, or to one GPU's
server; variants of one round that differ only in that share one load of the model.

The parts, each a module of this package:

- :mod:`~inflight.loadtest.runner.config`: :class:`AbConfig` (which checks itself), the variants, the endpoints;
- :mod:`~inflight.loadtest.runner.fleet`: the server fleet (one server or one per GPU: start, stop, load, unload);
- :mod:`~inflight.loadtest.runner.gpu_servers`: the plan of one server per GPU (its GPU, devices, cores);
- :mod:`~inflight.loadtest.runner.front`: the load balancer in front of the per-GPU servers (``--balancer nginx``);
- :mod:`~inflight.loadtest.runner.plan`: the load plan (closed or open loop, Locust or the asyncio generator),
  decided once, and the load generator's command lines and runs;
- :mod:`~inflight.loadtest.runner.window`: one measured window and its figures;
- :mod:`~inflight.loadtest.runner.document`: the run's JSON document;
- :mod:`~inflight.loadtest.runner.ab`: :class:`AbRunner`, which runs them in turn, and :func:`run_ab`.

Every part logs as ``inflight.loadtest.runner`` (this package's logger).
"""
