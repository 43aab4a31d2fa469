"""The official openai SDK against a real `specserve serve` on the bundled pair (not the fake engine):
chat streaming with the speculation usage block, seed reproducibility, greedy equal across speculation
modes, and a disconnect mid-stream freeing the KV cache."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.reliability.harness import Target, wait_engine_idle

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]
MODEL = "specserve-tiny"


def client(target: Target) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{target.url}/v1", api_key=target.api_key, max_retries=0)


async def test_chat_stream_reports_speculation_usage(target: Target) -> None:
    stream = await client(target).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Return the larger of two numbers."}],
        max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"speculation": {"mode": "draft", "max_k": 4}})
    text, usage, finish = "", None, None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text and finish in ("stop", "length")
    assert usage.completion_tokens > 0 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    speculation = usage.model_extra["speculation"]
    assert speculation["drafted_tokens"] > 0 and 0 <= speculation["accepted_tokens"] <= speculation["drafted_tokens"]


async def test_greedy_text_is_the_same_in_every_speculation_mode(target: Target) -> None:
    texts = set()
    for mode in ("off", "draft", "ngram", "auto"):
        done = await client(target).completions.create(model=MODEL, prompt="def parse_args(argv):", max_tokens=32,
                                                       temperature=0, extra_body={"speculation": {"mode": mode}})
        texts.add(done.choices[0].text)
    assert len(texts) == 1


async def test_same_seed_same_text(target: Target) -> None:
    async def sample() -> str:
        done = await client(target).completions.create(model=MODEL, prompt="import os\n", max_tokens=24,
                                                       temperature=0.9, seed=1234)
        return done.choices[0].text

    assert await sample() == await sample()


async def test_disconnect_mid_stream_frees_the_kv_cache(target: Target) -> None:
    stream = await client(target).completions.create(model=MODEL, prompt="class Parser:", max_tokens=400,
                                                     stream=True, extra_body={"ignore_eos": True})
    received = 0
    async for _ in stream:
        received += 1
        if received == 3:
            break
    await stream.close()
    stats = await asyncio.wait_for(wait_engine_idle(target), 30)
    assert stats["kv_used_blocks"] == 0
