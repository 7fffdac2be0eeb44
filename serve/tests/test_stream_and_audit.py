"""Safety filter on streams, client disconnects, and the audit trail, through the network."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from typing import Any

import httpx
from gwtest import JWT_SECRET, auth_headers, chat_body, token, wait_for


def _stream_text(client: httpx.Client, gw: Any, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    events = []
    with client.stream(
        "POST", gw.url + "/v1/chat/completions", json=body, headers=auth_headers()
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    return text, events


def test_term_split_across_chunks_is_masked(make_sim: Any, make_gateway: Any, client: httpx.Client) -> None:
    sim = make_sim(reply=["The pass", "word is ", "sw", "ordf", "ish", " ok"])
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]},
        safety={"terms": ["password", "swordfish"], "action": "mask"},
    )
    text, _ = _stream_text(client, gw, chat_body(stream=True))
    assert text == "The ******** is ********* ok"
    assert gw.audit_records(1)[-1]["safety_action"] == "mask"
    # the same reply, unstreamed
    response = client.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=auth_headers())
    assert response.json()["choices"][0]["message"]["content"] == "The ******** is ********* ok"
    assert response.headers["x-llm-gateway-safety"] == "mask"


def test_term_split_across_chunks_blocks_the_stream(
    make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    sim = make_sim(reply=["fine ", "text ", "then 机", "密", "文件 and more", " and more"], itl_s=0.01)
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]},
        safety={"terms": ["机密文件"], "action": "block"},
    )
    text, events = _stream_text(client, gw, chat_body(stream=True))
    assert "机" not in text and "more" not in text
    assert events[-1]["choices"][0]["finish_reason"] == "content_filter"
    record = gw.audit_records(1)[-1]
    assert record["safety_action"] == "block"
    assert wait_for(lambda: sim.stats()["running"] == 0)


def _raw_stream_then_disconnect(gw: Any, body: dict[str, Any], read_events: int) -> None:
    host, port = gw.url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {token('mallory')}\r\nX-App-Name: kb-qa\r\n".encode()
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        received = b""
        while received.count(b"data: ") < read_events:
            chunk = sock.recv(65536)
            assert chunk, "gateway closed the stream early"
            received += chunk


def test_client_disconnect_mid_stream_is_audited_and_cancels_upstream(
    make_sim: Any, make_gateway: Any
) -> None:
    sim = make_sim(itl_s=0.05, default_max_tokens=10_000)
    gw = make_gateway({"m": [{"name": "a", "url": sim.url, "served_model": "m"}]})
    _raw_stream_then_disconnect(gw, chat_body(stream=True), read_events=3)
    assert wait_for(lambda: sim.stats()["cancelled"] == 1)
    stats = sim.stats()
    assert stats["running"] == 0 and stats["finished"] == 0
    record = gw.audit_records(1)[-1]
    assert record["outcome"] == "client_disconnected"
    assert record["status"] == 499
    assert record["user"] == "mallory" and record["app"] == "kb-qa"
    assert record["upstream"] == "a" and record["completion_tokens"] >= 1 and record["usage_estimated"]
    assert wait_for(lambda: gw.bg.call(lambda: gw.gateway.runtime.upstreams()[0].in_flight) == 0)


def test_client_disconnect_while_waiting_for_unary_answer(make_sim: Any, make_gateway: Any) -> None:
    sim = make_sim(ttft_s=30)
    gw = make_gateway({"m": [{"name": "a", "url": sim.url, "served_model": "m"}]})
    with httpx.Client(timeout=0.3) as impatient, contextlib.suppress(httpx.TimeoutException):
        impatient.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=auth_headers())
    assert wait_for(lambda: sim.stats()["cancelled"] == 1)
    assert gw.audit_records(1)[-1]["outcome"] == "client_disconnected"


def test_audit_record_fields_and_request_id(make_sim: Any, make_gateway: Any, client: httpx.Client) -> None:
    sim = make_sim(reply=["ok"])
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m-v2"}]}, audit={"prompts": "full"}
    )
    sim.configure(served_models=["m-v2"])
    headers = auth_headers("bob", **{"X-Request-ID": "req-123", "X-App-Name": "copywriter"})
    response = client.post(gw.url + "/v1/chat/completions", json=chat_body("hi there"), headers=headers)
    assert response.status_code == 200 and response.headers["x-request-id"] == "req-123"
    rejected = client.post(
        gw.url + "/v1/chat/completions", json=chat_body(), headers={"X-App-Name": "copywriter"}
    )
    assert rejected.status_code == 401 and rejected.headers["x-request-id"]
    ok, denied = gw.audit_records(2)
    assert ok["request_id"] == "req-123" and ok["user"] == "bob" and ok["app"] == "copywriter"
    assert ok["model"] == "m" and ok["served_model"] == "m-v2" and ok["upstream"] == "a"
    assert ok["status"] == 200 and ok["outcome"] == "ok" and ok["safety_action"] == "none"
    assert ok["prompt_tokens"] >= 1 and ok["completion_tokens"] == 1
    assert ok["prompt"] == [{"role": "user", "content": "hi there"}]
    assert ok["latency_ms"] > 0
    assert denied["status"] == 401 and denied["error_type"] == "unauthorized" and denied["user"] is None
    assert denied["request_id"] == rejected.headers["x-request-id"]


def test_prompt_hashing_and_off(
    make_sim: Any, make_gateway: Any, client: httpx.Client, tmp_path: Any
) -> None:
    sim = make_sim()
    gw = make_gateway({"m": [{"name": "a", "url": sim.url, "served_model": "m"}]})
    client.post(gw.url + "/v1/chat/completions", json=chat_body("secret plans"), headers=auth_headers())
    record = gw.audit_records(1)[-1]
    assert len(record["prompt_sha256"]) == 64 and "prompt" not in record
    assert "secret plans" not in (tmp_path / "audit.jsonl").read_text()
    assert JWT_SECRET not in (tmp_path / "audit.jsonl").read_text()


def test_input_cleaning_reaches_upstream_clean(
    make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    sim = make_sim()
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]},
        sanitize={"strip_html": True},
        limits={"max_input_chars": 20, "on_overlong": "reject"},
        audit={"prompts": "full"},
    )
    dirty = "  <p>abc\u202edef</p>&amp;\u200b  "
    response = client.post(gw.url + "/v1/chat/completions", json=chat_body(dirty), headers=auth_headers())
    assert response.status_code == 200
    assert gw.audit_records(1)[-1]["prompt"][0]["content"] == "abcdef\n&"
    too_long = client.post(gw.url + "/v1/chat/completions", json=chat_body("x" * 21), headers=auth_headers())
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "input_too_long"


def test_metrics_and_dump_state(make_sim: Any, make_gateway: Any, client: httpx.Client) -> None:
    sim = make_sim(ttft_s=5)
    gw = make_gateway({"m": [{"name": "a", "url": sim.url, "served_model": "m"}]})
    sim.configure(ttft_s=0)
    client.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=auth_headers())
    client.post(gw.url + "/v1/chat/completions", json=chat_body(stream=True), headers=auth_headers())
    sim.configure(ttft_s=5)
    with httpx.Client(timeout=10) as slow:
        pending = slow.build_request(
            "POST", gw.url + "/v1/chat/completions", json=chat_body(), headers=auth_headers()
        )

        def send() -> None:
            with contextlib.suppress(httpx.HTTPError):
                slow.send(pending)

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        assert wait_for(lambda: sim.stats()["running"] == 1)
        state = client.get(gw.internal_url + "/debug/dump_state").json()
    upstream = state["upstreams"][0]
    assert upstream["breaker"]["state"] == "closed" and upstream["in_flight"] == 1
    assert upstream["vllm"]["num_requests_running"] == 1.0
    assert upstream["vllm"]["num_requests_waiting"] == 0.0
    assert "kv_cache_usage_perc" in upstream["vllm"]
    metrics = client.get(gw.internal_url + "/metrics").text
    for name in (
        'http_request_duration_seconds_bucket{le="0.001",method="POST",route="/v1/chat/completions",status="200"}',
        'llm_gateway_requests_total{model="m",outcome="ok",upstream="a"} 2.0',
        'llm_gateway_prompt_tokens_total{model="m",upstream="a"}',
        'llm_gateway_completion_tokens_total{model="m",upstream="a"} 32.0',
        'llm_gateway_time_to_first_token_seconds_count{model="m",upstream="a"} 1.0',
        'llm_gateway_upstream_breaker_state{model="m",upstream="a"} 0.0',
        'llm_gateway_upstream_in_flight_requests{model="m",upstream="a"} 1.0',
    ):
        assert name in metrics, name
    assert client.get(gw.url + "/metrics").status_code == 404  # not on the public listener


def test_models_listing_is_audited_rejected_or_not(
    make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    sim = make_sim()
    gw = make_gateway({"m": [{"name": "a", "url": sim.url, "served_model": "m"}]})
    denied = client.get(gw.url + "/v1/models", headers={"X-App-Name": "scanner", "X-Request-ID": "probe-1"})
    assert denied.status_code == 401 and denied.headers["x-request-id"] == "probe-1"
    forged = client.get(gw.url + "/v1/models", headers={"Authorization": "Bearer not.a.jwt"})
    assert forged.status_code == 401
    listed = client.get(gw.url + "/v1/models", headers=auth_headers("carol", **{"X-App-Name": "kb-qa"}))
    assert listed.status_code == 200 and listed.json()["data"][0]["id"] == "m"
    # liveness and readiness probes are not audited (they never reach auth)
    assert client.get(gw.url + "/health").status_code == 200
    assert wait_for(lambda: client.get(gw.url + "/ready").status_code == 200)
    records = gw.audit_records(3)
    assert [r["endpoint"] for r in records] == ["models"] * 3
    first, second, ok = records
    assert first["request_id"] == "probe-1" and first["app"] == "scanner" and first["user"] is None
    assert first["status"] == 401 and first["outcome"] == "rejected"
    assert first["error_type"] == "unauthorized" and first["client"] == "127.0.0.1"
    assert second["status"] == 401 and second["request_id"] == forged.headers["x-request-id"]
    assert ok["status"] == 200 and ok["outcome"] == "ok" and ok["user"] == "carol"
    assert ok["request_id"] == listed.headers["x-request-id"] and ok["app"] == "kb-qa"
    assert len(gw.audit_records(4, timeout=0.3)) == 3
