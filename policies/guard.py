"""A measured check on the cost model: does speculation pay at this batch size, right now?

The goodput plan (policies/goodput.py) is only as right as its linear cost model, which misses real
effects (padded attention, a CPU's matmul regimes, the engine's own per-step work). So the adaptive
policy also keeps the realised goodput of whole steps (policies/guard_figures.py): of plain steps per
batch size, and of speculative steps per batch-size bucket, temperature bucket and route (the draft
model proposed, or n-gram lookups alone), and this guard vetoes speculation that has not measurably
paid. The rules below are short; docs/goodput-guard.md records the measurements behind each one.

- The bar: speculation is taken up at 1 + ``REQUIRED_GAIN`` times plain decode's rate, then kept down to
  break-even (each flip costs a draft catch-up, and a ~20-step figure is noisy). A win that falls under
  break-even is measured again at once, a plain step then a burst, before it is rejected; a rejection that
  re-measurement makes is then probed like any other, its first burst boosted and not declinable.
- A trial from 17 requests on (`TRIAL_BUCKET`, policies/guard_trial.py): there a figure over its bar is taken up
  only once windows of plain steps and of steps that may speculate, in turns, side by side, read speculation
  1 + ``TRIAL_GAIN`` times as fast; paired plain figures strayed by up to 10% for whole runs there. A lost trial is
  a rejection like any. From 3 requests on (`REJECTION_TRIAL_BUCKET`), a figure that reads a loss rejects only on a
  trial too: there a 12-24-step figure can read 0.7-0.98x plain decode where sustained speculation wins by 10-19%.
  Below 17 requests that trial is won at break-even (below 9, at half its steps on a clear win), and a won one drops
  the figure (`Trial.rejection`).
- Enough steps: no verdict before ``MIN_SPECULATIVE_SAMPLES`` speculative steps; a near miss (from
  ``NEAR_MISS``) rejects only on ``SURE_SAMPLES``.
- Like with like: speculation is compared with plain decode at its own mix of batch sizes, each of its
  steps paired with a plain step of that size as plain decode ran at that moment (where a size is
  unmeasured, the cost model's time scaled by its error in the bucket; once plain decode is measured there, a
  figure paired with those stand-ins is judged against its rate now, which may reject it but not take it up). Plain
  figures go stale after ``FRESH_SECONDS`` of steps; the next samples restart them, and once two agree on a pace,
  it moves the bucket's sizes not sampled (`PaceCheck`, `carry_pace`).
- Catch-up counts: steps where the draft model caught up on tokens it missed are measured like any,
  except the switch into speculation (a first figure's first step, a probe's first speculative step),
  a cost that sustained speculation does not pay.
- Steps that prompts join count, less what their prompts add to a plain step (measured per bucket and
  prompt token); until that is known, such steps decode plainly. A burst of prompts arriving at once is
  not measured (`measures_step`) and speculates only on a settled winning verdict.
- Probes keep both arms measured: plain probes, held until a plain step without joining prompts lands
  (joined steps meanwhile speculate, unless what prompts cost is ``FRESH_SECONDS`` old: they measure that);
  and for rejected speculation, bursts of ``PROBE_BURST`` speculative steps (at most ``PROBE_LIMIT``
  steps) whose figure replaces the older one. Their rates scale with what they are expected to lose
  (`_probe_scale`). A rejection's first burst comes at ``MAX_PROBE_BOOST`` times the rate, and the plan
  may not decline it (`decline_measurement`).
- A rejection stands while plain decode keeps its pace: a move over ``REGIME_SHIFT`` since speculation
  was measured re-measures it (the traffic may have changed).
- An untried batch-size bucket inherits a rejection from the nearest smaller one at its temperature
  (extra tokens only get dearer with the batch); temperatures pass no verdicts on. Its probe bursts confirm
  the rejection (the plan may not decline them) until one has measured the bucket.
- Routes: where the draft route lost and n-gram lookups did not, only n-gram lookups may propose; where
  the draft route is untried or measured and the n-gram route lost, only the draft model may. From 9
  requests on, where n-gram lookups alone win, the draft route's bar is their rate, not plain decode's (`_bar`).

Known weaknesses: at 17-32 requests, where speculation about breaks even, a win once taken up on its trial is held
down to break-even by its paired figure, whose plain side can be off for many steps; and each trial where speculation
loses costs about half its steps' loss. A trial's windows make the draft model catch up on what each plain window
decoded, a cost sustained speculation does not pay: the cost model's price of it is taken off (~1% of the speculative
arm's seconds at 16-32 code requests), so a trial is as right as that price.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from policies.acceptance import TEMPERATURE_BUCKETS, temperature_bucket
from policies.base import PROPOSERS, StepTiming
from policies.guard_figures import (
    Figure,
    JoiningCost,
    PaceCheck,
    average_in,
    batch_bucket,
    bucket_sizes,
    carry_pace,
    measures_step,
    mix_rate,
    rate_over_plain,
)
from policies.guard_trial import EARLY_BUCKET, REJECTION_TRIAL_BUCKET, TRIAL_BUCKET, Trial

MIN_SAMPLES = 3  # plain steps in a bucket before their rate counts
MEASURE_PLAIN_RATE = 0.1  # chance of a plain step while a bucket's plain rate is still unknown
REQUIRED_GAIN = 0.05  # speculation must beat plain decode by this much to be taken up (and is kept to break-even)
MAX_PROBE_BOOST = 4.0  # the most times probe_rate a probe comes at (a near miss of the bar, or a win near break-even)
PROBE_BURST = 12  # a probe of rejected speculation measures this many speculative steps
PROBE_LIMIT = 3 * PROBE_BURST  # steps a probe burst may last while the plan decodes plainly in some of them
MIN_SPECULATIVE_SAMPLES = PROBE_BURST  # speculative steps before their rate counts: the first may be a catch-up
SURE_SAMPLES = 2 * MIN_SPECULATIVE_SAMPLES  # speculative steps before a near miss of the bar rejects speculation
NEAR_MISS = 1.0 - 2 * REQUIRED_GAIN  # speculation at or above this ratio to plain decode only just missed its bar
REGIME_SHIFT = 0.2  # plain decode's rate moved this much since rejected speculation was measured: measure it again
FRESH_SECONDS = 2.0  # a bucket's plain figures are stale after this many seconds of steps without a sample of theirs
NGRAM_BAR_BUCKET = 4  # from this batch-size bucket (9-16 requests) on, the draft route must beat winning n-gram lookups
ALL_PROPOSERS: frozenset[str] = frozenset(PROPOSERS)
NO_PROPOSERS: frozenset[str] = frozenset()
DRAFT_ONLY: frozenset[str] = frozenset({"draft"})
NGRAM_ONLY: frozenset[str] = frozenset({"ngram"})


PlainEstimate = Callable[[int], float]  # batch size -> predicted seconds of a plain-decode step


class GoodputGuard:
    """Realised tokens/s of plain steps per batch size, and of speculative steps per batch-size
    bucket, temperature bucket (acceptance, so what speculation yields, changes with T; plain decode
    costs the same at any T) and route (draft model or n-gram lookups only)."""

    def __init__(self, plain_estimate: PlainEstimate | None = None,
                 catch_up_token_seconds: Callable[[], float] = lambda: 0.0) -> None:
        """``plain_estimate``: a plain-decode step's seconds per batch size as the cost model predicts them, the
        stand-in for batch sizes whose plain steps are not measured yet; ``catch_up_token_seconds``: the cost model's
        price of a token the draft model catches up on, for trials (`LearnedState` wires in its cost model)."""
        self._plain_memo: dict[int, tuple[Callable[[int], float | None], bool]] = {}  # see `_plain_seconds`
        self.plain_estimate = plain_estimate
        self.catch_up_token_seconds = catch_up_token_seconds  # the price of a token the draft model catches up on
        self._plain: dict[int, dict[int, Figure]] = {}  # per batch-size bucket, per batch size
        # per batch-size bucket: what prompts joining plain steps added to them, beyond a plain step of the batch size
        self._joining: dict[int, JoiningCost] = {}
        self._speculative: dict[tuple[int, int, str], Figure] = {}  # (batch bucket, T bucket, route)
        self._burst_left: dict[tuple[int, int, str], int] = {}  # steps left of a speculative probe burst
        self._probes: dict[tuple[int, int, str], Figure] = {}  # the speculative steps of a probe, measured afresh
        self._catch_up: dict[int, float] = {}  # per batch-size bucket: a draft probe's catch-up, in plain steps extra
        self._burst_loss: dict[tuple[int, int, str], float] = {}  # what a probe burst cost, in plain steps (an EWMA)
        self._trial_loss: dict[tuple[int, int, str], float] = {}  # ... and the lost trials it led to (an EWMA)
        self._plain_probe_left: dict[int, int] = {}  # per batch-size bucket: steps left of an unmeasured plain probe
        self._clock = 0.0  # seconds of every step observed: the pace drifts with time, not with steps
        self._bucket = -1  # the batch-size bucket of the latest step's load (decodes and joining requests) ...
        self._bucket_moves = 0  # ... and how often the load has moved to another bucket (see `_draft_unsettled`)
        self._plain_at: dict[int, float] = {}  # per batch-size bucket: the clock at its latest plain sample
        self._pace_checks: dict[int, PaceCheck] = {}  # per batch-size bucket: its plain figures restarting (stale)
        self._joining_at: dict[int, float] = {}  # per batch-size bucket: the clock at its latest joining-cost sample
        # the step a trial routed: (its figure's key, whether it was the speculative arm's)
        self._trial_step: tuple[tuple[int, int, str], bool] | None = None
        # why `allowed_proposers` last allowed none (for operators' stats): joining | trial | probe | rejected
        self.plain_reason = "rejected"

    def observe(self, timing: StepTiming, temperature: float = 0.0) -> None:
        """Record one step with decodes (and perhaps prompts joining); speculative iff it fed drafts to the target.

        ``temperature``: the mean sampling temperature of the step's requests.
        """
        self._plain_memo.clear()  # the cost model has learned from this step
        if timing.step_seconds <= 0 or not math.isfinite(timing.step_seconds):
            return
        self._clock += timing.step_seconds
        load_bucket = batch_bucket(timing.batch_size + timing.num_prefilling)  # by load, as `allowed_proposers` asks
        if load_bucket != self._bucket:
            self._bucket, self._bucket_moves = load_bucket, self._bucket_moves + 1
        bucket = batch_bucket(timing.batch_size)
        trial_step, self._trial_step = self._trial_step, None
        if not measures_step(timing.batch_size, timing.num_prefilling):
            return
        sample = (timing.num_generated, timing.step_seconds, timing.batch_size)
        if trial_step is not None:
            self._add_to_trial(*trial_step, timing)
        self._charge_probes(timing, (bucket, temperature_bucket(temperature)))
        if not timing.speculative and not timing.num_prefilling:
            self._plain_probe_left.pop(bucket, None)
            stale = self._stale(self._plain_at, bucket)
            if stale and bucket > 1:  # buckets of one batch size (1, 2) have no other sizes to move
                self._pace_checks[bucket] = PaceCheck()
            figures = self._plain.setdefault(bucket, {})
            figure = figures.setdefault(timing.batch_size, Figure())
            check = self._pace_checks.get(bucket)
            restart = check.sample(figure, timing.batch_size, timing.step_seconds) if check is not None else stale
            figure.add(*sample, stale=restart)
            if check is not None and check.settled:
                carry_pace(figures, check)
                del self._pace_checks[bucket]
            self._plain_memo.clear()
            return
        plain_seconds, plain_measured = self._plain_seconds(bucket)
        if timing.num_prefilling:
            plain = plain_seconds(timing.batch_size)
            if plain is None:
                return
            joining = self._joining.setdefault(bucket, JoiningCost())
            if not timing.speculative:
                joining.add(timing, timing.step_seconds - plain, stale=self._stale(self._joining_at, bucket))
                return
            prompts_seconds = joining.seconds(timing.num_prefill_tokens)
            if joining.samples < MIN_SAMPLES or timing.step_seconds <= prompts_seconds:
                return  # what the prompts cost is unknown: nothing to take off
            # the prompts' prefill, as it costs plain decode, taken off: what remains is the decode step speculation ran
            sample = (timing.num_generated - joining.tokens(timing.num_prefilling),
                      timing.step_seconds - prompts_seconds, timing.batch_size)
        route = "draft" if timing.num_draft_tokens > 0 else "ngram"
        key = (bucket, temperature_bucket(temperature), route)
        probe = self._probes.get(key)
        first = probe is None and key not in self._speculative and timing.num_draft_catch_up_tokens > 0
        if first or (probe is not None and probe.catching_up):
            # the switch into speculation (a first figure's, or a probe's after a rejection): sunk, not measured
            if probe is not None:
                probe.catching_up = False
            else:
                self._speculative[key] = Figure(sampled_at_move=self._bucket_moves)
            self._observe_catch_up(key, timing.batch_size, sample[1])
            return
        arm = probe if probe is not None else self._speculative.setdefault(key, Figure())
        arm.add(*sample, plain_seconds=plain_seconds(timing.batch_size), plain_measured=plain_measured)
        arm.sampled_at_move = self._bucket_moves
        arm.plain_reference = mix_rate(arm.sizes, plain_seconds) or 0.0
        if probe is not None and probe.samples >= MIN_SPECULATIVE_SAMPLES:  # the probe's figure replaces the older one
            self._speculative[key] = self._end_probe(key)
            self._burst_left[key] = 0

    def _add_to_trial(self, key: tuple[int, int, str], speculative_arm: bool, timing: StepTiming) -> None:
        """Count a step that a trial routed, whole, where it ran at the trial's batch-size bucket."""
        spec = self._speculative.get(key)
        trial = spec.trial if spec is not None else None
        if trial is not None and not trial.done and batch_bucket(timing.batch_size) == key[0]:
            trial.add(speculative_arm, timing.num_prefill_tokens, timing.step_seconds,
                      max(0, timing.num_generated - timing.num_prefilling),  # less the joining requests' first tokens
                      timing.num_draft_catch_up_tokens, self.catch_up_token_seconds())
            if trial.done and trial.won and trial.rejection:
                # the figure that read the loss is dropped: speculation goes on, measured afresh, and holds down to
                # break-even (left in place, that figure overturned the won trial at the next step, and another trial
                # of the same loss began)
                self._speculative[key] = Figure(winning=True, trial=trial, sampled_at_move=self._bucket_moves)
            if trial.done and not trial.won:
                spec.probed = True  # the trial measured it afresh: its rejection is probed at the usual rate
                average_in(self._trial_loss, key, trial.loss)  # a cost of the burst that led to it (`_probe_loss`)

    def _stale(self, sampled_at: dict[int, float], bucket: int) -> bool:
        """Whether a sample of the bucket now finds its figure stale (``sampled_at``: when each bucket's was last
        sampled, set to now)."""
        stale = self._is_old(sampled_at, bucket)
        sampled_at[bucket] = self._clock
        return stale

    def _is_old(self, sampled_at: dict[int, float], bucket: int) -> bool:
        """Whether the bucket's latest sample in ``sampled_at`` is ``FRESH_SECONDS`` of steps old (none: not old)."""
        return self._clock - sampled_at.get(bucket, self._clock) >= FRESH_SECONDS

    def _charge_probes(self, timing: StepTiming, key: tuple[int, int]) -> None:
        """Charge each probe burst under way at this batch-size and temperature bucket what the step lost against
        plain decode, in plain steps: its seconds over a plain step's, less the tokens it emitted over the batch's
        (joining prompts taken off, as they cost plain decode alike). Every step of the burst counts: its catch-up,
        the steps the plan decoded plainly, the draft model's prefill of prompts that joined."""
        if not self._probes:  # most steps: no burst under way anywhere
            return
        probes = [probe for route in PROPOSERS if (probe := self._probes.get((*key, route))) is not None]
        if not probes:
            return
        plain = self._plain_seconds(key[0])[0](timing.batch_size)
        if not plain:
            return
        seconds, tokens = timing.step_seconds, float(timing.num_generated)
        if timing.num_prefilling:
            joining = self._joining.get(key[0])
            if joining is None or joining.samples < MIN_SAMPLES:
                return
            seconds -= joining.seconds(timing.num_prefill_tokens)
            tokens -= joining.tokens(timing.num_prefilling)
        for probe in probes:
            probe.loss += seconds / plain - tokens / timing.batch_size

    def _end_probe(self, key: tuple[int, int, str]) -> Figure:
        """Remove the probe under way at ``key`` and fold what its burst cost into the route's average."""
        probe = self._probes.pop(key)
        average_in(self._burst_loss, key, probe.loss)
        return probe

    def _observe_catch_up(self, key: tuple[int, int, str], batch_size: int, seconds: float) -> None:
        """What a probe's catch-up step cost beyond an ordinary speculative step, in plain steps: not part of
        the probe's figure (sustained speculation does not pay it), but of what the next probe will cost."""
        plain = self._plain_seconds(key[0])[0](batch_size)
        if not plain:
            return
        rejected = self._speculative.get(key)
        ordinary = rejected.seconds if rejected is not None and rejected.samples else plain
        extra = max(0.0, (seconds - ordinary) / plain)
        average_in(self._catch_up, key[0], extra)

    def allowed_proposers(self, batch_size: int, temperature: float, rng: random.Random, probe_rate: float,
                          measured: bool = True, joining: int = 0) -> frozenset[str]:
        """The proposers this step may use: both, the n-gram one only (the draft route lost here, n-gram
        speculation did not), or none (plain decode). Asked before planning; ``temperature``: the batch's mean.

        ``batch_size``: the load, the step's decodes and the ``joining`` requests (whose prompts share the step;
        the verdicts are those of the batch they join). ``measured=False`` for a step the guard will not see (a
        burst of prompts arriving, see `measures_step`): it speculates only where speculation has a settled winning
        verdict, and never probes, since a probe there would teach nothing and would make the draft model prefill
        the whole batch on top of the target's prefill.
        """
        self._trial_step = None
        key = (batch_bucket(batch_size), temperature_bucket(temperature))
        # what prompts add is measured at the bucket of the step's decodes, ``batch_size`` less the joining requests
        joining_cost = self._joining.get(batch_bucket(batch_size - joining)) if joining else None
        if measured and joining and (joining_cost is None or joining_cost.samples < MIN_SAMPLES):
            self.plain_reason = "joining"
            return NO_PROPOSERS  # what joining prompts cost a plain step here is unknown: measure it
        # a plain probe measures plain decode on a step without joining prompts, or what they cost once that is old
        probe_lands = not joining or self._is_old(self._joining_at, batch_bucket(batch_size - joining))
        draft, draft_verdict = self._route_decision((*key, "draft"), rng, probe_rate, measured, probe_lands)
        if draft == "plain":
            self.plain_reason = self._plain_step_reason()
            return NO_PROPOSERS
        if draft == "speculate":
            # The draft route is not known to win here: it is untried, or being measured. The plan may still
            # make a step n-gram-only, and such a step is judged by the n-gram route: where that route lost
            # here, only the draft model may propose (at 17-32 requests, a draft route that the plan never
            # used let it make 40% of the steps n-gram-only, at 0.93x plain decode).
            if draft_verdict != "speculate" and self._route_decision((*key, "ngram"), rng, probe_rate, measured,
                                                                     probe_lands)[0] == "rejected":
                return DRAFT_ONLY
            if self._trial_step is not None and self._trial_step[0][2] == "ngram":
                self._trial_step = None  # the n-gram route's trial did not route this step: the draft route did
            return ALL_PROPOSERS
        ngram, _ = self._route_decision((*key, "ngram"), rng, probe_rate, measured, probe_lands)
        if ngram == "speculate":
            return NGRAM_ONLY
        self.plain_reason = self._plain_step_reason() if ngram == "plain" else "rejected"
        return NO_PROPOSERS

    def _plain_step_reason(self) -> str:
        """Why a route made this step a deliberate plain one: a trial's plain window, or a plain probe."""
        return "trial" if self._trial_step is not None and not self._trial_step[1] else "probe"

    def probing(self, batch_size: int, temperature: float) -> bool:
        """Whether a probe burst of rejected speculation, or a trial, is under way at this batch size and
        temperature (the policy then plans every step, not a sample of them)."""
        key = (batch_bucket(batch_size), temperature_bucket(temperature))
        return any(self._burst_left.get((*key, route), 0) > 0 or self._on_trial((*key, route)) for route in PROPOSERS)

    def _on_trial(self, key: tuple[int, int, str]) -> bool:
        """Whether a trial is under way at ``key``."""
        spec = self._speculative.get(key)
        return spec is not None and spec.trial is not None and not spec.trial.done and not spec.winning

    def decline_measurement(self, batch_size: int, temperature: float) -> bool:
        """Whether the plan may decline to speculate where the guard is measuring speculation here (its model
        predicts speculation far below plain decode). A probe burst that has seen no speculative step yet then ends
        (it would plan every step for nothing); one under way goes on.

        False where a measurement must be made whatever the model says, since the model declining it is no
        evidence (docs/goodput-guard.md): a rejection's first burst (its confirming probe; an inherited rejection's
        bursts until one has measured the bucket), a draft route's first figure once begun (the switch into it
        taken), and a near miss short of ``SURE_SAMPLES``; these two only while the load has stayed at their bucket
        (`_draft_unsettled`)."""
        key = (batch_bucket(batch_size), temperature_bucket(temperature))
        if self._draft_unsettled(key):
            return False
        declined = True
        for route in PROPOSERS:
            probe = self._probes.get((*key, route))
            if probe is None:
                continue
            if probe.confirming:
                declined = False
                continue
            begun = probe.samples > 0 or (route == "draft" and not probe.catching_up)  # a catch-up is a step too
            if not begun:
                self._burst_left[(*key, route)] = 0
                del self._probes[(*key, route)]
        return declined

    def measuring_draft(self, batch_size: int, temperature: float) -> bool:
        """Whether the draft route is under a measurement the plan may not decline here (see `decline_measurement`):
        its first figure once begun, a near miss short of its sure verdict, or a rejection's confirming probe. The
        plan must then use the draft model even where it would speculate with n-gram lookups alone: steps without a
        draft-model user measure the n-gram route, and the measurement would starve."""
        key = (batch_bucket(batch_size), temperature_bucket(temperature))
        probe = self._probes.get((*key, "draft"))
        return (probe is not None and probe.confirming) or self._draft_unsettled(key)  # the dict lookup first

    def _draft_unsettled(self, key: tuple[int, int]) -> bool:
        """The draft route's first figure is begun (its switch taken) but short, or a near miss needs more steps, and
        the load has stayed at the bucket since the figure's latest step. A batch that left it (a draining batch
        passes a bucket in a few steps) comes back with requests the draft model has not seen: their catch-up is a
        new switch, not one taken, and the plan may decline it (docs/goodput-guard.md, s70)."""
        figure = self._speculative.get((*key, "draft"))
        return (figure is not None and figure.sampled_at_move == self._bucket_moves
                and self._judge(*key, "draft")[0] in (None, "measure more"))

    def speculation_evidence(self, batch_size: int, temperature: float) -> str | None:
        """What the measurements say of speculation with the draft model at this batch size and temperature: "wins"
        (a winning verdict), "measure" (a probe burst is under way, or the draft route needs more steps: a near
        miss, or untried here and not rejected at a smaller batch) or None (it lost)."""
        draft = (batch_bucket(batch_size), temperature_bucket(temperature), "draft")
        verdict = self._judge(*draft)[0]
        if verdict == "speculate":
            return "wins"
        if (self.probing(batch_size, temperature) or verdict == "measure more"
                or (verdict is None and not self._smaller_batches_reject(*draft))):
            return "measure"
        return None

    def _route_decision(self, key: tuple[int, int, str], rng: random.Random, probe_rate: float, measured: bool,
                        probe_lands: bool = True) -> tuple[str, str | None]:
        """(speculate | plain (a deliberate plain step: it measures the plain arm) | rejected (try a cheaper
        route), the route's verdict from `_judge`); ``probe_lands``: see `_plain_probe`."""
        verdict, ratio = self._judge(*key)
        spec = self._speculative.get(key)
        if spec is not None and not spec.winning and _tried_first(key[0], spec, verdict):
            if spec.trial is None:  # policies/guard_trial.py
                rejection = verdict == "decode plainly" and key[0] < TRIAL_BUCKET
                spec.trial = Trial(rejection=rejection, early_win=rejection and key[0] < EARLY_BUCKET)
            trial = spec.trial
            if not trial.done:
                if not measured:
                    return "rejected", verdict
                self._trial_step = (key, trial.speculates)
                return ("speculate" if trial.speculates else "plain"), verdict
        if not measured:
            return ("speculate" if verdict == "speculate" else "rejected"), verdict
        fallen = False
        if spec is not None and verdict is not None:
            fallen = spec.winning and verdict in ("decode plainly", "remeasure")  # measured again at once
            if spec.winning and verdict != "speculate":
                spec.trial = None  # a trial stands for one take-up
            spec.winning = verdict == "speculate"
        if verdict is None and not self._smaller_batches_reject(*key):
            return "speculate", verdict  # let the plan show what speculation does here
        if verdict == "measure more":
            return "speculate", verdict
        if verdict == "measure plain":
            probe = self._plain_probe(key[0], rng, MEASURE_PLAIN_RATE, probe_lands)
            return ("plain" if probe else "speculate"), verdict
        if verdict == "decode plainly" and not self._speculative[key].probed:
            probe_rate *= MAX_PROBE_BOOST  # sustained speculation lost: a probe checks it soon
        elif verdict is not None:  # the closer the verdict, the more often the other arm is measured
            probe_rate *= _probe_scale(ratio, self._catch_up.get(key[0], 0.0) if key[2] == "draft" else 0.0,
                                       burst_loss=self._probe_loss(key),
                                       winning=verdict == "speculate")
        if verdict == "speculate":
            self._speculative[key].probed = False  # should it lose from here on, a probe checks that soon
            # single steps (held until measured), no switching cost
            return ("plain" if self._plain_probe(key[0], rng, probe_rate, probe_lands) else "speculate"), verdict
        # speculation lost here, or is untried here and lost at a smaller batch: probe it in bursts
        left = self._burst_left.get(key, 0)
        if left == 0 and (fallen or verdict == "remeasure" or rng.random() < probe_rate / PROBE_BURST):
            left = PROBE_LIMIT
            if fallen:  # plain decode as it runs now first: the burst waits for it (below)
                self._plain_probe_left[key[0]] = PROBE_LIMIT
            rejected = self._speculative.get(key)  # None: inherited from a smaller batch, never measured here
            confirming = rejected is None or not rejected.probed
            # one boosted burst per rejection, whether or not the plan speculates in it; a fallen win's
            # re-measurement is none (should it reject, whichever figure then stands, that rejection is probed)
            probed = not fallen
            self._probes[key] = Figure(catching_up=key[2] == "draft", confirming=confirming, probed=probed)
            if rejected is not None:
                rejected.probed = probed
            if verdict == "remeasure":  # one burst per change of pace, whatever it measures
                spec = self._speculative[key]
                spec.plain_reference = self._plain_rate(key[0], spec.sizes)[0] or spec.plain_reference
        if left and self._plain_probe_left.get(key[0]):  # a plain probe under way: the burst waits for it
            self._burst_left[key] = left
            self._plain_probe_left[key[0]] -= 1
            return "plain", verdict
        self._burst_left[key] = max(0, left - 1)
        if left == 1 and key in self._probes:  # the burst ends before its probe measured enough: drop the probe
            self._end_probe(key)
        return ("speculate" if left > 0 else "rejected"), verdict

    def _probe_loss(self, key: tuple[int, int, str]) -> float | None:
        """What a probe burst of rejected speculation costs, in plain steps, as measured: the burst, and from 3
        requests on the trial it leads to where the trial is lost (a burst's figure that reads a loss is tried
        before it rejects; from 17 requests on one that reads a win too). A lost trial's speculative arm runs 32 steps
        to a burst's 12 measured ones: there most of what a burst costs is the trial after it."""
        burst = self._burst_loss.get(key)
        return None if burst is None else burst + self._trial_loss.get(key, 0.0)

    def _plain_probe(self, bucket: int, rng: random.Random, rate: float, lands: bool = True) -> bool:
        """Whether this step decodes plainly to measure plain decode: at ``rate``, once the bucket's plain figures
        are ``FRESH_SECONDS`` old or while their restart waits for samples (`PaceCheck`), and then on until a plain
        step of the bucket without joining prompts is measured (at most ``PROBE_LIMIT`` steps). Not where it would
        not land (``lands=False``: prompts join the step and what they cost is fresh): such a step speculates, and
        the probe waits for the next."""
        left = self._plain_probe_left.get(bucket, 0)
        if not left and (rng.random() < rate or self._is_old(self._plain_at, bucket) or bucket in self._pace_checks):
            left = PROBE_LIMIT
        if left:
            self._plain_probe_left[bucket] = left - 1
        return left > 0 and lands

    def _judge(self, bucket: int, temperature_key: int, route: str) -> tuple[str | None, float | None]:
        """(verdict, speculation's rate over its bar's at the same batch sizes or None). The verdict: speculate |
        decode plainly | measure plain | measure more (a near miss on too few steps) | remeasure (it lost, but
        plain decode's rate has moved by over ``REGIME_SHIFT`` since); None while speculation here is unmeasured.
        The bar is plain decode's rate, or for the draft route sometimes n-gram lookups' (`_bar`).

        Until plain steps of the bucket are measured, the cost model's plain rate stands in for them: where
        speculation loses even to that, plain steps follow (and measure the plain arm); where it wins, plain
        steps are still taken now and then to measure it ("measure plain"): a batch size that plain decode never
        ran at must not speculate however badly speculation does there.
        """
        spec = self._speculative.get((bucket, temperature_key, route))
        if spec is None or spec.samples < MIN_SPECULATIVE_SAMPLES:
            return None, None
        plain_rate, plain_measured = self._plain_rate(bucket, spec.sizes)
        if plain_rate is None:
            return "measure plain", None
        regime_shift = bool(spec.plain_reference) and abs(plain_rate / spec.plain_reference - 1.0) > REGIME_SHIFT
        trial = spec.trial
        if trial is not None and not spec.winning:  # a trial (of a take-up or a rejection)
            if not trial.done:  # under way: its windows route the steps, and its ratio is no bar yet (`_bar`)
                return "speculate", None
            ratio = trial.ratio
            if trial.won:
                return "speculate", ratio
            return ("remeasure" if regime_shift else "decode plainly"), ratio
        ratio = rate_over_plain(spec, plain_rate, plain_measured, taking_up=not spec.winning)
        ratio /= self._bar(bucket, temperature_key, route)
        if ratio >= (1.0 if spec.winning else 1.0 + REQUIRED_GAIN):
            return ("speculate" if plain_measured else "measure plain"), ratio
        if ratio >= NEAR_MISS and spec.samples < SURE_SAMPLES:
            return "measure more", ratio
        if regime_shift:
            return "remeasure", ratio
        return "decode plainly", ratio

    def _bar(self, bucket: int, temperature_key: int, route: str) -> float:
        """What the route's rate over plain decode's must beat: 1; for the draft route from ``NGRAM_BAR_BUCKET``
        on, where n-gram lookups alone win, their rate over plain decode's (each figure is paired with plain
        decode as it ran beside it, so the two compare). Judged against plain decode alone, a draft route that
        ran a little above it but below n-gram lookups alone held speculation to its own pace. Not below 9
        requests: there a route's figure depends most on the plan's choice of route (at one code client the
        steps given to n-gram lookups, long matches, read 2.36x plain and vetoed a draft model that ran 1.43x
        off alone; docs/goodput-guard.md)."""
        if route != "draft" or bucket < NGRAM_BAR_BUCKET:
            return 1.0
        verdict, ngram = self._judge(bucket, temperature_key, "ngram")
        return ngram if verdict == "speculate" and ngram is not None and ngram > 1.0 else 1.0

    def _plain_rate(self, bucket: int, sizes: dict[int, float]) -> tuple[float | None, bool]:
        """(plain tokens/s over the batch-size mix ``sizes`` of the bucket or None, whether plain decode was
        measured in the bucket)."""
        seconds, measured = self._plain_seconds(bucket)
        return mix_rate(sizes, seconds), measured

    @property
    def plain_estimate(self) -> PlainEstimate | None:
        return self._plain_estimate

    @plain_estimate.setter
    def plain_estimate(self, estimate: PlainEstimate | None) -> None:
        self._plain_estimate = estimate
        self.plain_estimate_changed()

    def plain_estimate_changed(self) -> None:
        """The cost model behind `plain_estimate` changed outside a step (new settings)."""
        self._plain_memo.clear()

    def _plain_seconds(self, bucket: int) -> tuple[Callable[[int], float | None], bool]:
        """(batch size -> a plain step's seconds, whether any size of the bucket is measured). A size's time: as
        measured; else the cost model's times the model's error at the bucket's measured sizes; else None. Kept
        per bucket while neither the plain figures nor the cost model change, from one observed step to the next:
        a step asks for it 2-3 times, each over up to 16 batch sizes."""
        memo = self._plain_memo.get(bucket)
        if memo is None:
            memo = self._plain_memo[bucket] = self._plain_step_seconds(bucket)
        return memo

    def _plain_step_seconds(self, bucket: int) -> tuple[Callable[[int], float | None], bool]:
        """`_plain_seconds`, worked out."""
        arms = self._plain.get(bucket, {})
        measured = {size: arm.seconds for size, arm in arms.items() if arm.samples >= MIN_SAMPLES}
        estimate = self.plain_estimate
        calibration: float | None = None  # computed at the first unmeasured size: most often none is asked for

        # not memoised: the cost model keeps its plain predictions per batch size, and a `functools.cache` made for
        # every step took longer to make than the calls it saved
        def seconds(size: int) -> float | None:
            nonlocal calibration
            if size in measured:
                return measured[size]
            predicted = estimate(size) if estimate is not None else 0.0
            if predicted > 0:
                if calibration is None:
                    modelled = sum(estimate(other) for other in measured)  # predicted > 0: estimate is set
                    calibration = sum(measured.values()) / modelled if modelled > 0 else 1.0
                return predicted * calibration
            if measured:  # no model at all: the nearest measured size's step time
                return measured[min(measured, key=lambda other: abs(other - size))]
            return None

        return seconds, bool(measured)

    def _smaller_batches_reject(self, bucket: int, temperature_key: int, route: str) -> bool:
        """Whether speculation lost at the nearest smaller batch size (same temperature and route) that has a
        settled verdict: an extra token only gets dearer as the batch grows, so an untried batch size starts
        from there, probing in bursts, instead of speculating at a loss until it has its own samples."""
        for smaller in range(bucket - 1, -1, -1):
            verdict, _ = self._judge(smaller, temperature_key, route)
            if verdict in ("speculate", "decode plainly"):
                return verdict == "decode plainly"
        return False

    def summary(self) -> list[dict[str, Any]]:
        """Per batch-size bucket: the sizes it covers, plain tokens/s (over all its plain steps), and speculative
        tokens/s by route and temperature, each with ``vs_plain``: its rate over plain decode's at its batch sizes."""
        out = []
        for bucket in sorted(set(self._plain) | {b for b, _, _ in self._speculative}):
            plain = list(self._plain.get(bucket, {}).values())
            speculative: dict[str, dict[str, Any]] = {}
            for (b, t, route), arm in sorted(self._speculative.items()):
                if b == bucket:
                    plain_rate, plain_measured = self._plain_rate(bucket, arm.sizes)
                    speculative.setdefault(route, {})[TEMPERATURE_BUCKETS[t]] = {
                        "tokens_per_s": arm.rate, "steps": arm.samples,
                        "vs_plain": rate_over_plain(arm, plain_rate, plain_measured) if plain_rate else None,
                        "probe_burst_loss": self._burst_loss.get((b, t, route)),
                        "trial_loss": self._trial_loss.get((b, t, route)),
                        "trial": None if arm.trial is None else {
                            "vs_plain": arm.trial.ratio, "steps": [side.steps for side in arm.trial.arms]}}
            plain_summary = None
            if plain:  # the arms' mean tokens and seconds per step, summed over batch sizes
                seconds = sum(arm.seconds for arm in plain)
                plain_summary = {"tokens_per_s": sum(arm.tokens for arm in plain) / seconds if seconds > 0 else 0.0,
                                 "steps": sum(arm.samples for arm in plain)}
            out.append({"batch_sizes": bucket_sizes(bucket), "plain": plain_summary, "speculative": speculative})
        return out


