"""Runs one model over one ragged batch against its own KV cache. Knows no proposer.

The target and the draft model each get a runner; a runner turns a list of
``SeqChunk`` (which request, which new tokens at which start position, how many
trailing positions need logits) into one forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv_cache import KVCache
from engine.models.llama import LlamaModel, build_attention_metadata, packed_linears, padded_rows


@dataclass(frozen=True)
class SeqChunk:
    request_id: str
    token_ids: list[int]  # new tokens fed this pass
    start: int  # position of token_ids[0]
    num_logits: int  # logits wanted for the last num_logits fed positions (0 = none)


class ModelRunner:
    def __init__(self, model: LlamaModel, cache: KVCache, device: torch.device) -> None:
        self.model = model
        self.cache = cache
        self.device = device
        self.vocab_size = model.args.vocab_size
        # A pass mixing decodes with verification attends in two groups, or in one with the decodes padded to
        # the verifying requests' k + 1 queries. On a CPU the padding's work costs more (16 requests, k = 2:
        # 142 -> 396 us per layer); on a GPU, whose small passes wait on kernel launches, the second group does:
        # on an H200 (bf16, bundled target, 30 requests) merged passes of mixed k = 0..4 took 6.1 ms, not 7.4
        # (bench/attention_groups.py), and at 32 code clients adaptive went from 1.04x to 1.10x ``off``.
        self.merge_decodes = device.type == "cuda"
        self._packed = next(iter(packed_linears(model)), None)  # its row padding is every packed linear's

    @property
    def pads_rows(self) -> bool:
        """Whether the model's linears run some row counts padded (a CPU's packed linears, `padded_rows`)."""
        return self._packed is not None

    def linear_rows(self, num_tokens: int) -> int:
        """The rows the model's linears run for ``num_tokens`` fed tokens: a step's cost follows these, not the
        tokens (one token beside 32 runs 36 rows on a CPU)."""
        packed = self._packed
        return num_tokens if packed is None else padded_rows(num_tokens, packed.row_padding)

    def execute(self, chunks: list[SeqChunk]) -> list[torch.Tensor]:
        """One forward pass; returns per chunk its logits ``[num_logits, vocab]`` (float32).

        The caller has reserved cache room for every chunk (``cache.reserve``).
        """
        tokens: list[int] = []
        positions: list[int] = []
        contexts: list[torch.Tensor] = []
        logit_rows: list[int] = []
        for chunk in chunks:
            n, end = len(chunk.token_ids), chunk.start + len(chunk.token_ids)
            offset = len(tokens)
            tokens.extend(chunk.token_ids)
            positions.extend(range(chunk.start, end))
            contexts.append(self.cache.indices(chunk.request_id, end))
            logit_rows.extend(range(offset + n - chunk.num_logits, offset + n))
        meta = build_attention_metadata(contexts, [len(c.token_ids) for c in chunks], self.device,
                                        self.merge_decodes, [c.num_logits for c in chunks])
        logits = self.model(
            torch.tensor(tokens, device=self.device),
            torch.tensor(positions, device=self.device),
            self.cache.layers,
            meta,
            torch.tensor(logit_rows, dtype=torch.long, device=self.device),
        )
        return list(logits.split([c.num_logits for c in chunks]))
