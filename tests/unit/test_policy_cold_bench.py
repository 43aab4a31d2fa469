"""bench/policy_cold.py: which batches it keeps for its replays, and what a replay times."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from bench.policy_cold import record, replay
from policies.base import BatchView, RequestView
from policies.controller import PolicyController


def batch_of(size: int) -> BatchView:
    return BatchView(tuple(RequestView(f"r{i}", 0.7, 3, 4, 0) for i in range(size)))


def test_every_decide_in_the_steps_is_timed_and_the_batches_of_the_cells_size_are_kept() -> None:
    engine = SimpleNamespace(policy=PolicyController())
    seconds: list[float] = []
    kept: list[BatchView] = []
    record(engine, seconds, kept, batch_size=2)
    batches = [batch_of(2), batch_of(1), batch_of(2)]
    for batch in batches:
        assert len(engine.policy.decide(batch)) == len(batch.requests)
    assert len(seconds) == 3 and all(s >= 0.0 for s in seconds)
    assert kept == [batches[0], batches[2]]


def test_a_cold_replay_writes_the_flush_before_each_call() -> None:
    calls: list[float] = []
    flush = torch.zeros(16)
    mean = replay(lambda batch: calls.append(float(flush[0])), [batch_of(1)] * 3, flush)
    assert calls == [1.0, 2.0, 3.0] and mean >= 0.0
    assert replay(lambda batch: None, [batch_of(1)], None) >= 0.0
