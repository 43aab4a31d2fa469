"""bench/acceptance_positions.py's reading of full rounds: per-position rates, the estimator's alpha, shorter k."""

from __future__ import annotations

import pytest

from bench.acceptance_positions import cell_report, pooled_alpha, position_rates
from policies.goodput import expected_tokens


def test_a_passage_that_rejects_early_leaves_the_later_positions_to_the_easier_ones() -> None:
    """Half the rounds accept everything, half nothing: position 1 reads 0.5, every later one 1.0, and the pooled
    alpha (3 of 4 trials accepted at k = 3) prices k = 3 at 2.73 tokens where rounds emit 2.5."""
    accepted = [3, 0] * 50
    assert position_rates(accepted, 3) == [0.5, 1.0, 1.0]
    assert pooled_alpha(accepted, 3) == pytest.approx(0.75)
    by_k = cell_report(accepted, 3)["by_k"]
    assert [row["emitted"] for row in by_k] == [1.5, 2.0, 2.5]
    assert by_k[2]["iid_over_emitted"] == pytest.approx(expected_tokens(0.75, 3) / 2.5)
    assert by_k[0]["iid_over_emitted"] == pytest.approx(1.0)  # at k = 1 the pooled alpha is the first position's


def test_identical_positions_are_priced_right_at_every_k() -> None:
    """Rounds whose accepted counts follow the i.i.d. law exactly (alpha 0.5, k = 2: 0, 1, 2 accepted in 2 : 1 : 1)."""
    accepted = [0, 0, 1, 2] * 25
    report = cell_report(accepted, 2)
    assert report["position_rates"] == [0.5, 0.5]
    assert [row["iid_over_emitted"] for row in report["by_k"]] == pytest.approx([1.0, 1.0])
