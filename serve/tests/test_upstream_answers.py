"""Answers the simulator does not give: an unreadable 200, and tool calls through the safety filter."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from gwtest import auth_headers, chat_body, sse, token

SAFETY_MASK = {"terms": ["forbidden"], "action": "mask"}
SAFETY_BLOCK = {"terms": ["forbidden"], "action": "block", "block_message": "[blocked]"}


def _upstream(url: str) -> dict[str, list[dict[str, Any]]]:
    return {"m": [{"name": "a", "url": url, "served_model": "m"}]}


def _breaker(gw: Any) -> str:
    return str(gw.bg.call(lambda: gw.gateway.runtime.upstreams()[0].breaker.state.name))


@pytest.mark.parametrize("body", [b"<html>oops</html>", b"[1, 2]", b'{"choices": 7}'])
def test_unreadable_200_is_a_502_and_a_breaker_failure(
    make_scripted: Any, make_gateway: Any, client: httpx.Client, body: bytes
) -> None:
    upstream = make_scripted(body)
    gw = make_gateway(_upstream(upstream.url), breaker={"failures_to_open": 2, "open_s": 600})
    for _ in range(2):
        response = client.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=auth_headers())
        assert response.status_code == 502 and response.json()["error"]["type"] == "server_error"
    assert _breaker(gw) == "OPEN"
    record = gw.audit_records(2)[-1]
    assert (record["outcome"], record["error_type"]) == ("upstream_error", "bad_upstream_response")


def _tool_answer(name: str, arguments: str) -> bytes:
    call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    doc = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6},
    }
    return json.dumps(doc).encode()


def _tool_stream(name: str, pieces: list[str]) -> bytes:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    start = {"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": ""}}
    events = [chunk({"role": "assistant", "content": None, "tool_calls": [start]})]
    events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces]
    events.append(chunk({}, "tool_calls"))  # OpenAI's end: an empty delta
    return sse(*events)


def _client(gw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=token(), max_retries=0, timeout=20)


def test_tool_call_names_and_arguments_are_masked(make_scripted: Any, make_gateway: Any) -> None:
    upstream = make_scripted(_tool_answer("get_forbidden", '{"q": "a forbidden thing"}'))
    gw = make_gateway(_upstream(upstream.url), safety=SAFETY_MASK)
    answer = _client(gw).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    call = answer.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_*********"  # type: ignore[union-attr]
    assert call.function.arguments == '{"q": "a ********* thing"}'  # type: ignore[union-attr]
    assert gw.audit_records(1)[-1]["safety_action"] == "mask"


def test_tool_call_arguments_are_blocked(make_scripted: Any, make_gateway: Any, client: httpx.Client) -> None:
    upstream = make_scripted(_tool_answer("lookup", '{"q": "forbidden"}'))
    gw = make_gateway(_upstream(upstream.url), safety=SAFETY_BLOCK)
    response = client.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=auth_headers())
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "content_filter" and "tool_calls" not in choice["message"]
    assert "forbidden" not in response.text and response.headers["x-llm-gateway-safety"] == "block"


def test_streamed_tool_call_arguments_are_masked_across_chunks(make_scripted: Any, make_gateway: Any) -> None:
    # the term is split over two chunks, and its end waits in the filter until the empty-delta end
    upstream = make_scripted(_tool_stream("lookup", ['{"q": "forb', 'idden"}']), b"text/event-stream")
    gw = make_gateway(_upstream(upstream.url), safety=SAFETY_MASK)
    chunks = list(
        _client(gw).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert [t.function.name for t in calls if t.function and t.function.name] == ["lookup"]
    arguments = "".join(t.function.arguments or "" for t in calls if t.function)
    assert arguments == '{"q": "*********"}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_streamed_tool_call_name_and_arguments_block(
    make_scripted: Any, make_gateway: Any, client: httpx.Client
) -> None:
    for name, pieces in (("forbidden_fn", ["{}"]), ("lookup", ['{"q": "forb', 'idden"}'])):
        upstream = make_scripted(_tool_stream(name, pieces), b"text/event-stream")
        gw = make_gateway(_upstream(upstream.url), safety=SAFETY_BLOCK)
        response = client.post(
            gw.url + "/v1/chat/completions", json=chat_body(stream=True), headers=auth_headers()
        )
        assert "forb" not in response.text
        assert '"finish_reason":"content_filter"' in response.text
        assert response.text.rstrip().endswith("data: [DONE]")
