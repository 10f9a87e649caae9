"""``relative_error``: the per-item error the GPU tests accept or refuse."""

from __future__ import annotations

import numpy as np

from inflight.models.reference import error_bound, relative_error


def test_an_item_with_near_zero_logits_is_judged_against_the_batchs_scale() -> None:
    ref = np.array([[0.10, -0.12], [0.09, 0.11], [0.002, -0.003]])
    out = ref + 1e-4  # fp16-sized rounding of every logit
    assert relative_error(out, ref) < error_bound(True)
    # on its own norm the near-zero item would fail the bound
    assert np.linalg.norm(out[2] - ref[2]) / np.linalg.norm(ref[2]) > error_bound(True)


def test_a_wrong_item_still_fails_and_a_lone_item_keeps_its_own_norm() -> None:
    ref = np.array([[0.10, -0.12], [0.09, 0.11], [0.002, -0.003]])
    wrong = ref.copy()
    wrong[1] = [-0.09, 0.11]
    assert relative_error(wrong, ref) > 1.0
    assert relative_error(ref[2:] + 3e-4, ref[2:]) > 0.1
    assert relative_error(np.full((1, 2), np.nan), ref[:1]) == float("inf")
