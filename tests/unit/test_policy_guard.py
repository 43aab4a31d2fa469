"""The goodput guard: realised tokens/s of plain vs speculative steps per batch-size bucket."""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest

from policies import (
    AdaptivePolicy,
    BatchView,
    FixedPolicy,
    LearnedState,
    OffPolicy,
    PolicySettings,
    PolicySettingsError,
    RequestView,
    StepTiming,
)
from policies.guard import (
    ALL_PROPOSERS,
    DRAFT_ONLY,
    FRESH_SECONDS,
    MAX_PROBE_BOOST,
    MEASURE_PLAIN_RATE,
    MIN_SAMPLES,
    MIN_SPECULATIVE_SAMPLES,
    NEAR_MISS,
    PROBE_BURST,
    PROBE_LIMIT,
    REGIME_SHIFT,
    SURE_SAMPLES,
    GoodputGuard,
)
from policies.guard_figures import batch_bucket, measures_step
from policies.guard_trial import EARLY_BUCKET, EARLY_STEPS, EARLY_WIN, TRIAL_STEPS, TRIAL_WINDOW, Trial
from policies.simulate import SimCost, simulate

SAMPLES = MIN_SPECULATIVE_SAMPLES  # steps of each arm the tests feed before asking for a verdict
SURE = SURE_SAMPLES  # speculative steps before a near miss of the bar settles as a rejection


def step(batch: int, speculative: bool, tokens: int, seconds: float, route: str = "draft") -> StepTiming:
    fed = batch * 3 if speculative else batch
    drafted = fed - batch if route == "draft" else 0
    return StepTiming(batch, fed, seconds, num_draft_tokens=drafted, step_seconds=seconds, num_generated=tokens)


def allowed_fraction(guard: GoodputGuard, batch: int, probe_rate: float, temperature: float = 0.0,
                     proposer: str = "draft", speculative: StepTiming | None = None,
                     plain: StepTiming | None = None) -> float:
    """How often a step may use ``proposer``; ``speculative``: the step each allowed draw then measures (else a
    probe burst measures nothing and lasts PROBE_LIMIT draws); ``plain``: the step each other draw measures (else a
    plain probe measures nothing and holds for PROBE_LIMIT draws)."""
    rng = random.Random(0)
    draws = 4000
    allowed = 0
    for _ in range(draws):
        if proposer in guard.allowed_proposers(batch, temperature, rng, probe_rate):
            allowed += 1
            if speculative is not None:
                guard.observe(speculative, temperature)
        elif plain is not None:
            guard.observe(plain, temperature)
    return allowed / draws


def plain_start_fraction(guard: GoodputGuard, batch: int, probe_rate: float) -> float:
    """How often a step starts a plain probe, each draw on a copy of ``guard`` (a probe then holds until measured)."""
    rng = random.Random(0)
    draws = 2000
    return sum("draft" not in copy.deepcopy(guard).allowed_proposers(batch, 0.0, rng, probe_rate)
               for _ in range(draws)) / draws


def burst_fraction(probe_rate: float, burst: int = PROBE_BURST + 1) -> float:
    """The share of steps in probe bursts of ``burst`` steps started at ``probe_rate / PROBE_BURST`` per step
    (a measured burst: its first step, the draft's catch-up, and PROBE_BURST measured ones)."""
    started = probe_rate * burst / PROBE_BURST
    return started / (1 + started)


def test_buckets_group_batch_sizes_by_powers_of_two() -> None:
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33)] == [0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6]


def test_speculation_is_allowed_until_both_arms_are_measured() -> None:
    guard = GoodputGuard()
    assert allowed_fraction(guard, 8, 0.05) == 1.0
    for _ in range(SAMPLES):
        guard.observe(step(8, True, 8, 0.01))
    # speculation measured, plain not yet: plain steps are taken at MEASURE_PLAIN_RATE to learn it
    assert plain_start_fraction(guard, 8, 0.05) == pytest.approx(MEASURE_PLAIN_RATE, abs=0.02)


# spec 2000 tokens/s vs plain 1600 (a 25% gain): plain probes at 5% x 0.1 / 0.25, rarer the more it wins;
# spec 1520 (5% below plain, 10% short of its +5% bar): probed at 5%;
# spec 800, half of plain: probed at 5% x 0.1 / 0.55, rarer the clearer it lost; spec 1600 (break-even):
# probed at 2 x 5%, spec 1648 (just under its bar): at MAX_PROBE_BOOST x 5%. Probes come in bursts: the draft's
# catch-up and PROBE_BURST measured steps, and where they measure a near miss, SURE_SAMPLES measured steps.
# The rejection these steps settled is not a probe's: it is probed at MAX_PROBE_BOOST x 5% until a probe
# confirms it, a burst or two of the 4000 draws.
@pytest.mark.usefixtures("without_trials")
@pytest.mark.parametrize(("spec_tokens", "probe_rate", "burst", "tolerance"), [
    (30, None, 0, 0.01), (22.8, 0.05, SURE + 1, 0.03), (12, 0.05 * 0.1 / 0.55, PROBE_BURST + 1, 0.01),
    (24, 0.1, SURE + 1, 0.05), (24.72, 0.05 * MAX_PROBE_BOOST, SURE + 1, 0.06)])
def test_verdict_follows_the_measured_rates_with_probes(spec_tokens: float, probe_rate: float | None, burst: int,
                                                         tolerance: float) -> None:
    guard = GoodputGuard()
    for _ in range(SURE):
        guard.observe(step(16, False, 16, 0.010))  # plain: 1600 tokens/s
        guard.observe(step(16, True, spec_tokens, 0.015))
    expected = 1 - 0.05 * 0.1 / 0.25 if probe_rate is None else burst_fraction(probe_rate, burst)
    measured = step(16, True, spec_tokens, 0.015)  # what each speculative step measures: the same again
    assert allowed_fraction(guard, 16, 0.05, speculative=measured,
                            plain=step(16, False, 16, 0.010)) == pytest.approx(expected, abs=tolerance)
    assert allowed_fraction(guard, 1, 0.05) == 1.0  # another bucket knows nothing yet


# held winning speculation 2% over plain decode (1632 tokens/s): plain probes at MAX_PROBE_BOOST x 5%; 6% over it:
# at 5% x 0.1 / 0.06; 25% over it: at 5% x 0.1 / 0.25
@pytest.mark.parametrize(("held_tokens", "plain_share"), [
    (24.48, 0.05 * MAX_PROBE_BOOST), (25.44, 0.05 * 0.1 / 0.06), (30, 0.05 * 0.1 / 0.25)])
def test_winning_speculation_is_probed_the_more_often_the_closer_it_runs_to_break_even(
        held_tokens: float, plain_share: float) -> None:
    """A plain probe of winning speculation costs what speculation gains in a step, so a win held near break-even
    takes plain steps the most often (its verdict rests on plain figures of the moment), a clear win the least."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(16, False, 16, 0.010))  # plain: 1600 tokens/s
        guard.observe(step(16, True, 30, 0.015))  # 2000 tokens/s: taken up
    assert "draft" in guard.allowed_proposers(16, 0.0, random.Random(0), 0.05)
    for _ in range(100):
        guard.observe(step(16, False, 16, 0.010))
        guard.observe(step(16, True, held_tokens, 0.015))  # the win settles at held_tokens / 0.015 tokens/s
    assert allowed_fraction(guard, 16, 0.05, speculative=step(16, True, held_tokens, 0.015),
                            plain=step(16, False, 16, 0.010)) == pytest.approx(1 - plain_share, abs=0.01)


def run_trial(guard: GoodputGuard, batch: int, spec_step: StepTiming, plain_step: StepTiming) -> list[bool]:
    """Feed a take-up's trial at ``batch`` requests: each step as the guard routes it (``spec_step`` where it may
    speculate, else ``plain_step``); which steps might speculate, in order."""
    rng = random.Random(0)
    arms = []
    for _ in range(2 * TRIAL_STEPS):
        arms.append("draft" in guard.allowed_proposers(batch, 0.0, rng, 0.0))
        guard.observe(spec_step if arms[-1] else plain_step)
    return arms


@pytest.mark.parametrize(("spec_tokens", "taken_up"), [(36, True), (32.4, False), (30.4, False)])
def test_from_17_requests_a_take_up_waits_for_a_trial_of_plain_and_speculative_windows(
        spec_tokens: float, taken_up: bool) -> None:
    """Beside stale plain figures a speculative figure can read a false win there, so the two arms run in turns,
    ``TRIAL_WINDOW`` steps each, and speculation is taken up only where its arm beats the plain one by 2.5%:
    by 12.5% here; by 1.25% (too close to call) or a 5% loss are rejections."""
    guard = GoodputGuard()
    rng = random.Random(0)
    for batch in (16, 32):
        for _ in range(SAMPLES):
            guard.observe(step(batch, False, batch, 0.010))
            guard.observe(step(batch, True, batch * 1.25, 0.010))  # both figures read a 25% win
    assert "draft" in guard.allowed_proposers(16, 0.0, rng, 0.0)  # below 17 requests: taken up at once
    arms = run_trial(guard, 32, step(32, True, spec_tokens, 0.010), step(32, False, 32, 0.010))
    assert arms == [i // TRIAL_WINDOW % 2 == 1 for i in range(2 * TRIAL_STEPS)]  # plain first, then in turns
    verdicts = ["draft" in guard.allowed_proposers(32, 0.0, rng, 0.0) for _ in range(50)]
    assert verdicts == [taken_up] * 50
    row = next(row for row in guard.summary() if row["batch_sizes"] == [17, 32])
    assert row["speculative"]["draft"]["T=0"]["trial"] == {"vs_plain": pytest.approx(spec_tokens / 32),
                                                           "steps": [TRIAL_STEPS, TRIAL_STEPS]}


@pytest.mark.parametrize(("batch", "spec_tokens", "taken_up"),
                         [(4, 4.6, True), (8, 9.2, True), (8, 7, False), (16, 18, True), (16, 16.2, True),
                          (16, 14, False), (32, 36, True), (32, 32.4, False)])
def test_from_3_requests_a_figure_that_reads_a_loss_rejects_only_on_a_trial(
        batch: int, spec_tokens: float, taken_up: bool) -> None:
    """A 12-step figure read 0.71x plain decode where sustained speculation ran 1.10x `off` (16 requests), a 24-step one
    0.98x where it ran 1.19x (8 requests), and the rejections stood for runs: there the arms run in turns before
    speculation is rejected, and a trial it wins takes it up: below 17 requests from break-even (1.0125x here), from
    17 on, where a won trial is a take-up, from 1 + ``TRIAL_GAIN``. Below 9 requests a trial that reads a clear win
    (1.15x) at ``EARLY_STEPS`` an arm is won there; at 9-16 (1.125x) it runs its ``TRIAL_STEPS``, as it does where
    the win is not clear."""
    guard = GoodputGuard()
    rng = random.Random(0)
    for _ in range(SAMPLES):
        guard.observe(step(batch, False, batch, 0.010))
        guard.observe(step(batch, True, batch * 0.7, 0.010))  # the figure reads a 30% loss
    arms = run_trial(guard, batch, step(batch, True, spec_tokens, 0.010), step(batch, False, batch, 0.010))
    early = batch_bucket(batch) < EARLY_BUCKET and spec_tokens >= batch * (1.0 + EARLY_WIN)
    trial_steps = EARLY_STEPS if early else TRIAL_STEPS
    windows = [i // TRIAL_WINDOW % 2 == 1 for i in range(2 * trial_steps)]
    assert arms == windows + [True] * (2 * (TRIAL_STEPS - trial_steps))  # a won trial: speculation goes on
    verdicts = ["draft" in guard.allowed_proposers(batch, 0.0, rng, 0.0) for _ in range(50)]
    assert verdicts == [taken_up] * 50
    for _ in range(SAMPLES):  # a figure below 3 requests still rejects alone
        guard.observe(step(2, False, 2, 0.010))
        guard.observe(step(2, True, 1.4, 0.010))
    assert not any("draft" in guard.allowed_proposers(2, 0.0, rng, 0.0) for _ in range(50))


def test_the_guard_says_why_it_allowed_no_proposer() -> None:
    """For operators' stats (`PolicyController`'s ``plain_by_cause``): a trial's plain window, a plain probe, or
    speculation that lost on both routes."""
    guard = GoodputGuard()
    rng = random.Random(0)
    for _ in range(SAMPLES):
        guard.observe(step(8, False, 8, 0.010))
        guard.observe(step(8, True, 5.6, 0.010))  # a loss at 5-8 requests is tried before it rejects
    assert not guard.allowed_proposers(8, 0.0, rng, 0.0) and guard.plain_reason == "trial"  # its plain window first
    for _ in range(SAMPLES):  # below 3 requests a loss rejects alone; both routes lose here
        guard.observe(step(2, False, 2, 0.010))
        guard.observe(step(2, True, 1.4, 0.010))
        guard.observe(step(2, True, 1.4, 0.010, route="ngram"))
    assert not guard.allowed_proposers(2, 0.0, rng, 0.0) and guard.plain_reason == "rejected"
    for _ in range(SAMPLES):  # a win at 1 request, probed by plain steps at the probe rate
        guard.observe(step(1, False, 1, 0.010))
        guard.observe(step(1, True, 2, 0.010))
    reasons = {guard.plain_reason for _ in range(200) if not guard.allowed_proposers(1, 0.0, rng, 1.0)}
    assert reasons == {"probe"}


def guard_with_a_losing_figure() -> tuple[GoodputGuard, tuple[int, int, str]]:
    """A guard whose draft-route figure at 16 requests, T = 0, reads a 30% loss (its trial not begun), and the key."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(16, False, 16, 0.010))
        guard.observe(step(16, True, 11.2, 0.010))
    return guard, (batch_bucket(16), 0, "draft")


