"""Every way a real server ends an answer, through the gateway's safety filter, with the official
openai client: the last text with the finish reason (vLLM), an empty delta (OpenAI), a usage
chunk nobody asked for, and [DONE] right after the text. The filter holds back the tail of the
text (a term could still be completing); whichever form the end takes, the tail must arrive."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from gwtest import token
from vllm_sim.engine import STREAM_ENDS

REPLY = ["echo: ", "hello", " stream"]
TEXT = "echo: hello stream"
# a long term: the filter holds back its length - 1 characters, more than the last chunk
SAFETY = {"terms": ["a-term-longer-than-the-tail"], "action": "mask"}


@pytest.fixture(params=STREAM_ENDS)
def gateway(request: pytest.FixtureRequest, make_sim: Any, make_gateway: Any) -> tuple[Any, str]:
    sim = make_sim(reply=REPLY, stream_end=request.param)
    gw = make_gateway({"m": [{"name": "a", "url": sim.url, "served_model": "m"}]}, safety=SAFETY)
    return gw, request.param


def _client(gw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=token("alice"), max_retries=0, timeout=20)


def _check_audit(gw: Any, end: str) -> None:
    record = gw.audit_records(1)[-1]
    assert record["status"] == 200 and record["outcome"] == "ok"
    assert record["completion_tokens"] == len(REPLY)
    # without a usage chunk the gateway counts content chunks, and says so
    assert record.get("usage_estimated", False) == (end == "done" and record["stream"])


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream_arrives_whole(gateway: tuple[Any, str], include_usage: bool) -> None:
    gw, end = gateway
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = list(
        _client(gw).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True, **options
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ([] if end == "done" else ["stop"])
    usage = [c.usage for c in chunks if c.usage is not None]
    if include_usage and end != "done":
        assert len(usage) == 1 and chunks[-1].usage is not None  # the usage chunk comes last
        assert chunks[-1].usage.completion_tokens == len(REPLY) and not chunks[-1].choices
    else:
        assert usage == []  # not asked for (or not given): none, even if the upstream sent one
    _check_audit(gw, end)


@pytest.mark.parametrize("include_usage", [False, True])
def test_completion_stream_arrives_whole(gateway: tuple[Any, str], include_usage: bool) -> None:
    gw, end = gateway
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = list(_client(gw).completions.create(model="m", prompt="hi", stream=True, **options))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == TEXT
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ([] if end == "done" else ["stop"])
    assert bool([c for c in chunks if c.usage is not None]) == (include_usage and end != "done")
    _check_audit(gw, end)


def test_unary_answers_arrive_whole(gateway: tuple[Any, str]) -> None:
    gw, end = gateway
    client = _client(gw)
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content == TEXT and chat.choices[0].finish_reason == "stop"
    _check_audit(gw, end)
    text = client.completions.create(model="m", prompt="hi")
    assert text.choices[0].text == TEXT and text.choices[0].finish_reason == "stop"
