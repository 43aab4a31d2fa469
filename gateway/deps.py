"""FastAPI dependencies: the app's state, authentication, rate limits, serving readiness."""

from __future__ import annotations

from fastapi import Depends, Request

from gateway.auth import Principal
from gateway.engine_client import EngineClient
from gateway.state import GatewayState

ADMIN_COOKIE = "specserve_admin"  # the admin key, for the dashboard in a browser


def get_state(request: Request) -> GatewayState:
    return request.app.state.gateway


def api_principal(request: Request, state: GatewayState = Depends(get_state)) -> Principal:
    """401 without a valid key (when keys are configured)."""
    return state.auth.authenticate(request.headers.get("authorization"))


def admin_principal(request: Request, state: GatewayState = Depends(get_state)) -> Principal:
    """401 without a valid key, 403 with a non-admin key. The key comes as ``Authorization: Bearer`` or, from a
    browser, as the HttpOnly cookie that ``GET /admin/ui?key=...`` sets (SameSite=Strict, so no cross-site use)."""
    authorization = request.headers.get("authorization")
    if authorization is None and (cookie := request.cookies.get(ADMIN_COOKIE)):
        authorization = f"Bearer {cookie}"
    return state.auth.authenticate_admin(authorization)


def serving_engine(state: GatewayState = Depends(get_state), _: Principal = Depends(api_principal)) -> EngineClient:
    """The engine, after authentication; 503 while loading or draining."""
    return state.serving_engine()


async def generation_principal(
    state: GatewayState = Depends(get_state),
    principal: Principal = Depends(api_principal),
    _: EngineClient = Depends(serving_engine),
) -> Principal:
    """For generation endpoints: authenticated, serving, and within the key's rate limits (429)."""
    await state.limiter.check(principal.key_id)
    return principal
