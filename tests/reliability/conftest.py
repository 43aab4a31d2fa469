"""Fixtures for the reliability tests: one real ``specserve serve`` (bundled pair, CPU) with a private Redis,
shared by the whole session; tests that need a process of their own (drain, replicas) start it themselves."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.reliability.harness import KillableRedis, ServerProcess, Target


@pytest.fixture(autouse=True)
def _no_specserve_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process apps take settings from each test, never from the developer's environment."""
    for name in list(os.environ):
        if name.startswith("SPECSERVE_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def reliability_redis() -> Iterator[KillableRedis]:
    """The session server's private redis-server; the Redis-fault test kills and restarts it."""
    server = KillableRedis().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def real_server(reliability_redis: KillableRedis) -> Iterator[ServerProcess]:
    server = ServerProcess({"SPECSERVE_REDIS_URL": reliability_redis.url}, name="reliability-server").start()
    yield server
    server.stop()


@pytest.fixture
def target(real_server: ServerProcess) -> Target:
    assert real_server.alive(), "the session server died; its stderr ends:\n" + real_server.log_tail()
    return Target(real_server.url)
