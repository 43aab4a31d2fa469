"""Tracer-provider construction: OTLP only when configured, and never the global provider."""

from __future__ import annotations

from opentelemetry import trace

from gateway.settings import GatewaySettings
from gateway.telemetry import build_tracer_provider


def _processors(provider) -> list:  # noqa: ANN001
    return list(provider._active_span_processor._span_processors)  # noqa: SLF001


def test_no_exporter_by_default() -> None:
    assert _processors(build_tracer_provider(GatewaySettings())) == []


def test_otlp_http_exporter_when_an_endpoint_is_set() -> None:
    provider = build_tracer_provider(GatewaySettings(otlp_endpoint="http://collector:4318/"))
    (processor,) = _processors(provider)
    exporter = processor.span_exporter
    assert type(exporter).__name__ == "OTLPSpanExporter"
    assert exporter._endpoint == "http://collector:4318/v1/traces"  # noqa: SLF001
    provider.shutdown()


def test_the_global_provider_is_left_alone() -> None:
    before = trace.get_tracer_provider()
    build_tracer_provider(GatewaySettings())
    assert trace.get_tracer_provider() is before
