"""The one seam between the gateway and an engine: the ``EngineClient`` protocol.

The gateway never imports engine internals; it talks to whatever satisfies this protocol:
the real ``engine.async_engine.AsyncEngine`` (built by :func:`build_engine`) or
``gateway.testing.FakeEngine`` in tests.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from engine.types import EngineHealth, RequestOutput, SamplingParams

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings


@runtime_checkable
class EngineClient(Protocol):
    model_name: str  # the served model id, e.g. "specserve-tiny"
    max_model_len: int  # context length: prompt + completion tokens

    def encode(self, prompt: str) -> list[int]:
        """Tokenize with the tokenizer's defaults (adds BOS)."""
        ...

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """Render and tokenize a chat; raises ``engine.errors.InvalidRequestError`` on bad messages."""
        ...

    def decode(self, token_ids: list[int]) -> str: ...

    def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        """Async generator of output deltas.

        May raise InvalidRequestError / ContextLengthExceededError / QueueFullError /
        EngineNotReadyError / EngineDeadError before or after the first item. The last item has
        ``finished=True``, ``finish_reason`` in stop|length|abort and ``spec`` set.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Stop the request and free its KV cache at once; a no-op for unknown or finished ids."""
        ...

    def health(self) -> EngineHealth: ...

    def stats(self) -> dict:
        """JSON-able counters: num_running, num_waiting, kv_used_blocks, kv_total_blocks,
        spec_decode_num_drafts, spec_decode_num_draft_tokens, spec_decode_num_accepted_tokens,
        spec_decode_num_accepted_tokens_per_pos (list), policy (dict)."""
        ...

    def policy_settings(self) -> dict: ...

    def update_policy(self, changes: dict) -> dict:
        """PATCH the speculation policy; raises a ValueError subclass naming the bad field."""
        ...


def build_engine(settings: GatewaySettings, progress: Callable[[str], None] | None = None) -> EngineClient:
    """Construct the real engine from settings. Imported lazily: the gateway imports without it.

    Blocking (loads weights); the app's lifespan runs it in a worker thread and reports each
    ``progress(step)`` call. If the engine has ``start()`` the lifespan awaits it, and ``shutdown()`` on exit.
    """
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

    config = EngineConfig(
        model=settings.model,
        draft_model=settings.draft_model,
        draft_quantization=settings.draft_quantization,
        device=settings.device,
        dtype=settings.dtype,
        max_running=settings.max_running,
        max_seq_len=settings.max_seq_len,
        max_waiting=settings.max_waiting,
        num_kv_blocks=settings.num_kv_blocks,
        speculation=settings.speculation,
        k=settings.spec_k,
        k_max=settings.k_max,
    )
    return AsyncEngine.from_config(config, model_name=settings.served_model_name, progress=progress)


async def maybe_call(obj: object, method: str) -> None:
    """Call an optional lifecycle hook (``start``/``shutdown``), sync or async, if the engine has it."""
    hook = getattr(obj, method, None)
    if hook is None:
        return
    result = hook()
    if inspect.isawaitable(result):
        await result
