"""The policy sweep's per-cell verdicts: paired ratios, the best fixed policy, and the twin noise controls."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.common import RunResult
from bench.policy_sweep import (
    OFF_TWIN,
    TWIN,
    TWIN_OF,
    VARIANTS,
    audit_at_load,
    plain_share,
    rotate_policies,
    summarize_cell,
)


def runs(*rates: float) -> list[RunResult]:
    return [RunResult(seconds=1.0, num_tokens=int(rate)) for rate in rates]


def test_cell_verdicts_are_medians_of_paired_ratios_and_no_twin_counts_as_best_fixed() -> None:
    cell = {"workload": "code", "temperature": 0.0, "concurrency": 4}
    summary = summarize_cell(cell, {
        "adaptive": runs(110, 100, 120),
        "off": runs(100, 100, 100),
        TWIN_OF: runs(100, 90, 130),  # median 100
        "draft k=4": runs(105, 95, 110),  # median 105: the best fixed policy
        TWIN: runs(200, 200, 200),  # faster than all, but a control: never "best fixed"
        OFF_TWIN: runs(99, 102, 300),  # a control too
    })
    assert summary["best_fixed"] == "draft k=4"
    assert summary["adaptive_vs_best_fixed"] == pytest.approx(100 / 95)  # the median of 1.048, 1.053, 1.091
    assert summary["adaptive_vs_off"] == pytest.approx(1.1)
    assert summary["twin_vs_best_fixed"] == pytest.approx(200 / 105)
    assert summary["twin_vs_original"] == pytest.approx(200 / 100)
    assert summary["off_twin_vs_off"] == pytest.approx(1.02)
    without_twins = summarize_cell(cell, {"adaptive": runs(1), "off": runs(1), TWIN_OF: runs(1)})
    assert "twin_vs_original" not in without_twins and "off_twin_vs_off" not in without_twins


def test_an_adaptive_variant_is_judged_like_adaptive_and_is_never_best_fixed() -> None:
    variant = next(iter(VARIANTS))
    cell = {"workload": "code", "temperature": 0.0, "concurrency": 32}
    summary = summarize_cell(cell, {"adaptive": runs(100, 100), "off": runs(90, 90), "ngram k=4": runs(110, 110),
                                    variant: runs(120, 125)})
    assert summary["best_fixed"] == "ngram k=4"
    assert summary[f"{variant}_vs_best_fixed"] == pytest.approx(122.5 / 110)
    assert summary[f"{variant}_vs_adaptive"] == pytest.approx(1.225)


def test_policies_take_every_engine_in_turn() -> None:
    """Engines differ in speed by themselves, so between runs each policy moves on to the next one's engine."""
    engines = {name: SimpleNamespace(policy=f"{name} policy", label=f"engine {i}")
               for i, name in enumerate(("adaptive", "off", "draft k=2"))}
    seen: dict[str, list[str]] = {name: [] for name in engines}
    for _ in range(3):
        for name, engine in engines.items():
            assert engine.policy == f"{name} policy"
            seen[name].append(engine.label)
        rotate_policies(engines)  # type: ignore[arg-type]
    assert all(sorted(labels) == ["engine 0", "engine 1", "engine 2"] for labels in seen.values())


def test_the_audit_line_shows_the_cells_batch_sizes_only() -> None:
    audit = {"plain": [{"batch_sizes": [1, 1], "measured_over_predicted": 1.3, "steps": 2},
                       {"batch_sizes": [5, 8], "measured_over_predicted": 1.01, "steps": 90}],
             "verify": [{"batch_sizes": [5, 8], "measured_over_predicted": 1.234, "steps": 40}], "draft": []}
    assert audit_at_load(audit, 8) == "plain 5-8: 1.01 (90 steps); verify 5-8: 1.23 (40 steps)"
    assert audit_at_load(audit, 32) == "none"


def test_the_plain_line_shares_each_cause_over_all_request_steps_of_the_runs() -> None:
    causes = [{"guard_probe": 6, "capped": 2}, {"guard_probe": 2, "capped": 2, "plan": 0}]
    assert plain_share(causes, [[10, 40, 50], [4, 46, 50]]) == "guard_probe 4.0%, capped 2.0%"
    assert plain_share([{}], [[0, 10]]) == "none"
