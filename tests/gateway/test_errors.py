"""The one error mapping: validation, context length, engine errors, errors mid-stream, loading."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from fastapi import FastAPI

import gateway.app as gateway_app
from engine.errors import EngineNotReadyError, QueueFullError
from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.testing import FakeEngine
from tests.gateway.helpers import MODEL, chat_body, completion_body, open_client, sse_payloads

ERROR_KEYS = {"message", "type", "param", "code"}


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == ERROR_KEYS
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}, "max_tokens",
         "expected an integer, but got a string"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature",
         "expected a number"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream",
         "expected a boolean"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": 5}, "stop", "expected one of"),
        ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "Invalid type"),
        ({"model": MODEL}, "messages", "Missing required parameter: 'messages'"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}, "n", "Invalid value"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature",
         "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "speculation": {"mode": "fast"}},
         "speculation.mode", "Invalid value"),
        ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "robot"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs",
         "logprobs"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}},
         "stream_options", "only allowed when 'stream' is enabled"),
    ],
)
async def test_bad_requests_are_400_in_openai_shape(
    client: httpx.AsyncClient, body: dict, param: str, fragment: str
) -> None:
    error = assert_openai_error(await client.post("/v1/chat/completions", json=body), 400, param=param)
    assert error["type"] == "invalid_request_error"
    assert fragment in error["message"]


async def test_unparseable_and_non_object_bodies(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert "could not parse the JSON body" in assert_openai_error(r, 400)["message"]
    r = await client.post("/v1/chat/completions", json=[1, 2])
    assert_openai_error(r, 400)


async def test_unknown_fields_are_ignored(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat_body("a </s>", tools=[], response_format={"x": 1}))
    assert r.status_code == 200


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json={**chat_body(), "model": "gpt-4o"})
    assert_openai_error(r, 404, param="model", code="model_not_found")


async def test_context_length_uses_openai_wording(client: httpx.AsyncClient) -> None:
    prompt = " ".join(["w"] * 250)  # 251 tokens with <s>; the fake model's context is 256
    r = await client.post("/v1/completions", json=completion_body(prompt, max_tokens=10))
    error = assert_openai_error(r, 400, code="context_length_exceeded")
    assert error["message"] == (
        "This model's maximum context length is 256 tokens. However, you requested 261 tokens "
        "(251 in the messages, 10 in the completion). Please reduce the length of the messages or completion."
    )
    r = await client.post("/v1/chat/completions", json=chat_body(" ".join(["w"] * 300)))
    assert_openai_error(r, 400, param="messages", code="context_length_exceeded")


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    assert_openai_error(await client.get("/v1/nothing"), 404)
    assert_openai_error(await client.get("/v1/chat/completions"), 405)


async def test_queue_full_is_429_with_retry_after(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.fail_on_start = QueueFullError("waiting queue is full")
    r = await client.post("/v1/chat/completions", json=chat_body())
    assert_openai_error(r, 429, code="queue_full")
    assert int(r.headers["retry-after"]) >= 1
    r = await client.post("/v1/chat/completions", json=chat_body(stream=True))  # before the first chunk: HTTP status
    assert_openai_error(r, 429, code="queue_full")


async def test_real_queue_bound_rejects_overflow() -> None:
    engine = FakeEngine(max_running=1, max_waiting=0, token_delay_s=0.01)
    async with open_client(create_app(GatewaySettings(), engine)) as client:
        slow = asyncio.create_task(client.post("/v1/completions", json=completion_body("a b", max_tokens=30)))
        for _ in range(400):
            if engine.num_running:
                break
            await asyncio.sleep(0.005)
        r = await client.post("/v1/completions", json=completion_body("c"))
        assert_openai_error(r, 429)
        assert (await slow).status_code == 200
    assert engine.kv_used_slots == 0


async def test_engine_not_ready_is_503(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.fail_on_start = EngineNotReadyError("warming up")
    r = await client.post("/v1/completions", json=completion_body())
    assert_openai_error(r, 503)
    assert "retry-after" in r.headers


async def test_engine_death_mid_stream_is_an_sse_error_event(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.fail_after_outputs = 1
    r = await client.post("/v1/completions", json=completion_body("a b c d e f g h i j k", stream=True, max_tokens=40))
    assert r.status_code == 200
    events = sse_payloads(r.text)
    assert "choices" in events[0]
    assert events[-1]["error"]["code"] == "engine_dead"
    assert set(events[-1]["error"]) == ERROR_KEYS
    assert "[DONE]" not in events
    r = await client.post("/v1/completions", json=completion_body("a b c d e f g h i j k", max_tokens=40))
    assert_openai_error(r, 500, code="engine_dead")


async def test_loading_engine_answers_503_until_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    def slow_build(settings: GatewaySettings, progress=None) -> FakeEngine:  # noqa: ANN001
        time.sleep(0.3)
        return FakeEngine()

    monkeypatch.setattr(gateway_app, "build_engine", slow_build)
    app: FastAPI = create_app(GatewaySettings())
    async with open_client(app) as client:
        assert (await client.get("/health")).status_code == 200
        ready = await client.get("/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "loading"
        r = await client.post("/v1/completions", json=completion_body())
        assert_openai_error(r, 503, code="model_loading")
        for _ in range(100):
            if (await client.get("/ready")).status_code == 200:
                break
            await asyncio.sleep(0.02)
        assert (await client.post("/v1/completions", json=completion_body())).status_code == 200


async def test_failed_load_fails_liveness(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_build(settings: GatewaySettings, progress=None) -> FakeEngine:  # noqa: ANN001
        raise FileNotFoundError("no config.json in /nowhere")

    monkeypatch.setattr(gateway_app, "build_engine", broken_build)
    async with open_client(create_app(GatewaySettings())) as client:
        for _ in range(100):
            if (await client.get("/health")).status_code == 503:
                break
            await asyncio.sleep(0.01)
        health = await client.get("/health")
        assert health.status_code == 503 and "config.json" in health.json()["error"]
        assert (await client.get("/ready")).json()["status"] == "load_failed"


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_body_over_the_limit_is_413_before_parsing(engine, chunked):
    app = create_app(GatewaySettings(max_body_bytes=2048), engine=engine)
    body = json.dumps({"model": MODEL, "prompt": "x" * 4096}).encode()

    async def chunks():
        for i in range(0, len(body), 1024):
            yield body[i:i + 1024]

    async with open_client(app) as client:
        r = await client.post("/v1/completions", content=chunks() if chunked else body,
                              headers={"Content-Type": "application/json"})
    error = assert_openai_error(r, 413, code="request_too_large")
    assert "2048 bytes" in error["message"]
