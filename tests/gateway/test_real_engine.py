"""The gateway in-process (httpx ASGITransport) on the real AsyncEngine and the bundled pair, not the fake:
chat and completions, streaming and not, the speculation usage block, spans and /metrics from the engine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.conftest import DRAFT, TARGET
from tests.gateway.helpers import MODEL, open_client, sse_payloads


@pytest.fixture(scope="module")
def real_engine() -> Iterator[AsyncEngine]:
    engine = AsyncEngine.from_config(EngineConfig(model=str(TARGET), draft_model=str(DRAFT), device="cpu",
                                                  max_seq_len=256, max_running=8), model_name=MODEL)
    yield engine
    engine.shutdown()


async def test_chat_and_completions_on_the_real_engine(real_engine: AsyncEngine) -> None:
    exporter = InMemorySpanExporter()
    app = create_app(GatewaySettings(), engine=real_engine, span_exporter=exporter)
    async with open_client(app) as client:
        chat = await client.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "Return the larger of two numbers."}],
            "max_tokens": 24, "temperature": 0, "speculation": {"mode": "draft", "max_k": 4}})
        assert chat.status_code == 200, chat.text
        body = chat.json()
        assert body["id"].startswith("chatcmpl-") and body["choices"][0]["message"]["content"]
        speculation = body["usage"]["speculation"]
        assert speculation["drafted_tokens"] > 0 and speculation["proposers"]["draft"]["rounds"] > 0

        streamed = await client.post("/v1/completions", json={
            "model": MODEL, "prompt": "def parse(text):", "max_tokens": 16, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}})
        events = sse_payloads(streamed.text)
        assert events[-1] == "[DONE]"
        text = "".join(e["choices"][0]["text"] for e in events[:-1] if isinstance(e, dict) and e["choices"])
        plain = await client.post("/v1/completions", json={
            "model": MODEL, "prompt": "def parse(text):", "max_tokens": 16, "temperature": 0,
            "speculation": {"mode": "off"}})
        assert text == plain.json()["choices"][0]["text"]  # greedy: the same text with and without speculation
        assert events[-2]["usage"]["completion_tokens"] == 16

        metrics = {f.name: f for f in text_string_to_metric_families((await client.get("/metrics")).text)}
    drafts = metrics["specserve:spec_decode_num_drafts"].samples[0].value
    assert drafts == real_engine.stats()["spec_decode_num_drafts"] > 0
    assert real_engine.health().kv_used_blocks == 0
    engine_spans = [s for s in exporter.get_finished_spans() if s.name == f"chat {MODEL}"]
    assert engine_spans and engine_spans[0].attributes["gen_ai.usage.output_tokens"] > 0
