"""A synthetic engine for judging speculation policies without models (the policy simulation tests).

Each request has a true per-position acceptance for the draft model and for the n-gram proposer; a
round drafting k tokens accepts a Bernoulli(alpha) run until the first failure and yields accepted + 1
tokens. A step costs a + b*batch + c*tokens fed + passes*(d + e*draft users) + h*catch-up tokens, with a
little noise, which is the shape of `CostModel`: memory-bound at small batches (a dominates: extra tokens
are nearly free), compute-bound at large ones (c dominates: extra tokens cost about as much as they
yield). As in the engine, the draft model catches up lazily: a request's first draft round first feeds it
the whole prompt, and a round after plain or n-gram steps the tokens those emitted.

The request stream (alphas, temperatures, lengths) depends only on the seed, so every policy run with
the same seed sees the same requests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from policies.base import BatchView, RequestView, RoundOutcome, SpeculationPolicy, StepTiming

TEMPERATURES = (0.0, 0.0, 0.7, 1.0)
TEMPERATURE_ACCEPTANCE = {0.0: 1.0, 0.7: 0.9, 1.0: 0.8}


@dataclass(frozen=True)
class SimCost:
    """Seconds: the defaults are a small GPU-like regime where speculation stops paying near batch 64."""

    verify_fixed: float = 8e-3
    verify_per_request: float = 5e-5
    verify_per_token: float = 2.5e-4
    draft_per_pass: float = 1.5e-3
    draft_per_request: float = 2e-5
    draft_per_catch_up_token: float = 2.5e-5  # ~0.1 of a token fed to the target, as measured on the bundled pair
    noise: float = 0.03  # relative standard deviation of measured times
    # host time per drafted token outside the target's and the draft's timed passes (bookkeeping, commit):
    # the step's clock sees it, CostModel's fit never does
    untimed_per_draft_token: float = 0.0

    def target_seconds(self, batch_size: int, num_tokens: int) -> float:
        return self.verify_fixed + self.verify_per_request * batch_size + self.verify_per_token * num_tokens

    def draft_seconds(self, num_passes: int, num_requests: int, num_catch_up_tokens: int = 0) -> float:
        if not num_requests:
            return 0.0
        return (num_passes * (self.draft_per_pass + self.draft_per_request * num_requests)
                + self.draft_per_catch_up_token * num_catch_up_tokens)


@dataclass
class SimRequest:
    request_id: str
    temperature: float
    alpha_draft: float
    alpha_ngram: float
    repetitive: bool  # its text repeats the prompt: long n-gram matches, high n-gram acceptance
    num_remaining: int
    draft_lag: int  # tokens the draft model has not seen: the prompt, until the first draft round
    num_output: int = 0


@dataclass(frozen=True)
class SimResult:
    num_tokens: int
    seconds: float
    num_steps: int
    num_speculative_request_steps: int
    num_request_steps: int

    @property
    def goodput(self) -> float:
        return self.num_tokens / self.seconds


def new_request(rng: random.Random, request_id: str) -> SimRequest:
    temperature = rng.choice(TEMPERATURES)
    repetitive = rng.random() < 0.25
    return SimRequest(
        request_id=request_id,
        temperature=temperature,
        alpha_draft=rng.uniform(0.45, 0.9) * TEMPERATURE_ACCEPTANCE[temperature],
        alpha_ngram=rng.uniform(0.75, 0.92) if repetitive else rng.uniform(0.05, 0.25),
        repetitive=repetitive,
        num_remaining=rng.randint(64, 256),
        draft_lag=rng.randint(32, 320),
    )


def _match_len(rng: random.Random, request: SimRequest) -> int:
    if request.repetitive:
        return rng.randint(3, 8) if rng.random() < 0.9 else 0
    return rng.randint(1, 2) if rng.random() < 0.3 else 0


def _accepted(rng: random.Random, alpha: float, k: int) -> int:
    accepted = 0
    while accepted < k and rng.random() < alpha:
        accepted += 1
    return accepted


def simulate(
    policy: SpeculationPolicy,
    num_concurrent: int,
    num_steps: int,
    cost: SimCost | None = None,
    seed: int = 0,
    k_max: int = 8,
    id_prefix: str = "sim",
) -> SimResult:
    """Run ``policy`` for ``num_steps`` steps at a constant ``num_concurrent`` running requests.

    Requests still running at the end are not forgotten: a later run with another ``id_prefix`` can
    continue with the same policy (a load change).
    """
    cost = cost or SimCost()
    stream_rng, draw_rng = random.Random(seed), random.Random(seed + 1)
    running = [new_request(stream_rng, f"{id_prefix}-{i}") for i in range(num_concurrent)]
    num_started, num_tokens, seconds, num_spec, num_request_steps = num_concurrent, 0, 0.0, 0, 0
    for _ in range(num_steps):
        match_lens = [_match_len(draw_rng, r) for r in running]
        views = tuple(
            RequestView(r.request_id, r.temperature, r.num_output, min(k_max, r.num_remaining - 1), m,
                        draft_lag=r.draft_lag, num_remaining_tokens=r.num_remaining)
            for r, m in zip(running, match_lens, strict=True)
        )
        decisions = policy.decide(BatchView(views))
        fed, draft_passes, draft_users, draft_tokens, catch_up, step_tokens = 0, 0, 0, 0, 0, 0
        for index, (request, view, decision) in enumerate(zip(running, views, decisions, strict=True)):
            k = max(0, min(decision.k, view.max_k))
            if decision.proposer == "ngram" and view.ngram_match_len == 0:
                k = 0
            fed += k + 1
            accepted = 0
            if k > 0:
                num_spec += 1
                alpha = request.alpha_draft if decision.proposer == "draft" else request.alpha_ngram
                accepted = _accepted(draw_rng, alpha, k)
                policy.observe(RoundOutcome(request.request_id, decision.proposer, request.temperature, k, accepted,
                                            view.ngram_match_len if decision.proposer == "ngram" else 0))
                if decision.proposer == "draft":
                    draft_passes, draft_users, draft_tokens = max(draft_passes, k), draft_users + 1, draft_tokens + k
                    catch_up, request.draft_lag = catch_up + request.draft_lag, 0
            produced = min(accepted + 1, request.num_remaining)
            if k == 0 or decision.proposer != "draft":
                request.draft_lag += produced
            request.num_remaining -= produced
            request.num_output += produced
            num_tokens += produced
            step_tokens += produced
            if request.num_remaining <= 0:
                policy.forget(request.request_id)
                running[index] = new_request(stream_rng, f"{id_prefix}-{num_started}")
                num_started += 1
        target = cost.target_seconds(len(views), fed) * _noise(draw_rng, cost.noise)
        draft = cost.draft_seconds(draft_passes, draft_users, catch_up) * _noise(draw_rng, cost.noise)
        step_seconds = target + draft + cost.untimed_per_draft_token * (fed - len(views))
        seconds += step_seconds
        num_request_steps += len(views)
        policy.observe_step(StepTiming(len(views), fed, target, draft_tokens, draft, draft_users, draft_passes,
                                       num_draft_catch_up_tokens=catch_up, step_seconds=step_seconds,
                                       num_generated=step_tokens))
    return SimResult(num_tokens, seconds, num_steps, num_spec, num_request_steps)


def _noise(rng: random.Random, relative: float) -> float:
    return max(0.5, 1.0 + rng.gauss(0.0, relative)) if relative > 0 else 1.0
