"""A trial: speculation against plain decode in alternating windows of steps, side by side.

From 17 requests on, speculation about breaks even on a CPU, and a figure's verdict rests on the plain step each
speculative step is paired with. Those plain figures are few and go stale: at 32 clients they strayed from a lockstep
`off` engine's plain steps by 0.94-1.10x for whole runs, so figures read false wins (docs/goodput-guard.md, s63).
A trial needs no pairing: before a figure over its bar is taken up there, the guard alternates windows of
``TRIAL_WINDOW`` plain steps and ``TRIAL_WINDOW`` steps where speculation may run, over the same stretch of traffic
at the same pace of the host, each step counted whole (the draft model's catch-ups are the speculative arm's), but
for the switch into speculation: where a speculative window's first drafting step makes the draft model catch up on
the tokens the plain window decoded, the cost model's price of those is taken off (`Trial.add`).
From 3 requests on, a figure that reads a loss is tried the same way before it rejects speculation: a false rejection
stands for long (its probes come the rarer the more it lost), and a trial where speculation does lose costs about half
its speculative steps' loss, once per measurement that rejects. Where the rejection is false, the trial's plain windows
cost what speculation gains: at 3-8 requests, where that is 15-25%, a trial that reads a clear win from half its steps
on is won then (``EARLY_WIN``); lockstep beside full trials, adaptive ran 1.010x as fast at 4-8 clients (geomean of
13 cells' paired medians, s89).

Prompts that join steps are most of a step's seconds at 32 code clients, and how many join a window is luck: so the
trial fits each arm's step seconds at no prompt tokens, with a slope per prompt token shared by both arms
(`Trial.ratio`), and gives both arms the same prompt cost per decoded token, as the traffic brings it: every request
is prefilled once whichever arm decodes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TRIAL_BUCKET = 5  # from this batch-size bucket (17-32 requests) on, speculation is taken up only on a trial
# from this bucket (3-4 requests) on, a figure that reads a loss rejects speculation only on a trial too: a 12-step
# figure read 0.71x plain decode where sustained fixed draft k = 2 ran 1.10x `off`, and 0.88x where it ran 1.12x (s71,
# 16 prose clients T = 0, 32 code clients T = 1), a 24-step one 0.98x where it ran 1.19x (s78, 8 prose clients T = 1),
# and the rejections stood for the rest of the runs. At 3-8 requests speculation ran 1.14-1.29x `off` in every cell
# of the sweep on a CPU (s78), so a rejection there is most likely false, and a trial costs little where it is not.
# At 1-2 requests figures gain 1.5-2x: a short one that reads a loss has not been met
REJECTION_TRIAL_BUCKET = 2
TRIAL_WINDOW = 4  # steps in a row per arm: the draft model catches up once a window, not once a step
TRIAL_STEPS = 32  # measured steps per arm before the trial's verdict
TRIAL_GAIN = 0.025  # speculation's arm must beat the plain one by this much: a trial's ratio is noisy too
# (but below ``TRIAL_BUCKET`` a rejection's trial is won at break-even, see `Trial.rejection`)
# below this bucket (3-8 requests), a rejection's trial that reads 1 + ``EARLY_WIN`` once it has ``EARLY_STEPS`` steps
# an arm is won then. There speculation gains 15-25% on a CPU, and the plain windows of a trial of a false rejection
# cost that. At 9-16 requests, where it gains 3-9%, a trial reads so clear a win mostly by noise: early wins there read
# 0.985-1.012x full trials in lockstep (s89), and trials run their length
EARLY_BUCKET = 4
EARLY_STEPS = TRIAL_STEPS // 2
EARLY_WIN = 0.1  # about two deviations of a 16-step trial's ratio


@dataclass
class _Arm:
    """One arm's steps: sums for a least-squares fit of seconds on prompt tokens, and the tokens decoded."""

    steps: int = 0
    prompt: float = 0.0  # prompt tokens
    seconds: float = 0.0
    prompt_sq: float = 0.0
    prompt_seconds: float = 0.0
    decoded: float = 0.0  # tokens emitted by decoding requests (not joining ones' first tokens)

    def add(self, prompt_tokens: int, seconds: float, decoded: int) -> None:
        self.steps += 1
        self.prompt += prompt_tokens
        self.seconds += seconds
        self.prompt_sq += prompt_tokens * prompt_tokens
        self.prompt_seconds += prompt_tokens * seconds
        self.decoded += decoded

    def centred(self) -> tuple[float, float]:
        """(sum of squares of prompt tokens, of their products with seconds), about the arm's means."""
        mean_prompt = self.prompt / self.steps
        return self.prompt_sq - mean_prompt * self.prompt, self.prompt_seconds - mean_prompt * self.seconds


