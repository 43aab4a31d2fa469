"""The engine's single handle on speculation policy: current settings, the policy, runtime changes, stats.

Operators (an admin route, another thread) call `update` / `replace`, which only validate and stage new
settings. The engine thread applies them between steps (`apply_pending`, also done at the start of
every `decide`), so a step never sees half-changed settings. Learned state (acceptance estimates and
the cost-model fit) is owned here and handed to every policy the controller builds, so it survives
any settings change, including a change of mode.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from policies.acceptance import AcceptanceEstimator
from policies.adaptive import AdaptivePolicy
from policies.base import BatchView, Decision, RoundOutcome, StepTiming
from policies.cost_model import RowCount
from policies.fixed import FixedPolicy, OffPolicy
from policies.learning import LearnedState, LearningPolicy
from policies.settings import K_LIMIT, PolicySettings


def build_policy(settings: PolicySettings, learned: LearnedState | None = None) -> LearningPolicy:
    """The one place that maps a mode to a policy class."""
    kind = settings.policy_kind
    if kind == "off":
        return OffPolicy(settings, learned)
    if kind == "fixed":
        return FixedPolicy(settings, learned)
    return AdaptivePolicy(settings, learned)


class PolicyController:
    """Implements `SpeculationPolicy` by delegation; thread-safe; see the module docstring."""

    def __init__(self, settings: PolicySettings | None = None) -> None:
        self._lock = threading.Lock()
        self._settings = settings or PolicySettings()
        self._pending: PolicySettings | None = None
        self._target_rows: RowCount | None = None
        self._start_learning()

    def _start_learning(self) -> None:
        self._learned = LearnedState(acceptance=AcceptanceEstimator(self._settings))
        self._learned.cost_model.set_rows(self._target_rows)
        self._policy = build_policy(self._settings, self._learned)
        self._num_steps = 0
        self._num_request_steps = 0
        self._k_counts = [0] * (K_LIMIT + 1)
        self._proposer_counts = {"draft": 0, "ngram": 0}
        self._plain_causes: Counter[str] = Counter()  # plain request-steps by why they decoded plainly (`decide`)
        self._seconds = {"deciding": 0.0, "learning": 0.0}  # the policy's own work, on the engine's thread

    def forget_learned(self) -> None:
        """Learn afresh: acceptance, step costs, the goodput guard and the operator counters all start over
        (the engine calls it after its warm-up, whose first-touch step times would mislead the cost model)."""
        with self._lock:
            self._start_learning()

    def set_target_rows(self, rows: RowCount | None) -> None:
        """The engine's count of the rows its target's linears run per fed tokens, which the step-cost fit prices
        (policies/cost_model.py); kept when the controller learns afresh."""
        with self._lock:
            self._target_rows = rows
            self._learned.cost_model.set_rows(rows)

    @property
    def name(self) -> str:
        return self._policy.name

    @property
    def settings(self) -> PolicySettings:
        return self._settings

    @property
    def learned(self) -> LearnedState:
        """What every policy of this controller learns from (acceptance, step costs, the guard's figures): for
        diagnostics to read (bench/k_costs.py), not to change between steps."""
        return self._learned

    @property
    def pending_settings(self) -> PolicySettings | None:
        return self._pending

    def update(self, changes: Mapping[str, Any]) -> PolicySettings:
        """PATCH: merge ``changes`` over the newest settings (staged ones first); stage and return the result.

        Raises `PolicySettingsError` (nothing staged) on an unknown field or a bad value.
        """
        with self._lock:
            staged = PolicySettings.from_dict(changes, self._pending or self._settings)
            self._pending = staged
        return staged

    def replace(self, settings: PolicySettings | Mapping[str, Any]) -> PolicySettings:
        """PUT: stage a complete settings object (a mapping is merged over the defaults)."""
        if not isinstance(settings, PolicySettings):
            settings = PolicySettings.from_dict(settings)
        with self._lock:
            self._pending = settings
        return settings

    def apply_pending(self) -> bool:
        """Swap in staged settings; call between engine steps. True when something changed."""
        with self._lock:
            return self._apply_pending_locked()

    def _apply_pending_locked(self) -> bool:
        new, self._pending = self._pending, None
        if new is None:
            return False
        if new.policy_kind == self._settings.policy_kind:
            self._policy.reconfigure(new)
        else:
            self._policy = build_policy(new, self._learned)
        self._settings = new
        return True

    def decide(self, batch: BatchView) -> list[Decision]:
        with self._lock:
            self._apply_pending_locked()
            start = time.perf_counter()
            decisions = self._policy.decide(batch)
            self._seconds["deciding"] += time.perf_counter() - start
            self._num_steps += 1
            self._num_request_steps += len(decisions)
            speculative = [decision for decision in decisions if decision.k > 0]
            if len(speculative) < len(decisions):
                self._count_plain(batch, decisions)
            self._k_counts[0] += len(decisions) - len(speculative)
            for decision in speculative:
                self._k_counts[min(decision.k, K_LIMIT)] += 1
                self._proposer_counts[decision.proposer] += 1
            return decisions

    def _count_plain(self, batch: BatchView, decisions: list[Decision]) -> None:
        """Count each plain decision under why it is plain: the engine's cap left no room (``capped``: max_tokens,
        the sequence length, the request's own max_k), the request asked for plain decode (``request``), or what
        the policy says of its step (`LearningPolicy.plain_cause`)."""
        cause = self._policy.plain_cause
        for view, decision in zip(batch.requests, decisions, strict=True):
            if decision.k == 0:
                self._plain_causes[
                    "capped" if view.max_k == 0 else "request" if view.override_mode == "off" else cause] += 1

    def observe(self, outcome: RoundOutcome) -> None:
        with self._lock:
            start = time.perf_counter()
            self._policy.observe(outcome)
            self._seconds["learning"] += time.perf_counter() - start

    def observe_step(self, timing: StepTiming) -> None:
        with self._lock:
            start = time.perf_counter()
            self._policy.observe_step(timing)
            self._seconds["learning"] += time.perf_counter() - start

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._policy.forget(request_id)

    @property
    def policy_seconds(self) -> float:
        """Seconds of the policy's own work so far (deciding and learning), without building the whole `stats`."""
        with self._lock:
            return sum(self._seconds.values())

    def stats(self) -> dict[str, Any]:
        """A JSON-able snapshot for operators (admin endpoint, metrics exporter)."""
        with self._lock:
            highest = max((k for k, count in enumerate(self._k_counts) if count), default=0)
            top = max(self._settings.k_max, highest)
            num_plain = self._k_counts[0]
            return {
                "policy": self._policy.name,
                "mode": self._settings.mode,
                "settings": self._settings.to_dict(),
                "pending_settings": self._pending.to_dict() if self._pending else None,
                "num_steps": self._num_steps,
                # seconds the policy took of the engine's steps: choosing k (``decide``) and learning from rounds and
                # step times; on a GPU, whose steps are short, the adaptive policy's planning is a visible share
                "policy_seconds": dict(self._seconds),
                "acceptance": self._learned.acceptance.summary(),
                "chosen_k": {
                    "histogram": self._k_counts[: top + 1],
                    "num_request_steps": self._num_request_steps,
                    "plain_decode_fraction": num_plain / self._num_request_steps if self._num_request_steps else None,
                    # plain request-steps by cause: capped, request, off, load_limit, no_proposal (fixed), plan,
                    # plain_streak (plans sampled where plain decode kept winning), guard_rejected, guard_probe,
                    # guard_trial, guard_joining (adaptive; policies/guard.py)
                    "plain_by_cause": dict(self._plain_causes),
                    "by_proposer": dict(self._proposer_counts),
                    "reused_plan_steps": self._policy.num_reused_plans,  # adaptive: steps that reused a plan
                    "k_probe_steps": self._policy.num_k_probes,  # adaptive: steps that drafted one token more
                },
                "cost_model": self._learned.cost_model.fit_summary(),
                "goodput_guard": self._learned.guard.summary(),
                "num_tracked_requests": self._learned.acceptance.num_tracked_requests,
            }
