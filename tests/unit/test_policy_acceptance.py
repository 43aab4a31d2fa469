"""AcceptanceEstimator: per-position alpha, temperature-bucket priors, warm-up, floor, forgetting."""

from __future__ import annotations

import random

import pytest

from policies import AcceptanceEstimator, PolicySettings, RoundOutcome, temperature_bucket
from policies.acceptance import ALPHA_CEILING, LEAD_RANGE, SHORT_MATCH_PRIOR_FACTOR

LONG_MATCH = 4


def geometric_rounds(rng: random.Random, alpha: float, k: int, n: int, request_id: str = "r", temperature=0.0):
    for _ in range(n):
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        yield RoundOutcome(request_id, "draft", temperature, k, accepted)


@pytest.mark.parametrize(
    ("temperature", "bucket"), [(0.0, 0), (0.3, 1), (0.5, 1), (0.7, 2), (1.0, 3), (1.3, 3), (2.0, 4)]
)
def test_temperature_buckets(temperature: float, bucket: int) -> None:
    assert temperature_bucket(temperature) == bucket


def test_estimate_is_the_per_position_rate_not_accepted_over_drafted() -> None:
    rng = random.Random(0)
    estimator = AcceptanceEstimator(PolicySettings(ewma_weight=0.02))
    rounds = list(geometric_rounds(rng, 0.8, 8, 2000))
    for outcome in rounds:
        estimator.observe(outcome)
    naive = sum(o.num_accepted for o in rounds) / sum(o.num_drafted for o in rounds)
    assert naive < 0.6  # accepted / drafted is badly biased at k = 8
    assert estimator.alpha("r", "draft", 0.0) == pytest.approx(0.8, abs=0.05)


def test_new_request_starts_at_its_buckets_prior() -> None:
    estimator = AcceptanceEstimator(PolicySettings(prior_alpha_draft=0.6))
    assert estimator.alpha("new", "draft", 0.0) == pytest.approx(0.6)
    assert estimator.alpha("new", "draft", 1.2) < estimator.alpha("new", "draft", 0.0)
    rng = random.Random(1)
    for index in range(50):  # other requests at T=1.2 accept little
        for outcome in geometric_rounds(rng, 0.2, 4, 5, f"hot-{index}", temperature=1.2):
            estimator.observe(outcome)
    assert estimator.prior("draft", 1.2) == pytest.approx(0.2, abs=0.05)
    assert estimator.alpha("new", "draft", 1.1) == pytest.approx(0.2, abs=0.05)  # same bucket
    assert estimator.alpha("new", "draft", 0.0) == pytest.approx(0.6)  # other buckets untouched


def test_warmup_blends_from_prior_to_own_rate() -> None:
    estimator = AcceptanceEstimator(PolicySettings(prior_alpha_draft=0.5, warmup_rounds=4, ewma_weight=0.5))
    seen = []
    for _ in range(6):
        estimator.observe(RoundOutcome("r", "draft", 0.0, 4, 4))
        seen.append(estimator.alpha("r", "draft", 0.0))
    assert seen == sorted(seen) and seen[0] < seen[-1]
    assert seen[0] < 0.75 and seen[-1] > 0.85


def test_floor_and_ceiling() -> None:
    settings = PolicySettings(alpha_floor=0.3, prior_alpha_draft=0.2, warmup_rounds=0, ewma_weight=0.1)
    estimator = AcceptanceEstimator(settings)
    for _ in range(30):
        estimator.observe(RoundOutcome("bad", "draft", 0.0, 4, 0))
        estimator.observe(RoundOutcome("good", "ngram", 0.0, 8, 8))
    assert estimator.alpha("bad", "draft", 0.0) == pytest.approx(0.3)
    assert estimator.alpha("good", "ngram", 0.0) < 1.0


def test_proposers_are_separate_and_forget_drops_the_request() -> None:
    estimator = AcceptanceEstimator(PolicySettings(warmup_rounds=0, ewma_weight=0.1))
    for _ in range(30):
        estimator.observe(RoundOutcome("r", "ngram", 0.0, 4, 0))
    assert estimator.alpha("r", "ngram", 0.0) < 0.3
    assert estimator.alpha("r", "draft", 0.0) == pytest.approx(estimator.prior("draft", 0.0))
    assert estimator.num_tracked_requests == 1
    estimator.forget("r")
    assert estimator.num_tracked_requests == 0


def test_short_ngram_matches_are_estimated_apart() -> None:
    estimator = AcceptanceEstimator(PolicySettings(warmup_rounds=0, ewma_weight=0.1, ngram_long_match=LONG_MATCH))
    long_prior = estimator.alpha("new", "ngram", 0.0)
    assert estimator.alpha("new", "ngram", 0.0, match_len=2) == pytest.approx(SHORT_MATCH_PRIOR_FACTOR * long_prior)
    for _ in range(30):
        estimator.observe(RoundOutcome("r", "ngram", 0.0, 4, 0, ngram_match_len=2))
        estimator.observe(RoundOutcome("r", "ngram", 0.0, 4, 4, ngram_match_len=LONG_MATCH))
    assert estimator.alpha("r", "ngram", 0.0, match_len=LONG_MATCH - 1) < 0.2
    assert estimator.alpha("r", "ngram", 0.0, match_len=LONG_MATCH) > 0.8
    assert estimator.alpha("r", "ngram", 0.0) > 0.8  # an unknown match length reads the long matches' estimate
    summary = estimator.summary()
    assert summary["ngram_short"]["num_accepted"] == 0 and summary["ngram"]["num_accepted"] == 120
    estimator.forget("r")
    assert estimator.num_tracked_requests == 0


