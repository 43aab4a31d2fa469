"""A measured check on the cost model: does speculation pay at this batch size, right now?

The goodput plan (policies/goodput.py) is only as right as the cost model, and a linear step-cost
model misses real effects: padded attention grows with batch x (largest k + 1), a CPU's matmuls
change regime with the row count, the engine's own per-step work grows with the drafts. So the
adaptive policy also keeps the *realised* goodput (tokens emitted per second of whole step time) of
plain steps (per batch size) and of speculative steps (per batch-size bucket, and per temperature
bucket: what speculation yields depends on T), and vetoes speculation where speculative steps have
not been measurably faster (by ``REQUIRED_GAIN``) than plain ones: near break-even, the flips
between the two (each return to speculation makes the draft model catch up) and the noise of the
estimates would cost more than the gain. The bar is for taking speculation up; once taken, it is kept
down to break-even (the same reason the other way: a flip costs, and a figure over ~20 noisy steps dips
under a bar it truly clears). At 8 code requests, T = 0.7, sustained speculation read 0.97-1.15x plain
decode as its figure moved, around ~1.1x: with one bar for both ways it dipped under 1.05 sooner
or later, and the rejection, dear to probe there (the draft model first catches up on every request,
~2.5-3.4 plain steps), stood for runs while fixed draft k = 4 ran 1.01-1.15x ``off``. A win that falls under
break-even is measured again at once before it is rejected: a plain step (plain decode as it runs now, held until
measured), then a burst that measures speculation afresh, its figure replacing the fallen one as a probe's does
(`_route_decision`). The draft model is in step with the requests there, so this costs no catch-up, and where
speculation truly lost it costs a burst at about break-even. Rejected at once, the route waited for a probe: at 8
prose requests, T = 1, a figure that read 1.23x plain decode at 60 steps read 0.99x at 229, and the rejection stood
for ~200 steps (two thirds of a run) while fixed draft k = 2 ran 1.1x ``off``. Re-measured at once, two falls there
read 1.09x (speculation went on) and 0.72x (rejected).

Steps in which the draft model first had to catch up on tokens it missed (its lazy prefill, or a
return from plain decode) count like any other: the plan's own switching between plain and
speculative decode costs those catch-ups, and leaving them out made speculation look better than it
was. Speculation gets no verdict before ``MIN_SPECULATIVE_SAMPLES`` steps: judged on three, one of them
the draft's lazy prefill of a 150-token prompt, speculation at batch 1 looked half as fast as plain
decode and, so clearly lost, was hardly ever probed again. The one step left out is the first that
speculated at a batch-size bucket and temperature, if the draft model caught up in it: the switch into
speculation there, left out as a probe leaves out its first (below). At a cold start the draft model
prefills every running request's context in it: at 8 code requests, T = 0.7, that step fed it 1043 tokens
and took 32.8 ms beside 11-16 ms for the steps after it (~3.5 plain steps more); counted, it pulled a first
figure of 19 steps from 0.95x plain decode to 0.88x, under ``NEAR_MISS``: rejected at once.

A probe of rejected speculation is a burst that lasts until it has measured ``PROBE_BURST`` speculative
steps, as sustained speculation would run them (the plan may decode plainly in some of its steps: counted
by steps, bursts at 4 requests ended on 10 or 11 speculative ones and never replaced the rejected figure),
at most ``PROBE_LIMIT`` steps. Its first speculative step is not measured: there the draft model catches up
on everything the requests decoded plainly while speculation was rejected. That is a cost of the rejection,
sunk once the probe has begun, and sustained speculation does not pay it: charged to the burst, it made
speculation that ran 1.2x plain decode (batch 4, T = 1) read 0.85x, and the rejection stuck for three runs.
A rejection no probe has checked yet (sustained speculation can lose on a transient: four prompts arriving
at once, each draft-prefilled in one step) gets one probe burst at ``MAX_PROBE_BOOST`` times the rate. The
plan may decline a burst (`decline_measurement`: its model predicts speculation far below plain decode); one
that has not speculated yet then ends, since it would measure nothing. That one boosted burst, the rejection's
confirming probe, is an exception: the plan must speculate in it; so it must in a first figure it has begun, and
in a near miss short of its sure verdict (see `decline_measurement`).

Speculative steps are kept apart by route: those where the draft model proposed (alone or beside
n-gram lookups) and those where only n-gram lookups did. An n-gram proposal costs no model pass, so
at large batches, where the draft model's passes no longer pay, n-gram speculation alone can still
beat plain decode; the guard then allows the n-gram proposer only. The other way round, where the draft
route is untried or being measured but the n-gram route lost, it allows the draft model only: the plan
may pick no draft-model user, and every step it then made n-gram-only would be a step of the losing route.

A probe measures speculation afresh: once it has ``MIN_SPECULATIVE_SAMPLES`` steps, they replace the
older speculative figure instead of nudging its average. What was rejected was measured under an older
plan (at first contact the plan drafts short, from a cautious prior acceptance), and at an average
over ~20 steps one burst of 12 moved it only halfway, so speculation that had come to pay (batch 4,
T = 1: draft k = 2 1.2x plain) stayed rejected.

Speculation is compared with plain decode at the same batch sizes: each speculative figure keeps how
often each batch size occurred in its steps, and its bar is plain decode's rate over that same mix
(plain step times are kept per batch size). A bucket spans sizes whose plain rates differ by half (at
9 and 16 requests), and its plain steps came mostly from the tails of runs, where the batch drains
through the bucket's low end, while speculation was measured at its top: compared bucket to bucket,
speculation at batch 16 looked 25% faster than plain decode when it was break-even. A batch size
whose plain steps are not measured takes the cost model's plain step time, scaled by how the model
erred at the measured sizes of the same bucket.

Steps that requests join (their prompts' prefill chunks share the pass) count too, less what the prompts cost.
A joining prompt costs plain and speculative decode alike, but speculation pays more in such steps (its draft
model catches up on prompts that joined the step before), and it has more of them, since it finishes requests
sooner: at 32 prose clients, T = 1, they were 65-70% of fixed draft k = 2's time (48% of ``off``'s). On steps
without prefill alone, draft k = 2 read 0.98-1.02x ``off`` while whole runs read 0.95-0.97x, and the adaptive
policy, judging by those steps, drafted in 83-93% of request-steps at 0.93x ``off``. What prompts cost is
measured on plain steps, per batch-size bucket: what joining prompts added to a plain step of its batch size,
per prompt token (code prompts differ in length by up to ten times). Until that is known (``MIN_SAMPLES`` such
steps), steps that prompts join decode plainly: a speculative one could not be measured. Joined steps that
speculated unmeasured made a cold start dear: at 32 prose clients, T = 0.7, with one of them in ten plain, a new
engine's untried draft route speculated in 55 joined steps of its first run (82 ms each, ``off``'s 38 ms) while
its figure, from the other steps alone, was a near miss: first runs read 0.87x ``off`` (6 new engines), 0.93x
with joined steps plain until measured (code, 32 clients, T = 0.7: 0.96x either way). Two ways that did not work: joined
steps' whole times in the plain arms (a plain step that a prompt joined, at 8 code requests, took 100 ms
against 29, and through the plain step times and the calibration of the cost model's stand-ins speculation
read 1.6-3.6x plain decode); and pairing each speculative step with plain steps that as many prompts joined,
which charged plain decode the prompts at speculation's pace, more per token than it pays (speculation read
1.4-2x plain decode where it ran 1.0-1.2x ``off``). A burst of prompts arriving at once (more joining than 1 +
``MAX_JOINING_SHARE`` of the decoding requests) is no regime's cost and is left out (`measures_step`), as is a
step of prefill alone.

Both arms must stay measured for the comparison to stay true, so a fraction ``probe_rate`` of the
decisions takes the other arm, never in steps the guard leaves out, which speculate only where
speculation has a settled winning verdict. Rejected speculation
is probed at a rate scaled by what a probe is expected to lose: up to ``MAX_PROBE_BOOST`` times
``probe_rate`` where it fell just short of its bar (probing it costs next to nothing there, and a verdict
that noise turned against it must not stick: with one burst per ~240 steps, a cell of 40-step runs
decoded plainly for three runs while fixed speculation ran 1.3x faster), and more rarely the more clearly
it lost (a probe at a large batch first makes the draft model prefill every request), or the more its bursts
measurably lost: each burst is measured whole against plain decode (`_charge_probes`). Likewise winning
speculation takes plain steps the more rarely the more clearly it wins (see ``_probe_scale``). A bucket where
plain decode was never measured compares speculation with the cost model's plain rate instead, and takes
plain steps at a higher rate until it has ``MIN_SAMPLES`` of them.

A plain probe holds until it is measured: the steps after it decode plainly too until one without joining
prompts lands (at most ``PROBE_LIMIT`` steps). Under sustained speculation at many requests, some request
finishes in nearly every step and a new prompt joins the next, so single plain probes landed on joined steps,
which the plain arms leave out: at 32 code clients, T = 0.7, winning speculation took no plain sample in three
runs, judged against plain steps measured a cell earlier (1633 tokens/s, where plain decode ran ~2200), and read
1.06-1.15x plain decode while the runs read 0.94x ``off``. Plain decode frees the batch of its joins within a
step or two.

Plain figures go stale with time, not with steps: a shared VM's pace can double within seconds. Winning speculation
takes a plain probe once its bucket's latest plain sample is ``FRESH_SECONDS`` of steps old, and a sample that comes
after so long restarts its average (a plain step's, or what joining prompts cost, above), the old figure counting as
one sample. Where speculation clearly won, plain probes were too rare to follow the pace: at 32 code requests, held at
a winning verdict, a plain step at 32 requests stood at 93 ms from a slow spell and the prompts' cost at 0.93 s per
1000 tokens while both ran at half that, and speculation read 2.2-2.4x plain decode where the runs read 0.95-0.98x
``off``. With fresh figures, the same runs' speculative steps read 0.87-1.07x (sums over each run) against whole
runs at 0.95-0.97x.

A near miss (speculation at ``NEAR_MISS`` or more of plain decode's rate, yet under its bar) rejects
speculation only on ``SURE_SAMPLES`` steps; before that, it keeps speculating. Twelve steps, one of them
the switch from plain decode (every request's draft catch-up), are too few to tell 0.95x from 1.1x: at
batch 4, T = 1, a first contact measured 0.94x, and the cell decoded plainly for two whole runs until a
probe found speculation 1.2x faster. Where it truly only breaks even, the extra steps cost next to nothing.

Each speculative step is paired with plain decode as it ran at that moment: the time of a plain step of
its batch size, as the plain arms stand then, enters the speculative figure's averages beside the step's own,
and speculation is judged by the ratio of the two. A shared VM's pace drifts by 10-30% within a minute, and a
figure measured once, then compared with ever fresher plain steps, drifted with it: at 32 requests, draft
speculation rejected at 0.67x plain decode read 0.78x, 0.83x, then 0.89x over the next runs (nearing the
ratios probed at boosted rates) with no new measurement of it. Paired, a verdict moves only when speculation
is measured again. Stand-ins from the cost model are not paired on: once plain decode is measured, a figure
paired with them is judged against plain decode's rate now.

A rejection stands only while plain decode runs as fast as when speculation was last measured: where plain
decode's rate (at speculation's batch sizes) has moved by over ``REGIME_SHIFT`` since, the traffic may have
changed under the verdict, and a probe burst measures speculation at once. Its figure was kept from other
traffic: in the policy sweep, code prompts (long contexts) left the draft route rejected at batch 4, T = 1;
prose prompts then ran plain steps 15% faster (and unpaired, the stale figure looked ever worse: 0.93x plain
decode, then 0.86x, and rarer to probe), and the cell decoded plainly for most of a run while fixed draft
k = 2 ran 1.3x faster. One burst per change of pace: a burst that measured nothing (at 17-32 requests the
plan used no draft-model user) restarted every 12 steps. A pace alone moves too: at 10% (paired, the bar was
there for traffic only), a shared VM's drift reopened the rejection at 32 requests about once a run, and a
burst there makes the draft model prefill every request's prompt first (one step ~7x a plain one): runs with
such a burst read 0.96x ``off``.

A batch-size bucket where speculation was never measured starts from the verdict of the nearest smaller
batch size at the same temperature: if speculation lost there, it is rejected (and probed) here too,
since extra tokens only get dearer as the batch grows. Temperatures do not pass verdicts on: acceptance
need not fall as T rises (the bundled pair's prose drafts are accepted 0.76 of the time greedily and
0.80 at T = 0.7, since rejection sampling accepts wherever the two distributions overlap), and greedy
code, where n-gram lookups win, left the draft route rejected at T = 0 and so, inherited, at T = 0.7,
where it paid 1.3x.

A known weakness, at 17-32 requests where speculation about breaks even: its figure can read a win that sustained
speculation does not deliver. Two causes were measured at 32 code requests, T = 0.7 (where every fixed policy ran
0.95-1.0x ``off``): a probe begun right after a run's synchronized start read 1.116x plain decode over 22 steps (no
prompt had joined yet: ~15 draft catch-up tokens a step against 150-400 sustained); and the step a whole batch's
prompts arrive in is left out (`measures_step`) though, speculating on a winning verdict, it makes the draft model
prefill every decoding request (1939 tokens, +0.33 s in a 12.9 s run of forced speculation). A third, mended by
``FRESH_SECONDS``: held at a winning verdict, speculation was paired with plain figures from another pace (a plain
arm and a joining cost that rare plain probes no longer moved). What remains is noise: with fresh figures, a run's
speculative steps at 32 code requests read 0.87-1.07x plain decode (summed over the run) where the runs read
0.95-0.97x ``off``, and a 20-step figure moves more than that, so a win that is not there is now and then taken up
and held down to break-even. Before that fix the cell pooled at 0.992x ``off`` on an AMD EPYC VM (24 rounds),
0.999x on an Intel Xeon one. Tried and not kept, none better beyond noise: charging every step the traffic's
average catch-up (offline, on a probe's logs: 1.19x to 1.15x); in lockstep A/B, probe bursts alternating
speculative and plain steps; no probe burst for 24 steps after prompts arrived at once (0.994x against 0.989x
``off`` over 22 runs, 0.996x against 1.008x at 16 requests); plain decode in every step the guard leaves out
(0.997x against 0.984x over 12 runs, but 3-4% lower at 8-16 requests, 3 runs each, where it defers the catch-up
into a measured step that crushes a 20-step figure); a win at a large batch only once its plain arms hold 12
samples (0.991x against 0.997x ``off`` over 10 runs: a speculative step keeps the plain time it was paired with).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from policies.acceptance import TEMPERATURE_BUCKETS, temperature_bucket
from policies.base import PROPOSERS, StepTiming

MIN_SAMPLES = 3  # plain steps in a bucket before their rate counts
MEASURE_PLAIN_RATE = 0.1  # chance of a plain step while a bucket's plain rate is still unknown
EWMA_WEIGHT = 0.05  # weight of the newest step's tokens and seconds: about the last 20 steps count
REQUIRED_GAIN = 0.05  # speculation must beat plain decode by this much to be taken up (and is kept to break-even)
MAX_PROBE_BOOST = 4.0  # rejected speculation close to its bar is probed at up to this many times probe_rate
PROBE_BURST = 12  # a probe of rejected speculation measures this many speculative steps
PROBE_LIMIT = 3 * PROBE_BURST  # steps a probe burst may last while the plan decodes plainly in some of them
MIN_SPECULATIVE_SAMPLES = PROBE_BURST  # speculative steps before their rate counts: the first may be a catch-up
SURE_SAMPLES = 2 * MIN_SPECULATIVE_SAMPLES  # speculative steps before a near miss of the bar rejects speculation
NEAR_MISS = 1.0 - 2 * REQUIRED_GAIN  # speculation at or above this ratio to plain decode only just missed its bar
CATCH_UP_WEIGHT = 0.25  # weight of the newest probe's catch-up cost, or its burst's loss, in their averages
MAX_JOINING_SHARE = 0.25  # steps where more requests join (prefill) than 1 + this share of those decoding: unmeasured
REGIME_SHIFT = 0.2  # plain decode's rate moved this much since rejected speculation was measured: measure it again
FRESH_SECONDS = 2.0  # a bucket's plain figures are stale after this many seconds of steps without a sample of theirs
ALL_PROPOSERS: frozenset[str] = frozenset(PROPOSERS)
NO_PROPOSERS: frozenset[str] = frozenset()
DRAFT_ONLY: frozenset[str] = frozenset({"draft"})
NGRAM_ONLY: frozenset[str] = frozenset({"ngram"})


PlainEstimate = Callable[[int], float]  # batch size -> predicted seconds of a plain-decode step


def measures_step(num_decodes: int, num_prefilling: int) -> bool:
    """Whether the guard measures a step of ``num_decodes`` decoding requests beside ``num_prefilling`` prefilling
    ones: steady traffic, a few requests joining a running batch, but not a burst of prompts arriving at once."""
    return num_decodes > 0 and num_prefilling <= 1 + num_decodes * MAX_JOINING_SHARE


def _ewma_weight(samples: int) -> float:
    """The newest sample's weight after ``samples`` earlier ones: a plain mean until the EWMA's horizon is filled."""
    return max(EWMA_WEIGHT, 1.0 / (samples + 1))


def _sample_weight(averaged: int, stale: bool) -> tuple[float, int]:
    """(the newest sample's weight, the samples the averages then hold) after ``averaged`` earlier ones; ``stale``:
    the figure so far counts as one sample."""
    if stale:
        averaged = min(averaged, 1)
    return _ewma_weight(averaged), averaged + 1


def batch_bucket(batch_size: int) -> int:
    """1, 2, 3-4, 5-8, ... -> 0, 1, 2, 3, ...: per-token costs change slowly with batch size."""
    return (max(1, batch_size) - 1).bit_length()  # ceil(log2(batch_size)), exactly


@dataclass
class _Arm:
    tokens: float = 0.0
    seconds: float = 0.0
    samples: int = 0
    averaged: int = 0  # the samples the averages hold: a stale figure counts as one
    sizes: dict[int, float] = field(default_factory=dict)  # batch size -> its weight in the averages
    # speculative arms: each step paired with a plain step of its batch size as plain decode ran at that moment
    plain_tokens: float = 0.0
    plain_seconds: float = 0.0
    paired_measured: bool = False  # the latest step's plain counterpart was measured (not the cost model's)
    plain_reference: float = 0.0  # speculative arms: plain decode's tokens/s at their sizes when last sampled
    probed: bool = False  # speculative arms: a probe burst ran since this figure last won (or measured it)
    winning: bool = False  # speculative arms: the verdict acted on last was "speculate"; it holds down to break-even
    catching_up: bool = False  # draft-route probes: the first speculative step (the draft's catch-up) is still due
    confirming: bool = False  # probes: the first of a rejection, which the plan may not decline
    loss: float = 0.0  # probes: plain steps their burst lost so far against plain decode (`_charge_probes`)

    def add(self, tokens: float, seconds: float, batch_size: int, plain_seconds: float | None = None,
            plain_measured: bool = False, stale: bool = False) -> None:
        """One step; ``plain_seconds``: speculative steps' counterpart, a plain step of ``batch_size`` right now;
        ``stale``: the figure so far is from another pace, and counts as one sample (this one weighs half, the next
        a third, ...)."""
        w, self.averaged = _sample_weight(self.averaged, stale)
        self.tokens += w * (tokens - self.tokens)
        self.seconds += w * (seconds - self.seconds)
        for size in self.sizes:
            self.sizes[size] *= 1.0 - w
        self.sizes[batch_size] = self.sizes.get(batch_size, 0.0) + w
        self.samples += 1
        if plain_seconds is not None:
            self.plain_tokens += w * (batch_size - self.plain_tokens)
            self.plain_seconds += w * (plain_seconds - self.plain_seconds)
        self.paired_measured = plain_seconds is not None and plain_measured

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def paired_plain_rate(self) -> float:
        return self.plain_tokens / self.plain_seconds if self.plain_seconds > 0 else 0.0


@dataclass
class _Joining:
    """What prompts joining plain steps added to them: seconds per prompt token (prompts differ in length by up to
    ten times) and tokens per joining request (its first token, once its whole prompt is in), as EWMAs."""

    prompt_tokens: float = 0.0
    extra_seconds: float = 0.0
    requests: float = 0.0
    extra_tokens: float = 0.0
    samples: int = 0
    averaged: int = 0  # as in `_Arm`

    def add(self, timing: StepTiming, extra_seconds: float, stale: bool = False) -> None:
        """``stale``: as for `_Arm.add`."""
        w, self.averaged = _sample_weight(self.averaged, stale)
        self.prompt_tokens += w * (timing.num_prefill_tokens - self.prompt_tokens)
        self.extra_seconds += w * (extra_seconds - self.extra_seconds)
        self.requests += w * (timing.num_prefilling - self.requests)
        self.extra_tokens += w * (timing.num_generated - timing.batch_size - self.extra_tokens)
        self.samples += 1

    def seconds(self, prompt_tokens: int) -> float:
        return prompt_tokens * self.extra_seconds / self.prompt_tokens if self.prompt_tokens > 0 else 0.0

    def tokens(self, requests: int) -> float:
        return requests * self.extra_tokens / self.requests if self.requests > 0 else 0.0


class GoodputGuard:
    """Realised tokens/s of plain steps per batch size, and of speculative steps per batch-size
    bucket, temperature bucket (acceptance, so what speculation yields, changes with T; plain decode
    costs the same at any T) and route (draft model or n-gram lookups only)."""

    def __init__(self, plain_estimate: PlainEstimate | None = None) -> None:
        """``plain_estimate``: a plain-decode step's seconds per batch size as the cost model predicts them, the
        stand-in for batch sizes whose plain steps are not measured yet (`LearnedState` wires in its cost model)."""
        self.plain_estimate = plain_estimate
        self._plain: dict[int, dict[int, _Arm]] = {}  # per batch-size bucket, per batch size
        # per batch-size bucket: what prompts joining plain steps added to them, beyond a plain step of the batch size
        self._joining: dict[int, _Joining] = {}
        self._speculative: dict[tuple[int, int, str], _Arm] = {}  # (batch bucket, T bucket, route)
        self._burst_left: dict[tuple[int, int, str], int] = {}  # steps left of a speculative probe burst
        self._probes: dict[tuple[int, int, str], _Arm] = {}  # the speculative steps of a probe, measured afresh
        self._catch_up: dict[int, float] = {}  # per batch-size bucket: a draft probe's catch-up, in plain steps extra
        self._burst_loss: dict[tuple[int, int, str], float] = {}  # what a probe burst cost, in plain steps (an EWMA)
        self._plain_probe_left: dict[int, int] = {}  # per batch-size bucket: steps left of an unmeasured plain probe
        self._clock = 0.0  # seconds of every step observed: the pace drifts with time, not with steps
        self._plain_at: dict[int, float] = {}  # per batch-size bucket: the clock at its latest plain sample
        self._joining_at: dict[int, float] = {}  # per batch-size bucket: the clock at its latest joining-cost sample

    def observe(self, timing: StepTiming, temperature: float = 0.0) -> None:
        """Record one step with decodes (and perhaps prompts joining); speculative iff it fed drafts to the target.

        ``temperature``: the mean sampling temperature of the step's requests.
        """
        if timing.step_seconds <= 0 or not math.isfinite(timing.step_seconds):
            return
        self._clock += timing.step_seconds
        if not measures_step(timing.batch_size, timing.num_prefilling):
            return
        sample = (timing.num_generated, timing.step_seconds, timing.batch_size)
        bucket = batch_bucket(timing.batch_size)
        self._charge_probes(timing, (bucket, temperature_bucket(temperature)))
        if not timing.speculative and not timing.num_prefilling:
            self._plain_probe_left.pop(bucket, None)
            stale = self._stale(self._plain_at, bucket)
            self._plain.setdefault(bucket, {}).setdefault(timing.batch_size, _Arm()).add(*sample, stale=stale)
            return
        plain_seconds, plain_measured = self._plain_seconds(bucket)
        if timing.num_prefilling:
            plain = plain_seconds(timing.batch_size)
            if plain is None:
                return
            joining = self._joining.setdefault(bucket, _Joining())
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
                self._speculative[key] = _Arm()
            self._observe_catch_up(key, timing.batch_size, sample[1])
            return
        arm = probe if probe is not None else self._speculative.setdefault(key, _Arm())
        arm.add(*sample, plain_seconds=plain_seconds(timing.batch_size), plain_measured=plain_measured)
        arm.plain_reference = _mix_rate(arm.sizes, plain_seconds) or 0.0
        if probe is not None and probe.samples >= MIN_SPECULATIVE_SAMPLES:  # the probe's figure replaces the older one
            self._speculative[key] = self._end_probe(key)
            self._burst_left[key] = 0
            probe.probed = True

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

    def _end_probe(self, key: tuple[int, int, str]) -> _Arm:
        """Remove the probe under way at ``key`` and fold what its burst cost into the route's average."""
        probe = self._probes.pop(key)
        _average_in(self._burst_loss, key, probe.loss)
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
        _average_in(self._catch_up, key[0], extra)

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
        key = (batch_bucket(batch_size), temperature_bucket(temperature))
        # what prompts add is measured at the bucket of the step's decodes, ``batch_size`` less the joining requests
        joining_cost = self._joining.get(batch_bucket(batch_size - joining)) if joining else None
        if measured and joining and (joining_cost is None or joining_cost.samples < MIN_SAMPLES):
            return NO_PROPOSERS  # what joining prompts cost a plain step here is unknown: measure it
        draft, draft_verdict = self._route_decision((*key, "draft"), rng, probe_rate, measured)
        if draft == "plain":
            return NO_PROPOSERS
        if draft == "speculate":
            # The draft route is not known to win here: it is untried, or being measured. The plan may still
            # make a step n-gram-only, and such a step is judged by the n-gram route: where that route lost
            # here, only the draft model may propose (at 17-32 requests, a draft route that the plan never
            # used let it make 40% of the steps n-gram-only, at 0.93x plain decode).
            if draft_verdict != "speculate" and self._route_decision((*key, "ngram"), rng, probe_rate,
                                                                     measured)[0] == "rejected":
                return DRAFT_ONLY
            return ALL_PROPOSERS
        ngram, _ = self._route_decision((*key, "ngram"), rng, probe_rate, measured)
        return NGRAM_ONLY if ngram == "speculate" else NO_PROPOSERS

    def probing(self, batch_size: int, temperature: float) -> bool:
        """Whether a probe burst of rejected speculation is under way at this batch size and temperature."""
        key = (batch_bucket(batch_size), temperature_bucket(temperature))
        return any(self._burst_left.get((*key, route), 0) > 0 for route in PROPOSERS)

    def decline_measurement(self, batch_size: int, temperature: float) -> bool:
        """Whether the plan may decline to speculate where the guard is measuring speculation here (its model
        predicts speculation far below plain decode). A probe burst that has seen no speculative step yet then ends
        (it would plan every step for nothing: at 32 requests the model predicted speculation far below plain
        decode, and bursts ran their ``PROBE_LIMIT`` steps unmeasured); one under way goes on.

        False where a measurement is under way or must be made whatever the model says: a rejection's first burst
        (its confirming probe), a draft route's first figure once begun (fewer than ``MIN_SPECULATIVE_SAMPLES`` steps,
        the switch into it taken), and a near miss short of ``SURE_SAMPLES``. The model declining them is no evidence:
        fitted on the plain steps a rejection made, it kept rejections standing for whole runs (8 code requests,
        T = 0.7: a first figure of 0.876x, declined, stood for 4 runs while fixed draft k = 4 ran 1.05-1.09x
        ``off``); and on a new engine's first few, slow speculative steps at 1 request, T = 1, it priced speculation
        so dear that a first figure stopped at 3-11 steps and the engine decoded plainly for 1500-3000 steps in 5 of
        8 starts, while fixed draft k = 4 ran 1.4x faster."""
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
        draft-model user measure the n-gram route, and at 8 code requests, T = 0, a confirming probe of a rejection
        made in stalled first rounds ran its ``PROBE_LIMIT`` steps without one, and the rejection stood for runs."""
        key = (batch_bucket(batch_size), temperature_bucket(temperature))
        probe = self._probes.get((*key, "draft"))
        return (probe is not None and probe.confirming) or self._draft_unsettled(key)  # the dict lookup first

    def _draft_unsettled(self, key: tuple[int, int]) -> bool:
        """The draft route's first figure is begun (its switch taken) but short, or a near miss needs more steps."""
        draft = (*key, "draft")
        return draft in self._speculative and self._judge(*draft)[0] in (None, "measure more")

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

    def _route_decision(self, key: tuple[int, int, str], rng: random.Random, probe_rate: float,
                        measured: bool) -> tuple[str, str | None]:
        """(speculate | plain (a deliberate plain step: it measures the plain arm) | rejected (try a cheaper
        route), the route's verdict from `_judge`)."""
        verdict, vs_plain = self._judge(*key)
        if not measured:
            return ("speculate" if verdict == "speculate" else "rejected"), verdict
        fallen = False
        if verdict is not None:
            spec = self._speculative[key]
            fallen = spec.winning and verdict in ("decode plainly", "remeasure")  # measured again at once
            spec.winning = verdict == "speculate"
        if verdict is None and not self._smaller_batches_reject(*key):
            return "speculate", verdict  # let the plan show what speculation does here
        if verdict == "measure more":
            return "speculate", verdict
        if verdict == "measure plain":
            return ("plain" if self._plain_probe(key[0], rng, MEASURE_PLAIN_RATE) else "speculate"), verdict
        if verdict == "decode plainly" and not self._speculative[key].probed:
            probe_rate *= MAX_PROBE_BOOST  # sustained speculation lost: a probe checks it soon
        elif verdict is not None:  # the closer the verdict, the more often the other arm is measured
            probe_rate *= _probe_scale(vs_plain, self._catch_up.get(key[0], 0.0) if key[2] == "draft" else 0.0,
                                       burst_loss=self._burst_loss.get(key),
                                       winning=verdict == "speculate")
        if verdict == "speculate":
            self._speculative[key].probed = False  # should it lose from here on, a probe checks that soon
            # single steps (held until measured), no switching cost
            return ("plain" if self._plain_probe(key[0], rng, probe_rate) else "speculate"), verdict
        # speculation lost here, or is untried here and lost at a smaller batch: probe it in bursts
        left = self._burst_left.get(key, 0)
        if left == 0 and (fallen or verdict == "remeasure" or rng.random() < probe_rate / PROBE_BURST):
            left = PROBE_LIMIT
            if fallen:  # plain decode as it runs now first: the burst waits for it (below)
                self._plain_probe_left[key[0]] = PROBE_LIMIT
            rejected = self._speculative.get(key)
            confirming = rejected is not None and not rejected.probed
            self._probes[key] = _Arm(catching_up=key[2] == "draft", confirming=confirming)
            if rejected is not None:  # one boosted burst per rejection, whether or not the plan speculates in it
                rejected.probed = True
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

    def _plain_probe(self, bucket: int, rng: random.Random, rate: float) -> bool:
        """Whether this step decodes plainly to measure plain decode: at ``rate`` or once the bucket's plain figures
        are ``FRESH_SECONDS`` old, and then on until a plain step of the bucket without joining prompts is measured
        (at most ``PROBE_LIMIT`` steps; see the module docstring)."""
        left = self._plain_probe_left.get(bucket, 0)
        if not left and (rng.random() < rate or self._is_old(self._plain_at, bucket)):
            left = PROBE_LIMIT
        if left:
            self._plain_probe_left[bucket] = left - 1
        return left > 0

    def _judge(self, bucket: int, temperature_key: int, route: str) -> tuple[str | None, float | None]:
        """(verdict, speculation's rate over plain decode's at the same batch sizes or None). The verdict:
        speculate | decode plainly | measure plain | measure more (a near miss on too few steps) | remeasure (it
        lost, but plain decode's rate has moved by over ``REGIME_SHIFT`` since); None while speculation here is
        unmeasured.

        Until plain steps of the bucket are measured, the cost model's plain rate stands in for them: where
        speculation loses even to that, plain steps follow (and measure the plain arm); where it wins, plain
        steps are still taken now and then to measure it ("measure plain"). Without the stand-in, a batch size
        that plain decode never ran at (a batch of 32 whose requests, once speculation desynchronised them,
        finish one by one) speculated at 90% however badly its speculation did.
        """
        spec = self._speculative.get((bucket, temperature_key, route))
        if spec is None or spec.samples < MIN_SPECULATIVE_SAMPLES:
            return None, None
        plain_rate, plain_measured = self._plain_rate(bucket, spec.sizes)
        if plain_rate is None:
            return "measure plain", None
        vs_plain = _vs_plain(spec, plain_rate, plain_measured)
        if vs_plain >= (1.0 if spec.winning else 1.0 + REQUIRED_GAIN):
            return ("speculate" if plain_measured else "measure plain"), vs_plain
        if vs_plain >= NEAR_MISS and spec.samples < SURE_SAMPLES:
            return "measure more", vs_plain
        if spec.plain_reference and abs(plain_rate / spec.plain_reference - 1.0) > REGIME_SHIFT:
            return "remeasure", vs_plain
        return "decode plainly", vs_plain

    def _plain_rate(self, bucket: int, sizes: dict[int, float]) -> tuple[float | None, bool]:
        """(plain tokens/s over the batch-size mix ``sizes`` of the bucket or None, whether plain decode was
        measured in the bucket)."""
        seconds, measured = self._plain_seconds(bucket)
        return _mix_rate(sizes, seconds), measured

    def _plain_seconds(self, bucket: int) -> tuple[Callable[[int], float | None], bool]:
        """(batch size -> a plain step's seconds, whether any size of the bucket is measured). A size's time: as
        measured; else the cost model's times the model's error at the bucket's measured sizes; else None."""
        arms = self._plain.get(bucket, {})
        measured = {size: arm.seconds for size, arm in arms.items() if arm.samples >= MIN_SAMPLES}
        estimate = self.plain_estimate
        calibration: float | None = None  # computed at the first unmeasured size: most often none is asked for

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
            low, high = (1, 1) if bucket == 0 else (2 ** (bucket - 1) + 1, 2**bucket)
            plain = list(self._plain.get(bucket, {}).values())
            speculative: dict[str, dict[str, Any]] = {}
            for (b, t, route), arm in sorted(self._speculative.items()):
                if b == bucket:
                    plain_rate, plain_measured = self._plain_rate(bucket, arm.sizes)
                    speculative.setdefault(route, {})[TEMPERATURE_BUCKETS[t]] = {
                        "tokens_per_s": arm.rate, "steps": arm.samples,
                        "vs_plain": _vs_plain(arm, plain_rate, plain_measured) if plain_rate else None,
                        "probe_burst_loss": self._burst_loss.get((b, t, route))}
            plain_summary = None
            if plain:  # the arms' mean tokens and seconds per step, summed over batch sizes
                seconds = sum(arm.seconds for arm in plain)
                plain_summary = {"tokens_per_s": sum(arm.tokens for arm in plain) / seconds if seconds > 0 else 0.0,
                                 "steps": sum(arm.samples for arm in plain)}
            out.append({"batch_sizes": [low, high], "plain": plain_summary, "speculative": speculative})
        return out


def _average_in(averages: dict, key: Any, value: float) -> None:
    """Fold a probe's ``value`` into ``averages[key]`` (its first value stands alone): the newest weighs
    ``CATCH_UP_WEIGHT``, so the last few probes count."""
    known = averages.get(key)
    averages[key] = value if known is None else known + CATCH_UP_WEIGHT * (value - known)


def _mix_rate(sizes: dict[int, float], seconds: Callable[[int], float | None]) -> float | None:
    """Plain tokens/s over the batch-size mix ``sizes`` (size -> weight), given a plain step's seconds per size."""
    total_tokens = total_seconds = 0.0
    for size, weight in sizes.items():
        step_seconds = seconds(size)
        if step_seconds is None:
            return None
        total_tokens += weight * size
        total_seconds += weight * step_seconds
    return total_tokens / total_seconds if total_seconds > 0 else None


def _vs_plain(spec: _Arm, plain_rate: float, plain_measured: bool) -> float:
    """Speculation's rate over plain decode's as plain decode ran beside each speculative step (see the module's
    docstring); where those were the cost model's stand-ins and plain decode is measured by now, over its rate now
    (``plain_rate``, at speculation's batch sizes)."""
    paired = spec.paired_plain_rate
    if paired > 0 and (spec.paired_measured or not plain_measured):
        return spec.rate / paired
    return spec.rate / plain_rate


def _probe_scale(vs_plain: float | None, catch_up: float = 0.0, winning: bool = False,
                 burst_loss: float | None = None) -> float:
    """The probe rate's multiplier, from speculation's rate over plain decode's (``vs_plain``, None: unknown).

    Rejected speculation (below its bar, 1 + ``REQUIRED_GAIN``): ``2 x REQUIRED_GAIN / shortfall``, at most
    ``MAX_PROBE_BOOST``: 2 at break-even, the most just under the bar, falling as 1 / shortfall where it
    clearly lost. A draft-route burst also pays its first step, the draft model's catch-up (``catch_up``: what
    that cost beyond an ordinary speculative step, in plain steps, as the last probes measured it), so the
    shortfall is the whole burst's, over ``PROBE_BURST``. The catch-up grows with the batch and its contexts
    (the draft model prefills every request's lag): 0.55 plain steps at 32 prose requests, T = 0.7, where a
    burst's steps that lost 15% fall 2.4 plain steps short of the bar. Where bursts were measured whole
    (``burst_loss``: plain steps lost over a burst, an average, see `_charge_probes`), the dearer of the two
    counts: at 32 prose requests, T = 0.7, draft bursts that their figure (0.65x plain decode) priced at ~5 plain
    steps lost 14 (every prompt joining a burst needs the draft model's prefill too, and a burst may run on to
    ``PROBE_LIMIT``), and runs with one read 0.94-0.98x ``off`` against ~1.0x without. Winning speculation
    (``winning``: over its bar, or kept down to break-even): plain steps at ``min(1, 2 x REQUIRED_GAIN / gain)``
    of the rate, rarer the more it wins (at batch 1, where it ran 1.5-1.9x plain decode, each plain probe gave up
    half a step's tokens and made the draft model catch up in the next: 5% of them cost ~3% of the throughput).
    Either way the throughput that probing is expected to cost, the probed share times what that arm loses per
    step, stays below probe_rate x 2 x ``REQUIRED_GAIN`` (0.5% at the default rate).
    """
    if not vs_plain:
        return 1.0
    gain = vs_plain - 1.0
    if winning or gain >= REQUIRED_GAIN:
        return min(1.0, 2.0 * REQUIRED_GAIN / gain) if gain > 2.0 * REQUIRED_GAIN else 1.0
    burst_cost = PROBE_BURST * (REQUIRED_GAIN - gain) + catch_up  # in plain steps, the shortfall counted to the bar
    if burst_loss is not None:
        burst_cost = max(burst_cost, PROBE_BURST * REQUIRED_GAIN + burst_loss)
    return min(MAX_PROBE_BOOST, 2.0 * REQUIRED_GAIN * PROBE_BURST / burst_cost)
