"""A request's state inside the engine."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from engine.models.tokenizer import IncrementalDetokenizer
from engine.types import FinishReason, SamplingParams, SpecStats, TokenLogprob


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """Token ids are prompt + output; ``num_computed`` of them have K/V in the target cache.

    Invariant while decoding: ``num_computed == num_tokens - 1`` (the newest token is fed
    next step). While ``num_tokens - num_computed > 1`` the request is (re)prefilling.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    detokenizer: IncrementalDetokenizer
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    spec: SpecStats = field(default_factory=SpecStats)
    arrival_time: float = field(default_factory=time.monotonic)
    num_preemptions: int = 0
    # increments not yet handed to the caller
    pending_ids: list[int] = field(default_factory=list)
    pending_text: str = ""
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_prefilling(self) -> bool:
        return self.num_tokens - self.num_computed > 1

    @property
    def remaining_tokens(self) -> int:
        return self.params.max_tokens - len(self.output_ids)

    def token_at(self, index: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[index] if index < n else self.output_ids[index - n]

    def tokens(self, start: int, end: int) -> list[int]:
        return (self.prompt_ids + self.output_ids)[start:end]

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
