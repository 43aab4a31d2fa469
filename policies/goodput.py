"""Choosing every request's k at once to maximise the batch's expected goodput (pure math, no state).

Leviathan et al.: with per-position acceptance alpha, drafting k tokens yields
E[tokens] = (1 - alpha^(k+1)) / (1 - alpha) per round (accepted drafts + the bonus/recovered token).
SmartSpec generalises this to a batch: goodput = sum_i E_i(k_i) / T_step, where T_step depends on
everyone's choice: a + b*n + c*(tokens fed) on the target, plus g if anyone speculates, plus
f + K_d * (d + e*n_d) for the draft model, K_d being the largest k among the n_d draft users (the draft
runs K_d sequential passes for all of them).

Maximising a ratio is done by Dinkelbach's method: for a price lambda (seconds are worth lambda tokens)
maximise sum_i E_i - lambda * T. For a fixed K_d that problem separates per request (each picks plain,
n-gram, or draft with k <= K_d), so enumerating K_d = 0..k_max solves it exactly; the fixed cost g of
speculating at all is then weighed against plain decode for everyone. lambda is raised to the goodput
of the solution until it stops improving (a few iterations). Everything is vectorised over
[requests, k], a few hundred microseconds for 32 requests.

Hysteresis enters as a bonus: a request's previous choice counts its expected tokens times (1 + h),
so a new choice must beat it by more than h to be taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policies.base import ProposerName
from policies.cost_model import CostCoefficients, DraftPlan

MAX_DINKELBACH_ITERATIONS = 12
DRAFT: ProposerName = "draft"
NGRAM: ProposerName = "ngram"


@dataclass(frozen=True)
class Candidate:
    """One request's options this step; a max_k of 0 means that proposer is not an option."""

    alpha_draft: float
    max_k_draft: int
    alpha_ngram: float
    max_k_ngram: int
    previous: tuple[str, int] | None = None  # (proposer, k) chosen last step, for hysteresis


@dataclass(frozen=True)
class BatchPlan:
    ks: tuple[int, ...]
    proposers: tuple[ProposerName, ...]  # meaningless where k == 0
    expected_tokens: float
    step_seconds: float
    batch_size: int
    num_tokens: int  # fed to the target, prefill included
    draft_passes: int
    num_draft_requests: int

    @property
    def goodput(self) -> float:
        return self.expected_tokens / self.step_seconds


def expected_tokens(alpha: float, k: int) -> float:
    """Leviathan's E[tokens per round] for per-position acceptance alpha and draft length k."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _tables(alphas: np.ndarray, caps: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """E[tokens] per [request, k] with -inf where k is 0 or above the request's cap."""
    alphas = np.clip(alphas, 0.0, 1.0 - 1e-9)[:, None]  # alpha = 1 is the limit k + 1
    table: np.ndarray = (1.0 - alphas ** (ks[None, :] + 1)) / (1.0 - alphas)
    invalid = (ks[None, :] > caps[:, None]) | (ks[None, :] == 0)
    table[invalid] = -np.inf
    return table


def plan_batch(
    candidates: Sequence[Candidate],
    coeffs: CostCoefficients,
    num_prefill_tokens: int = 0,
    hysteresis: float = 0.0,
) -> BatchPlan:
    """The goodput-maximising (k, proposer) of every request (exact for the cost model, see module doc)."""
    if len(candidates) == 1:
        return _plan_single(candidates[0], coeffs, num_prefill_tokens, hysteresis)
    return _plan_general(candidates, coeffs, num_prefill_tokens, hysteresis)


