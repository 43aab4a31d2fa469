"""Per-key rate limits (in-process counters) and the drain state."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.testing import FakeEngine
from tests.gateway.helpers import auth, chat_body, completion_body, open_client, sse_payloads


async def test_requests_per_minute_limit_is_per_key(engine: FakeEngine) -> None:
    settings = GatewaySettings(api_keys="k1,k2", rate_limit_rpm=2)
    async with open_client(create_app(settings, engine)) as client:
        for _ in range(2):
            assert (await client.post("/v1/chat/completions", json=chat_body(), headers=auth("k1"))).status_code == 200
        limited = await client.post("/v1/chat/completions", json=chat_body(), headers=auth("k1"))
        assert limited.status_code == 429
        assert limited.json()["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(limited.headers["retry-after"]) <= 61
        assert (await client.post("/v1/chat/completions", json=chat_body(), headers=auth("k2"))).status_code == 200
    assert len(engine.submitted) == 3  # the limited request never reached the engine


async def test_tokens_per_minute_limit(engine: FakeEngine) -> None:
    async with open_client(create_app(GatewaySettings(rate_limit_tpm=30), engine)) as client:
        first = await client.post("/v1/completions", json=completion_body("a b c", max_tokens=20))
        assert first.json()["usage"]["total_tokens"] == 24
        assert (await client.post("/v1/completions", json=completion_body("a", max_tokens=8))).status_code == 200
        limited = await client.post("/v1/completions", json=completion_body("a"))
        assert limited.status_code == 429 and "tokens per minute" in limited.json()["error"]["message"]


async def started_request(client: httpx.AsyncClient, engine: FakeEngine, *, max_tokens: int,
                          stream: bool) -> asyncio.Task:
    """A completion request in flight, once the engine runs it."""
    request = asyncio.create_task(
        client.post("/v1/completions", json=completion_body("a b c d", max_tokens=max_tokens, stream=stream))
    )
    for _ in range(200):
        if engine.num_running:
            break
        await asyncio.sleep(0.005)
    return request


async def test_drain_refuses_new_requests_and_lets_streams_finish() -> None:
    engine = FakeEngine(token_delay_s=0.005)
    app = create_app(GatewaySettings(), engine)
    state = app.state.gateway
    async with open_client(app) as client:
        stream = await started_request(client, engine, max_tokens=60, stream=True)
        assert state.num_in_flight == 1
        state.begin_drain()
        ready = await client.get("/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        refused = await client.post("/v1/chat/completions", json=chat_body())
        assert refused.status_code == 503 and refused.headers["retry-after"] == "10"
        assert refused.json()["error"]["code"] == "draining"
        assert (await client.get("/health")).status_code == 200
        assert await state.wait_idle(5.0)
        events = sse_payloads((await stream).text)
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert engine.kv_used_slots == 0


@pytest.mark.parametrize("stream", [True, False])
async def test_cutting_open_requests_ends_them_with_a_shutdown_error(stream: bool) -> None:
    engine = FakeEngine(token_delay_s=0.01)
    app = create_app(GatewaySettings(), engine)
    state = app.state.gateway
    async with open_client(app) as client:
        request = await started_request(client, engine, max_tokens=200, stream=stream)
        await asyncio.sleep(0.05)
        state.begin_drain()
        assert state.cut_open_requests() == 1
        response = await request
        if stream:
            events = sse_payloads(response.text)
            assert "[DONE]" not in events and events[-1]["error"]["code"] == "server_shutdown"
        else:
            assert response.status_code == 503 and response.json()["error"]["code"] == "server_shutdown"
        assert await state.wait_idle(1.0) and not state.open_runners
    assert engine.kv_used_slots == 0 and engine.num_running == 0


async def test_wait_idle_times_out() -> None:
    app = create_app(GatewaySettings(), FakeEngine())
    state = app.state.gateway
    state.num_in_flight = 1
    assert await state.wait_idle(0.1) is False


@pytest.mark.parametrize("keepalive", [0.05])
async def test_slow_stream_gets_keepalive_pings(keepalive: float) -> None:
    engine = FakeEngine(prefill_delay_s=0.3)
    async with open_client(create_app(GatewaySettings(keepalive_s=keepalive), engine)) as client:
        r = await client.post("/v1/completions", json=completion_body("a </s>", stream=True))
    assert ": ping" in r.text
    assert sse_payloads(r.text)[-1] == "[DONE]"
