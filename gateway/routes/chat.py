from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from gateway import serving
from gateway.auth import Principal
from gateway.deps import generation_principal, get_state
from gateway.protocol import ChatCompletionRequest
from gateway.state import GatewayState

router = APIRouter()


@router.post("/v1/chat/completions")
async def create_chat_completion(
    body: ChatCompletionRequest,
    request: Request,
    state: GatewayState = Depends(get_state),
    principal: Principal = Depends(generation_principal),
) -> Response:
    return await serving.chat_completion(state, body, principal, request)
