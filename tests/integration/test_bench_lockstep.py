"""The benchmarks' lockstep driver: engines served the same traffic in turn, each timed by its own steps."""

from __future__ import annotations

import time

from bench.common import run_engine, run_engines_lockstep, set_policy
from bench.prompts import PROSE
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.models.loader import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.types import SamplingParams


def small_engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), draft_model=str(DEFAULT_DRAFT), dtype="float32",
                                  device="cpu", max_seq_len=256, max_running=8))


def test_lockstep_engines_serve_the_same_traffic_each_timed_by_its_own_steps() -> None:
    plain, drafting = small_engine(), small_engine()
    set_policy(plain, mode="off")
    set_policy(drafting, mode="draft", k=3)
    prompts = [plain.tokenizer.encode(text) for text in PROSE[:6]]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (4, 9, 6, 12, 5, 8)]
    alone = run_engine(plain, prompts, params, max_in_flight=2)

    start = time.perf_counter()
    results = run_engines_lockstep({"off": plain, "draft": drafting}, prompts, params, max_in_flight=2)
    wall = time.perf_counter() - start

    assert sorted(results["off"].texts) == sorted(results["draft"].texts) == sorted(alone.texts)  # greedy: exact
    for result in results.values():
        assert result.num_tokens == sum(p.max_tokens for p in params)
        assert 0.0 < result.tpot < result.seconds
    assert results["off"].seconds + results["draft"].seconds <= wall  # each clock ran only on its engine's turns
    assert results["draft"].drafted > 0 and results["off"].drafted == 0
    assert not plain.has_work() and not drafting.has_work()
