"""bench/k_costs.py: which steps count as steady decoding, whose request a finished one was; bench/row_bands.py: its
twins round rows as before s77."""

from __future__ import annotations

import pytest

from bench.k_costs import client_and_run, request_id, steady
from bench.row_bands import COARSE_BANDS
from engine.models import llama
from policies.base import StepTiming


def test_steady_steps_are_the_full_batchs_without_prefill_after_the_first_ten() -> None:
    first = [StepTiming(batch_size=4, num_tokens=8, target_seconds=0.5, step_seconds=0.5)] * 10
    full = StepTiming(batch_size=4, num_tokens=12, target_seconds=0.01, step_seconds=0.01)
    draining = StepTiming(batch_size=3, num_tokens=9, target_seconds=0.01, step_seconds=0.01)
    joined = StepTiming(batch_size=4, num_tokens=40, target_seconds=0.02, step_seconds=0.02, num_prefill_tokens=28,
                        num_prefilling=1)
    assert steady([*first, full, draining, joined, full], 4) == [full, full]


@pytest.mark.parametrize("engine", [0, 4, "adaptive"])
def test_a_finished_requests_client_asks_again_under_its_own_name(engine) -> None:
    assert client_and_run(request_id(engine, 12, 3)) == (12, 3)


def test_the_coarse_twin_rounds_65_to_512_rows_to_32_as_before_s77(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [llama.padded_rows(rows) for rows in (65, 80, 255)] == [72, 80, 256]
    monkeypatch.setattr(llama, "ROW_BANDS", COARSE_BANDS)
    assert [llama.padded_rows(rows) for rows in (64, 65, 80, 257, 513)] == [64, 96, 96, 288, 768]
