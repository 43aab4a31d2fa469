from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.deps import get_state
from gateway.state import GatewayState

router = APIRouter()


@router.get("/health")
async def health(state: GatewayState = Depends(get_state)) -> JSONResponse:
    """Liveness: the process and its event loop answer; 503 once the engine loop died or the model failed to load."""
    if state.load_error is not None:
        return JSONResponse({"status": "load_failed", "error": state.load_error}, status_code=503)
    if state.engine is not None and not state.engine.health().loop_alive:
        return JSONResponse({"status": "engine_dead"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(state: GatewayState = Depends(get_state)) -> JSONResponse:
    """Readiness: model loaded, engine loop alive, not draining. Redis is reported, not required."""
    redis = await state.redis.status() if state.redis is not None else "disabled"
    body: dict = {"model": state.settings.served_model_name, "redis": redis, "replica": state.replica_id}
    if state.draining:
        status = "draining"
    elif state.engine is None:
        status = "load_failed" if state.load_error else "loading"
    else:
        health = state.engine.health()
        status = "ready" if health.ready and health.loop_alive else "engine_dead" if not health.loop_alive \
            else "engine_not_ready"
        body.update(model=state.engine.model_name, num_running=health.num_running, num_waiting=health.num_waiting)
    code = 200 if status == "ready" else 503
    headers = {} if code == 200 else {"Retry-After": "5"}
    return JSONResponse({"status": status, **body}, status_code=code, headers=headers)


@router.get("/metrics")
async def metrics(state: GatewayState = Depends(get_state)) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
