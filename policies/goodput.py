"""Choosing every request's k at once to maximise the batch's expected goodput (pure math, no state).

Leviathan et al.: with per-position acceptance alpha, drafting k tokens yields
E[tokens] = (1 - alpha^(k+1)) / (1 - alpha) per round (accepted drafts + the bonus/recovered token). The first
position accepts apart from the later ones (policies/acceptance.py), at lead * alpha, so a round yields
E[tokens] = 1 + lead * alpha (1 - alpha^k) / (1 - alpha); lead = 1 is Leviathan's.
SmartSpec generalises this to a batch: goodput = sum_i E_i(k_i) / T_step, where T_step depends on
everyone's choice: a + b*n + c*(tokens fed) on the target, plus g if anyone speculates, plus
f + K_d * (d + e*n_d) + h * (catch-up) for the draft model, K_d being the largest k among the n_d draft
users (the draft runs K_d sequential passes for all of them) and the catch-up each user's share of its
lag: the draft model catches a request up once, for all the tokens it then emits drafting, so each
expected token is charged lag / tokens left (see policies/adaptive.py).

Maximising a ratio is done by Dinkelbach's method: for a price lambda (seconds are worth lambda tokens)
maximise sum_i E_i - lambda * T. For a fixed K_d that problem separates per request (each picks plain,
n-gram, or draft with k <= K_d), so enumerating K_d = 0..k_max solves it exactly; the fixed cost g of
speculating at all is then weighed against plain decode for everyone. lambda is raised to the goodput
of the solution until it stops improving (a few iterations).

It runs every engine step, in plain Python: numpy's per-call overhead on arrays of a few requests made
the vectorised solver take 80-200 us at 1-8 requests, 1-3% of a small batch's step on the bundled pair;
this one takes 13-60 us there.

Most requests of a large batch cannot gain from any draft, and the planner sets them aside before it
builds anything (exactly, not by a heuristic): the k-th drafted token adds lead * alpha^k expected tokens and
costs its price (lam * c, plus lam * e for a draft-model user, who also pays its catch-up), so a request
gains at most the positive terms of sum_k (lead * alpha^k - price), less its catch-up; where that is nothing, it
does no better than plain decode at any k. Prices only rise over Dinkelbach's iterations, so a request
set aside at the first price stays aside. Where the bounds of all requests together do not even cover
what any speculating step pays on top (g, and f + d with a draft-model user), plain decode is optimal and
no price iteration runs. On plans captured from the engine, with the catch-up charged, the tighter bounds
and this check cut the planner's time from 105 to 63 us at 16 clients and from 133 to 75 us at 32.

The solve prices every drafted token at c, while a plan's step is evaluated at the rows the target's linears run
(`CostCoefficients.rows`: on a CPU, 17-64 rounded up to a multiple of 4), so a choice whose padding eats its gain is
no better than the plan it would replace and is not taken: Dinkelbach's iterations stop at the last plan that
raised the goodput. The bounds above ignore padding as the solve does. Rows a plan's padding runs anyway then take
drafted tokens of its speculating requests (`_fill_padding`), where that raises the goodput.

Hysteresis enters as a bonus: a request's previous choice counts its expected tokens times (1 + hysteresis),
so a new choice must beat it by more than the hysteresis to be taken.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from policies.base import ProposerName
from policies.cost_model import MIN_SECONDS, CostCoefficients, DraftPlan

MAX_DINKELBACH_ITERATIONS = 12
FORBIDDEN = -1e9  # the value of plain decode where the plan must speculate
DRAFT: ProposerName = "draft"
NGRAM: ProposerName = "ngram"


@dataclass(slots=True)
class Candidate:
    """One request's options this step; a max_k of 0 means that proposer is not an option. (Not frozen: a frozen
    dataclass's constructor took 3.1 us against 1.4, and the adaptive policy builds one per request every step.)"""

    alpha_draft: float
    max_k_draft: int
    alpha_ngram: float
    max_k_ngram: int
    previous: tuple[str, int] | None = None  # (proposer, k) chosen last step, for hysteresis
    draft_catch_up: float = 0.0  # the draft model's catch-up charged per token the request emits drafting
    lead_draft: float = 1.0  # each proposer's first position's acceptance over its alpha (the later positions')
    lead_ngram: float = 1.0


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
    draft_catch_up: float = 0.0  # catch-up tokens charged to the step: summed over the draft-model users

    @property
    def goodput(self) -> float:
        return self.expected_tokens / self.step_seconds


