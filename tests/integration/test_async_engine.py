"""AsyncEngine on the bundled pair: streaming, concurrency, cancellation, seeds, runtime policy changes, failures.

Nothing here depends on what the (possibly placeholder) models say; expectations come from reference runs.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import time

import pytest

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.errors import EngineDeadError, InvalidRequestError
from engine.types import RequestOutput, SamplingParams, SpeculationOverride
from policies import PolicySettingsError
from tests.conftest import DRAFT, TARGET

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"
TIMEOUT = 120
_ids = itertools.count()


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(TARGET), draft_model=str(DRAFT), device="cpu", dtype="float32",
                                  max_seq_len=256, max_running=8, speculation="draft", k=4, k_max=8))


@pytest.fixture(scope="module")
def aengine(engine):
    ae = AsyncEngine(engine)
    yield ae
    ae.shutdown()


@pytest.fixture(autouse=True)
def idle_afterwards(request):
    """Each test leaves the engine idle, with both KV caches empty."""
    yield
    if "aengine" not in request.fixturenames:
        return
    eng: LLMEngine = request.getfixturevalue("engine")
    wait_until(lambda: not eng.requests and not eng.has_work(), what="the engine to go idle")
    assert_caches_empty(eng)


def wait_until(condition, *, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


async def async_wait_until(condition, *, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def assert_caches_empty(eng: LLMEngine) -> None:
    assert eng.runner.cache.num_used_blocks == 0
    assert eng.proposers["draft"].cache.num_used_blocks == 0


def new_id() -> str:
    return f"async-{next(_ids)}"


async def collect(ae: AsyncEngine, params: SamplingParams, prompt: str = PROMPT,
                  rid: str | None = None) -> list[RequestOutput]:
    async def go() -> list[RequestOutput]:
        return [out async for out in ae.generate(rid or new_id(), ae.encode(prompt), params)]

    return await asyncio.wait_for(go(), TIMEOUT)


def text_of(outs: list[RequestOutput]) -> str:
    return "".join(o.new_text for o in outs)


def tokens_of(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


class AbortSpy:
    """Records what LLMEngine.abort returned, to tell an abort from a natural finish."""

    def __init__(self, eng: LLMEngine, monkeypatch) -> None:
        self.results: dict[str, RequestOutput | None] = {}
        original = eng.abort

        def abort(request_id: str):
            out = original(request_id)
            self.results[request_id] = out
            return out

        monkeypatch.setattr(eng, "abort", abort)


# ---------------------------------------------------------------- streaming


async def test_deltas_concatenate_to_the_final_text(aengine):
    outs = await collect(aengine, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert not any(o.finished for o in outs[:-1])
    assert len(outs) > 1, "the output should be streamed in several increments"
    tokens, text = tokens_of(outs), text_of(outs)
    assert len(tokens) == 12 == outs[-1].num_output_tokens
    assert [o.num_output_tokens for o in outs] == list(itertools.accumulate(len(o.new_token_ids) for o in outs))
    full = aengine.decode(tokens)
    if full.endswith("\ufffd"):  # untrained weights may end on an incomplete UTF-8 character: it is held back
        assert full.startswith(text)
    else:
        assert text == full
    assert outs[-1].spec is not None and outs[-1].num_prompt_tokens == len(aengine.encode(PROMPT))


async def test_concurrent_generates_all_finish(aengine, engine):
    params = [
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=1, max_tokens=10),
        SamplingParams(temperature=0.0, max_tokens=6, speculation=SpeculationOverride(mode="ngram")),
        SamplingParams(temperature=1.0, top_p=0.9, seed=2, max_tokens=8, speculation=SpeculationOverride(mode="off")),
        SamplingParams(temperature=0.0, max_tokens=1),
        SamplingParams(temperature=0.5, seed=3, max_tokens=10, presence_penalty=1.0, logprobs=1),
    ]
    prompts = [PROMPT, "import os\n", PROMPT * 2, "hello", "x", "class A:\n"]
    results = await asyncio.gather(*(collect(aengine, p, prompt) for p, prompt in zip(params, prompts)))
    for outs, p in zip(results, params):
        assert outs[-1].finished and outs[-1].finish_reason in ("stop", "length")
        assert 1 <= len(tokens_of(outs)) == outs[-1].num_output_tokens <= p.max_tokens
    health = aengine.health()
    assert health.ready and health.loop_alive and health.num_running == 0 and health.num_waiting == 0
    assert health.kv_used_blocks == 0 and health.kv_total_blocks > 0
    stats = aengine.stats()
    assert stats["num_running"] == 0 and "policy" in stats


async def test_invalid_request_raises_from_generate(aengine):
    with pytest.raises(InvalidRequestError):
        async for _ in aengine.generate(new_id(), [10**6], SamplingParams()):
            pass


async def test_unexpected_error_while_adding_reaches_the_caller(aengine, engine, monkeypatch):
    def add_request(*args, **kwargs):
        raise RuntimeError("unexpected")

    monkeypatch.setattr(engine, "add_request", add_request)
    with pytest.raises(RuntimeError, match="unexpected"):  # raised, not left waiting forever
        await asyncio.wait_for(collect(aengine, SamplingParams(max_tokens=2)), 10)


# ---------------------------------------------------------------- cancellation


async def test_breaking_out_of_the_stream_aborts_the_request(aengine, engine, monkeypatch):
    spy = AbortSpy(engine, monkeypatch)
    rid = new_id()
    stream = aengine.generate(rid, aengine.encode(PROMPT), SamplingParams(temperature=0.0, max_tokens=200,
                                                                          ignore_eos=True))
    async for out in stream:
        assert not out.finished
        break
    await stream.aclose()  # what `async with contextlib.aclosing(...)` or the garbage collector does
    assert rid not in engine.requests
    assert spy.results[rid] is not None and spy.results[rid].finish_reason == "abort"
    assert spy.results[rid].num_output_tokens < 200
    assert_caches_empty(engine)


async def test_dropping_the_stream_aborts_the_request(aengine, engine, monkeypatch):
    spy = AbortSpy(engine, monkeypatch)
    rid = new_id()
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    async for _ in aengine.generate(rid, aengine.encode(PROMPT), params):
        break  # the generator is finalised by the event loop's async-generator hooks
    await async_wait_until(lambda: rid in spy.results, what="the abort", timeout=10)
    assert spy.results[rid] is not None and spy.results[rid].finish_reason == "abort"
    await async_wait_until(lambda: engine.runner.cache.num_used_blocks == 0, what="the KV cache to be freed")


async def test_cancelling_the_consumer_task_aborts_the_request(aengine, engine, monkeypatch):
    spy = AbortSpy(engine, monkeypatch)
    rid = new_id()
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in aengine.generate(rid, aengine.encode(PROMPT), SamplingParams(temperature=0.8, seed=0,
                                                                                     max_tokens=200, ignore_eos=True)):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), TIMEOUT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert spy.results[rid] is not None and spy.results[rid].finish_reason == "abort"
    assert rid not in engine.requests
    assert_caches_empty(engine)


async def test_cancelling_before_the_request_is_admitted_does_not_leak_it(aengine, engine, monkeypatch):
    spy = AbortSpy(engine, monkeypatch)
    rid = new_id()

    async def consume() -> None:
        params = SamplingParams(temperature=0.8, seed=0, max_tokens=240, ignore_eos=True)
        async for _ in aengine.generate(rid, aengine.encode("x"), params):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)  # the task submits the request and waits for the loop thread to accept it
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # the request must be aborted, not left running for its 240 tokens with nobody listening
    await async_wait_until(lambda: rid in spy.results, what="the orphaned request to be aborted", timeout=10)
    assert spy.results[rid] is not None and spy.results[rid].finish_reason == "abort"
    assert spy.results[rid].num_output_tokens < 240


# ---------------------------------------------------------------- seeds


async def test_same_seed_gives_the_same_text(aengine):
    params = SamplingParams(temperature=0.8, seed=1234, max_tokens=16, ignore_eos=True)
    a = await collect(aengine, params)
    b = await collect(aengine, params)
    assert tokens_of(a) == tokens_of(b) and text_of(a) == text_of(b)


async def test_seed_is_independent_of_the_other_requests_in_the_batch(aengine):
    params = SamplingParams(temperature=0.8, seed=99, max_tokens=16, ignore_eos=True,
                            speculation=SpeculationOverride(mode="off"))
    alone = await collect(aengine, params)
    neighbours = [
        SamplingParams(temperature=0.8, seed=s, max_tokens=16, ignore_eos=True,
                       speculation=SpeculationOverride(mode="draft"))
        for s in (1, 2)
    ] + [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, speculation=SpeculationOverride(mode="draft"))]
    batched, *others = await asyncio.gather(collect(aengine, params),
                                            *(collect(aengine, p, "import sys\n") for p in neighbours))
    assert any(o[-1].spec.rounds > 0 for o in others), "the neighbours should have speculated"
    assert tokens_of(batched) == tokens_of(alone) and text_of(batched) == text_of(alone)


# ---------------------------------------------------------------- policy


async def test_update_policy_validates(aengine, engine):
    before = engine.policy.settings
    with pytest.raises(PolicySettingsError, match="bogus"):
        aengine.update_policy({"bogus": 1})
    with pytest.raises(PolicySettingsError, match="k_max"):
        aengine.update_policy({"k_max": 100})
    with pytest.raises(PolicySettingsError, match="mode"):
        aengine.update_policy({"mode": "fast"})
    assert engine.policy.settings is before and engine.policy.pending_settings is None
    assert aengine.policy_settings() == before.to_dict()


async def test_update_policy_is_applied_between_steps(aengine, engine):
    assert engine.policy.settings.mode == "draft"
    try:
        staged = aengine.update_policy({"mode": "off"})
        assert staged["mode"] == "off"
        outs = await collect(aengine, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
        assert engine.policy.settings.mode == "off"
        assert outs[-1].spec.rounds == 0 and outs[-1].spec.num_plain_steps > 0  # applied before its first step
    finally:
        aengine.update_policy({"mode": "draft"})
        engine.policy.apply_pending()
    outs = await collect(aengine, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    assert outs[-1].spec.rounds > 0


# ---------------------------------------------------------------- failures


async def test_a_failing_step_fails_its_requests_but_not_the_engine(aengine, engine, monkeypatch):
    original = engine.step
    calls = {"n": 0}

    def step():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return original()

    monkeypatch.setattr(engine, "step", step)
    with pytest.raises(EngineDeadError, match="boom"):
        await collect(aengine, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert aengine.health().loop_alive and not engine.requests
    assert_caches_empty(engine)
    outs = await collect(aengine, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    assert outs[-1].finished and outs[-1].finish_reason == "length"


def test_warm_up_takes_each_kind_of_step_then_the_policy_forgets_them() -> None:
    """First-touch step times must not train the cost model: the warm-up's steps are all forgotten."""
    eng = LLMEngine(EngineConfig(model=str(TARGET), draft_model=str(DRAFT), device="cpu", dtype="float32",
                                 max_seq_len=256, max_running=8, speculation="auto", k_max=6))
    rounds: set[tuple[str, float]] = set()
    observe = eng.policy.observe
    eng.policy.observe = lambda outcome: (rounds.add((outcome.proposer, outcome.temperature)), observe(outcome))
    eng.warm_up()
    assert {("draft", 0.0), ("draft", 1.0)} <= rounds and any(proposer == "ngram" for proposer, _ in rounds)
    stats = eng.policy.stats()
    assert stats["num_steps"] == 0 and stats["cost_model"]["num_observations"] == 0
    assert stats["acceptance"]["draft"]["num_rounds"] == 0
    assert eng.policy.settings.mode == "auto" and eng.policy.settings.k_max == 6
    assert eng.stats.num_steps == 0 and eng.stats.num_draft_tokens == 0
    assert not eng.requests and not eng.has_work()
    assert_caches_empty(eng)
    assert gc.get_freeze_count() > 0  # what the warm-up left is the process's own: full collections skip it
    eng.add_request("busy", eng.tokenizer.encode(PROMPT), SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="idle"):
        eng.warm_up()
