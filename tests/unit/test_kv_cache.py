"""KV cache backends: allocation, reserve on demand, truncate (rollback), free, capacity, index mapping, no leaks."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.kv_cache import OutOfCapacityError, PagedKVCache, SlottedKVCache, make_kv_cache

CPU = torch.device("cpu")
BLOCK = 4


def paged(num_blocks: int = 8, block_size: int = BLOCK) -> PagedKVCache:
    return PagedKVCache(1, 1, 2, num_blocks, block_size, torch.float32, CPU)


def slotted(num_slots: int = 3, max_seq_len: int = 16) -> SlottedKVCache:
    return SlottedKVCache(1, 1, 2, num_slots, max_seq_len, torch.float32, CPU)


# ---------------------------------------------------------------- paged


def test_paged_allocates_blocks_on_demand():
    cache = paged()
    assert cache.num_total_blocks == 8 and cache.num_used_blocks == 0
    cache.allocate("a")
    assert "a" in cache and cache.num_requests == 1
    assert cache.length("a") == 0 and cache.num_used_blocks == 0  # nothing reserved yet
    cache.reserve("a", 1)
    assert cache.num_used_blocks == 1 and cache.length("a") == 1
    cache.reserve("a", BLOCK)  # still fits the first block
    assert cache.num_used_blocks == 1
    cache.reserve("a", BLOCK + 1)
    assert cache.num_used_blocks == 2 and cache.length("a") == BLOCK + 1
    cache.reserve("a", 2)  # reserve never shrinks
    assert cache.length("a") == BLOCK + 1 and cache.num_used_blocks == 2


def test_paged_truncate_frees_whole_blocks_past_the_new_end():
    cache = paged()
    cache.allocate("a")
    cache.reserve("a", 3 * BLOCK)
    assert cache.num_used_blocks == 3
    cache.truncate_to("a", 2 * BLOCK + 1)  # still needs 3 blocks
    assert cache.num_used_blocks == 3 and cache.length("a") == 2 * BLOCK + 1
    cache.truncate_to("a", 2 * BLOCK)  # exactly two blocks
    assert cache.num_used_blocks == 2 and cache.length("a") == 2 * BLOCK
    cache.truncate_to("a", 1)
    assert cache.num_used_blocks == 1 and cache.length("a") == 1
    cache.truncate_to("a", 5 * BLOCK)  # truncating "up" changes nothing
    assert cache.num_used_blocks == 1 and cache.length("a") == 1
    cache.truncate_to("a", 0)
    assert cache.num_used_blocks == 0 and cache.length("a") == 0 and "a" in cache


def test_paged_free_returns_every_block():
    cache = paged()
    cache.allocate("a")
    cache.allocate("b")
    cache.reserve("a", 2 * BLOCK + 1)
    cache.reserve("b", BLOCK)
    assert cache.num_used_blocks == 4
    cache.free("a")
    assert "a" not in cache and cache.num_used_blocks == 1 and cache.num_requests == 1
    cache.free("a")  # idempotent
    cache.free("never-allocated")
    assert cache.num_used_blocks == 1
    cache.free("b")
    assert cache.num_used_blocks == 0 and cache.num_requests == 0
    assert sorted(cache.free_blocks) == list(range(8))


def test_paged_out_of_capacity():
    cache = paged(num_blocks=4)
    cache.allocate("a")
    cache.allocate("b")
    cache.reserve("a", 3 * BLOCK)
    assert cache.can_allocate(BLOCK) and not cache.can_allocate(BLOCK + 1)
    assert cache.can_reserve("b", BLOCK) and not cache.can_reserve("b", BLOCK + 1)
    assert cache.can_reserve("a", 4 * BLOCK) and not cache.can_reserve("a", 4 * BLOCK + 1)
    with pytest.raises(OutOfCapacityError):
        cache.reserve("b", 2 * BLOCK)
    assert cache.length("b") == 0 and cache.num_used_blocks == 3  # a failed reserve takes nothing
    cache.reserve("b", BLOCK)
    assert cache.num_used_blocks == 4 and not cache.can_allocate(1)
    cache.truncate_to("a", BLOCK)  # rollback makes room again
    assert cache.can_reserve("b", 3 * BLOCK)


def test_paged_double_allocate_is_an_error():
    cache = paged()
    cache.allocate("a")
    with pytest.raises(ValueError):
        cache.allocate("a")


def test_paged_indices_follow_the_block_table():
    cache = paged(num_blocks=6)
    cache.allocate("a")
    cache.allocate("b")
    cache.reserve("a", BLOCK)  # a: first block
    cache.reserve("b", BLOCK)  # b: second block
    cache.reserve("a", 2 * BLOCK + 2)  # a: two more blocks after b's
    table = cache.tables["a"]
    assert len(table) == 3 and len(set(table) | set(cache.tables["b"])) == 4
    got = cache.indices("a", 2 * BLOCK + 2).tolist()
    expected = [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(2 * BLOCK + 2)]
    assert got == expected
    assert cache.indices("a", 3).tolist() == expected[:3]
    assert cache.indices("a", 0).tolist() == []
    assert not set(got) & set(cache.indices("b", BLOCK).tolist())
    # the flat indices address the layer tensors: a write through them lands in a's blocks only
    k, _ = cache.layers[0]
    k[cache.indices("a", 2 * BLOCK + 2)] = 1.0
    assert k[cache.indices("b", BLOCK)].abs().sum() == 0


# ---------------------------------------------------------------- slotted


def test_slotted_allocation_and_indices():
    cache = slotted(num_slots=3, max_seq_len=16)
    assert cache.num_total_blocks == 3 and cache.num_used_blocks == 0
    cache.allocate("a")
    cache.allocate("b")
    assert cache.num_used_blocks == 2 and cache.num_requests == 2  # a "block" is a whole slot
    cache.reserve("a", 5)
    assert cache.length("a") == 5 and cache.length("b") == 0
    slot_a, slot_b = cache.slot_of["a"], cache.slot_of["b"]
    assert slot_a != slot_b
    assert cache.indices("a", 5).tolist() == list(range(slot_a * 16, slot_a * 16 + 5))
    assert cache.indices("b", 16).tolist() == list(range(slot_b * 16, slot_b * 16 + 16))


def test_slotted_truncate_only_lowers_the_length():
    cache = slotted()
    cache.allocate("a")
    cache.reserve("a", 12)
    cache.truncate_to("a", 4)
    assert cache.length("a") == 4 and cache.num_used_blocks == 1 and "a" in cache
    cache.truncate_to("a", 10)
    assert cache.length("a") == 4
    cache.reserve("a", 3)
    assert cache.length("a") == 4


def test_slotted_out_of_capacity():
    cache = slotted(num_slots=2, max_seq_len=16)
    cache.allocate("a")
    assert cache.can_reserve("a", 16) and not cache.can_reserve("a", 17)
    with pytest.raises(OutOfCapacityError):
        cache.reserve("a", 17)
    assert cache.length("a") == 0
    assert cache.can_allocate(16) and not cache.can_allocate(17)
    cache.allocate("b")
    assert not cache.can_allocate(1)
    with pytest.raises(OutOfCapacityError):
        cache.allocate("c")
    with pytest.raises(ValueError):
        cache.allocate("a")
    cache.free("a")
    assert "a" not in cache and cache.num_used_blocks == 1 and cache.can_allocate(1)
    cache.allocate("c")
    assert cache.num_used_blocks == 2


def test_make_kv_cache():
    kw = dict(num_layers=2, kv_heads=1, head_dim=4, max_running=3, max_seq_len=20, block_size=8,
              dtype=torch.float32, device=CPU)
    p = make_kv_cache("paged", num_blocks=None, **kw)
    assert isinstance(p, PagedKVCache) and p.num_total_blocks == 3 * 3  # ceil(20 / 8) blocks per request
    assert len(p.layers) == 2 and p.layers[0][0].shape == (9 * 8, 1, 4)
    assert make_kv_cache("paged", num_blocks=5, **kw).num_total_blocks == 5
    s = make_kv_cache("slotted", num_blocks=None, **kw)
    assert isinstance(s, SlottedKVCache) and s.num_total_blocks == 3 and s.layers[1][1].shape == (60, 1, 4)
    with pytest.raises(ValueError, match="unknown kv cache kind"):
        make_kv_cache("bogus", num_blocks=None, **kw)


# ---------------------------------------------------------------- no leaks under random operations


def check_consistent(cache, lengths: dict[str, int]) -> None:
    """The cache agrees with a model of request lengths; no index is shared; blocks are accounted for."""
    assert {rid for rid in lengths} == set(cache.len_of)
    for rid, n in lengths.items():
        assert cache.length(rid) == n
    seen: set[int] = set()
    for rid, n in lengths.items():
        idx = cache.indices(rid, n).tolist()
        assert len(idx) == n and not seen & set(idx)
        seen |= set(idx)
    if isinstance(cache, PagedKVCache):
        for rid, n in lengths.items():
            assert len(cache.tables[rid]) == cache.blocks_for(n)
        owned = [b for table in cache.tables.values() for b in table]
        assert len(owned) == len(set(owned)) == cache.num_used_blocks
        assert sorted(owned + cache.free_blocks) == list(range(cache.num_total_blocks))
    else:
        slots = list(cache.slot_of.values())
        assert sorted(slots + cache.free_slots) == list(range(cache.num_total_blocks))


@pytest.mark.parametrize("make", [lambda: paged(num_blocks=10, block_size=3), lambda: slotted(4, 12)],
                         ids=["paged", "slotted"])
def test_random_operations_never_leak(make):
    rng = random.Random(1234)
    cache = make()
    lengths: dict[str, int] = {}
    for step in range(2000):
        op = rng.random()
        if op < 0.2 or not lengths:
            rid = f"r{step}"
            if cache.can_allocate(1) and (isinstance(cache, PagedKVCache) or cache.free_slots):
                cache.allocate(rid)
                lengths[rid] = 0
        else:
            rid = rng.choice(sorted(lengths))
            if op < 0.6:
                new_len = lengths[rid] + rng.randint(0, 7)
                if cache.can_reserve(rid, new_len):
                    cache.reserve(rid, new_len)
                    lengths[rid] = max(lengths[rid], new_len)
                else:
                    used = cache.num_used_blocks
                    with pytest.raises(OutOfCapacityError):
                        cache.reserve(rid, new_len)
                    assert cache.num_used_blocks == used
            elif op < 0.9:
                new_len = rng.randint(0, lengths[rid] + 2)
                cache.truncate_to(rid, new_len)
                lengths[rid] = min(lengths[rid], new_len)
            else:
                cache.free(rid)
                del lengths[rid]
        check_consistent(cache, lengths)
    for rid in list(lengths):
        cache.free(rid)
    assert cache.num_used_blocks == 0 and cache.num_requests == 0


class PagedCacheMachine(RuleBasedStateMachine):
    """Hypothesis drives reserve/truncate/free on a small paged cache; the model must always agree."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = paged(num_blocks=6, block_size=2)
        self.lengths: dict[str, int] = {}
        self.counter = 0

    @rule()
    def allocate(self) -> None:
        rid = f"r{self.counter}"
        self.counter += 1
        self.cache.allocate(rid)
        self.lengths[rid] = 0

    @precondition(lambda self: self.lengths)
    @rule(data=st.data(), grow=st.integers(0, 6))
    def reserve(self, data, grow: int) -> None:
        rid = data.draw(st.sampled_from(sorted(self.lengths)))
        new_len = self.lengths[rid] + grow
        if self.cache.can_reserve(rid, new_len):
            self.cache.reserve(rid, new_len)
            self.lengths[rid] = new_len
        else:
            with pytest.raises(OutOfCapacityError):
                self.cache.reserve(rid, new_len)

    @precondition(lambda self: self.lengths)
    @rule(data=st.data(), shrink=st.integers(0, 6))
    def truncate(self, data, shrink: int) -> None:
        rid = data.draw(st.sampled_from(sorted(self.lengths)))
        new_len = max(0, self.lengths[rid] - shrink)
        self.cache.truncate_to(rid, new_len)
        self.lengths[rid] = new_len

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def free(self, data) -> None:
        rid = data.draw(st.sampled_from(sorted(self.lengths)))
        self.cache.free(rid)
        del self.lengths[rid]

    @invariant()
    def consistent(self) -> None:
        check_consistent(self.cache, self.lengths)

    def teardown(self) -> None:
        for rid in list(self.lengths):
            self.cache.free(rid)
        assert self.cache.num_used_blocks == 0


TestPagedCacheMachine = PagedCacheMachine.TestCase
TestPagedCacheMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None, derandomize=True,
                                          suppress_health_check=[HealthCheck.too_slow])