def expected_tokens(alpha: float, k: int, lead: float = 1.0) -> float:
    """E[tokens per round] for draft length k: the first position accepts at lead * alpha, the later ones at alpha
    (Leviathan's at lead 1)."""
    first = min(lead * alpha, 1.0)
    if alpha >= 1.0:
        return 1.0 + first * k
    return 1.0 + first * (1.0 - alpha ** k) / (1.0 - alpha)


def _clamped(alpha: float) -> float:
    return min(max(alpha, 0.0), 1.0 - 1e-9)  # alpha = 1 is the limit k + 1


@functools.lru_cache(maxsize=4096)
def _token_table(alpha: float, cap: int, lead: float = 1.0) -> tuple[float, ...]:
    """E[tokens] (`expected_tokens`) for k = 0..cap; k = 0 (plain decode, scored apart) is -inf. Cached: a request's
    alpha moves only after its own rounds, and a plan of 32 requests built 64 tables."""
    alpha = _clamped(alpha)
    return (-math.inf, *[expected_tokens(alpha, k, lead) for k in range(1, cap + 1)])


@dataclass
class _Tables:
    """Per request: the value of plain decode and E[tokens] per k for each proposer (index k, up to its cap),
    and the draft model's catch-up charged per token it emits drafting (on the true E[tokens], ``draft_true``).
    ``bumped``: per request, the k whose entry carries the hysteresis bonus in its previous proposer's table (0:
    none); beyond it, each table's value less the tokens' price is unimodal in k, so a scan may stop at its peak."""

    plain: list[float]
    draft: list[Sequence[float]]
    ngram: list[Sequence[float]]
    catch_up: list[float]
    draft_true: list[Sequence[float]]
    bumped_draft: list[int]
    bumped_ngram: list[int]


Choice = tuple[list[int], list[bool]]  # per request: k, and whether the draft model proposes (else n-gram)


def plan_batch(
    candidates: Sequence[Candidate],
    coeffs: CostCoefficients,
    num_prefill_tokens: int = 0,
    hysteresis: float = 0.0,
    speculate: bool = False,
) -> BatchPlan:
    """The goodput-maximising (k, proposer) of every request (exact for the cost model, see module doc).

    ``speculate``: the best plan in which every request that has a proposer drafts (k >= 1): plain decode is
    no option for it, and Dinkelbach's iterations start from one drafted token each, a feasible plan (started
    from a price of nothing, a plan of 32 requests took 514 us; from there, 211 us)."""
    if len(candidates) == 1:
        return _plan_alone(candidates[0], coeffs, 1 + num_prefill_tokens, 1.0 + hysteresis, speculate)
    return _plan_jointly(candidates, coeffs, num_prefill_tokens, hysteresis, speculate)


