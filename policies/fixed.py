"""The two non-adaptive policies: `off` (always plain decode) and `fixed` (one k, one proposer).

They still feed the shared learned state, so statistics keep accumulating and a later switch to the
adaptive policy starts informed.
"""

from __future__ import annotations

from policies.base import BatchView, Decision, ProposerName, RequestView, StepTiming
from policies.learning import LearningPolicy
from policies.settings import PolicySettings

PLAIN = Decision(k=0)


class OffPolicy(LearningPolicy):
    """Plain decode for everyone, whatever the requests ask for (the operator's kill switch)."""

    name = "off"
    plain_cause = "off"

    def decide(self, batch: BatchView) -> list[Decision]:
        return [PLAIN] * len(batch.requests)


class FixedPolicy(LearningPolicy):
    """k = min(settings.k, k_max, request max_k) with the mode's proposer, or the request's override.

    A request that cannot use its proposer this step (no draft model; no n-gram match) decodes plainly.
    """

    name = "fixed"
    proposer: ProposerName = "draft"  # set from the mode by reconfigure()

    def reconfigure(self, settings: PolicySettings) -> None:
        super().reconfigure(settings)
        self.proposer = "ngram" if settings.mode == "ngram" else "draft"

    def observe_step(self, timing: StepTiming) -> None:
        """Step costs only: a fixed k's speculative steps say nothing of what the adaptive plan's would
        yield, so they must not shape the goodput guard's verdict."""
        self.cost_model.observe(timing)

    def decide(self, batch: BatchView) -> list[Decision]:
        if self.over_load_limit(batch.load):
            self.plain_cause = "load_limit"
            return [PLAIN] * len(batch.requests)
        self.plain_cause = "no_proposal"  # its proposer has nothing to offer the request (no n-gram match)
        return [self._decide_one(view) for view in batch.requests]

    def _decide_one(self, view: RequestView) -> Decision:
        if view.override_mode == "off":
            return PLAIN
        proposer: ProposerName = self.proposer
        if view.override_mode == "draft" or view.override_mode == "ngram":
            proposer = view.override_mode
        return fixed_decision(view, proposer, self.settings)


def fixed_decision(view: RequestView, proposer: ProposerName, settings: PolicySettings) -> Decision:
    """``proposer`` drafting the configured fixed k, capped by the request; plain where it cannot propose."""
    if (proposer == "draft" and not view.draft_available) or (proposer == "ngram" and view.ngram_match_len < 1):
        return PLAIN
    k = min(settings.k, settings.k_max, view.max_k)
    return Decision(k, proposer) if k > 0 else PLAIN
