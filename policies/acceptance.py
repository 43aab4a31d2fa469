"""Acceptance-rate estimates per request and proposer, with temperature-bucketed global priors.

alpha is the per-position acceptance probability of Leviathan et al.: draft token j is accepted with
probability alpha given tokens 1..j-1 were. A round that drafts k and accepts m observed m successes
and, if m < k, one failure, so the estimate is (accepted) / (accepted + failures) over recent rounds.
The naive ratio accepted / drafted is biased low and more so the larger k is (positions after the
first rejection are never tried), which would push k down for no reason.

Per-request evidence is thin (a k = 1 round is one or two trials) and selection makes noise sticky: an
estimate that drops by bad luck sends the request to k = 0, where it learns nothing more. So the global
prior keeps a small pseudo-count weight in every request's estimate (shrinkage), on top of warm-up.

Recent rounds weigh more: both counts decay by (1 - ewma_weight) per round. A new request borrows the
global rate of its proposer at its temperature bucket (acceptance falls as T rises), blended out over
``warmup_rounds`` rounds. Buckets learn from every request; before they have data they fall back to the
settings' prior scaled by a default temperature factor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from policies.base import PROPOSERS, RoundOutcome
from policies.settings import PolicySettings

TEMPERATURE_BUCKETS: tuple[str, ...] = ("T=0", "(0,0.5]", "(0.5,0.9]", "(0.9,1.3]", ">1.3")
DEFAULT_TEMPERATURE_FACTORS: tuple[float, ...] = (1.0, 0.95, 0.88, 0.8, 0.7)
BUCKET_PRIOR_PSEUDO_TRIALS = 20.0  # the settings prior weighs this many draft positions in a bucket
REQUEST_PRIOR_PSEUDO_TRIALS = 4.0  # the global prior keeps this weight in a request's own estimate
GLOBAL_DECAY = 0.999  # per round: the global rates follow drift over ~1000 rounds
ALPHA_CEILING = 0.99  # keeps 1 / (1 - alpha) finite


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
class ProposerTotals:
    """Undecayed totals for operators: what was drafted and accepted since start."""

    num_rounds: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    per_bucket: list[DecayedCounts] = field(default_factory=lambda: [DecayedCounts() for _ in TEMPERATURE_BUCKETS])


class AcceptanceEstimator:
    """Learns alpha from `RoundOutcome`s; holds no reference to any model."""

    def __init__(self, settings: PolicySettings | None = None) -> None:
        self._settings = settings or PolicySettings()
        self._requests: dict[tuple[str, str], DecayedCounts] = {}
        self._totals: dict[str, ProposerTotals] = {name: ProposerTotals() for name in PROPOSERS}

    def configure(self, settings: PolicySettings) -> None:
        self._settings = settings

    def observe(self, outcome: RoundOutcome) -> None:
        if outcome.num_drafted <= 0 or outcome.proposer not in self._totals:
            return
        accepted = max(0, min(outcome.num_accepted, outcome.num_drafted))
        trials = accepted + (1 if accepted < outcome.num_drafted else 0)
        key = (outcome.request_id, outcome.proposer)
        counts = self._requests.get(key)
        if counts is None:
            counts = self._requests[key] = DecayedCounts()
        counts.add(accepted, trials, 1.0 - self._settings.ewma_weight)
        totals = self._totals[outcome.proposer]
        totals.num_rounds += 1
        totals.num_drafted += outcome.num_drafted
        totals.num_accepted += accepted
        totals.per_bucket[temperature_bucket(outcome.temperature)].add(accepted, trials, GLOBAL_DECAY)

    def prior(self, proposer: str, temperature: float) -> float:
        """The global rate of ``proposer`` at this temperature bucket (settings prior before data)."""
        bucket = temperature_bucket(temperature)
        base = self._settings.prior_alpha_draft if proposer == "draft" else self._settings.prior_alpha_ngram
        default = base * DEFAULT_TEMPERATURE_FACTORS[bucket]
        return self._totals[proposer].per_bucket[bucket].rate(default, BUCKET_PRIOR_PSEUDO_TRIALS)

    def alpha(self, request_id: str, proposer: str, temperature: float) -> float:
        """The request's own decayed rate, blended with the prior during warm-up, floored and capped."""
        prior = self.prior(proposer, temperature)
        counts = self._requests.get((request_id, proposer))
        if counts is None or counts.trials <= 0.0:
            estimate = prior
        else:
            own = counts.rate(prior, REQUEST_PRIOR_PSEUDO_TRIALS)
            warmup = self._settings.warmup_rounds
            weight = 1.0 if warmup == 0 else min(1.0, counts.num_rounds / warmup)
            estimate = weight * own + (1.0 - weight) * prior
        return min(ALPHA_CEILING, max(self._settings.alpha_floor, estimate))

    def forget(self, request_id: str) -> None:
        for proposer in PROPOSERS:
            self._requests.pop((request_id, proposer), None)

    @property
    def num_tracked_requests(self) -> int:
        return len({request_id for request_id, _ in self._requests})

    def summary(self) -> dict[str, Any]:
        """Per proposer: totals, acceptance rate (accepted / drafted) and the per-bucket alpha priors."""
        out: dict[str, Any] = {}
        for proposer, totals in self._totals.items():
            rate = totals.num_accepted / totals.num_drafted if totals.num_drafted else None
            out[proposer] = {
                "num_rounds": totals.num_rounds,
                "num_drafted": totals.num_drafted,
                "num_accepted": totals.num_accepted,
                "acceptance_rate": rate,
                "alpha_by_temperature": {
                    name: round(self.prior(proposer, t), 4)
                    for name, t in zip(TEMPERATURE_BUCKETS, (0.0, 0.3, 0.7, 1.1, 1.5), strict=True)
                },
            }
        return out
