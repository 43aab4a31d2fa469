"""Everything one gateway app holds, in one object (``app.state.gateway``); no module-level state."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer

from gateway.auth import ApiKeyAuth
from gateway.engine_client import EngineClient
from gateway.errors import NOT_READY_RETRY_AFTER_S, ServiceUnavailableError
from gateway.metrics import GatewayMetrics
from gateway.rate_limit import RateLimiter
from gateway.redis_guard import RedisGuard
from gateway.request_store import RequestStore
from gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from gateway.admin import PolicyBroker
    from gateway.runner import JobRunner

VERSION = "0.1.0"
DRAIN_RETRY_AFTER_S = 10


def _replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(eq=False)
class GatewayState:
    settings: GatewaySettings
    auth: ApiKeyAuth
    store: RequestStore
    limiter: RateLimiter
    metrics: GatewayMetrics
    tracer_provider: TracerProvider
    redis: RedisGuard | None = None
    engine: EngineClient | None = None
    policy: PolicyBroker | None = None
    replica_id: str = field(default_factory=_replica_id)
    started_at: float = field(default_factory=time.time)
    draining: bool = False
    load_error: str | None = None
    load_steps: list[str] = field(default_factory=list)  # progress reported by the engine while loading
    num_in_flight: int = 0  # generation requests between arrival and their last byte
    open_runners: set[JobRunner] = field(default_factory=set)  # started and not yet closed

    @property
    def tracer(self) -> Tracer:
        return self.tracer_provider.get_tracer("specserve.gateway", VERSION)

    @property
    def system_fingerprint(self) -> str:
        name = self.engine.model_name if self.engine is not None else ""
        return "fp_" + hashlib.sha256(f"{VERSION}:{name}:{self.settings.speculation}".encode()).hexdigest()[:10]

    @property
    def loaded(self) -> bool:
        return self.engine is not None

    def serving_engine(self) -> EngineClient:
        """The engine, or 503 (with Retry-After) while loading, after a failed load, or while draining."""
        if self.draining:
            raise ServiceUnavailableError("The server is shutting down; retry on another replica.",
                                          code="draining", retry_after=DRAIN_RETRY_AFTER_S)
        if self.engine is None:
            message = f"The model failed to load: {self.load_error}" if self.load_error else "The model is loading."
            raise ServiceUnavailableError(message, code="model_loading", retry_after=NOT_READY_RETRY_AFTER_S)
        return self.engine

    def begin_drain(self) -> None:
        self.draining = True

    def cut_open_requests(self) -> int:
        """End every open request with a 503 ``server_shutdown`` error (an SSE error event mid-stream), so that a
        stream a drain could not wait for tells its client why it ended instead of just breaking off."""
        error = ServiceUnavailableError("The server shut down before this request finished; retry it.",
                                        code="server_shutdown", retry_after=DRAIN_RETRY_AFTER_S)
        runners = list(self.open_runners)
        for runner in runners:
            runner.interrupt(error)
        return len(runners)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no generation request is in flight; False if ``timeout_s`` ran out first."""
        deadline = time.monotonic() + timeout_s
        while self.num_in_flight > 0:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True
