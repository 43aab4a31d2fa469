"""Process-level behaviour with the real engine: SIGTERM drains in-flight streams then exits 0 (tests/e2e covers
the same with FakeEngine); two gateway processes sharing one Redis share policy, request state and rate limits."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.reliability.harness import ADMIN_KEY, API_KEY, OTHER_KEY, KillableRedis, ServerProcess, Target, start_all
from tests.reliability.scenarios import check_policy_sync, check_shared_rate_limit, check_shared_state, run_drain

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

RATE_LIMIT_RPM = 3
RATE_KEY = "sk-rel-limited"


async def test_sigterm_drains_a_real_stream_then_exits_0() -> None:
    server = ServerProcess({"SPECSERVE_DRAIN_TIMEOUT_S": "60"}, name="drain-server").start()
    try:
        result = await run_drain(server, Target(server.url), max_tokens=300)
    finally:
        server.stop(timeout_s=5)
    assert result.errors == 0, (result.row(), server.log_tail())
    assert result.lost == 0


@pytest.fixture(scope="module")
def replicas() -> Iterator[tuple[Target, Target]]:
    """Two `specserve serve` processes (real engine) sharing one private Redis, with a 3 requests/min limit."""
    redis_server = KillableRedis().start()
    env = {"SPECSERVE_REDIS_URL": redis_server.url, "SPECSERVE_RATE_LIMIT_RPM": str(RATE_LIMIT_RPM),
           "SPECSERVE_API_KEYS": f"{API_KEY},{OTHER_KEY},{RATE_KEY}", "SPECSERVE_ADMIN_KEY": ADMIN_KEY}
    a, b = ServerProcess(env, name="replica-a"), ServerProcess(env, name="replica-b")
    try:
        start_all(a, b)
        yield Target(a.url), Target(b.url)
    finally:
        a.stop(timeout_s=10)
        b.stop(timeout_s=10)
        redis_server.stop()


async def test_policy_patch_on_one_replica_shows_on_the_other_within_a_second(
        replicas: tuple[Target, Target]) -> None:
    what, passed, detail = await check_policy_sync(*replicas, timeout_s=1.0)
    assert passed, detail


async def test_request_state_is_readable_from_either_replica(replicas: tuple[Target, Target]) -> None:
    what, passed, detail = await check_shared_state(*replicas)
    assert passed, detail


async def test_rate_limit_is_shared_across_replicas(replicas: tuple[Target, Target]) -> None:
    what, passed, detail = await check_shared_rate_limit(*replicas, rate_limit_rpm=RATE_LIMIT_RPM, rate_key=RATE_KEY)
    assert passed, detail
