from __future__ import annotations

from fastapi import APIRouter, Depends

from gateway.auth import Principal
from gateway.deps import api_principal, get_state
from gateway.errors import NotFoundError
from gateway.state import GatewayState

router = APIRouter()


@router.get("/v1/requests/{request_id}")
async def get_request(
    request_id: str, state: GatewayState = Depends(get_state), principal: Principal = Depends(api_principal)
) -> dict:
    """A request's record, to the key that made it; anyone else gets the same 404 as for an unknown id."""
    record = await state.store.get(request_id)
    if record is None or record.key_id != principal.key_id:
        raise NotFoundError(f"No request found with id '{request_id}'.", param="request_id")
    return record.to_dict()
