"""Acceptance-rate estimates per request and proposer, with temperature-bucketed global priors.

alpha is the per-position acceptance probability of Leviathan et al.: draft token j is accepted with
probability alpha given tokens 1..j-1 were. A round that drafts k and accepts m observed m successes
and, if m < k, one failure, so the estimate is (accepted) / (accepted + failures) over recent rounds.
The naive ratio accepted / drafted is biased low and more so the larger k is (positions after the
first rejection are never tried), which would push k down for no reason.

Per-request evidence is thin (a k = 1 round is one or two trials, and the EWMA keeps ~10 trials), so
each request's estimate is shrunk towards its bucket's global rate: the global rate counts as m
pseudo-trials in it (a Beta prior). How strongly to shrink depends on how much requests really differ,
and that is learned (empirical Bayes, by the method of moments over finished requests' totals): the
draft model's acceptance hardly differs between requests (measured on the bundled pair, 32 requests
each: between-request spread 0-0.08, m ~ 25-75), so a request's own rate there is mostly noise, and a
lucky streak read as alpha 0.95 made the plan draft k = 8 where the true 0.83 wanted 4, and made the
other requests of the batch wait on those passes; n-gram lookups differ a lot (spread ~0.2, m ~ 3-5:
some texts repeat, others never), so there each request's own rate counts. Until a bucket has seen
``MIN_DISPERSION_REQUESTS`` finished requests, m is ``DEFAULT_PRIOR_TRIALS``.

Recent rounds weigh more: both counts decay by (1 - ewma_weight) per round. A new request borrows the
global rate of its proposer at its temperature bucket (acceptance changes with T), blended out over
``warmup_rounds`` rounds. Buckets learn from every request; before they have data they fall back to the
settings' prior scaled by a default temperature factor.

Positions do not accept alike: on the bundled pair acceptance given the earlier positions is flat or rises with the
position (prose, T = 0: 0.65 at the first, 0.73-0.97 after; prose, T = 1: 0.79, then 0.82-0.88; a passage that
rejects early leaves the later positions to the easier ones; bench/acceptance_positions.py). One pooled alpha then
prices a round's first token above its worth and the later ones below, and by how much depends on the k its rounds
drafted: under plans of k = 1 the pooled alpha is the first position's, so a second token reads no likelier than
the first, and k = 1 stays a near-tie with k = 2 that it loses on the clock (16 prose clients, T = 1:
docs/goodput-guard.md, s68). So each bucket also counts its first positions apart from the later ones (`positions`),
and the plan prices a round as E[tokens] = 1 + a1 (1 - a^k) / (1 - a): a the later positions' rate, a1 = lead * a
the first's. A request's pooled rate is split in the bucket's proportions (its own rounds say too little to split).

An n-gram proposal is only as good as its match: on the bundled pair (code, T = 0, every match allowed) rounds
from 2- and 3-token matches accepted 24% of their drafted tokens, from 4 tokens on 67%. One estimate for both
priced every short match at the long ones' rate, so a CPU, where each fed token costs, would have drafted them
at a loss; short matches (under the ``ngram_long_match`` setting, "ngram_short") are therefore estimated apart, per
request and per bucket, as a third proposer. The engine reports each round's match length (`RoundOutcome`). Auto
considers matches of every length, split at 4 tokens: on a virtual H200 clock (bench/virtual_clock.py, 32 code
clients) that took adaptive from 0.94-0.96x fixed n-gram k = 4 (matches from 3 tokens, one estimate) to 0.98-0.99x,
and in lockstep A/Bs of the five CPU cells where a noisy sweep had read it under 0.95x the best fixed policy, it ran
0.999-1.036x the old settings (docs/goodput-guard.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policies.base import PROPOSERS, RoundOutcome
from policies.settings import PolicySettings

TEMPERATURE_BUCKETS: tuple[str, ...] = ("T=0", "(0,0.5]", "(0.5,0.9]", "(0.9,1.3]", ">1.3")
DEFAULT_TEMPERATURE_FACTORS: tuple[float, ...] = (1.0, 0.95, 0.88, 0.8, 0.7)
BUCKET_POINTS: tuple[float, ...] = (0.0, 0.3, 0.7, 1.1, 1.5)  # a temperature inside each bucket
BUCKET_PRIOR_PSEUDO_TRIALS = 20.0  # the settings prior weighs this many draft positions in a bucket
DEFAULT_PRIOR_TRIALS = 4.0  # pseudo-trials of the global rate in a request's estimate, before m is learned
PRIOR_TRIALS_RANGE = (2.0, 200.0)  # learned m is clamped to this: some own evidence always counts, and none dominates
MIN_DISPERSION_REQUESTS = 8  # finished requests in a bucket before its learned m is used
DISPERSION_DECAY = 0.98  # per finished request: the spread follows the last ~50 requests
GLOBAL_DECAY = 0.999  # per round: the global rates follow drift over ~1000 rounds
ALPHA_CEILING = 0.99  # keeps 1 / (1 - alpha) finite
LEAD_RANGE = (0.7, 1.3)  # the first position's rate over the later ones' is clamped to this
SHORT_MATCH_PRIOR_FACTOR = 0.5  # the settings' n-gram prior, scaled for short matches before they have data
ESTIMATES: tuple[str, ...] = (*PROPOSERS, "ngram_short")


def estimate_key(proposer: str, match_len: int = 0, long_match: int = 1) -> str:
    """Which estimate a round (or a request's option) reads: an n-gram match under ``long_match`` tokens has its own
    ("ngram_short"); 0 = unknown match."""
    return "ngram_short" if proposer == "ngram" and 0 < match_len < long_match else proposer


def temperature_bucket(temperature: float) -> int:
    if temperature <= 0.0:
        return 0
    for index, upper in enumerate((0.5, 0.9, 1.3), start=1):
        if temperature <= upper:
            return index
    return 4


@dataclass
class DecayedCounts:
    """Accepted positions and tried positions, each an exponentially decayed sum."""

    accepted: float = 0.0
    trials: float = 0.0
    num_rounds: int = 0

    def add(self, accepted: int, trials: int, decay: float) -> None:
        self.accepted = self.accepted * decay + accepted
        self.trials = self.trials * decay + trials
        self.num_rounds += 1

    def rate(self, prior: float, prior_trials: float) -> float:
        return (self.accepted + prior * prior_trials) / (self.trials + prior_trials)


@dataclass
class RequestCounts(DecayedCounts):
    """One request's decayed counts, plus its undecayed totals and bucket for the spread between requests."""

    bucket: int = 0
    total_accepted: int = 0
    total_trials: int = 0

    def add(self, accepted: int, trials: int, decay: float) -> None:
        super().add(accepted, trials, decay)
        self.total_accepted += accepted
        self.total_trials += trials


@dataclass
class Dispersion:
    """How much requests' acceptance differs within one proposer and temperature bucket.

    Decayed sums over finished requests i with a_i accepted of n_i trials; the between-request variance
    tau^2 is the observed spread of the p_i = a_i / n_i less what binomial noise explains (the
    weighted method-of-moments estimator). A Beta prior of that variance around the mean p weighs
    m = p (1 - p) / tau^2 - 1 trials. Refitted as each finished request is added, not when read (every
    request's estimate reads it, every step).
    """

    num_requests: int = 0  # undecayed, for the minimum
    requests: float = 0.0
    trials: float = 0.0
    accepted: float = 0.0
    trials_squared: float = 0.0  # sum of n_i^2
    accepted_squared_per_trial: float = 0.0  # sum of a_i^2 / n_i
    prior_trials: float = DEFAULT_PRIOR_TRIALS  # m

    def add(self, accepted: int, trials: int) -> None:
        decay = DISPERSION_DECAY
        self.num_requests += 1
        self.requests = self.requests * decay + 1.0
        self.trials = self.trials * decay + trials
        self.accepted = self.accepted * decay + accepted
        self.trials_squared = self.trials_squared * decay + trials * trials
        self.accepted_squared_per_trial = self.accepted_squared_per_trial * decay + accepted * accepted / trials
        self.prior_trials = self._fit()

    def _fit(self) -> float:
        if self.num_requests < MIN_DISPERSION_REQUESTS:
            return DEFAULT_PRIOR_TRIALS
        low, high = PRIOR_TRIALS_RANGE
        p = self.accepted / self.trials
        binomial = p * (1.0 - p)
        spread = self.accepted_squared_per_trial - self.trials * p * p  # sum of n_i (p_i - p)^2
        effective_trials = self.trials - self.trials_squared / self.trials  # 0 if one request holds them all
        if effective_trials <= 0.0:
            return DEFAULT_PRIOR_TRIALS
        tau_squared = (spread - (self.requests - 1.0) * binomial) / effective_trials
        if tau_squared <= binomial / (high + 1.0):
            return high
        return min(high, max(low, binomial / tau_squared - 1.0))


@dataclass
class ProposerTotals:
    """Undecayed totals for operators: what was drafted and accepted since start."""

    num_rounds: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    per_bucket: list[DecayedCounts] = field(default_factory=lambda: [DecayedCounts() for _ in TEMPERATURE_BUCKETS])
    first: list[DecayedCounts] = field(default_factory=lambda: [DecayedCounts() for _ in TEMPERATURE_BUCKETS])
    later: list[DecayedCounts] = field(default_factory=lambda: [DecayedCounts() for _ in TEMPERATURE_BUCKETS])


class AcceptanceEstimator:
    """Learns alpha from `RoundOutcome`s; holds no reference to any model."""

    def __init__(self, settings: PolicySettings | None = None) -> None:
        self._settings = settings or PolicySettings()
        self._requests: dict[tuple[str, str], RequestCounts] = {}  # (request id, estimate) -> its counts
        self._totals: dict[str, ProposerTotals] = {name: ProposerTotals() for name in ESTIMATES}
        self._dispersion = {name: [Dispersion() for _ in TEMPERATURE_BUCKETS] for name in ESTIMATES}
        # (estimate, bucket) -> (prior, prior trials): read for every request every step, changed only by
        # observations, finished requests and settings
        self._shared: dict[tuple[str, int], tuple[float, float]] = {}
        self._positions: dict[tuple[str, int], tuple[float, float]] = {}  # (estimate, bucket) -> `positions`

    def configure(self, settings: PolicySettings) -> None:
        self._settings = settings
        self._shared.clear()
        self._positions.clear()

    def _estimate(self, proposer: str, match_len: int) -> str:
        """`estimate_key` at the settings' ``ngram_long_match``."""
        return estimate_key(proposer, match_len, self._settings.ngram_long_match)

    def observe(self, outcome: RoundOutcome) -> None:
        if outcome.num_drafted <= 0 or outcome.proposer not in PROPOSERS:
            return
        accepted = max(0, min(outcome.num_accepted, outcome.num_drafted))
        trials = accepted + (1 if accepted < outcome.num_drafted else 0)
        estimate = self._estimate(outcome.proposer, outcome.ngram_match_len)
        key = (outcome.request_id, estimate)
        bucket = temperature_bucket(outcome.temperature)
        counts = self._requests.get(key)
        if counts is None:
            counts = self._requests[key] = RequestCounts(bucket=bucket)
        counts.add(accepted, trials, 1.0 - self._settings.ewma_weight)
        totals = self._totals[estimate]
        totals.num_rounds += 1
        totals.num_drafted += outcome.num_drafted
        totals.num_accepted += accepted
        totals.per_bucket[bucket].add(accepted, trials, GLOBAL_DECAY)
        totals.first[bucket].add(min(accepted, 1), 1, GLOBAL_DECAY)
        if accepted and outcome.num_drafted > 1:  # the later positions were tried
            totals.later[bucket].add(accepted - 1, trials - 1, GLOBAL_DECAY)
        self._shared.pop((estimate, bucket), None)
        self._positions.pop((estimate, bucket), None)

    def prior(self, proposer: str, temperature: float, match_len: int = 0) -> float:
        """The global rate of ``proposer`` (at this n-gram match length) at this temperature bucket (settings prior
        before data)."""
        estimate = self._estimate(proposer, match_len)
        bucket = temperature_bucket(temperature)
        base = self._settings.prior_alpha_draft if proposer == "draft" else self._settings.prior_alpha_ngram
        if estimate == "ngram_short":
            base *= SHORT_MATCH_PRIOR_FACTOR
        default = base * DEFAULT_TEMPERATURE_FACTORS[bucket]
        return self._totals[estimate].per_bucket[bucket].rate(default, BUCKET_PRIOR_PSEUDO_TRIALS)

    def positions(self, proposer: str, temperature: float, match_len: int = 0) -> tuple[float, float]:
        """(scale, lead) of the bucket's positions: a request's pooled `alpha` times scale is its later positions'
        rate a, and lead * a its first position's (see the module doc). Each rate is shrunk towards the bucket's
        pooled one by the bucket prior's pseudo-trials, so a bucket without rounds past the first reads (1, 1)."""
        return self._positions_at(self._estimate(proposer, match_len), temperature_bucket(temperature))

    def _positions_at(self, estimate: str, bucket: int) -> tuple[float, float]:
        cached = self._positions.get((estimate, bucket))
        if cached is None:
            totals = self._totals[estimate]
            counts = totals.per_bucket[bucket]
            if counts.accepted <= 0.0:
                cached = (1.0, 1.0)
            else:
                pooled = counts.accepted / counts.trials
                first = totals.first[bucket].rate(pooled, BUCKET_PRIOR_PSEUDO_TRIALS)
                later = totals.later[bucket].rate(pooled, BUCKET_PRIOR_PSEUDO_TRIALS)
                low, high = LEAD_RANGE
                cached = (later / pooled, min(high, max(low, first / later)))
            self._positions[(estimate, bucket)] = cached
        return cached

    def is_learned(self, proposer: str, temperature: float, match_len: int = 0) -> bool:
        """Whether the proposer's observed trials at this temperature bucket outweigh the settings prior."""
        totals = self._totals[self._estimate(proposer, match_len)]
        return totals.per_bucket[temperature_bucket(temperature)].trials >= BUCKET_PRIOR_PSEUDO_TRIALS

    def alpha(self, request_id: str, proposer: str, temperature: float, match_len: int = 0) -> float:
        """The request's own decayed rate, blended with the prior during warm-up, floored and capped.
        ``match_len``: of the n-gram match the proposal would use (0: unknown)."""
        return self._alpha_at(request_id, proposer, temperature, match_len, self._estimate(proposer, match_len),
                              temperature_bucket(temperature))

    def by_position(self, request_id: str, proposer: str, temperature: float, match_len: int = 0,
                    ) -> tuple[float, float]:
        """(a, lead): the request's later positions' rate (its `alpha` times the bucket's scale, capped) and the
        first position's lead over it (`positions`). The planner reads this for every request every step, so it
        looks up the estimate and bucket once for both."""
        estimate = self._estimate(proposer, match_len)
        bucket = temperature_bucket(temperature)
        scale, lead = self._positions_at(estimate, bucket)
        alpha = self._alpha_at(request_id, proposer, temperature, match_len, estimate, bucket)
        return min(ALPHA_CEILING, scale * alpha), lead

    def _alpha_at(self, request_id: str, proposer: str, temperature: float, match_len: int, estimate: str,
                  bucket: int) -> float:
        key = (estimate, bucket)
        shared = self._shared.get(key)
        if shared is None:
            shared = self._shared[key] = (self.prior(proposer, temperature, match_len),
                                          self.prior_trials(proposer, temperature, match_len))
        prior, prior_trials = shared
        counts = self._requests.get((request_id, estimate))
        settings = self._settings
        if counts is None or counts.trials <= 0.0:
            estimate_value = prior
        else:  # read for every request every step: `DecayedCounts.rate` inlined
            own = (counts.accepted + prior * prior_trials) / (counts.trials + prior_trials)
            warmup = settings.warmup_rounds
            weight = 1.0 if warmup == 0 else min(1.0, counts.num_rounds / warmup)
            estimate_value = weight * own + (1.0 - weight) * prior
        return min(ALPHA_CEILING, max(settings.alpha_floor, estimate_value))

    def prior_trials(self, proposer: str, temperature: float, match_len: int = 0) -> float:
        """m: how many trials the global rate weighs in a request's estimate (learned, see the module doc)."""
        estimate = self._estimate(proposer, match_len)
        return self._dispersion[estimate][temperature_bucket(temperature)].prior_trials

    def forget(self, request_id: str) -> None:
        """The request is done: its totals join its bucket's spread between requests."""
        for estimate in ESTIMATES:
            counts = self._requests.pop((request_id, estimate), None)
            if counts is not None and counts.total_trials > 0:
                self._dispersion[estimate][counts.bucket].add(counts.total_accepted, counts.total_trials)
                self._shared.pop((estimate, counts.bucket), None)

    @property
    def num_tracked_requests(self) -> int:
        return len({request_id for request_id, _ in self._requests})

    def summary(self) -> dict[str, Any]:
        """Per proposer ("ngram" for matches of ``ngram_long_match`` tokens or more, "ngram_short" for shorter ones):
        totals, acceptance rate (accepted / drafted), the per-bucket alpha priors and first positions' leads."""
        out: dict[str, Any] = {}
        buckets = list(zip(TEMPERATURE_BUCKETS, BUCKET_POINTS, strict=True))
        for proposer, totals in self._totals.items():
            rate = totals.num_accepted / totals.num_drafted if totals.num_drafted else None
            out[proposer] = {
                "num_rounds": totals.num_rounds,
                "num_drafted": totals.num_drafted,
                "num_accepted": totals.num_accepted,
                "acceptance_rate": rate,
                "alpha_by_temperature": {name: round(self.prior(proposer, t), 4) for name, t in buckets},
                # how many trials the global rate weighs in each request's estimate (learned shrinkage)
                "prior_trials_by_temperature": {name: round(self.prior_trials(proposer, t), 1) for name, t in buckets},
                # the first position's rate over the later ones' (`positions`), as the plan prices it
                "first_position_lead_by_temperature": {
                    name: round(self._positions_at(proposer, temperature_bucket(t))[1], 3) for name, t in buckets},
            }
        return out
