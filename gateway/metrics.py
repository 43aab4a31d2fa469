"""Prometheus metrics, in a per-app registry.

The gateway's own figures (requests, latencies, Redis errors) are ordinary prometheus-client
instruments. The engine's figures are read from ``EngineClient.stats()`` at scrape time by
:class:`EngineCollector`, so the engine stays the single source of truth; their names follow
vLLM's (``vllm:num_requests_running`` -> ``specserve:num_requests_running``, ...).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.engine_client import EngineClient

logger = logging.getLogger(__name__)

ENGINE_PREFIX = "specserve:"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)


class EngineCollector(Collector):
    """Engine gauges and vLLM-named speculative-decoding counters, read from ``stats()`` per scrape."""

    def __init__(self, get_engine: Callable[[], EngineClient | None]) -> None:
        self._get_engine = get_engine

    def collect(self) -> Iterator[Metric]:
        engine = self._get_engine()
        if engine is None:
            return
        try:
            stats = engine.stats()
        except Exception:  # a scrape must not take the endpoint down
            logger.exception("engine.stats() failed during a metrics scrape")
            return
        yield from self._gauges(stats)
        yield from self._spec_counters(stats)
        yield from self._cost_audit(stats)
        yield from self._plain_causes(stats)

    @staticmethod
    def _gauges(stats: dict) -> Iterator[Metric]:
        total = stats.get("kv_total_blocks") or 0
        usage = stats.get("kv_used_blocks", 0) / total if total else 0.0
        for name, doc, value in (
            ("num_requests_running", "Requests in the engine's running batch.", stats.get("num_running", 0)),
            ("num_requests_waiting", "Requests waiting to be scheduled.", stats.get("num_waiting", 0)),
            ("kv_cache_usage_perc", "KV-cache usage (1 = full).", usage),
        ):
            yield GaugeMetricFamily(ENGINE_PREFIX + name, doc, value=value)

    @staticmethod
    def _spec_counters(stats: dict) -> Iterator[Metric]:
        for name, doc in (
            ("spec_decode_num_drafts", "Speculation rounds."),
            ("spec_decode_num_draft_tokens", "Draft tokens proposed."),
            ("spec_decode_num_accepted_tokens", "Draft tokens accepted."),
        ):
            yield CounterMetricFamily(ENGINE_PREFIX + name, doc, value=stats.get(name, 0))
        per_pos = CounterMetricFamily(
            ENGINE_PREFIX + "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each draft position.",
            labels=["position"],
        )
        for position, value in enumerate(stats.get("spec_decode_num_accepted_tokens_per_pos", [])):
            per_pos.add_metric([str(position)], value)
        yield per_pos

    @staticmethod
    def _cost_audit(stats: dict) -> Iterator[Metric]:
        """The speculation policy's cost model against the clock (policies/cost_audit.py)."""
        audit = stats.get("policy", {}).get("cost_model", {}).get("prediction_audit", {})
        ratio = GaugeMetricFamily(
            ENGINE_PREFIX + "policy_cost_measured_over_predicted",
            "Measured over predicted step seconds of the speculation policy's cost model (geometric mean of the last"
            " ~50 steps), per kind of step (plain, verify, draft) and batch-size bucket.",
            labels=["kind", "batch_sizes"],
        )
        for kind, buckets in audit.items():
            for bucket in buckets:
                low, high = bucket["batch_sizes"]
                ratio.add_metric([kind, f"{low}-{high}"], bucket["measured_over_predicted"])
        yield ratio

    @staticmethod
    def _plain_causes(stats: dict) -> Iterator[Metric]:
        """Why request-steps decoded plainly (policies/controller.py `plain_by_cause`): where speculation is on but
        does not run, the cause tells an operator whether the policy judged it not to pay or measured that."""
        plain = CounterMetricFamily(
            ENGINE_PREFIX + "policy_plain_request_steps",
            "Request-steps decoded without speculation, by cause (capped, request, off, load_limit, no_proposal,"
            " plan, plain_streak, guard_rejected, guard_probe, guard_trial, guard_joining).",
            labels=["cause"],
        )
        for cause, count in stats.get("policy", {}).get("chosen_k", {}).get("plain_by_cause", {}).items():
            plain.add_metric([cause], count)
        yield plain


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "specserve_requests", "HTTP requests by endpoint and status code.", ["endpoint", "status"],
            registry=self.registry,
        )
        self.time_to_first_token = Histogram(
            "specserve_time_to_first_token_seconds", "Arrival to first output token.", buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.time_per_output_token = Histogram(
            "specserve_time_per_output_token_seconds", "Mean inter-token time after the first, per choice.",
            buckets=TPOT_BUCKETS, registry=self.registry,
        )
        self.e2e_latency = Histogram(
            "specserve_e2e_request_latency_seconds", "Arrival to last token of finished requests.",
            buckets=E2E_BUCKETS, registry=self.registry,
        )
        self.redis_errors = Counter(
            "specserve_redis_errors", "Redis operations that failed (the request went on without Redis).",
            ["operation"], registry=self.registry,
        )

    def count_redis_error(self, operation: str) -> None:
        self.redis_errors.labels(operation=operation).inc()

    def watch_engine(self, get_engine: Callable[[], EngineClient | None]) -> None:
        self.registry.register(EngineCollector(get_engine))

    def render(self) -> bytes:
        return generate_latest(self.registry)