def _plan_jointly(candidates: Sequence[Candidate], coeffs: CostCoefficients, num_prefill_tokens: int,
                  hysteresis: float, speculate: bool) -> BatchPlan:
    """`plan_batch` by Dinkelbach's iterations (see the module doc)."""
    n = len(candidates)
    base_tokens = n + num_prefill_tokens
    bonus = 1.0 + hysteresis
    plain = [bonus if c.previous is not None and c.previous[1] == 0 else 1.0 for c in candidates]
    lam = sum(plain) / coeffs.target_seconds(n, base_tokens)
    if speculate:
        active = [i for i, c in enumerate(candidates) if c.max_k_draft or c.max_k_ngram]
        if not active:
            return _plain_plan(n, base_tokens, coeffs)
    else:
        bounds = [_gain_bounds(c, lam, coeffs) for c in candidates]
        active = [i for i, bound in enumerate(bounds) if bound is None or max(bound) > 0.0]
        if not active or _cannot_pay([bounds[i] for i in active], [plain[i] for i in active], lam, coeffs):
            return _plain_plan(n, base_tokens, coeffs)
    # the set-aside requests decode plainly: their tokens are a constant, their fed tokens part of the base
    subset = [candidates[i] for i in active]
    draft_tables = [_token_table(c.alpha_draft, c.max_k_draft, c.lead_draft) for c in subset]
    ngram_tables = [_token_table(c.alpha_ngram, c.max_k_ngram, c.lead_ngram) for c in subset]
    unbumped = [0] * len(subset)
    true = _Tables([1.0] * len(subset), draft_tables, ngram_tables,
                   [c.draft_catch_up for c in subset], draft_tables, unbumped, unbumped)
    objective = _with_hysteresis(true, subset, bonus)
    if speculate:
        objective.plain = [FORBIDDEN] * len(subset)
    aside_objective = sum(plain) - sum(plain[i] for i in active)
    choice: Choice = ([0] * len(subset), [False] * len(subset))
    if speculate:  # a feasible start: one drafted token each, by the draft model where it may propose
        choice = ([1] * len(subset), [c.max_k_draft > 0 for c in subset])
        tokens, seconds = _evaluate(choice, objective, n, base_tokens, coeffs)
        lam = (tokens + aside_objective) / seconds
    previous = _previous_choice(subset, objective)
    # a better start than plain decode: most often the optimum already, confirmed by one solve
    if all(previous[0]) if speculate else any(previous[0]):
        tokens, seconds = _evaluate(previous, objective, n, base_tokens, coeffs)
        if (tokens + aside_objective) / seconds > lam:
            lam, choice = (tokens + aside_objective) / seconds, previous
    for _ in range(MAX_DINKELBACH_ITERATIONS):
        candidate = _solve_for_price(lam, objective, coeffs)
        tokens, seconds = _evaluate(candidate, objective, n, base_tokens, coeffs)
        if (tokens + aside_objective) / seconds <= lam * (1.0 + 1e-12):
            break
        lam, choice = (tokens + aside_objective) / seconds, candidate
    choice, (tokens, seconds) = _fill_padding(choice, true, aside_objective, n, base_tokens, coeffs)
    ks, uses_draft = [0] * n, [False] * n
    for i, k, draft in zip(active, *choice, strict=True):
        ks[i], uses_draft[i] = k, draft
    draft_ks = [k for k, draft in zip(*choice, strict=True) if draft]
    catch_up = sum(rate * table[k] for rate, table, k, draft in zip(true.catch_up, true.draft, *choice, strict=True)
                   if draft)
    return BatchPlan(
        ks=tuple(ks),
        proposers=tuple(DRAFT if draft or not k else NGRAM for k, draft in zip(ks, uses_draft, strict=True)),
        expected_tokens=tokens + n - len(active),
        step_seconds=seconds,
        batch_size=n,
        num_tokens=base_tokens + sum(ks),
        draft_passes=max(draft_ks, default=0),
        num_draft_requests=len(draft_ks),
        draft_catch_up=catch_up,
    )


def _plan_alone(c: Candidate, coeffs: CostCoefficients, base_tokens: int, bonus: float, speculate: bool) -> BatchPlan:
    """`plan_batch` for a batch of one: each (proposer, k) scored as it stands, the best taken: 14-16 us a plan, the
    joint solver's 62-73. At one prose client the policy's work had been 2.2-2.5% of adaptive's runs against fixed
    draft k = 4's 0.9%; with this, 1.8-2.1% (s74)."""
    previous = c.previous
    # `CostCoefficients.step_seconds` at batch 1, spelled out: a `DraftPlan` per option would cost more than the scan
    # (the property test holds the two together)
    a, f, d, e, h = coeffs.a + coeffs.b + coeffs.g, coeffs.f, coeffs.d, coeffs.e, coeffs.h
    best_value, best_k, best_draft = -math.inf, 0, False
    if not speculate or not (c.max_k_draft or c.max_k_ngram):
        plain = bonus if previous is not None and previous[1] == 0 else 1.0
        best_value = plain / coeffs.step_seconds(1, base_tokens)
    ngram = _token_table(c.alpha_ngram, c.max_k_ngram, c.lead_ngram)
    draft = _token_table(c.alpha_draft, c.max_k_draft, c.lead_draft)
    # the target's verifying step at each k (its fed tokens priced at the rows they run)
    target = [max(MIN_SECONDS, a + coeffs.c * coeffs.target_rows(base_tokens + k))
              for k in range(max(len(ngram), len(draft)))]
    for k in range(1, len(ngram)):
        tokens = ngram[k] * (bonus if previous == (NGRAM, k) else 1.0)
        value = tokens / target[k]
        if value > best_value:
            best_value, best_k = value, k
    for k in range(1, len(draft)):
        tokens = draft[k] * (bonus if previous == (DRAFT, k) else 1.0)
        value = tokens / (target[k] + f + k * (d + e) + h * c.draft_catch_up * draft[k])
        if value > best_value:
            best_value, best_k, best_draft = value, k, True
    if not best_k:
        return _plain_plan(1, base_tokens, coeffs)
    tokens = (draft if best_draft else ngram)[best_k]
    catch_up = c.draft_catch_up * tokens if best_draft else 0.0
    plan = DraftPlan(best_k, 1, catch_up) if best_draft else None
    return BatchPlan((best_k,), (DRAFT if best_draft else NGRAM,), tokens,
                     coeffs.step_seconds(1, base_tokens + best_k, plan, verifies=True), 1, base_tokens + best_k,
                     best_k if best_draft else 0, int(best_draft), catch_up)


