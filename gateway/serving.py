"""OpenAI request -> engine requests -> OpenAI response, for chat and text completions.

Validation that needs the tokenizer (chat template, context length) happens here, before any
engine request starts, so a bad request never reaches the scheduler.
"""

from __future__ import annotations

import asyncio
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from gateway.auth import Principal
from gateway.engine_client import EngineClient
from gateway.errors import BadRequestError, ModelNotFoundError, context_length_error
from gateway.protocol import ChatCompletionRequest, CompletionRequest
from gateway.responses import ChatFormat, CompletionFormat, ResponseFormat
from gateway.runner import Choice, Job, JobRunner
from gateway.state import GatewayState
from gateway.streaming import start_stream

CLIENT_CLOSED_REQUEST = 499  # nginx's convention; only metrics ever see it


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def check_model(engine: EngineClient, model: str) -> None:
    if model != engine.model_name:
        raise ModelNotFoundError(f"The model `{model}` does not exist or you do not have access to it.", param="model")


def resolve_max_tokens(max_model_len: int, num_prompt: int, requested: int | None, param: str) -> int:
    """The completion budget: as requested if it fits, else OpenAI's context-length error; absent = the rest."""
    if requested is None:
        if num_prompt >= max_model_len:
            raise context_length_error(max_model_len, num_prompt, 0, param)
        return max_model_len - num_prompt
    if num_prompt + requested > max_model_len:
        raise context_length_error(max_model_len, num_prompt, requested, param)
    return requested


async def chat_completion(
    state: GatewayState, body: ChatCompletionRequest, principal: Principal, request: Request
) -> Response:
    engine = state.serving_engine()
    check_model(engine, body.model)
    body.check_stream_options()
    messages = [m.to_template_dict(i) for i, m in enumerate(body.messages)]
    prompt_ids = engine.apply_chat_template(messages)
    max_tokens = resolve_max_tokens(engine.max_model_len, len(prompt_ids), body.requested_max_tokens, "messages")
    num_logprobs = body.num_logprobs
    job_id = new_id("chatcmpl")
    choices = [Choice(i, f"{job_id}-{i}", prompt_ids, body.sampling_params(max_tokens, i, num_logprobs))
               for i in range(body.num_choices)]
    job = Job("chat", job_id, engine.model_name, "/v1/chat/completions", principal, choices,
              num_prompt_tokens=len(prompt_ids), prompt=messages)
    fmt = ChatFormat(job, state.system_fingerprint, body.include_usage, num_logprobs)
    return await _run(state, engine, job, fmt, request, stream=bool(body.stream))


async def completion(state: GatewayState, body: CompletionRequest, principal: Principal, request: Request) -> Response:
    engine = state.serving_engine()
    check_model(engine, body.model)
    body.check_stream_options()
    if body.echo:
        raise BadRequestError("'echo' is not supported.", param="echo")
    job_id, n = new_id("cmpl"), body.num_choices
    choices: list[Choice] = []
    num_prompt_tokens = 0
    prompts = body.prompts()
    for p, prompt in enumerate(prompts):
        prompt_ids = engine.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids:
            raise BadRequestError("'prompt' must not be empty.", param="prompt")
        max_tokens = resolve_max_tokens(engine.max_model_len, len(prompt_ids), body.max_tokens, "prompt")
        num_prompt_tokens += len(prompt_ids)
        choices += [Choice(p * n + i, f"{job_id}-{p * n + i}", prompt_ids,
                           body.sampling_params(max_tokens, p * n + i, body.logprobs)) for i in range(n)]
    job = Job("text_completion", job_id, engine.model_name, "/v1/completions", principal, choices,
              num_prompt_tokens=num_prompt_tokens, prompt=prompts)
    fmt = CompletionFormat(job, state.system_fingerprint, body.include_usage, body.logprobs)
    return await _run(state, engine, job, fmt, request, stream=bool(body.stream))


async def _run(
    state: GatewayState, engine: EngineClient, job: Job, fmt: ResponseFormat, request: Request, *, stream: bool
) -> Response:
    runner = JobRunner(state, engine, job)
    if stream:
        return await start_stream(runner, fmt, state.settings)
    return await _complete(runner, fmt, request)


async def _complete(runner: JobRunner, fmt: ResponseFormat, request: Request) -> Response:
    """Collect every output; if the client disconnects first, abort instead of finishing unheard."""
    await runner.start()
    collect = asyncio.ensure_future(_collect(runner))
    disconnect = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({collect, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        if collect not in done:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        error = collect.exception()
        await runner.close(error=error)
        if error is not None:
            raise error
        return JSONResponse(fmt.response())
    finally:
        collect.cancel()
        disconnect.cancel()
        await runner.close()  # a no-op unless we are leaving early (disconnect or cancellation)


async def _collect(runner: JobRunner) -> None:
    while await runner.next_output() is not None:
        pass


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
