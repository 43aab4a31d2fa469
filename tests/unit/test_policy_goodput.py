"""plan_batch: Leviathan's formula, exactness against brute force, hysteresis."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import Candidate, CostCoefficients, DraftPlan, expected_tokens, plan_batch
from policies.goodput import _plan_jointly, best_alone, k_probe

COEFFS = CostCoefficients(a=8e-3, b=5e-5, c=2.5e-4, d=1.5e-3, e=2e-5)


def test_expected_tokens() -> None:
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 8) == 1.0
    assert expected_tokens(0.5, 2, lead=1.2) == pytest.approx(1 + 0.6 + 0.6 * 0.5)  # the first position at 0.6
    assert expected_tokens(0.9, 3, lead=1.3) == pytest.approx(1 + 1.0 + 0.9 + 0.81)  # ... at most 1


def objective(candidates: list[Candidate], coeffs: CostCoefficients, prefill: int, hysteresis: float,
              combo: tuple[tuple[int, str], ...]) -> float:
    """Expected tokens per predicted second of one (k, proposer) per request, each request's previous choice
    counted ``1 + hysteresis`` times."""
    n = len(candidates)
    tokens = 0.0
    for c, (k, proposer) in zip(candidates, combo, strict=True):
        alpha, lead = (c.alpha_draft, c.lead_draft) if proposer == "draft" else (c.alpha_ngram, c.lead_ngram)
        sticky = c.previous is not None and c.previous[1] == k and (k == 0 or c.previous[0] == proposer)
        tokens += expected_tokens(alpha, k, lead) * (1.0 + hysteresis if sticky else 1.0)
    draft_ks = [k for k, proposer in combo if proposer == "draft" and k]
    catch_up = sum(c.draft_catch_up * expected_tokens(c.alpha_draft, k, c.lead_draft)
                   for c, (k, proposer) in zip(candidates, combo, strict=True) if proposer == "draft" and k)
    plan = DraftPlan(max(draft_ks), len(draft_ks), catch_up) if draft_ks else None
    num_drafted = sum(k for k, _ in combo)
    return tokens / coeffs.step_seconds(n, n + prefill + num_drafted, plan, verifies=num_drafted > 0)


def brute_force_goodput(candidates: list[Candidate], coeffs: CostCoefficients, prefill: int,
                        hysteresis: float = 0.0, speculate: bool = False) -> float:
    """``speculate``: over the plans where every request that has a proposer drafts."""
    options = []
    for c in candidates:
        drafts = [(k, "draft") for k in range(1, c.max_k_draft + 1)]
        drafts += [(k, "ngram") for k in range(1, c.max_k_ngram + 1)]
        options.append(drafts if speculate and drafts else [(0, "draft"), *drafts])
    return max(objective(candidates, coeffs, prefill, hysteresis, combo) for combo in itertools.product(*options))


def candidates(max_k: int) -> st.SearchStrategy[Candidate]:
    """Requests with caps up to ``max_k`` per proposer (3 keeps brute force over a batch of 3 fast)."""
    return st.builds(
        Candidate,
        alpha_draft=st.floats(0.05, 0.99),
        max_k_draft=st.integers(0, max_k),
        alpha_ngram=st.floats(0.05, 0.99),
        max_k_ngram=st.integers(0, max_k),
        draft_catch_up=st.one_of(st.just(0.0), st.floats(0.0, 20.0)),
        lead_draft=st.one_of(st.just(1.0), st.floats(0.7, 1.3)),
        lead_ngram=st.one_of(st.just(1.0), st.floats(0.7, 1.3)),
    )


candidate = candidates(3)
coefficients = st.builds(
    CostCoefficients,
    a=st.floats(1e-3, 1e-2),
    b=st.floats(0.0, 1e-3),
    c=st.floats(0.0, 5e-3),
    d=st.floats(0.0, 5e-3),
    e=st.floats(0.0, 1e-3),
    f=st.floats(0.0, 5e-3),
    g=st.floats(0.0, 5e-3),
    h=st.floats(0.0, 1e-4),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(candidate, min_size=1, max_size=3), coefficients, st.integers(0, 20))
def test_plan_is_the_exact_optimum(candidates: list[Candidate], coeffs: CostCoefficients, prefill: int) -> None:
    plan = plan_batch(candidates, coeffs, prefill)
    assert plan.goodput >= brute_force_goodput(candidates, coeffs, prefill) * (1 - 1e-9)
    for c, k, proposer in zip(candidates, plan.ks, plan.proposers, strict=True):
        if k:
            assert k <= (c.max_k_draft if proposer == "draft" else c.max_k_ngram)


@settings(max_examples=150, deadline=None)
@given(st.lists(candidate, min_size=1, max_size=3), coefficients)
def test_speculative_plan_is_the_best_in_which_every_request_drafts(candidates: list[Candidate],
                                                                   coeffs: CostCoefficients) -> None:
    plan = plan_batch(candidates, coeffs, speculate=True)
    assert plan.goodput >= brute_force_goodput(candidates, coeffs, 0, speculate=True) * (1 - 1e-9)
    for c, k in zip(candidates, plan.ks, strict=True):
        assert (k > 0) == bool(c.max_k_draft or c.max_k_ngram)


@settings(max_examples=100, deadline=None)
@given(st.lists(candidate, min_size=1, max_size=3), coefficients, st.integers(0, 20))
def test_a_k_probe_drafts_one_token_more_or_at_the_cap_one_fewer_and_is_priced_as_such(
        candidates: list[Candidate], coeffs: CostCoefficients, prefill: int) -> None:
    plan = plan_batch(candidates, coeffs, prefill, speculate=True)
    probed = k_probe(plan, candidates, coeffs)
    caps = [c.max_k_draft if proposer == "draft" else c.max_k_ngram for c, proposer in zip(candidates, plan.proposers)]
    assert probed.ks == tuple((k + 1 if k < cap else max(1, k - 1)) if k else 0
                              for k, cap in zip(plan.ks, caps, strict=True))
    assert probed.proposers == plan.proposers
    combo = tuple(zip(probed.ks, probed.proposers, strict=True))
    assert probed.goodput == pytest.approx(objective(candidates, coeffs, prefill, 0.0, combo), rel=1e-9)


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


def test_a_draft_models_catch_up_is_charged_to_the_requests_that_need_it() -> None:
    """Two requests alike but for the draft model's catch-up: the one whose context it must still prefill, with
    few tokens left to spread it over, stays on plain decode where the other drafts; the plan's time includes
    what it does charge (per expected token)."""
    coeffs = CostCoefficients(a=8e-3, b=5e-5, c=2.5e-4, d=1.5e-3, e=2e-5, h=3e-5)
    drafting, new = Candidate(0.7, 4, 0.0, 0), Candidate(0.7, 4, 0.0, 0, draft_catch_up=100.0)
    plan = plan_batch([drafting, new], coeffs)
    assert plan.ks[0] > 0 and plan.ks[1] == 0
    assert plan.draft_catch_up == 0.0
    charged = plan_batch([Candidate(0.7, 4, 0.0, 0, draft_catch_up=2.0)], coeffs)  # 2 tokens per token left: pays
    k = charged.ks[0]
    assert k > 0 and charged.draft_catch_up == pytest.approx(2.0 * expected_tokens(0.7, k))
    assert charged.step_seconds == pytest.approx(coeffs.step_seconds(1, 1 + k, DraftPlan(k, 1, charged.draft_catch_up)))


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


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(candidate, previous), min_size=1, max_size=3), coefficients, st.integers(0, 20),
       st.sampled_from([0.03, 0.2]))
def test_plan_is_the_exact_optimum_with_hysteresis(pairs, coeffs: CostCoefficients, prefill: int,
                                                   hysteresis: float) -> None:
    candidates = [Candidate(c.alpha_draft, c.max_k_draft, c.alpha_ngram, c.max_k_ngram, previous=prev,
                            draft_catch_up=c.draft_catch_up) for c, prev in pairs]
    plan = plan_batch(candidates, coeffs, prefill, hysteresis)
    chosen = objective(candidates, coeffs, prefill, hysteresis, tuple(zip(plan.ks, plan.proposers, strict=True)))
    assert chosen >= brute_force_goodput(candidates, coeffs, prefill, hysteresis) * (1 - 1e-9)


@settings(max_examples=200, deadline=None)
@given(candidate, coefficients, st.integers(0, 4), st.floats(100.0, 5000.0), st.integers(1, 16))
def test_best_alone_is_the_best_choice_at_the_price_with_the_rest_of_the_step_fixed(
        c: Candidate, coeffs: CostCoefficients, passes: int, price: float, batch: int) -> None:
    """In a speculating step of ``batch`` other requests, one of which drafts ``passes`` tokens with the draft model
    (none: the draft model does not run), the request's choice maximises its tokens less the price of the seconds
    it adds; a draft-model draft may not add passes."""
    def seconds(k: int, proposer: str) -> float:
        drafts = proposer == "draft" and k > 0
        catch_up = c.draft_catch_up * expected_tokens(c.alpha_draft, k, c.lead_draft) * drafts
        users = int(passes > 0) + drafts
        plan = DraftPlan(passes, users, catch_up) if users else None
        return coeffs.step_seconds(batch + 1, batch + 1 + passes + k, plan, verifies=True)

    def value(k: int, proposer: str) -> float:
        alpha, lead = (c.alpha_draft, c.lead_draft) if proposer == "draft" else (c.alpha_ngram, c.lead_ngram)
        return expected_tokens(alpha, k, lead) - price * (seconds(k, proposer) - seconds(0, "draft"))

    options = [(0, "draft")] + [(k, "ngram") for k in range(1, c.max_k_ngram + 1)]
    options += [(k, "draft") for k in range(1, min(c.max_k_draft, passes) + 1)]
    chosen = best_alone(c, coeffs, price, passes)
    assert chosen in options
    assert value(*chosen) >= max(value(*option) for option in options) - 1e-9 * price


@settings(max_examples=300, deadline=None)
@given(candidates(8), coefficients, st.integers(0, 20), st.sampled_from([0.0, 0.1]), st.booleans(),
       st.one_of(st.none(), st.tuples(st.sampled_from(["draft", "ngram"]), st.integers(0, 9))))
def test_a_batch_of_one_is_planned_as_the_joint_solver_would(
        alone: Candidate, coeffs: CostCoefficients, prefill: int, hysteresis: float, speculate: bool,
        previous: tuple[str, int] | None) -> None:
    """One request's plan scores each choice directly; it must find the joint solver's optimum, priced alike."""
    alone = replace(alone, previous=previous)
    fast = plan_batch([alone], coeffs, prefill, hysteresis, speculate=speculate)
    joint = _plan_jointly([alone], coeffs, prefill, hysteresis, speculate)
    combo = lambda plan: tuple(zip(plan.ks, plan.proposers, strict=True))  # noqa: E731
    assert objective([alone], coeffs, prefill, hysteresis, combo(fast)) == pytest.approx(
        objective([alone], coeffs, prefill, hysteresis, combo(joint)), rel=1e-9)
    assert fast.goodput == pytest.approx(objective([alone], coeffs, prefill, 0.0, combo(fast)), rel=1e-9)
    assert (fast.num_tokens, fast.draft_passes, fast.num_draft_requests) == (
        1 + prefill + fast.ks[0], fast.ks[0] if fast.proposers[0] == "draft" else 0,
        int(fast.ks[0] > 0 and fast.proposers[0] == "draft"))


def test_a_plan_that_must_draft_keeps_gains_too_small_for_a_sum_near_1e9() -> None:
    """Drafting is free here, so k = 6 beats k = 5 by alpha^6 (6e-8 tokens): the speculative plan must still see it
    (with its old floor of -1e9 for plain decode, the sums rounded it away)."""
    request = Candidate(alpha_draft=0.0625, max_k_draft=6, alpha_ngram=0.5, max_k_ngram=0)
    free = CostCoefficients(a=0.0078125, b=0.0, c=0.0, d=0.0, e=0.0, f=0.0, g=0.0, h=0.0)
    assert plan_batch([request, request], free, speculate=True).ks == (6, 6)


def rows_of_four(tokens: int) -> int:
    """A CPU's packed linears from 17 rows on: rounded up to a multiple of 4 (engine/models/llama.py)."""
    return tokens if tokens <= 16 else -(-tokens // 4) * 4


def test_a_lone_draft_whose_padded_rows_eat_its_gain_is_not_taken() -> None:
    """32 plain requests run 32 rows; one drafting a token beside them runs 36, not 33."""
    coeffs = CostCoefficients(a=2e-3, b=5e-5, c=3e-4, d=1e-3, e=2e-5)
    batch = [Candidate(0.1, 0, 0.1, 0)] * 31 + [Candidate(0.1, 0, 0.9, 1)]
    as_fed = plan_batch(batch, coeffs)
    assert as_fed.ks[-1] == 1 and as_fed.proposers[-1] == "ngram"  # 0.9 tokens for c: it pays
    padded = plan_batch(batch, replace(coeffs, rows=rows_of_four))
    assert set(padded.ks) == {0}  # 0.9 tokens for 4c: it does not
    assert padded.step_seconds == pytest.approx(coeffs.target_seconds(32, 32))


@settings(max_examples=200, deadline=None)
@given(candidates(8), coefficients, st.integers(0, 20), st.booleans())
def test_a_batch_of_one_is_the_exact_optimum_at_the_rows_its_tokens_run(
        alone: Candidate, coeffs: CostCoefficients, prefill: int, speculate: bool) -> None:
    coeffs = replace(coeffs, rows=lambda tokens: max(4, rows_of_four(tokens)))  # and 1-3 rows run as 4
    plan = plan_batch([alone], coeffs, prefill, speculate=speculate)
    assert plan.goodput == pytest.approx(brute_force_goodput([alone], coeffs, prefill, speculate=speculate),
                                         rel=1e-9)


def test_rows_a_plan_pads_to_anyway_take_drafted_tokens() -> None:
    """17 requests drafting one n-gram token each feed 34 tokens, which run 36 rows: two more drafted tokens cost
    the linears nothing, so the two requests whose next token is worth most draft them."""
    coeffs = CostCoefficients(a=2e-3, b=5e-5, c=2.85e-4, d=1e-3, e=2e-5, rows=rows_of_four)
    batch = [Candidate(0.1, 0, 0.7, 3)] * 15 + [Candidate(0.1, 0, 0.75, 3)] * 2
    as_fed = plan_batch(batch, replace(coeffs, rows=None))
    assert as_fed.ks == (1,) * 17  # a second token (0.49, 0.56) is worth less than a row's price (~0.66 tokens)
    plan = plan_batch(batch, coeffs)
    assert plan.ks == (1,) * 15 + (2, 2) and plan.num_tokens == 36
    assert plan.goodput > as_fed.expected_tokens / coeffs.step_seconds(17, 34, verifies=True)
