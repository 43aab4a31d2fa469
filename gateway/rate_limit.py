"""Per-key rate limits (requests/min, tokens/min) in fixed one-minute windows.

With Redis the counters live there (one atomic Lua INCRBY+EXPIRE per hit), so the limits hold
across replicas; without it they live in this process. A Redis outage fails open: the guard
counts the error and the request goes through.

Tokens are charged when a request finishes (prompt + completion); a request is refused while its
key's window already holds ``tpm`` tokens or more.
"""

from __future__ import annotations

import math
import time
from typing import Any

from gateway.errors import RateLimitError
from gateway.redis_guard import RedisGuard
from gateway.request_store import KEY_PREFIX

WINDOW_S = 60
_INCR_WITH_TTL = """
local value = redis.call('INCRBY', KEYS[1], ARGV[1])
if redis.call('TTL', KEYS[1]) < 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return value
"""


class RateLimiter:
    def __init__(self, rpm: int = 0, tpm: int = 0, guard: RedisGuard | None = None) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self.guard = guard
        self._script = guard.client.register_script(_INCR_WITH_TTL) if guard is not None else None
        self._memory: dict[str, int] = {}
        self._memory_window = -1

    @property
    def enabled(self) -> bool:
        return self.rpm > 0 or self.tpm > 0

    async def check(self, key_id: str) -> None:
        """Count one request; raise 429 (with Retry-After) if the key is over either limit."""
        if not self.enabled:
            return
        window, retry_after = self._window()
        if self.rpm and await self._add(f"rpm:{key_id}:{window}", 1) > self.rpm:
            raise RateLimitError(f"Rate limit reached: {self.rpm} requests per minute.", retry_after=retry_after)
        if self.tpm and await self._add(f"tpm:{key_id}:{window}", 0) >= self.tpm:
            raise RateLimitError(f"Rate limit reached: {self.tpm} tokens per minute.", retry_after=retry_after)

    async def charge_tokens(self, key_id: str, num_tokens: int) -> None:
        if self.tpm and num_tokens > 0:
            window, _ = self._window()
            await self._add(f"tpm:{key_id}:{window}", num_tokens)

    @staticmethod
    def _window() -> tuple[int, float]:
        now = time.time()
        return int(now // WINDOW_S), max(1, math.ceil(WINDOW_S - now % WINDOW_S))

    async def _add(self, key: str, amount: int) -> int:
        if self.guard is None or self._script is None:
            return self._add_memory(key, amount)
        script = self._script

        async def incr(_: Any) -> int:
            return int(await script(keys=[KEY_PREFIX + "rl:" + key], args=[amount, WINDOW_S + 1]))

        return await self.guard.call("rate_limit", incr, 0)

    def _add_memory(self, key: str, amount: int) -> int:
        window = int(key.rsplit(":", 1)[1])
        if window != self._memory_window:  # a new minute: old windows are dead weight
            self._memory = {k: v for k, v in self._memory.items() if int(k.rsplit(":", 1)[1]) >= window}
            self._memory_window = window
        self._memory[key] = self._memory.get(key, 0) + amount
        return self._memory[key]
