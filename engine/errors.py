"""The engine's typed errors. The gateway maps each to one HTTP status, in one place."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequestError(EngineError):
    """The request itself is wrong (bad sampling params, bad token ids...): HTTP 400."""


class ContextLengthExceededError(InvalidRequestError):
    """Prompt (plus requested tokens) does not fit the model's context: HTTP 400."""


class QueueFullError(EngineError):
    """The waiting queue is at its bound: HTTP 429 with Retry-After."""


class EngineNotReadyError(EngineError):
    """The engine is loading, draining or stopped: HTTP 503."""


class ModelLoadError(EngineError):
    """A checkpoint is missing files, is not Llama-architecture, or the pair mismatches."""


class EngineDeadError(EngineError):
    """The engine loop died; every pending request gets this instead of hanging: HTTP 500."""
