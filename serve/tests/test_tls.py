"""https:// upstreams: the certificate is verified (a CA bundle, or the system store), by default."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from gwtest import auth_headers, chat_body
from llm_gateway.config import ConfigError, UpstreamConfig

_KEY_PEM = serialization.Encoding.PEM


def _cert(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None, signer: Any, ca: bool
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """A CA made for this test, and a server certificate for 127.0.0.1 signed by it."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test CA", ca_key, None, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert("127.0.0.1", key, ca, ca_key, ca=False)
    files = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "server.pem", "key": tmp_path / "server.key"}
    files["ca"].write_bytes(ca.public_bytes(_KEY_PEM))
    files["cert"].write_bytes(cert.public_bytes(_KEY_PEM))
    files["key"].write_bytes(
        key.private_bytes(_KEY_PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files


def _post(client: httpx.Client, gw: Any) -> httpx.Response:
    return client.post(gw.url + "/v1/chat/completions", json=chat_body(), headers=auth_headers())


def test_https_upstream_verified_with_the_ca_bundle(
    pki: dict[str, Path], make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    sim = make_sim(tls=(pki["cert"], pki["key"]), reply=["over tls"])
    assert sim.url.startswith("https://")
    gw = make_gateway({"m": [{"name": "a", "url": sim.url, "served_model": "m", "ca_file": "ca.pem"}]})
    response = _post(client, gw)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "over tls"


def test_https_upstream_with_an_unknown_ca_is_refused(
    pki: dict[str, Path], make_sim: Any, make_gateway: Any, client: httpx.Client
) -> None:
    # verification is on by default: the system store does not know the test's CA
    sim = make_sim(tls=(pki["cert"], pki["key"]))
    gw = make_gateway({"m": [{"name": "a", "url": sim.url, "served_model": "m"}]}, fallback={"mode": "error"})
    response = _post(client, gw)
    assert response.status_code == 503 and response.headers["x-llm-gateway-fallback"] == "unreachable"
    assert sim.stats()["started"] == 0
    snapshot = gw.bg.call(lambda: gw.gateway.runtime.upstreams()[0].breaker.snapshot())
    assert "CERTIFICATE_VERIFY_FAILED" in snapshot["last_failure"]
    # turning verification off is a written decision
    insecure = make_gateway({"m": [{"name": "a", "url": sim.url, "served_model": "m", "tls_verify": False}]})
    assert _post(client, insecure).status_code == 200


def test_tls_settings_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="https:// upstreams only"):
        UpstreamConfig(name="a", url="http://x:1", served_model="m", ca_file=Path("ca.pem"))
    assert UpstreamConfig(name="a", url="https://vllm", served_model="m").port == 443
    from gwtest import gateway_config

    with pytest.raises(ConfigError, match=r"models\.m\.upstreams\.0\.ca_file: .*missing\.pem"):
        gateway_config(
            {"m": [{"name": "a", "url": "https://x", "served_model": "m", "ca_file": "missing.pem"}]},
            tmp_path,
        )
