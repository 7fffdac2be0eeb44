"""Certificates and keys as kubeadm writes them, made with the openssl command line tool."""

from __future__ import annotations

import hashlib
import ipaddress
import math
import os
import secrets
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


class PkiError(Exception):
    pass


def _openssl(*args: str, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(["openssl", *args], input=stdin, capture_output=True)
    if proc.returncode != 0:
        raise PkiError(f"openssl {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def new_key(path: Path, algorithm: str = "RSA-2048") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if algorithm.startswith("RSA-"):
        pem = _openssl("genrsa", "-traditional", algorithm[4:])
    elif algorithm in ("ECDSA-P256", "ECDSA-P384"):
        curve = "prime256v1" if algorithm.endswith("256") else "secp384r1"
        pem = _openssl("ecparam", "-name", curve, "-genkey", "-noout")
    else:
        raise PkiError(f"encryptionAlgorithm {algorithm!r} is not supported")
    _write_private(path, pem)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def days(duration_hours: float) -> str:
    return str(max(1, math.ceil(duration_hours / 24)))


def _subject(cn: str, orgs: list[str]) -> str:
    return "".join(f"/O={o}" for o in orgs) + f"/CN={cn}"


def new_ca(cert: Path, key: Path, cn: str, hours: float, algorithm: str) -> None:
    new_key(key, algorithm)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(key),
        "-subj",
        f"/CN={cn}",
        "-days",
        days(hours),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
        "-addext",
        f"subjectAltName=DNS:{cn}",
        "-out",
        str(cert),
    )
    os.chmod(cert, 0o644)


@dataclass
class Leaf:
    name: str  # base name: apiserver, apiserver-kubelet-client, ...
    cn: str
    orgs: list[str] = field(default_factory=list)
    usages: tuple[str, ...] = ("clientAuth",)
    dns: list[str] = field(default_factory=list)
    ips: list[str] = field(default_factory=list)


def sign(
    ca_cert: Path, ca_key: Path, leaf: Leaf, cert: Path, key: Path, hours: float, algorithm: str
) -> None:
    new_key(key, algorithm)
    csr = _openssl("req", "-new", "-key", str(key), "-subj", _subject(leaf.cn, leaf.orgs))
    lines = [
        "[v3]",
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={','.join(leaf.usages)}",
        "authorityKeyIdentifier=keyid",
    ]
    sans = [f"DNS:{d}" for d in leaf.dns] + [f"IP:{ipaddress.ip_address(i)}" for i in leaf.ips]
    if sans:
        lines.append("subjectAltName=" + ",".join(dict.fromkeys(sans)))
    with tempfile.NamedTemporaryFile("w", suffix=".ext") as ext:
        ext.write("\n".join(lines) + "\n")
        ext.flush()
        pem = _openssl(
            "x509",
            "-req",
            "-CA",
            str(ca_cert),
            "-CAkey",
            str(ca_key),
            "-set_serial",
            "0x" + secrets.token_hex(8),
            "-days",
            days(hours),
            "-extfile",
            ext.name,
            "-extensions",
            "v3",
            stdin=csr,
        )
    cert.write_bytes(pem)
    os.chmod(cert, 0o644)


def key_pair(private: Path, public: Path) -> None:
    """The service-account signing key pair (sa.key / sa.pub)."""
    new_key(private, "RSA-2048")
    public.write_bytes(_openssl("rsa", "-in", str(private), "-pubout"))
    os.chmod(public, 0o644)


def ca_cert_hash(cert_pem: bytes) -> str:
    """sha256 of the CA's DER SubjectPublicKeyInfo: kubeadm's --discovery-token-ca-cert-hash."""
    public = _openssl("x509", "-pubkey", "-noout", stdin=cert_pem)
    der = _openssl("pkey", "-pubin", "-outform", "der", stdin=public)
    return "sha256:" + hashlib.sha256(der).hexdigest()
