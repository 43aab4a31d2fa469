"""/v1/chat/completions and /v1/models through the app in-process, against FakeEngine."""

from __future__ import annotations

import httpx

from gateway.testing import FakeEngine
from tests.gateway.helpers import MODEL, chat_body, sse_payloads


async def test_chat_completion_has_openai_shape_and_speculation_usage(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat_body("hello world </s>"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL
    assert isinstance(body["created"], int)
    assert body["system_fingerprint"].startswith("fp_")
    assert body["choices"] == [{
        "index": 0, "message": {"role": "assistant", "content": "hello world", "refusal": None},
        "logprobs": None, "finish_reason": "stop",
    }]
    usage = body["usage"]
    assert usage["completion_tokens"] == 2
    assert usage["prompt_tokens"] == 6  # <s> <|user|> hello world </s> <|assistant|>
    assert usage["total_tokens"] == 8
    spec = usage["speculation"]
    assert set(spec) >= {"rounds", "drafted_tokens", "accepted_tokens", "acceptance_rate", "proposers"}
    assert spec["rounds"] >= 1


async def test_max_tokens_gives_length(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat_body("a b c", max_tokens=5))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == "a b c a b"
    r = await client.post("/v1/chat/completions", json=chat_body("a b c", max_tokens=50, max_completion_tokens=4))
    assert r.json()["usage"]["completion_tokens"] == 4  # max_completion_tokens wins


async def test_stop_string_and_ignore_eos(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat_body("one two three four", stop=["three"]))
    assert r.json()["choices"][0]["message"]["content"] == "one two "
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    r = await client.post("/v1/chat/completions", json=chat_body("one two </s>", ignore_eos=True, max_tokens=6))
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == 6


async def test_n_choices_are_separate_engine_requests_with_seed_offsets(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    body = chat_body("x", temperature=1.0, seed=7, n=3, max_tokens=8)
    r = await client.post("/v1/chat/completions", json=body)
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert [p.seed for _, _, p in engine.submitted] == [7, 8, 9]
    assert len({c["message"]["content"] for c in choices}) > 1
    usage = r.json()["usage"]
    assert usage["completion_tokens"] == 24
    assert usage["prompt_tokens"] == 4  # the prompt is counted once
    assert usage["speculation"]["rounds"] == engine.num_drafts  # summed over the choices


async def test_seed_reproduces(client: httpx.AsyncClient) -> None:
    body = chat_body("x", temperature=0.9, seed=1234, max_tokens=12)
    first = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
    again = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
    other = (await client.post("/v1/chat/completions", json={**body, "seed": 99})).json()
    assert first == again
    assert other["choices"][0]["message"]["content"] != first


async def test_logprobs_shape(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat_body("a b </s>", logprobs=True, top_logprobs=2))
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in content] == ["a", " b"]
    assert content[1]["bytes"] == list(b" b")
    assert len(content[0]["top_logprobs"]) == 2
    assert set(content[0]["top_logprobs"][0]) == {"token", "logprob", "bytes"}


async def test_speculation_override_reaches_the_engine(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    r = await client.post("/v1/chat/completions", json=chat_body("a b c", max_tokens=6, speculation={"mode": "off"}))
    spec = r.json()["usage"]["speculation"]
    assert spec["rounds"] == 0 and spec["plain_decode_steps"] == 6
    await client.post("/v1/chat/completions", json=chat_body("a b c", speculation={"mode": "ngram", "max_k": 2}))
    params = engine.submitted[-1][2]
    assert params.speculation.mode == "ngram" and params.speculation.max_k == 2


async def test_stream_chunks_roles_content_finish_and_done(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat_body("a b c d e f </s>", stream=True))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_payloads(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert all("usage" not in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "a b c d e f"
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}


async def test_stream_include_usage_puts_usage_on_a_final_chunk(client: httpx.AsyncClient) -> None:
    body = chat_body("a b c </s>", stream=True, stream_options={"include_usage": True}, n=2)
    chunks = sse_payloads((await client.post("/v1/chat/completions", json=body)).text)[:-1]
    assert all(c["usage"] is None for c in chunks[:-1])
    final = chunks[-1]
    assert final["choices"] == []
    assert final["usage"]["completion_tokens"] == 6
    assert final["usage"]["speculation"]["rounds"] >= 2
    assert {c["choices"][0]["index"] for c in chunks[:-1]} == {0, 1}
    finishes = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["finish_reason"]]
    assert sorted(f["index"] for f in finishes) == [0, 1]


async def test_models(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/models")
    assert r.json()["object"] == "list"
    assert [m["id"] for m in r.json()["data"]] == [MODEL]
    assert (await client.get(f"/v1/models/{MODEL}")).json()["object"] == "model"
    missing = await client.get("/v1/models/gpt-4")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
