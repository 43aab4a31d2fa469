"""The adaptive policy: per-request k and proposer from live acceptance, temperature and load.

Each step it estimates every request's alpha for each proposer it may use (policies/acceptance.py),
reads the current step-cost fit (policies/cost_model.py) and picks all k's jointly to maximise the
batch's expected goodput (policies/goodput.py). Load enters through the cost model: when tokens are
expensive (large, compute-bound batches) extra draft tokens stop paying and requests fall back to
k = 0; when the batch shrinks they pay again and speculation resumes, since alpha estimates are kept.
A request's first draft (and its first after plain steps) makes the draft model catch up on what it has
not seen; the plan charges that to the request, spread over the tokens it has left (``_catch_up_share``).

Six corrections on top of the pure optimum:
- hysteresis: a request's previous (proposer, k) gets a bonus of ``hysteresis`` in the objective, so k
  does not flip every step on estimation noise;
- exploration: a request at k = 0 learns nothing about its alpha; with probability
  ``exploration_rate`` it probes k = 1..2 with the proposer that costs least, if the expected cost of
  such probes stays below ``exploration_max_loss`` of the predicted goodput (so no draft probes under
  heavy load, where each would add whole draft passes to a large batch), or, for one request per step,
  whatever it costs while that proposer's acceptance at the temperature is unlearned;
- k probes: with probability ``k_probe_rate`` a planned step that speculates drafts one token more than planned for
  every speculating request, one fewer for one at its cap (not sticky: the next plan starts from the plan's own k).
  The step-cost fit needs steps of more than one k to tell what a fed token costs from what verifying at all costs
  (c from g, policies/cost_model.py): while every step at about one batch size drafts k = 1, it cannot, and where it
  put the unknown share on c, k = 1 looked best for good (at 16 code requests, T = 0.7: 1.04x ``off`` in one process,
  1.14x at k = 3 in another); at the cap, likewise, k = 8 (`policies.goodput.k_probe`);
- plan sampling: where steps have decoded plainly ``PLAIN_STREAK`` times in a row at a batch-size and
  temperature bucket (by an all-plain plan or by the goodput guard's veto), the steps there decode plainly
  unplanned, but for a fraction ``REPLAN_RATE`` whose plan checks again (and exploration draws with it); a
  plan that speculates ends the streak, and another load or temperature is planned at once. An exploration
  probe does not end it: it is no plan to speculate, and what it teaches, the next sampled plan reads. At
  16-32 requests, where plain decode is optimal, planning every step cost 0.6-1.5% of the run's time for
  nothing. The other steps do not ask the goodput guard either: the sampled ones ask it at
  ``1 / REPLAN_RATE`` times its probe rate, so its probes start as often per step. At 32 prose requests,
  T = 0.7 (~24 ms steps), unplanned steps that asked it took 46-57 us, those that do not 22 us; the policy's
  `decide` took 70-80 us on average, then 30-33 (``off``: 7). On a VM with ~10 ms steps there it took 48 us
  against ``off``'s 7, 0.4% of the step time and about all of adaptive's shortfall against ``off`` in the
  cell: a third of its steps at 17-32 requests were planned (~150 us each), half of them in streaks that
  speculative steps had ended, mostly exploration probes. Once probes ended none, 11% were planned there (the
  sampled ones: 62-66 of 564 steps in 3 runs, against 179 of 562), and adaptive ran 1.010x [1.005, 1.015] its
  old self there in lockstep (0.999x ``off``), 1.000-1.002x at 16-32 code requests (T = 0.7, 1) and 1.010x at
  8 prose requests, T = 0 (intervals within +-1%);
- the goodput guard (policies/guard.py): where speculative steps (at this batch size and temperature)
  have not measurably emitted more tokens per second than plain steps, the step decodes plainly
  whatever the model predicts, or, where only the draft model's route lost, speculates with n-gram
  lookups only. It is asked before planning, so vetoed steps cost no planning time;
- measured speculation: the other way round, where the plan comes out all plain but the guard measured the
  draft route winning here, or is measuring it and the model predicts speculation within ``NEAR_TIE`` of
  plain decode, the step takes the model's best plan in which every request drafts. The model then picks
  how to speculate, and the measurements whether: fitted mostly on plain steps, it erred by ~10% on
  speculative ones, and kept 8 requests at T = 0.7 on plain decode for whole runs while fixed draft k = 2
  ran 1.09x faster. Where the model puts speculation further below plain decode, a probe burst that has not
  speculated yet is declined and ends: it would plan each of its steps (plan sampling waits for bursts) and
  measure nothing. At 32 requests such bursts came about once per 240 steps and ran their 36 steps each.
  Measurements under way are not declined (a rejection's confirming probe, a first figure once begun, a near
  miss short of its sure verdict, the last two while the load stays at their bucket): see
  `GoodputGuard.decline_measurement`. Nor are they left to starve where the plan speculates with n-gram lookups
  alone (steps the guard books to the n-gram route): such a step takes the best plan in which the draft model
  proposes (`_draft_measurement`).

Plans are reused where they cost more than they are worth (`_hold`): at 32 requests on an H200 a plan took
0.6-0.9 ms of Python against ~10 ms steps, and the policy's own work was two thirds of its shortfall against fixed
n-gram k = 4 there (bench/virtual_clock.py). A speculating plan dearer than ``max_planning_share`` of the measured
step serves up to ``MAX_HELD_STEPS`` more steps, as many as bring planning within that share. In those, each request
keeps its choice; one that joined since, or whose options changed (an n-gram match came or went), is decided alone
at the plan's price and draft passes (`policies.goodput.best_alone`). Decided plainly instead, those requests had
cost 2-4% of throughput there, with the policy's time uncharged.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from policies.acceptance import temperature_bucket
from policies.base import BatchView, Decision, ProposerName, RequestView, StepTiming
from policies.cost_model import CostCoefficients
from policies.fixed import PLAIN, fixed_decision
from policies.goodput import BatchPlan, Candidate, best_alone, k_probe, plan_batch, with_probe
from policies.guard import ALL_PROPOSERS
from policies.guard_figures import batch_bucket, measures_step
from policies.learning import LearnedState, LearningPolicy
from policies.settings import PolicySettings

PLAIN_STREAK = 16  # plain steps in a row at a batch-size and temperature bucket before plans are sampled
REPLAN_RATE = 0.125  # then, the chance per step that the plan is made (and may resume speculation)
NEAR_TIE = 0.9  # speculation the model predicts at this share of plain decode's goodput or more is measured
NAMED_MODES = ("draft", "ngram")  # a request's `speculation.mode` naming its proposer
MAX_HELD_STEPS = 4  # a plan is reused for at most this many steps after its own
TIME_AVERAGE_WEIGHT = 0.2  # of the newest plan's and step's seconds in their averages
NO_OPTIONS = Candidate(alpha_draft=0.0, max_k_draft=0, alpha_ngram=0.0, max_k_ngram=0)


@dataclass
class HeldPlan:
    """A plan being reused (`AdaptivePolicy._hold`): what it was made for, its steps left, the cost fit, price
    (goodput) and draft passes it settled on, and each request's options (draft model, n-gram) when it was made."""

    made_for: tuple
    steps_left: int
    coeffs: CostCoefficients
    price: float
    draft_passes: int
    options: dict[str, tuple[bool, bool]]


