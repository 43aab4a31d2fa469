"""plan_batch: Leviathan's formula, exactness against brute force, hysteresis."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import Candidate, CostCoefficients, DraftPlan, expected_tokens, plan_batch
from policies.goodput import _plan_general

COEFFS = CostCoefficients(a=8e-3, b=5e-5, c=2.5e-4, d=1.5e-3, e=2e-5)


def test_expected_tokens() -> None:
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 8) == 1.0


def brute_force_goodput(candidates: list[Candidate], coeffs: CostCoefficients, prefill: int) -> float:
    options = []
    for c in candidates:
        mine = [(0, "plain", 1.0)]
        mine += [(k, "draft", expected_tokens(c.alpha_draft, k)) for k in range(1, c.max_k_draft + 1)]
        mine += [(k, "ngram", expected_tokens(c.alpha_ngram, k)) for k in range(1, c.max_k_ngram + 1)]
        options.append(mine)
    best = 0.0
    n = len(candidates)
    for combo in itertools.product(*options):
        draft_ks = [k for k, proposer, _ in combo if proposer == "draft"]
        plan = DraftPlan(max(draft_ks), len(draft_ks)) if draft_ks else None
        num_drafted = sum(k for k, _, _ in combo)
        seconds = coeffs.step_seconds(n, n + prefill + num_drafted, plan, verifies=num_drafted > 0)
        best = max(best, sum(tokens for _, _, tokens in combo) / seconds)
    return best


candidate = st.builds(
    Candidate,
    alpha_draft=st.floats(0.05, 0.99),
    max_k_draft=st.integers(0, 3),
    alpha_ngram=st.floats(0.05, 0.99),
    max_k_ngram=st.integers(0, 3),
)
coefficients = st.builds(
    CostCoefficients,
    a=st.floats(1e-3, 1e-2),
    b=st.floats(0.0, 1e-3),
    c=st.floats(0.0, 5e-3),
    d=st.floats(0.0, 5e-3),
    e=st.floats(0.0, 1e-3),
    f=st.floats(0.0, 5e-3),
    g=st.floats(0.0, 5e-3),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(candidate, min_size=1, max_size=3), coefficients, st.integers(0, 20))
def test_plan_is_the_exact_optimum(candidates: list[Candidate], coeffs: CostCoefficients, prefill: int) -> None:
    plan = plan_batch(candidates, coeffs, prefill)
    assert plan.goodput >= brute_force_goodput(candidates, coeffs, prefill) * (1 - 1e-9)
    for c, k, proposer in zip(candidates, plan.ks, plan.proposers, strict=True):
        if k:
            assert k <= (c.max_k_draft if proposer == "draft" else c.max_k_ngram)


def test_fixed_cost_of_speculating_favours_longer_drafts() -> None:
    """Where speculating at all costs a fixed g + f and each extra token little, k = 1 does not pay its entry
    fee while a longer draft does: the fixed costs must not be folded into the per-token ones."""
    per_token = CostCoefficients(a=8e-3, b=0.0, c=1e-3, d=2e-3, e=0.0)
    fixed = CostCoefficients(a=8.9e-3, b=0.0, c=1e-4, d=0.9e-3, e=0.0, f=0.8e-3, g=1.2e-3)
    # the two models agree on plain decode and on a k = 1 round
    assert fixed.step_seconds(1, 1) == pytest.approx(per_token.step_seconds(1, 1))
    assert fixed.step_seconds(1, 2, DraftPlan(1, 1)) == pytest.approx(per_token.step_seconds(1, 2, DraftPlan(1, 1)))
    long_fixed = plan_batch([Candidate(0.7, 6, 0.0, 0)] * 2, fixed)
    long_per_token = plan_batch([Candidate(0.7, 6, 0.0, 0)] * 2, per_token)
    assert min(long_fixed.ks) > max(long_per_token.ks)


def test_fixed_cost_alone_can_veto_speculation() -> None:
    """Drafts that pay per token but not the entry fee g: plain decode for everyone."""
    cheap_tokens_dear_entry = CostCoefficients(a=8e-3, b=0.0, c=1e-5, d=0.0, e=0.0, g=8e-3)
    plan = plan_batch([Candidate(0.0, 0, 0.3, 2)] * 4, cheap_tokens_dear_entry)
    assert set(plan.ks) == {0}
    assert plan.goodput == pytest.approx(4 / cheap_tokens_dear_entry.step_seconds(4, 4))


def test_cheap_tokens_and_high_alpha_give_long_drafts() -> None:
    plan = plan_batch([Candidate(0.95, 8, 0.0, 0)], COEFFS)
    assert plan.ks == (8,) and plan.proposers == ("draft",)


def test_expensive_tokens_give_plain_decode() -> None:
    compute_bound = CostCoefficients(a=1e-3, b=0.0, c=1e-3, d=5e-4, e=1e-5)
    plan = plan_batch([Candidate(0.7, 8, 0.0, 0)] * 64, compute_bound)
    assert set(plan.ks) == {0}


def test_hysteresis_keeps_a_slightly_worse_previous_choice() -> None:
    free = Candidate(0.6, 8, 0.0, 0)
    best = plan_batch([free], COEFFS).ks[0]
    neighbour = best - 1
    sticky = Candidate(0.6, 8, 0.0, 0, previous=("draft", neighbour))
    assert plan_batch([sticky], COEFFS, hysteresis=0.05).ks[0] == neighbour
    assert plan_batch([sticky], COEFFS, hysteresis=0.0).ks[0] == best
    far = Candidate(0.6, 8, 0.0, 0, previous=("draft", 8))  # far worse than hysteresis allows
    assert plan_batch([far], COEFFS, hysteresis=0.01).ks[0] == best


previous = st.one_of(st.none(), st.tuples(st.sampled_from(["draft", "ngram"]), st.integers(0, 3)))


@settings(max_examples=300, deadline=None)
@given(candidate, previous, coefficients, st.integers(0, 20), st.sampled_from([0.0, 0.03, 0.2]))
def test_single_request_shortcut_agrees_with_the_general_solver(
    c: Candidate, prev, coeffs: CostCoefficients, prefill: int, hysteresis: float
) -> None:
    c = Candidate(c.alpha_draft, c.max_k_draft, c.alpha_ngram, c.max_k_ngram, previous=prev)
    fast, general = plan_batch([c], coeffs, prefill, hysteresis), _plan_general([c], coeffs, prefill, hysteresis)
    assert fast.goodput == pytest.approx(general.goodput, rel=1e-9)
    if (fast.ks, fast.proposers) == (general.ks, general.proposers) and fast.ks[0]:  # ties may break either way
        assert (fast.num_tokens, fast.draft_passes, fast.num_draft_requests) == (
            general.num_tokens, general.draft_passes, general.num_draft_requests)
