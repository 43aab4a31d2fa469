"""The policy seam: the engine describes each step in plain views; a policy answers with decisions.

Policies never see models, caches or tensors, only these dataclasses, so they can be
unit-tested and simulated without an engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

ProposerName = Literal["draft", "ngram"]
PROPOSERS: tuple[str, ...] = ("draft", "ngram")
OverrideMode = Literal["auto", "off", "draft", "ngram"]


@dataclass(frozen=True)
class RequestView:
    """What the policy may know about one running (decoding) request this step."""

    request_id: str
    temperature: float
    num_output_tokens: int
    max_k: int  # hard cap from the engine: k_max, the request's override and the sequence-length guard
    ngram_match_len: int  # length of the n-gram the prompt-lookup proposer matched now (0 = no match)
    override_mode: OverrideMode = "auto"  # the request's own `speculation.mode`
    draft_available: bool = True  # False when the engine has no draft model
    draft_lag: int = 0  # tokens the draft model must catch up on before the request's next draft (all, if none yet)
    num_remaining_tokens: int = 0  # tokens the request may still emit (its max_tokens left); 0 = unknown


@dataclass(frozen=True)
class BatchView:
    requests: tuple[RequestView, ...]
    num_waiting: int = 0
    num_prefill_tokens: int = 0  # tokens of prefill chunks sharing this step
    num_prefilling: int = 0  # requests whose prompt chunks share this step: they decode from the next step on

    @property
    def load(self) -> int:
        """Running requests: the decodes of this step and those still prefilling (the batch they join)."""
        return len(self.requests) + self.num_prefilling


@dataclass(frozen=True)
class Decision:
    """k = 0 means plain decode (proposer is then ignored)."""

    k: int
    proposer: ProposerName = "draft"


@dataclass(frozen=True)
class RoundOutcome:
    """The result of one speculation round of one request."""

    request_id: str
    proposer: ProposerName
    temperature: float
    num_drafted: int
    num_accepted: int
    ngram_match_len: int = 0  # an n-gram round's match length (its acceptance is learned per length class); 0 = unknown


@dataclass(frozen=True)
class StepTiming:
    """Measured wall time of one engine step with at least one decode, for the cost model and the goodput guard."""

    batch_size: int  # decoding (and verifying) requests in the target's forward pass
    num_tokens: int  # tokens fed to the target in that pass (decode + drafts + prefill)
    target_seconds: float
    num_draft_tokens: int = 0  # tokens the draft model produced (for its per-token cost)
    draft_seconds: float = 0.0
    num_draft_requests: int = 0  # batch size of the draft model's forward passes
    num_draft_passes: int = 0  # sequential draft forward passes (max k of the draft users); 0 = unknown
    num_draft_catch_up_tokens: int = 0  # tokens the draft model fed beyond one per request (prefill, catch-up)
    step_seconds: float = 0.0  # the whole step (planning, drafting, verifying, committing); 0 = unknown
    num_generated: int = 0  # tokens the step emitted (accepted drafts + one per request, and prefills' first)
    num_prefill_tokens: int = 0  # tokens of prefill chunks that shared the pass (the cost model fits none)
    num_prefilling: int = 0  # requests whose prompt chunks shared the pass

    @property
    def speculative(self) -> bool:
        """Whether the step fed drafts to the target."""
        return self.num_tokens - self.num_prefill_tokens > self.batch_size


class SpeculationPolicy(Protocol):
    name: str

    def decide(self, batch: BatchView) -> list[Decision]:
        """One decision per request in ``batch.requests``, same order."""
        ...

    def observe(self, outcome: RoundOutcome) -> None: ...

    def observe_step(self, timing: StepTiming) -> None: ...

    def forget(self, request_id: str) -> None:
        """The request finished or was aborted: drop its state."""
        ...
