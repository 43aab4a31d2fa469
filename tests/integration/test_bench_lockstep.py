"""The benchmarks' lockstep driver: engines served the same traffic in turn, each timed by its own steps."""

from __future__ import annotations

import time

import pytest

from bench.common import run_engine, run_engines_lockstep, set_policy
from bench.prompts import PROSE
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.models.loader import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.types import SamplingParams


def small_engine(weights_from: LLMEngine | None = None, **overrides) -> LLMEngine:
    config = {"model": str(DEFAULT_TARGET), "draft_model": str(DEFAULT_DRAFT), "dtype": "float32", "device": "cpu",
              "max_seq_len": 256, "max_running": 8, **overrides}
    return LLMEngine(EngineConfig(**config), weights_from=weights_from)


def test_lockstep_engines_serve_the_same_traffic_each_timed_by_its_own_steps() -> None:
    plain = small_engine()
    drafting = small_engine(weights_from=plain)  # as bench/policy_sweep.py makes its engines
    assert drafting.model is plain.model and drafting.runner.cache is not plain.runner.cache
    assert drafting.draft_model is plain.draft_model is not None
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


def test_an_engine_reads_another_engines_weights_only_where_it_would_load_the_same_ones() -> None:
    source = small_engine()
    with pytest.raises(ValueError, match="weights_from: its draft_model is"):
        small_engine(weights_from=source, draft_model=None)
    with pytest.raises(ValueError, match="weights_from: its torch_dtype is"):
        small_engine(weights_from=source, dtype="bfloat16")


def test_the_virtual_clock_charges_each_step_its_modelled_seconds() -> None:
    from bench.virtual_clock import H200, VirtualClients, VirtualClock

    engine = small_engine()
    set_policy(engine, mode="off")
    engine.virtual_clock = VirtualClock(engine, H200, host=0.0, policy_time=0.0)
    prompt = engine.tokenizer.encode(PROSE[0])
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    result = run_engines_lockstep({"off": engine}, [prompt], params, clients_type=VirtualClients)["off"]
    # the prompt's chunk (its first token sampled with it), then five plain steps of one request
    prefill = H200["a"] + H200["p"] * len(prompt)
    assert result.seconds == pytest.approx(prefill + 5 * (H200["a"] + H200["b"] + H200["c"]))
    assert engine.policy.stats()["cost_model"]["num_observations"] == 5  # its policy learned the virtual times