def _tried_first(bucket: int, spec: Figure, verdict: str | None) -> bool:
    """Whether the route's steps go to a trial's windows: one is under way, or a figure's verdict here waits for one
    (a take-up from ``TRIAL_BUCKET`` on, a rejection from ``REJECTION_TRIAL_BUCKET`` on; a lost trial's rejection
    stands)."""
    if spec.trial is not None:
        return not spec.trial.done
    return ((verdict == "speculate" and bucket >= TRIAL_BUCKET)
            or (verdict == "decode plainly" and bucket >= REJECTION_TRIAL_BUCKET))


def _probe_scale(vs_plain: float | None, catch_up: float = 0.0, winning: bool = False,
                 burst_loss: float | None = None) -> float:
    """The probe rate's multiplier, from speculation's rate over plain decode's (``vs_plain``, None: unknown).

    Rejected speculation (below its bar, 1 + ``REQUIRED_GAIN``): ``2 x REQUIRED_GAIN / shortfall``, at most
    ``MAX_PROBE_BOOST``: 2 at break-even, the most just under the bar, falling as 1 / shortfall where it
    clearly lost. A draft-route burst also pays its first step, the draft model's catch-up (``catch_up``: what
    that cost beyond an ordinary speculative step, in plain steps, as the last probes measured it), so the
    shortfall is the whole burst's, over ``PROBE_BURST``. Where bursts were measured whole (``burst_loss``: plain
    steps lost over a burst, an average, see `_charge_probes`), the dearer of the two counts. Winning speculation
    (``winning``: over its bar, or kept down to break-even): plain steps at ``2 x REQUIRED_GAIN / gain`` of the
    rate, at most ``MAX_PROBE_BOOST``: rarer the more it wins (each plain probe gives up part of a step's tokens
    and makes the draft model catch up in the next), more often the closer it runs to break-even, where a plain
    step costs next to nothing and the verdict rests most on how fresh the plain figures it is paired with are.
    Either way the throughput that probing is expected to cost, the probed share times what that arm loses per
    step, stays below probe_rate x 2 x ``REQUIRED_GAIN`` (0.5% at the default rate).
    """
    if not vs_plain:
        return 1.0
    gain = vs_plain - 1.0
    if winning or gain >= REQUIRED_GAIN:
        return min(MAX_PROBE_BOOST, 2.0 * REQUIRED_GAIN / gain) if gain > 0.0 else MAX_PROBE_BOOST
    burst_cost = PROBE_BURST * (REQUIRED_GAIN - gain) + catch_up  # in plain steps, the shortfall counted to the bar
    if burst_loss is not None:
        burst_cost = max(burst_cost, PROBE_BURST * REQUIRED_GAIN + burst_loss)
    return min(MAX_PROBE_BOOST, 2.0 * REQUIRED_GAIN * PROBE_BURST / burst_cost)
