"""FakeEngine honours the EngineClient contract the gateway is built against."""

from __future__ import annotations

import asyncio

import pytest

from engine.errors import ContextLengthExceededError, InvalidRequestError, QueueFullError
from engine.types import SamplingParams
from gateway.engine_client import EngineClient
from gateway.testing import FakeEngine


async def collect(engine: FakeEngine, request_id: str, prompt: str, **params) -> list:
    return [out async for out in engine.generate(request_id, engine.encode(prompt), SamplingParams(**params))]


def test_satisfies_the_protocol() -> None:
    assert isinstance(FakeEngine(), EngineClient)


async def test_greedy_echo_stop_and_final_output() -> None:
    outputs = await collect(FakeEngine(), "r1", "a b c </s>", temperature=0, max_tokens=50)
    final = outputs[-1]
    assert "".join(o.new_text for o in outputs) == "a b c"
    assert final.finished and final.finish_reason == "stop" and final.spec is not None
    assert all(not o.finished and o.spec is None for o in outputs[:-1])
    assert final.num_output_tokens == 3 and final.num_prompt_tokens == 5


async def test_seeded_sampling_reproduces() -> None:
    engine = FakeEngine()
    first = await collect(engine, "r1", "x", temperature=1.0, seed=3, max_tokens=10)
    second = await collect(engine, "r2", "x", temperature=1.0, seed=3, max_tokens=10)
    assert [o.new_text for o in first] == [o.new_text for o in second]


async def test_abort_frees_the_slot_at_once_and_ends_the_stream() -> None:
    engine = FakeEngine(token_delay_s=0.01)
    stream = engine.generate("r1", engine.encode("a b"), SamplingParams(max_tokens=200, temperature=0))
    await stream.__anext__()
    assert engine.kv_used_slots == 1 and engine.num_running == 1
    await engine.abort("r1")
    assert engine.kv_used_slots == 0 and engine.num_running == 0 and engine.aborted == ["r1"]
    rest = [out async for out in stream]
    assert rest[-1].finish_reason == "abort"


async def test_dropping_a_stream_without_abort_leaks_its_slot() -> None:
    """Strict on purpose: the gateway must call abort(), as a real engine would keep decoding."""
    engine = FakeEngine(token_delay_s=0.01)
    stream = engine.generate("r1", engine.encode("a b"), SamplingParams(max_tokens=200, temperature=0))
    await stream.__anext__()
    await stream.aclose()
    assert engine.kv_used_slots == 1


async def test_queue_bound_and_admission_order() -> None:
    engine = FakeEngine(max_running=1, max_waiting=1, token_delay_s=0.005)
    first = asyncio.create_task(collect(engine, "r1", "a", max_tokens=10, temperature=0))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(collect(engine, "r2", "b", max_tokens=3, temperature=0))
    await asyncio.sleep(0.01)
    assert engine.num_waiting == 1
    with pytest.raises(QueueFullError):
        await collect(engine, "r3", "c")
    await asyncio.gather(first, second)
    assert engine.num_running == engine.num_waiting == engine.kv_used_slots == 0


async def test_request_validation() -> None:
    engine = FakeEngine(max_model_len=8)
    with pytest.raises(ContextLengthExceededError):
        await collect(engine, "r1", "a b c d", max_tokens=5)
    with pytest.raises(InvalidRequestError):
        engine.apply_chat_template([{"role": "wizard", "content": "x"}])
    with pytest.raises(ValueError, match="^k_max"):
        engine.update_policy({"k_max": 0})
