"""bench/row_padding.py's exact-rows twin: its steps run the shared linears unpadded, then restore their padding."""

from __future__ import annotations

import pytest
import torch

from bench.row_padding import run_exactly
from engine.models import llama
from engine.models.llama import packed_linears


class _Engine:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.seen = model, []

    def step(self):
        self.seen.append([linear.row_padding for linear in packed_linears(self.model)])
        raise RuntimeError("a step that fails still leaves the padding as it was")


def test_an_exact_twins_steps_run_unpadded_and_restore_the_shared_padding() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    assert llama.pack_linears_for_cpu(model)
    table = (0, 4, 4, 3, 4)
    for linear in packed_linears(model):
        linear.row_padding = table
    engine = _Engine(model)
    run_exactly(engine, packed_linears(model))
    with pytest.raises(RuntimeError):
        engine.step()
    assert engine.seen == [[None, None]]
    assert all(linear.row_padding is table for linear in packed_linears(model))
    engine.exact_rows = False  # its policy moved on to another engine
    with pytest.raises(RuntimeError):
        engine.step()
    assert engine.seen[-1] == [table, table]
