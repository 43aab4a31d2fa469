"""An online model of what one engine step costs, fitted from measured `StepTiming`s.

target step:  seconds = a + b * batch_size + c * rows(num_tokens) + g * [the step verifies drafts]
draft model:  seconds = f + num_passes * (d + e * num_draft_requests) + h * catch_up_tokens

``rows``: the row count the target's linears run for the tokens fed, as the engine says (`CostModel.rows`): on a
CPU its packed linears run 17-64 rows rounded up to a multiple of 4 (engine/models/llama.py `padded_rows`), so one
request verifying a single draft beside 32 plain ones runs 36 rows, not 33. Priced as tokens, that cost c where it
cost 4c: at 32 code clients, T = 0.7, the plan drafted lone n-gram tokens that made a 13.3 ms step 14.8-16.5 ms
(g + c predicted 0.7 ms of it), and the goodput guard's probes of that route lost ~1% of the runs they fell in.

The draft runs one sequential forward pass per drafted position for all of its users at once, so its
time grows with the largest k among them, not with the sum. ``g`` and ``f`` are what a step pays for
speculating at all, whatever k: verification attends over multi-token queries (a separate attention
group from the decoding requests) and samples against the drafts; a draft round first catches up on the
last round's tokens. Fitted on a 2-core CPU at batch 1: g 1.3-1.6 ms and f ~1.2 ms beside a ~9 ms
plain step, while one more fed token cost 0.13-0.25 ms; folded into the per-token terms, they made
k = 1 look cheap and k = 4 dear, the reverse of what the clock said.

``h`` prices what the draft model feeds beyond one token per user: a request's whole context on its
first draft round, and the tokens it missed while it decoded plainly. At 16 requests on the bundled
pair, fixed draft k = 2 spent 8% of its time there (~30 us per token on one CPU thread); such rounds
were once left out of the fit, and the plan started drafting for requests at a price it never saw.

Fits are ridge regressions over a window of recent steps (512), pulled towards a prior scaled to the
measured level: the relative defaults at first, later the last values the data determined well.
Directions the window does not determine (e.g. b vs c while every step feeds one token per request) stay
at the prior instead of swinging to nonsense, negative coefficients are clamped to zero, and steps far off a
first fit (a stalled host) are left out of the final one (`ridge_fit_nonnegative`). The target's
fit also keeps the last plain steps once its window has moved past them (`_KeptPlainRows`). A fit is
redone every 8 steps, and once the window is full whenever a 32nd of it is new (every 16 steps), but after the
first 16 steps no more often than keeps refits within ``REFIT_BUDGET`` of the steps' measured seconds. Every
policy learns (``off`` too, for a later switch to ``auto``), and fitting from the rows every 8 steps took ~100 us
of an engine step at 32 prose requests (0.4% of it; 63 us now), mostly in numpy's per-call costs. Beside the CPU
engine's forward passes a refit took 0.4-0.9 ms, so every 16 steps of ~5 ms (1 client) it cost ~0.7% of the run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from policies.base import StepTiming
from policies.cost_audit import PredictionAudit

# Relative defaults before data: verifying k+1 = 5 tokens at batch 1 costs ~1.05 of a 1-token step
# (memory-bound), one draft forward pass costs ~0.2 of a target step, and a token the draft model
# catches up on ~0.1 of a token fed to the target (measured: 30 us beside 0.27 ms at 16-32 requests).
# Unidentified cost (every step feeding one token per request makes b and c inseparable) is put mostly on
# c, the per-token cost: that errs towards plain decode, the choice that cannot lose. It could hold the plan at
# k = 1 where longer drafts pay, though: with every step at k <= 1, the window never tells c from g (at 16 code
# requests, T = 0.7, c = 1.14 ms kept k = 1 at 1.04x `off`; a fit of c = 0.48 ms, g = 2.3 ms drafted k = 3 at 1.14x;
# docs/goodput-guard.md, s52). So the adaptive policy's k probes (`k_probe_rate`) add steps of one k more.
DEFAULT_VERIFY = (0.010, 2e-5, 1e-4, 0.0)
DRAFT_RELATIVE_COST = 0.2
CATCH_UP_RELATIVE_COST = 0.1
MIN_SECONDS = 1e-6
PRIOR_PSEUDO_OBSERVATIONS = 2.0  # the defaults weigh as much as this many observations' spread
PRIOR_FLOOR = 1e-3  # keeps fully collinear directions at the prior
KEPT_PLAIN_ROWS = 64  # the target's fit keeps this many of the last plain steps beyond its window
KEPT_PLAIN_HORIZON = 3  # ... for at most this many windows' worth of later steps
OUTLIER_SPREADS = 8.0  # a row whose deleted residual is this many robust spreads off their median is left out
REFIT_SHARE = 32  # a full window is refitted once this share of its rows is new (every 16 steps at 512)
REFIT_BUDGET = 0.002  # after the first steps, refits take at most this share of the steps' seconds ...
MAX_REFIT_INTERVAL = 128  # ... but one is redone at least this many steps after the last
REFIT_AVERAGE_WEIGHT = 0.25  # of the newest refit's seconds in their average
WELL_DETERMINED = 0.05  # max relative error of a coefficient's share of a step for it to count as learned
PRICE_ROWS = True  # price the target's fed tokens at the rows its linears run (False: as fed; for A/B runs)

RowCount = Callable[[int], int]  # tokens fed to the target -> rows its linears run


@dataclass(frozen=True)
class DraftPlan:
    """How a step would use the draft model: passes = largest k of its users; catch_up_tokens: what it feeds
    them beyond one token each (the planner passes a share of each user's lag, see policies/adaptive.py)."""

    num_passes: int
    num_requests: int
    catch_up_tokens: float = 0.0


@dataclass(frozen=True)
class CostCoefficients:
    a: float  # seconds per target step
    b: float  # seconds per request in the step
    c: float  # seconds per token fed to the target
    d: float  # seconds per draft forward pass
    e: float  # seconds per draft request per pass
    f: float = 0.0  # seconds per draft round (any k)
    g: float = 0.0  # seconds a target step adds when it verifies drafts (any k)
    h: float = 0.0  # seconds per token the draft model catches up on
    rows: RowCount | None = field(default=None, compare=False)  # c is per row of these (None: per token fed)

    def target_rows(self, num_tokens: int) -> int:
        """The rows the target's linears run for ``num_tokens`` fed tokens, the count ``c`` prices."""
        return num_tokens if self.rows is None else self.rows(num_tokens)

    def target_seconds(self, batch_size: int, num_tokens: int, verifies: bool = False) -> float:
        return max(MIN_SECONDS, self.a + self.b * batch_size + self.c * self.target_rows(num_tokens)
                   + (self.g if verifies else 0.0))

    def draft_seconds(self, plan: DraftPlan | None) -> float:
        if plan is None or plan.num_passes <= 0 or plan.num_requests <= 0:
            return 0.0
        return self.f + plan.num_passes * (self.d + self.e * plan.num_requests) + self.h * plan.catch_up_tokens

    def step_seconds(self, batch_size: int, num_tokens: int, plan: DraftPlan | None = None,
                     verifies: bool = False) -> float:
        """``verifies``: some request feeds drafts (a draft-model ``plan`` implies it)."""
        return self.target_seconds(batch_size, num_tokens, verifies or plan is not None) + self.draft_seconds(plan)


class _Window:
    """Fixed-size ring buffer of regression rows (features, seconds)."""

    def __init__(self, size: int, num_features: int) -> None:
        self.features = np.zeros((size, num_features))
        self.seconds = np.zeros(size)
        self.count = 0

    def add(self, features: tuple[float, ...], seconds: float) -> None:
        row = self.count % len(self.seconds)
        self.features[row] = features
        self.seconds[row] = seconds
        self.count += 1

    @property
    def filled(self) -> int:
        """Rows held: all added, until the ring is full."""
        return min(self.count, len(self.seconds))

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        filled = self.filled
        return self.features[:filled], self.seconds[:filled]


class _KeptPlainRows:
    """The last plain steps' rows, kept in the target's fit after the window has moved past them.

    Every plan weighs speculation against plain decode's predicted step, so that prediction must stay
    anchored in measured plain steps. Under sustained speculation they are a few percent of the window
    (the guard's probes), and its speculative rows alone do not separate a per-request from a per-token
    cost: at 8 code requests, T = 0.7, with ~2 of 8 requests drafting per step, the fit put 2.4 ms on each
    request and 0.15 ms on each token, predicting a plain step at 27 ms where it took 15.4. Kept, 16.7 against
    16.65. Rows older than ``KEPT_PLAIN_HORIZON`` windows are let go (see `rows_between`).
    """

    def __init__(self, size: int, num_features: int) -> None:
        self.window = _Window(size, num_features)
        self.positions = np.zeros(size, dtype=np.int64)  # each row's place in the target's stream of rows

    def add(self, features: tuple[float, ...], seconds: float, position: int) -> None:
        self.positions[self.window.count % len(self.positions)] = position
        self.window.add(features, seconds)

    def rows_between(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The kept rows whose place is in [start, end): those the window no longer holds, but not so old that
        a shared VM's drift (10-30% within minutes) has made them another machine's times."""
        features, seconds = self.window.rows()
        positions = self.positions[: len(seconds)]
        chosen = (positions >= start) & (positions < end)
        return features[chosen], seconds[chosen]


@dataclass(frozen=True)
class RegressionFit:
    coef: np.ndarray
    well_determined: np.ndarray  # per coefficient: does the window's data pin it down?
    rmse: float


def ridge_fit_nonnegative(features: np.ndarray, seconds: np.ndarray, prior: np.ndarray) -> RegressionFit:
    """`_ridge_fit`, then again without the rows whose deleted residual (what the fit to the other rows would miss
    them by: residual / (1 - leverage)) lies over ``OUTLIER_SPREADS`` robust spreads (1.4826 median absolute
    deviations) from the deleted residuals' median: a step the host stalled in is no cost of its features.

    From their median, not from zero: stalls only add time, and many of them shift the fit, so that every
    row misses it by much (the stalls above, the rest below). Measured from zero, twelve stalled rounds (+100 ms)
    among 46 made the spread so wide that none was left out: the draft fit put 52-66 ms on every round (a round
    took ~3-10 ms), and a new engine at 8 code requests, T = 0, drafted k = 1 for runs or not at all.

    Least squares follows a few stalls: on a new engine whose first three draft rounds (one or two passes each)
    took 30 ms more than the ~1-1.6 ms such rounds take, the draft fit put 5.5 ms on every round and nothing on a
    pass, over 346 rounds whose times grew plainly by 0.66 ms a pass, and the plan drafted k = 8 in 83% of its
    rounds, passes it took to be free. At other times such a start priced drafting so dear that the engine
    decoded plainly for thousands of steps. Plain residuals miss a stall that is the only row of its kind (the
    first round, which prefilled a prompt): the fit passes through it (0.27 ms put on each token caught up on,
    against ~0.02), hence the deleted ones.
    """
    moments = _Moments.of(features, seconds)
    fit = _ridge_fit(moments, features, seconds, prior)
    leverage = np.einsum("ij,ij->i", features @ np.linalg.inv(moments.gram + np.diag(moments.ridge)), features)
    deleted = (seconds - features @ fit.coef) / np.maximum(1.0 - leverage, 1e-3)
    off_centre = np.abs(deleted - _median(deleted))
    spread = 1.4826 * _median(off_centre)
    kept = off_centre <= OUTLIER_SPREADS * spread
    if spread <= 0 or kept.all() or kept.sum() < 2 * len(prior):
        return fit
    features, seconds = features[kept], seconds[kept]
    return _ridge_fit(_Moments.of(features, seconds), features, seconds, prior)


def _median(values: np.ndarray) -> float:
    """np.median's value, without its NaN checks and dispatch (12 us a call on 512 rows; this, 6)."""
    middle = len(values) // 2
    if len(values) % 2:
        return float(np.partition(values, middle)[middle])
    low, high = np.partition(values, (middle - 1, middle))[middle - 1 : middle + 1]
    return float((low + high) / 2.0)


@dataclass(frozen=True)
class _Moments:
    """What a fit needs of its rows, computed once per set of rows: the 4 x 4 normal equations and per-feature
    means, and from them the pull towards the prior per coefficient (``ridge``: by its feature's spread, since a
    coefficient is learned from how its feature varies, not from its level) and its ``floor``. Matrix products only:
    numpy's reductions along the rows' short axis cost 11 us (a mean) to 27 us (a variance) each, on 512 rows."""

    gram: np.ndarray  # features' X'X
    moment: np.ndarray  # X'y
    mean: np.ndarray  # per feature (features are counts: >= 0)
    floor: np.ndarray
    ridge: np.ndarray
    mean_seconds: float

    @classmethod
    def of(cls, features: np.ndarray, seconds: np.ndarray) -> _Moments:
        count = len(seconds)
        gram = features.T @ features
        mean = np.ones(count) @ features / count
        mean_square = np.diag(gram) / count
        floor = PRIOR_FLOOR * mean_square + 1e-18
        ridge = PRIOR_PSEUDO_OBSERVATIONS * np.maximum(mean_square - mean**2, 0.0) + floor
        return cls(gram, features.T @ seconds, mean, floor, ridge, float(seconds.sum()) / count)


def _ridge_fit(moments: _Moments, features: np.ndarray, seconds: np.ndarray, prior: np.ndarray) -> RegressionFit:
    """Least squares pulled towards ``prior`` (rescaled to the data's level), with coefficients >= 0.

    The pull is ``moments.ridge``, plus a floor that settles directions the data cannot see at all. Negative
    coefficients are fixed at zero and the rest refitted (a tiny active-set loop). A coefficient is
    well determined when the data alone would fix its contribution to a typical step within 5%, and some row
    has its feature: a cost that no step of the window paid (g where every step decoded plainly, h where no
    draft round caught up) contributes exactly nothing, which says nothing of it. Remembered as determined, such
    a coefficient took each fit's rescaling of its prior, and those compounded: g at 0.65-7.3x itself after
    5000 plain steps, h at 1e64 s a token in a simulation without catch-ups.
    """
    predicted_by_prior = float(moments.mean @ prior)
    scale = moments.mean_seconds / predicted_by_prior if predicted_by_prior > 0 else 1.0
    anchor = prior * max(scale, 0.0)
    ridge = moments.ridge
    free = np.ones(len(prior), dtype=bool)
    coef = np.zeros(len(prior))
    for _ in range(len(prior)):
        coef = np.zeros(len(prior))
        coef[free] = np.linalg.solve(_block(moments.gram, free) + np.diag(ridge[free]),
                                     moments.moment[free] + ridge[free] * anchor[free])
        if (coef >= 0).all():
            break
        free &= coef > 0
        if not free.any():
            return RegressionFit(np.zeros(len(prior)), np.zeros(len(prior), dtype=bool), 0.0)
    coef = np.maximum(coef, 0.0)
    residual = seconds - features @ coef
    rmse = float(np.sqrt(residual @ residual / len(seconds)))
    variance = rmse**2 * np.diag(np.linalg.inv(_block(moments.gram, free) + np.diag(moments.floor[free])))
    well = np.zeros(len(prior), dtype=bool)
    contribution_error = np.sqrt(variance) * moments.mean[free]
    well[free] = (contribution_error <= WELL_DETERMINED * abs(moments.mean_seconds)) & (moments.mean[free] > 0)
    return RegressionFit(coef, well, rmse)


def _block(gram: np.ndarray, free: np.ndarray) -> np.ndarray:
    """The normal equations of the free coefficients (all of them, as a rule)."""
    return gram if free.all() else gram[np.ix_(free, free)]


class _OnlineFit:
    """A windowed regression that remembers each coefficient's last well-determined value.

    A window of steady traffic (same batch size, plain decode) says nothing about what an extra token
    costs; refitting it from scratch would drift back to the defaults and, next time, mislead the policy
    into speculating. So the prior of every fit is the last well-determined coefficients, not the defaults.

    A window that has not grown since its last fit is not fitted again (unless the defaults its prior still
    takes have moved): the draft model's window grows only in steps that draft, and refitting the same rows
    only moves the coefficients along the pull towards their own last values (by ~1e-4 of themselves a refit),
    at the price of a second ridge fit beside the target's in every refit of a plain step.
    """

    def __init__(self, window: int, num_features: int, kept_plain: int = 0) -> None:
        self.window = _Window(window, num_features)
        self.kept_plain = _KeptPlainRows(kept_plain, num_features) if kept_plain else None
        self.remembered: np.ndarray | None = None
        self.ever_determined = np.zeros(num_features, dtype=bool)
        self.rmse = 0.0
        self._last: tuple[int, bytes, np.ndarray] | None = None  # (rows seen, prior's defaults, coefficients)

    def add(self, features: tuple[float, ...], seconds: float, plain: bool = False) -> None:
        if plain and self.kept_plain is not None:
            self.kept_plain.add(features, seconds, self.window.count)
        self.window.add(features, seconds)

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        features, seconds = self.window.rows()
        if self.kept_plain is None:
            return features, seconds
        window_start = self.window.count - len(self.window.seconds)
        kept_features, kept_seconds = self.kept_plain.rows_between(window_start - KEPT_PLAIN_HORIZON * len(
            self.window.seconds), window_start)
        return np.concatenate([features, kept_features]), np.concatenate([seconds, kept_seconds])

    def learned(self) -> list[bool]:
        """Per coefficient: has some window of data ever pinned it down (else it still leans on defaults)?"""
        return [bool(v) for v in self.ever_determined]

    def fit(self, default: np.ndarray, min_observations: int) -> tuple[np.ndarray, str]:
        """(coefficients, source) where source is fit | scaled_default | default."""
        features, seconds = self.rows()
        prior = default if self.remembered is None else np.where(self.remembered > 0, self.remembered, default)
        if len(seconds) == 0:
            return prior, "default"
        if len(seconds) < min_observations:  # too few to fit: keep the prior's shape at the measured level
            return prior * float(seconds.sum() / max((features @ prior).sum(), 1e-18)), "scaled_default"
        # what the prior takes from ``default`` (which moves with the target's fit), not from the fit's own past
        outside = (default if self.remembered is None else default[self.remembered <= 0]).tobytes()
        if self._last is not None and self._last[:2] == (self.window.count, outside):
            return self._last[2], "fit"
        result = ridge_fit_nonnegative(features, seconds, prior)
        base = prior if self.remembered is None else self.remembered
        self.remembered = np.where(result.well_determined, result.coef, base)
        self.ever_determined |= result.well_determined
        self.rmse = result.rmse
        self._last = (self.window.count, outside, result.coef)
        return result.coef, "fit"


class CostModel:
    """Windowed online fit of the step-cost coefficients, refitted as observations arrive."""

    clock = staticmethod(time.perf_counter)  # times the refits for ``refit_budget`` (tests may set another)

    def __init__(self, window: int = 512, min_observations: int = 4, refit_every: int = 8,
                 refit_budget: float | None = REFIT_BUDGET) -> None:
        self._target = _OnlineFit(window, 4, kept_plain=KEPT_PLAIN_ROWS)
        self._draft = _OnlineFit(window, 4)
        self._min_observations = min_observations
        self._refit_every = refit_every
        self._num_unfitted = 0
        self._refit_budget = refit_budget
        self._refit_seconds = 0.0  # a refit's own seconds, averaged
        self._seconds_unfitted = 0.0  # the measured seconds of the steps since the last refit
        self._verify_override: tuple[float, float, float] | None = None
        self._draft_override: float | None = None
        self._fitted: CostCoefficients | None = None
        self._effective: CostCoefficients | None = None  # the fit with the overrides, until either changes
        self._plain_seconds: dict[int, float] = {}  # batch size -> predicted plain step, until the fit changes
        self._sources = ("default", "default")
        self.audit = PredictionAudit()
        self.rows: RowCount | None = None  # the engine's `RowCount` for its target (None: rows are the tokens fed)

    def configure(
        self, verify_override: tuple[float, float, float] | None = None, draft_override: float | None = None
    ) -> None:
        """Operator overrides: (a, b, c) for the target; seconds per draft pass (the batch, round and catch-up
        terms dropped). An override is the whole cost of its model: its fixed cost of speculating is dropped too."""
        self._verify_override = verify_override
        self._draft_override = draft_override
        self._effective = None
        self._plain_seconds.clear()

    def set_rows(self, rows: RowCount | None) -> None:
        """Price the target's fed tokens at the rows its linears run (`RowCount`, the engine's; None: as fed). Set
        before the steps it is fitted on: each step's row count is taken as it is observed."""
        self.rows = rows
        self._fitted = self._effective = None
        self._plain_seconds.clear()

    def observe(self, timing: StepTiming) -> None:
        if (timing.batch_size <= 0 or not math.isfinite(timing.target_seconds) or timing.target_seconds <= 0
                or timing.num_prefill_tokens):  # it predicts decode/verify steps: prefill chunks would skew its fit
            return
        verifies = float(timing.speculative)
        coef = self.coefficients()  # what the plan of this step was priced with
        self.audit.record("verify" if verifies else "plain", timing.batch_size, timing.target_seconds,
                          coef.target_seconds(timing.batch_size, timing.num_tokens, timing.speculative))
        rows = coef.target_rows(timing.num_tokens)
        self._target.add((1.0, timing.batch_size, rows, verifies), timing.target_seconds, plain=not timing.speculative)
        if timing.num_draft_requests > 0 and timing.num_draft_tokens > 0 and timing.draft_seconds > 0:
            passes = timing.num_draft_passes or math.ceil(timing.num_draft_tokens / timing.num_draft_requests)
            plan = DraftPlan(passes, timing.num_draft_requests, timing.num_draft_catch_up_tokens)
            self.audit.record("draft", timing.batch_size, timing.draft_seconds, coef.draft_seconds(plan))
            self._draft.add((1.0, passes, passes * timing.num_draft_requests, timing.num_draft_catch_up_tokens),
                            timing.draft_seconds)
        self._num_unfitted += 1
        self._seconds_unfitted += timing.step_seconds or timing.target_seconds + timing.draft_seconds
        if self._refit_due():
            start = self.clock()
            self._refit()
            seconds, average = self.clock() - start, self._refit_seconds
            self._refit_seconds = average + REFIT_AVERAGE_WEIGHT * (seconds - average) if average else seconds

    def _refit_due(self) -> bool:
        """Every step at first, later every few: a refit moves the fit by about the share of its rows that are new,
        but no more often than keeps refits within their budget of the steps' seconds."""
        window = self._target.window
        if window.count <= 4 * self._min_observations:
            return True
        if self._num_unfitted < max(self._refit_every, window.filled // REFIT_SHARE):
            return False
        budget = self._refit_budget
        return (budget is None or self._num_unfitted >= MAX_REFIT_INTERVAL
                or self._refit_seconds <= budget * self._seconds_unfitted)

    def _refit(self) -> None:
        self._fitted = self._fit()
        self._num_unfitted = 0
        self._seconds_unfitted = 0.0
        self._effective = None
        self._plain_seconds.clear()

    def coefficients(self) -> CostCoefficients:
        if self._effective is not None:
            return self._effective
        if self._fitted is None:
            self._refit()
        coef = self._fitted
        if self._verify_override:
            a, b, c = self._verify_override
            coef = replace(coef, a=a, b=b, c=c, g=0.0)
        if self._draft_override is not None:
            coef = replace(coef, f=0.0, d=self._draft_override, e=0.0, h=0.0)
        self._effective = coef
        return coef

    def predict_step(self, batch_size: int, num_tokens: int, draft_plan: DraftPlan | None = None) -> float:
        """A step whose ``num_tokens`` exceed its batch verifies drafts (as the observed steps do)."""
        return self.coefficients().step_seconds(batch_size, num_tokens, draft_plan, num_tokens > batch_size)

    def predict_plain_step(self, batch_size: int) -> float:
        """`predict_step` of plain decode, remembered per batch size until the fit changes: the goodput guard asks
        it for every batch size of a bucket's mix, several times a step."""
        seconds = self._plain_seconds.get(batch_size)
        if seconds is None:
            seconds = self._plain_seconds[batch_size] = self.predict_step(batch_size, batch_size)
        return seconds

    def _fit(self) -> CostCoefficients:
        verify, verify_source = self._target.fit(np.array(DEFAULT_VERIFY), self._min_observations)
        a, b, c, g = max(float(verify[0]), MIN_SECONDS), float(verify[1]), float(verify[2]), float(verify[3])
        draft_default = np.array([0.0, DRAFT_RELATIVE_COST * a, DRAFT_RELATIVE_COST * (b + c),
                                  CATCH_UP_RELATIVE_COST * c])
        draft, draft_source = self._draft.fit(draft_default, self._min_observations)
        self._sources = (verify_source, draft_source)
        return CostCoefficients(a=a, b=b, c=c, d=float(draft[1]), e=float(draft[2]), f=float(draft[0]), g=g,
                                h=float(draft[3]), rows=self.rows if PRICE_ROWS else None)

    def fit_summary(self) -> dict[str, Any]:
        """JSON-able description of the current fit for operators."""
        coef = self.coefficients()
        verify_source, draft_source = self._sources
        return {
            "verify_source": "override" if self._verify_override else verify_source,
            "draft_source": "override" if self._draft_override is not None else draft_source,
            "num_observations": self._target.window.count,
            "num_draft_observations": self._draft.window.count,
            "verify_seconds": {"fixed": coef.a, "per_request": coef.b, "per_token": coef.c,
                               "per_speculating_step": coef.g},
            "per_token_is_per_row": coef.rows is not None,  # of the target's linears, padded (see the module doc)
            "verify_learned": dict(zip(("fixed", "per_request", "per_token", "per_speculating_step"),
                                       self._target.learned(), strict=True)),
            "draft_seconds": {"per_round": coef.f, "per_pass": coef.d, "per_request_per_pass": coef.e,
                              "per_catch_up_token": coef.h},
            "verify_rmse_seconds": self._target.rmse,
            "draft_cost_ratio": coef.d / coef.a if coef.a > 0 else None,
            "prediction_audit": self.audit.summary(),
        }
