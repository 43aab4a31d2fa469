"""Server-sent events for a running job, with sse-starlette.

The first engine output is awaited before the response starts, so errors the engine raises at
admission (queue full, context length, not ready) still get their HTTP status; a slow start is
bounded by the keep-alive interval, after which the stream opens and errors become SSE error
events. A client disconnect cancels the generator; ``JobRunner.close()`` in its ``finally`` then
aborts the engine requests at once (shielded, so the cancellation cannot skip it).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette import EventSourceResponse

from gateway.errors import sse_error_payload
from gateway.responses import ResponseFormat
from gateway.runner import JobRunner
from gateway.settings import GatewaySettings

_PENDING = object()


def _event(payload: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(payload, separators=(",", ":"))}


async def start_stream(runner: JobRunner, fmt: ResponseFormat, settings: GatewaySettings) -> EventSourceResponse:
    await runner.start()
    try:
        first: Any = await runner.next_output(timeout=settings.keepalive_s or None)
    except TimeoutError:
        first = _PENDING
    except BaseException as exc:
        await runner.close(error=exc if isinstance(exc, Exception) else None)
        raise
    return EventSourceResponse(
        _events(runner, fmt, first),
        ping=settings.keepalive_s,
        sep="\n",
    )


async def _events(runner: JobRunner, fmt: ResponseFormat, first: Any) -> AsyncIterator[Any]:
    try:
        for chunk in fmt.opening_chunks():
            yield _event(chunk)
        item = first
        while True:
            if item is _PENDING:
                item = await runner.next_output()
            if item is None:
                break
            for chunk in fmt.output_chunks(*item):
                yield _event(chunk)
            item = _PENDING
        if fmt.include_usage:
            yield _event(fmt.usage_chunk())
        await runner.close()
    except Exception as exc:
        await runner.close(error=exc)
        yield _event(sse_error_payload(exc))
        return
    finally:
        await runner.close()  # a disconnect (cancellation or aclose): abort now; a no-op after a normal close
    yield "[DONE]"
