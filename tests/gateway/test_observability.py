"""OpenTelemetry spans (InMemorySpanExporter) and /metrics (parsed with prometheus_client)."""

from __future__ import annotations

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from gateway.testing import FakeEngine
from tests.gateway.helpers import MODEL, chat_body, completion_body


def metrics_by_name(text: str) -> dict[str, list]:
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    matching = [s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert matching, f"no sample {name}{labels}"
    return matching[0]


async def test_engine_request_spans_are_children_of_the_http_span(
    client: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    r = await client.post("/v1/chat/completions", json=chat_body("a b c </s>", n=2, max_tokens=9))
    spans = exporter.get_finished_spans()
    server = [s for s in spans if s.kind == SpanKind.SERVER]
    engine_spans = [s for s in spans if s.name == f"chat {MODEL}"]
    assert len(server) == 1 and len(engine_spans) == 2
    for span in engine_spans:
        assert span.parent is not None and span.parent.span_id == server[0].context.span_id
        attrs = span.attributes
        assert attrs["gen_ai.system"] == "specserve"
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == MODEL
        assert attrs["gen_ai.request.max_tokens"] == 9
        assert attrs["gen_ai.request.temperature"] == 0.0
        assert tuple(attrs["gen_ai.response.finish_reasons"]) == ("stop",)
        assert attrs["gen_ai.usage.input_tokens"] == 7
        assert attrs["gen_ai.usage.output_tokens"] == 3
        assert attrs["specserve.spec.rounds"] >= 1
        assert 0.0 <= attrs["specserve.spec.acceptance_rate"] <= 1.0
        assert [e.name for e in span.events] == ["queued", "first_token", "speculation"]
        speculation = span.events[-1].attributes
        assert speculation["draft.rounds"] == attrs["specserve.spec.rounds"]
    assert {s.attributes["gen_ai.response.id"] for s in engine_spans} == {f"{r.json()['id']}-0", f"{r.json()['id']}-1"}


async def test_failed_engine_request_span_has_error_status(
    client: httpx.AsyncClient, engine: FakeEngine, exporter: InMemorySpanExporter
) -> None:
    engine.fail_after_outputs = 1
    await client.post("/v1/completions", json=completion_body("a b c d e f g h", max_tokens=40))
    (span,) = [s for s in exporter.get_finished_spans() if s.name == f"text_completion {MODEL}"]
    assert span.status.status_code == StatusCode.ERROR


async def test_health_endpoints_are_not_traced(client: httpx.AsyncClient, exporter: InMemorySpanExporter) -> None:
    for path in ("/health", "/ready", "/metrics"):
        assert (await client.get(path)).status_code == 200
    assert exporter.get_finished_spans() == ()


async def test_metrics_exposition(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    await client.post("/v1/chat/completions", json=chat_body("a b c d e f </s>"))
    await client.post("/v1/completions", json=completion_body("a b c", max_tokens=5, n=2))
    await client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    r = await client.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    m = metrics_by_name(r.text)
    assert value(m, "specserve_requests_total", endpoint="/v1/chat/completions", status="200") == 1
    assert value(m, "specserve_requests_total", endpoint="/v1/completions", status="200") == 1
    assert value(m, "specserve_requests_total", endpoint="/v1/completions", status="404") == 1
    assert value(m, "specserve_time_to_first_token_seconds_count") == 2
    assert value(m, "specserve_e2e_request_latency_seconds_count") == 2
    assert value(m, "specserve_time_per_output_token_seconds_count") == 3  # one per choice
    assert value(m, "specserve:num_requests_running") == 0
    assert value(m, "specserve:num_requests_waiting") == 0
    assert value(m, "specserve:kv_cache_usage_perc") == 0
    # engine counters are read from EngineClient.stats() at scrape time
    assert value(m, "specserve:spec_decode_num_drafts_total") == engine.num_drafts > 0
    assert value(m, "specserve:spec_decode_num_draft_tokens_total") == engine.num_draft_tokens
    assert value(m, "specserve:spec_decode_num_accepted_tokens_total") == engine.num_accepted_tokens
    per_pos = {s.labels["position"]: s.value for s in m["specserve:spec_decode_num_accepted_tokens_per_pos_total"]}
    assert per_pos["0"] == engine.accepted_per_pos[0]
    assert sum(per_pos.values()) == engine.num_accepted_tokens
    # the policy's cost model against the clock, per kind of step and batch-size bucket
    ratio = "specserve:policy_cost_measured_over_predicted"
    assert value(m, ratio, kind="plain", batch_sizes="5-8") == 1.0
    assert value(m, ratio, kind="verify", batch_sizes="5-8") == 1.12
    assert {s.labels["kind"] for s in m[ratio]} == {"plain", "verify"}
    # why request-steps decoded plainly
    assert value(m, "specserve:policy_plain_request_steps_total", cause="capped") == engine.num_drafts
    assert value(m, "specserve:policy_plain_request_steps_total", cause="plan") == 3


async def test_kv_usage_gauge_reads_the_engine(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.kv_used_slots, engine.num_running, engine.num_waiting = 2, 2, 5
    m = metrics_by_name((await client.get("/metrics")).text)
    assert value(m, "specserve:kv_cache_usage_perc") == 2 / engine.max_running
    assert value(m, "specserve:num_requests_waiting") == 5
    engine.kv_used_slots, engine.num_running, engine.num_waiting = 0, 0, 0