def _gain_bounds(candidate: Candidate, lam: float, coeffs: CostCoefficients) -> tuple[float, float] | None:
    """Upper bounds on what the request's best n-gram and best draft-model choice gain over plain decode at
    price ``lam`` (see the module doc), the step's shared costs (g, f, d) left out; None for a request whose
    previous choice drafted (its hysteresis bonus lies there). The margin keeps rounding from ever setting
    aside a request at exactly its price."""
    if not (candidate.max_k_draft or candidate.max_k_ngram):
        return 0.0, 0.0
    if candidate.previous is not None and candidate.previous[1] > 0:
        return None
    token_price = lam * coeffs.c - 1e-9
    ngram = _best_run(_clamped(candidate.alpha_ngram), candidate.max_k_ngram, token_price, candidate.lead_ngram)
    if not candidate.max_k_draft:
        return ngram, 0.0
    # the catch-up taxes every token the request emits drafting:
    # E(k) (1 - tax) - 1 = sum_j (lead * alpha^j (1 - tax)) - tax
    tax = lam * coeffs.h * candidate.draft_catch_up
    draft = _best_run(_clamped(candidate.alpha_draft), candidate.max_k_draft, token_price + lam * coeffs.e,
                      (1.0 - tax) * candidate.lead_draft)
    return ngram, draft - tax


def _best_run(alpha: float, cap: int, price: float, worth: float = 1.0) -> float:
    """max over k <= cap of sum_{j <= k} (worth * alpha^j - price): the terms fall with j, so the positive ones
    (an upper bound where lead * alpha > 1, which `expected_tokens` caps)."""
    total, power = 0.0, worth
    for _ in range(cap):
        power *= alpha
        if power <= price:
            break
        total += power - price
    return total


def _cannot_pay(bounds: Sequence[tuple[float, float] | None], plain: Sequence[float], lam: float,
                coeffs: CostCoefficients) -> bool:
    """Whether the requests' best gains cannot cover what any speculating step pays on top (g, and f + d
    with a draft-model user): then plain decode is optimal at this price, and so (Dinkelbach) overall.
    Exact, and it spares the price iterations where many requests gain a little, less than the entry fee."""
    if any(bound is None for bound in bounds):
        return False
    ngram_gains = any_gains = 0.0
    for (ngram, draft), plain_value in zip(bounds, plain, strict=True):  # type: ignore[misc]
        ngram_gains += max(0.0, ngram + 1.0 - plain_value)  # a previous plain choice carries its bonus
        any_gains += max(0.0, max(ngram, draft) + 1.0 - plain_value)
    margin = 1e-9 * (1.0 + any_gains)
    return ngram_gains + margin <= lam * coeffs.g and any_gains + margin <= lam * (coeffs.g + coeffs.f + coeffs.d)


def _with_hysteresis(true: _Tables, candidates: Sequence[Candidate], bonus: float) -> _Tables:
    """The objective's tables: each request's previous choice counts its expected tokens times ``bonus``."""
    tables = _Tables(list(true.plain), list(true.draft), list(true.ngram), true.catch_up, true.draft_true,
                     [0] * len(candidates), [0] * len(candidates))
    for i, c in enumerate(candidates):
        if c.previous is None:
            continue
        proposer, k = c.previous
        if k == 0:
            tables.plain[i] *= bonus
            continue
        if proposer == DRAFT:
            per_request, bumped = tables.draft, tables.bumped_draft
        else:
            per_request, bumped = tables.ngram, tables.bumped_ngram
        if k < len(per_request[i]):
            table = per_request[i] = list(per_request[i])
            table[k] *= bonus
            bumped[i] = k
    return tables