class AdaptivePolicy(LearningPolicy):
    name = "adaptive"
    clock = staticmethod(time.perf_counter)  # times the plans (tests set a deterministic one)

    def __init__(self, settings: PolicySettings | None = None, learned: LearnedState | None = None) -> None:
        self._rng = random.Random(settings.seed if settings else 0)
        super().__init__(settings, learned)
        self._previous: dict[str, tuple[ProposerName, int]] = {}
        self._plain_streak: dict[tuple[int, int], int] = {}  # (batch bucket, T bucket) -> plain steps in a row
        self.last_plan: BatchPlan | None = None  # for stats and tests: the last plan, probes included
        self._plan_seconds = 0.0  # a plan's own seconds (options, plan, exploration), averaged
        self._step_seconds = 0.0  # a step's measured seconds, averaged
        self._held: HeldPlan | None = None  # the plan being reused (see `_hold`)

    def decide(self, batch: BatchView) -> list[Decision]:
        requests = batch.requests
        if not requests:
            return []
        if self.over_load_limit(batch.load):
            for view in requests:
                self._previous[view.request_id] = ("draft", 0)
            self.plain_cause = "load_limit"
            return [PLAIN] * len(requests)
        self.batch_temperature = sum(view.temperature for view in requests) / len(requests)
        regime = (batch_bucket(batch.load), temperature_bucket(self.batch_temperature))
        streak = self._plain_streak.get(regime, 0)
        sampled = streak >= PLAIN_STREAK and not self.guard.probing(batch.load, self.batch_temperature)
        if sampled and self._rng.random() >= REPLAN_RATE:
            self.last_plan = None
            self.plain_cause = "plain_streak"
            return self._with_named_proposers(requests, [PLAIN] * len(requests))
        # asked before planning: where speculation measurably loses, planning is waste. The guard judges by load,
        # not by this step's decodes: while a batch ramps up, its steps would otherwise speculate with the
        # verdict of a batch size the steady batch does not have.
        measured = measures_step(len(requests), batch.num_prefilling)
        allowed = self._allowed_proposers(batch.load, measured, batch.num_prefilling,
                                          probe_boost=1.0 / REPLAN_RATE if sampled else 1.0)
        if not allowed:  # a plain step like an all-plain plan: it extends the streak (see the module docstring)
            self.last_plan = None
            self.plain_cause = "guard_" + self.guard.plain_reason
            self._plain_streak[regime] = streak + 1
            return self._with_named_proposers(requests, [PLAIN] * len(requests))
        made_for = (regime, allowed, measured)
        self.plain_cause = "plan"
        held = self._held
        if held is not None and held.steps_left and held.made_for == made_for:
            held.steps_left -= 1
            self.num_reused_plans += 1
            self.last_plan = None
            return self._with_named_proposers(requests, self._held_decisions(held, requests, allowed))
        start = self.clock()
        options_of = self._options_reader(allowed)
        candidates = [self._candidate(view, *options_of(view)) for view in requests]
        coeffs = self.cost_model.coefficients()
        plan = plan_batch(candidates, coeffs, batch.num_prefill_tokens, self.settings.hysteresis)
        if measured and self.settings.goodput_guard:
            if not any(plan.ks):
                plan = self._measured_speculation(batch.load, candidates, coeffs, plan)
            elif not plan.num_draft_requests and self.guard.measuring_draft(batch.load, self.batch_temperature):
                plan = self._draft_measurement(candidates, coeffs, plan)
        for view, k, proposer in zip(requests, plan.ks, plan.proposers, strict=True):
            self._previous[view.request_id] = (proposer, k)  # before exploration: probes are not sticky
        speculates = any(plan.ks)
        self._plain_streak[regime] = 0 if speculates else streak + 1  # nor do they end streaks
        chosen = plan
        if speculates and self.settings.k_probe_rate > 0.0 and self._rng.random() < self.settings.k_probe_rate:
            plan = k_probe(plan, candidates, coeffs)
            self.num_k_probes += 1
        plan = self.last_plan = self._explore(plan, candidates, coeffs, requests)
        self._hold(made_for, chosen, requests, candidates, coeffs, self.clock() - start)
        return self._with_named_proposers(requests, [_decision(k, proposer) if k > 0 else PLAIN
                                                     for k, proposer in zip(plan.ks, plan.proposers, strict=True)])

    def observe_step(self, timing: StepTiming) -> None:
        super().observe_step(timing)
        if timing.step_seconds > 0.0:
            self._step_seconds = _averaged(self._step_seconds, timing.step_seconds)

    def _hold(self, made_for: tuple, plan: BatchPlan, requests: tuple[RequestView, ...], candidates: list[Candidate],
              coeffs: CostCoefficients, seconds: float) -> None:
        """Reuse the speculating plan just made (not an all-plain one: plan sampling thins those out) for as many steps
        as keep planning within ``max_planning_share`` of the step time, at most ``MAX_HELD_STEPS`` (``seconds``: what
        this plan took; ``made_for``: the regime, proposers and measurement it was made for, where it is reused)."""
        self._plan_seconds = _averaged(self._plan_seconds, seconds)
        share, step = self.settings.max_planning_share, self._step_seconds
        self._held = None
        if not any(plan.ks) or share is None or step <= 0.0:
            return
        steps = min(MAX_HELD_STEPS, math.ceil(self._plan_seconds / (share * step)) - 1)
        if steps > 0:
            options = {view.request_id: (c.max_k_draft > 0, c.max_k_ngram > 0)
                       for view, c in zip(requests, candidates, strict=True)}
            self._held = HeldPlan(made_for, steps, coeffs, plan.goodput, plan.draft_passes, options)

    def _held_decisions(self, held: HeldPlan, requests: tuple[RequestView, ...],
                        allowed: frozenset[str]) -> list[Decision]:
        """Each request's choice in the held plan (its k within the cap now). A request whose options changed since
        (it joined, or an n-gram match came or went) is decided alone, at the plan's price and draft passes.
        On a GPU most steps of a large batch are held ones, so the step's settings and verdicts are read once."""
        options_of, held_options, previous = self._options_reader(allowed), held.options, self._previous
        decisions = []
        for view in requests:
            cap, draft_ok, ngram_ok = options_of(view)
            if held_options.get(view.request_id) == (draft_ok, ngram_ok):
                proposer, k = previous[view.request_id]
                decisions.append(_decision(min(k, cap), proposer) if k else PLAIN)
                continue
            held_options[view.request_id] = (draft_ok, ngram_ok)
            k, proposer = best_alone(self._candidate(view, cap, draft_ok, ngram_ok), held.coeffs, held.price,
                                     held.draft_passes)
            previous[view.request_id] = (proposer, k)
            decisions.append(_decision(k, proposer) if k else PLAIN)
        return decisions

    def reconfigure(self, settings: PolicySettings) -> None:
        if settings.seed != self.settings.seed:
            self._rng = random.Random(settings.seed)
        self._held = None  # new settings: plan afresh
        super().reconfigure(settings)

    def forget(self, request_id: str) -> None:
        super().forget(request_id)
        self._previous.pop(request_id, None)

    def _allowed_proposers(self, batch_size: int, measured: bool, joining: int, probe_boost: float) -> frozenset[str]:
        """The goodput guard's measured verdicts override the model's plan (see policies/guard.py).
        ``probe_boost``: where only sampled steps ask, each asks at that many times the probe rate."""
        settings = self.settings
        if not settings.goodput_guard:
            return ALL_PROPOSERS
        return self.guard.allowed_proposers(batch_size, self.batch_temperature, self._rng,
                                            settings.guard_probe_rate * probe_boost, measured, joining)

    def _measured_speculation(self, load: int, candidates: list[Candidate], coeffs: CostCoefficients,
                              plain: BatchPlan) -> BatchPlan:
        """The model's all-plain plan, or its best speculative one where the guard's measurements call for it:
        where speculation measurably won here (the model erred), or where the guard is measuring it and the
        model predicts it within ``NEAR_TIE`` of plain decode (too close for the model to call) or the guard
        may not let the plan decline (a measurement under way)."""
        evidence = self.guard.speculation_evidence(load, self.batch_temperature)
        if evidence is None:
            return plain
        speculative = plan_batch(candidates, coeffs, 0, self.settings.hysteresis, speculate=True)
        if (evidence == "wins" or speculative.goodput >= NEAR_TIE * plain.goodput
                or not self.guard.decline_measurement(load, self.batch_temperature)):
            return speculative
        return plain

    def _draft_measurement(self, candidates: list[Candidate], coeffs: CostCoefficients, plan: BatchPlan) -> BatchPlan:
        """The model's best plan in which every request speculates and the draft model proposes for some (for
        all that may use it, if need be), where the guard's measurement of the draft route must go on but the plan
        speculates with n-gram lookups alone; ``plan`` where no request may use the draft model."""
        speculative = plan_batch(candidates, coeffs, 0, self.settings.hysteresis, speculate=True)
        if speculative.num_draft_requests:
            return speculative
        draft_only = [replace(c, alpha_ngram=0.0, max_k_ngram=0) if c.max_k_draft else c for c in candidates]
        speculative = plan_batch(draft_only, coeffs, 0, self.settings.hysteresis, speculate=True)
        return speculative if speculative.num_draft_requests else plan

    def _with_named_proposers(self, requests: tuple[RequestView, ...], decisions: list[Decision]) -> list[Decision]:
        """A request that named its proposer (``speculation.mode`` "draft" or "ngram") speculates with it
        whenever it can: the plan picks its k, but where the plan or the guard would decode it plainly it
        drafts the configured fixed k, as under the fixed policy. Only the operator's load limit stops it."""
        for i in [i for i, view in enumerate(requests) if view.override_mode in NAMED_MODES]:
            if decisions[i].k == 0:
                decisions[i] = fixed_decision(requests[i], requests[i].override_mode, self.settings)
        return decisions

    def _options_reader(self, allowed: frozenset[str]) -> Callable[[RequestView], tuple[int, bool, bool]]:
        """A reader of a request's k cap this step, and whether the draft model and whether n-gram lookups may
        propose for it (neither where its cap is 0). Built once a step: read for every request, its settings and
        verdicts looked up once."""
        k_max, min_match = self.settings.k_max, self.settings.ngram_min_match
        draft_allowed, ngram_allowed = "draft" in allowed, "ngram" in allowed

        def options(view: RequestView) -> tuple[int, bool, bool]:
            cap = min(view.max_k, k_max)
            if cap <= 0:
                return 0, False, False
            mode = view.override_mode
            draft_ok = draft_allowed and view.draft_available and mode in ("auto", "draft")
            ngram_ok = ngram_allowed and mode in ("auto", "ngram") and view.ngram_match_len >= (
                1 if mode == "ngram" else min_match)
            return cap, draft_ok, ngram_ok

        return options

    def _candidate(self, view: RequestView, cap: int, draft_ok: bool, ngram_ok: bool) -> Candidate:
        """The request's options (from `_options_reader`): which proposers it may use this step, their alphas, and
        the k cap."""
        if not (draft_ok or ngram_ok):
            return NO_OPTIONS  # plain whatever it chose before: no hysteresis to weigh, and the planner sets it aside
        acceptance = self.acceptance
        alpha_draft = alpha_ngram = 0.0
        lead_draft = lead_ngram = 1.0
        if draft_ok:  # the pooled alpha, split by position (policies/acceptance.py)
            alpha_draft, lead_draft = acceptance.by_position(view.request_id, "draft", view.temperature)
        if ngram_ok:
            alpha_ngram, lead_ngram = acceptance.by_position(view.request_id, "ngram", view.temperature,
                                                             view.ngram_match_len)
        return Candidate(  # positional: a third of the keyword call's time, for one per request a plan
            alpha_draft, cap if draft_ok else 0, alpha_ngram, cap if ngram_ok else 0,
            self._previous.get(view.request_id), _catch_up_share(view) if draft_ok else 0.0, lead_draft, lead_ngram,
        )

    def _explore(self, plan: BatchPlan, candidates: list[Candidate], coeffs: CostCoefficients,
                 requests: tuple[RequestView, ...]) -> BatchPlan:
        """Turn some k = 0 requests into short probes; the expected cost of probing stays within budget.

        Each of the n stuck requests probes with probability ``rate``, so a probe is taken only if its
        predicted goodput loss is at most ``exploration_max_loss / (rate * n)``: one request alone may
        probe with the draft model, 64 of them may not (but n-gram probes, nearly free, still pass).

        The budget prices a probe with the very estimates the probe would correct, so a proposer whose
        acceptance at this temperature is still unlearned (its trials there do not yet outweigh the prior)
        is probed whatever the predicted loss, by one request per step at most. Without this, the few slow
        first steps of a new engine (first-touch allocations, a whole-prompt draft prefill) could fit a
        draft model so dear that the plan never drafted, so nothing it believed ever changed: in 2 of 10
        new engines, 32 prose requests at T = 0.7 and 2 clients drafted 3 and 54 tokens (550 tok/s; the
        other 8: 710-800). With it, 1 of 10 lagged (drafted 412 tokens, 530 tok/s).
        """
        rate = self.settings.exploration_rate
        stuck = [i for i, c in enumerate(candidates) if plan.ks[i] == 0 and (c.max_k_draft or c.max_k_ngram)]
        if rate <= 0.0 or not stuck:
            return plan
        allowed_loss = self.settings.exploration_max_loss / (rate * len(stuck))
        unlearned_probe = False
        for index in stuck:
            if self._rng.random() >= rate:
                continue
            candidate = candidates[index]
            k = self._rng.randint(1, 2)
            choices: tuple[tuple[ProposerName, float, int, float], ...] = (
                ("ngram", candidate.alpha_ngram, candidate.max_k_ngram, candidate.lead_ngram),
                ("draft", candidate.alpha_draft, candidate.max_k_draft, candidate.lead_draft),
            )
            options = {
                proposer: with_probe(plan, coeffs, index, alpha, min(k, cap), proposer, candidate.draft_catch_up, lead)
                for proposer, alpha, cap, lead in choices
                if cap > 0
            }
            if not unlearned_probe:
                view = requests[index]
                unlearned = [option for proposer, option in options.items()
                             if not self.acceptance.is_learned(proposer, view.temperature, view.ngram_match_len)]
                if unlearned:
                    plan, unlearned_probe = max(unlearned, key=lambda option: option.goodput), True
                    continue
            probed = max(options.values(), key=lambda option: option.goodput)  # the cheaper way to learn
            if probed.goodput >= (1.0 - allowed_loss) * plan.goodput:
                plan = probed
        return plan


