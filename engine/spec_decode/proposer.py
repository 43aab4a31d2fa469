"""The proposer seam: something that suggests k draft tokens per request.

``build_proposers`` is the only place that switches on a proposer's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from engine.request import Request


@dataclass
class Draft:
    token_ids: list[int]  # up to k proposed tokens (a proposer may return fewer)
    probs: torch.Tensor | None  # [len(token_ids), vocab] processed draft distribution q; None = deterministic


class Proposer(Protocol):
    name: str
    catch_up_tokens: int  # tokens the last propose() fed beyond one per request: what it caught up on

    def add_request(self, request: Request) -> None: ...

    def remove_request(self, request: Request) -> None:
        """Finished, aborted or preempted: drop its state (and cache) at once."""
        ...

    def propose(self, requests: list[Request], ks: list[int]) -> list[Draft]:
        """One Draft per request; ks[i] >= 1 is the wanted draft length."""
        ...

    def on_committed(self, request: Request) -> None:
        """The request's accepted tokens were appended: roll any state back to them."""
        ...


def build_proposers(config, *, draft_runner=None, tokenizer=None) -> dict[str, Proposer]:
    """Every proposer the engine can use this run, by name."""
    from engine.spec_decode.draft_model import DraftModelProposer
    from engine.spec_decode.prompt_lookup import NgramProposer

    proposers: dict[str, Proposer] = {"ngram": NgramProposer(config.ngram_min, config.ngram_max)}
    if draft_runner is not None:
        proposers["draft"] = DraftModelProposer(draft_runner)
    return proposers