def _previous_choice(candidates: Sequence[Candidate], tables: _Tables) -> Choice:
    """Each request's previous (proposer, k), its k cut to the proposer's cap now, or plain decode where that
    proposer is no option now: a feasible start for Dinkelbach's iterations."""
    ks, uses_draft = [], []
    for c, draft, ngram in zip(candidates, tables.draft, tables.ngram, strict=True):
        proposer, k = c.previous or (DRAFT, 0)
        k = min(k, len(draft if proposer == DRAFT else ngram) - 1)
        ks.append(k)
        uses_draft.append(k > 0 and proposer == DRAFT)
    return ks, uses_draft


def _solve_for_price(lam: float, tables: _Tables, coeffs: CostCoefficients) -> Choice:
    """argmax of sum_i E_i - lam * T over all choices, by enumerating the draft pass count K_d.

    Per request: the best choice without the draft model (plain or n-gram), and for each K_d what its best
    draft k <= K_d gains over that; the K_d whose summed gains best pay for its passes wins. Beyond a request's
    own cap its best draft k stays put while each pass costs it more, so its gains there only fall.
    """
    token_price, user_price, tax_rate = lam * coeffs.c, lam * coeffs.e, lam * coeffs.h
    k_top = max(len(t) for t in tables.draft) - 1
    gains = [0.0] * (k_top + 1)  # per K_d: summed gains of the requests that draft at it
    values: list[float] = []  # per request: the value of its best non-draft choice ...
    ngram_ks: list[int] = []  # ... and its n-gram k (0: plain decode)
    nets: list[list[float]] = []  # per request and draft k: its value less the tokens' and catch-up's price
    improved: list[list[int]] = []  # per request: the draft k's that beat every smaller k (the best k <= K_d's)
    for plain, draft, ngram, catch_up, draft_true, bumped_draft, bumped_ngram in zip(
            tables.plain, tables.draft, tables.ngram, tables.catch_up, tables.draft_true, tables.bumped_draft,
            tables.bumped_ngram, strict=True):
        value, k_ngram, last = plain, 0, -math.inf
        for k in range(1, len(ngram)):
            drafted = ngram[k] - token_price * k
            if drafted > value:
                value, k_ngram = drafted, k
            elif k > bumped_ngram + 1 and drafted <= last:
                break  # past the peak: no longer k beats it (see `_Tables`)
            last = drafted
        values.append(value)
        ngram_ks.append(k_ngram)
        net, firsts = [-math.inf], [0]
        nets.append(net)
        improved.append(firsts)
        tax = tax_rate * catch_up  # per true expected token: the catch-up spread over what it emits
        if value == FORBIDDEN and len(draft) > 1:
            # it must draft, by the draft model alone: any floor under its every draft choice, the draft passes'
            # price included (no K_d = 0), serves, and one near them keeps the sums exact (at -1e9 their rounding,
            # ~1e-7, lost the gain of a k = 6 over a k = 5)
            value = values[-1] = (draft[1] - tax * draft_true[1] - token_price - user_price * k_top
                                  - lam * (coeffs.d * k_top + coeffs.f) - 1.0)
        best, settled = -math.inf, len(draft)  # settled: from this pass count on, the best draft k is found
        for passes in range(1, len(draft)):
            drafted = draft[passes] - tax * draft_true[passes] - token_price * passes
            net.append(drafted)
            if drafted > best:
                best = drafted
                firsts.append(passes)
            elif passes > bumped_draft + 1 and drafted <= net[passes - 1]:
                settled = passes  # past the peak (see `_Tables`): each further pass only costs
                break
            gain = best - user_price * passes - value
            if gain > 0.0:
                gains[passes] += gain
        for passes in range(settled, k_top + 1):
            gain = best - user_price * passes - value
            if gain <= 0.0:
                break
            gains[passes] += gain
    base = sum(values)
    total, passes = base, 0
    for k_d in range(1, k_top + 1):
        if base + gains[k_d] - lam * (coeffs.d * k_d + coeffs.f) > total:
            total, passes = base + gains[k_d] - lam * (coeffs.d * k_d + coeffs.f), k_d
    ks, uses_draft = [], []
    for net, value, k_ngram, firsts in zip(nets, values, ngram_ks, improved, strict=True):
        k = firsts[-1]
        if k > passes:  # the last k that beat all smaller ones, among those within K_d
            k = next(first for first in reversed(firsts) if first <= passes)
        drafts = k > 0 and net[k] - user_price * passes > value
        ks.append(k if drafts else k_ngram)
        uses_draft.append(drafts)
    if any(ks) and total - lam * coeffs.g < sum(tables.plain):  # speculating does not pay its fixed cost
        return [0] * len(ks), [False] * len(ks)
    return ks, uses_draft


