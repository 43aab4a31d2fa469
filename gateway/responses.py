"""A job's state -> OpenAI response bodies (non-streaming) and chunks (streaming), for both APIs."""

from __future__ import annotations

from typing import Any, Protocol

from engine.types import RequestOutput, TokenLogprob
from gateway.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatResponseMessage,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
)
from gateway.runner import Choice, Job


class ResponseFormat(Protocol):
    include_usage: bool  # streaming: every chunk carries "usage" (null until the final usage chunk)

    def response(self) -> dict[str, Any]: ...

    def opening_chunks(self) -> list[dict[str, Any]]: ...

    def output_chunks(self, choice: Choice, output: RequestOutput) -> list[dict[str, Any]]: ...

    def usage_chunk(self) -> dict[str, Any]: ...


def _chat_token(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def chat_logprobs(logprobs: list[TokenLogprob], num_top: int) -> ChatLogprobs:
    return ChatLogprobs(content=[
        {**_chat_token(lp.token, lp.logprob), "top_logprobs": [_chat_token(t, v) for _, t, v in lp.top[:num_top]]}
        for lp in logprobs
    ])


def completion_logprobs(logprobs: list[TokenLogprob], num_top: int, start_offset: int) -> CompletionLogprobs:
    offsets, offset = [], start_offset
    for lp in logprobs:
        offsets.append(offset)
        offset += len(lp.token)
    return CompletionLogprobs(
        tokens=[lp.token for lp in logprobs],
        token_logprobs=[lp.logprob for lp in logprobs],
        top_logprobs=[{t: v for _, t, v in lp.top[:num_top]} for lp in logprobs],
        text_offset=offsets,
    )


class _Format:
    def __init__(self, job: Job, fingerprint: str, include_usage: bool) -> None:
        self.job = job
        self.fingerprint = fingerprint
        self.include_usage = include_usage

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.job.id, "object": obj, "created": self.job.created, "model": self.job.model,
                "system_fingerprint": self.fingerprint}

    def _chunk_dump(self, chunk: Any) -> dict[str, Any]:
        data = chunk.model_dump()
        if not self.include_usage:
            data.pop("usage", None)
        return data


class ChatFormat(_Format):
    def __init__(self, job: Job, fingerprint: str, include_usage: bool, num_top_logprobs: int | None) -> None:
        super().__init__(job, fingerprint, include_usage)
        self.num_top_logprobs = num_top_logprobs  # None: logprobs off

    def _logprobs(self, logprobs: list[TokenLogprob] | None) -> ChatLogprobs | None:
        if self.num_top_logprobs is None:
            return None
        return chat_logprobs(logprobs or [], self.num_top_logprobs)

    def response(self) -> dict[str, Any]:
        choices = [
            ChatChoice(index=c.index, message=ChatResponseMessage(content=c.text),
                       logprobs=self._logprobs(c.logprobs), finish_reason=c.finish_reason)
            for c in self.job.choices
        ]
        body = ChatCompletionResponse(**self._envelope("chat.completion"), choices=choices, usage=self.job.usage())
        return body.model_dump()

    def _chunk(self, choice: ChatChunkChoice | None) -> dict[str, Any]:
        chunk = ChatCompletionChunk(**self._envelope("chat.completion.chunk"), choices=[choice] if choice else [])
        data = self._chunk_dump(chunk)
        for item in data["choices"]:
            item["delta"] = {k: v for k, v in item["delta"].items() if v is not None}
        return data

    def opening_chunks(self) -> list[dict[str, Any]]:
        return [self._chunk(ChatChunkChoice(index=c.index, delta=ChatDelta(role="assistant", content="")))
                for c in self.job.choices]

    def output_chunks(self, choice: Choice, output: RequestOutput) -> list[dict[str, Any]]:
        chunks = []
        if output.new_text or output.logprobs:
            chunks.append(self._chunk(ChatChunkChoice(
                index=choice.index, delta=ChatDelta(content=output.new_text), logprobs=self._logprobs(output.logprobs),
            )))
        if output.finished:
            chunks.append(self._chunk(ChatChunkChoice(index=choice.index, delta=ChatDelta(),
                                                      finish_reason=choice.finish_reason)))
        return chunks

    def usage_chunk(self) -> dict[str, Any]:
        data = self._chunk(None)
        data["usage"] = self.job.usage().model_dump()
        return data


class CompletionFormat(_Format):
    def __init__(self, job: Job, fingerprint: str, include_usage: bool, num_logprobs: int | None) -> None:
        super().__init__(job, fingerprint, include_usage)
        self.num_logprobs = num_logprobs  # None: logprobs off

    def _logprobs(self, logprobs: list[TokenLogprob] | None, start_offset: int) -> CompletionLogprobs | None:
        if self.num_logprobs is None:
            return None
        return completion_logprobs(logprobs or [], self.num_logprobs, start_offset)

    def response(self) -> dict[str, Any]:
        choices = [
            CompletionChoice(index=c.index, text=c.text, logprobs=self._logprobs(c.logprobs, 0),
                             finish_reason=c.finish_reason)
            for c in self.job.choices
        ]
        body = CompletionResponse(**self._envelope("text_completion"), choices=choices, usage=self.job.usage())
        return body.model_dump()

    def opening_chunks(self) -> list[dict[str, Any]]:
        return []

    def output_chunks(self, choice: Choice, output: RequestOutput) -> list[dict[str, Any]]:
        if not (output.new_text or output.logprobs or output.finished):
            return []
        logprobs = self._logprobs(output.logprobs, choice.text_offset)
        if logprobs is not None:
            choice.text_offset += sum(len(t) for t in logprobs.tokens)
        item = CompletionChoice(index=choice.index, text=output.new_text, logprobs=logprobs,
                                finish_reason=choice.finish_reason if output.finished else None)
        return [self._chunk_dump(CompletionResponse(**self._envelope("text_completion"), choices=[item]))]

    def usage_chunk(self) -> dict[str, Any]:
        data = self._chunk_dump(CompletionResponse(**self._envelope("text_completion"), choices=[]))
        data["usage"] = self.job.usage().model_dump()
        return data
