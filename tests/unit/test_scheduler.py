"""Scheduler: admission (max_running, KV capacity), chunked prefill without starving decodes, preemption, remove."""

from __future__ import annotations

import torch

from engine.kv_cache import PagedKVCache, SlottedKVCache
from engine.request import Request, RequestStatus
from engine.scheduler import Scheduler, SchedulerOutput
from engine.types import SamplingParams

CPU = torch.device("cpu")
BLOCK = 4
NEXT_TOKEN = 7


class StubDetokenizer:
    def add(self, token_ids):
        return "", False

    def flush(self):
        return ""


def make_request(rid: str, prompt_len: int, max_tokens: int = 64) -> Request:
    return Request(rid, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens), None,
                   StubDetokenizer())  # type: ignore[arg-type]


def make_scheduler(cache, *, max_running: int = 8, budget: int = 64, evicted: list | None = None) -> Scheduler:
    on_evict = evicted.append if evicted is not None else None
    return Scheduler(cache, max_running=max_running, max_waiting=100, max_num_batched_tokens=budget,
                     on_evict=on_evict)


def paged(num_blocks: int) -> PagedKVCache:
    return PagedKVCache(1, 1, 2, num_blocks, BLOCK, torch.float32, CPU)


def advance(out: SchedulerOutput) -> None:
    """Do what the engine does after a step without speculation: one new token per decode/finished prefill."""
    for r in out.decodes:
        r.num_computed += 1
        r.output_ids.append(NEXT_TOKEN)
    for chunk in out.prefills:
        chunk.request.num_computed = chunk.start + chunk.num_tokens
        if chunk.is_last:
            chunk.request.output_ids.append(NEXT_TOKEN)


def test_admission_limited_by_max_running():
    sched = make_scheduler(paged(64), max_running=2)
    requests = [make_request(f"r{i}", 3) for i in range(5)]
    for r in requests:
        sched.add(r)
    out = sched.schedule()
    assert [c.request for c in out.prefills] == requests[:2]
    assert all(c.start == 0 and c.num_tokens == 3 and c.is_last for c in out.prefills)
    assert sched.num_running == 2 and sched.num_waiting == 3
    assert [r.status for r in requests] == [RequestStatus.RUNNING] * 2 + [RequestStatus.WAITING] * 3
    advance(out)
    out = sched.schedule()
    assert out.decodes == requests[:2] and not out.prefills  # still full: nobody else admitted
    sched.remove(requests[0])
    advance(out)
    out = sched.schedule()
    assert out.decodes == [requests[1]] and [c.request for c in out.prefills] == [requests[2]]  # FIFO


def test_admission_limited_by_kv_capacity():
    cache = paged(4)  # 16 token slots
    sched = make_scheduler(cache)
    a, b = make_request("a", 10), make_request("b", 10)  # 3 blocks each
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert [c.request for c in out.prefills] == [a]
    assert cache.num_used_blocks == 3 and sched.num_waiting == 1 and b.status is RequestStatus.WAITING
    assert "b" not in cache
    sched.remove(a)
    out = sched.schedule()
    assert [c.request for c in out.prefills] == [b]


def test_slotted_admission_limited_by_slots():
    cache = SlottedKVCache(1, 1, 2, 2, 32, torch.float32, CPU)
    sched = make_scheduler(cache)
    requests = [make_request(f"r{i}", 4) for i in range(3)]
    for r in requests:
        sched.add(r)
    out = sched.schedule()
    assert [c.request for c in out.prefills] == requests[:2] and sched.num_waiting == 1


def test_long_prompt_is_chunked_and_decodes_are_not_starved():
    budget = 8
    sched = make_scheduler(paged(64), budget=budget)
    short = make_request("short", 3)
    sched.add(short)
    advance(sched.schedule())  # short is now decoding
    long = make_request("long", 30)
    sched.add(long)
    starts = []
    while long.is_prefilling or not long.output_ids:
        out = sched.schedule()
        assert out.decodes == [short], "the decoding request is fed every step"
        assert len(out.prefills) == 1 and out.prefills[0].request is long
        chunk = out.prefills[0]
        assert chunk.start == long.num_computed
        assert 1 + chunk.num_tokens <= budget  # one decode + the chunk fit the token budget
        starts.append(chunk.start)
        assert chunk.is_last == (chunk.start + chunk.num_tokens == 30)
        advance(out)
    assert starts == [0, 7, 14, 21, 28]
    assert long.num_computed == 30 and len(long.output_ids) == 1
    out = sched.schedule()
    assert out.decodes == [short, long] and not out.prefills