def test_a_won_trial_of_a_rejection_drops_the_figure_that_read_the_loss() -> None:
    """Kept, a figure that read a loss fell the win of the trial that tried it at once, and a trial of the same loss
    began again: below 17 requests speculation goes on after a won trial, its figure measured afresh and held down to
    break-even."""
    guard, key = guard_with_a_losing_figure()
    rng = random.Random(0)
    plain, even = step(16, False, 16, 0.010), step(16, True, 16.2, 0.010)
    run_trial(guard, 16, even, plain)
    figure = guard._speculative[key]
    assert figure.trial.won and figure.winning and figure.samples == 1  # the trial's last step, no more
    for _ in range(3 * SAMPLES):  # at 1.0125x plain decode it holds, and no trial starts again
        assert "draft" in guard.allowed_proposers(16, 0.0, rng, 0.0) and not guard.probing(16, 0.0)
        guard.observe(even)
    assert guard._speculative[key].samples == 1 + 3 * SAMPLES


def test_a_lost_trial_stands_until_a_probe_measures_speculation_again() -> None:
    """A trial's rejection is not tried again: only a probe burst's new figure, where it reads a loss, starts the
    next."""
    guard, key = guard_with_a_losing_figure()
    rng = random.Random(0)
    losing, plain = step(16, True, 11.2, 0.010), step(16, False, 16, 0.010)
    run_trial(guard, 16, losing, plain)
    tried = guard._speculative[key]
    assert tried.trial.done and not tried.trial.won
    assert not any("draft" in guard.allowed_proposers(16, 0.0, rng, 0.0) for _ in range(200))  # no probes at rate 0
    while guard._speculative[key] is tried:  # probes at every chance: a burst measures speculation afresh
        guard.observe(losing if "draft" in guard.allowed_proposers(16, 0.0, rng, 1.0) else plain)
    assert guard._speculative[key].trial is None
    guard.allowed_proposers(16, 0.0, rng, 0.0)
    assert guard.probing(16, 0.0) and not guard._speculative[key].trial.done  # its loss is tried in turn


def test_a_lost_trial_counts_in_what_the_probe_burst_before_it_cost() -> None:
    """From 9 requests on a burst's figure that reads a loss is tried before it rejects: where speculation loses that
    trial too, its speculative arm's loss (32 steps, to a burst's 12) is part of what the probe cost, and the next
    probe is priced with it."""
    guard = GoodputGuard()
    key = (batch_bucket(16), 0, "draft")
    losing, plain = step(16, True, 11.2, 0.010), step(16, False, 16, 0.010)  # speculation at 0.7x plain decode
    for _ in range(SAMPLES):
        guard.observe(plain)
        guard.observe(losing)
    run_trial(guard, 16, losing, plain)
    assert guard._trial_loss[key] == pytest.approx(TRIAL_STEPS * 0.3)  # plain steps lost
    [row] = [row for row in guard.summary() if row["batch_sizes"] == [9, 16]]
    assert row["speculative"]["draft"]["T=0"]["trial_loss"] == pytest.approx(TRIAL_STEPS * 0.3)
    assert guard._probe_loss(key) is None  # no burst measured yet: the figure prices the probe
    guard._burst_loss[key] = 2.0
    assert guard._probe_loss(key) == pytest.approx(2.0 + TRIAL_STEPS * 0.3)
    won = Trial()
    for _ in range(2 * TRIAL_STEPS):
        won.add(won.speculates, 0, 0.010, 20 if won.speculates else 16)
    assert won.won and won.loss == 0.0


def test_a_trial_takes_the_draft_models_catch_up_on_the_plain_window_off_its_switch() -> None:
    """A speculative window's first drafting step feeds the draft model what the plain window decoded, which neither
    sustained speculation nor plain decode pays: its price comes off. The draft model's prefill of a prompt that
    joined meanwhile is sustained speculation's cost too, and stays."""
    trial = Trial()
    price = 1e-4  # seconds per token the draft model catches up on
    while not trial.done:
        if not trial.speculates:
            trial.add(False, 0, 0.010, 16)
        elif trial.lag:  # the switch: 64 tokens of lag and a 100-token prompt to catch up on
            trial.add(True, 0, 0.015 + 164 * price, 26, catch_up_tokens=164, catch_up_token_seconds=price)
        else:
            trial.add(True, 0, 0.015, 26)
    switches = TRIAL_STEPS // TRIAL_WINDOW
    spec_seconds = TRIAL_STEPS * 0.015 + switches * 100 * price
    assert trial.ratio == pytest.approx((0.010 / 16) / (spec_seconds / (26 * TRIAL_STEPS)))


def test_a_trial_gives_both_arms_the_same_prompt_cost_per_decoded_token() -> None:
    """Which arm's steps prompts join is luck (they were 64% of a step's seconds at 32 code clients): a plain arm
    that drew every joining prompt must not read slow for it, nor a speculative one fast."""
    trial = Trial()
    for i in range(TRIAL_STEPS):
        prompt_tokens = 100 if i % 2 else 0  # the plain arm draws every prompt: 1600 tokens at 100 us each
        trial.add(False, prompt_tokens, 0.010 + prompt_tokens * 1e-4, 32)
        trial.add(True, 0, 0.010, 32.5)  # speculation decodes 1.6% more per step
    prompt_per_token = 1e-4 * 1600 / (32 * 32 + 32 * 32.5)  # what the traffic's prompts cost per decoded token
    assert trial.ratio == pytest.approx((0.010 / 32 + prompt_per_token) / (0.010 / 32.5 + prompt_per_token))
    assert trial.done and not trial.won  # a 1.2% gain: under TRIAL_GAIN (unadjusted, the arms read 1.52x)


