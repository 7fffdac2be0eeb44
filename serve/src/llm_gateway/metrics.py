"""Prometheus metrics. Per-request updates are a few dictionary lookups; the gauges that describe
upstreams (breaker state, in-flight) are read at scrape time, so they cost nothing per request."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .upstream import Upstream

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _UpstreamCollector(Collector):
    def __init__(self, upstreams: Callable[[], Iterable[Upstream]], in_flight: Callable[[], int]) -> None:
        self._upstreams = upstreams
        self._in_flight = in_flight

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "llm_gateway_upstream_breaker_state",
            "Circuit breaker state per upstream: 0 closed, 1 half-open, 2 open",
            labels=["model", "upstream"],
        )
        busy = GaugeMetricFamily(
            "llm_gateway_upstream_in_flight_requests",
            "Requests in flight to each upstream",
            labels=["model", "upstream"],
        )
        weight = GaugeMetricFamily(
            "llm_gateway_upstream_weight", "Configured routing weight", labels=["model", "upstream"]
        )
        for upstream in self._upstreams():
            labels = [upstream.model, upstream.name]
            state.add_metric(labels, int(upstream.breaker.peek_state()))
            busy.add_metric(labels, upstream.in_flight)
            weight.add_metric(labels, upstream.weight)
        total = GaugeMetricFamily("llm_gateway_in_flight_requests", "Requests in flight in the gateway")
        total.add_metric([], self._in_flight())
        yield from (state, busy, weight, total)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # The name the team's alerts use.
        self.http_duration = Histogram(
            "http_request_duration_seconds",
            "Time from request to the end of the response, streams included",
            ["method", "route", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "llm_gateway_requests",
            "Completion requests by model, upstream and outcome",
            ["model", "upstream", "outcome"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "llm_gateway_prompt_tokens",
            "Prompt tokens, from upstream usage",
            ["model", "upstream"],
            registry=r,
        )
        self.completion_tokens = Counter(
            "llm_gateway_completion_tokens",
            "Completion tokens, from upstream usage",
            ["model", "upstream"],
            registry=r,
        )
        self.ttft = Histogram(
            "llm_gateway_time_to_first_token_seconds",
            "Time from request to the first streamed token sent to the client",
            ["model", "upstream"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.safety_actions = Counter(
            "llm_gateway_safety_actions", "Responses where a sensitive term was found", ["action"], registry=r
        )
        self.fallbacks = Counter(
            "llm_gateway_fallbacks", "Requests answered by the fallback", ["model", "reason"], registry=r
        )
        self.audit_dropped = Counter(
            "llm_gateway_audit_dropped", "Audit records dropped because the writer fell behind", registry=r
        )
        self.reloads = Counter("llm_gateway_config_reloads", "Configuration reloads", ["result"], registry=r)
        self._children: dict[tuple[Any, ...], Any] = {}

    def attach_upstreams(
        self, upstreams: Callable[[], Iterable[Upstream]], in_flight: Callable[[], int]
    ) -> None:
        self.registry.register(_UpstreamCollector(upstreams, in_flight))

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            if len(self._children) > 10_000:  # labels come from config, but stay bounded regardless
                self._children.clear()
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        self._child(self.http_duration, method, route, str(status)).observe(seconds)

    def count_request(self, model: str, upstream: str, outcome: str) -> None:
        self._child(self.requests, model, upstream, outcome).inc()

    def count_tokens(self, model: str, upstream: str, prompt: int, completion: int) -> None:
        if prompt:
            self._child(self.prompt_tokens, model, upstream).inc(prompt)
        if completion:
            self._child(self.completion_tokens, model, upstream).inc(completion)

    def observe_ttft(self, model: str, upstream: str, seconds: float) -> None:
        self._child(self.ttft, model, upstream).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
