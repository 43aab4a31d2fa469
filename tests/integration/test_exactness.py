"""Greedy exactness: every speculation mode emits exactly plain greedy's tokens, which equal
transformers' greedy generate on the same checkpoint (float32, bundled pair; on the CPU, and on CUDA
where a GPU is present)."""

from __future__ import annotations

import pytest
import torch

from bench.prompts import PROSE, code_prompts
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.types import SamplingParams, SpeculationOverride
from tests.conftest import DEVICES, DRAFT, TARGET

MAX_TOKENS = 24
MODES = [("off", 1)] + [("draft", k) for k in range(1, 9)] + [("ngram", 4)]


@pytest.fixture(scope="module", params=DEVICES)
def engine(request) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(TARGET), draft_model=str(DRAFT), dtype="float32", device=request.param,
                                  max_seq_len=512, max_running=32, speculation="off"))


@pytest.fixture(scope="module")
def prompts(engine) -> list[list[int]]:
    texts = code_prompts(14, max_chars=240) + PROSE[:6]
    assert len(texts) == 20
    return [engine.tokenizer.encode(t) for t in texts]


def run(engine: LLMEngine, prompts: list[list[int]], overrides: list[SpeculationOverride | None]) -> list[list[int]]:
    for i, (ids, override) in enumerate(zip(prompts, overrides)):
        engine.add_request(f"r{i}", ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, speculation=override))
    outputs: dict[str, list[int]] = {}
    while engine.has_work():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert engine.runner.cache.num_used_blocks == 0
    return [outputs[f"r{i}"] for i in range(len(prompts))]


def set_mode(engine: LLMEngine, mode: str, k: int, stop_confidence: float = 0.0) -> None:
    engine.policy.update({"mode": mode, "k": k, "draft_stop_confidence": stop_confidence})
    engine.policy.apply_pending()


@pytest.fixture(scope="module")
def plain(engine, prompts) -> list[list[int]]:
    set_mode(engine, "off", 1)
    return run(engine, prompts, [None] * len(prompts))


def test_plain_greedy_equals_transformers(engine, prompts, plain):
    from transformers import LlamaForCausalLM

    device = engine.config.torch_device
    hf = LlamaForCausalLM.from_pretrained(TARGET, dtype=torch.float32).to(device).eval()
    for ids, ours in zip(prompts, plain):
        out = hf.generate(torch.tensor([ids], device=device), max_new_tokens=MAX_TOKENS, do_sample=False,
                          pad_token_id=engine.tokenizer.pad_token_id)
        assert out[0, len(ids):].tolist() == ours


@pytest.mark.parametrize("mode,k", MODES[1:], ids=[f"{m}-k{k}" for m, k in MODES[1:]])
def test_speculative_greedy_equals_plain(engine, prompts, plain, mode, k):
    set_mode(engine, mode, k)
    assert run(engine, prompts, [None] * len(prompts)) == plain
    assert engine.stats.num_draft_tokens > 0


def test_mixed_batch_of_modes_and_k_equals_plain(engine, prompts, plain):
    """Every request in one batch with its own proposer and k, under the adaptive policy."""
    set_mode(engine, "auto", 4)
    overrides = [SpeculationOverride(mode=("off", "draft", "ngram", "auto")[i % 4], max_k=1 + i % 8)
                 for i in range(len(prompts))]
    assert run(engine, prompts, overrides) == plain


def test_prompts_alone_equal_batched(engine, prompts, plain):
    set_mode(engine, "draft", 5)
    for i in (0, 7, 15):
        assert run(engine, [prompts[i]], [None]) == [plain[i]]


def test_draft_rounds_stopped_by_confidence_equal_plain(engine, prompts, plain):
    """Rounds the draft ends early (after a token it gave < 0.2) still verify to plain greedy's tokens."""
    set_mode(engine, "draft", 8, stop_confidence=0.2)
    drafts_before, tokens_before = engine.stats.total.rounds, engine.stats.num_draft_tokens
    assert run(engine, prompts, [None] * len(prompts)) == plain
    rounds, drafted = engine.stats.total.rounds - drafts_before, engine.stats.num_draft_tokens - tokens_before
    assert drafted < 0.75 * 8 * rounds, "the confidence stop never shortened a round"


def test_the_policy_sees_the_draft_models_lag_and_what_catching_up_cost(engine, prompts):
    """Views carry each request's draft lag (its whole context before its first draft, then at most the one
    token a fully accepted round leaves), and step timings the tokens the draft model caught up on."""
    seen: list[int] = []
    decide, observe_step = engine.policy.decide, engine.policy.observe_step
    lags: list[tuple[int, ...]] = []
    engine.policy.decide = lambda batch: lags.append(tuple(v.draft_lag for v in batch.requests)) or decide(batch)
    engine.policy.observe_step = lambda timing: seen.append(timing.num_draft_catch_up_tokens) or observe_step(timing)
    try:
        set_mode(engine, "off", 1)
        engine.add_request("lag", prompts[0], SamplingParams(max_tokens=8, temperature=0.0))
        for _ in range(3):  # prefill, then plain steps: the draft model sees nothing
            engine.step()
        set_mode(engine, "draft", 2)
        while engine.has_work():
            engine.step()
    finally:
        engine.policy.decide, engine.policy.observe_step = decide, observe_step
    n = len(prompts[0])
    assert lags[:3] == [(n,), (n + 1,), (n + 2,)]  # the prompt and each plain step's token, less the one fed per round
    assert seen[2] == n + 2  # the first draft round prefilled it all
    assert all(lag[0] <= 1 for lag in lags[3:]) and all(tokens <= 1 for tokens in seen[3:])
