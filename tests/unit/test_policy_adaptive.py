"""The adaptive decision rule on synthetic views: alpha, load, temperature, n-gram, overrides, exploration."""

from __future__ import annotations

import random
import time

import pytest

from policies import (
    AdaptivePolicy,
    BatchView,
    CostModel,
    Decision,
    LearnedState,
    PolicySettings,
    RequestView,
    RoundOutcome,
    StepTiming,
)
from policies.adaptive import REPLAN_RATE


def view(request_id: str = "r", temperature: float = 0.0, max_k: int = 8, match: int = 0, **kw) -> RequestView:
    return RequestView(request_id, temperature, 10, max_k, match, **kw)


def teach(policy: AdaptivePolicy, request_id: str, accepted: int, drafted: int = 4, rounds: int = 20, **kw) -> None:
    proposer = kw.pop("proposer", "draft")
    temperature = kw.pop("temperature", 0.0)
    match = kw.pop("match", 0)
    for _ in range(rounds):
        policy.observe(RoundOutcome(request_id, proposer, temperature, drafted, accepted, match))


def compute_bound_cost_model() -> CostModel:
    """A target where tokens dominate step time (a big batch on a saturated accelerator)."""
    model = CostModel()
    rng = random.Random(0)
    for _ in range(200):
        batch = rng.randint(1, 128)
        tokens = batch * rng.randint(1, 5)
        model.observe(StepTiming(batch, tokens, 2e-3 + 1e-5 * batch + 4e-4 * tokens, 2 * batch, 6e-4 * 2, batch, 2))
    return model


def quiet(**kw) -> PolicySettings:
    return PolicySettings(**{"exploration_rate": 0.0, "k_probe_rate": 0.0, **kw})


def test_high_alpha_low_load_gives_large_k() -> None:
    policy = AdaptivePolicy(quiet())
    teach(policy, "r", accepted=8, drafted=8)
    [decision] = policy.decide(BatchView((view("r"),)))
    assert decision.proposer == "draft" and decision.k >= 6


def test_low_alpha_gives_plain_decode() -> None:
    policy = AdaptivePolicy(quiet(prior_alpha_draft=0.1))
    teach(policy, "r", accepted=0, drafted=2, rounds=40)
    assert policy.decide(BatchView((view("r"),))) == [Decision(0)]


def test_very_high_load_gives_plain_decode_and_low_load_speculates_again() -> None:
    policy = AdaptivePolicy(quiet(), LearnedState(cost_model=compute_bound_cost_model()))
    for index in range(128):
        teach(policy, f"r{index}", accepted=2, drafted=4, rounds=5)
    crowd = BatchView(tuple(view(f"r{index}") for index in range(128)))
    assert {d.k for d in policy.decide(crowd)} == {0}
    alone = BatchView((view("r0"),))
    assert policy.decide(alone)[0].k > 0


def test_a_long_plain_streak_is_planned_only_now_and_then_and_a_lighter_load_at_once() -> None:
    policy = AdaptivePolicy(quiet(), LearnedState(cost_model=compute_bound_cost_model()))
    for index in range(64):
        teach(policy, f"r{index}", accepted=2, drafted=4, rounds=5)
    crowd = BatchView(tuple(view(f"r{index}") for index in range(64)))
    planned = 0
    for _ in range(16 + 400):
        assert {d.k for d in policy.decide(crowd)} == {0}
        planned += policy.last_plan is not None
    assert 16 + 25 < planned < 16 + 80  # 1 in 8 of the 400 steps after the streak
    assert policy.decide(BatchView((view("r0"),)))[0].k > 0


def test_unplanned_steps_skip_the_guard_and_sampled_ones_ask_it_at_a_boosted_probe_rate() -> None:
    """Asking the guard cost ~30 us a step at 32 requests: steps that plan sampling decodes plainly unplanned do
    not ask it, and so that its probes start as often per step, the sampled ones ask at 1 / REPLAN_RATE times
    the probe rate."""
    policy = AdaptivePolicy(quiet(), LearnedState(cost_model=compute_bound_cost_model()))
    for index in range(64):
        teach(policy, f"r{index}", accepted=2, drafted=4, rounds=5)
    crowd = BatchView(tuple(view(f"r{index}") for index in range(64)))
    asked = policy.guard.allowed_proposers
    rates = []

    def allowed_proposers(batch_size, temperature, rng, probe_rate, measured=True, joining=0):  # type: ignore[no-untyped-def]
        rates.append(probe_rate)
        return asked(batch_size, temperature, rng, probe_rate, measured, joining)

    policy.guard.allowed_proposers = allowed_proposers  # type: ignore[method-assign]
    for _ in range(16 + 400):
        policy.decide(crowd)
    assert rates[:16] == [0.05] * 16
    assert 25 < len(rates) - 16 < 80
    assert set(rates[16:]) == {0.05 / REPLAN_RATE}


