"""The rest of the public surface: probes, /v1/models auth, unknown paths, body limits, the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from gwtest import auth_headers, chat_body, wait_for

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gateway.yaml"


def test_surface(make_sim: Any, make_gateway: Any, client: httpx.Client) -> None:
    sim = make_sim()
    gw = make_gateway(
        {"m": [{"name": "a", "url": sim.url, "served_model": "m"}]}, limits={"max_body_bytes": 2048}
    )
    assert client.get(gw.url + "/health").json() == {"status": "ok"}
    # ready once the first probe has reached the upstream (test_resilience.py: not before)
    assert wait_for(lambda: client.get(gw.url + "/ready").status_code == 200)
    assert client.get(gw.url + "/ready").json() == {"status": "ready", "models": {"m": True}}
    assert client.get(gw.url + "/v1/models").status_code == 401
    assert client.get(gw.url + "/v1/models", headers=auth_headers()).json()["data"][0]["id"] == "m"
    missing = client.get(gw.url + "/v1/embeddings", headers=auth_headers())
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "invalid_request_error"
    wrong_method = client.get(gw.url + "/v1/chat/completions", headers=auth_headers())
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    big = client.post(gw.url + "/v1/chat/completions", json=chat_body("x" * 4096), headers=auth_headers())
    assert big.status_code == 413
    not_json = client.post(gw.url + "/v1/chat/completions", content=b"{nope", headers=auth_headers())
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "invalid_json"
    as_string = client.post(
        gw.url + "/v1/chat/completions", json=chat_body(max_tokens="5"), headers=auth_headers()
    )
    assert as_string.status_code == 400 and as_string.json()["error"]["param"] == "max_tokens"
    # the body is parsed once (orjson); a number orjson refuses still gets a 400 naming the field
    huge = client.post(
        gw.url + "/v1/chat/completions",
        content=b'{"model": "m", "messages": [], "temperature": 1e999999}',
        headers=auth_headers(),
    )
    assert huge.status_code == 400 and huge.json()["error"]["param"] == "temperature"
    past_64_bits = client.post(
        gw.url + "/v1/chat/completions",
        content=b'{"model": "m", "messages": [], "seed": 123456789012345678901234567890}',
        headers=auth_headers(),
    )
    assert past_64_bits.status_code == 400 and past_64_bits.json()["error"]["param"] == "seed"
    array = client.post(gw.url + "/v1/chat/completions", json=[1], headers=auth_headers())
    assert (
        array.status_code == 400
        and array.json()["error"]["message"] == "The request body must be a JSON object."
    )


def test_cli_check_names_the_bad_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("on_overlong: reject", "on_overlong: chop"))
    (tmp_path / "blocked_terms.txt").write_text("x\n")
    result = subprocess.run(
        [sys.executable, "-m", "llm_gateway.cli", "--config", str(bad), "--check"],
        capture_output=True,
        text=True,
        env={"GATEWAY_JWT_SECRET": "s" * 40, "PATH": ""},
        timeout=60,
    )
    assert result.returncode == 2
    assert "limits.on_overlong" in result.stderr


def test_cli_check_refuses_an_unwritable_audit_path(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    missing = tmp_path / "no-such-dir" / "audit.jsonl"
    config.write_text(EXAMPLE.read_text().replace("/var/log/llm-gateway/audit.jsonl", str(missing)))
    (tmp_path / "blocked_terms.txt").write_text("x\n")
    result = subprocess.run(
        [sys.executable, "-m", "llm_gateway.cli", "--config", str(config), "--check"],
        capture_output=True,
        text=True,
        env={"GATEWAY_JWT_SECRET": "s" * 40, "PATH": ""},
        timeout=60,
    )
    assert result.returncode == 2, result.stdout
    assert f"audit.path: directory {missing.parent} does not exist" in result.stderr
