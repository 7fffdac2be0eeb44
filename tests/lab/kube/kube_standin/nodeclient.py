"""A minimal Kubernetes API client for the node-side stand-ins (kubeadm, kubelet, kube-proxy).

Standard library only: it runs on the lab nodes' /usr/bin/python3. It reads a kubeconfig the way
client-go does for what kubeadm writes (one cluster, one user; client certificate/key data or a bearer
token; certificate-authority-data or the file) and speaks JSON over HTTPS.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .yamlio import load_yaml_file

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    """A non-2xx answer from the API (status code and the Status message) or no answer at all."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message


class Client:
    def __init__(
        self,
        server: str,
        ca_pem: bytes | None,
        cert_pem: bytes | None = None,
        key_pem: bytes | None = None,
        token: str | None = None,
        insecure: bool = False,
        timeout: float = 10.0,
    ) -> None:
        self.server = server.rstrip("/")
        self.ca_pem = ca_pem
        self.token = token
        self.timeout = timeout
        if insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cadata=ca_pem.decode() if ca_pem else None)
        if cert_pem and key_pem:
            # ssl wants files: a private temporary file, removed right after loading.
            fd, path = tempfile.mkstemp(prefix="kube-standin-cred.")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(cert_pem + b"\n" + key_pem)
                ctx.load_cert_chain(path)
            finally:
                os.unlink(path)
        self.ctx = ctx

    @classmethod
    def from_kubeconfig(cls, path: str, timeout: float = 10.0) -> Client:
        config = load_yaml_file(path)
        if not isinstance(config, dict):
            raise ApiError(0, f"{path}: not a kubeconfig")
        current = config.get("current-context")
        contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
        context = contexts.get(current) if current else None
        if context is None and contexts:
            context = next(iter(contexts.values()))
        clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
        users = {u["name"]: u["user"] for u in config.get("users") or []}
        try:
            cluster = clusters[context["cluster"]] if context else next(iter(clusters.values()))
            user = users[context["user"]] if context else next(iter(users.values()), {})
        except (KeyError, StopIteration, TypeError) as exc:
            raise ApiError(0, f"{path}: no usable cluster/user in the kubeconfig") from exc
        ca = _data_or_file(cluster, "certificate-authority")
        cert = _data_or_file(user, "client-certificate")
        key = _data_or_file(user, "client-key")
        token = user.get("token")
        if not token and user.get("tokenFile"):
            with open(user["tokenFile"], encoding="utf-8") as f:
                token = f.read().strip()
        return cls(
            cluster["server"], ca, cert, key, token, cluster.get("insecure-skip-tls-verify", False), timeout
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = JSON,
        query: dict[str, str] | None = None,
    ) -> Any:
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", JSON)
        req.add_header("User-Agent", "kube-standin-node/v1.36.3")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                status = json.loads(raw)
                message, reason = status.get("message", ""), status.get("reason", "")
            except ValueError:
                message, reason = raw.decode(errors="replace")[:300], ""
            raise ApiError(err.code, message, reason) from None
        except (urllib.error.URLError, OSError) as err:
            raise ApiError(0, f"cannot reach {self.server}: {getattr(err, 'reason', err)}") from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def get(self, path: str, query: dict[str, str] | None = None) -> Any:
        return self.request("GET", path, query=query)

    def create(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("POST", path, body)

    def ensure(self, path: str, body: dict[str, Any]) -> Any:
        """Create; an existing object (409) is left as it is, like kubeadm's CreateOrRetain."""
        try:
            return self.create(path, body)
        except ApiError as err:
            if err.status != 409:
                raise
            return None

    def apply(self, path: str, body: dict[str, Any]) -> Any:
        """Create, or replace an existing object (kubeadm's CreateOrUpdate)."""
        try:
            return self.create(path, body)
        except ApiError as err:
            if err.status != 409:
                raise
        name = body["metadata"]["name"]
        current = self.get(f"{path}/{name}")
        body = dict(body)
        body["metadata"] = dict(body["metadata"], resourceVersion=current["metadata"]["resourceVersion"])
        return self.request("PUT", f"{path}/{name}", body)

    def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        return self.request("PATCH", path, patch, MERGE_PATCH)


def _data_or_file(section: dict[str, Any], key: str) -> bytes | None:
    data = section.get(f"{key}-data")
    if data:
        return base64.b64decode(data)
    path = section.get(key)
    if path:
        with open(path, "rb") as f:
            return f.read()
    return None
