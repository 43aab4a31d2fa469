from __future__ import annotations

from fastapi import APIRouter, Depends

from gateway.deps import get_state, serving_engine
from gateway.engine_client import EngineClient
from gateway.protocol import ModelCard, ModelList
from gateway.serving import check_model
from gateway.state import GatewayState

router = APIRouter()


def _card(state: GatewayState, engine: EngineClient) -> ModelCard:
    return ModelCard(id=engine.model_name, created=int(state.started_at), max_model_len=engine.max_model_len)


@router.get("/v1/models")
async def list_models(state: GatewayState = Depends(get_state), engine: EngineClient = Depends(serving_engine)) -> dict:
    return ModelList(data=[_card(state, engine)]).model_dump()


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(
    model_id: str, state: GatewayState = Depends(get_state), engine: EngineClient = Depends(serving_engine)
) -> dict:
    check_model(engine, model_id)
    return _card(state, engine).model_dump()
