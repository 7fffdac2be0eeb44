"""Unit tests of the pure parts: cleaning, safety matching, breaker, routing, auth, config."""

from __future__ import annotations

import itertools
import json
import logging
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from gwtest import JWT_ENV, JWT_SECRET
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_gateway.auth import JwtAuth
from llm_gateway.breaker import BreakerState, CircuitBreaker
from llm_gateway.config import AuthConfig, ConfigError, UpstreamConfig, load_config, parse_config
from llm_gateway.errors import ApiError
from llm_gateway.routing import rank
from llm_gateway.safety import SafetyPolicy, TermMatcher
from llm_gateway.sanitize import INVISIBLE_CHARS, clean_payload, clean_text, html_to_text
from llm_gateway.upstream import Upstream, parse_vllm_figures

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gateway.yaml"

# --- cleaning -----------------------------------------------------------------------------


def test_bidi_and_invisible_controls_are_stripped() -> None:
    text = "\u202eabc\u202c \u2066x\u2069\u200by\ufeffz\u00ad\U000e0041\x07 "
    assert clean_text(text, strip_html=False) == "abc xyz"
    assert clean_text("emoji 👨\u200d👩 and ZWNJ می\u200cخواهم", strip_html=False).count("\u200d") == 1


def test_html_to_text_keeps_comparisons() -> None:
    html = "<div><h1>Title</h1><script>evil()</script><p>a &lt; b &amp;&amp; c</p><!-- x --></div>"
    assert html_to_text(html).split() == ["Title", "a", "<", "b", "&&", "c"]
    assert clean_text("if a < b and c > d", strip_html=True) == "if a < b and c > d"


def test_overlong_input_rejected_or_truncated() -> None:
    payload: dict[str, Any] = {
        "messages": [{"role": "system", "content": "short"}, {"role": "user", "content": "x" * 100}]
    }
    with pytest.raises(ApiError) as info:
        clean_payload(
            json.loads(json.dumps(payload)), chat=True, strip_html=False, max_chars=50, truncate=False
        )
    assert info.value.status == 400 and info.value.code == "input_too_long"
    total, truncated = clean_payload(payload, chat=True, strip_html=False, max_chars=50, truncate=True)
    assert (total, truncated) == (50, True)
    assert payload["messages"][0]["content"] == "short" and payload["messages"][1]["content"] == "x" * 45


@given(st.text())
def test_cleaned_text_has_no_invisible_characters(text: str) -> None:
    cleaned = clean_text(text, strip_html=True)
    assert not set(cleaned) & INVISIBLE_CHARS
    assert cleaned == cleaned.strip()


# --- safety -------------------------------------------------------------------------------


def _policy(terms: list[str], action: str = "mask") -> SafetyPolicy:
    return SafetyPolicy(TermMatcher(terms), action)  # type: ignore[arg-type]


def test_matcher_finds_overlapping_terms_case_insensitively() -> None:
    policy = _policy(["Secret", "cretin", "机密"])
    assert policy.check("a SECRETIN 机密!").text == "a ******** **!"


@settings(max_examples=1000)
@given(
    text=st.text(alphabet="abcsecrtx机密 ", max_size=60),
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=8),
)
def test_stream_filter_equals_whole_text_masking(text: str, cuts: list[int]) -> None:
    policy = _policy(["secret", "机密", "cc"])
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    flt = policy.stream()
    out = "".join(flt.feed(text[a:b]) for a, b in itertools.pairwise(bounds)) + flt.flush()
    assert out == policy.check(text).text


@settings(max_examples=300)
@given(prefix=st.text(alphabet="ab ", max_size=20), split=st.integers(min_value=1, max_value=5))
def test_stream_block_never_leaks_any_part_of_the_term(prefix: str, split: int) -> None:
    policy = _policy(["forbid"], "block")
    flt = policy.stream()
    text = prefix + "forbid" + " tail"
    cut = len(prefix) + split
    sent = flt.feed(text[:cut]) + flt.feed(text[cut:]) + flt.flush()
    assert flt.blocked
    assert prefix.startswith(sent)  # nothing of the term, nor after it, reached the client


def test_no_terms_is_a_pass_through() -> None:
    flt = _policy([]).stream()
    assert flt.feed("anything") == "anything"