@dataclass
class Trial:
    """Both arms' steps so far, plain (0) and speculative (1).

    ``rejection``: the trial of a figure that read a loss, below ``TRIAL_BUCKET``. There speculation is taken up
    without a trial, and such a trial is won at break-even, not at 1 + ``TRIAL_GAIN``: at 16 prose requests two
    trials read 1.024x and 0.967x where fixed draft k = 2 ran 1.07x and 1.09x `off`, and each kept the rejection it
    confirmed for three runs (docs/goodput-guard.md, s82); below 9 requests, one that reads 1 + ``EARLY_WIN`` from
    ``EARLY_STEPS`` steps an arm on is won then (``early_win``). From 17 requests on a rejection's trial, won, is a
    take-up: its bar and length stay.
    """

    rejection: bool = False
    early_win: bool = False  # a rejection's trial below ``EARLY_BUCKET``: won at ``EARLY_STEPS`` on a clear win
    arms: tuple[_Arm, _Arm] = field(default_factory=lambda: (_Arm(), _Arm()))
    lag: int = 0  # tokens the plain arm decoded since the draft model last proposed (what it must catch up on)
    done: bool = False  # each arm has ``TRIAL_STEPS`` steps (``EARLY_STEPS``, an early win): the verdict is in, and
    # no step is added after it
    _final: float | None = None  # the ratio once done: a lost trial's verdict is read every step it stands

    @property
    def speculates(self) -> bool:
        """Whether the next step is one of the speculative arm's (the arms take turns, a window each)."""
        return (sum(arm.steps for arm in self.arms) // TRIAL_WINDOW) % 2 == 1

    def add(self, speculative_arm: bool, prompt_tokens: int, seconds: float, decoded: int,
            catch_up_tokens: int = 0, catch_up_token_seconds: float = 0.0) -> None:
        """Count one step the trial routed; ``catch_up_tokens``: what the draft model fed beyond one token per
        request, at ``catch_up_token_seconds`` each (the cost model's price).

        Of a speculative step's catch-up, the tokens the plain arm decoded are no cost of sustained speculation nor
        of plain decode: only of the trial's alternation, and their price is taken off. The rest of it, the draft
        model's prefill of prompts that joined, is sustained speculation's too and stays. At 16-32 code requests
        (T = 0.7, 1) a switch's draft model fed 399 tokens beyond one a request against 187 in the speculative steps
        after it, and took 5.5 ms more (~24 us a token): of that, the ~90 tokens of lag at the fitted ~22 us were
        ~2 ms, ~1% of the speculative arm's seconds. Leaving the whole switch out instead (s74) dropped ~2.7%.
        """
        if not speculative_arm:
            self.lag += decoded
        elif catch_up_tokens:
            seconds -= catch_up_token_seconds * min(catch_up_tokens, self.lag)
            self.lag = 0
        self.arms[int(speculative_arm)].add(prompt_tokens, seconds, decoded)
        steps = min(arm.steps for arm in self.arms)
        if steps >= TRIAL_STEPS:
            self.done, self._final = True, self._ratio()
        elif self.early_win and steps >= EARLY_STEPS:
            ratio = self._ratio()
            if ratio is not None and ratio >= 1.0 + EARLY_WIN:
                self.done, self._final = True, ratio

    @property
    def ratio(self) -> float | None:
        """See `_ratio`."""
        return self._final if self.done else self._ratio()

    def _ratio(self) -> float | None:
        """The speculative arm's tokens/s over the plain arm's, at the same prompt cost per decoded token; None while
        either arm is unmeasured. Each arm's decode seconds per step are its mean less what its prompt tokens took
        (the slope fitted within both arms, so that a slower arm's extra per prompt token stays its own)."""
        plain, spec = self.arms
        if not (plain.steps and spec.steps and plain.decoded and spec.decoded):
            return None
        (sxx_plain, sxy_plain), (sxx_spec, sxy_spec) = plain.centred(), spec.centred()
        sxx = sxx_plain + sxx_spec
        slope = max(0.0, (sxy_plain + sxy_spec) / sxx) if sxx > 0 else 0.0
        prompt_per_token = slope * (plain.prompt + spec.prompt) / (plain.decoded + spec.decoded)
        per_token = [(arm.seconds - slope * arm.prompt) / arm.decoded + prompt_per_token for arm in self.arms]
        if min(per_token) <= 0:
            return None
        return per_token[0] / per_token[1]

    @property
    def loss(self) -> float:
        """What the speculative arm lost against the plain one, in plain steps (0 unless it read slower)."""
        plain, spec = self.arms
        ratio = self.ratio
        if ratio is None or ratio >= 1.0 or not plain.seconds:
            return 0.0
        return spec.seconds / (plain.seconds / plain.steps) * (1.0 - ratio)

    @property
    def won(self) -> bool:
        return self._final is not None and self._final >= (1.0 if self.rejection else 1.0 + TRIAL_GAIN)  # once done
