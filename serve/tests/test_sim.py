"""The simulator itself: what vllm serve exposes, queueing, usage, faults."""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

import httpx
from gwtest import wait_for

METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_swapped",
    "vllm:gpu_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_success_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


def test_endpoints_usage_and_metrics(make_sim: Any, client: httpx.Client) -> None:
    sim = make_sim(reply=["a", "b", "c"])
    assert client.get(sim.url + "/health").status_code == 200
    assert [m["id"] for m in client.get(sim.url + "/v1/models").json()["data"]] == ["m"]
    unary = client.post(sim.url + "/v1/completions", json={"model": "m", "prompt": "hello world"}).json()
    assert unary["choices"][0]["text"] == "abc" and unary["usage"]["completion_tokens"] == 3
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    plain = client.post(sim.url + "/v1/chat/completions", json=body).text
    assert '"usage"' not in plain
    with_usage = client.post(
        sim.url + "/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}}
    ).text
    events = [json.loads(line[6:]) for line in with_usage.splitlines() if line.startswith("data: {")]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    metrics = client.get(sim.url + "/metrics").text
    for name in METRICS:
        assert name in metrics, name
    # the pinned vLLM (engine.VLLM_METRICS_VERSION) predates these names; alerts must not rely on them
    for newer in ("vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds"):
        assert newer not in metrics, newer
    assert 'vllm:generation_tokens_total{model_name="m"} 9.0' in metrics
    too_long = client.post(
        sim.url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 10**6}
    )
    assert too_long.status_code == 400


def test_queue_and_cap(make_sim: Any, client: httpx.Client) -> None:
    sim = make_sim(max_num_seqs=1, max_queue=1, ttft_s=30)
    body = {"model": "m", "prompt": "x"}
    threads = []
    for _ in range(2):

        def send() -> None:
            with httpx.Client(timeout=1) as c, contextlib.suppress(httpx.TimeoutException):
                c.post(sim.url + "/v1/completions", json=body)

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        threads.append(thread)
        expected = len(threads)
        assert wait_for(lambda n=expected: sim.stats()["running"] + sim.stats()["waiting"] == n)
    metrics = client.get(sim.url + "/metrics").text
    assert 'vllm:num_requests_running{model_name="m"} 1.0' in metrics
    assert 'vllm:num_requests_waiting{model_name="m"} 1.0' in metrics
    assert client.post(sim.url + "/v1/completions", json=body).status_code == 503
    for thread in threads:
        thread.join(5)
    assert wait_for(lambda: sim.stats()["running"] == 0 and sim.stats()["waiting"] == 0)
    stats = sim.stats()
    assert stats["cancelled"] + stats["abandoned"] == 2 and stats["finished"] == 0


def test_faults(make_sim: Any, client: httpx.Client) -> None:
    sim = make_sim(error_rate=1.0, health_fail=True)
    assert client.get(sim.url + "/health").status_code == 500
    assert client.post(sim.url + "/v1/completions", json={"model": "m", "prompt": "x"}).status_code == 500
    assert client.post(sim.url + "/sim/config", json={"nope": 1}).status_code == 400
    assert (
        client.post(sim.url + "/sim/config", json={"error_rate": 0, "health_fail": False}).status_code == 200
    )
    assert client.post(sim.url + "/v1/completions", json={"model": "m", "prompt": "x"}).status_code == 200
    assert client.post(sim.url + "/v1/completions", json={"model": "other", "prompt": "x"}).status_code == 404
