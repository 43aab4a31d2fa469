"""``create_app``: wires settings, engine, request store, auth, limits, telemetry and routes.

Nothing happens at import. The lifespan connects what needs the event loop: it adopts an injected
engine at once, or loads the real one in a worker thread while /health answers and /ready and the
API say 503; then it adopts the shared policy and subscribes to policy updates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from opentelemetry.sdk.trace.export import SpanExporter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.admin import PolicyBroker
from gateway.auth import ApiKeyAuth
from gateway.engine_client import EngineClient, build_engine, maybe_call
from gateway.errors import PayloadTooLargeError, error_response, install_error_handlers
from gateway.metrics import GatewayMetrics
from gateway.rate_limit import RateLimiter
from gateway.redis_guard import RedisGuard, make_redis_client
from gateway.request_store import MemoryRequestStore, RedisRequestStore, RequestStore
from gateway.routes import all_routers
from gateway.settings import GatewaySettings
from gateway.state import VERSION, GatewayState
from gateway.telemetry import build_tracer_provider, instrument_app

logger = logging.getLogger(__name__)

UNCOUNTED_ENDPOINTS = ("/metrics", "/health", "/ready")


def create_app(
    settings: GatewaySettings | None = None,
    engine: EngineClient | None = None,
    store: RequestStore | None = None,
    *,
    span_exporter: SpanExporter | None = None,
) -> FastAPI:
    settings = settings or GatewaySettings()
    metrics = GatewayMetrics()
    guard = RedisGuard(make_redis_client(settings.redis_url), metrics.count_redis_error) if settings.redis_url else None
    if store is None and guard is not None:
        store = RedisRequestStore(guard, settings.request_ttl_s)
    elif store is None:
        store = MemoryRequestStore(settings.request_ttl_s)
    state = GatewayState(
        settings=settings,
        auth=ApiKeyAuth.from_settings(settings),
        store=store,
        limiter=RateLimiter(settings.rate_limit_rpm, settings.rate_limit_tpm, guard),
        metrics=metrics,
        tracer_provider=build_tracer_provider(settings, span_exporter),
        redis=guard,
    )
    state.policy = PolicyBroker(lambda: state.engine, guard, state.replica_id)
    metrics.watch_engine(lambda: state.engine)

    app = FastAPI(title="specserve", version=VERSION, lifespan=_lifespan(engine))
    app.state.gateway = state
    install_error_handlers(app)
    for router in all_routers():
        app.include_router(router)
    app.add_middleware(RequestTracker, state=state)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    instrument_app(app, state.tracer_provider)
    return app


def _lifespan(engine: EngineClient | None) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state: GatewayState = app.state.gateway
        state.auth.warn_if_open()
        loader = None
        if engine is not None:
            await _activate(state, engine)
        else:
            loader = asyncio.create_task(_load(state))
        try:
            yield
        finally:
            if loader is not None:
                loader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loader
            await _shutdown(state, owns_engine=engine is None)

    return lifespan


async def _load(state: GatewayState) -> None:
    settings = state.settings
    logger.info("loading %s (draft: %s) on device=%s dtype=%s", settings.model, settings.draft_model,
                settings.device, settings.dtype)
    try:
        engine = await asyncio.to_thread(build_engine, settings, state.load_steps.append)
        await maybe_call(engine, "start")
    except Exception as exc:
        state.load_error = f"{type(exc).__name__}: {exc}"
        logger.exception("the engine failed to load")
        return
    await _activate(state, engine)


async def _activate(state: GatewayState, engine: EngineClient) -> None:
    state.engine = engine
    if state.policy is not None:
        await state.policy.start()
    logger.info("engine ready: model %s, max_model_len %d", engine.model_name, engine.max_model_len)


async def _shutdown(state: GatewayState, *, owns_engine: bool) -> None:
    if state.policy is not None:
        await state.policy.stop()
    await state.store.close()
    if state.redis is not None:
        await state.redis.close()
    if owns_engine and state.engine is not None:
        await maybe_call(state.engine, "shutdown")
    state.tracer_provider.shutdown()


class RequestTracker:
    """Pure ASGI middleware: counts requests by endpoint and status, and the in-flight generation
    requests that a drain waits for (until the last byte of a stream, which a BaseHTTPMiddleware could not see)."""

    def __init__(self, app: ASGIApp, state: GatewayState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        generation = scope["method"] == "POST" and scope["path"].startswith("/v1/")
        self.state.num_in_flight += generation
        try:
            await self.app(scope, receive, send_with_status)
        finally:
            self.state.num_in_flight -= generation
            endpoint = getattr(scope.get("route"), "path", "unmatched")
            if endpoint not in UNCOUNTED_ENDPOINTS:
                self.state.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()


class BodySizeLimit:
    """Pure ASGI middleware: refuse a request body over ``max_bytes`` with 413 before anything parses it.

    The body is read here first (by Content-Length when given, else chunk by chunk up to the limit) and
    replayed to the app; later ``receive`` calls go to the server, so disconnects are still seen.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = f"The request body exceeds the limit of {self.max_bytes} bytes."
        too_large = error_response(PayloadTooLargeError(limit))
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.max_bytes:
            await too_large(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replay: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replaying_receive() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replaying_receive, send)
