"""/v1/completions: prompt forms, n, logprobs, streaming."""

from __future__ import annotations

import httpx

from gateway.testing import FakeEngine
from tests.gateway.helpers import completion_body, sse_payloads


async def test_text_completion_shape(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json=completion_body("one two three </s>"))
    body = r.json()
    assert r.status_code == 200
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert body["choices"] == [{"index": 0, "text": "one two three", "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"]["prompt_tokens"] == 5 and body["usage"]["completion_tokens"] == 3


async def test_default_max_tokens_is_16(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json=completion_body("a b"))
    assert r.json()["usage"]["completion_tokens"] == 16
    assert r.json()["choices"][0]["finish_reason"] == "length"


async def test_prompt_batches_and_token_ids(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    r = await client.post("/v1/completions", json=completion_body(["a </s>", "b c </s>"], n=2))
    choices = r.json()["choices"]
    assert [(c["index"], c["text"]) for c in choices] == [(0, "a"), (1, "a"), (2, "b c"), (3, "b c")]
    assert r.json()["usage"]["prompt_tokens"] == 3 + 4
    ids = engine.encode("x y </s>")
    r = await client.post("/v1/completions", json=completion_body(ids))
    assert r.json()["choices"][0]["text"] == "x y"
    r = await client.post("/v1/completions", json=completion_body([ids, ids[:2]], max_tokens=3))
    assert [c["text"] for c in r.json()["choices"]] == ["x y", "x x x"]


async def test_token_ids_out_of_vocab_are_400(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json=completion_body([1, 10_000_000]))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt"


async def test_completion_logprobs(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json=completion_body("a bb </s>", logprobs=2))
    logprobs = r.json()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["a", " bb"]
    assert logprobs["text_offset"] == [0, 1]
    assert len(logprobs["token_logprobs"]) == 2
    assert all(len(top) == 2 for top in logprobs["top_logprobs"])


async def test_completion_stream_with_usage(client: httpx.AsyncClient) -> None:
    body = completion_body("a b c d e f g h </s>", stream=True, stream_options={"include_usage": True}, logprobs=1)
    events = sse_payloads((await client.post("/v1/completions", json=body)).text)
    assert events[-1] == "[DONE]"
    chunks, final = events[:-2], events[-2]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "a b c d e f g h"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    offsets = [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 8


async def test_echo_is_refused(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json=completion_body("a", echo=True))
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"
