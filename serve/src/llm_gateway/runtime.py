"""The gateway's state: a Runtime per loaded configuration, and the Gateway that swaps them.

A request reads `gateway.runtime` once, at its start, and keeps that snapshot to its end; a
reload (SIGHUP) builds a new Runtime and swaps the reference, so requests in flight finish
with what they started with. Upstreams whose endpoint did not change are carried over with
their connections and breaker state; removed ones are closed once their requests drain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from .audit import AuditLog, RequestRecord
from .auth import Authenticator, build_authenticator
from .config import GatewayConfig, load_config
from .metrics import GatewayMetrics
from .safety import SafetyPolicy, TermMatcher, read_terms_file
from .upstream import Upstream

log = logging.getLogger("llm_gateway")


@dataclass(frozen=True, slots=True)
class Runtime:
    config: GatewayConfig
    auth: Authenticator
    safety: SafetyPolicy
    models: dict[str, list[Upstream]]
    loaded_at: float

    def upstreams(self) -> list[Upstream]:
        return [u for ups in self.models.values() for u in ups]


def prepare(config: GatewayConfig) -> tuple[Authenticator, SafetyPolicy]:
    """The parts of a Runtime that read files (keys, terms): run off the event loop."""
    terms = list(config.safety.terms)
    if config.safety.terms_file is not None:
        terms += read_terms_file(config.safety.terms_file)
    safety = SafetyPolicy(
        TermMatcher(terms), config.safety.action, config.safety.mask_char, config.safety.block_message
    )
    return build_authenticator(config.auth), safety


class Gateway:
    def __init__(self, config: GatewayConfig, config_path: Path | None = None) -> None:
        self.config_path = config_path
        self.metrics = GatewayMetrics()
        self.audit = AuditLog(
            config.audit.path, config.audit.queue_size, on_drop=self.metrics.audit_dropped.inc
        )
        auth, safety = prepare(config)
        self.runtime = self._assemble(config, auth, safety, previous=None)
        self.in_flight = 0
        self._closing: set[asyncio.Task[None]] = set()
        self.metrics.attach_upstreams(lambda: self.runtime.upstreams(), lambda: self.in_flight)

    @staticmethod
    def _assemble(
        config: GatewayConfig, auth: Authenticator, safety: SafetyPolicy, previous: Runtime | None
    ) -> Runtime:
        models: dict[str, list[Upstream]] = {}
        for model, model_config in config.models.items():
            old = {u.name: u for u in (previous.models.get(model, []) if previous else [])}
            upstreams = []
            for upstream_config in model_config.upstreams:
                existing = old.get(upstream_config.name)
                if existing is not None and existing.same_endpoint(upstream_config):
                    existing.update(upstream_config, config.breaker)
                    upstreams.append(existing)
                else:
                    upstreams.append(Upstream(model, upstream_config, config.breaker))
            models[model] = upstreams
        return Runtime(config, auth, safety, models, time.time())

    async def start(self) -> None:
        for upstream in self.runtime.upstreams():
            upstream.start_probe()

    async def reload(self) -> bool:
        """Load the config file again and swap it in; a bad file is refused and the old one kept."""
        if self.config_path is None:
            return False
        try:
            config = await asyncio.to_thread(load_config, self.config_path)
            auth, safety = await asyncio.to_thread(prepare, config)
            new_audit = None
            audit = config.audit
            if audit.path != self.audit.path or audit.queue_size != self.runtime.config.audit.queue_size:
                # opened before the swap: a file that cannot be opened refuses the reload
                new_audit = await asyncio.to_thread(
                    AuditLog, audit.path, audit.queue_size, self.metrics.audit_dropped.inc
                )
        except Exception as exc:  # a reload must never take the gateway down
            log.error("config reload refused, keeping the running config: %s", exc)
            self.metrics.reloads.labels("error").inc()
            return False
        old = self.runtime
        for key in ("listen", "internal"):
            if getattr(config, key) != getattr(old.config, key):
                log.warning("config reload: %s changed; it takes effect at the next restart", key)
        new = self._assemble(config, auth, safety, previous=old)
        self.runtime = new
        kept = {id(u) for u in new.upstreams()}
        for upstream in new.upstreams():
            upstream.start_probe()
        for upstream in old.upstreams():
            if id(upstream) not in kept:
                task = asyncio.create_task(upstream.close(drain_s=old.config.timeouts.total_s))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        if new_audit is not None:
            previous_audit = self.audit
            self.audit = new_audit
            await asyncio.to_thread(previous_audit.close)
        else:
            self.audit.reopen()
        self.metrics.reloads.labels("ok").inc()
        log.info(
            "config reloaded: %d models, %d upstreams, %d safety terms",
            len(new.models),
            len(new.upstreams()),
            new.safety.matcher.size,
        )
        return True

    def end(
        self,
        record: RequestRecord,
        runtime: Runtime,
        status: int,
        outcome: str = "ok",
        error_type: str | None = None,
    ) -> None:
        """Settle how the request ended and account for it (a request ends exactly once)."""
        record.settle(status, outcome, error_type)
        self.finish(record, runtime)

    def finish(self, record: RequestRecord, runtime: Runtime) -> None:
        """Account for one finished request: its audit line and its metrics."""
        latency = time.perf_counter() - record.started
        self.audit.write(record.to_record(runtime.config.audit.prompts, latency))
        if record.model is not None and record.model in runtime.models:
            self.metrics.count_request(record.model, record.upstream or "none", record.outcome)
            if record.upstream is not None:
                self.metrics.count_tokens(
                    record.model, record.upstream, record.prompt_tokens or 0, record.completion_tokens or 0
                )
        if record.safety_action != "none":
            self.metrics.safety_actions.labels(record.safety_action).inc()

    async def close(self) -> None:
        for upstream in self.runtime.upstreams():
            await upstream.close()
        for task in list(self._closing):
            task.cancel()
        await asyncio.to_thread(self.audit.close)
