"""The simulated engine: admission (running seqs, waiting queue, queue cap), token timing,
fault injection, and vLLM's Prometheus metrics under the names of the vLLM version the serving stage pins
(`VLLM_METRICS_VERSION`; the version and why: docs/serving.md)."""

from __future__ import annotations

import asyncio
import random
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_SENTENCE = (
    "the quick brown fox jumps over the lazy dog while the model keeps writing plausible text "
    "about serving large language models on three servers"
)
_WORDS = tuple(_SENTENCE.split(" "))

# The vLLM release whose /metrics names the simulator copies: the V0 engine's vllm/engine/metrics.py
# (gpu_cache_usage_perc and time_per_output_token_seconds; later releases renamed them
# kv_cache_usage_perc and inter_token_latency_seconds). Alerts and dashboards are tested against these.
VLLM_METRICS_VERSION = "0.4.2"

# How a stream ends, in the forms real servers use:
#   with_text    the last text chunk carries the finish reason (vLLM)
#   empty_delta  a chunk with an empty delta (text "") carries it (OpenAI)
#   usage_chunk  as empty_delta, then a usage chunk even when not asked for (vLLM's
#                --enable-force-include-usage, some proxies)
#   done         no finish reason and no usage: [DONE] right after the text
STREAM_ENDS = ("with_text", "empty_delta", "usage_chunk", "done")


@dataclass
class SimConfig:
    served_models: list[str] = field(default_factory=lambda: ["sim-model"])
    ttft_s: float = 0.0
    itl_s: float = 0.0
    max_num_seqs: int = 256
    max_queue: int = 1024
    default_max_tokens: int = 16
    max_model_len: int = 4096  # max_tokens above this is refused with 400, as vLLM does
    reply: list[str] | None = None  # fixed output tokens (one per chunk); else generated words
    error_rate: float = 0.0  # share of requests answered 500
    hang_rate: float = 0.0  # share of requests that never answer
    health_fail: bool = False  # /health answers 500 (engine dead)
    stream_end: str = "with_text"  # one of STREAM_ENDS
    seed: int | None = None

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        if self.stream_end not in STREAM_ENDS:
            raise ValueError(f"stream_end must be one of {', '.join(STREAM_ENDS)}, not {self.stream_end!r}")

    def update(self, changes: dict[str, Any]) -> None:
        names = {f.name for f in fields(self)}
        unknown = set(changes) - names
        if unknown:
            raise ValueError(f"unknown settings: {', '.join(sorted(unknown))}")
        previous = self.as_dict()
        for key, value in changes.items():
            setattr(self, key, value)
        try:
            self._check()
        except ValueError:
            for key, value in previous.items():
                setattr(self, key, value)
            raise

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Overloaded(Exception):
    pass


class Engine:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.random = random.Random(config.seed)
        self.running = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self.stats = {
            "started": 0,
            "finished": 0,
            "cancelled": 0,
            "rejected": 0,
            "errors": 0,
            "hung": 0,
            "abandoned": 0,
        }
        self.registry = CollectorRegistry()
        r = self.registry
        labels = ["model_name"]
        model = config.served_models[0]
        self._g_running = Gauge("vllm:num_requests_running", "Requests running", labels, registry=r).labels(
            model
        )
        self._g_waiting = Gauge("vllm:num_requests_waiting", "Requests waiting", labels, registry=r).labels(
            model
        )
        self._g_swapped = Gauge(
            "vllm:num_requests_swapped", "Requests swapped to CPU", labels, registry=r
        ).labels(model)
        self._g_kv = Gauge(
            "vllm:gpu_cache_usage_perc", "KV-cache usage, 1 = full", labels, registry=r
        ).labels(model)
        self._h_ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token", labels, registry=r
        ).labels(model)
        self._h_itl = Histogram(
            "vllm:time_per_output_token_seconds", "Time per output token", labels, registry=r
        ).labels(model)
        self._h_e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency", labels, registry=r
        ).labels(model)
        self._c_success = Counter(
            "vllm:request_success", "Finished requests", ["model_name", "finished_reason"], registry=r
        )
        self._c_prompt = Counter("vllm:prompt_tokens", "Prompt tokens", labels, registry=r).labels(model)
        self._c_gen = Counter("vllm:generation_tokens", "Generated tokens", labels, registry=r).labels(model)

    # --- admission -------------------------------------------------------------------------
    def _publish(self) -> None:
        self._g_running.set(self.running)
        self._g_waiting.set(len(self._waiting))
        self._g_kv.set(min(self.running / max(self.config.max_num_seqs, 1), 1.0))

    async def admit(self) -> None:
        """Take a sequence slot, waiting in the queue if all are busy; Overloaded past the cap."""
        if self.running < self.config.max_num_seqs and not self._waiting:
            self.running += 1
            self._publish()
            return
        if len(self._waiting) >= self.config.max_queue:
            self.stats["rejected"] += 1
            raise Overloaded()
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._publish()
        try:
            await waiter
        except BaseException:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif waiter.done() and not waiter.cancelled():
                self.release()  # we were handed a slot and are leaving
            self._publish()
            raise
        self._publish()

    def release(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the next in line
                self._publish()
                return
        self.running -= 1
        self._publish()

    # --- generation ------------------------------------------------------------------------
    def fault(self) -> str | None:
        c = self.config
        if c.error_rate and self.random.random() < c.error_rate:
            self.stats["errors"] += 1
            return "error"
        if c.hang_rate and self.random.random() < c.hang_rate:
            self.stats["hung"] += 1
            return "hang"
        return None

    def output_tokens(self, max_tokens: int | None) -> tuple[list[str], str]:
        limit = max_tokens if max_tokens is not None else self.config.default_max_tokens
        if self.config.reply is not None:
            tokens = self.config.reply[:limit]
            return tokens, "length" if len(self.config.reply) > limit else "stop"
        return [_WORDS[i % len(_WORDS)] + " " for i in range(limit)], "length"

    def observe_ttft(self, seconds: float) -> None:
        self._h_ttft.observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        self._h_itl.observe(seconds)

    def finished(self, model: str, reason: str, prompt_tokens: int, gen_tokens: int, e2e_s: float) -> None:
        self.stats["finished"] += 1
        self._c_success.labels(model, reason).inc()
        self._c_prompt.inc(prompt_tokens)
        self._c_gen.inc(gen_tokens)
        self._h_e2e.observe(e2e_s)

    def render_metrics(self) -> bytes:
        return generate_latest(self.registry)

    def snapshot(self) -> dict[str, Any]:
        return {**self.stats, "running": self.running, "waiting": len(self._waiting)}
