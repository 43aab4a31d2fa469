"""A guarded Redis client: a Redis outage is logged and counted, never raised into a request.

After a failure the guard answers with the caller's default for ``backoff_s`` (no network call),
so an outage costs requests nothing; then it tries again and the client's connection pool
reconnects by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

T = TypeVar("T")
REDIS_FAILURES = (RedisError, OSError, asyncio.TimeoutError)


def make_redis_client(url: str, *, timeout_s: float = 1.0) -> Redis:
    """One retry without backoff: a pooled connection that went stale across a Redis restart is replaced."""
    return Redis.from_url(
        url,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),
        health_check_interval=10,
        decode_responses=True,
    )


class RedisGuard:
    def __init__(
        self, client: Redis, on_error: Callable[[str], None] | None = None, *, backoff_s: float = 1.0
    ) -> None:
        self.client = client
        self.backoff_s = backoff_s
        self._on_error = on_error or (lambda op: None)
        self._down_until = 0.0
        self._was_down = False

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    async def call(self, op: str, fn: Callable[[Redis], Awaitable[T]], default: T) -> T:
        """Run ``fn(client)``; on any Redis failure log, count and return ``default``."""
        if not self.available:
            return default
        try:
            result = await fn(self.client)
        except REDIS_FAILURES as exc:
            self.record_failure(op, exc)
            return default
        self.record_success()
        return result

    def record_failure(self, op: str, exc: BaseException) -> None:
        self._on_error(op)
        self._down_until = time.monotonic() + self.backoff_s
        if not self._was_down:
            logger.warning("redis unavailable (%s: %s); serving on without it and retrying", op, exc)
        self._was_down = True

    def record_success(self) -> None:
        if self._was_down:
            logger.warning("redis reachable again")
        self._was_down = False

    async def status(self) -> str:
        """'ok' or 'down' (a cheap PING, skipped during the backoff after a failure)."""
        ok = await self.call("ping", lambda r: r.ping(), False)
        return "ok" if ok else "down"

    async def close(self) -> None:
        with contextlib.suppress(*REDIS_FAILURES):  # closing a dead connection is not worth a log line
            await self.client.aclose()
