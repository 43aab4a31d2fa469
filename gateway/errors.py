"""The one mapping from errors to HTTP: status code, headers and OpenAI's error body.

Every route, dependency and stream goes through :func:`to_gateway_error`, so an engine error, a
validation error or a gateway decision (auth, rate limit, drain) always renders the same way:
``{"error": {"message", "type", "param", "code"}}``, also as an SSE error event mid-stream.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.errors import (
    ContextLengthExceededError,
    EngineDeadError,
    EngineError,
    EngineNotReadyError,
    InvalidRequestError,
    QueueFullError,
)

logger = logging.getLogger(__name__)

QUEUE_FULL_RETRY_AFTER_S = 1
NOT_READY_RETRY_AFTER_S = 5


class GatewayError(Exception):
    status_code = 500
    error_type = "server_error"
    default_code: str | None = None

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        headers = {"Retry-After": str(max(1, math.ceil(self.retry_after)))} if self.retry_after is not None else {}
        if self.status_code == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}


class BadRequestError(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class PayloadTooLargeError(GatewayError):
    status_code = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class ContextLengthError(BadRequestError):
    default_code = "context_length_exceeded"


class AuthenticationError(GatewayError):
    status_code = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(GatewayError):
    status_code = 403
    error_type = "permission_error"
    default_code = "permission_denied"


class NotFoundError(GatewayError):
    status_code = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class ModelNotFoundError(NotFoundError):
    default_code = "model_not_found"


class RateLimitError(GatewayError):
    status_code = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class ServiceUnavailableError(GatewayError):
    status_code = 503
    error_type = "service_unavailable_error"
    default_code = "service_unavailable"


def context_length_error(max_len: int, num_prompt: int, num_completion: int, param: str) -> ContextLengthError:
    return ContextLengthError(
        f"This model's maximum context length is {max_len} tokens. However, you requested "
        f"{num_prompt + num_completion} tokens ({num_prompt} in the messages, {num_completion} in the completion). "
        "Please reduce the length of the messages or completion.",
        param=param,
    )


def to_gateway_error(exc: BaseException) -> GatewayError:
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, EngineError):
        return _from_engine_error(exc)
    if isinstance(exc, RequestValidationError):
        return _from_validation_errors(exc.errors())
    if isinstance(exc, StarletteHTTPException):
        return _from_http_exception(exc)
    logger.exception("unhandled error", exc_info=exc)
    return GatewayError("The server had an error while processing your request.", code="internal_error")


def _from_engine_error(exc: EngineError) -> GatewayError:
    if isinstance(exc, ContextLengthExceededError):
        return ContextLengthError(exc.message, param=exc.param)
    if isinstance(exc, InvalidRequestError):
        return BadRequestError(exc.message, param=exc.param)
    if isinstance(exc, QueueFullError):
        return RateLimitError(
            f"The server is overloaded: {exc.message}", code="queue_full", retry_after=QUEUE_FULL_RETRY_AFTER_S
        )
    if isinstance(exc, EngineNotReadyError):
        return ServiceUnavailableError(exc.message, retry_after=NOT_READY_RETRY_AFTER_S)
    if isinstance(exc, EngineDeadError):
        return GatewayError(f"The engine failed: {exc.message}", code="engine_dead")
    return GatewayError(exc.message, code="engine_error")


def _from_http_exception(exc: StarletteHTTPException) -> GatewayError:
    kinds: dict[int, type[GatewayError]] = {400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError,
                                            404: NotFoundError, 429: RateLimitError, 503: ServiceUnavailableError}
    err = kinds.get(exc.status_code, GatewayError)(str(exc.detail))
    if err.__class__ is GatewayError:
        err.status_code = exc.status_code  # e.g. 405; an instance attribute keeps the class default intact
        err.error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return err


_TYPE_WORDS = {"string": "a string", "int": "an integer", "float": "a number", "bool": "a boolean",
               "list": "an array", "dict": "an object", "model": "an object", "model_attributes": "an object",
               "tuple": "an array"}
_PY_TYPE_WORDS = {str: "a string", int: "an integer", float: "a decimal", bool: "a boolean", list: "an array",
                  dict: "an object", type(None): "null"}


def _param_from_loc(loc: tuple) -> str:
    """The field path of a pydantic error location, without union tags; the first item is always a field
    (so a top-level field named like a tag, e.g. ``model``, is kept)."""
    parts: list[str] = []
    for item in loc[1:] if loc and loc[0] in ("body", "query", "path") else loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif isinstance(item, str) and item.isidentifier() and item.islower() \
                and (not parts or (item not in _TYPE_WORDS and item not in ("str", "none"))):
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def _from_validation_errors(errors: list[dict]) -> BadRequestError:
    if not errors:
        return BadRequestError("Invalid request.")
    first = errors[0]
    kind, param = first.get("type", ""), _param_from_loc(tuple(first.get("loc", ())))
    if kind == "json_invalid":
        return BadRequestError(
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
            "HTTP library correctly. The OpenAI API expects a JSON payload.)"
        )
    if not param:
        return BadRequestError("The request body must be a JSON object.")
    if kind == "missing":
        return BadRequestError(f"Missing required parameter: '{param}'.", param=param)
    expected = [_TYPE_WORDS[e["type"][:-5]] for e in errors
                if e.get("type", "").endswith("_type") and e["type"][:-5] in _TYPE_WORDS
                and _param_from_loc(tuple(e.get("loc", ()))) == param]
    if expected:
        got = _PY_TYPE_WORDS.get(type(first.get("input")), "another type")
        wanted = expected[0] if len(expected) == 1 else "one of " + ", ".join(dict.fromkeys(expected))
        return BadRequestError(f"Invalid type for '{param}': expected {wanted}, but got {got} instead.", param=param)
    return BadRequestError(f"Invalid value for '{param}': {first.get('msg', 'invalid')}.", param=param)


def error_response(exc: BaseException) -> JSONResponse:
    err = to_gateway_error(exc)
    return JSONResponse(err.body(), status_code=err.status_code, headers=err.headers)


def sse_error_payload(exc: BaseException) -> dict[str, Any]:
    """The body of an SSE error event sent after a stream has started."""
    return to_gateway_error(exc).body()


def install_error_handlers(app: FastAPI) -> None:
    async def handle(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    for kind in (GatewayError, EngineError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, handle)