# --- breaker ------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breaker_cycle() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures_to_open=3, open_s=10, clock=clock)
    for _ in range(2):
        breaker.record_failure("x")
    breaker.record_success()  # resets the count
    for _ in range(3):
        assert breaker.acquire()
        breaker.record_failure("x")
    assert breaker.state is BreakerState.OPEN and not breaker.acquire()
    clock.now = 10
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.acquire() and not breaker.acquire()  # a single trial
    breaker.record_failure("still down")
    assert breaker.state is BreakerState.OPEN
    clock.now = 20
    breaker.record_probe(True)
    assert breaker.state is BreakerState.CLOSED


def test_reached_only_by_a_success_and_never_lost() -> None:
    for success in ("request", "probe"):
        breaker = CircuitBreaker(failures_to_open=100, open_s=10, clock=Clock())
        assert breaker.state is BreakerState.CLOSED and not breaker.reached  # closed is not reached
        breaker.record_failure("connect timed out")
        breaker.record_probe(False, "timed out")
        breaker.record_neutral()
        assert not breaker.reached and not breaker.snapshot()["reached"]
        if success == "request":
            breaker.record_success()
        else:
            breaker.record_probe(True)
        assert breaker.reached and breaker.snapshot()["reached"]
        breaker.record_failure("down")
        assert breaker.reached


def test_overload_neither_opens_nor_closes() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures_to_open=1, open_s=10, clock=clock)
    for _ in range(10):  # closed stays closed, however many
        assert breaker.acquire()
        breaker.record_neutral()
    assert breaker.state is BreakerState.CLOSED
    breaker.record_failure("down")
    breaker.record_neutral()  # open stays open
    assert breaker.state is BreakerState.OPEN and not breaker.acquire()
    clock.now = 10
    for _ in range(3):  # half-open stays half-open, and the trial slot is given back
        assert breaker.acquire() and not breaker.acquire()
        breaker.record_neutral()
        assert breaker.state is BreakerState.HALF_OPEN
    breaker.record_failure("still down")  # a neutral answer did not reset the clock either
    assert breaker.state is BreakerState.OPEN


# --- routing ------------------------------------------------------------------------------


def _upstreams(weights: dict[str, int]) -> list[Upstream]:
    config = parse_config(
        {
            "auth": {"mode": "none"},
            "models": {
                "m": {
                    "upstreams": [
                        {"name": n, "url": "http://127.0.0.1:1", "served_model": "m", "weight": w}
                        for n, w in weights.items()
                    ]
                }
            },
            "audit": {"path": "-"},
        }
    )
    return [Upstream("m", u, config.breaker) for u in config.models["m"].upstreams]


def test_canary_split_follows_weights_and_is_sticky() -> None:
    upstreams = _upstreams({"stable": 90, "canary": 10})
    choices = {f"user-{i}": rank(f"sub:user-{i}", upstreams)[0].name for i in range(10_000)}
    share = sum(c == "canary" for c in choices.values()) / len(choices)
    assert abs(share - 0.10) < 0.02
    assert all(rank(f"sub:{u}", upstreams)[0].name == c for u, c in list(choices.items())[:500])


def test_weight_change_moves_only_the_users_it_must() -> None:
    before = _upstreams({"stable": 90, "canary": 10})
    after = _upstreams({"stable": 50, "canary": 50})
    moved_wrong_way = sum(
        rank(f"sub:{i}", before)[0].name == "canary" and rank(f"sub:{i}", after)[0].name == "stable"
        for i in range(5000)
    )
    assert moved_wrong_way == 0  # growing the canary only adds users to it
    assert [u.name for u in rank("x", _upstreams({"a": 1, "b": 0}))] == ["a"]


# --- auth ---------------------------------------------------------------------------------