def test_steps_the_guard_vetoes_extend_the_plain_streak() -> None:
    """Where the guard keeps speculation down, its veto is the plain decision: after ``PLAIN_STREAK`` of them only
    the sampled steps ask it (each ask cost ~1% of a 6 ms GPU step at 32 requests, where every step asked)."""
    policy = AdaptivePolicy(quiet(), LearnedState(cost_model=compute_bound_cost_model()))
    crowd = BatchView(tuple(view(f"r{index}") for index in range(64)))
    asked = []

    def allowed_proposers(*args, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(args)
        return frozenset()

    policy.guard.allowed_proposers = allowed_proposers  # type: ignore[method-assign]
    for _ in range(16 + 400):
        assert {d.k for d in policy.decide(crowd)} == {0}
    assert 16 + 25 < len(asked) < 16 + 80


@pytest.mark.usefixtures("without_trials")
def test_every_step_of_a_probe_burst_is_planned() -> None:
    """A probe of rejected speculation measures what the plan does with it: plain steps that plan sampling
    skipped the plan for would leave the probe without speculative steps. The model here predicts speculation at
    0.96x plain decode, close enough for the probe to measure it."""
    near_tie = quiet(verify_cost_coefficients=(0.01, 0.0, 0.001), draft_cost_per_token=0.006, goodput_guard=False)
    policy = AdaptivePolicy(near_tie)
    batch = BatchView(tuple(view(f"r{index}") for index in range(8)))
    for _ in range(16):
        assert {d.k for d in policy.decide(batch)} == {0}  # all plain: plans are sampled from now on
    policy.reconfigure(PolicySettings(**{**near_tie.to_dict(), "goodput_guard": True, "guard_probe_rate": 1.0}))
    for _ in range(24):  # speculation measured slower than plain decode at 8 requests: rejected, and probed
        policy.observe_step(StepTiming(8, 8, 0.01, step_seconds=0.01, num_generated=8))
        policy.observe_step(StepTiming(8, 16, 0.02, 8, 0.004, 8, 1, step_seconds=0.024, num_generated=10))
    while {d.k for d in policy.decide(batch)} == {0}:  # vetoed until a probe burst starts
        assert not policy.guard.probing(8, 0.0)
    for _ in range(10):
        assert {d.k for d in policy.decide(batch)} == {1}
        assert policy.guard.probing(8, 0.0)


@pytest.mark.usefixtures("without_trials")
def test_a_probe_burst_the_model_declines_ends_at_once() -> None:
    """Where the model predicts speculation far below plain decode (64 requests on a compute-bound target) and
    the guard has no win to show, a probe burst would plan every one of its steps and measure nothing: it ends in
    its first step, and the steps after it are sampled for planning again."""
    policy = AdaptivePolicy(quiet(guard_probe_rate=0.2), LearnedState(cost_model=compute_bound_cost_model()))
    crowd = BatchView(tuple(view(f"r{index}") for index in range(64)))
    for _ in range(16):
        policy.decide(crowd)  # all plain: plans are sampled from now on
    losing = StepTiming(64, 128, 0.02, 64, 0.004, 64, 1, step_seconds=0.024, num_generated=80)
    for _ in range(24):  # speculation measured slower than plain decode at 64 requests: rejected, and probed
        policy.observe_step(StepTiming(64, 64, 0.01, step_seconds=0.01, num_generated=64))
        policy.observe_step(losing)
    while not policy.guard.probing(64, 0.0):  # the rejection's first burst confirms it whatever the model predicts
        policy.decide(crowd)
    while policy.guard.probing(64, 0.0):
        assert {d.k for d in policy.decide(crowd)} != {0}
        policy.observe_step(losing)
    planned = 0
    for _ in range(400):  # bursts start at 0.2 / 12 per step: ~7 of them
        assert {d.k for d in policy.decide(crowd)} == {0}
        assert not policy.guard.probing(64, 0.0)
        planned += policy.last_plan is not None
    assert planned < 400 * 0.125 + 20  # plan sampling's share, and the first step of each burst


def test_high_temperature_lowers_k_at_the_same_history() -> None:
    policy = AdaptivePolicy(quiet())
    for index in range(40):  # the population: cold requests accept well, hot ones poorly
        teach(policy, f"cold{index}", accepted=4, rounds=3, temperature=0.0)
        teach(policy, f"hot{index}", accepted=1, rounds=3, temperature=1.2)
    teach(policy, "a", accepted=2, rounds=2, temperature=0.0)  # identical own history
    teach(policy, "b", accepted=2, rounds=2, temperature=1.2)
    [cold] = policy.decide(BatchView((view("a", temperature=0.0),)))
    [hot] = policy.decide(BatchView((view("b", temperature=1.2),)))
    assert hot.k < cold.k


def test_repetitive_text_chooses_ngram() -> None:
    policy = AdaptivePolicy(quiet(ngram_min_match=2))
    [alone] = policy.decide(BatchView((view("rep", match=6),)))
    assert alone.proposer == "ngram" and alone.k > 0  # free to propose, so it wins even at the default priors
    teach(policy, "rep", accepted=4, rounds=4, proposer="ngram")
    for index in range(4):
        teach(policy, f"other{index}", accepted=3, drafted=4, rounds=5)
    others = tuple(view(f"other{index}", match=1) for index in range(4))
    decisions = policy.decide(BatchView((view("rep", match=6), *others)))
    assert decisions[0].proposer == "ngram" and decisions[0].k > 0
    assert all(d.proposer == "draft" and d.k > 0 for d in decisions[1:])  # short matches: below ngram_min_match


def test_short_ngram_matches_learn_their_own_acceptance() -> None:
    """A request whose 2-token matches fail drafts with the draft model there, and still takes its long matches."""
    policy = AdaptivePolicy(quiet(ngram_min_match=1, ngram_long_match=4))
    teach(policy, "r", accepted=3, drafted=4, rounds=5)
    teach(policy, "r", accepted=0, drafted=4, rounds=8, proposer="ngram", match=2)
    teach(policy, "r", accepted=4, drafted=4, rounds=8, proposer="ngram", match=6)
    [short] = policy.decide(BatchView((view("r", match=2),)))
    [long] = policy.decide(BatchView((view("r", match=6),)))
    assert short.proposer == "draft" and short.k > 0
    assert long.proposer == "ngram" and long.k > 0


def test_ngram_even_against_a_good_draft_when_its_acceptance_is_higher() -> None:
    policy = AdaptivePolicy(quiet())
    teach(policy, "r", accepted=3, drafted=4)
    teach(policy, "r", accepted=8, drafted=8, proposer="ngram")
    [decision] = policy.decide(BatchView((view("r", match=5),)))
    assert decision.proposer == "ngram" and decision.k >= 4


def test_overrides_are_respected() -> None:
    policy = AdaptivePolicy(quiet())
    for request_id in ("off", "draft", "capped"):
        teach(policy, request_id, accepted=4, drafted=4)
    batch = BatchView(
        (
            view("off", override_mode="off"),
            view("draft", match=8, override_mode="draft"),
            view("ngram", match=1, override_mode="ngram"),  # any match will do when asked for
            view("ngram-nomatch", match=0, override_mode="ngram"),
            view("capped", max_k=2),
            view("nodraft", match=0, draft_available=False),
            view("nodraft-rep", match=5, draft_available=False),
        )
    )
    off, draft, ngram, nomatch, capped, nodraft, nodraft_rep = policy.decide(batch)
    assert off.k == 0
    assert draft.proposer == "draft" and draft.k > 0
    assert ngram.proposer == "ngram" and ngram.k > 0
    assert nomatch.k == 0
    assert 0 < capped.k <= 2
    assert nodraft.k == 0
    assert nodraft_rep.proposer == "ngram" and nodraft_rep.k > 0


def test_a_named_proposer_is_used_even_where_the_plan_would_decode_plainly() -> None:
    """Where speculation does not pay (low alpha), "auto" requests decode plainly, but a request that asked for
    a proposer speculates with it (the configured k where the plan says 0); with nothing to propose (no n-gram
    match) it decodes plainly."""
    policy = AdaptivePolicy(quiet(prior_alpha_draft=0.1, prior_alpha_ngram=0.1, k=3))
    for request_id in ("auto", "draft", "ngram"):
        teach(policy, request_id, accepted=0, drafted=2, rounds=40)
    auto, draft, ngram, nomatch = policy.decide(BatchView((
        view("auto"), view("draft", override_mode="draft"), view("ngram", match=4, override_mode="ngram"),
        view("nomatch", override_mode="ngram"))))
    assert auto.k == 0 and nomatch.k == 0
    assert draft == Decision(3, "draft") and ngram.proposer == "ngram" and ngram.k > 0


def test_the_draft_models_catch_up_is_spread_over_the_rounds_left() -> None:
    """Before a request's first draft the draft model must prefill its context: worth it for a request with
    many tokens left, not for one about to finish; a request the draft model has kept up with just drafts."""
    model = CostModel()
    rng = random.Random(0)
    for _ in range(300):  # a draft model that pays 0.1 ms per token it catches up on
        batch, k, catch_up = rng.randint(1, 8), rng.randint(1, 4), rng.choice([0, 20, 300])
        model.observe(StepTiming(batch, batch * (1 + k), 8e-3 + 2.5e-4 * batch * (1 + k), batch * k,
                                 k * (1.5e-3 + 2e-5 * batch) + 1e-4 * catch_up, batch, k,
                                 num_draft_catch_up_tokens=catch_up))
    policy = AdaptivePolicy(quiet(), LearnedState(cost_model=model))
    for request_id in ("kept up", "new, long", "new, ending"):
        teach(policy, request_id, accepted=3, drafted=4)
    kept_up, long, ending = policy.decide(BatchView((
        view("kept up", num_remaining_tokens=3, max_k=2),
        view("new, long", draft_lag=400, num_remaining_tokens=400),
        view("new, ending", draft_lag=400, num_remaining_tokens=3, max_k=2))))
    assert kept_up.k > 0 and long.k > 0
    assert ending.k == 0


def test_k_max_and_load_limit_settings() -> None:
    policy = AdaptivePolicy(quiet(k_max=3))
    teach(policy, "r", accepted=8, drafted=8)
    assert policy.decide(BatchView((view("r"),)))[0].k == 3
    limited = AdaptivePolicy(quiet(max_batch_for_speculation=2))
    many = BatchView(tuple(view(f"r{index}") for index in range(3)))
    assert {d.k for d in limited.decide(many)} == {0}
    assert limited.decide(BatchView(many.requests[:2]))[0].k > 0


def test_exploration_unsticks_a_request_and_is_seeded() -> None:
    def probes(seed: int) -> list[int]:
        settings = PolicySettings(prior_alpha_draft=0.05, exploration_rate=0.3, exploration_max_loss=0.05, seed=seed)
        policy = AdaptivePolicy(settings)
        batch = BatchView((view("r"),))
        return [policy.decide(batch)[0].k for _ in range(400)]

    first = probes(3)
    assert first == probes(3)
    # the first 16 steps are planned, then one in 8 (plan sampling): ~5 + ~14 probes
    assert 5 < sum(1 for k in first if k > 0) < 60 and max(first) <= 2
    assert not any(
        AdaptivePolicy(quiet(prior_alpha_draft=0.05)).decide(BatchView((view("r"),)))[0].k for _ in range(50)
    )


def test_an_exploration_probe_does_not_end_a_plain_streak() -> None:
    """A probe is no plan to speculate: ended by each, streaks at 32 prose requests, T = 0.7, kept a third of the
    steps planned (~150 us each), 0.4% of the step time, adaptive's whole shortfall against ``off`` there."""
    settings = PolicySettings(prior_alpha_draft=0.05, exploration_rate=1.0, exploration_max_loss=1.0)
    policy = AdaptivePolicy(settings)  # every planned step probes; the plans themselves decode plainly
    batch = BatchView((view("r"),))
    planned = probes = 0
    for _ in range(16 + 400):
        probes += policy.decide(batch)[0].k > 0
        planned += policy.last_plan is not None
    assert probes == planned and 16 + 25 < planned < 16 + 80  # one in 8 of the 400 steps after the streak


def test_a_k_probe_drafts_one_token_more_for_every_speculating_request_and_is_not_sticky() -> None:
    """So the step-cost fit sees more than one k (policies/cost_model.py: c against g); one at its cap drafts one
    fewer."""
    requests = BatchView((view("a"), view("b", max_k=2), view("c", max_k=0)))
    policy = AdaptivePolicy(quiet(k_probe_rate=1.0))
    teach(policy, "a", accepted=1, drafted=4)
    teach(policy, "b", accepted=4, drafted=4)
    planned = AdaptivePolicy(quiet(), policy.learned).decide(requests)
    k = planned[0].k
    assert 0 < k < 8 and planned[1:] == [Decision(2, "draft"), Decision(0)]
    probed = policy.decide(requests)
    assert probed == [Decision(k + 1, "draft"), Decision(1, "draft"), Decision(0)]  # b at its cap, c plain
    assert policy.last_plan.ks == (k + 1, 1, 0) and policy.last_plan.draft_passes == k + 1
    assert policy.num_k_probes == 1
    policy.reconfigure(quiet())
    assert policy.decide(requests) == planned


def test_exploration_stays_within_its_loss_budget_under_heavy_load() -> None:
    settings = PolicySettings(prior_alpha_draft=0.05, exploration_rate=1.0, exploration_max_loss=0.01)
    policy = AdaptivePolicy(settings, LearnedState(cost_model=compute_bound_cost_model()))
    crowd = BatchView(tuple(view(f"r{index}") for index in range(64)))
    probed = sum(1 for d in policy.decide(crowd) if d.k > 0)
    assert probed <= 2


def test_an_unlearned_proposer_is_probed_whatever_the_budget_by_one_request_a_step() -> None:
    """Regression: the budget prices a probe with the estimates the probe would correct, so a new server whose
    first steps made drafting look dear never drafted, and never learned otherwise."""
    settings = PolicySettings(prior_alpha_draft=0.05, exploration_rate=1.0, exploration_max_loss=0.01)
    policy = AdaptivePolicy(settings, LearnedState(cost_model=compute_bound_cost_model()))
    crowd = BatchView(tuple(view(f"r{index}") for index in range(64)))
    assert sum(1 for d in policy.decide(crowd) if d.k > 0) == 1
    teach(policy, "seen", accepted=0, drafted=2, rounds=30)  # 30 trials at T = 0 outweigh the prior
    assert not any(d.k for d in policy.decide(crowd))
    hot = BatchView(tuple(view(f"r{index}", temperature=1.0) for index in range(64)))
    assert sum(1 for d in policy.decide(hot) if d.k > 0) == 1  # T = 1 is another bucket, still unlearned


def test_probe_uses_the_cheaper_proposer_under_load() -> None:
    """Regression: probes picked the proposer by alpha alone, so under load draft probes were all refused."""
    settings = PolicySettings(prior_alpha_ngram=0.3, exploration_rate=0.05, exploration_max_loss=0.05)
    policy = AdaptivePolicy(settings, LearnedState(cost_model=compute_bound_cost_model()))
    teach(policy, "seen", accepted=2, drafted=4, rounds=30)  # the draft model's acceptance is learned
    crowd = BatchView((view("rep", match=6), *(view(f"r{index}") for index in range(63))))
    probes = [d for _ in range(100) for d in policy.decide(crowd) if d.k > 0]
    assert probes and all(d.proposer == "ngram" for d in probes)  # a draft probe would cost a whole pass


def test_hysteresis_damps_flapping() -> None:
    def changes(hysteresis: float) -> int:
        policy = AdaptivePolicy(quiet(hysteresis=hysteresis, ewma_weight=0.5, warmup_rounds=0))
        rng = random.Random(0)
        last, num_changes = None, 0
        for _ in range(300):
            [decision] = policy.decide(BatchView((view("r"),)))
            num_changes += last is not None and decision.k != last
            last = decision.k
            if decision.k:
                accepted = 0
                while accepted < decision.k and rng.random() < 0.7:
                    accepted += 1
                policy.observe(RoundOutcome("r", "draft", 0.0, decision.k, accepted))
        return num_changes

    assert changes(0.1) < changes(0.0)


def test_forget_drops_request_state() -> None:
    policy = AdaptivePolicy(quiet())
    teach(policy, "r", accepted=0, drafted=4, rounds=30)
    policy.decide(BatchView((view("r"),)))
    policy.forget("r")
    assert policy.acceptance.num_tracked_requests == 0
    assert policy.decide(BatchView((view("r"),)))[0].k > 0  # back to the prior


def test_decide_is_fast_for_32_requests() -> None:
    policy = AdaptivePolicy(PolicySettings())
    batch = BatchView(tuple(view(f"r{i}", temperature=i % 3 * 0.5, match=i % 7) for i in range(32)))
    for i in range(32):
        teach(policy, f"r{i}", accepted=i % 5, rounds=3)
    policy.decide(batch)
    timings = []
    for _ in range(30):
        start = time.perf_counter()
        policy.decide(batch)
        timings.append(time.perf_counter() - start)
    assert sorted(timings)[len(timings) // 2] < 5e-3  # ~0.3 ms on an idle core; loose for loaded CI


def test_the_guards_measurements_overrule_a_plan_that_decodes_plainly() -> None:
    """The model predicts speculation at 0.96x plain decode (k = 1, the best draft): too close to call, so where
    the guard has not measured it yet, the plan speculates to measure it; at 0.82x the model is trusted until a
    measurement says speculation wins here, which then overrules it."""
    batch = BatchView(tuple(view(f"r{index}") for index in range(8)))
    near_tie = quiet(verify_cost_coefficients=(0.01, 0.0, 0.001), draft_cost_per_token=0.006)
    assert {d.k for d in AdaptivePolicy(PolicySettings(**{**near_tie.to_dict(), "goodput_guard": False}))
            .decide(batch)} == {0}
    assert {d.k for d in AdaptivePolicy(near_tie).decide(batch)} == {1}
    clear_loss = quiet(verify_cost_coefficients=(0.01, 0.0, 0.002), draft_cost_per_token=0.012)
    policy = AdaptivePolicy(clear_loss)
    assert {d.k for d in policy.decide(batch)} == {0}
    for _ in range(12):  # measured: speculation at 8 requests emits 1.5x the tokens per second of plain decode
        policy.observe_step(StepTiming(8, 8, 0.010, step_seconds=0.010, num_generated=8))
        policy.observe_step(StepTiming(8, 16, 0.012, 8, 0.004, 8, 1, step_seconds=0.016, num_generated=18))
    assert {d.k for d in policy.decide(batch)} == {1}


def test_a_begun_first_measurement_is_finished_though_the_model_says_speculation_loses() -> None:
    """The model predicts speculation at 0.82x plain decode; a new engine's first speculative steps (the switch
    into it, then two more) are not enough to judge by, so however dear they made the model think drafting is,
    the plan speculates until the guard has its first figure, here a win, which then holds."""
    batch = BatchView(tuple(view(f"r{index}") for index in range(8)))
    policy = AdaptivePolicy(quiet(verify_cost_coefficients=(0.01, 0.0, 0.002), draft_cost_per_token=0.012))
    assert {d.k for d in policy.decide(batch)} == {0}
    for _ in range(3):
        policy.observe_step(StepTiming(8, 8, 0.010, step_seconds=0.010, num_generated=8))
    switch = StepTiming(8, 16, 0.012, 8, 0.030, 8, 1, num_draft_catch_up_tokens=800, step_seconds=0.042,
                        num_generated=18)
    speculative = StepTiming(8, 16, 0.012, 8, 0.004, 8, 1, step_seconds=0.016, num_generated=18)
    for timing in (switch, speculative, speculative):
        policy.observe_step(timing)
    for _ in range(12):  # the first figure: 1.4x plain decode
        assert {d.k for d in policy.decide(batch)} == {1}
        policy.observe_step(speculative)
    assert policy.guard.speculation_evidence(8, 0.0) == "wins"
    assert {d.k for d in policy.decide(batch)} == {1}


def test_a_draft_measurement_under_way_uses_the_draft_model_where_the_plan_would_use_ngram_alone() -> None:
    """Steps without a draft-model user measure the n-gram route: where the draft route's measurement must go on
    (here its first figure, begun), a plan that would speculate with n-gram lookups alone drafts instead."""
    policy = AdaptivePolicy(quiet(verify_cost_coefficients=(0.01, 0.0, 0.002), draft_cost_per_token=0.012))
    for index in range(8):
        teach(policy, f"r{index}", accepted=4, rounds=4, proposer="ngram")
    batch = BatchView(tuple(view(f"r{index}", match=6) for index in range(8)))
    assert {d.proposer for d in policy.decide(batch) if d.k} == {"ngram"}
    for _ in range(3):
        policy.observe_step(StepTiming(8, 8, 0.010, step_seconds=0.010, num_generated=8))
    switch = StepTiming(8, 16, 0.012, 8, 0.030, 8, 1, num_draft_catch_up_tokens=800, step_seconds=0.042,
                        num_generated=18)
    speculative = StepTiming(8, 16, 0.012, 8, 0.004, 8, 1, step_seconds=0.016, num_generated=18)
    for timing in (switch, speculative):
        policy.observe_step(timing)
    assert policy.guard.measuring_draft(8, 0.0)
    for _ in range(11):
        assert "draft" in {d.proposer for d in policy.decide(batch) if d.k}
        policy.observe_step(speculative)
    assert not policy.guard.measuring_draft(8, 0.0)  # the first figure is complete (a win: it holds)


class PlanClock:
    """Each plan takes ``seconds`` (the policy reads the clock before and after one)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.now, self.reads = seconds, 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:
            self.now += self.seconds
        return self.now


def test_a_plan_dear_against_the_step_is_reused_and_changed_requests_are_decided_alone(monkeypatch) -> None:
    # plans of 1 ms against 10 ms steps: at most 2% of the step time, so each plan serves 4 more steps
    monkeypatch.setattr(AdaptivePolicy, "clock", staticmethod(PlanClock(1e-3)))
    policy = AdaptivePolicy(quiet(goodput_guard=False))
    for request_id in ("a", "b", "c", "x"):
        teach(policy, request_id, accepted=4, drafted=4)
    for request_id in ("b", "c"):
        teach(policy, request_id, accepted=4, drafted=4, proposer="ngram", match=4)
    policy.observe_step(StepTiming(3, 3, 0.01, step_seconds=0.01, num_generated=3))
    first = policy.decide(BatchView((view("a"), view("b", match=4), view("x"))))
    assert policy.last_plan is not None and first[1] == Decision(8, "ngram")
    # held: no plan. "x" left and "c" joined (the same batch-size bucket) with a match: decided alone, it drafts
    # from the match. "b" keeps its choice while its options stay; once its match is gone, it is decided alone.
    for match in (4, 4, 0, 0):
        a, b, c = policy.decide(BatchView((view("a"), view("b", match=match), view("c", match=4))))
        assert policy.last_plan is None
        assert a == first[0] and c.proposer == "ngram" and c.k > 0
        assert b == first[1] if match else b.proposer != "ngram" or b.k == 0
    policy.decide(BatchView((view("a"), view("b", match=4), view("c", match=4))))
    assert policy.last_plan is not None and policy.num_reused_plans == 4  # planned again


def test_plans_are_reused_only_where_they_were_made_and_never_when_every_step_is_planned(monkeypatch) -> None:
    monkeypatch.setattr(AdaptivePolicy, "clock", staticmethod(PlanClock(1e-3)))
    for settings, planned in ((quiet(goodput_guard=False), [True, False, True]),
                              (quiet(goodput_guard=False, max_planning_share=None), [True, True, True])):
        policy = AdaptivePolicy(settings)
        teach(policy, "a", accepted=4, drafted=4)
        policy.observe_step(StepTiming(1, 1, 0.01, step_seconds=0.01, num_generated=1))
        hot = BatchView((view("a"),))
        cold = BatchView((view("a", temperature=1.0),))  # another temperature bucket: plan it
        seen = []
        for batch in (hot, hot, cold):
            policy.decide(batch)
            seen.append(policy.last_plan is not None)
        assert seen == planned