def _plan_single(candidate: Candidate, coeffs: CostCoefficients, num_prefill_tokens: int,
                 hysteresis: float) -> BatchPlan:
    """One request: score each of its (at most 2 k_max + 1) options directly, in plain Python.

    Same optimum as the general solver (Dinkelbach converges to the best ratio), at a tenth of its cost,
    which matters where the steps are shortest: batch 1.
    """
    base_tokens = 1 + num_prefill_tokens
    previous = candidate.previous
    options: list[tuple[ProposerName, int, float]] = [(DRAFT, 0, 1.0)]
    for proposer, alpha, cap in ((DRAFT, candidate.alpha_draft, candidate.max_k_draft),
                                 (NGRAM, candidate.alpha_ngram, candidate.max_k_ngram)):
        alpha = min(max(alpha, 0.0), 1.0 - 1e-9)
        options += [(proposer, k, expected_tokens(alpha, k)) for k in range(1, cap + 1)]

    def seconds(proposer: ProposerName, k: int) -> float:
        draft = DraftPlan(k, 1) if proposer == DRAFT and k > 0 else None
        return coeffs.step_seconds(1, base_tokens + k, draft, verifies=k > 0)

    def objective(option: tuple[ProposerName, int, float]) -> float:
        proposer, k, tokens = option
        sticky = previous is not None and previous[1] == k and (k == 0 or previous[0] == proposer)
        return tokens * (1.0 + hysteresis if sticky else 1.0) / seconds(proposer, k)

    proposer, k, tokens = max(options, key=objective)
    return BatchPlan((k,), (proposer,), tokens, seconds(proposer, k), 1, base_tokens + k,
                     k if proposer == DRAFT else 0, 1 if proposer == DRAFT and k > 0 else 0)


def _plan_general(candidates: Sequence[Candidate], coeffs: CostCoefficients, num_prefill_tokens: int,
                  hysteresis: float) -> BatchPlan:
    n = len(candidates)
    k_top = max((max(c.max_k_draft, c.max_k_ngram) for c in candidates), default=0)
    base_tokens = n + num_prefill_tokens
    if k_top == 0:
        return _plain_plan(n, base_tokens, coeffs)
    ks = np.arange(k_top + 1)
    caps_draft, caps_ngram = (
        np.array([c.max_k_draft for c in candidates]),
        np.array([c.max_k_ngram for c in candidates]),
    )
    true_draft = _tables(np.array([c.alpha_draft for c in candidates]), caps_draft, ks)
    true_ngram = _tables(np.array([c.alpha_ngram for c in candidates]), caps_ngram, ks)
    obj_draft, obj_ngram, obj_plain = true_draft.copy(), true_ngram.copy(), np.ones(n)
    for i, c in enumerate(candidates):  # hysteresis bonus on last step's choice
        if c.previous is None:
            continue
        proposer, k = c.previous
        if k == 0:
            obj_plain[i] *= 1.0 + hysteresis
        elif k <= k_top:
            (obj_draft if proposer == "draft" else obj_ngram)[i, k] *= 1.0 + hysteresis

    rows = np.arange(n)
    choice = (np.zeros(n, dtype=int), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool))  # k, uses draft, uses ngram
    lam = obj_plain.sum() / coeffs.target_seconds(n, base_tokens)
    for _ in range(MAX_DINKELBACH_ITERATIONS):
        candidate = _solve_for_price(lam, obj_draft, obj_ngram, obj_plain, ks, coeffs)
        objective, seconds = _evaluate(candidate, obj_draft, obj_ngram, obj_plain, rows, base_tokens, coeffs)
        if objective / seconds <= lam * (1.0 + 1e-12):
            break
        lam, choice = objective / seconds, candidate
    return _to_plan(choice, true_draft, true_ngram, rows, base_tokens, coeffs)


