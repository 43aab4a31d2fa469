"""Random accept/reject rounds: the cache equals a fresh prefill of the accepted text, and no block leaks."""

from __future__ import annotations

import random

import pytest
import torch

from engine.model_runner import ModelRunner, SeqChunk
from tests.conftest import make_runner

CPU = torch.device("cpu")


def cached_kv(runner: ModelRunner, rid: str, length: int) -> list[torch.Tensor]:
    idx = runner.cache.indices(rid, length)
    return [torch.stack((k[idx], v[idx])) for k, v in runner.cache.layers]


@pytest.mark.parametrize("kind", ["paged", "slotted"])
def test_random_rounds_match_fresh_prefill(random_llama_dir, kind):
    rng = random.Random(7)
    runner = make_runner(random_llama_dir, kind, block_size=4)
    texts = {rid: [rng.randrange(512) for _ in range(rng.randint(3, 12))] for rid in ("a", "b", "c")}
    for rid, ids in texts.items():
        runner.cache.allocate(rid)
        runner.cache.reserve(rid, len(ids) - 1)
        runner.execute([SeqChunk(rid, ids[:-1], 0, 0)])
    for _ in range(40):
        chunks, plans = [], {}
        for rid, ids in texts.items():
            k = rng.randint(0, 6)
            computed = len(ids) - 1
            drafts = [rng.randrange(512) for _ in range(k)]
            runner.cache.reserve(rid, computed + 1 + k)
            chunks.append(SeqChunk(rid, [ids[-1]] + drafts, computed, 1 + k))
            plans[rid] = (drafts, rng.randint(0, k))
        runner.execute(chunks)
        for rid, (drafts, accepted) in plans.items():
            texts[rid] += drafts[:accepted] + [rng.randrange(512)]
            runner.cache.truncate_to(rid, len(texts[rid]) - 1)
    for rid, ids in texts.items():
        length = len(ids) - 1
        fresh = make_runner(random_llama_dir, kind, block_size=4)
        fresh.cache.allocate(rid)
        fresh.cache.reserve(rid, length)
        fresh.execute([SeqChunk(rid, ids[:-1], 0, 0)])
        for got, want in zip(cached_kv(runner, rid, length), cached_kv(fresh, rid, length)):
            assert torch.allclose(got, want, atol=1e-5)
        if kind == "paged":
            assert len(runner.cache.tables[rid]) == runner.cache.blocks_for(length)
    used = runner.cache.num_used_blocks
    for rid in texts:
        runner.cache.free(rid)
    assert runner.cache.num_used_blocks == 0 and used > 0
