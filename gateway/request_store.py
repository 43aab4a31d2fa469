"""Request state: one record per API request, written at each transition, kept for a TTL.

``RequestStore`` has two implementations behind one interface: ``MemoryRequestStore`` (the
embedded default) and ``RedisRequestStore`` (shared by every replica). A store never raises into
a request: Redis failures are absorbed by the ``RedisGuard`` (logged and counted).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gateway.redis_guard import RedisGuard

RequestStatus = Literal["queued", "running", "finished", "aborted", "failed"]
ACTIVE_STATUSES = ("queued", "running")
KEY_PREFIX = "specserve:"


@dataclass
class RequestRecord:
    id: str
    key_id: str  # a short hash of the API key, never the key
    model: str
    endpoint: str
    status: RequestStatus = "queued"
    created: float = field(default_factory=time.time)
    first_token_at: float | None = None
    finished_at: float | None = None
    num_choices: int = 1
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None  # choice 0's
    finish_reasons: list[str | None] = field(default_factory=list)
    speculation: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    replica: str = ""
    prompt: Any = None  # only with store_prompts
    output: list[str] | None = None  # only with store_prompts

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class RequestStore(Protocol):
    async def save(self, record: RequestRecord) -> None: ...

    async def get(self, request_id: str) -> RequestRecord | None: ...

    async def recent(self, limit: int = 50, status: str | None = None) -> list[RequestRecord]:
        """Newest first; ``status="active"`` means queued or running."""
        ...

    async def status(self) -> str:
        """'memory', or 'ok' / 'down' for Redis."""
        ...

    async def close(self) -> None: ...


def _matches(record: RequestRecord, status: str | None) -> bool:
    if status is None:
        return True
    return record.status in ACTIVE_STATUSES if status == "active" else record.status == status


class MemoryRequestStore:
    """In-process store with the same TTL semantics; bounded so a long-lived process cannot grow without end."""

    def __init__(self, ttl_s: float = 3600, max_records: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_records = max_records
        self._records: OrderedDict[str, tuple[float, dict]] = OrderedDict()

    async def save(self, record: RequestRecord) -> None:
        self._records[record.id] = (time.monotonic() + self.ttl_s, record.to_dict())
        self._records.move_to_end(record.id)
        while len(self._records) > self.max_records:
            self._records.popitem(last=False)

    async def get(self, request_id: str) -> RequestRecord | None:
        entry = self._records.get(request_id)
        if entry is None or entry[0] < time.monotonic():
            return None
        return RequestRecord.from_dict(entry[1])

    async def recent(self, limit: int = 50, status: str | None = None) -> list[RequestRecord]:
        now = time.monotonic()
        records = [RequestRecord.from_dict(data) for expires, data in self._records.values() if expires >= now]
        records.sort(key=lambda r: r.created, reverse=True)
        return [r for r in records if _matches(r, status)][:limit]

    async def status(self) -> str:
        return "memory"

    async def close(self) -> None:
        self._records.clear()


class RedisRequestStore:
    """Records as JSON strings with EX ttl, indexed by a sorted set (score = created) for listings."""

    def __init__(self, guard: RedisGuard, ttl_s: int = 3600, prefix: str = KEY_PREFIX) -> None:
        self.guard = guard
        self.ttl_s = ttl_s
        self.index_key = f"{prefix}requests"
        self.record_prefix = f"{prefix}req:"

    async def save(self, record: RequestRecord) -> None:
        async def write(redis: Any) -> None:
            pipe = redis.pipeline(transaction=False)
            pipe.set(self.record_prefix + record.id, json.dumps(record.to_dict()), ex=self.ttl_s)
            pipe.zadd(self.index_key, {record.id: record.created})
            pipe.zremrangebyscore(self.index_key, "-inf", time.time() - self.ttl_s)
            await pipe.execute()

        await self.guard.call("store_save", write, None)

    async def get(self, request_id: str) -> RequestRecord | None:
        raw = await self.guard.call("store_get", lambda r: r.get(self.record_prefix + request_id), None)
        return RequestRecord.from_dict(json.loads(raw)) if raw else None

    async def recent(self, limit: int = 50, status: str | None = None) -> list[RequestRecord]:
        async def read(redis: Any) -> list[str | None]:
            ids = await redis.zrevrange(self.index_key, 0, max(limit * 4, 200) - 1)
            return await redis.mget([self.record_prefix + i for i in ids]) if ids else []

        raws = await self.guard.call("store_recent", read, [])
        records = [RequestRecord.from_dict(json.loads(raw)) for raw in raws if raw]
        return [r for r in records if _matches(r, status)][:limit]

    async def status(self) -> str:
        return await self.guard.status()

    async def close(self) -> None:
        """The guard (and its client) belongs to the app, which closes it."""