def test_hs256_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = JwtAuth(AuthConfig(mode="jwt", hs256_secret_env=JWT_ENV))
    good = jwt.encode({"sub": "u1", "exp": int(time.time()) + 60}, JWT_SECRET, algorithm="HS256")
    assert auth.authenticate(f"Bearer {good}") == "u1"
    assert auth.authenticate(f"Bearer {good}") == "u1"  # cached
    expired = jwt.encode({"sub": "u1", "exp": int(time.time()) - 3600}, JWT_SECRET, algorithm="HS256")
    forged = jwt.encode({"sub": "u1", "exp": int(time.time()) + 60}, "another-secret-" * 4, algorithm="HS256")
    no_sub = jwt.encode({"exp": int(time.time()) + 60}, JWT_SECRET, algorithm="HS256")
    none_alg = jwt.encode({"sub": "u1", "exp": int(time.time()) + 60}, None, algorithm="none")
    for bad in (
        None,
        "Basic abc",
        f"Bearer {expired}",
        f"Bearer {forged}",
        f"Bearer {no_sub}",
        f"Bearer {none_alg}",
    ):
        with pytest.raises(ApiError) as info:
            auth.authenticate(bad)
        assert info.value.status == 401
        assert JWT_SECRET not in info.value.message


def test_rs256_from_jwks(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    auth = JwtAuth(AuthConfig(mode="jwt", jwks_file=jwks, audience="llm"))
    claims = {"sub": "svc", "aud": "llm", "exp": int(time.time()) + 60}
    good = jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})
    assert auth.authenticate(f"Bearer {good}") == "svc"
    wrong_aud = jwt.encode({**claims, "aud": "other"}, key, algorithm="RS256", headers={"kid": "k1"})
    hs_confusion = jwt.encode(claims, "k" * 32, algorithm="HS256", headers={"kid": "k1"})
    for bad in (wrong_aud, hs_confusion):
        with pytest.raises(ApiError):
            auth.authenticate(f"Bearer {bad}")


# --- config -------------------------------------------------------------------------------


def test_example_config_is_valid(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GATEWAY_JWT_SECRET", "x" * 40)
    example = tmp_path / "gateway.yaml"  # its audit directory, /var/log/llm-gateway, is not here
    example.write_text(
        EXAMPLE.read_text().replace("/var/log/llm-gateway/audit.jsonl", str(tmp_path / "audit.jsonl"))
    )
    (tmp_path / "blocked_terms.txt").write_text((EXAMPLE.parent / "blocked_terms.txt").read_text())
    config = load_config(example)
    assert [u.weight for u in config.models["qwen2-7b"].upstreams] == [90, 10]
    assert config.fallback.message == "系统繁忙，请稍后再试"


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"listen": {"port": 8000, "hots": "x"}}, "listen.hots: unknown key"),
        ({"limits": {"on_overlong": "cut"}}, "limits.on_overlong"),
        (
            {"models": {"m": {"upstreams": [{"name": "a", "url": "ftp://x", "served_model": "m"}]}}},
            "models.m.upstreams.0.url",
        ),
        (
            {
                "models": {
                    "m": {
                        "upstreams": [{"name": "a", "url": "http://x:1", "served_model": "m", "weight": -1}]
                    }
                }
            },
            "models.m.upstreams.0.weight",
        ),
        ({"auth": {"mode": "jwt"}}, "auth: "),
        ({"auth": {"mode": "jwt", "hs256_secret_env": "LLM_GATEWAY_UNSET_VAR"}}, "auth.hs256_secret_env"),
        ({"timeouts": {"first_token_s": 500, "total_s": 300}}, "timeouts: "),
        ({"safety": {"terms_file": "/nonexistent/terms.txt"}}, "safety.terms_file"),
    ],
)
def test_bad_config_names_the_key(change: dict[str, Any], key: str) -> None:
    data: dict[str, Any] = {
        "auth": {"mode": "none"},
        "models": {"m": {"upstreams": [{"name": "a", "url": "http://127.0.0.1:1", "served_model": "m"}]}},
        "audit": {"path": "-"},
        **change,
    }
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert key in str(info.value)


