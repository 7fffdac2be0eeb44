"""Kubelet TLS bootstrap and the CSR approver/signer of kube-controller-manager, for the lab.

* ``bootstrap()``: what a joining kubelet does with ``--bootstrap-kubeconfig`` (a bootstrap token):
  make a key, post a CertificateSigningRequest (signer kubernetes.io/kube-apiserver-client-kubelet,
  CN=system:node:NAME, O=system:nodes), wait for the certificate, write
  /var/lib/kubelet/pki/kubelet-client-current.pem and the ``--kubeconfig`` file pointing at it.
* ``Signer``: the part of the kube-controller-manager static Pod that approves such CSRs from bootstrap
  tokens (csrapproving) and signs approved ones with ``--cluster-signing-{cert,key}-file`` (csrsigning).
  The control-plane kubelet stand-in runs it while /etc/kubernetes/manifests/kube-controller-manager.yaml
  exists, with that manifest's flags and kubeconfig, as the real kubelet would run the Pod.
"""

from __future__ import annotations

import base64
import os
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .nodeclient import ApiError, Client
from .yamlio import dump, load_yaml_file

SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
PKI_DIR = "/var/lib/kubelet/pki"


def _openssl(*args: str, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(["openssl", *args], input=stdin, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def bootstrap(
    bootstrap_kubeconfig: str, kubeconfig: str, node_name: str, log: Any, cert_dir: str = PKI_DIR
) -> None:
    boot = load_yaml_file(bootstrap_kubeconfig)
    client = Client.from_kubeconfig(bootstrap_kubeconfig)
    pki = Path(cert_dir)
    pki.mkdir(parents=True, exist_ok=True)
    key = _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout")
    with tempfile.NamedTemporaryFile() as key_file:
        key_file.write(key)
        key_file.flush()
        request = _openssl(
            "req", "-new", "-key", key_file.name, "-subj", f"/O=system:nodes/CN=system:node:{node_name}"
        )
    body = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "node-csr-"},
        "spec": {
            "request": base64.b64encode(request).decode(),
            "signerName": SIGNER,
            "usages": ["digital signature", "client auth"],
        },
    }
    created = client.create(CSR_PATH, body)
    name = created["metadata"]["name"]
    log(f"TLS bootstrap: posted CertificateSigningRequest {name}; waiting for it to be approved and signed")
    deadline = time.monotonic() + 300
    while True:
        csr = client.get(f"{CSR_PATH}/{name}")
        status = csr.get("status", {})
        if any(c.get("type") in ("Denied", "Failed") for c in status.get("conditions") or []):
            raise RuntimeError(
                f"CertificateSigningRequest {name} was denied or failed: {status.get('conditions')}"
            )
        if status.get("certificate"):
            cert = base64.b64decode(status["certificate"])
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"CertificateSigningRequest {name} was not signed within 300s")
        time.sleep(1)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H-%M-%S")
    pem = pki / f"kubelet-client-{stamp}.pem"
    fd = os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(cert + key)
    current = pki / "kubelet-client-current.pem"
    current.unlink(missing_ok=True)
    current.symlink_to(pem)
    cluster = boot["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"cluster": cluster["cluster"], "name": "default-cluster"}],
        "contexts": [
            {
                "context": {"cluster": "default-cluster", "namespace": "default", "user": "default-auth"},
                "name": "default-context",
            }
        ],
        "current-context": "default-context",
        "preferences": {},
        "users": [
            {"name": "default-auth", "user": {"client-certificate": str(current), "client-key": str(current)}}
        ],
    }
    fd = os.open(kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(dump(config))
    log(f"TLS bootstrap: client certificate written; {kubeconfig} points at {current}")


def manifest_flags(manifest: Path) -> dict[str, str]:
    pod = load_yaml_file(str(manifest))
    flags: dict[str, str] = {}
    for word in pod["spec"]["containers"][0].get("command", []):
        if word.startswith("--") and "=" in word:
            key, value = word[2:].split("=", 1)
            flags[key] = value
    return flags


class Signer:
    """csrapproving + csrsigning for kubelet client certificates requested with bootstrap tokens."""

    def __init__(self, manifest: Path, log: Any) -> None:
        self.manifest = manifest
        self.log = log
        self.client: Client | None = None
        self.flags: dict[str, str] = {}

    def sync(self) -> None:
        if not self.manifest.is_file():
            self.client = None
            return
        if self.client is None:
            self.flags = manifest_flags(self.manifest)
            self.client = Client.from_kubeconfig(self.flags["kubeconfig"])
        try:
            items = self.client.get(CSR_PATH).get("items", [])
        except ApiError as err:
            self.log(f"csr signer: {err}")
            return
        for csr in items:
            try:
                self._handle(csr)
            except (ApiError, RuntimeError, KeyError) as err:
                self.log(f"csr signer: {csr['metadata']['name']}: {err}")

    def _handle(self, csr: dict[str, Any]) -> None:
        assert self.client is not None
        spec, status = csr.get("spec", {}), csr.get("status", {})
        if spec.get("signerName") != SIGNER or status.get("certificate"):
            return
        conditions = {c.get("type") for c in status.get("conditions") or []}
        if conditions & {"Denied", "Failed"}:
            return
        name = csr["metadata"]["name"]
        request = base64.b64decode(spec["request"])
        subject = _openssl("req", "-noout", "-subject", "-nameopt", "RFC2253", stdin=request).decode().strip()
        if "Approved" not in conditions:
            groups = spec.get("groups") or []
            # csrapproving: a node client certificate (O=system:nodes, CN=system:node:...) asked for with a
            # bootstrap token bound to nodeclient auto-approval (kubeadm:node-autoapprove-bootstrap)
            if "O=system:nodes" not in subject or "CN=system:node:" not in subject:
                return
            if groups and "system:bootstrappers" not in groups and "system:nodes" not in groups:
                return
            csr.setdefault("status", {})["conditions"] = [
                *(status.get("conditions") or []),
                {
                    "type": "Approved",
                    "status": "True",
                    "reason": "AutoApproved",
                    "message": "Auto approving kubelet client certificate after SubjectAccessReview.",
                    "lastUpdateTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                },
            ]
            csr = self.client.request("PUT", f"{CSR_PATH}/{name}/approval", csr)
        days = "365"
        with tempfile.NamedTemporaryFile("w", suffix=".ext") as ext:
            ext.write(
                "[v3]\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                "extendedKeyUsage=clientAuth\nauthorityKeyIdentifier=keyid\n"
            )
            ext.flush()
            cert = _openssl(
                "x509", "-req", "-CA", self.flags["cluster-signing-cert-file"],
                "-CAkey", self.flags["cluster-signing-key-file"], "-set_serial", "0x" + os.urandom(8).hex(),
                "-days", days, "-extfile", ext.name, "-extensions", "v3",
                stdin=request,
            )  # fmt: skip
        csr.setdefault("status", {})["certificate"] = base64.b64encode(cert).decode()
        self.client.request("PUT", f"{CSR_PATH}/{name}/status", csr)
        self.log(f"csr signer: signed {name} ({subject})")
