"""Shared helpers for the gateway tests (in-process, through httpx.ASGITransport)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI

MODEL = "specserve-tiny"


@asynccontextmanager
async def open_client(app: FastAPI, headers: dict[str, str] | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan and give a client talking to it in-process."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", headers=headers) as client:
            yield client


def sse_payloads(text: str) -> list[Any]:
    """The data of each SSE event: parsed JSON, or the literal "[DONE]"."""
    payloads = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def chat_body(content: str = "hello world </s>", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0, **fields}


def completion_body(prompt: Any = "hello world </s>", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "temperature": 0, **fields}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
