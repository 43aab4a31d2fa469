"""Prompt-lookup (n-gram) proposer: copies what followed the last earlier occurrence of the
current suffix in the request's own prompt + output. Costs no model call; deterministic,
so it returns no draft probabilities (the rejection sampler treats q as a point mass).

Shadow rounds: a greedy request's text does not depend on speculation (verification accepts a drafted token
exactly where it is the target's argmax, the token the request emits there anyway), so a proposal that is never
verified can be judged against the tokens the request emits next: a round of k drafts whose accepted count is
exact, at the cost of one lookup. The adaptive policy so learns what the n-gram proposer would get while a
request decodes plainly or drafts with the draft model, instead of only by spending verification on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.request import Request
from engine.spec_decode.ngram import NgramIndex
from engine.spec_decode.proposer import Draft


@dataclass(frozen=True)
class ShadowRound:
    """An unverified proposal: ``token_ids`` proposed when the request had emitted ``start`` tokens."""

    start: int
    token_ids: list[int]


class NgramProposer:
    name = "ngram"
    catch_up_tokens = 0

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.indexes: dict[str, NgramIndex] = {}
        self.shadows: dict[str, ShadowRound] = {}  # request id -> its pending shadow round (greedy requests only)

    def index(self, request: Request) -> NgramIndex:
        """The request's index, brought up to date with its committed tokens."""
        idx = self.indexes.get(request.request_id)
        if idx is None:
            idx = self.indexes[request.request_id] = NgramIndex(self.min_n, self.max_n)
        if len(idx) < request.num_tokens:
            idx.extend(request.tokens(len(idx), request.num_tokens))
        return idx

    def match_len(self, request: Request) -> int:
        return self.index(request).match_len()

    def add_request(self, request: Request) -> None:
        self.index(request)

    def remove_request(self, request: Request) -> None:
        self.indexes.pop(request.request_id, None)
        self.shadows.pop(request.request_id, None)

    def on_committed(self, request: Request) -> None:
        """Nothing to roll back: the index only ever sees committed tokens."""

    def propose(self, requests: list[Request], ks: list[int]) -> list[Draft]:
        return [Draft(self.index(r).propose(k), None) for r, k in zip(requests, ks)]

    def open_shadow(self, request: Request, k: int) -> None:
        """Propose ``k`` tokens to judge later (``settle_shadow``) instead of verifying them; one pending round per
        request. Only for greedy requests: a sampled one's text depends on what is verified."""
        if request.request_id not in self.shadows:
            proposal = self.index(request).propose(k)
            if proposal:
                self.shadows[request.request_id] = ShadowRound(len(request.output_ids), proposal)

    def settle_shadow(self, request: Request) -> tuple[int, int] | None:
        """(drafted, accepted) of the request's pending shadow round once its emitted tokens decide it, as a
        verified round of that many drafts would have ended: at the first mismatch, or with every draft accepted."""
        shadow = self.shadows.get(request.request_id)
        if shadow is None:
            return None
        proposal = shadow.token_ids
        emitted = request.output_ids[shadow.start : shadow.start + len(proposal)]
        accepted = 0
        while accepted < len(emitted) and emitted[accepted] == proposal[accepted]:
            accepted += 1
        if accepted == len(emitted) < len(proposal):
            return None  # every token so far matched: the next ones decide
        del self.shadows[request.request_id]
        return (accepted + 1 if accepted < len(proposal) else accepted), accepted
