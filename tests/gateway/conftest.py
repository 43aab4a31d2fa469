from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.testing import FakeEngine, RedisServer
from tests.gateway.helpers import open_client


@pytest.fixture(autouse=True)
def _no_specserve_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from each test, never from the developer's environment."""
    for name in list(os.environ):
        if name.startswith("SPECSERVE_"):
            monkeypatch.delenv(name)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def app(engine: FakeEngine, exporter: InMemorySpanExporter) -> FastAPI:
    return create_app(GatewaySettings(), engine, span_exporter=exporter)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with open_client(app) as c:
        yield c


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One private redis-server for the session (never the shared one on 6379)."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own, free to be killed and restarted."""
    server = RedisServer().start()
    yield server
    server.stop()
