"""bench/attention_fold.py's per-head twin: its steps attend per head, then fold again whatever happens."""

from __future__ import annotations

import pytest

from bench.attention_fold import attend_per_head
from engine.models import llama


class _Engine:
    def __init__(self) -> None:
        self.seen: list[bool] = []

    def step(self):
        self.seen.append(llama.FOLD_SHORT_RUNS)
        raise RuntimeError("a step that fails still leaves attention folded")


def test_a_per_head_twins_steps_attend_per_head_and_leave_the_fold_on() -> None:
    engine = _Engine()
    attend_per_head(engine)
    with pytest.raises(RuntimeError):
        engine.step()
    assert engine.seen == [False] and llama.FOLD_SHORT_RUNS
    engine.per_head = False  # its policy moved on to another engine
    with pytest.raises(RuntimeError):
        engine.step()
    assert engine.seen[-1] is True
