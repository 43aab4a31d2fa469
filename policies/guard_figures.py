"""What the goodput guard (policies/guard.py) measures: realised tokens per second of whole steps, as EWMAs.

A `Figure` is one arm's average step (tokens emitted, seconds) over its mix of batch sizes; a speculative
figure also averages the plain step each of its steps was paired with (plain decode as it ran at that
moment), so a verdict is the ratio of two figures of the same moments (`rate_over_plain`). `JoiningCost`
is what prompts joining a plain step added to it, so that steps prompts join can be measured too, less
what their prompts cost. The guard's decisions live in policies/guard.py; what each rule is for, as
measured, in docs/goodput-guard.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from policies.base import StepTiming
from policies.guard_trial import Trial

EWMA_WEIGHT = 0.05  # weight of the newest step's tokens and seconds: about the last 20 steps count
CATCH_UP_WEIGHT = 0.25  # weight of the newest probe's catch-up cost, or its burst's loss, in their averages
PACE_SAMPLES = 2  # plain samples of a stale bucket that must agree on a pace before its other sizes move
MAX_JOINING_SHARE = 0.25  # steps where more requests join (prefill) than 1 + this share of those decoding: unmeasured


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


def bucket_sizes(bucket: int) -> list[int]:
    """[smallest, largest] batch size of a `batch_bucket`."""
    return [1, 1] if bucket == 0 else [2 ** (bucket - 1) + 1, 2**bucket]


@dataclass
class Figure:
    """One arm's average step (tokens emitted, seconds) and the batch sizes it came from; on speculative figures
    also the plain steps they were paired with, and what the guard last did with the figure."""

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
    probed: bool = False  # speculative arms: its rejection was probed since it last won (not by a re-measurement)
    winning: bool = False  # speculative arms: the verdict acted on last was "speculate"; it holds down to break-even
    catching_up: bool = False  # draft-route probes: the first speculative step (the draft's catch-up) is still due
    confirming: bool = False  # probes: the first of a rejection, which the plan may not decline
    loss: float = 0.0  # probes: plain steps their burst lost so far against plain decode (`_charge_probes`)
    trial: Trial | None = None  # speculative arms: the trial of a rejection (from 3 requests) or take-up (from 17)
    sampled_at_move: int = 0  # speculative arms: the guard's count of bucket moves at their latest step

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
class PaceCheck:
    """A stale bucket's plain figures restarting. Each size restarts on its own first sample since it went stale
    (which weighs half, `Figure.add(stale=True)`); the sizes left unsampled then move by the pace that
    ``PACE_SAMPLES`` samples agree on (`carry_pace`). One sample is not enough: host noise makes 3-4% of plain steps at
    17-32 requests take over 1.27x their size's median, and one such step at 28 code requests, carried to the whole
    bucket, paired the next cell's first draft figure at 32 requests with plain steps 1.27x too slow; it read a win,
    and the draft route was taken up where it ran 0.94x ``off`` (docs/goodput-guard.md, s53)."""

    before: dict[int, float] = field(default_factory=dict)  # each sampled size's figure (seconds) when it went stale
    moves: list[float] = field(default_factory=list)  # each sample's seconds over its size's figure then

    def sample(self, figure: Figure, batch_size: int, seconds: float) -> bool:
        """Record a plain sample of ``figure`` (its size's, not yet added); whether it is the size's first since the
        bucket went stale (it restarts the figure)."""
        first = batch_size not in self.before
        if first:
            self.before[batch_size] = figure.seconds if figure.samples else 0.0
        if self.before[batch_size] > 0:
            self.moves.append(seconds / self.before[batch_size])
        return first

    @property
    def settled(self) -> bool:
        return len(self.moves) >= PACE_SAMPLES

    def pace(self) -> float:
        """The move the samples agree on: the smallest in their common direction; none where they disagree."""
        lowest, highest = min(self.moves), max(self.moves)
        if lowest > 1.0:
            return lowest
        return highest if highest < 1.0 else 1.0


def carry_pace(figures: dict[int, Figure], check: PaceCheck) -> None:
    """Move the bucket's sizes that ``check`` did not sample by the pace its samples agree on, as far as a sample
    moves a stale figure (half way), and let each count as one sample against its own next one. Left at the old
    pace, they paired speculative steps at their sizes with it: after the host's pace doubled mid-run at 32 code
    requests, T = 1, the draft route read 1.35-2.43x plain decode while its runs read 0.87x ``off``."""
    factor = 1.0 + _ewma_weight(1) * (check.pace() - 1.0)
    for size, figure in figures.items():
        if size not in check.before:
            figure.seconds *= factor
            figure.averaged = min(figure.averaged, 1)


@dataclass
class JoiningCost:
    """What prompts joining plain steps added to them: seconds per prompt token (prompts differ in length by up to
    ten times) and tokens per joining request (its first token, once its whole prompt is in), as EWMAs."""

    prompt_tokens: float = 0.0
    extra_seconds: float = 0.0
    requests: float = 0.0
    extra_tokens: float = 0.0
    samples: int = 0
    averaged: int = 0  # as in `Figure`

    def add(self, timing: StepTiming, extra_seconds: float, stale: bool = False) -> None:
        """``stale``: as for `Figure.add`."""
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


def average_in(averages: dict, key: Any, value: float) -> None:
    """Fold a probe's ``value`` into ``averages[key]`` (its first value stands alone): the newest weighs
    ``CATCH_UP_WEIGHT``, so the last few probes count."""
    known = averages.get(key)
    averages[key] = value if known is None else known + CATCH_UP_WEIGHT * (value - known)


def mix_rate(sizes: dict[int, float], seconds: Callable[[int], float | None]) -> float | None:
    """Plain tokens/s over the batch-size mix ``sizes`` (size -> weight), given a plain step's seconds per size."""
    total_tokens = total_seconds = 0.0
    for size, weight in sizes.items():
        step_seconds = seconds(size)
        if step_seconds is None:
            return None
        total_tokens += weight * size
        total_seconds += weight * step_seconds
    return total_tokens / total_seconds if total_seconds > 0 else None


def rate_over_plain(spec: Figure, plain_rate: float, plain_measured: bool, taking_up: bool = False) -> float:
    """Speculation's rate over plain decode's as plain decode ran beside each speculative step (see the module's
    docstring); where those were the cost model's stand-ins and plain decode is measured by now, over its rate now
    (``plain_rate``, at speculation's batch sizes).

    ``taking_up``: the ratio decides whether a figure not winning is taken up. The switch from stand-ins to the
    measured rate may then lower the ratio but not raise it: plain decode's first samples at a batch size are few,
    and one slow step among three lifted a draft figure that read 1.045x beside its stand-ins to 1.161x, with no
    speculative step in between; it was taken up where the draft route ran 0.98x ``off`` (docs/goodput-guard.md,
    s57). A figure that truly wins is taken up at its next probe, whose steps pair with measured plain decode."""
    paired = spec.paired_plain_rate
    if paired > 0 and (spec.paired_measured or not plain_measured):
        return spec.rate / paired
    now = spec.rate / plain_rate
    return min(now, spec.rate / paired) if taking_up and paired > 0 else now
