from __future__ import annotations

import time

from fastapi import APIRouter, Body, Depends, Query

from gateway.admin import PolicyBroker
from gateway.deps import admin_principal, get_state
from gateway.state import GatewayState

router = APIRouter(prefix="/admin", dependencies=[Depends(admin_principal)])


def _broker(state: GatewayState) -> PolicyBroker:
    assert state.policy is not None, "create_app always sets the policy broker"
    return state.policy


@router.get("/policy")
async def get_policy(state: GatewayState = Depends(get_state)) -> dict:
    return state.serving_engine().policy_settings()


@router.patch("/policy")
async def patch_policy(changes: dict = Body(...), state: GatewayState = Depends(get_state)) -> dict:
    return await _broker(state).update(state.serving_engine(), changes, replace=False)


@router.put("/policy")
async def put_policy(settings: dict = Body(...), state: GatewayState = Depends(get_state)) -> dict:
    return await _broker(state).update(state.serving_engine(), settings, replace=True)


@router.get("/stats")
async def stats(state: GatewayState = Depends(get_state)) -> dict:
    engine = state.serving_engine()
    gateway = {
        "replica": state.replica_id,
        "uptime_s": round(time.time() - state.started_at, 3),
        "draining": state.draining,
        "num_in_flight": state.num_in_flight,
        "redis": await state.redis.status() if state.redis is not None else "disabled",
        "policy_updates_from_replicas": _broker(state).num_remote_updates,
    }
    return {"engine": engine.stats(), "gateway": gateway}


@router.get("/requests")
async def list_requests(
    state: GatewayState = Depends(get_state),
    status: str | None = Query(None, description="queued|running|finished|aborted|failed|active"),
    limit: int = Query(50, ge=1, le=1000),
) -> dict:
    records = await state.store.recent(limit=limit, status=status)
    return {"object": "list", "data": [r.to_dict() for r in records]}
