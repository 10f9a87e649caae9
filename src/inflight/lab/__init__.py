"""The lab: what measures and explains the product, apart from it.

The reports generated from ``results/`` (``results_report`` and its live ``sections``; ``archive`` keeps the
closed questions' sections as they were last rendered), the faults-under-load driver (``faults``) and the stall
diagnostics of stuck stubs (``stalls``). Nothing under ``inflight.runtime`` imports this package; the load test
reaches ``stalls`` through the ``inflight.diagnostics`` entry point (:func:`inflight.log.plugin`).
"""