def test_auth_section_is_required_and_none_must_be_explicit() -> None:
    data: dict[str, Any] = {
        "models": {"m": {"upstreams": [{"name": "a", "url": "http://127.0.0.1:1", "served_model": "m"}]}},
        "audit": {"path": "-"},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert str(info.value).startswith("auth: required") and "mode: none" in str(info.value)
    with pytest.raises(ConfigError, match="auth: "):
        parse_config({**data, "auth": {}})  # mode defaults to jwt, which needs a key source
    assert parse_config({**data, "auth": {"mode": "none"}}).auth.mode == "none"


def test_short_hs256_secret_is_warned_about_without_the_secret(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    short = "tooshort-0123456789abcdef-xyz"  # 29 bytes
    monkeypatch.setenv("LLM_GATEWAY_SHORT_SECRET", short)
    with caplog.at_level(logging.WARNING, logger="llm_gateway.auth"):
        JwtAuth(AuthConfig(mode="jwt", hs256_secret_env="LLM_GATEWAY_SHORT_SECRET"))
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "LLM_GATEWAY_SHORT_SECRET" in message and "32 bytes" in message
    assert short not in message and str(len(short)) not in message
    caplog.clear()
    monkeypatch.setenv("LLM_GATEWAY_SHORT_SECRET", "é" * 16)  # 32 bytes in UTF-8: long enough
    with caplog.at_level(logging.WARNING, logger="llm_gateway.auth"):
        JwtAuth(AuthConfig(mode="jwt", hs256_secret_env="LLM_GATEWAY_SHORT_SECRET"))
        JwtAuth(AuthConfig(mode="jwt", hs256_secret_env=JWT_ENV))
    assert caplog.records == []


def test_upstream_url_parts() -> None:
    upstream = UpstreamConfig(name="a", url="http://vllm.serving:8000/", served_model="m")
    assert (upstream.host, upstream.port, upstream.url) == ("vllm.serving", 8000, "http://vllm.serving:8000")


def test_vllm_metrics_parsing() -> None:
    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{model_name="a"} 3.0\n'
        'vllm:num_requests_waiting{model_name="a"} 7.0\n'
        'vllm:gpu_cache_usage_perc{model_name="a"} 0.5\n'
        'vllm:time_to_first_token_seconds_sum{model_name="a"} 9.0\n'
    )
    assert parse_vllm_figures(text) == {
        "num_requests_running": 3.0,
        "num_requests_waiting": 7.0,
        "kv_cache_usage_perc": 0.5,
    }


def test_audit_path_must_be_writable_at_load(tmp_path: Path) -> None:
    data: dict[str, Any] = {
        "auth": {"mode": "none"},
        "models": {"m": {"upstreams": [{"name": "a", "url": "http://127.0.0.1:1", "served_model": "m"}]}},
    }
    (tmp_path / "a-file").write_text("")
    for path, problem in (
        (tmp_path / "missing" / "audit.jsonl", "does not exist"),
        (tmp_path / "a-file" / "audit.jsonl", "does not exist"),
        (tmp_path, "is a directory"),
    ):
        with pytest.raises(ConfigError) as info:
            parse_config({**data, "audit": {"path": str(path)}})
        assert str(info.value).startswith("audit.path: ") and problem in str(info.value)
    for fine in (str(tmp_path / "new.jsonl"), str(tmp_path / "a-file"), "-"):
        assert parse_config({**data, "audit": {"path": fine}}).audit.path == fine


def test_audit_file_gone_after_validation_names_audit_path(tmp_path: Path) -> None:
    from llm_gateway.runtime import Gateway

    directory = tmp_path / "logs"
    directory.mkdir()
    config = parse_config(
        {
            "auth": {"mode": "none"},
            "models": {"m": {"upstreams": [{"name": "a", "url": "http://127.0.0.1:1", "served_model": "m"}]}},
            "audit": {"path": str(directory / "audit.jsonl")},
        }
    )
    directory.rmdir()
    with pytest.raises(ConfigError, match=r"^audit\.path: cannot open"):
        Gateway(config)


async def test_reload_to_an_unwritable_audit_path_is_refused(tmp_path: Path) -> None:
    from llm_gateway.runtime import Gateway

    config_path = tmp_path / "gateway.json"
    data: dict[str, Any] = {
        "auth": {"mode": "none"},
        "models": {"m": {"upstreams": [{"name": "a", "url": "http://127.0.0.1:1", "served_model": "m"}]}},
        "audit": {"path": str(tmp_path / "audit.jsonl")},
    }
    config_path.write_text(json.dumps(data))
    gateway = Gateway(load_config(config_path), config_path)
    try:
        data["audit"] = {"path": str(tmp_path / "gone" / "audit.jsonl")}
        config_path.write_text(json.dumps(data))
        assert not await gateway.reload()
        assert gateway.audit.path == str(tmp_path / "audit.jsonl")  # the running trail stays
    finally:
        await gateway.close()