def _fill_padding(choice: Choice, tables: _Tables, aside: float, batch_size: int, base_tokens: int,
                  coeffs: CostCoefficients) -> tuple[Choice, tuple[float, float]]:
    """The choice with the rows the target's linears run beyond its fed tokens (their padding, `CostCoefficients.rows`)
    fed drafted tokens instead, where that raises the predicted goodput (``aside``: the set-aside requests' tokens),
    and its `_evaluate`. Each padded row goes to the speculating request whose next token is worth most, within its
    cap and, for a draft-model user, within the step's draft passes: the solve prices every token at c and does not
    see rows that cost nothing more."""
    evaluated = _evaluate(choice, tables, batch_size, base_tokens, coeffs)
    ks, uses_draft = choice
    num_tokens = base_tokens + sum(ks)
    free = coeffs.target_rows(num_tokens) - num_tokens
    if free <= 0 or not any(ks):
        return choice, evaluated
    passes = max((k for k, draft in zip(ks, uses_draft, strict=True) if draft), default=0)
    filled = list(ks)
    for _ in range(free):
        best, chosen = 0.0, -1
        for i, (k, draft) in enumerate(zip(filled, uses_draft, strict=True)):
            table = tables.draft[i] if draft else tables.ngram[i]
            if k and k + 1 < len(table) and not (draft and k + 1 > passes) and table[k + 1] - table[k] > best:
                best, chosen = table[k + 1] - table[k], i
        if chosen < 0:
            break
        filled[chosen] += 1
    if filled == ks:  # no request could take a row: nothing to weigh
        return choice, evaluated
    tokens, seconds = evaluated
    filled_tokens, filled_seconds = _evaluate((filled, uses_draft), tables, batch_size, base_tokens, coeffs)
    if (filled_tokens + aside) / filled_seconds > (tokens + aside) / seconds:
        return (filled, uses_draft), (filled_tokens, filled_seconds)
    return choice, evaluated


def _evaluate(choice: Choice, tables: _Tables, batch_size: int, base_tokens: int,
              coeffs: CostCoefficients) -> tuple[float, float]:
    """(expected tokens of the choice's requests under the given tables, predicted seconds of the whole step:
    ``batch_size`` requests, the choice's among them)."""
    ks, uses_draft = choice
    tokens, passes, users, catch_up = 0.0, 0, 0, 0.0
    for i, (k, draft) in enumerate(zip(ks, uses_draft, strict=True)):
        if k == 0:
            tokens += tables.plain[i]
        elif draft:
            tokens, users = tokens + tables.draft[i][k], users + 1
            if k > passes:
                passes = k
            catch_up += tables.catch_up[i] * tables.draft_true[i][k]
        else:
            tokens += tables.ngram[i][k]
    num_drafted = sum(ks)
    plan = DraftPlan(passes, users, catch_up) if users else None
    return tokens, coeffs.step_seconds(batch_size, base_tokens + num_drafted, plan, verifies=num_drafted > 0)


def _plain_plan(n: int, base_tokens: int, coeffs: CostCoefficients) -> BatchPlan:
    seconds = coeffs.step_seconds(n, base_tokens)
    return BatchPlan((0,) * n, (DRAFT,) * n, float(n), seconds, n, base_tokens, 0, 0)