def test_speculative_rates_are_kept_per_temperature() -> None:
    """Greedy steps that speculate well say nothing about T = 1 steps, whose acceptance is lower."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(16, False, 16, 0.010))
        guard.observe(step(16, True, 32, 0.012), temperature=0.0)
        guard.observe(step(16, True, 17, 0.012), temperature=1.0)
    assert allowed_fraction(guard, 16, 0.0, temperature=0.0) == 1.0
    assert allowed_fraction(guard, 16, 0.0, temperature=1.0) == 0.0
    assert allowed_fraction(guard, 16, 0.0, temperature=0.7) == 1.0  # nothing measured at T=0.7 yet


def test_summary_reports_each_bucket() -> None:
    guard = GoodputGuard()
    guard.observe(step(3, False, 3, 0.01))
    guard.observe(step(0, False, 0, 0.01))  # ignored
    guard.observe(step(3, True, 6, 0.0))  # no step time: ignored
    guard.observe(step(4, True, 8, 0.01), temperature=0.7)
    [row] = guard.summary()
    assert row == {"batch_sizes": [3, 4], "plain": {"tokens_per_s": pytest.approx(300.0), "steps": 1},
                   "speculative": {"draft": {"(0.5,0.9]": {"tokens_per_s": pytest.approx(800.0), "steps": 1,
                                                             "vs_plain": None, "probe_burst_loss": None,
                                                             "trial_loss": None, "trial": None}}}}
    # (1 plain step: not measured yet; no probe burst ran; no trial below 17 requests)


# a cost model told that tokens are cheap, so that only the guard's measurements can stop speculation
CHEAP_TOKENS = (0.01, 0.0, 1e-4)


def test_adaptive_policy_decodes_plainly_where_speculation_measured_slower() -> None:
    policy = AdaptivePolicy(PolicySettings(guard_probe_rate=0.0, verify_cost_coefficients=CHEAP_TOKENS))
    views = tuple(RequestView(f"r{i}", 0.0, 10, 4, 0) for i in range(8))
    assert any(d.k for d in policy.decide(BatchView(views)))  # the model alone would speculate
    for _ in range(SAMPLES):
        policy.observe_step(step(8, False, 8, 0.010))
        policy.observe_step(step(8, True, 10, 0.020))
    assert all(d.k == 0 for _ in range(20) for d in policy.decide(BatchView(views)))
    # for operators' stats (`PolicyController`'s ``plain_by_cause``): at 5-8 requests a loss is tried before it
    # rejects, and these are the trial's plain windows
    assert policy.plain_cause == "guard_trial"
    off_guard = AdaptivePolicy(PolicySettings(goodput_guard=False, verify_cost_coefficients=CHEAP_TOKENS),
                               policy.learned)
    assert any(d.k for d in off_guard.decide(BatchView(views)))


def test_the_guard_judges_a_ramping_batch_by_its_load() -> None:
    """Two decodes beside six prefilling requests are a batch of eight: its verdict applies, not batch 2's."""
    policy = AdaptivePolicy(PolicySettings(guard_probe_rate=0.0))
    for _ in range(SAMPLES):
        policy.observe_step(step(8, False, 8, 0.010))
        policy.observe_step(step(8, True, 10, 0.020))  # speculation loses at 5-8
    views = tuple(RequestView(f"r{i}", 0.0, 10, 4, 0) for i in range(2))
    assert any(d.k for d in policy.decide(BatchView(views)))
    ramping = BatchView(views, num_prefill_tokens=600, num_prefilling=6)
    assert ramping.load == 8
    assert all(d.k == 0 for _ in range(20) for d in policy.decide(ramping))


def joining(timing: StepTiming, num_prefilling: int, prompt_tokens: int = 150) -> StepTiming:
    """``timing`` with ``num_prefilling`` requests' prompts sharing the pass (and their first tokens emitted)."""
    return dataclasses.replace(timing, num_tokens=timing.num_tokens + num_prefilling * prompt_tokens,
                               num_prefill_tokens=num_prefilling * prompt_tokens, num_prefilling=num_prefilling,
                               num_generated=timing.num_generated + num_prefilling)


def test_steps_a_request_joins_are_measured_as_their_regime_runs_them() -> None:
    """Speculation whose steps without prefill win, but whose steps prompts join (the draft model catching up on
    them beside the target's prefill) lose more, loses: what clients get is the whole of it. The prompts' own
    cost, the same under plain decode, is taken off: what two joining prompts added to plain steps."""
    guard = GoodputGuard()
    for timing in [step(24, False, 24, 0.040), joining(step(24, False, 24, 0.078), 2)]:
        for _ in range(MIN_SAMPLES):  # plain steps, then what two joining prompts add to them
            guard.observe(timing)
    for _ in range(SURE):
        guard.observe(step(24, False, 24, 0.040))
        guard.observe(step(24, True, 52, 0.070))  # 1.24x plain on its own
        guard.observe(joining(step(24, True, 52, 0.210), 2))  # 0.83x the plain steps two prompts joined
    [bucket] = guard.summary()
    assert bucket["plain"]["steps"] == MIN_SAMPLES + SURE  # the joined steps are kept apart
    assert bucket["speculative"]["draft"]["T=0"]["steps"] == 2 * SURE
    # each joined step less what two prompts of 150 tokens add to a plain one (2 tokens, 38 ms): 52 tokens in 172 ms
    assert bucket["speculative"]["draft"]["T=0"]["vs_plain"] == pytest.approx(52 / 0.121 / (24 / 0.040), rel=0.02)
    assert "draft" not in guard.allowed_proposers(24, 0.0, random.Random(0), 0.0)


def test_a_joined_speculative_step_is_left_out_until_what_prompts_cost_plain_decode_is_known() -> None:
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(24, False, 24, 0.040))
        guard.observe(joining(step(24, True, 52, 0.5), 2))  # no plain step that prompts joined: nothing to take off
    assert guard.summary()[0]["speculative"] == {}


@pytest.mark.usefixtures("without_trials")
def test_steps_prompts_join_decode_plainly_until_what_joining_costs_is_measured() -> None:
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(24, False, 24, 0.040))
        guard.observe(step(24, True, 60, 0.050))  # speculation wins clearly
    rng = random.Random(0)
    assert not any(guard.allowed_proposers(24, 0.0, rng, 0.0, joining=1) for _ in range(100))
    assert guard.plain_reason == "joining"
    assert all(guard.allowed_proposers(24, 0.0, rng, 0.0) for _ in range(100))  # steps no prompt joins speculate
    for _ in range(MIN_SAMPLES - 1):
        guard.observe(joining(step(24, False, 24, 0.070), 1))
    assert not guard.allowed_proposers(24, 0.0, rng, 0.0, joining=1)
    guard.observe(joining(step(24, False, 24, 0.070), 1))
    assert all(guard.allowed_proposers(24, 0.0, rng, 0.0, joining=2) for _ in range(1000))  # known per prompt token
    assert not guard.allowed_proposers(8, 0.0, rng, 0.0, joining=1)  # another bucket: unknown


def test_what_joining_costs_is_looked_up_where_it_is_measured_at_the_decodes_batch_size() -> None:
    """At 2 clients a request joins beside one decoding: the step's load is 2 (bucket 1), its decodes 1 (bucket 0),
    and its plain time, prompts taken off, is measured at 1 request. Looked up at the load's bucket, which only
    steps with two requests decoding beside a join ever measure, such steps decoded plainly for good."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(1, False, 1, 0.010))
        guard.observe(step(2, False, 2, 0.011))
        guard.observe(step(2, True, 5, 0.016))  # speculation at 2 requests wins clearly
    rng = random.Random(0)
    assert not guard.allowed_proposers(2, 0.0, rng, 0.0, joining=1)  # 1 decoding + 1 joining: unknown yet
    for _ in range(MIN_SAMPLES):
        guard.observe(joining(step(1, False, 1, 0.030), 1))  # one request decoding while a prompt joins
    assert all(guard.allowed_proposers(2, 0.0, rng, 0.0, joining=1) for _ in range(100))


def test_a_burst_of_arriving_prompts_is_not_measured() -> None:
    guard = GoodputGuard()
    guard.observe(joining(step(8, False, 8, 0.4), 16, prompt_tokens=128))  # more join than 1 + a quarter of 8
    guard.observe(joining(step(8, True, 8, 0.4), 16))
    assert guard.summary() == []
    assert measures_step(8, 3) and not measures_step(8, 4) and measures_step(1, 1) and not measures_step(0, 1)


def test_the_cost_model_fits_no_step_shared_with_prefill() -> None:
    state = LearnedState()
    state.cost_model.observe(joining(step(8, False, 8, 0.05), 1))
    assert state.cost_model.fit_summary()["num_observations"] == 0
    state.cost_model.observe(step(8, False, 8, 0.01))
    assert state.cost_model.fit_summary()["num_observations"] == 1


def test_steps_the_guard_leaves_out_speculate_only_on_a_winning_verdict_and_never_probe() -> None:
    """Steps the guard leaves out (a burst of prompts arriving) speculate only on a winning verdict: a probe there
    would teach nothing, and would add the draft's prefill of the whole batch."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(8, False, 8, 0.010))
        guard.observe(step(8, True, 8, 0.0104))  # loses narrowly: probed at the full rate when measured
        guard.observe(step(2, False, 2, 0.010))
        guard.observe(step(2, True, 4, 0.010))  # wins at batch 2
    rng = random.Random(0)
    assert not any("draft" in guard.allowed_proposers(8, 0.0, rng, 1.0, measured=False) for _ in range(200))
    assert guard.allowed_proposers(2, 0.0, rng, 1.0, measured=False) == ALL_PROPOSERS
    assert not guard.allowed_proposers(1, 0.0, rng, 1.0, measured=False)  # untried: nothing to learn there


