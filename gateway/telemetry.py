"""OpenTelemetry: a per-app tracer provider and the GenAI-convention span of each engine request.

The provider is never installed globally, so several apps (tests, replicas in one process) do not
share exporters. The HTTP server span comes from the FastAPI instrumentation; each engine request
(one per choice) gets a child span with ``gen_ai.*`` attributes and the events "queued",
"first_token" and "speculation".
"""

from __future__ import annotations

from fastapi import FastAPI
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from engine.types import SamplingParams, SpecStats
from gateway.settings import GatewaySettings

GEN_AI_SYSTEM = "specserve"
UNTRACED_URLS = "/health,/ready,/metrics"


def build_tracer_provider(settings: GatewaySettings, span_exporter: SpanExporter | None = None) -> TracerProvider:
    """Spans go to ``span_exporter`` (tests), else to OTLP/HTTP when an endpoint is set, else nowhere."""
    provider = TracerProvider(resource=Resource.create({"service.name": "specserve"}))
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    elif settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = settings.otlp_endpoint.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def instrument_app(app: FastAPI, provider: TracerProvider) -> None:
    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=provider,
        meter_provider=NoOpMeterProvider(),
        excluded_urls=UNTRACED_URLS,
        exclude_spans=["receive", "send"],
    )


def start_engine_span(
    tracer: Tracer, *, operation: str, model: str, request_id: str, index: int, params: SamplingParams,
    num_prompt_tokens: int, parent: otel_context.Context,
) -> Span:
    span = tracer.start_span(
        f"{operation} {model}",
        context=parent,
        kind=SpanKind.INTERNAL,
        attributes={
            "gen_ai.system": GEN_AI_SYSTEM,
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": params.max_tokens,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.request.top_p": params.top_p,
            "gen_ai.response.id": request_id,
            "specserve.choice.index": index,
            "specserve.speculation.mode": params.speculation.mode if params.speculation else "auto",
            "gen_ai.usage.input_tokens": num_prompt_tokens,
        },
    )
    span.add_event("queued")
    return span


def end_engine_span(
    span: Span, *, finish_reason: str | None, num_output_tokens: int, spec: SpecStats | None,
    error: BaseException | None = None,
) -> None:
    span.set_attribute("gen_ai.response.finish_reasons", [finish_reason or "abort"])
    span.set_attribute("gen_ai.usage.output_tokens", num_output_tokens)
    if spec is not None:
        span.set_attributes({
            "specserve.spec.rounds": spec.rounds,
            "specserve.spec.drafted_tokens": spec.num_draft_tokens,
            "specserve.spec.accepted_tokens": spec.num_accepted_tokens,
            "specserve.spec.acceptance_rate": round(spec.acceptance_rate, 4),
            "specserve.spec.plain_steps": spec.num_plain_steps,
        })
        span.add_event("speculation", _speculation_event(spec))
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))
    span.end()


def _speculation_event(spec: SpecStats) -> dict:
    attributes: dict = {"rounds": spec.rounds, "plain_steps": spec.num_plain_steps}
    for name, stats in spec.by_proposer.items():
        attributes[f"{name}.rounds"] = stats.rounds
        attributes[f"{name}.drafted_tokens"] = stats.num_draft_tokens
        attributes[f"{name}.accepted_tokens"] = stats.num_accepted_tokens
        attributes[f"{name}.mean_k"] = round(stats.num_draft_tokens / stats.rounds, 3) if stats.rounds else 0.0
        attributes[f"{name}.accepted_per_position"] = list(stats.accepted_per_pos)
    return attributes
