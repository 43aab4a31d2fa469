"""Bad input: hostile bodies against the real server, and schemathesis against the public API in-process.

Nothing may get a 5xx or take the server down; each case gets a clear 4xx.
"""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.testing import FakeEngine
from tests.gateway.helpers import open_client
from tests.reliability.harness import MODEL, Target, auth
from tests.reliability.hostile import FuzzReport, bad_input_cases, bound_cost, fuzz_public_api, run_bad_input

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

CI_MAX_EXAMPLES = 40  # per operation and generation mode; scripts/reliability.py runs more
CASES = {case.name: case for case in bad_input_cases()}


@pytest.mark.parametrize("name", list(CASES))
async def test_hostile_body_gets_a_clear_4xx(target: Target, name: str) -> None:
    _, [outcome] = await run_bad_input(target, [CASES[name]])
    assert outcome.passed, (name, outcome.status, outcome.code)
    async with httpx.AsyncClient(base_url=target.url, timeout=10) as http:
        assert (await http.get("/health")).status_code == 200


async def test_oversized_body_is_refused_with_413(target: Target) -> None:
    body = json.dumps({"model": MODEL, "prompt": "hello " * (10 * 1024 * 1024 // 6)}).encode()
    async with httpx.AsyncClient(base_url=target.url, timeout=120) as http:
        response = await http.post("/v1/completions", content=body,
                                   headers={**auth(target.api_key), "Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [
    b'{"model": "specserve-tiny", "prompt": "\\ud800", "max_tokens": 2}',
    b'{"model": "specserve-tiny\\udfff", "prompt": "Hi", "max_tokens": 2}',
    b'{"model": "specserve-tiny", "prompt": "Hi", "stop": ["\\ud800"], "max_tokens": 2}',
    b'{"model": "specserve-tiny", "prompt": "caf\xed\xa0\x80", "max_tokens": 2}',  # raw bytes of U+D800
])
async def test_lone_surrogate_text_is_a_400_not_a_500(body: bytes) -> None:
    """Regression: a lone surrogate reached the tokenizer (TypeError) or the UTF-8 error renderer -> 500."""
    async with open_client(create_app(GatewaySettings(), FakeEngine())) as client:
        response = await client.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert "lone surrogate" in response.json()["error"]["message"]


@pytest.mark.parametrize(("body", "message"), [
    (b'{"prompt": "Hi"}', "Missing required parameter: 'model'."),
    (b'{"model": 5, "prompt": "Hi"}', "Invalid type for 'model': expected a string, but got an integer instead."),
])
async def test_a_bad_model_field_is_named_in_the_error(body: bytes, message: str) -> None:
    """Regression: "model" doubles as a pydantic union tag, so its errors said "The request body must be a JSON
    object." (and no param)."""
    async with open_client(create_app(GatewaySettings(), FakeEngine())) as client:
        response = await client.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == message and response.json()["error"]["param"] == "model"


def test_schemathesis_finds_no_server_error_on_the_public_api() -> None:
    schemathesis = pytest.importorskip("schemathesis", minversion="4")

    app = create_app(GatewaySettings(), FakeEngine(max_model_len=256))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    report: FuzzReport = fuzz_public_api(schema, max_examples=CI_MAX_EXAMPLES, call=lambda case: case.call(),
                                         prepare=lambda case: bound_cost(case.body, max_tokens=64, max_n=8))
    assert not report.failures, "\n".join(report.failures)
    assert len(report.per_operation) >= 8, report.per_operation  # chat, completions, models x2, requests, health...
    assert report.statuses[200] > 0 and report.num_examples > 100, report.statuses
