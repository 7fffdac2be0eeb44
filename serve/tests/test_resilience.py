"""Breaker, failover, fallback, overload and timeouts, against the simulator over loopback."""

from __future__ import annotations

import contextlib
from typing import Any

import httpx
from gwtest import auth_headers, chat_body, wait_for

FALLBACK = "系统繁忙，请稍后再试"


def _post(client: httpx.Client, gw: Any, body: dict[str, Any], sub: str = "alice") -> httpx.Response:
    return client.post(gw.url + "/v1/chat/completions", json=body, headers=auth_headers(sub))


def _breaker(gw: Any, name: str) -> str:
    return gw.bg.call(
        lambda: next(u for u in gw.gateway.runtime.upstreams() if u.name == name).breaker.state.name
    )


def test_breaker_opens_on_errors_then_recovers(
    make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    sim = make_sim(error_rate=1.0)
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]},
        breaker={"failures_to_open": 3, "open_s": 0.3, "probe_interval_s": 60},
        fallback={"mode": "message"},
    )
    for _ in range(3):
        response = _post(client, gw, chat_body())
        assert response.headers["x-llm-gateway-fallback"] == "upstream_error"
    assert _breaker(gw, "a") in ("OPEN", "HALF_OPEN")
    started = sim.stats()["started"]
    # while open, requests do not reach the upstream (open_s is short, so check the count moved by <=1 trial)
    sim.configure(error_rate=0.0)
    assert wait_for(lambda: _breaker(gw, "a") == "HALF_OPEN", timeout=5)
    response = _post(client, gw, chat_body())
    assert response.status_code == 200 and "x-llm-gateway-fallback" not in response.headers
    assert _breaker(gw, "a") == "CLOSED"
    assert sim.stats()["started"] == started + 1


def test_open_breaker_keeps_traffic_off_the_upstream(
    make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    sim = make_sim(error_rate=1.0)
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]},
        breaker={"failures_to_open": 2, "open_s": 600, "probe_interval_s": 600},
        fallback={"mode": "message"},
    )
    for _ in range(2):
        _post(client, gw, chat_body())
    started = sim.stats()["started"]
    for _ in range(5):
        response = _post(client, gw, chat_body())
        assert response.status_code == 200
        assert response.headers["x-llm-gateway-fallback"] == "breaker_open"
        assert response.json()["choices"][0]["message"]["content"] == FALLBACK
    assert sim.stats()["started"] == started
    ready = client.get(gw.url + "/ready")
    assert ready.status_code == 503 and ready.json()["models"] == {"m": False}


def test_failing_health_probe_opens_and_healthy_probe_closes(
    make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    sim = make_sim(health_fail=True)
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]},
        breaker={"failures_to_open": 2, "open_s": 0.2, "probe_interval_s": 0.05},
    )
    assert wait_for(lambda: gw.bg.call(lambda: gw.gateway.runtime.upstreams()[0].breaker.times_opened) >= 1)
    sim.configure(health_fail=False)
    assert wait_for(lambda: _breaker(gw, "a") == "CLOSED", timeout=10)
    assert client.get(gw.url + "/ready").status_code == 200


def test_not_ready_until_an_upstream_has_been_reached(
    make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    """A breaker starts closed, so closed alone is not "reachable": a new replica whose upstream does
    not answer yet (its Service name not resolving, its connects timing out, as after a drain) must not
    be Ready, or clients are sent to it while the replicas that can reach the model are there."""
    sim = make_sim(health_fail=True)
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]},
        breaker={"failures_to_open": 1000, "open_s": 600, "probe_interval_s": 0.05},
    )
    upstream = lambda: gw.gateway.runtime.upstreams()[0]  # noqa: E731
    assert wait_for(lambda: gw.bg.call(lambda: upstream().last_probe) is not None)
    for _ in range(3):  # several failed probes, the breaker still closed: not ready
        ready = client.get(gw.url + "/ready")
        assert ready.status_code == 503 and ready.json() == {"status": "not_ready", "models": {"m": False}}
        assert _breaker(gw, "a") == "CLOSED"
    assert gw.bg.call(lambda: upstream().breaker.snapshot()["reached"]) is False
    sim.configure(health_fail=False)
    assert wait_for(lambda: client.get(gw.url + "/ready").status_code == 200)
    # reached stays: a later failure is the breaker's to judge, not a return to "never reached"
    sim.configure(health_fail=True)
    assert wait_for(lambda: gw.bg.call(lambda: upstream().last_probe["ok"]) is False)
    assert client.get(gw.url + "/ready").status_code == 200
    assert gw.bg.call(lambda: upstream().breaker.snapshot()["reached"]) is True


def test_an_answered_request_counts_as_reached(
    make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    sim = make_sim(health_fail=True)
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]},
        breaker={"failures_to_open": 1000, "open_s": 600, "probe_interval_s": 600},
    )
    assert client.get(gw.url + "/ready").status_code == 503
    assert _post(client, gw, chat_body()).status_code == 200
    assert client.get(gw.url + "/ready").status_code == 200


