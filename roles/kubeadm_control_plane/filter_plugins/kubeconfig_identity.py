"""Who a kubeconfig authenticates as, read from its client certificate (runs on the controller, where
ansible-core's own dependency `cryptography` is installed; nothing is needed on the node).

The role gives each operator a kubeconfig of their own (`kubeadm kubeconfig user`) so that the API audit
log names the person; this filter tells whether the file an operator has is still that: the right name
and group, signed by this cluster's CA, not about to expire.
"""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID


def _current_user(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    contexts = {c.get("name"): c.get("context") or {} for c in config.get("contexts") or []}
    context = contexts.get(config.get("current-context")) or {}
    users = {u.get("name"): u.get("user") or {} for u in config.get("users") or []}
    clusters = {c.get("name"): c.get("cluster") or {} for c in config.get("clusters") or []}
    return users.get(context.get("user")) or {}, clusters.get(context.get("cluster")) or {}


def kubeconfig_client_identity(kubeconfig: str, ca_pem: str = "", now: str = "") -> dict[str, Any]:
    """The current context's client certificate of KUBECONFIG (the file's text):

    {"name": CN, "groups": [O, ...], "not_after": ISO 8601, "days_left": float,
     "issued_by_ca": the certificate's CA data is CA_PEM (this cluster's ca.crt) and signed the certificate,
     "server": the cluster's server URL}

    A file that does not parse, or has no embedded client certificate (a token, a path), gives
    {"name": "", "groups": [], ...}: never an exception, so the role can decide to issue a new one.
    NOW (ISO 8601, for tests) defaults to the current time."""
    empty: dict[str, Any] = {
        "name": "",
        "groups": [],
        "not_after": "",
        "days_left": 0.0,
        "issued_by_ca": False,
        "server": "",
    }
    try:
        config = yaml.safe_load(kubeconfig or "") or {}
        user, cluster = _current_user(config)
        cert = x509.load_pem_x509_certificate(base64.b64decode(user["client-certificate-data"]))
    except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError):
        return empty
    subject = cert.subject
    moment = dt.datetime.fromisoformat(now) if now else dt.datetime.now(dt.UTC)
    not_after = cert.not_valid_after_utc
    issued = False
    if ca_pem:
        try:
            ca = x509.load_pem_x509_certificate(ca_pem.encode())
            cluster_ca = base64.b64decode(cluster.get("certificate-authority-data") or "")
            cert.verify_directly_issued_by(ca)
            issued = x509.load_pem_x509_certificate(cluster_ca) == ca
        except (ValueError, TypeError, InvalidSignature):
            issued = False
    return {
        "name": ",".join(a.value for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)),
        "groups": [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)],
        "not_after": not_after.isoformat(),
        "days_left": round((not_after - moment).total_seconds() / 86400, 2),
        "issued_by_ca": issued,
        "server": cluster.get("server") or "",
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"kubeconfig_client_identity": kubeconfig_client_identity}