def best_alone(candidate: Candidate, coeffs: CostCoefficients, price: float,
               draft_passes: int) -> tuple[int, ProposerName]:
    """The request's best (k, proposer) at ``price`` (tokens per second) in a speculating step whose other choices
    stand: plain decode, an n-gram draft, or a draft-model draft of at most the step's ``draft_passes`` (none where
    the draft model does not run: starting it, or adding passes, is a choice for the whole batch, `plan_batch`)."""
    token_price = price * coeffs.c
    best, choice = 1.0, (0, DRAFT)
    ngram = _token_table(candidate.alpha_ngram, candidate.max_k_ngram, candidate.lead_ngram)
    last = -math.inf
    for k in range(1, len(ngram)):
        value = ngram[k] - token_price * k
        if value <= last:
            break  # past the peak: each value is unimodal in k (see `_Tables`)
        if value > best:
            best, choice = value, (k, NGRAM)
        last = value
    if draft_passes and candidate.max_k_draft:
        draft = _token_table(candidate.alpha_draft, min(candidate.max_k_draft, draft_passes), candidate.lead_draft)
        tax, user_price = price * coeffs.h * candidate.draft_catch_up, price * coeffs.e * draft_passes
        last = -math.inf
        for k in range(1, len(draft)):
            value = draft[k] * (1.0 - tax) - token_price * k - user_price
            if value <= last:
                break
            if value > best:
                best, choice = value, (k, DRAFT)
            last = value
    return choice


def with_probe(
    plan: BatchPlan, coeffs: CostCoefficients, index: int, alpha: float, k: int, proposer: ProposerName,
    catch_up: float = 0.0, lead: float = 1.0,
) -> BatchPlan:
    """The plan with request ``index`` (now at k = 0) drafting k tokens with ``proposer`` instead (``catch_up``:
    the draft model's catch-up charged per token it emits, if that proposer is the draft model)."""
    draft_passes, num_draft, draft_catch_up = plan.draft_passes, plan.num_draft_requests, plan.draft_catch_up
    tokens = expected_tokens(alpha, k, lead)
    if proposer == "draft":
        draft_passes, num_draft = max(draft_passes, k), num_draft + 1
        draft_catch_up += catch_up * tokens
    num_tokens = plan.num_tokens + k
    draft = DraftPlan(draft_passes, num_draft, draft_catch_up) if num_draft else None
    return BatchPlan(
        ks=plan.ks[:index] + (k,) + plan.ks[index + 1 :],
        proposers=plan.proposers[:index] + (proposer,) + plan.proposers[index + 1 :],
        expected_tokens=plan.expected_tokens - 1.0 + tokens,
        step_seconds=coeffs.step_seconds(plan.batch_size, num_tokens, draft, verifies=True),
        batch_size=plan.batch_size,
        num_tokens=num_tokens,
        draft_passes=draft_passes,
        num_draft_requests=num_draft,
        draft_catch_up=draft_catch_up,
    )


def k_probe(plan: BatchPlan, candidates: Sequence[Candidate], coeffs: CostCoefficients) -> BatchPlan:
    """The plan with every speculating request drafting one token more with its proposer, or one fewer where it is
    at that proposer's cap (a k probe, see policies/adaptive.py).

    One fewer at the cap: steps that all draft one k cannot tell what a fed token costs, and a plan at the cap had no
    other. At one prose client, T = 1, the plan drafted k = 7-8 (the cap 8) in most steps, its fit putting 0-72 us on
    a fed token, while fixed draft k = 4 -> 6 cost 1.5-2.2 ms a step per token more (a draft pass ~1 ms of it), and
    ran 0.90x fixed draft k = 4 (s73_low_prose)."""
    ks, tokens, passes, users, catch_up = list(plan.ks), plan.expected_tokens, 0, 0, 0.0
    for i, (k, proposer, c) in enumerate(zip(plan.ks, plan.proposers, candidates, strict=True)):
        if k == 0:
            continue
        alpha, cap, lead = ((c.alpha_draft, c.max_k_draft, c.lead_draft) if proposer == DRAFT
                            else (c.alpha_ngram, c.max_k_ngram, c.lead_ngram))
        probed = ks[i] = k + 1 if k < cap else max(1, k - 1)  # a plan's k is within its proposer's cap
        tokens += expected_tokens(alpha, probed, lead) - expected_tokens(alpha, k, lead)
        if proposer == DRAFT:
            passes, users = max(passes, probed), users + 1
            catch_up += c.draft_catch_up * expected_tokens(alpha, probed, lead)
    num_tokens = plan.num_tokens + sum(ks) - sum(plan.ks)
    draft = DraftPlan(passes, users, catch_up) if users else None
    return replace(plan, ks=tuple(ks), expected_tokens=tokens, num_tokens=num_tokens, draft_passes=passes,
                   step_seconds=coeffs.step_seconds(plan.batch_size, num_tokens, draft, verifies=any(ks)),
                   draft_catch_up=catch_up)
