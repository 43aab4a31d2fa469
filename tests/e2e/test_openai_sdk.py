"""The gateway behind a real uvicorn server, driven by the official openai SDK (sync and async)."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.e2e.conftest import API_KEY, LiveServer

MODEL = "specserve-tiny"


@pytest.fixture
def client(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=20)


@pytest.fixture
def async_client(live_server: LiveServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{live_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=20)


def user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def wait_until(condition, timeout_s: float = 2.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=user("hello there world </s>"), temperature=0)
    assert resp.id.startswith("chatcmpl-")
    assert resp.choices[0].message.content == "hello there world"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens == 3
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 3
    assert resp.usage.model_dump()["speculation"]["rounds"] >= 1


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=user("a b c d e f g h i j </s>"), temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "a b c d e f g h i j"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.model_dump()["speculation"]["drafted_tokens"] > 0


def test_n_2_streams_interleaved_with_index(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=user("x"), n=2, max_tokens=20, seed=5,
                                            temperature=1.0, stream=True)
    texts = {0: "", 1: ""}
    order = []
    for chunk in stream:
        choice = chunk.choices[0]
        texts[choice.index] += choice.delta.content or ""
        order.append(choice.index)
    assert texts[0] and texts[1] and texts[0] != texts[1]
    assert order.count(0) > 1 and order.count(1) > 1


def test_stop_and_extras(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=user("one two three four"), temperature=0,
                                          stop=["three"], max_tokens=30)
    assert resp.choices[0].message.content == "one two "
    resp = client.completions.create(model=MODEL, prompt="a b </s>", temperature=0, max_tokens=7,
                                     extra_body={"ignore_eos": True, "top_k": 5, "speculation": {"mode": "off"}})
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 7
    assert resp.usage.model_dump()["speculation"]["plain_decode_steps"] == 7


def test_seed_reproducibility(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        resp = client.completions.create(model=MODEL, prompt="x", temperature=0.8, seed=seed, max_tokens=15)
        return resp.choices[0].text

    assert sample(42) == sample(42)
    assert sample(42) != sample(43)


def test_bad_request_has_openai_error_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=user("x"), extra_body={"max_tokens": "many"})
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == "max_tokens"
    assert caught.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=user("x"))


def test_prompt_over_context_length(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=user("w " * 300), max_tokens=10)
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length is 256 tokens" in caught.value.message


def test_wrong_key_is_401(live_server: LiveServer) -> None:
    bad = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


async def test_async_client_streaming_completion(async_client: openai.AsyncOpenAI) -> None:
    stream = await async_client.completions.create(model=MODEL, prompt="p q r s </s>", temperature=0, stream=True,
                                                   stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "p q r s"
    assert chunks[-1].usage.completion_tokens == 4
    resp = await async_client.chat.completions.create(model=MODEL, messages=user("k </s>"), temperature=0)
    assert resp.choices[0].message.content == "k"


def test_disconnect_mid_stream_aborts_in_the_engine(client: openai.OpenAI, live_server: LiveServer) -> None:
    engine = live_server.engine
    assert wait_until(lambda: engine.kv_used_slots == 0)
    stream = client.chat.completions.create(model=MODEL, messages=user("a b c"), temperature=0, max_tokens=240,
                                            stream=True)
    first = [next(stream) for _ in range(3)]
    request_id = first[0].id
    assert engine.kv_used_slots == 1
    stream.close()
    assert wait_until(lambda: engine.kv_used_slots == 0, timeout_s=1.0), "the KV slot was not freed"
    assert f"{request_id}-0" in engine.aborted

    def status() -> str:
        url, headers = f"{live_server.url}/v1/requests/{request_id}", {"Authorization": f"Bearer {API_KEY}"}
        return httpx.get(url, headers=headers).json()["status"]

    assert wait_until(lambda: status() == "aborted")


def test_disconnect_during_non_streaming_request_aborts(live_server: LiveServer) -> None:
    engine = live_server.engine
    assert wait_until(lambda: engine.kv_used_slots == 0)
    body = {"model": MODEL, "prompt": "a b c", "temperature": 0, "max_tokens": 240}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{live_server.url}/v1/completions", json=body, timeout=0.2,
                   headers={"Authorization": f"Bearer {API_KEY}"})
    assert wait_until(lambda: engine.kv_used_slots == 0, timeout_s=1.0), "the KV slot was not freed"
    assert engine.aborted and engine.aborted[-1].startswith("cmpl-")