def _solve_for_price(
    lam: float, obj_draft: np.ndarray, obj_ngram: np.ndarray, obj_plain: np.ndarray, ks: np.ndarray,
    coeffs: CostCoefficients,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """argmax of sum_i E_i - lam * T over all choices, by enumerating the draft pass count K_d."""
    token_price = lam * coeffs.c * ks
    net_ngram = obj_ngram - token_price  # [n, K+1]
    k_ngram = net_ngram.argmax(axis=1)
    value_ngram = net_ngram[np.arange(len(obj_plain)), k_ngram]
    value_other = np.maximum(obj_plain, value_ngram)  # best choice without the draft model
    net_draft = obj_draft - token_price  # [n, K+1]
    best_up_to = np.maximum.accumulate(net_draft, axis=1)  # best draft value with k <= K_d
    per_user = best_up_to - lam * coeffs.e * ks[None, :]
    totals = np.maximum(value_other[:, None], per_user).sum(axis=0) - lam * (coeffs.d * ks + coeffs.f * (ks > 0))
    passes = int(totals.argmax())
    use_draft = np.zeros(len(obj_plain), dtype=bool)
    k_draft = np.zeros(len(obj_plain), dtype=int)
    if passes > 0:
        use_draft = per_user[:, passes] > value_other
        k_draft = net_draft[:, : passes + 1].argmax(axis=1)
    use_ngram = ~use_draft & (value_ngram > obj_plain)
    k = np.where(use_draft, k_draft, np.where(use_ngram, k_ngram, 0))
    if k.any() and totals[passes] - lam * coeffs.g < obj_plain.sum():  # speculating does not pay its fixed cost
        return np.zeros_like(k), np.zeros_like(use_draft), np.zeros_like(use_ngram)
    return k, use_draft, use_ngram


def _evaluate(
    choice: tuple[np.ndarray, np.ndarray, np.ndarray], table_draft: np.ndarray, table_ngram: np.ndarray,
    plain: np.ndarray, rows: np.ndarray, base_tokens: int, coeffs: CostCoefficients,
) -> tuple[float, float]:  # fmt: skip
    """(expected tokens under the given tables, predicted step seconds) of a choice."""
    k, use_draft, use_ngram = choice
    tokens = np.where(use_draft, table_draft[rows, k], np.where(use_ngram, table_ngram[rows, k], plain))
    num_draft = int(use_draft.sum())
    plan = DraftPlan(int(k[use_draft].max()), num_draft) if num_draft else None
    return float(tokens.sum()), coeffs.step_seconds(len(rows), base_tokens + int(k.sum()), plan, verifies=bool(k.any()))


def _to_plan(
    choice: tuple[np.ndarray, np.ndarray, np.ndarray], true_draft: np.ndarray, true_ngram: np.ndarray,
    rows: np.ndarray, base_tokens: int, coeffs: CostCoefficients,
) -> BatchPlan:  # fmt: skip
    k, use_draft, use_ngram = choice
    tokens, seconds = _evaluate(choice, true_draft, true_ngram, np.ones(len(rows)), rows, base_tokens, coeffs)
    num_draft = int(use_draft.sum())
    return BatchPlan(
        ks=tuple(int(v) for v in k),
        proposers=tuple(NGRAM if ng else DRAFT for ng in use_ngram),
        expected_tokens=tokens,
        step_seconds=seconds,
        batch_size=len(rows),
        num_tokens=base_tokens + int(k.sum()),
        draft_passes=int(k[use_draft].max()) if num_draft else 0,
        num_draft_requests=num_draft,
    )


def _plain_plan(n: int, base_tokens: int, coeffs: CostCoefficients) -> BatchPlan:
    seconds = coeffs.step_seconds(n, base_tokens)
    return BatchPlan((0,) * n, (DRAFT,) * n, float(n), seconds, n, base_tokens, 0, 0)


def with_probe(
    plan: BatchPlan, coeffs: CostCoefficients, index: int, alpha: float, k: int, proposer: ProposerName
) -> BatchPlan:
    """The plan with request ``index`` (now at k = 0) drafting k tokens with ``proposer`` instead."""
    draft_passes, num_draft = plan.draft_passes, plan.num_draft_requests
    if proposer == "draft":
        draft_passes, num_draft = max(draft_passes, k), num_draft + 1
    num_tokens = plan.num_tokens + k
    draft = DraftPlan(draft_passes, num_draft) if num_draft else None
    return BatchPlan(
        ks=plan.ks[:index] + (k,) + plan.ks[index + 1 :],
        proposers=plan.proposers[:index] + (proposer,) + plan.proposers[index + 1 :],
        expected_tokens=plan.expected_tokens - 1.0 + expected_tokens(alpha, k),
        step_seconds=coeffs.step_seconds(plan.batch_size, num_tokens, draft, verifies=True),
        batch_size=plan.batch_size,
        num_tokens=num_tokens,
        draft_passes=draft_passes,
        num_draft_requests=num_draft,
    )