def test_failover_to_next_upstream_when_first_is_down(
    make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    sim = make_sim()
    gw = make_gateway(
        {
            "m": [
                {"name": "dead", "url": "http://127.0.0.1:9", "served_model": "m", "weight": 1000},
                {"name": "live", "url": sim.url, "served_model": "m", "weight": 1},
            ]
        }
    )
    response = _post(client, gw, chat_body())
    assert response.status_code == 200
    assert response.headers["x-llm-gateway-upstream"] == "live"


def test_stream_fallback_message(make_gateway: Any, client: httpx.Client) -> None:
    gw = make_gateway(
        {"m": [{"name": "dead", "url": "http://127.0.0.1:9", "served_model": "m"}]},
        fallback={"mode": "message"},
    )
    with client.stream(
        "POST",
        gw.url + "/v1/chat/completions",
        json=chat_body(stream=True, stream_options={"include_usage": True}),
        headers=auth_headers(),
    ) as response:
        body = response.read().decode()
    assert response.status_code == 200
    assert response.headers["x-llm-gateway-fallback"] == "unreachable"
    assert FALLBACK in body and body.rstrip().endswith("data: [DONE]")
    record = gw.audit_records(1)[-1]
    assert record["outcome"] == "fallback" and record["fallback"] == "unreachable"


def test_overload_is_not_a_breaker_failure(make_sim: Any, make_gateway: Any, client: httpx.Client) -> None:
    sim = make_sim(max_num_seqs=1, max_queue=0, hang_rate=1.0)
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]},
        breaker={"failures_to_open": 1, "open_s": 600, "probe_interval_s": 600},
        fallback={"mode": "error"},
    )
    # one request occupies the only sequence slot and hangs; the rest hit the queue cap (503)
    with httpx.Client(timeout=0.5) as hanging, contextlib.suppress(httpx.TimeoutException):
        hanging.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=auth_headers())
    assert wait_for(lambda: sim.stats()["running"] == 0)  # the gateway cancelled it when we left
    sim.configure(hang_rate=0.0, max_num_seqs=0)
    for _ in range(3):
        response = _post(client, gw, chat_body())
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "overloaded"
        assert response.headers["retry-after"] == "1"
    assert _breaker(gw, "a") == "CLOSED"


def test_first_token_timeout_falls_back(make_sim: Any, make_gateway: Any, client: httpx.Client) -> None:
    sim = make_sim(hang_rate=1.0)
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]},
        timeouts={"first_token_s": 0.3, "total_s": 0.5},
        fallback={"mode": "message"},
    )
    response = _post(client, gw, chat_body(stream=True))
    assert response.headers["x-llm-gateway-fallback"] == "timeout"
    response = _post(client, gw, chat_body())
    assert response.headers["x-llm-gateway-fallback"] == "timeout"
    records = gw.audit_records(2)
    assert [r["error_type"] for r in records] == ["timeout", "timeout"]
    assert wait_for(lambda: sim.stats()["cancelled"] == 2)  # the timed-out requests were aborted upstream


def test_stalled_stream_ends_with_an_error_event(
    make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    sim = make_sim(itl_s=1.0, reply=["a", "b", "c"])
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]},
        timeouts={"between_tokens_s": 0.2},
    )
    response = _post(client, gw, chat_body(stream=True))
    assert response.status_code == 200
    assert '"code":"timeout"' in response.text
    assert response.text.rstrip().endswith("data: [DONE]")
    record = gw.audit_records(1)[-1]
    assert record["outcome"] == "timeout"
    assert wait_for(lambda: sim.stats()["cancelled"] == 1)


def test_upstream_client_error_passes_through(make_sim: Any, make_gateway: Any, client: httpx.Client) -> None:
    sim = make_sim()
    gw = make_gateway({"m": [{"name": "a", "url": sim.url, "served_model": "not-served"}]})
    response = _post(client, gw, chat_body())
    assert response.status_code == 404  # vLLM's own answer, not a breaker failure
    assert _breaker(gw, "a") == "CLOSED"


def _pool_in_use(gw: Any) -> int:
    return int(gw.bg.call(lambda: gw.gateway.runtime.upstreams()[0].pool.in_use))


def test_first_token_timeout_after_headers_frees_the_connection(
    make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    # vLLM sends a stream's headers at once and its first chunk only after prefill: the timeout
    # fires with the response open. Its connection must go back and the upstream must be aborted.
    sim = make_sim(ttft_s=30)
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m", "max_connections": 2}]},
        timeouts={"first_token_s": 0.3, "total_s": 5},
        fallback={"mode": "message"},
    )
    for _ in range(2):
        response = _post(client, gw, chat_body(stream=True))
        assert response.headers["x-llm-gateway-fallback"] == "timeout"
    assert wait_for(lambda: _pool_in_use(gw) == 0)
    assert wait_for(lambda: sim.stats()["cancelled"] == 2)  # the GPU stopped generating
    assert sim.stats()["running"] == 0 and sim.stats()["finished"] == 0
    assert gw.bg.call(lambda: gw.gateway.runtime.upstreams()[0].in_flight) == 0
    sim.configure(ttft_s=0)
    response = _post(client, gw, chat_body(stream=True))  # not 503 overloaded: the pool has room
    assert response.status_code == 200 and "x-llm-gateway-fallback" not in response.headers
    assert response.text.rstrip().endswith("data: [DONE]")


def test_client_gone_before_first_token_frees_the_connection(make_sim: Any, make_gateway: Any) -> None:
    sim = make_sim(ttft_s=30)
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m", "max_connections": 2}]},
        timeouts={"first_token_s": 10},
    )
    with httpx.Client(timeout=0.3) as impatient, contextlib.suppress(httpx.TimeoutException):
        impatient.post(gw.url + "/v1/chat/completions", json=chat_body(stream=True), headers=auth_headers())
    assert wait_for(lambda: sim.stats()["cancelled"] == 1)
    assert wait_for(lambda: _pool_in_use(gw) == 0)
    record = gw.audit_records(1)[-1]
    assert record["outcome"] == "client_disconnected" and record["status"] == 499
    assert _breaker(gw, "a") == "CLOSED"  # the client leaving says nothing about the upstream