@pytest.mark.usefixtures("without_trials")
def test_unmeasured_plain_decode_is_judged_by_the_cost_model() -> None:
    """A batch size plain decode never ran at (requests desynchronised by speculation finishing one by one)
    compares speculation with the predicted plain rate instead of speculating at 1 - MEASURE_PLAIN_RATE."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(16, True, 16, 0.010))  # speculation at 1600 tokens/s, plain never measured
    assert plain_start_fraction(guard, 16, 0.0) == pytest.approx(MEASURE_PLAIN_RATE, abs=0.02)
    rng = random.Random(0)

    def fraction(estimate: float) -> float:
        guard.plain_estimate = lambda batch_size: batch_size / estimate  # plain step seconds at that rate
        draws = [guard.allowed_proposers(16, 0.0, rng, 0.0) for _ in range(2000)]
        return sum("draft" in allowed for allowed in draws) / len(draws)

    assert fraction(2000.0) == 0.0  # plain predicted faster: plain steps, which then measure it
    guard.plain_estimate = lambda batch_size: batch_size / 1200.0
    assert plain_start_fraction(guard, 16, 0.0) == pytest.approx(MEASURE_PLAIN_RATE, abs=0.02)  # speculation wins


@pytest.mark.usefixtures("without_trials")
def test_guard_rescues_a_cost_model_blind_to_part_of_the_step() -> None:
    """Host time per drafted token outside the timed passes, which the cost model never sees: without the
    guard the adaptive policy speculates at a loss; with it, it stays near plain decode."""
    cost = SimCost(untimed_per_draft_token=4e-4)
    # long enough for the fixed cost of learning (each route's first contact and the probe confirming its
    # rejection, at two temperature buckets, ~40 steps at 0.6-0.9x each, and for the draft route the draft
    # model's prefill of all 32 requests' contexts) to be what it is for a server, a small part of the run:
    # over 1200 steps it was 3-6% (seeds 0-4), over 2400 1.5-3.7%
    off = simulate(OffPolicy(), 32, 2400, cost).goodput
    unguarded = simulate(AdaptivePolicy(PolicySettings(goodput_guard=False)), 32, 2400, cost).goodput
    guarded = simulate(AdaptivePolicy(), 32, 2400, cost).goodput
    assert unguarded < 0.9 * off
    assert guarded >= 0.95 * off


def test_settings_validate_the_guard_fields() -> None:
    assert PolicySettings.from_dict({"goodput_guard": False, "guard_probe_rate": 0.1}).guard_probe_rate == 0.1
    with pytest.raises(PolicySettingsError, match="goodput_guard"):
        PolicySettings.from_dict({"goodput_guard": 1})
    with pytest.raises(PolicySettingsError, match="guard_probe_rate"):
        PolicySettings.from_dict({"guard_probe_rate": 1.5})


@pytest.mark.usefixtures("without_trials")
def test_a_probe_of_rejected_speculation_is_a_burst_of_steps() -> None:
    """A probe lasts until it has measured PROBE_BURST speculative steps (sustained speculation, not one step),
    beside the plan's plain steps, at most PROBE_LIMIT steps."""
    guard = GoodputGuard()
    for _ in range(SURE):
        guard.observe(step(8, False, 8, 0.010))
        guard.observe(step(8, True, 6, 0.010))  # speculation clearly loses: 600 tokens/s against 800
    rng = random.Random(1)
    allowed = []
    for i in range(8000):
        allowed.append("draft" in guard.allowed_proposers(8, 0.0, rng, 0.05))
        if allowed[-1]:  # the plan speculates in every other step of a burst
            guard.observe(step(8, i % 2 == 0, 6 if i % 2 == 0 else 8, 0.010))
    runs = "".join("s" if a else "." for a in allowed).split(".")
    # the draft's catch-up, then PROBE_BURST measured steps, every other one speculative
    assert {len(run) for run in runs if run} <= {2 * PROBE_BURST + 1, 2 * PROBE_BURST + 2}
    unmeasured = GoodputGuard()  # a burst in which the plan never speculates ends after PROBE_LIMIT steps
    for _ in range(SURE):
        unmeasured.observe(step(8, False, 8, 0.010))
        unmeasured.observe(step(8, True, 6, 0.010))
    while "draft" not in unmeasured.allowed_proposers(8, 0.0, rng, 1.0):
        pass
    assert sum("draft" in unmeasured.allowed_proposers(8, 0.0, rng, 0.0) for _ in range(100)) == PROBE_LIMIT - 1


@pytest.mark.usefixtures("without_trials")
def test_a_probe_does_not_measure_the_catch_up_its_rejection_caused() -> None:
    """Its first speculative step catches the draft model up on everything the requests decoded plainly while
    speculation was rejected: sunk by then, and a cost sustained speculation does not pay. Charged to 12 steps
    it made speculation that paid 1.2x look 0.85x (batch 4, T = 1), and the rejection stuck for three runs."""
    guard = GoodputGuard()
    for _ in range(SURE):
        guard.observe(step(4, False, 4, 0.010))  # plain: 400 tokens/s
        guard.observe(step(4, True, 6, 0.020))  # early speculation: 300 tokens/s
    rng = random.Random(0)
    while "draft" not in guard.allowed_proposers(4, 0.0, rng, 1.0):
        pass
    guard.observe(step(4, True, 10, 0.080))  # the catch-up: the draft model prefills every request's lag
    for _ in range(SAMPLES):
        guard.observe(step(4, True, 10, 0.020))  # 500 tokens/s
    assert guard.summary()[0]["speculative"]["draft"]["T=0"]["tokens_per_s"] == pytest.approx(500.0)


@pytest.mark.usefixtures("without_trials")
def test_a_rejection_no_probe_confirmed_is_probed_soon() -> None:
    """Sustained speculation can turn to a loss on a transient (four requests arriving at once make the draft
    model prefill four prompts in one step); such a rejection is probed at MAX_PROBE_BOOST times the rate, and
    at the usual rate once a probe measured the loss itself."""
    guard = GoodputGuard()
    for _ in range(SURE):
        guard.observe(step(8, False, 8, 0.010))
        guard.observe(step(8, True, 4, 0.010))  # speculation at half plain decode's rate: probed at 0.1 / 0.55
    rng = random.Random(0)
    waits = []
    for _ in range(2):
        wait = 0
        while "draft" not in guard.allowed_proposers(8, 0.0, rng, 0.05):
            wait += 1
        waits.append(wait)
        for _ in range(PROBE_BURST + 1):  # the probe: its catch-up step and PROBE_BURST measured ones
            guard.observe(step(8, True, 4, 0.010))
        while guard.probing(8, 0.0):
            guard.allowed_proposers(8, 0.0, rng, 0.05)
    assert waits[0] < PROBE_BURST / (0.05 * MAX_PROBE_BOOST) * 3  # ~60 steps, not ~1300
    assert waits[1] > waits[0]


@pytest.mark.usefixtures("without_trials")
def test_a_draft_probe_is_charged_what_its_burst_lost_catch_up_included() -> None:
    """A draft-route burst first makes the draft model catch up on what its requests decoded plainly, and each of
    its steps here emits 12 tokens in 1.5 plain steps' time (0.75 plain steps lost). Measured whole, a burst of
    13 steps loses 9.75 plain steps, its cost to the bar 10.35 (more than the 6.6 its figure prices it at: 12 steps
    x 0.55 short of the bar); where its catch-up step costs 6.6 plain steps more, 16.95, so bursts start 0.61
    times as often: the throughput that probing costs stays within its budget."""
    def bursts(catch_up_seconds: float) -> int:
        guard = GoodputGuard()
        for _ in range(SAMPLES):
            guard.observe(step(16, False, 16, 0.010))  # plain: 1600 tokens/s
            guard.observe(step(16, True, 12, 0.015))  # speculative: 800 tokens/s
        rng = random.Random(0)
        started = 0
        for _ in range(100_000):
            begins = not guard.probing(16, 0.0)
            if "draft" in guard.allowed_proposers(16, 0.0, rng, 0.05):
                started += begins
                guard.observe(step(16, True, 12, catch_up_seconds if begins else 0.015))
        return started

    cheap, dear = bursts(0.015), bursts(0.015 + 0.066)
    assert cheap > 20
    assert dear / cheap == pytest.approx(10.35 / 16.95, abs=0.1)


@pytest.mark.usefixtures("without_trials")
def test_a_probe_burst_is_measured_whole_against_plain_decode() -> None:
    """Every step of a burst counts against plain decode, in plain steps lost (seconds over a plain step's, less
    tokens over the batch's): its catch-up, the speculative steps it measures, and a plain step in between
    (which loses nothing). What it lost is kept per route, an average over bursts, and reported."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(16, False, 16, 0.010))  # plain: 1600 tokens/s
        guard.observe(step(16, True, 12, 0.015))  # speculative: 800 tokens/s, rejected
    rng = random.Random(0)
    while "draft" not in guard.allowed_proposers(16, 0.0, rng, 1.0):  # until a burst begins
        guard.observe(step(16, False, 16, 0.010))
    guard.observe(step(16, True, 12, 0.025))  # its catch-up: 2.5 - 0.75 = 1.75 plain steps lost
    guard.observe(step(16, False, 16, 0.010))  # a plain step inside the burst: nothing lost
    for _ in range(PROBE_BURST):  # 0.75 plain steps lost each
        guard.observe(step(16, True, 12, 0.015))
    [bucket] = guard.summary()
    assert bucket["speculative"]["draft"]["T=0"]["probe_burst_loss"] == pytest.approx(1.75 + PROBE_BURST * 0.75)


def test_fixed_policies_do_not_feed_the_guard_but_plain_decode_does() -> None:
    guard = GoodputGuard()
    FixedPolicy(PolicySettings(mode="draft", k=4), LearnedState(guard=guard)).observe_step(step(8, True, 8, 0.02))
    assert guard.summary() == []
    OffPolicy(learned=LearnedState(guard=guard)).observe_step(step(8, False, 8, 0.01))
    assert guard.summary()[0]["plain"]["steps"] == 1


def test_an_untried_batch_size_starts_from_the_verdict_of_smaller_batches() -> None:
    """Extra tokens only get dearer as the batch grows: where speculation lost at 16, 32 starts rejected."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(16, False, 16, 0.010))  # plain: 1600 tokens/s
        guard.observe(step(16, True, 12, 0.015))  # speculative: 800 tokens/s
        guard.observe(step(2, False, 2, 0.004))  # plain: 500 tokens/s
        guard.observe(step(2, True, 6, 0.006))  # speculative: 1000 tokens/s
    # bursts of probes only; the plan never speculates in them here, so each lasts PROBE_LIMIT steps
    assert allowed_fraction(guard, 32, 0.05) == pytest.approx(burst_fraction(0.05, PROBE_LIMIT), abs=0.04)
    assert allowed_fraction(guard, 32, 0.05, temperature=1.0) == 1.0  # nothing known at T=1 anywhere
    assert allowed_fraction(guard, 4, 0.05) == 1.0  # the nearest smaller verdict (batch 2) speculates
    for _ in range(SAMPLES + 1):  # (the first may be a probe's catch-up step, which is not measured)
        guard.observe(step(32, True, 96, 0.02))  # speculation measured at 32 itself, and it pays
        guard.observe(step(32, False, 32, 0.02))
    assert 0.95 < allowed_fraction(guard, 32, 0.05, plain=step(32, False, 32, 0.02)) < 1.0


