"""The lab: what measures and explains the product, apart from it.

The published experiment plan (``experiments``), the reports generated from ``results/``
(``results_report``, with its ``open_loop_results`` and ``cost_results`` blocks) and the stall
diagnostics of stuck stubs (``stalls``). Nothing under ``inflight.runtime`` imports this package;
the load test reaches ``stalls`` through the ``inflight.diagnostics`` entry point
(:func:`inflight.log.plugin`).
"""
