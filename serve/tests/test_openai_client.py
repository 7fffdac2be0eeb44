"""The official openai client against the gateway, through the network."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from gwtest import token


@pytest.fixture
def setup(make_sim: Any, make_gateway: Any) -> tuple[Any, Any]:
    sim = make_sim(reply=["Hello", ",", " world", "!"])
    gw = make_gateway({"m": [{"name": "a", "url": sim.url, "served_model": "m"}]})
    return sim, gw


def _client(gw: Any, api_key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gw.url + "/v1", api_key=api_key or token("alice"), max_retries=0, timeout=20
    )


def test_chat_completion(setup: tuple[Any, Any]) -> None:
    _, gw = setup
    result = _client(gw).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert result.choices[0].message.content == "Hello, world!"
    assert result.model == "m"
    assert result.usage is not None and result.usage.completion_tokens == 4


def test_chat_completion_stream_with_usage(setup: tuple[Any, Any]) -> None:
    _, gw = setup
    stream = _client(gw).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello, world!"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_stream_without_usage_request_has_no_usage_chunk(setup: tuple[Any, Any]) -> None:
    _, gw = setup
    stream = _client(gw).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    chunks = list(stream)
    # the answer came whole and ended (an empty stream would pass the two checks below)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello, world!"
    assert chunks and chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_completion_and_stream(setup: tuple[Any, Any]) -> None:
    _, gw = setup
    client = _client(gw)
    result = client.completions.create(model="m", prompt="Say hi", max_tokens=2)
    assert result.choices[0].text == "Hello,"
    assert result.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(model="m", prompt="Say hi", stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Hello, world!"


def test_models(setup: tuple[Any, Any]) -> None:
    _, gw = setup
    assert [m.id for m in _client(gw).models.list()] == ["m"]


def test_unknown_field_is_400_naming_it(setup: tuple[Any, Any]) -> None:
    _, gw = setup
    with pytest.raises(openai.BadRequestError) as info:
        _client(gw).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], extra_body={"frobnicate": 1}
        )
    assert info.value.status_code == 400
    assert "frobnicate" in info.value.message
    assert info.value.body["param"] == "frobnicate"  # type: ignore[index]


def test_bad_token_is_401(setup: tuple[Any, Any]) -> None:
    _, gw = setup
    with pytest.raises(openai.AuthenticationError):
        _client(gw, api_key="not-a-jwt").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )


def test_unknown_model_is_404(setup: tuple[Any, Any]) -> None:
    _, gw = setup
    with pytest.raises(openai.NotFoundError) as info:
        _client(gw).chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert info.value.code == "model_not_found"


def test_no_upstream_is_503_in_error_mode(make_gateway: Any) -> None:
    # nothing listens on port 9 of loopback: connection refused
    gw = make_gateway(
        {"m": [{"name": "dead", "url": "http://127.0.0.1:9", "served_model": "m"}]},
        fallback={"mode": "error"},
    )
    with pytest.raises(openai.InternalServerError) as info:
        _client(gw).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 503
    assert info.value.response.headers["x-llm-gateway-fallback"] == "unreachable"
