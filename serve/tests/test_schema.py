"""The committed OpenAPI document: valid, in step with the code, and fuzzed against a live gateway."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from gwtest import auth_headers
from hypothesis import HealthCheck, given
from llm_gateway.cli import _openapi
from openapi_spec_validator import validate
from schemathesis import GenerationMode

COMMITTED = Path(__file__).resolve().parents[1] / "openapi.json"
REGENERATE = "llm-gateway --print-openapi > serve/openapi.json"


def test_committed_schema_is_valid_openapi() -> None:
    validate(json.loads(COMMITTED.read_text()))


def test_committed_schema_matches_the_code() -> None:
    generated = json.loads(json.dumps(_openapi()))
    committed = json.loads(COMMITTED.read_text())
    assert generated == committed, f"serve/openapi.json is stale; regenerate it: {REGENERATE}"


def test_schema_names_the_vllm_extras_and_refuses_unknown_fields() -> None:
    schemas = json.loads(COMMITTED.read_text())["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]
    assert chat["additionalProperties"] is False
    for field in ("top_k", "min_p", "repetition_penalty", "guided_json", "stream_options", "seed"):
        assert field in chat["properties"], field


SCHEMA = schemathesis.openapi.from_path(str(COMMITTED))
FUZZ = hypothesis.settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def fuzz_target(make_sim: Any, make_gateway: Any) -> Any:
    sim = make_sim(max_model_len=32, default_max_tokens=4)
    return make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]},
        safety={"terms": ["secret"]},
        sanitize={"strip_html": True},
    )


@pytest.mark.parametrize(
    ("path", "method", "mode"),
    [
        ("/v1/chat/completions", "POST", GenerationMode.POSITIVE),
        ("/v1/chat/completions", "POST", GenerationMode.NEGATIVE),
        ("/v1/completions", "POST", GenerationMode.POSITIVE),
        ("/v1/completions", "POST", GenerationMode.NEGATIVE),
        ("/v1/models", "GET", GenerationMode.POSITIVE),
        ("/ready", "GET", GenerationMode.POSITIVE),
    ],
)
def test_fuzz_finds_no_server_error(fuzz_target: Any, path: str, method: str, mode: GenerationMode) -> None:
    operation = SCHEMA[path][method]
    headers = auth_headers()
    seen: list[int] = []

    @FUZZ
    @given(case=operation.as_strategy(mode))
    def run(case: Any) -> None:
        if (
            isinstance(case.body, dict)
            and case.body.get("model") is not None
            and mode is GenerationMode.POSITIVE
        ):
            case.body["model"] = "m"  # reach the upstream, not only the 404
        response = case.call(base_url=fuzz_target.url, headers=headers, timeout=20)
        seen.append(response.status_code)
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["message"] and error["type"]

    run()
    assert seen
    if mode is GenerationMode.POSITIVE and method == "POST":
        assert 200 in seen, "positive cases never reached the model"
