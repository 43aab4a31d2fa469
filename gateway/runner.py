"""One API request in flight: its n engine requests, their merged outputs, and their bookkeeping.

A ``JobRunner`` starts one engine request per choice, each pumped by a task into one queue, so
choices interleave as the engine produces them. Around that it keeps the request record
(queued -> running -> finished/aborted/failed), one span per engine request, the latency metrics
and the token charge for rate limits. ``close()`` is the single exit: it aborts every unfinished
engine request (freeing its KV cache at once), and it completes even when the caller is cancelled
(a client disconnect cancels the stream), because the work runs in a shielded task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from opentelemetry import context as otel_context
from opentelemetry.trace import Span

from engine.types import ProposerStats, RequestOutput, SamplingParams, SpecStats, TokenLogprob
from gateway.auth import Principal
from gateway.engine_client import EngineClient
from gateway.errors import to_gateway_error
from gateway.protocol import Usage
from gateway.request_store import RequestRecord, RequestStatus
from gateway.state import GatewayState
from gateway.telemetry import end_engine_span, start_engine_span

logger = logging.getLogger(__name__)

Operation = Literal["chat", "text_completion"]
_DONE = object()


@dataclass(eq=False)
class Choice:
    index: int
    request_id: str  # the engine's id: "<job id>-<index>"
    prompt_token_ids: list[int]
    params: SamplingParams
    texts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    num_output_tokens: int = 0
    finish_reason: str | None = None
    spec: SpecStats | None = None
    first_token_at: float | None = None
    text_offset: int = 0  # characters of logprob tokens streamed so far (completions' text_offset)
    span: Span | None = None

    @property
    def text(self) -> str:
        return "".join(self.texts)


@dataclass(eq=False)
class Job:
    operation: Operation
    id: str
    model: str
    endpoint: str
    principal: Principal
    choices: list[Choice]
    num_prompt_tokens: int  # each distinct prompt once, as OpenAI counts with n > 1
    prompt: Any = None  # what the record keeps when store_prompts is on
    created: int = field(default_factory=lambda: int(time.time()))
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None

    @property
    def num_completion_tokens(self) -> int:
        return sum(c.num_output_tokens for c in self.choices)

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=self.num_completion_tokens,
            total_tokens=self.num_prompt_tokens + self.num_completion_tokens,
            speculation=merge_spec_stats([c.spec for c in self.choices]).to_dict(),
        )


def merge_spec_stats(stats: list[SpecStats | None]) -> SpecStats:
    """Sum per-choice speculation stats (the usage block reports the whole request)."""
    total = SpecStats()
    for spec in stats:
        if spec is None:
            continue
        total.num_plain_steps += spec.num_plain_steps
        for name, part in spec.by_proposer.items():
            into = total.by_proposer.setdefault(name, ProposerStats())
            into.rounds += part.rounds
            into.num_draft_tokens += part.num_draft_tokens
            into.num_accepted_tokens += part.num_accepted_tokens
            if len(into.accepted_per_pos) < len(part.accepted_per_pos):
                into.accepted_per_pos.extend([0] * (len(part.accepted_per_pos) - len(into.accepted_per_pos)))
            for pos, count in enumerate(part.accepted_per_pos):
                into.accepted_per_pos[pos] += count
    return total


class JobRunner:
    def __init__(self, state: GatewayState, engine: EngineClient, job: Job) -> None:
        self.state = state
        self.engine = engine
        self.job = job
        self._queue: asyncio.Queue[tuple[Choice, Any]] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._num_open = len(job.choices)
        self._pending_get: asyncio.Future | None = None
        self._closing: asyncio.Future | None = None
        self._parent_context = otel_context.get_current()
        self.record = RequestRecord(
            id=job.id, key_id=job.principal.key_id, model=job.model, endpoint=job.endpoint,
            num_choices=len(job.choices), prompt_tokens=job.num_prompt_tokens, replica=state.replica_id,
            prompt=job.prompt if state.settings.store_prompts else None,
        )

    async def start(self) -> None:
        await self.state.store.save(self.record)
        self.state.open_runners.add(self)
        for choice in self.job.choices:
            choice.span = start_engine_span(
                self.state.tracer, operation=self.job.operation, model=self.job.model, request_id=choice.request_id,
                index=choice.index, params=choice.params, num_prompt_tokens=len(choice.prompt_token_ids),
                parent=self._parent_context,
            )
            self._tasks.append(asyncio.create_task(self._pump(choice)))

    async def _pump(self, choice: Choice) -> None:
        try:
            async for output in self.engine.generate(choice.request_id, choice.prompt_token_ids, choice.params):
                self._queue.put_nowait((choice, output))
        except Exception as exc:
            self._queue.put_nowait((choice, exc))
        finally:
            self._queue.put_nowait((choice, _DONE))

    def interrupt(self, error: Exception) -> None:
        """Make the next ``next_output`` raise ``error`` (the server is stopping); ``close`` then aborts the rest."""
        self._queue.put_nowait((self.job.choices[0], error))

    async def next_output(self, timeout: float | None = None) -> tuple[Choice, RequestOutput] | None:
        """The next output of any choice, None once all are done; re-raises an engine error.

        On ``timeout`` raises TimeoutError without losing anything: the pending read is kept for the next call.
        """
        while self._num_open:
            choice, payload = await self._get(timeout)
            if payload is _DONE:
                self._num_open -= 1
                continue
            if isinstance(payload, BaseException):
                raise payload
            await self._observe(choice, payload)
            return choice, payload
        return None

    async def _get(self, timeout: float | None) -> tuple[Choice, Any]:
        if self._pending_get is None:
            self._pending_get = asyncio.ensure_future(self._queue.get())
        done, _ = await asyncio.wait({self._pending_get}, timeout=timeout)
        if not done:
            raise TimeoutError
        item, self._pending_get = self._pending_get.result(), None
        return item

    async def _observe(self, choice: Choice, output: RequestOutput) -> None:
        now = time.monotonic()
        if output.new_token_ids and choice.first_token_at is None:
            choice.first_token_at = now
            if choice.span is not None:
                choice.span.add_event("first_token", {"specserve.ttft_s": round(now - self.job.arrival, 6)})
            if self.job.first_token_at is None:
                await self._on_first_token(now)
        choice.texts.append(output.new_text)
        choice.num_output_tokens = output.num_output_tokens
        if output.logprobs:
            choice.logprobs.extend(output.logprobs)
        if output.finished:
            choice.finish_reason = output.finish_reason
            choice.spec = output.spec
            if choice.first_token_at is not None and choice.num_output_tokens > 1:
                tpot = (now - choice.first_token_at) / (choice.num_output_tokens - 1)
                self.state.metrics.time_per_output_token.observe(tpot)

    async def _on_first_token(self, now: float) -> None:
        self.job.first_token_at = now
        self.state.metrics.time_to_first_token.observe(now - self.job.arrival)
        self.record.status = "running"
        self.record.first_token_at = time.time()
        await self.state.store.save(self.record)

    async def close(self, error: BaseException | None = None) -> None:
        """Abort what is unfinished and write the final record, once; survives the caller's cancellation.

        Unfinished choices at close mean the client went away (status "aborted") unless ``error`` is given.
        """
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._finalize(error))
        await asyncio.shield(self._closing)

    async def _finalize(self, error: BaseException | None) -> None:
        self.state.open_runners.discard(self)
        unfinished = [c for c in self.job.choices if c.finish_reason is None]
        for choice in unfinished:
            try:
                await self.engine.abort(choice.request_id)
            except Exception:
                logger.exception("engine.abort(%s) failed", choice.request_id)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pending_get is not None:
            self._pending_get.cancel()
        status: RequestStatus = "finished"
        if error is not None:
            status = "failed"
        elif unfinished or any(c.finish_reason == "abort" for c in self.job.choices):
            status = "aborted"  # the client went away, or the engine aborted
        await self._write_final(status, error)

    async def _write_final(self, status: RequestStatus, error: BaseException | None) -> None:
        job, record, now = self.job, self.record, time.monotonic()
        usage = job.usage()
        record.status = status
        record.finished_at = time.time()
        record.completion_tokens = usage.completion_tokens
        record.finish_reasons = [c.finish_reason for c in job.choices]
        record.finish_reason = record.finish_reasons[0] if record.finish_reasons else None
        record.speculation = usage.speculation
        if error is not None:
            record.error = to_gateway_error(error).body()["error"]
        if self.state.settings.store_prompts:
            record.output = [c.text for c in job.choices]
        for choice in job.choices:
            if choice.span is not None:
                end_engine_span(choice.span, finish_reason=choice.finish_reason,
                                num_output_tokens=choice.num_output_tokens, spec=choice.spec, error=error)
        if status == "finished":
            self.state.metrics.e2e_latency.observe(now - job.arrival)
        await self.state.limiter.charge_tokens(job.principal.key_id, usage.total_tokens)
        await self.state.store.save(record)
