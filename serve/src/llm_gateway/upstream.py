"""One vLLM server behind the gateway: its connection pool, breaker, in-flight count and probe."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from typing import Any

from .breaker import CircuitBreaker
from .config import BreakerConfig, UpstreamConfig
from .http_client import ConnectionPool, UpstreamError

log = logging.getLogger("llm_gateway.upstream")

# vLLM has renamed its KV-cache gauge; read whichever the server exposes.
_VLLM_FIGURES = {
    "vllm:num_requests_running": "num_requests_running",
    "vllm:num_requests_waiting": "num_requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage_perc",
}


def parse_vllm_figures(text: str) -> dict[str, float]:
    """Sum the gauges we care about over their label sets (one engine per model name usually)."""
    figures: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        key = _VLLM_FIGURES.get(line[:name_end])
        if key is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        figures[key] = figures.get(key, 0.0) + value
    return figures


def tls_context(config: UpstreamConfig) -> ssl.SSLContext | None:
    """For an https:// upstream: verify its certificate (CA bundle or system store) and name."""
    if not config.tls:
        return None
    context = ssl.create_default_context(cafile=str(config.ca_file) if config.ca_file else None)
    if not config.tls_verify:
        log.warning("upstream %s: TLS certificate verification is off", config.name)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class Upstream:
    def __init__(self, model: str, config: UpstreamConfig, breaker: BreakerConfig) -> None:
        self.model = model
        self.config = config
        self.breaker = CircuitBreaker(breaker.failures_to_open, breaker.open_s)
        self.pool = ConnectionPool(
            config.host, config.port, max_connections=config.max_connections, tls=tls_context(config)
        )
        self.in_flight = 0
        self.last_probe: dict[str, Any] | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._breaker_config = breaker

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def weight(self) -> int:
        return self.config.weight

    @property
    def served_model(self) -> str:
        return self.config.served_model

    def same_endpoint(self, config: UpstreamConfig) -> bool:
        def endpoint(c: UpstreamConfig) -> tuple[object, ...]:
            return (c.name, c.url, c.max_connections, c.ca_file, c.tls_verify)

        return endpoint(config) == endpoint(self.config)

    def update(self, config: UpstreamConfig, breaker: BreakerConfig) -> None:
        """Take new weight/served model/breaker settings, keeping connections and breaker state."""
        self.config = config
        self.breaker.reconfigure(breaker.failures_to_open, breaker.open_s)
        self._breaker_config = breaker

    # --- active health probe -------------------------------------------------------------
    def start_probe(self) -> None:
        if self._probe_task is None:
            self._probe_task = asyncio.create_task(self._probe_loop(), name=f"probe {self.model}/{self.name}")

    async def _probe_loop(self) -> None:
        # the first probe at once: until an upstream has been reached, /ready does not count it
        await self.probe_once()
        # then the probes of many upstreams spread over the interval
        await asyncio.sleep(random.uniform(0, self._breaker_config.probe_interval_s))
        while True:
            await self.probe_once()
            await asyncio.sleep(self._breaker_config.probe_interval_s)

    async def probe_once(self) -> bool:
        started = time.monotonic()
        error: str | None = None
        try:
            async with asyncio.timeout(self._breaker_config.probe_timeout_s):
                response = await self.pool.request(
                    "GET", "/health", connect_timeout_s=self._breaker_config.probe_timeout_s
                )
                await response.read()
            ok = response.status == 200
            if not ok:
                error = f"/health answered {response.status}"
        except TimeoutError:
            ok, error = False, f"/health timed out after {self._breaker_config.probe_timeout_s}s"
        except UpstreamError as exc:
            ok, error = False, str(exc)
        self.last_probe = {
            "ok": ok,
            "at": time.time(),
            "latency_ms": round((time.monotonic() - started) * 1000, 3),
            "error": error,
        }
        self.breaker.record_probe(ok, error)
        if not ok:
            log.warning("probe of upstream %s/%s failed: %s", self.model, self.name, error)
        return ok

    async def vllm_figures(self, timeout_s: float = 1.0) -> dict[str, Any]:
        """vLLM's own view of its queue, read from its /metrics."""
        try:
            async with asyncio.timeout(timeout_s):
                response = await self.pool.request("GET", "/metrics", connect_timeout_s=timeout_s)
                body = await response.read()
        except TimeoutError:
            return {"error": f"/metrics timed out after {timeout_s}s"}
        except UpstreamError as exc:
            return {"error": str(exc)}
        if response.status != 200:
            return {"error": f"/metrics answered {response.status}"}
        return dict(parse_vllm_figures(body.decode("utf-8", "replace")))

    def snapshot(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "name": self.name,
            "url": self.config.url,
            "served_model": self.served_model,
            "weight": self.weight,
            "breaker": self.breaker.snapshot(),
            "in_flight": self.in_flight,
            "connections": {"in_use": self.pool.in_use, "idle": self.pool.idle},
            "last_probe": self.last_probe,
        }

    async def close(self, drain_s: float = 0.0) -> None:
        """Stop probing; close the pool once in-flight requests finish (at most drain_s)."""
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
            self._probe_task = None
        deadline = time.monotonic() + drain_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.pool.close()