@functools.lru_cache(maxsize=64)
def _decision(k: int, proposer: ProposerName) -> Decision:
    """Decisions are frozen, so one per (k, proposer) serves every request: ~1.5 us each saved, ~20 a step."""
    return Decision(k, proposer)


def _averaged(average: float, value: float) -> float:
    """An exponential average that starts at its first value."""
    return value if average <= 0.0 else average + TIME_AVERAGE_WEIGHT * (value - average)


def _catch_up_share(view: RequestView) -> float:
    """The draft model's catch-up charged per token this request emits while drafting.

    Before its first draft the draft model must prefill the request's whole context, and after plain steps the
    tokens it missed. That is paid once, for all the tokens the request may then emit drafting: its lag over
    its tokens left. So a request that already drafts pays next to nothing to go on, and one near its end, or
    whose context is long, starts drafting only where drafting gains that much. Uncharged, at 16 requests
    (code, T = 0.7) the plan started drafting for requests that then drafted ~4 rounds each: the draft
    model caught up 3563 prompt tokens (5% of the run's time) for 96 draft rounds. Charged per round as if
    the request drafted k_max tokens in each, it overcharged shorter drafts and kept 8 requests at T = 1
    on plain decode where fixed draft k = 2 ran 1.1x faster.
    """
    if view.draft_lag <= 0:
        return 0.0
    return view.draft_lag / max(1, view.num_remaining_tokens)