def test_continuing_prefill_goes_before_new_admissions():
    sched = make_scheduler(paged(64), budget=8)
    first, second = make_request("first", 12), make_request("second", 4)
    sched.add(first)
    out = sched.schedule()
    assert out.prefills[0].num_tokens == 8
    advance(out)
    sched.add(second)
    out = sched.schedule()
    assert [(c.request, c.start, c.num_tokens) for c in out.prefills] == [(first, 8, 4), (second, 0, 4)]


def test_admission_waits_for_kv_of_the_first_chunk():
    cache = paged(3)  # 12 token slots
    sched = make_scheduler(cache, budget=64)
    a = make_request("a", 6)  # 2 blocks
    sched.add(a)
    advance(sched.schedule())
    b = make_request("b", 8)
    sched.add(b)  # its first chunk needs 2 blocks, 1 is free: it waits
    out = sched.schedule()
    assert out.decodes == [a] and not out.prefills and sched.num_waiting == 1


def test_prefill_chunk_shrinks_to_the_free_kv():
    cache = paged(4)
    sched = make_scheduler(cache, budget=8)
    a, b = make_request("a", 6), make_request("b", 10)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert [(c.request, c.start, c.num_tokens) for c in out.prefills] == [(a, 0, 6), (b, 0, 2)]
    advance(out)
    assert cache.num_used_blocks == 3
    out = sched.schedule()  # b wants 7 more tokens (2 blocks) but 1 block is free: the chunk is halved to fit
    assert out.decodes == [a]
    assert [(c.request, c.start, c.num_tokens) for c in out.prefills] == [(b, 2, 3)]
    assert cache.num_used_blocks == 4 and not out.preempted


def test_preemption_when_kv_runs_out():
    cache = paged(4)
    evicted: list[Request] = []
    sched = make_scheduler(cache, evicted=evicted)
    a, b = make_request("a", 7), make_request("b", 7)
    sched.add(a)
    sched.add(b)
    advance(sched.schedule())  # both prefilled: 2 blocks each, cache full
    assert cache.num_used_blocks == 4
    assert a.num_tokens == b.num_tokens == 8
    advance(sched.schedule())  # decode position 7 still fits the second block
    assert a.num_tokens == 9
    out = sched.schedule()  # a needs a third block: the newest request (b) is preempted
    assert out.preempted == [b] and out.decodes == [a]
    assert b.status is RequestStatus.WAITING and b.num_computed == 0 and b.num_preemptions == 1
    assert list(sched.waiting) == [b] and sched.running == [a]
    assert "b" not in cache and evicted == [b]
    assert b.output_ids == [NEXT_TOKEN, NEXT_TOKEN]  # tokens are kept; only the cache is recomputed
    assert cache.num_used_blocks == 3
    advance(out)
    sched.remove(a)
    out = sched.schedule()  # b is recomputed from scratch: prompt + its outputs
    assert [(c.request, c.start, c.num_tokens, c.is_last) for c in out.prefills] == [(b, 0, 9, True)]


def test_preempted_request_is_requeued_at_the_front():
    cache = paged(4)
    sched = make_scheduler(cache, max_running=2)
    a, b, c = make_request("a", 7), make_request("b", 7), make_request("c", 2)
    for r in (a, b, c):
        sched.add(r)
    advance(sched.schedule())
    advance(sched.schedule())
    out = sched.schedule()
    assert out.preempted == [b]
    assert list(sched.waiting) == [b, c]


def test_a_request_that_cannot_grow_preempts_itself_when_it_is_the_newest():
    cache = paged(2)
    sched = make_scheduler(cache)
    a = make_request("a", 8)
    sched.add(a)
    advance(sched.schedule())
    assert cache.num_used_blocks == 2
    out = sched.schedule()  # position 8 needs a third block that does not exist
    assert out.preempted == [a] and not out.decodes
    assert "a" not in cache and a.num_computed == 0


def test_remove_frees_the_cache():
    cache = paged(16)
    evicted: list[Request] = []
    sched = make_scheduler(cache, max_running=1, evicted=evicted)
    a, b = make_request("a", 9), make_request("b", 3)
    sched.add(a)
    sched.add(b)
    advance(sched.schedule())
    assert cache.num_used_blocks == 3
    sched.remove(a)
    assert cache.num_used_blocks == 0 and "a" not in cache and sched.num_running == 0 and evicted == [a]
    sched.remove(b)  # a waiting request leaves the queue
    assert sched.num_waiting == 0 and not sched.has_work and evicted == [a, b]