def test_an_untried_temperature_inherits_no_verdict_from_lower_temperatures() -> None:
    """Acceptance need not fall as T rises (rejection sampling accepts where the distributions overlap):
    where greedy speculation lost at 16, T = 0.7 is still tried; a smaller batch's loss at T = 0.7 does pass on."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(16, False, 16, 0.010))
        guard.observe(step(16, True, 12, 0.015), temperature=0.0)  # loses
        guard.observe(step(1, False, 1, 0.004))
        guard.observe(step(1, True, 3, 0.006), temperature=0.7)  # wins
    assert allowed_fraction(guard, 16, 0.05, temperature=0.7) == 1.0
    lost = step(16, True, 12, 0.015)  # what a probe measures: it lost clearly, rare bursts of probes
    assert allowed_fraction(guard, 16, 0.05, temperature=0.0, speculative=lost) < 0.05
    for _ in range(SAMPLES):
        guard.observe(step(8, False, 8, 0.010))
        guard.observe(step(8, True, 6, 0.015), temperature=0.7)  # loses at 8, T = 0.7
    probed = burst_fraction(0.05, PROBE_LIMIT)  # in bursts that the plan, here, never speculates in
    assert allowed_fraction(guard, 16, 0.05, temperature=0.7) == pytest.approx(probed, abs=0.04)


@pytest.mark.usefixtures("without_trials")
def test_n_gram_speculation_is_judged_apart_from_the_draft_model() -> None:
    """At a large batch the draft model's passes stop paying before free n-gram proposals do."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(32, False, 32, 0.010))  # plain: 3200 tokens/s
        guard.observe(step(32, True, 40, 0.020))  # draft route: 2000 tokens/s
    # the draft route lost; n-gram speculation alone is untried here: it may run
    assert allowed_fraction(guard, 32, 0.0, proposer="ngram") == 1.0
    assert allowed_fraction(guard, 32, 0.0, proposer="draft") == 0.0
    for _ in range(SAMPLES):
        guard.observe(step(32, True, 44, 0.011, route="ngram"))  # 4000 tokens/s
    assert 0.95 < allowed_fraction(guard, 32, 0.05, proposer="ngram", plain=step(32, False, 32, 0.010)) < 1.0
    lost = step(32, True, 40, 0.020)  # what a probe of the draft route measures: it lost again
    assert allowed_fraction(guard, 32, 0.05, proposer="draft", speculative=lost) < 0.05  # bursts of probes only
    for _ in range(40):
        guard.observe(step(32, True, 30, 0.011, route="ngram"))  # n-gram lookups stop paying too
    lost = step(32, True, 30, 0.011, route="ngram")  # measured again at once, and lost again
    assert allowed_fraction(guard, 32, 0.0, proposer="ngram", speculative=lost,
                            plain=step(32, False, 32, 0.010)) == PROBE_BURST / 4000
    assert allowed_fraction(guard, 32, 0.0, proposer="ngram") == 0.0


