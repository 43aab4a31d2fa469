"""What every policy does with observations: feed the shared acceptance estimator, cost model and guard.

The learned state (acceptance, step costs, realised goodput) lives outside the policy objects so that
the controller can hand it from one policy to the next when the settings (or the mode) change:
switching from `fixed` to `auto` starts with everything the fixed policy saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.acceptance import AcceptanceEstimator
from policies.base import BatchView, Decision, RoundOutcome, StepTiming
from policies.cost_model import CostModel
from policies.guard import GoodputGuard
from policies.settings import PolicySettings


@dataclass
class LearnedState:
    """Everything the policies learn, handed as one from policy to policy."""

    acceptance: AcceptanceEstimator = field(default_factory=AcceptanceEstimator)
    cost_model: CostModel = field(default_factory=CostModel)
    guard: GoodputGuard = field(default_factory=GoodputGuard)

    def __post_init__(self) -> None:
        if self.guard.plain_estimate is None:
            self.guard.plain_estimate = self.predicted_plain_seconds
            self.guard.catch_up_token_seconds = self.predicted_catch_up_token_seconds

    def predicted_catch_up_token_seconds(self) -> float:
        """What a token the draft model catches up on costs, as the cost model prices it."""
        return self.cost_model.coefficients().h

    def predicted_plain_seconds(self, batch_size: int) -> float:
        """A plain-decode step's seconds at ``batch_size``, as the cost model predicts them."""
        return self.cost_model.predict_plain_step(batch_size)


class LearningPolicy:
    """Base of the concrete policies: holds settings and the shared learned state; subclasses decide."""

    name = "learning"
    num_reused_plans = 0  # steps that reused an earlier step's plan instead of planning (the adaptive policy's)
    num_k_probes = 0  # planned steps whose speculating requests drafted one token more than planned (adaptive)
    # why the last decided step's plain requests decode plainly, where the policy chose it (the controller counts it
    # per plain request-step, for operators; see `PolicyController.decide`)
    plain_cause = "policy"

    def __init__(self, settings: PolicySettings | None = None, learned: LearnedState | None = None) -> None:
        self.settings = settings or PolicySettings()
        self.learned = learned = learned or LearnedState()
        self.acceptance, self.cost_model, self.guard = learned.acceptance, learned.cost_model, learned.guard
        self.batch_temperature = 0.0  # mean temperature of the last decided batch, for the guard
        self.reconfigure(self.settings)

    def reconfigure(self, settings: PolicySettings) -> None:
        """Adopt new settings of the same mode, keeping everything learned (called between steps)."""
        self.settings = settings
        self.acceptance.configure(settings)
        self.cost_model.configure(settings.verify_cost_coefficients, settings.draft_cost_per_token)
        self.guard.plain_estimate_changed()

    def decide(self, batch: BatchView) -> list[Decision]:
        raise NotImplementedError

    def observe(self, outcome: RoundOutcome) -> None:
        self.acceptance.observe(outcome)

    def observe_step(self, timing: StepTiming) -> None:
        self.cost_model.observe(timing)
        self.guard.observe(timing, self.batch_temperature)

    def forget(self, request_id: str) -> None:
        self.acceptance.forget(request_id)

    def over_load_limit(self, num_requests: int) -> bool:
        """The operator's hard load knob: above it every request decodes plainly."""
        limit = self.settings.max_batch_for_speculation
        return limit is not None and num_requests > limit
