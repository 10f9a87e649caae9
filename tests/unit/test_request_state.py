"""Where a model's requests are, read from Triton's Prometheus text (what the A/B runner records)."""

from __future__ import annotations

from inflight.loadtest.stats import request_state

TEXT = """\
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="m",reason="OTHER",version="1"} 2
nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 1
nv_inference_request_failure{gpu_uuid="GPU-1",model="m",reason="BACKEND",version="1"} 1
nv_inference_request_failure{model="other",reason="OTHER",version="1"} 7
nv_inference_request_success{model="m",version="1"} 100
nv_inference_request_success{model="m",version="2"} 5
nv_inference_pending_request_count{model="m",version="1"} 16
nv_inference_pending_request_count{model="other",version="1"} 3
nv_inference_exec_count{model="m",version="1"} 4
"""


def test_counters_are_summed_over_versions_and_reasons_of_one_model() -> None:
    state = request_state(TEXT, "m")
    assert {k: state[k] for k in ("pending", "success", "failure", "executions")} == {
        "pending": 16,
        "success": 105,
        "failure": 3,
        "executions": 4,
    }
    assert len(state["lines"]) == 7 and all('model="m"' in ln for ln in state["lines"])


def test_a_metric_the_server_does_not_publish_is_none() -> None:
    state = request_state('nv_inference_request_success{model="m",version="1"} 1\n', "m")
    assert state["success"] == 1 and state["pending"] is None and state["failure"] is None
    assert request_state(TEXT, "absent")["pending"] is None