def test_zero_drafted_rounds_are_ignored_and_summary_counts() -> None:
    estimator = AcceptanceEstimator()
    estimator.observe(RoundOutcome("r", "draft", 0.0, 0, 0))
    estimator.observe(RoundOutcome("r", "draft", 0.0, 4, 3))
    summary = estimator.summary()["draft"]
    assert (summary["num_rounds"], summary["num_drafted"], summary["num_accepted"]) == (1, 4, 3)
    assert summary["acceptance_rate"] == pytest.approx(0.75)
    assert estimator.summary()["ngram"]["acceptance_rate"] is None


def finished_requests(estimator: AcceptanceEstimator, rng: random.Random, alphas, proposer="draft", rounds=10):
    for index, alpha in enumerate(alphas):
        request_id = f"{proposer}-{index}"
        for outcome in geometric_rounds(rng, alpha, 4, rounds, request_id):
            estimator.observe(RoundOutcome(request_id, proposer, 0.0, outcome.num_drafted, outcome.num_accepted))
        estimator.forget(request_id)


def test_shrinkage_is_learned_from_how_much_requests_differ() -> None:
    """Alike requests (the draft model): a request's lucky streak is noise, its estimate stays near the global
    rate. Requests that differ (n-gram lookups: texts that repeat and texts that never do): its own rate counts."""
    rng = random.Random(2)
    settings = PolicySettings(warmup_rounds=0)
    estimator = AcceptanceEstimator(settings)
    assert estimator.prior_trials("draft", 0.0) == estimator.prior_trials("ngram", 0.0)  # the default, before data
    finished_requests(estimator, rng, [0.8] * 60, "draft")
    finished_requests(estimator, rng, [0.2, 0.9] * 30, "ngram")
    alike, different = estimator.prior_trials("draft", 0.0), estimator.prior_trials("ngram", 0.0)
    assert alike > 50 and different < 6
    for _ in range(3):  # a streak of full acceptance, twice over
        for proposer in ("draft", "ngram"):
            estimator.observe(RoundOutcome("lucky", proposer, 0.0, 4, 4))
    assert estimator.alpha("lucky", "draft", 0.0) < 0.85  # the global 0.8, barely moved
    assert estimator.alpha("lucky", "ngram", 0.0) > 0.8  # far above the n-gram global ~0.55
    assert estimator.summary()["draft"]["prior_trials_by_temperature"]["T=0"] == pytest.approx(alike, abs=0.05)


def test_shrinkage_needs_enough_finished_requests_and_stays_per_bucket() -> None:
    estimator = AcceptanceEstimator()
    default = estimator.prior_trials("draft", 0.0)
    finished_requests(estimator, random.Random(3), [0.8] * 7)
    assert estimator.prior_trials("draft", 0.0) == default  # 7 requests say too little
    finished_requests(estimator, random.Random(4), [0.8] * 3)
    assert estimator.prior_trials("draft", 0.0) > default
    assert estimator.prior_trials("draft", 1.0) == default  # another temperature bucket


def test_positions_split_the_pooled_rate_into_the_first_and_the_later_ones() -> None:
    """Rounds whose first position accepts at 0.6 and later ones at 0.9: the bucket reads lead ~ 0.67 (clamped to
    0.7), and a request's pooled alpha times scale is the later rate."""
    rng = random.Random(1)
    estimator = AcceptanceEstimator(PolicySettings())
    for _ in range(3000):
        accepted = 0
        while accepted < 3 and rng.random() < (0.6 if accepted == 0 else 0.9):
            accepted += 1
        estimator.observe(RoundOutcome("r", "draft", 0.0, 3, accepted))
    scale, lead = estimator.positions("draft", 0.0)
    assert lead == pytest.approx(LEAD_RANGE[0])
    assert scale * estimator.prior("draft", 0.0) == pytest.approx(0.9, abs=0.03)
    assert estimator.by_position("r", "draft", 0.0) == (  # what the planner reads: both in one call
        pytest.approx(min(ALPHA_CEILING, scale * estimator.alpha("r", "draft", 0.0))), lead)
    assert estimator.positions("draft", 1.0) == (1.0, 1.0)  # a bucket without rounds
    for _ in range(200):  # rounds of one position say nothing of the later ones
        estimator.observe(RoundOutcome("s", "draft", 1.0, 1, int(rng.random() < 0.8)))
    assert estimator.positions("draft", 1.0)[1] == pytest.approx(1.0, abs=0.02)
