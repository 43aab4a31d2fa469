"""Draft-model proposer: a small model with its own KV cache, kept in lockstep with the target's.

Cache invariant: the draft cache of a request holds K/V for a prefix of the request's
committed tokens (``draft_len <= num_tokens - 1``). Before drafting, the proposer
*catches up* on every committed token it has not seen: on the first round that is the
whole prompt (lazy, batched prefill); after rounds where the request drafted nothing
(k = 0) it is the tokens emitted meanwhile. Skipping that catch-up is what makes other
engines' acceptance collapse when speculation is switched back on.

A round may end before k tokens: after a token the draft itself gave less than ``stop_confidence``
(a runtime policy setting), drafting more for that request would mostly buy rejected tokens. The
stop depends on the draft's own outputs only, so verification stays exact.
"""

from __future__ import annotations

import torch

from engine.model_runner import ModelRunner, SeqChunk
from engine.request import Request
from engine.sampler import apply_penalties, processed_probs, sample_rows, transform_key
from engine.spec_decode.proposer import Draft


class DraftModelProposer:
    name = "draft"

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.cache = runner.cache
        self.catch_up_tokens = 0  # tokens the last round fed beyond one per request (prefill, catch-up)
        self.stop_confidence = 0.0  # end a request's round after a draft token of lower probability; 0 = never

    def add_request(self, request: Request) -> None:
        if request.request_id not in self.cache:
            self.cache.allocate(request.request_id)

    def remove_request(self, request: Request) -> None:
        self.cache.free(request.request_id)

    def lag(self, request: Request) -> int:
        """Committed tokens the draft cache lacks beyond the one every round feeds: what the request's next
        round would first catch up on (its whole prompt and output if it never drafted)."""
        length = self.cache.length(request.request_id) if request.request_id in self.cache else 0
        return max(0, request.num_tokens - length - 1)

    def on_committed(self, request: Request) -> None:
        rid = request.request_id
        if rid in self.cache and self.cache.length(rid) > request.num_computed:
            self.cache.truncate_to(rid, request.num_computed)

    def propose(self, requests: list[Request], ks: list[int]) -> list[Draft]:
        tokens: list[list[int]] = [[] for _ in requests]
        qs: list[list[torch.Tensor]] = [[] for _ in requests]
        counts = [self._counts(r) for r in requests]
        # pass 0: catch up on missed tokens (prefill on the first round) and draft token 1
        chunks = []
        for r in requests:
            self.add_request(r)
            start = self.cache.length(r.request_id)
            self.cache.reserve(r.request_id, r.num_tokens)
            chunks.append(SeqChunk(r.request_id, r.tokens(start, r.num_tokens), start, 1))
        # normally a round feeds 1 token per request (2 after a fully accepted round)
        self.catch_up_tokens = sum(len(c.token_ids) for c in chunks) - len(chunks)
        logits = self.runner.execute(chunks)
        active = list(range(len(requests)))
        for step in range(max(ks)):
            confidences = self._take_all([requests[i] for i in active], logits, [counts[i] for i in active],
                                         [tokens[i] for i in active], [qs[i] for i in active])
            stopped = {i for i, confidence in zip(active, confidences) if confidence < self.stop_confidence}
            active = [i for i in active if len(tokens[i]) < ks[i] and i not in stopped]
            if not active:
                break
            chunks = []
            for i in active:
                r, pos = requests[i], requests[i].num_tokens + step
                self.cache.reserve(r.request_id, pos + 1)
                chunks.append(SeqChunk(r.request_id, [tokens[i][-1]], pos, 1))
            logits = self.runner.execute(chunks)
        return [Draft(t, torch.stack(q) if q else None) for t, q in zip(tokens, qs)]

    def _counts(self, request: Request) -> torch.Tensor | None:
        if not request.params.has_penalties:
            return None
        counts = torch.zeros(self.runner.vocab_size)
        if request.output_ids:
            counts.index_add_(0, torch.tensor(request.output_ids), torch.ones(len(request.output_ids)))
        return counts

    def _take_all(self, requests: list[Request], logits: list[torch.Tensor], counts: list[torch.Tensor | None],
                  tokens: list[list[int]], qs: list[list[torch.Tensor]]) -> list[float]:
        """Pick every active request's next draft token; returns the draft's probability of each (see `_take`).

        Sampling requests whose transforms match (the usual case: one temperature and top-p for all) go
        through `processed_probs` and the sampler as one batch: per request, those would be a dozen small
        ops per draft position, more than the draft model's own per-request cost.
        """
        confidences = [1.0] * len(requests)
        groups: dict[tuple | str, list[int]] = {}
        for j, request in enumerate(requests):
            params = request.params
            key = "greedy" if params.greedy and not params.has_penalties else transform_key(params)
            if key is None:  # penalties: the request's own counts shape its distribution
                confidences[j] = self._take(request, logits[j], counts[j], tokens[j], qs[j])
            else:
                groups.setdefault(key, []).append(j)
        for key, group in groups.items():
            rows = torch.cat([logits[j] for j in group])  # [g, vocab]
            if key == "greedy":
                q = None
                picks = rows.argmax(dim=-1).tolist()
            else:
                q = processed_probs(rows, requests[group[0]].params, None)  # [g, vocab]
                picks = sample_rows(q, [requests[j].generator for j in group])
            if self.stop_confidence > 0:
                probs = torch.softmax(rows, dim=-1) if q is None else q
                for j, confidence in zip(group, probs[torch.arange(len(group)), picks].tolist()):
                    confidences[j] = confidence
            for row, (j, token) in enumerate(zip(group, picks)):
                tokens[j].append(token)
                if q is not None:
                    qs[j].append(q[row])
        return confidences

    def _take(self, request: Request, logits: torch.Tensor, counts: torch.Tensor | None,
              tokens: list[int], qs: list[torch.Tensor]) -> float:
        """Pick the next draft token with the same transforms the target's verification uses.

        Returns the draft's probability of that token, or 1.0 while no stop is set (reading it costs a device sync).
        """
        params = request.params
        row_counts = counts[None] if counts is not None else None
        if params.greedy:
            scores = apply_penalties(logits, params, row_counts)[0]
            token = int(scores.argmax())
            confidence = float(torch.softmax(scores, dim=-1)[token]) if self.stop_confidence > 0 else 1.0
        else:
            q = processed_probs(logits, params, row_counts)[0]
            token = sample_rows(q[None], [request.generator])[0]
            confidence = float(q[token]) if self.stop_confidence > 0 else 1.0
            qs.append(q)
        tokens.append(token)
        if counts is not None:
            counts[token] += 1
        return confidence
