"""The asyncio bridge: the engine loop runs in its own thread; each request has an output queue.

Commands (add, abort) cross into the loop thread through a queue and take effect between
steps; outputs cross back with ``loop.call_soon_threadsafe``. If a step raises, every
request in flight gets the error (nothing hangs) and the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.errors import EngineDeadError, EngineError, EngineNotReadyError
from engine.models.tokenizer import apply_chat_template
from engine.types import EngineHealth, RequestOutput, SamplingParams

log = logging.getLogger("specserve.engine")


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue

    def put(self, item: RequestOutput | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class AsyncEngine:
    """``generate()`` yields ``RequestOutput`` deltas; ``abort()`` frees the request's cache at once."""

    def __init__(self, engine: LLMEngine, model_name: str | None = None) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = model_name or engine.model_path.name
        self.max_model_len = engine.max_seq_len
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self._streams: dict[str, _Stream] = {}
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="specserve-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig, model_name: str | None = None, progress=None) -> AsyncEngine:
        engine = LLMEngine(config, progress=progress)
        engine.warm_up()
        return cls(engine, model_name)

    # ------------------------------------------------------------------ client side

    def encode(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return apply_chat_template(self.tokenizer, messages)

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        if self._stopped or not self._thread.is_alive():
            raise EngineNotReadyError("the engine is stopped")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        added: asyncio.Future = stream.loop.create_future()

        def add() -> None:
            try:
                self.engine.add_request(request_id, prompt_token_ids, params)
            except Exception as exc:  # noqa: BLE001 - any failure goes to the caller, who must not wait forever
                stream.loop.call_soon_threadsafe(_resolve, added, exc)
                return
            self._streams[request_id] = stream
            stream.loop.call_soon_threadsafe(_resolve, added, None)

        self._submit(add)
        try:
            error = await added
        except asyncio.CancelledError:
            def drop() -> None:  # queued after add(): abort the request if add() registered it for this stream
                if self._streams.get(request_id) is stream:
                    del self._streams[request_id]
                    self.engine.abort(request_id)

            self._submit(drop)  # the consumer left before the loop accepted the request: don't run it orphaned
            raise
        if error is not None:
            raise error
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:  # the consumer went away (disconnect, cancellation): free the request now
                await self.abort(request_id)

    async def abort(self, request_id: str) -> None:
        if not self._thread.is_alive():
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def abort() -> None:
            self._streams.pop(request_id, None)
            self.engine.abort(request_id)
            loop.call_soon_threadsafe(_resolve, done, None)

        self._submit(abort)
        await done

    def health(self) -> EngineHealth:
        h = self.engine.health()
        alive = self._thread.is_alive() and not self._stopped
        return EngineHealth(alive, alive, h.num_running, h.num_waiting, h.kv_used_blocks, h.kv_total_blocks)

    def stats(self) -> dict:
        return self.engine.snapshot()

    def policy_settings(self) -> dict:
        return self.engine.policy.settings.to_dict()

    def update_policy(self, changes: dict) -> dict:
        """Validated now (raises PolicySettingsError); applied by the loop between two steps."""
        settings = self.engine.policy.update(changes)
        self._wake.set()
        return settings.to_dict()

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------ loop thread

    def _submit(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped:
            self._drain_commands()
            self.engine.policy.apply_pending()  # also when idle, so a settings change shows at once
            if not self.engine.has_work():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # noqa: BLE001 - one bad step must not kill the server
                log.exception("engine step failed; failing the requests in flight")
                self._fail_all(EngineDeadError(f"engine step failed: {exc.__class__.__name__}: {exc}"))
                continue
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    stream.put(out)
                    if out.finished:
                        del self._streams[out.request_id]
        self._fail_all(EngineNotReadyError("the engine is shutting down"))

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                command()
            except Exception:  # noqa: BLE001 - a failing command must not stop the loop
                log.exception("engine command failed")

    def _fail_all(self, error: EngineError) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)