@pytest.mark.usefixtures("without_trials")
def test_from_9_requests_the_draft_route_must_beat_n_gram_lookups_alone_where_they_win() -> None:
    """From 9 requests on, where n-gram lookups alone win, the draft model's steps must beat them, not just plain
    decode: a draft route that ran a little above plain decode but below n-gram lookups alone held speculation to its
    pace. Below 9 requests a route's figure depends too much on which steps the plan gave it (at one code client, the
    n-gram route's long matches read 2.36x plain decode and vetoed a draft model that ran 1.43x `off` alone)."""
    guard, rng = GoodputGuard(), random.Random(0)
    for batch in (8, 32):
        for _ in range(SURE):
            guard.observe(step(batch, False, batch, 0.010))  # plain: 100 tokens/s per request
            guard.observe(step(batch, True, batch * 19 // 16, 0.010))  # the draft route: 1.19x plain decode
        assert guard.allowed_proposers(batch, 0.0, rng, 0.0) == ALL_PROPOSERS  # n-gram lookups alone are untried
        for _ in range(SAMPLES):
            guard.observe(step(batch, True, batch * 22 // 16, 0.010, route="ngram"))  # 1.38x plain decode
    by_bucket = {bucket["batch_sizes"][0]: bucket for bucket in guard.summary()}
    assert by_bucket[17]["speculative"]["draft"]["T=0"]["vs_plain"] == pytest.approx(1.1875)  # reported as it ran
    # at 32 it lost to n-gram lookups alone: a win that fell, measured again at once (one burst), then rejected ...
    assert allowed_fraction(guard, 32, 0.0, proposer="draft") <= PROBE_LIMIT / 4000
    assert allowed_fraction(guard, 32, 0.0, proposer="ngram") == 1.0  # ... which propose alone
    assert allowed_fraction(guard, 8, 0.0, proposer="draft") == 1.0  # at 8 plain decode is the bar
    for _ in range(100):
        guard.observe(step(32, True, 30, 0.010, route="ngram"))  # n-gram lookups stop paying: plain decode is the bar
    assert guard._judge(batch_bucket(32), 0, "draft")[1] == pytest.approx(1.1875)


@pytest.mark.usefixtures("without_trials")
def test_an_untried_draft_route_does_not_let_the_plan_run_a_rejected_n_gram_route() -> None:
    """Where the plan has not used the draft model yet, the steps it makes n-gram-only are n-gram route steps:
    if that route lost here, only the draft model may propose (in the sweep, 40% of the steps at 17-32
    requests ran n-gram-only at 0.93x plain decode this way)."""
    guard = GoodputGuard()
    for _ in range(SURE):
        guard.observe(step(32, False, 32, 0.010))  # plain: 3200 tokens/s
        guard.observe(step(32, True, 34, 0.012, route="ngram"))  # n-gram only: 2833 tokens/s, rejected
    rng = random.Random(0)
    assert all(guard.allowed_proposers(32, 0.0, rng, 0.0) == DRAFT_ONLY for _ in range(100))
    winning = GoodputGuard()  # where the n-gram route wins, the plan may mix both
    for _ in range(SAMPLES):
        winning.observe(step(32, False, 32, 0.010))
        winning.observe(step(32, True, 40, 0.010, route="ngram"))  # 4000 tokens/s
    assert winning.allowed_proposers(32, 0.0, rng, 0.0) == ALL_PROPOSERS


@pytest.mark.usefixtures("without_trials")
def test_adaptive_policy_speculates_with_n_grams_only_where_the_draft_model_lost() -> None:
    policy = AdaptivePolicy(PolicySettings(guard_probe_rate=0.0, verify_cost_coefficients=CHEAP_TOKENS))
    for _ in range(SAMPLES):
        policy.observe_step(step(8, False, 8, 0.010))
        policy.observe_step(step(8, True, 10, 0.020))  # the draft route loses at 5-8
    views = tuple(RequestView(f"r{i}", 0.0, 10, 4, ngram_match_len=6) for i in range(8))
    decisions = [d for _ in range(20) for d in policy.decide(BatchView(views))]
    assert any(d.k for d in decisions)
    assert all(d.proposer == "ngram" for d in decisions if d.k)


def test_speculation_gets_no_verdict_before_a_burst_of_steps() -> None:
    """Judged on three steps, one of them the draft's lazy prefill, speculation looked slower than plain
    decode and, having clearly lost, was hardly ever probed again."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(1, False, 1, 0.005))  # plain: 200 tokens/s
    guard.observe(step(1, True, 2, 0.030))  # the first speculative step prefills the draft model
    for _ in range(2):
        guard.observe(step(1, True, 2, 0.008))
    assert allowed_fraction(guard, 1, 0.05) == 1.0  # no verdict yet
    for _ in range(SAMPLES - 3):
        guard.observe(step(1, True, 3, 0.009))
    assert 0.95 < allowed_fraction(guard, 1, 0.05, plain=step(1, False, 1, 0.005)) < 1.0  # ~260 tokens/s: speculate


def test_the_switch_into_speculation_is_left_out_of_its_first_figure() -> None:
    """At a cold start the first speculative step at a batch size makes the draft model prefill every request's
    context (at 8 code requests: 1043 tokens, 32.8 ms beside 11-16 ms): a cost of the switch, sunk as a probe's
    first step is, not of sustained speculation. Counted, it pulled a first figure from 0.95x to 0.88x."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(8, False, 8, 0.006))  # plain: 1333 tokens/s
    fed = step(8, True, 18, 0.033)
    switch = StepTiming(8, fed.num_tokens, 0.033, fed.num_draft_tokens, step_seconds=0.033, num_generated=18,
                        num_draft_catch_up_tokens=1043)
    guard.observe(switch)
    for _ in range(SAMPLES):
        guard.observe(step(8, True, 19, 0.0135))  # sustained: 1407 tokens/s
    figure = guard.summary()[0]["speculative"]["draft"]["T=0"]
    assert figure["steps"] == SAMPLES
    assert figure["vs_plain"] == pytest.approx(19 / 0.0135 / (8 / 0.006))
    guard.observe(switch)  # later steps count whatever the draft model caught up on in them
    assert guard.summary()[0]["speculative"]["draft"]["T=0"]["steps"] == SAMPLES + 1


@pytest.mark.usefixtures("without_trials")
def test_a_near_miss_rejects_speculation_only_on_more_steps() -> None:
    """Twelve steps, one of them the switch from plain decode, cannot tell 0.95x from 1.1x: a first contact at
    batch 4 measured 0.94x and decoded plainly for two runs while speculation was 1.2x faster."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(4, False, 4, 0.010))  # plain: 400 tokens/s
    guard.observe(step(4, True, 4, 0.040))  # the switch: the draft model catches up on every request
    for _ in range(SAMPLES - 1):
        guard.observe(step(4, True, 9, 0.020))
    assert NEAR_MISS < guard.summary()[0]["speculative"]["draft"]["T=0"]["vs_plain"] < 1.0
    assert allowed_fraction(guard, 4, 0.0) == 1.0  # a near miss on too few steps: it keeps speculating
    for _ in range(SURE - SAMPLES):
        guard.observe(step(4, True, 9, 0.020))  # 450 tokens/s: over the bar once the switch is diluted
    assert allowed_fraction(guard, 4, 0.0) == 1.0
    for _ in range(SURE):
        guard.observe(step(4, True, 6, 0.016))  # 375 tokens/s, below break-even on enough steps
    lost, plain = step(4, True, 6, 0.016), step(4, False, 4, 0.010)  # a fallen win: measured again, then rejected
    # (the draft's catch-up, then a near miss again: on SURE steps)
    assert allowed_fraction(guard, 4, 0.0, speculative=lost, plain=plain) == (SURE + 1) / 4000
    assert allowed_fraction(guard, 4, 0.0) == 0.0
    bad = GoodputGuard()
    for _ in range(SAMPLES):
        bad.observe(step(4, False, 4, 0.010))
        bad.observe(step(4, True, 6, 0.020))  # 300 tokens/s: no near miss, rejected on the first burst
    assert allowed_fraction(bad, 4, 0.0) == 0.0


@pytest.mark.usefixtures("without_trials")
def test_winning_speculation_is_rejected_only_below_break_even() -> None:
    """Speculation must beat plain decode by REQUIRED_GAIN to be taken up, but once taken it is kept down to
    break-even: at 8 code requests, T = 0.7, sustained speculation read 0.97-1.15x plain decode around ~1.1x,
    dipped under the 5% bar sooner or later, and the rejection, dear to probe there, stuck for runs."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(8, False, 8, 0.006))  # plain: 1333 tokens/s
    for _ in range(SAMPLES):
        guard.observe(step(8, True, 18, 0.0125))  # 1440 tokens/s: 1.08x
    assert allowed_fraction(guard, 8, 0.0) == 1.0
    for _ in range(3 * SURE):
        guard.observe(step(8, True, 17, 0.0125))  # 1360 tokens/s: 1.02x, under the bar to take it up, kept
    assert allowed_fraction(guard, 8, 0.0) == 1.0
    for _ in range(3 * SURE):
        guard.observe(step(8, True, 16, 0.0125))  # 1280 tokens/s: 0.96x, it loses
    # measured again at once (a plain step, the draft's catch-up, a fresh figure: a near miss, so SURE steps)
    lost, plain = step(8, True, 16, 0.0125), step(8, False, 8, 0.006)
    assert allowed_fraction(guard, 8, 0.0, speculative=lost, plain=plain) == (SURE + 1) / 4000
    assert allowed_fraction(guard, 8, 0.0) == 0.0
    for _ in range(SAMPLES):
        guard.observe(step(8, False, 8, 0.006))
    rng = random.Random(0)
    while "draft" not in guard.allowed_proposers(8, 0.0, rng, 1.0):  # a probe burst
        pass
    for _ in range(SURE + 1):  # its figure, at 1.02x on enough steps, must clear the bar again to be taken up
        guard.observe(step(8, True, 17, 0.0125))
    assert allowed_fraction(guard, 8, 0.0) == 0.0


@pytest.mark.usefixtures("without_trials")
def test_a_win_that_falls_is_measured_again_at_once_before_it_is_rejected() -> None:
    """A winning figure that falls under break-even takes a plain step (plain decode as it runs now), then a burst
    that measures speculation afresh: at 8 prose requests, T = 1, a figure fell from 1.23x plain decode to 0.99x,
    and its rejection stood for ~200 steps while fixed draft k = 2 ran 1.1x ``off``."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(8, False, 8, 0.010))  # plain: 800 tokens/s
        guard.observe(step(8, True, 12, 0.010))  # 1.5x
    rng = random.Random(0)
    assert "draft" in guard.allowed_proposers(8, 0.0, rng, 0.0)
    for _ in range(3 * SAMPLES):
        guard.observe(step(8, True, 7, 0.010))  # falls to 0.875x
    assert "draft" not in guard.allowed_proposers(8, 0.0, rng, 0.0)  # a plain step first, held until measured
    assert "draft" not in guard.allowed_proposers(8, 0.0, rng, 0.0)
    guard.observe(step(8, False, 8, 0.010))
    for _ in range(SAMPLES + 1):  # the burst: its first step, the draft's catch-up, is not measured
        assert "draft" in guard.allowed_proposers(8, 0.0, rng, 0.0)
        guard.observe(step(8, True, 10, 0.010))  # 1.25x: it wins again
    assert allowed_fraction(guard, 8, 0.0) == 1.0


@pytest.mark.usefixtures("without_trials")
def test_a_probe_measures_speculation_afresh() -> None:
    """Speculation rejected on its early steps (short drafts from a cautious prior) is re-judged on the
    probe's own steps, not on an average that still holds the old ones."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(4, False, 4, 0.010))  # plain: 400 tokens/s
        guard.observe(step(4, True, 4, 0.020))  # early speculation: 200 tokens/s
    assert allowed_fraction(guard, 4, 0.0) == 0.0
    rng = random.Random(0)
    while "draft" not in guard.allowed_proposers(4, 0.0, rng, 1.0):  # wait for a probe burst
        pass
    for _ in range(SAMPLES + 1):  # its first step, the draft's catch-up, is not measured
        guard.observe(step(4, True, 10, 0.016))  # speculation now: 625 tokens/s
    assert allowed_fraction(guard, 4, 0.0) == 1.0


@pytest.mark.usefixtures("without_trials")
def test_a_rejection_is_measured_again_once_plain_decode_changed_pace() -> None:
    """Rejected speculation measured under other traffic (plain steps then took 10 ms) is probed at once when
    plain decode runs over REGIME_SHIFT faster or slower, not judged by its stale figure against fresh plain steps."""
    guard = GoodputGuard()
    for _ in range(SURE):
        guard.observe(step(4, False, 4, 0.010))  # plain: 400 tokens/s
        guard.observe(step(4, True, 5, 0.020))  # speculation: 250 tokens/s
    assert allowed_fraction(guard, 4, 0.0) == 0.0
    for _ in range(40):  # plain steps at the new pace; a small drift alone does not reopen the verdict
        guard.observe(step(4, False, 4, 0.010 * (1.0 - REGIME_SHIFT / 2)))
    assert allowed_fraction(guard, 4, 0.0) == 0.0
    for _ in range(40):
        guard.observe(step(4, False, 4, 0.0075))  # a third faster: the traffic changed
    rng = random.Random(0)
    assert all("draft" in guard.allowed_proposers(4, 0.0, rng, 0.0) for _ in range(PROBE_BURST))
    for _ in range(SAMPLES + 1):
        guard.observe(step(4, True, 12, 0.016))  # speculation under the new traffic: 750 tokens/s
    assert allowed_fraction(guard, 4, 0.0) == 1.0


@pytest.mark.usefixtures("without_trials")
def test_a_change_of_pace_reopens_a_rejection_for_one_burst() -> None:
    """A burst that measured nothing (the plan, say, never used the draft model there) does not start another at
    once: the rejection stands again until plain decode's pace moves once more."""
    guard = GoodputGuard()
    for _ in range(SURE):
        guard.observe(step(4, False, 4, 0.010))  # plain: 400 tokens/s
        guard.observe(step(4, True, 5, 0.020))  # speculation: 250 tokens/s
    for _ in range(40):
        guard.observe(step(4, False, 4, 0.0075))  # a third faster: the traffic changed
    rng = random.Random(0)
    assert all("draft" in guard.allowed_proposers(4, 0.0, rng, 0.0) for _ in range(PROBE_LIMIT))
    assert allowed_fraction(guard, 4, 0.0) == 0.0  # no speculative step came: rejected again, not re-probed
    for _ in range(80):
        guard.observe(step(4, False, 4, 0.010))  # back to the old pace: a change again
    assert all("draft" in guard.allowed_proposers(4, 0.0, rng, 0.0) for _ in range(PROBE_BURST))


def test_speculation_is_judged_against_plain_decode_as_it_ran_beside_it() -> None:
    """A machine's pace drifts: rejected speculation, 0.97x the plain steps beside it, is not called a win once
    plain decode slows by 9% (under REGIME_SHIFT) while speculation is no longer measured, nor winning
    speculation a loss once plain decode speeds up."""
    rejected = GoodputGuard()
    for _ in range(SURE):
        rejected.observe(step(16, False, 16, 0.010))  # plain: 1600 tokens/s
        rejected.observe(step(16, True, 24, 0.01546))  # speculation: 1552 tokens/s, 0.97x
    for _ in range(80):
        rejected.observe(step(16, False, 16, 0.0109))  # plain decode slows: 1468 tokens/s
    assert allowed_fraction(rejected, 16, 0.0) == 0.0
    [row] = rejected.summary()
    assert row["speculative"]["draft"]["T=0"]["vs_plain"] == pytest.approx(0.97, abs=0.005)
    winning = GoodputGuard()
    for _ in range(SURE):
        winning.observe(step(16, False, 16, 0.010))
        winning.observe(step(16, True, 28, 0.0159))  # 1761 tokens/s, 1.1x
    for _ in range(80):
        winning.observe(step(16, False, 16, 0.0092))  # plain decode speeds up by 9%
    assert allowed_fraction(winning, 16, 0.0) > 0.9


def test_learned_state_gives_the_guard_the_cost_model_plain_step_time() -> None:
    learned = LearnedState()
    for _ in range(8):
        learned.cost_model.observe(step(16, False, 16, 0.010))
    assert learned.guard.plain_estimate is not None
    assert learned.guard.plain_estimate(16) == pytest.approx(0.010, rel=0.05)


def plain_seconds(batch_size: int) -> float:
    """A plain step's time that grows with the batch more slowly than its tokens: rates differ inside a bucket."""
    return 0.012 + 0.001 * batch_size


def test_speculation_is_compared_with_plain_decode_at_its_own_batch_sizes() -> None:
    """Plain steps of bucket 9-16 came from a run's draining tail (9-12 requests), speculation ran at 16: plain
    decode at 16 is faster than the bucket's plain average, and that is the bar speculation must clear."""
    guard = GoodputGuard()
    for size in (9, 10, 11, 12, 16):
        for _ in range(5 if size < 16 else 3):
            guard.observe(step(size, False, size, plain_seconds(size)))  # plain at 16: 571 tokens/s
    for _ in range(SURE):
        guard.observe(step(16, True, 17, 0.030))  # 567 tokens/s: beats the tail's ~440, not plain at 16
    assert allowed_fraction(guard, 16, 0.0) == 0.0
    [row] = guard.summary()
    assert row["speculative"]["draft"]["T=0"]["vs_plain"] == pytest.approx(567 / 571, rel=0.01)


@pytest.mark.usefixtures("without_trials")
def test_unmeasured_batch_sizes_take_the_cost_model_corrected_by_measured_ones() -> None:
    """Plain measured only at 9, 20% slower than the model predicts: at 16 the model's time is taken 20% slower."""
    guard = GoodputGuard(plain_estimate=plain_seconds)
    for _ in range(3):
        guard.observe(step(9, False, 9, 1.2 * plain_seconds(9)))
    for _ in range(SURE):
        guard.observe(step(16, True, 16, 0.0325))  # 492 tokens/s vs plain's 16 / (1.2 x 28 ms) = 476: not 5% more
    assert allowed_fraction(guard, 16, 0.0) == 0.0
    for _ in range(SAMPLES):
        guard.observe(step(16, True, 17, 0.030))  # 567 tokens/s: 19% more
    assert allowed_fraction(guard, 16, 0.0) == 1.0


def test_plain_decode_measured_late_may_reject_a_figure_paired_with_stand_ins_but_not_take_it_up() -> None:
    """A first figure at 32 requests ran beside the cost model's stand-ins and read 1.045x, under its bar. Plain
    decode's first three samples there, one of them slow, then read it 1.08x with no speculative step in between:
    not a take-up. A probe, its steps paired with measured plain decode, takes a true win up."""
    guard = GoodputGuard(plain_estimate=lambda batch_size: batch_size / 1000.0)  # plain: 1000 tokens/s
    for _ in range(SURE):
        guard.observe(step(32, True, 33.44, 0.032))  # 1045 tokens/s
    for seconds in (0.0314, 0.0298, 0.0383):
        guard.observe(step(32, False, 32, seconds))  # 965 tokens/s
    assert allowed_fraction(guard, 32, 0.0) == 0.0
    [row] = guard.summary()
    assert row["speculative"]["draft"]["T=0"]["vs_plain"] == pytest.approx(1045 / 965, rel=0.01)
    win = step(32, True, 35.2, 0.032)  # 1100 tokens/s: 1.14x plain decode as measured
    assert allowed_fraction(guard, 32, 0.05, speculative=win, plain=step(32, False, 32, 0.0332)) > 0.9


@pytest.mark.usefixtures("without_trials")
def test_the_evidence_on_speculation_the_plan_may_be_overruled_by() -> None:
    """The draft route's measurements: untried (and not lost at a smaller batch) or a near miss on too few
    steps ask for measurement; a winning verdict says it wins; a settled loss says nothing."""
    guard = GoodputGuard()
    assert guard.speculation_evidence(8, 0.0) == "measure"  # untried
    for _ in range(SAMPLES):
        guard.observe(step(8, False, 8, 0.010))  # plain: 800 tokens/s
        guard.observe(step(8, True, 12, 0.010))  # speculation: 1200 tokens/s
    assert guard.speculation_evidence(8, 0.0) == "wins"
    assert guard.speculation_evidence(8, 1.0) == "measure"  # nothing measured at T = 1
    near = GoodputGuard()
    for _ in range(SAMPLES):
        near.observe(step(8, False, 8, 0.010))
        near.observe(step(8, True, 8, 0.0104))  # 0.96x plain decode on 12 steps: a near miss, measure more
    assert near.speculation_evidence(8, 0.0) == "measure"
    for _ in range(SURE):
        near.observe(step(8, True, 8, 0.0104))  # settled: rejected
    assert near.speculation_evidence(8, 0.0) is None
    assert near.speculation_evidence(16, 0.0) is None  # lost at a smaller batch: a larger one starts rejected
    rng = random.Random(0)
    while not near.probing(8, 0.0):  # a probe burst measures it again
        near.allowed_proposers(8, 0.0, rng, 1.0)
    assert near.speculation_evidence(8, 0.0) == "measure"


def test_a_first_figure_once_begun_and_a_near_miss_are_measured_whatever_the_model_says() -> None:
    """A draft route's first figure that has begun (its switch taken, fewer than 12 steps) and a near miss short of
    its sure verdict must be measured on: the model may not decline them. Untried, or settled, it may."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(8, False, 8, 0.010))
    assert guard.decline_measurement(8, 0.0)  # untried, not begun: the model's word stands
    guard.observe(dataclasses.replace(step(8, True, 20, 0.040), num_draft_catch_up_tokens=400))  # the switch
    assert not guard.decline_measurement(8, 0.0)
    for _ in range(SAMPLES):
        guard.observe(step(8, True, 8, 0.0104))  # 0.96x plain decode: a near miss, measured on to a sure verdict
        assert not guard.decline_measurement(8, 0.0)
    for _ in range(SURE - SAMPLES - 1):
        guard.observe(step(8, True, 8, 0.0104))
    assert not guard.decline_measurement(8, 0.0)
    guard.observe(step(8, True, 8, 0.0104))  # settled: rejected
    assert guard.decline_measurement(8, 0.0)
    assert guard.decline_measurement(8, 1.0)  # untried at T = 1


def test_a_begun_first_figure_binds_only_while_the_batch_stays_at_its_bucket() -> None:
    """A draining batch passes a bucket in a few steps: a first figure begun there and left short binds the plan
    only until the batch leaves the bucket. Back there, the draft model has new requests to catch up on (a new
    switch, which the plan may decline); once the plan speculates there again, the figure binds again."""
    guard = GoodputGuard()
    for _ in range(SAMPLES):
        guard.observe(step(8, False, 8, 0.010))
    guard.observe(dataclasses.replace(step(8, True, 20, 0.040), num_draft_catch_up_tokens=400))  # the switch
    guard.observe(step(6, True, 12, 0.009))  # still the 5-8 bucket
    assert not guard.decline_measurement(8, 0.0)
    guard.observe(step(4, True, 8, 0.007))  # the batch drained on
    guard.observe(step(8, False, 8, 0.010))  # ... and came back, decoding plainly
    assert guard.decline_measurement(8, 0.0) and not guard.measuring_draft(8, 0.0)
    guard.observe(step(8, True, 16, 0.011))  # the plan speculated there again
    assert not guard.decline_measurement(8, 0.0) and guard.measuring_draft(8, 0.0)


@pytest.mark.usefixtures("without_trials")
def test_a_declined_probe_ends_only_before_its_first_speculative_step() -> None:
    """The plan may decline a probe burst (its model predicts speculation far below plain decode): one that has
    not speculated yet ends unmeasured; one whose draft model already caught up goes on measuring. A rejection's
    first burst, its confirming probe, may not be declined."""
    guard = GoodputGuard()
    for _ in range(SURE):
        guard.observe(step(8, False, 8, 0.010))
        guard.observe(step(8, True, 6, 0.010))  # speculation clearly loses: 600 tokens/s against 800
    rng = random.Random(0)
    while "draft" not in guard.allowed_proposers(8, 0.0, rng, 1.0):
        pass
    assert not guard.decline_measurement(8, 0.0)  # the rejection's first burst: the plan must speculate in it
    assert guard.probing(8, 0.0)
    for _ in range(SAMPLES + 1):  # its catch-up and its measured steps: it loses again, the rejection stands
        guard.observe(step(8, True, 6, 0.010))
    assert not guard.probing(8, 0.0)
    while "draft" not in guard.allowed_proposers(8, 0.0, rng, 1.0):
        pass
    assert guard.decline_measurement(8, 0.0)
    assert not guard.probing(8, 0.0)
    assert "draft" not in guard.allowed_proposers(8, 0.0, rng, 0.0)
    while "draft" not in guard.allowed_proposers(8, 0.0, rng, 1.0):
        pass
    guard.observe(step(8, True, 6, 0.030))  # the draft model's catch-up: the burst has begun
    guard.decline_measurement(8, 0.0)
    assert guard.probing(8, 0.0)


def rejected_at_4() -> GoodputGuard:
    """A guard where draft speculation lost at 4 requests and 8 requests ran only plain steps."""
    guard = GoodputGuard()
    for _ in range(SURE):
        guard.observe(step(4, False, 4, 0.010))
        guard.observe(step(4, True, 3, 0.010))  # speculation loses at 4
        guard.observe(step(8, False, 8, 0.010))
    return guard


@pytest.mark.usefixtures("without_trials")
def test_an_inherited_rejection_is_measured_before_the_plan_may_decline_its_probes() -> None:
    """An untried bucket inherits a rejection from a smaller one; a model declining its probes is no evidence, so
    its bursts may not be declined until one has measured the bucket (a noisy loss at 4 code requests, T = 1,
    once kept 5-8 requests plain for four runs while fixed draft k = 2 ran 1.07x faster)."""
    rng = random.Random(0)
    for measured, taken_up in ((step(8, True, 6, 0.010), False), (step(8, True, 16, 0.010), True)):
        guard = rejected_at_4()
        while "draft" not in guard.allowed_proposers(8, 0.0, rng, 1.0):  # inherited: bursts of probes only
            pass
        assert not guard.decline_measurement(8, 0.0)  # the plan must speculate in it
        assert guard.measuring_draft(8, 0.0)
        for _ in range(SAMPLES + 1):  # its catch-up and its measured steps
            guard.observe(measured)
        assert not guard.probing(8, 0.0)
        if taken_up:  # it won at 8: speculation is taken up
            assert 0.95 < allowed_fraction(guard, 8, 0.05, plain=step(8, False, 8, 0.010)) < 1.0
        else:  # it lost at 8 too: a rejection of its own, probed, whose next burst the plan may decline
            while "draft" not in guard.allowed_proposers(8, 0.0, rng, 1.0):
                pass
            assert guard.decline_measurement(8, 0.0)


def winning_at_32() -> GoodputGuard:
    """A guard whose draft speculation at 32 requests wins: 3200 tokens/s against plain decode's 1600."""
    guard = GoodputGuard()
    for _ in range(SURE):
        guard.observe(step(32, False, 32, 0.020))
        guard.observe(step(32, True, 64, 0.020))
    return guard


@pytest.mark.usefixtures("without_trials")
def test_a_plain_probe_holds_until_a_plain_step_without_joining_prompts_measures_it() -> None:
    """At many requests some request finishes in nearly every speculative step and a prompt joins the next: a
    single plain probe landed on such steps, which the plain arm leaves out, and winning speculation was judged
    against a plain figure from another cell for runs."""
    guard, rng = winning_at_32(), random.Random(0)
    while guard.allowed_proposers(32, 0.0, rng, 1.0):  # until a plain probe
        pass
    for _ in range(3):  # its steps are joined: unmeasured, so it holds, whatever the probe rate
        guard.observe(joining(step(32, False, 32, 0.030), 1))
        assert not guard.allowed_proposers(32, 0.0, rng, 0.0)
    guard.observe(step(32, False, 32, 0.020))  # measured: the probe ends
    assert "draft" in guard.allowed_proposers(32, 0.0, rng, 0.0)
    fresh = winning_at_32()
    while fresh.allowed_proposers(32, 0.0, rng, 1.0):
        pass
    for _ in range(PROBE_LIMIT - 1):  # never measured: it ends after PROBE_LIMIT steps
        assert not fresh.allowed_proposers(32, 0.0, rng, 0.0)
    assert "draft" in fresh.allowed_proposers(32, 0.0, rng, 0.0)


@pytest.mark.usefixtures("without_trials")
def test_a_waiting_plain_probe_lets_steps_prompts_join_speculate_while_what_they_cost_is_fresh() -> None:
    """A plain step that prompts join measures only what they cost, not plain decode: while that is fresh, such
    steps speculate and the probe waits for a step without them (at 32 code clients, a third of the plain probes'
    steps were joined ones, ~10% slower each than speculating); once it is FRESH_SECONDS old, they decode plainly."""
    guard, rng = winning_at_32(), random.Random(0)
    for _ in range(MIN_SAMPLES):
        guard.observe(joining(step(32, False, 32, 0.030), 1))  # what a joining prompt costs: measured, fresh
    while guard.allowed_proposers(32, 0.0, rng, 1.0):  # until a plain probe
        pass
    for _ in range(3):  # the probe waits: joined steps speculate
        assert "draft" in guard.allowed_proposers(32, 0.0, rng, 0.0, joining=1)
        guard.observe(joining(step(32, True, 64, 0.030), 1))
    assert not guard.allowed_proposers(32, 0.0, rng, 0.0)  # a step without joins decodes plainly: the probe lands
    guard.observe(step(32, False, 32, 0.020))
    assert "draft" in guard.allowed_proposers(32, 0.0, rng, 0.0)
    for _ in range(round(FRESH_SECONDS / 0.020)):  # what joining costs is now old ...
        guard.observe(step(32, True, 64, 0.020))
    while guard.allowed_proposers(32, 0.0, rng, 1.0):
        pass
    assert not guard.allowed_proposers(32, 0.0, rng, 0.0, joining=1)  # ... so a joined step measures it plainly


@pytest.mark.parametrize(("speculative_steps", "low", "high"),
                         [(round(FRESH_SECONDS / 0.020), 1850, 2000), (10, 1600, 1700)])
def test_a_plain_sample_after_long_speculation_restarts_its_batch_sizes_figure(speculative_steps: int, low: float,
                                                                                high: float) -> None:
    """The old figure counts as one sample against a plain step that comes after FRESH_SECONDS of steps without
    one in its bucket (it is from other traffic or another pace), as one of ~20 otherwise."""
    guard = winning_at_32()
    for _ in range(speculative_steps):
        guard.observe(step(32, True, 64, 0.020))
    guard.observe(step(32, False, 32, 0.0133))  # plain decode now runs at 2400 tokens/s
    [bucket] = guard.summary()
    assert low < bucket["plain"]["tokens_per_s"] < high


def stale_at_20_and_30() -> GoodputGuard:
    """Plain figures at 20 and 30 requests (40 ms each), then FRESH_SECONDS of speculative steps: stale."""
    guard = GoodputGuard()
    for _ in range(4 * MIN_SAMPLES):
        guard.observe(step(20, False, 20, 0.040))
        guard.observe(step(30, False, 30, 0.040))
    for _ in range(round(FRESH_SECONDS / 0.040) + 1):
        guard.observe(step(30, True, 60, 0.060))
    return guard


def test_stale_plain_samples_that_agree_on_a_pace_move_their_buckets_other_batch_sizes() -> None:
    """Each size of a stale bucket restarts on its own first sample, and once two samples agree on a pace, the
    sizes not sampled move by it: left at the old pace, speculative steps at those sizes were paired with it (after
    a change of the host's pace at 32 code requests, the draft route read 1.35-2.43x plain decode while its runs
    read 0.87x ``off``)."""
    guard = stale_at_20_and_30()
    guard.observe(step(20, False, 20, 0.020))  # the host now runs twice as fast: size 20 half way there
    [bucket] = guard.summary()
    assert bucket["plain"]["tokens_per_s"] == pytest.approx(50 / (0.030 + 0.040))  # one sample moves no other size
    guard.observe(step(20, False, 20, 0.022))  # 0.55x the old figure: the pace both agree on
    [bucket] = guard.summary()
    # size 20: 30 ms, then its second sample weighs a third; size 30 half way to 0.55x of 40 ms
    size_20 = 0.030 + (0.022 - 0.030) / 3
    assert bucket["plain"]["tokens_per_s"] == pytest.approx(50 / (size_20 + 0.031))
    guard.observe(step(30, False, 30, 0.020))  # size 30's own next sample weighs half against the moved figure
    [bucket] = guard.summary()
    assert bucket["plain"]["tokens_per_s"] == pytest.approx(50 / (size_20 + 0.0255))


def test_one_slow_plain_step_of_a_stale_bucket_moves_no_other_batch_size() -> None:
    """Host noise makes 3-4% of plain steps at 17-32 requests take over 1.27x their size's median: one such step at
    28 code requests, carried to 32, made the next cell's first draft figure read a win where the route ran 0.94x
    ``off``. Samples that disagree on the pace move no size they did not sample."""
    guard = stale_at_20_and_30()
    guard.observe(step(20, False, 20, 0.060))  # an outlier
    guard.observe(step(20, False, 20, 0.040))  # the pace held
    assert guard._plain[batch_bucket(30)][30].seconds == pytest.approx(0.040)


@pytest.mark.usefixtures("without_trials")
def test_winning_speculation_measures_plain_decode_once_its_plain_figure_is_fresh_seconds_old() -> None:
    """However clearly speculation wins, its bucket takes a plain sample every FRESH_SECONDS: the winning figure is
    paired with plain decode's, and a plain figure from another pace made speculation read 2.3x plain decode at 32
    requests while its run read 0.98x ``off``."""
    guard, rng = winning_at_32(), random.Random(0)
    steps = 0
    while "draft" in guard.allowed_proposers(32, 0.0, rng, 0.0) and steps < 1000:
        guard.observe(step(32, True, 64, 0.020))
        steps += 1
    assert steps == pytest.approx(FRESH_SECONDS / 0.020, abs=1)
    guard.observe(step(32, False, 32, 0.020))
    # the plain probe goes on until the restart's second sample (`PaceCheck`): until then, speculative steps at the
    # sizes not sampled would be paired with the old pace
    assert "draft" not in guard.allowed_proposers(32, 0.0, rng, 0.0)
    guard.observe(step(32, False, 32, 0.020))
    assert "draft" in guard.allowed_proposers(32, 0.0, rng, 0.0)


def test_what_joining_prompts_cost_restarts_from_a_sample_after_fresh_seconds() -> None:
    """The prompts' cost taken off a joined speculative step is a plain figure too: learned at another pace, it
    took 2.4x what the prompts cost off such steps, and speculation read 1.7x plain decode."""
    guard = GoodputGuard()
    for _ in range(20):
        guard.observe(step(24, False, 24, 0.040))
        guard.observe(joining(step(24, False, 24, 0.100), 2))  # two prompts add 60 ms
    for _ in range(round(FRESH_SECONDS / 0.040)):
        guard.observe(step(24, True, 52, 0.040))
    guard.observe(joining(step(24, False, 24, 0.060), 2))  # now 20 ms
    guard.observe(joining(step(24, True, 52, 0.080), 2))  # the mean of 60 and 20 ms taken off: 40 ms, as unjoined
    assert guard._speculative[(batch_bucket(24), 0, "draft")].seconds == pytest.approx(0.040, abs=1e-5)


@pytest.mark.usefixtures("without_trials")
def test_a_rejection_that_a_fallen_wins_remeasurement_made_is_confirmed_like_any() -> None:
    """A win that falls is measured again at once; should that reject it, the re-measurement was no probe of the
    rejection, so the rejection's first burst is still to come, boosted, and the plan may not decline it (at 16
    prose requests, T = 1, a noisy 0.97x re-measurement of a 1.10x draft route stood, its bursts declined by the
    plan, for two runs while fixed draft k = 2 ran 1.11x faster)."""
    rng = random.Random(0)
    guard = GoodputGuard()
    for _ in range(SURE):
        guard.observe(step(8, False, 8, 0.010))
        guard.observe(step(8, True, 9, 0.010))  # 1.125x plain decode
    assert guard.allowed_proposers(8, 0.0, rng, 0.0) == ALL_PROPOSERS  # a win
    while not guard.probing(8, 0.0):  # it falls under break-even: measured again at once
        guard.observe(step(8, True, 7, 0.010))
        guard.allowed_proposers(8, 0.0, rng, 0.0)
    guard.observe(step(8, False, 8, 0.010))  # the plain step the re-measurement starts with
    assert not guard.decline_measurement(8, 0.0)
    for _ in range(SURE + 1):  # its catch-up and its steps, on to a sure verdict: 0.96x, a near miss, rejects
        guard.observe(step(8, True, 8, 0.0104))
        guard.allowed_proposers(8, 0.0, rng, 0.0)
    assert "draft" not in guard.allowed_proposers(8, 0.0, rng, 0.0)  # rejected
    while "draft" not in guard.allowed_proposers(8, 0.0, rng, 1.0):  # the rejection's first burst
        pass
    assert not guard.decline_measurement(8, 0.0) and guard.measuring_draft(8, 0.0)
    for _ in range(SURE + 1):  # it misses again, surely: the rejection stands, and its later bursts are declinable
        guard.observe(step(8, True, 8, 0.0104))
    while "draft" not in guard.allowed_proposers(8, 0.0, rng, 1.0):
        pass
    assert guard.decline_measurement(8, 0.0)
