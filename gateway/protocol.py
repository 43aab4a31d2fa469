"""OpenAI wire models, ordered as in OpenAI's API reference, and the conversion to engine params.

Requests ignore unknown fields (as OpenAI's server does) but type-check known ones strictly: a string
where an integer belongs is a 400, not a silent coercion. Text must be valid Unicode: a lone surrogate
(JSON's ``"\\ud800"``, or raw bytes that ``json.loads`` decodes with surrogatepass) is a 400, since the
tokenizer and the UTF-8 response encoder would otherwise fail on it with a 500.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

from engine.types import SamplingParams, SpeculationOverride
from gateway.errors import BadRequestError

PositiveInt = Annotated[int, Field(strict=True, ge=1)]
ChoiceCount = Annotated[int, Field(strict=True, ge=1, le=128)]
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @field_validator("*")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        texts = (value,) if isinstance(value, str) else value if isinstance(value, list) else ()
        if any(isinstance(t, str) and not t.isascii() and _LONE_SURROGATE.search(t) for t in texts):
            raise ValueError("must be valid Unicode text (it contains a lone surrogate such as \\ud800)")
        return value


class StreamOptions(_Wire):
    include_usage: StrictBool = False


class SpeculationOptions(_Wire):
    """specserve's extra: a request's say in speculative decoding."""

    mode: Literal["auto", "off", "draft", "ngram"] = "auto"
    max_k: Annotated[int, Field(strict=True, ge=0, le=64)] | None = None


class _SamplingRequest(_Wire):
    """Fields shared by chat and text completions (OpenAI's plus specserve's extras)."""

    model: StrictStr
    frequency_penalty: StrictFloat | None = None
    n: ChoiceCount | None = None
    presence_penalty: StrictFloat | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    user: StrictStr | None = None
    # extras (vLLM-compatible names)
    top_k: StrictInt | None = None
    min_p: StrictFloat | None = None
    ignore_eos: StrictBool | None = False
    speculation: SpeculationOptions | None = None

    @property
    def num_choices(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise BadRequestError("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                                  param="stream_options")

    def sampling_params(self, max_tokens: int, index: int, logprobs: int | None) -> SamplingParams:
        """Engine params for choice ``index``: with a seed, choice i samples with seed + i."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        speculation = None
        if self.speculation is not None:
            speculation = SpeculationOverride(mode=self.speculation.mode, max_k=self.speculation.max_k)
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else float(self.temperature),
            top_p=1.0 if self.top_p is None else float(self.top_p),
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            seed=None if self.seed is None else self.seed + index,
            stop=stop,
            ignore_eos=bool(self.ignore_eos),
            logprobs=logprobs,
            speculation=speculation,
        )


class TextContentPart(_Wire):
    type: StrictStr
    text: StrictStr | None = None


class ChatMessage(_Wire):
    role: StrictStr
    content: StrictStr | list[TextContentPart] | None = None
    name: StrictStr | None = None

    def to_template_dict(self, index: int) -> dict[str, Any]:
        """The message as the chat template wants it: content flattened to text."""
        content = self.content
        if isinstance(content, list):
            if any(part.type != "text" or part.text is None for part in content):
                raise BadRequestError("Only text content parts are supported.", param=f"messages[{index}].content")
            content = "".join(part.text or "" for part in content)
        message: dict[str, Any] = {"role": self.role, "content": content if content is not None else ""}
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    logprobs: StrictBool | None = False
    top_logprobs: Annotated[int, Field(strict=True, ge=0, le=20)] | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise BadRequestError("'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_SamplingRequest):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    echo: StrictBool | None = False
    logprobs: Annotated[int, Field(strict=True, ge=0, le=20)] | None = None
    max_tokens: PositiveInt | None = 16

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a batch: a string, a list of strings, token ids or a list of token-id lists."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise BadRequestError("'prompt' must not be empty.", param="prompt")
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


# ---- responses ---------------------------------------------------------------------------------


class Usage(_Wire):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    speculation: dict[str, Any] | None = None


class ChatLogprobs(_Wire):
    content: list[dict[str, Any]] | None = None
    refusal: list[dict[str, Any]] | None = None


class ChatResponseMessage(_Wire):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None


class ChatChoice(_Wire):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(_Wire):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChatDelta(_Wire):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Wire):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Wire):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(_Wire):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(_Wire):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(_Wire):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ModelCard(_Wire):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specserve"
    max_model_len: int | None = None


class ModelList(_Wire):
    object: Literal["list"] = "list"
    data: list[ModelCard]
