"""Prompt-lookup (n-gram) proposer: copies what followed the last earlier occurrence of the
current suffix in the request's own prompt + output. Costs no model call; deterministic,
so it returns no draft probabilities (the rejection sampler treats q as a point mass)."""

from __future__ import annotations

from engine.request import Request
from engine.spec_decode.ngram import NgramIndex
from engine.spec_decode.proposer import Draft


class NgramProposer:
    name = "ngram"
    catch_up_tokens = 0

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.indexes: dict[str, NgramIndex] = {}

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

    def on_committed(self, request: Request) -> None:
        """Nothing to roll back: the index only ever sees committed tokens."""

    def propose(self, requests: list[Request], ks: list[int]) -> list[Draft]:
        return [Draft(self.index(r).propose(k), None) for r, k in zip(requests, ks)]
