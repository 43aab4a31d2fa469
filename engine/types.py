"""Plain data crossing the engine's public API: sampling parameters and outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from engine.errors import InvalidRequestError

SpeculationMode = Literal["auto", "off", "draft", "ngram"]
SPECULATION_MODES: tuple[str, ...] = ("auto", "off", "draft", "ngram")
FinishReason = Literal["stop", "length", "abort"]
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SpeculationOverride:
    """A request's own say in speculation: ``{"mode": ..., "max_k": ...}``."""

    mode: SpeculationMode = "auto"
    max_k: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in SPECULATION_MODES:
            raise InvalidRequestError(
                f"speculation.mode must be one of {', '.join(SPECULATION_MODES)}; got {self.mode!r}",
                param="speculation.mode",
            )
        if self.max_k is not None and (not isinstance(self.max_k, int) or isinstance(self.max_k, bool)
                                       or not 0 <= self.max_k <= 64):
            raise InvalidRequestError(
                f"speculation.max_k must be an integer in [0, 64]; got {self.max_k!r}",
                param="speculation.max_k",
            )


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, validated on construction.

    ``temperature == 0`` means greedy. ``top_k <= 0`` and ``top_p == 1`` disable truncation.
    ``logprobs`` is None (off) or the number of top alternatives to report (0..20).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    speculation: SpeculationOverride | None = None

    def __post_init__(self) -> None:
        def bad(param: str, why: str) -> InvalidRequestError:
            return InvalidRequestError(f"{param} {why}", param=param)

        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad("max_tokens", f"must be an integer >= 1; got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= 2.0:
            raise bad("temperature", f"must be in [0, 2]; got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", f"must be in (0, 1]; got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", f"must be in [0, 1]; got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise bad(name, f"must be in [-2, 2]; got {getattr(self, name)}")
        if self.seed is not None and (not isinstance(self.seed, int) or not -(2**63) <= self.seed < 2**64):
            raise bad("seed", f"must be an integer in [-2**63, 2**64); got {self.seed!r}")  # torch's seed range
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise bad("top_logprobs", f"must be in [0, {MAX_TOP_LOGPROBS}]; got {self.logprobs}")
        if any(not s for s in self.stop):
            raise bad("stop", "must not contain empty strings")
        if len(self.stop) > 16:
            raise bad("stop", "may hold at most 16 sequences")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


@dataclass
class ProposerStats:
    """Speculation counters of one request for one proposer."""

    rounds: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def add(self, num_drafted: int, num_accepted: int) -> None:
        self.rounds += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_drafted:
            self.accepted_per_pos.extend([0] * (num_drafted - len(self.accepted_per_pos)))
        for pos in range(num_accepted):
            self.accepted_per_pos[pos] += 1


@dataclass
class SpecStats:
    """Per-request speculation summary, keyed by proposer name ("draft", "ngram")."""

    by_proposer: dict[str, ProposerStats] = field(default_factory=dict)
    num_plain_steps: int = 0

    def add(self, proposer: str, num_drafted: int, num_accepted: int) -> None:
        self.by_proposer.setdefault(proposer, ProposerStats()).add(num_drafted, num_accepted)

    @property
    def rounds(self) -> int:
        return sum(s.rounds for s in self.by_proposer.values())

    @property
    def num_draft_tokens(self) -> int:
        return sum(s.num_draft_tokens for s in self.by_proposer.values())

    @property
    def num_accepted_tokens(self) -> int:
        return sum(s.num_accepted_tokens for s in self.by_proposer.values())

    @property
    def acceptance_rate(self) -> float:
        drafted = self.num_draft_tokens
        return self.num_accepted_tokens / drafted if drafted else 0.0

    def to_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "drafted_tokens": self.num_draft_tokens,
            "accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "plain_decode_steps": self.num_plain_steps,
            "proposers": {
                name: {
                    "rounds": s.rounds,
                    "drafted_tokens": s.num_draft_tokens,
                    "accepted_tokens": s.num_accepted_tokens,
                    "accepted_per_position": list(s.accepted_per_pos),
                }
                for name, s in self.by_proposer.items()
            },
        }


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()


@dataclass
class RequestOutput:
    """One streamed increment of a request: new tokens/text since the previous output."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    num_prompt_tokens: int
    num_output_tokens: int
    finished: bool = False
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None
    spec: SpecStats | None = None


@dataclass(frozen=True)
class EngineHealth:
    """A cheap snapshot for /health, /ready and the gauges."""

    ready: bool
    loop_alive: bool
    num_running: int
    num_waiting: int
    kv_used_blocks: int
    kv_total_blocks: int
