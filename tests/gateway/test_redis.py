"""Redis-backed request state, limits and policy sync, against a real private redis-server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
import redis

from gateway.app import create_app
from gateway.redis_guard import RedisGuard, make_redis_client
from gateway.request_store import RedisRequestStore, RequestRecord
from gateway.settings import GatewaySettings
from gateway.testing import FakeEngine, RedisServer
from tests.gateway.helpers import auth, chat_body, completion_body, open_client
from tests.gateway.test_observability import metrics_by_name


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis.Redis.from_url(redis_server.url).flushall()
    return redis_server.url


Replica = tuple[httpx.AsyncClient, FakeEngine]


@contextlib.asynccontextmanager
async def replicas(settings: GatewaySettings, count: int = 2) -> AsyncIterator[list[Replica]]:
    """``count`` apps (replicas) sharing one Redis, each with its own engine."""
    async with contextlib.AsyncExitStack() as stack:
        pairs = []
        for _ in range(count):
            engine = FakeEngine()
            client = await stack.enter_async_context(open_client(create_app(settings, engine)))
            pairs.append((client, engine))
        yield pairs


async def test_store_round_trip_and_ttl(redis_url: str) -> None:
    guard = RedisGuard(make_redis_client(redis_url))
    store = RedisRequestStore(guard, ttl_s=60)
    record = RequestRecord(id="cmpl-1", key_id="abc", model="m", endpoint="/v1/completions", status="running")
    await store.save(record)
    assert (await store.get("cmpl-1")) == record
    assert [r.id for r in await store.recent(status="active")] == ["cmpl-1"]
    assert 0 < redis.Redis.from_url(redis_url).ttl("specserve:req:cmpl-1") <= 60
    assert await store.get("cmpl-missing") is None
    await guard.close()


async def test_records_are_shared_across_replicas(redis_url: str) -> None:
    settings = GatewaySettings(redis_url=redis_url, api_keys="k1", admin_key="adm")
    async with replicas(settings) as [(a, _), (b, _)]:
        request_id = (await a.post("/v1/chat/completions", json=chat_body(), headers=auth("k1"))).json()["id"]
        record = await b.get(f"/v1/requests/{request_id}", headers=auth("k1"))
        assert record.status_code == 200 and record.json()["status"] == "finished"
        listing = (await b.get("/admin/requests", headers=auth("adm"))).json()["data"]
        assert [r["id"] for r in listing] == [request_id]
        ready = (await b.get("/ready")).json()
        assert ready["redis"] == "ok"


async def test_rate_limit_holds_across_replicas(redis_url: str) -> None:
    settings = GatewaySettings(redis_url=redis_url, rate_limit_rpm=3)
    async with replicas(settings) as [(a, _), (b, _)]:
        codes = [(await c.post("/v1/completions", json=completion_body())).status_code for c in (a, b, a, b)]
    assert codes == [200, 200, 200, 429]


async def test_policy_patch_reaches_other_replicas_within_a_second(redis_url: str) -> None:
    async with replicas(GatewaySettings(redis_url=redis_url), count=3) as pairs:
        (a, engine_a), (_, engine_b), (_, engine_c) = pairs
        r = await a.patch("/admin/policy", json={"k": 2, "mode": "ngram"})
        assert r.status_code == 200
        for _ in range(100):
            if engine_b.policy["k"] == 2 and engine_c.policy["k"] == 2:
                break
            await asyncio.sleep(0.01)
        assert engine_b.policy == engine_c.policy == engine_a.policy
        assert engine_b.policy["mode"] == "ngram"
        stats = (await pairs[1][0].get("/admin/stats")).json()
        assert stats["gateway"]["policy_updates_from_replicas"] == 1
    # a replica that starts later adopts the persisted policy
    late_engine = FakeEngine()
    async with open_client(create_app(GatewaySettings(redis_url=redis_url), late_engine)):
        assert late_engine.policy["k"] == 2 and late_engine.policy["mode"] == "ngram"


async def test_redis_outage_never_fails_requests_and_recovers(private_redis: RedisServer) -> None:
    engine = FakeEngine()
    app = create_app(GatewaySettings(redis_url=private_redis.url, rate_limit_rpm=1000), engine)
    state = app.state.gateway
    state.redis.backoff_s = 0.2
    async with open_client(app) as client:
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200
        private_redis.stop()
        for _ in range(3):
            r = await client.post("/v1/chat/completions", json=chat_body(stream=True))
            assert r.status_code == 200 and r.text.rstrip().endswith("[DONE]")
            assert (await client.post("/v1/completions", json=completion_body())).status_code == 200
        errors = metrics_by_name((await client.get("/metrics")).text)["specserve_redis_errors_total"]
        assert sum(s.value for s in errors) >= 1
        ready = await client.get("/ready")
        assert ready.status_code == 200 and ready.json()["redis"] == "down"
        # Redis comes back on the same port: the pool reconnects by itself
        private_redis.start()
        await asyncio.sleep(state.redis.backoff_s + 0.05)
        request_id = (await client.post("/v1/chat/completions", json=chat_body())).json()["id"]
        record = (await client.get(f"/v1/requests/{request_id}")).json()
        assert record["status"] == "finished"
        assert (await client.get("/ready")).json()["redis"] == "ok"
        # the policy subscriber resubscribed too
        other_engine = FakeEngine()
        async with open_client(create_app(GatewaySettings(redis_url=private_redis.url), other_engine)) as other:
            for _ in range(200):
                await other.patch("/admin/policy", json={"k": 3})
                if engine.policy["k"] == 3:
                    break
                await asyncio.sleep(0.05)
            assert engine.policy["k"] == 3


async def test_redis_down_at_start_up(private_redis: RedisServer) -> None:
    private_redis.stop()
    async with open_client(create_app(GatewaySettings(redis_url=private_redis.url), FakeEngine())) as client:
        assert (await client.get("/ready")).status_code == 200
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200
        assert (await client.patch("/admin/policy", json={"k": 2})).status_code == 200
