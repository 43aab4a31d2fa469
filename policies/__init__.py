"""Speculation policies: per-request draft length and proposer, decided from plain views of each step."""

from policies.acceptance import AcceptanceEstimator, temperature_bucket
from policies.adaptive import AdaptivePolicy
from policies.base import (
    PROPOSERS,
    BatchView,
    Decision,
    OverrideMode,
    ProposerName,
    RequestView,
    RoundOutcome,
    SpeculationPolicy,
    StepTiming,
)
from policies.controller import PolicyController, build_policy
from policies.cost_model import CostCoefficients, CostModel, DraftPlan
from policies.fixed import FixedPolicy, OffPolicy
from policies.goodput import BatchPlan, Candidate, expected_tokens, plan_batch
from policies.learning import LearnedState
from policies.settings import POLICY_MODES, PolicySettings, PolicySettingsError

__all__ = [
    "POLICY_MODES",
    "PROPOSERS",
    "AcceptanceEstimator",
    "AdaptivePolicy",
    "BatchPlan",
    "BatchView",
    "Candidate",
    "CostCoefficients",
    "CostModel",
    "Decision",
    "DraftPlan",
    "FixedPolicy",
    "LearnedState",
    "OffPolicy",
    "OverrideMode",
    "PolicyController",
    "PolicySettings",
    "PolicySettingsError",
    "ProposerName",
    "RequestView",
    "RoundOutcome",
    "SpeculationPolicy",
    "StepTiming",
    "build_policy",
    "expected_tokens",
    "plan_batch",
    "temperature_bucket",
]
