"""Authentication (client certificates, ServiceAccount tokens, bootstrap tokens) and RBAC authorization."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from .store import Store

MASTERS = "system:masters"


@dataclass
class User:
    name: str
    groups: list[str] = field(default_factory=list)
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict)

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"username": self.name, "groups": self.groups}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = self.extra
        return out


ANONYMOUS = User("system:anonymous", ["system:unauthenticated"])


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Authenticator:
    def __init__(
        self, store: Store, sa_key_file: str | None, issuer: str = "https://kubernetes.default.svc"
    ) -> None:
        self.store = store
        self.issuer = issuer
        if sa_key_file:
            with open(sa_key_file, "rb") as fh:
                self.key = hashlib.sha256(fh.read()).digest()
        else:
            secret = store.extra.get("tokenKey")
            if not secret:
                secret = store.extra["tokenKey"] = base64.b64encode(os.urandom(32)).decode()
                store.mark_dirty()
            self.key = base64.b64decode(secret)

    # -------------------------------------------------------------- certificates
    @staticmethod
    def from_cert(cert: dict[str, Any] | None) -> User | None:
        if not cert:
            return None
        cn, orgs = "", []
        for rdn in cert.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    cn = value
                elif key == "organizationName":
                    orgs.append(value)
        if not cn:
            return None
        return User(cn, [*orgs, "system:authenticated"])

    # -------------------------------------------------------------- tokens
    def mint(
        self,
        namespace: str,
        sa_name: str,
        sa_uid: str,
        expiration_s: int = 3600,
        audiences: list[str] | None = None,
        bound: dict[str, Any] | None = None,
    ) -> tuple[str, int]:
        now = int(time.time())
        exp = now + max(600, expiration_s)
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": f"system:serviceaccount:{namespace}:{sa_name}",
            "aud": audiences or [self.issuer],
            "iat": now,
            "nbf": now,
            "exp": exp,
            "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": sa_name, "uid": sa_uid}},
        }
        if bound:
            claims["kubernetes.io"][bound.get("kind", "").lower() or "object"] = {
                "name": bound.get("name"),
                "uid": bound.get("uid"),
            }
        return self._sign(claims), exp

    def mint_legacy(self, namespace: str, sa_name: str, sa_uid: str, secret_name: str) -> str:
        claims = {
            "iss": "kubernetes/serviceaccount",
            "sub": f"system:serviceaccount:{namespace}:{sa_name}",
            "kubernetes.io/serviceaccount/namespace": namespace,
            "kubernetes.io/serviceaccount/secret.name": secret_name,
            "kubernetes.io/serviceaccount/service-account.name": sa_name,
            "kubernetes.io/serviceaccount/service-account.uid": sa_uid,
        }
        return self._sign(claims)

    def _sign(self, claims: dict[str, Any]) -> str:
        # HS256 with a key derived from --service-account-key: the stdlib has no RSA signing (docs/lab.md)
        head = _b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "lab-standin"}).encode())
        body = _b64url(json.dumps(claims, separators=(",", ":")).encode())
        sig = hmac.new(self.key, f"{head}.{body}".encode(), hashlib.sha256).digest()
        return f"{head}.{body}.{_b64url(sig)}"

    def from_token(self, token: str) -> User | None:
        if token.count(".") == 1 and len(token) == 23:
            return self._bootstrap(token)
        parts = token.split(".")
        if len(parts) != 3:
            return None
        want = hmac.new(self.key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
        try:
            if not hmac.compare_digest(want, _unb64url(parts[2])):
                return None
            claims = json.loads(_unb64url(parts[1]))
        except ValueError:
            return None
        if "exp" in claims and claims["exp"] < time.time():
            return None
        sub = claims.get("sub", "")
        if not sub.startswith("system:serviceaccount:"):
            return None
        _, _, namespace, name = sub.split(":", 3)
        sa = self.store.get("", "serviceaccounts", namespace, name)
        if sa is None:
            return None
        ku = claims.get("kubernetes.io") or {}
        want_uid = (ku.get("serviceaccount") or {}).get("uid") or claims.get(
            "kubernetes.io/serviceaccount/service-account.uid"
        )
        if want_uid and want_uid != sa["metadata"]["uid"]:
            return None
        secret_name = claims.get("kubernetes.io/serviceaccount/secret.name")
        if secret_name and self.store.get("", "secrets", namespace, secret_name) is None:
            return None
        return User(
            sub,
            ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
            uid=sa["metadata"]["uid"],
        )

    def _bootstrap(self, token: str) -> User | None:
        token_id, token_secret = token.split(".")
        secret = self.store.get("", "secrets", "kube-system", f"bootstrap-token-{token_id}")
        if secret is None or secret.get("type") != "bootstrap.kubernetes.io/token":
            return None
        data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
        if data.get("token-id") != token_id or not hmac.compare_digest(
            data.get("token-secret", ""), token_secret
        ):
            return None
        if data.get("usage-bootstrap-authentication") != "true":
            return None
        exp = data.get("expiration")
        if exp and time.strptime(exp[:19], "%Y-%m-%dT%H:%M:%S") < time.gmtime():
            return None
        extra = [g for g in data.get("auth-extra-groups", "").split(",") if g]
        return User(f"system:bootstrap:{token_id}", ["system:bootstrappers", *extra, "system:authenticated"])


# ------------------------------------------------------------------ RBAC


def _rule_matches(
    rule: dict[str, Any], verb: str, group: str, resource: str, sub: str, name: str, path: str
) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and verb not in verbs:
        return False
    if path:
        urls = rule.get("nonResourceURLs") or []
        return any(u == "*" or u == path or (u.endswith("*") and path.startswith(u[:-1])) for u in urls)
    if rule.get("nonResourceURLs") and not rule.get("resources"):
        return False
    groups = rule.get("apiGroups") or []
    if "*" not in groups and group not in groups:
        return False
    full = f"{resource}/{sub}" if sub else resource
    resources = rule.get("resources") or []
    if not any(
        r == "*" or r == full or (sub and r == f"*/{sub}") or (not sub and r == resource) for r in resources
    ):
        return False
    names = rule.get("resourceNames") or []
    return not names or (bool(name) and name in names)


class Authorizer:
    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def _subject_matches(subject: dict[str, Any], user: User, binding_ns: str) -> bool:
        kind = subject.get("kind")
        if kind == "User":
            return bool(subject.get("name") == user.name)
        if kind == "Group":
            return subject.get("name") in user.groups
        if kind == "ServiceAccount":
            ns = subject.get("namespace") or binding_ns
            return user.name == f"system:serviceaccount:{ns}:{subject.get('name')}"
        return False

    def _role_rules(self, ref: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
        if ref.get("kind") == "ClusterRole":
            role = self.store.get("rbac.authorization.k8s.io", "clusterroles", "", ref.get("name", ""))
            if role is None:
                return []
            rules = list(role.get("rules") or [])
            agg = role.get("aggregationRule")
            if agg:
                from .selectors import labels_match, selector_from_label_selector

                for other in self.store.select("rbac.authorization.k8s.io", "clusterroles"):
                    for sel in agg.get("clusterRoleSelectors") or []:
                        if labels_match(
                            selector_from_label_selector(sel) or [], other["metadata"].get("labels")
                        ):
                            rules += other.get("rules") or []
            return rules
        role = self.store.get("rbac.authorization.k8s.io", "roles", namespace, ref.get("name", ""))
        return list(role.get("rules") or []) if role else []

    def rules_for(self, user: User, namespace: str) -> list[dict[str, Any]]:
        rules: list[dict[str, Any]] = []
        if "system:nodes" in user.groups:
            node_role = self.store.get("rbac.authorization.k8s.io", "clusterroles", "", "system:node")
            rules += (node_role or {}).get("rules") or []
        for crb in self.store.select("rbac.authorization.k8s.io", "clusterrolebindings"):
            if any(self._subject_matches(s, user, "") for s in crb.get("subjects") or []):
                rules += self._role_rules(crb.get("roleRef") or {}, "")
        if namespace:
            for rb in self.store.select("rbac.authorization.k8s.io", "rolebindings", namespace):
                if any(self._subject_matches(s, user, namespace) for s in rb.get("subjects") or []):
                    rules += self._role_rules(rb.get("roleRef") or {}, namespace)
        return rules

    def allowed(
        self,
        user: User,
        verb: str,
        group: str = "",
        resource: str = "",
        sub: str = "",
        namespace: str = "",
        name: str = "",
        path: str = "",
    ) -> bool:
        if MASTERS in user.groups:
            return True
        return any(
            _rule_matches(r, verb, group, resource, sub, name, path) for r in self.rules_for(user, namespace)
        )


# bootstrap policy the real API server reconciles at start
# (subset of plugin/pkg/auth/authorizer/rbac/bootstrappolicy)
READ = ["get", "list", "watch"]
EDIT = ["create", "delete", "deletecollection", "patch", "update"]
BOOTSTRAP_CLUSTER_ROLES: dict[str, list[dict[str, Any]]] = {
    "cluster-admin": [
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
        {"nonResourceURLs": ["*"], "verbs": ["*"]},
    ],
    "system:discovery": [
        {
            "nonResourceURLs": [
                "/api",
                "/api/*",
                "/apis",
                "/apis/*",
                "/healthz",
                "/livez",
                "/openapi",
                "/openapi/*",
                "/readyz",
                "/version",
                "/version/",
            ],
            "verbs": ["get"],
        }
    ],
    "system:public-info-viewer": [
        {"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}
    ],
    "system:basic-user": [
        {
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
            "verbs": ["create"],
        },
        {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
    ],
    "view": [
        {
            "apiGroups": [
                "",
                "apps",
                "batch",
                "policy",
                "networking.k8s.io",
                "autoscaling",
                "discovery.k8s.io",
            ],
            "resources": [
                "pods",
                "pods/log",
                "pods/status",
                "services",
                "endpoints",
                "configmaps",
                "persistentvolumeclaims",
                "replicationcontrollers",
                "serviceaccounts",
                "events",
                "namespaces",
                "limitranges",
                "resourcequotas",
                "deployments",
                "deployments/scale",
                "replicasets",
                "statefulsets",
                "daemonsets",
                "jobs",
                "cronjobs",
                "poddisruptionbudgets",
                "networkpolicies",
                "ingresses",
                "horizontalpodautoscalers",
                "endpointslices",
            ],
            "verbs": READ,
        }
    ],
    "edit": [
        {
            "apiGroups": ["", "apps", "batch", "policy", "networking.k8s.io", "autoscaling"],
            "resources": [
                "pods",
                "pods/log",
                "pods/eviction",
                "services",
                "endpoints",
                "configmaps",
                "secrets",
                "persistentvolumeclaims",
                "replicationcontrollers",
                "serviceaccounts",
                "events",
                "deployments",
                "deployments/scale",
                "replicasets",
                "statefulsets",
                "daemonsets",
                "jobs",
                "cronjobs",
                "poddisruptionbudgets",
                "networkpolicies",
                "ingresses",
                "horizontalpodautoscalers",
            ],
            "verbs": READ + EDIT,
        },
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": READ},
    ],
    "admin": [
        {
            "apiGroups": [
                "",
                "apps",
                "batch",
                "policy",
                "networking.k8s.io",
                "autoscaling",
                "rbac.authorization.k8s.io",
            ],
            "resources": ["*"],
            "verbs": READ + EDIT,
        }
    ],
    "system:node": [
        {"apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": [*READ, *EDIT]},
        {"apiGroups": [""], "resources": ["pods", "pods/status", "pods/eviction"], "verbs": [*READ, *EDIT]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "update"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
        {
            "apiGroups": [""],
            "resources": [
                "configmaps",
                "secrets",
                "services",
                "endpoints",
                "persistentvolumeclaims",
                "persistentvolumes",
            ],
            "verbs": READ,
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": [*READ, *EDIT]},
        {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": READ},
        {
            "apiGroups": ["storage.k8s.io"],
            "resources": ["csidrivers", "csinodes", "volumeattachments"],
            "verbs": [*READ, *EDIT],
        },
        {
            "apiGroups": ["certificates.k8s.io"],
            "resources": ["certificatesigningrequests"],
            "verbs": ["create", "get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ],
    "system:node-bootstrapper": [
        {
            "apiGroups": ["certificates.k8s.io"],
            "resources": ["certificatesigningrequests"],
            "verbs": ["create", "get", "list", "watch"],
        }
    ],
}
BOOTSTRAP_CLUSTER_ROLES.update(
    {
        "system:node-proxier": [
            {"apiGroups": [""], "resources": ["endpoints", "services"], "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": READ},
            {
                "apiGroups": ["", "events.k8s.io"],
                "resources": ["events"],
                "verbs": ["create", "patch", "update"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient": [
            {
                "apiGroups": ["certificates.k8s.io"],
                "resources": ["certificatesigningrequests/nodeclient"],
                "verbs": ["create"],
            }
        ],
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient": [
            {
                "apiGroups": ["certificates.k8s.io"],
                "resources": ["certificatesigningrequests/selfnodeclient"],
                "verbs": ["create"],
            }
        ],
        "system:auth-delegator": [
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["subjectaccessreviews"],
                "verbs": ["create"],
            },
        ],
        "system:monitoring": [
            {
                "nonResourceURLs": [
                    "/healthz",
                    "/healthz/*",
                    "/livez",
                    "/livez/*",
                    "/readyz",
                    "/readyz/*",
                    "/metrics",
                    "/metrics/slis",
                ],
                "verbs": ["get"],
            }
        ],
        # reduced: the real roles list each resource the component touches
        "system:kube-controller-manager": [
            {"apiGroups": ["*"], "resources": ["*"], "verbs": READ},
            {
                "apiGroups": ["", "events.k8s.io"],
                "resources": ["events"],
                "verbs": ["create", "patch", "update"],
            },
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": [*READ, *EDIT]},
            {
                "apiGroups": [""],
                "resources": ["secrets", "serviceaccounts", "serviceaccounts/token"],
                "verbs": ["create", "update", "delete"],
            },
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {
                "apiGroups": ["authorization.k8s.io"],
                "resources": ["subjectaccessreviews"],
                "verbs": ["create"],
            },
        ],
        "system:kube-scheduler": [
            {"apiGroups": ["*"], "resources": ["*"], "verbs": READ},
            {
                "apiGroups": ["", "events.k8s.io"],
                "resources": ["events"],
                "verbs": ["create", "patch", "update"],
            },
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": [*READ, *EDIT]},
            {"apiGroups": [""], "resources": ["pods/binding", "bindings"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
        ],
    }
)
BOOTSTRAP_CLUSTER_ROLES["system:controller:certificate-controller"] = [
    {
        "apiGroups": ["certificates.k8s.io"],
        "resources": ["certificatesigningrequests"],
        "verbs": ["delete", "get", "list", "watch"],
    },
    {
        "apiGroups": ["certificates.k8s.io"],
        "resources": ["certificatesigningrequests/approval", "certificatesigningrequests/status"],
        "verbs": ["update"],
    },
    {
        "apiGroups": ["certificates.k8s.io"],
        "resources": ["signers"],
        "verbs": ["approve"],
        "resourceNames": [
            "kubernetes.io/kube-apiserver-client",
            "kubernetes.io/kube-apiserver-client-kubelet",
        ],
    },
    {
        "apiGroups": ["certificates.k8s.io"],
        "resources": ["signers"],
        "verbs": ["sign"],
        "resourceNames": [
            "kubernetes.io/kube-apiserver-client",
            "kubernetes.io/kube-apiserver-client-kubelet",
            "kubernetes.io/kubelet-serving",
            "kubernetes.io/legacy-unknown",
        ],
    },
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
]
# binding name -> (ClusterRole, subjects as (kind, name); ServiceAccounts as "namespace:name")
BOOTSTRAP_BINDINGS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "system:monitoring": ("system:monitoring", [("Group", "system:monitoring")]),
    "system:kube-controller-manager": (
        "system:kube-controller-manager",
        [("User", "system:kube-controller-manager")],
    ),
    "system:kube-scheduler": ("system:kube-scheduler", [("User", "system:kube-scheduler")]),
    "system:controller:certificate-controller": (
        "system:controller:certificate-controller",
        [("ServiceAccount", "kube-system:certificate-controller")],
    ),
    "cluster-admin": ("cluster-admin", [("Group", "system:masters")]),
    "system:discovery": ("system:discovery", [("Group", "system:authenticated")]),
    "system:basic-user": ("system:basic-user", [("Group", "system:authenticated")]),
    "system:public-info-viewer": (
        "system:public-info-viewer",
        [("Group", "system:authenticated"), ("Group", "system:unauthenticated")],
    ),
}


# ------------------------------------------------------------------ privilege escalation prevention

RBAC_GROUP = "rbac.authorization.k8s.io"


def _covers(held: list[dict[str, Any]], rule: dict[str, Any]) -> list[str]:
    """The parts of rule no held rule grants (empty when fully covered), as "verb group/resource[/name]"."""
    missing: list[str] = []
    for verb in rule.get("verbs") or []:
        urls = rule.get("nonResourceURLs") or []
        for url in urls:
            if not any(_rule_matches(h, verb, "", "", "", "", url) for h in held):
                missing.append(f"{verb} {url}")
        for group in rule.get("apiGroups") or ([] if urls else [""]):
            for resource in rule.get("resources") or []:
                for name in rule.get("resourceNames") or [""]:
                    if not any(_held_covers(h, verb, group, resource, name) for h in held):
                        missing.append(f"{verb} {group or 'core'}/{resource}{'/' + name if name else ''}")
    return missing


def _held_covers(h: dict[str, Any], verb: str, group: str, resource: str, name: str) -> bool:
    if "*" not in (h.get("verbs") or []) and verb not in (h.get("verbs") or []):
        return False
    if "*" not in (h.get("apiGroups") or []) and group not in (h.get("apiGroups") or []):
        return False
    res = h.get("resources") or []
    _, _, sub = resource.partition("/")
    if not ("*" in res or resource in res or (sub and f"*/{sub}" in res)):
        return False
    names = h.get("resourceNames") or []
    return not names or (bool(name) and name in names)


def escalation_check(authz: Authorizer, user: User, plural: str, namespace: str, obj: dict[str, Any]) -> str:
    """RBAC's escalation prevention ("Privilege escalation prevention and bootstrapping"): a Role or
    ClusterRole may only grant what its author holds (or has `escalate` on roles); a binding needs `bind` on
    the role or every permission in it. Returns the reason to refuse, or ""."""
    if MASTERS in user.groups:
        return ""
    held = authz.rules_for(user, namespace)
    if plural in ("roles", "clusterroles"):
        if authz.allowed(
            user, "escalate", RBAC_GROUP, plural, "", namespace, obj["metadata"].get("name", "")
        ):
            return ""
        rules = list(obj.get("rules") or [])
    elif plural in ("rolebindings", "clusterrolebindings"):
        ref = obj.get("roleRef") or {}
        ref_plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
        if authz.allowed(user, "bind", RBAC_GROUP, ref_plural, "", namespace, ref.get("name", "")):
            return ""
        rules = authz._role_rules(ref, namespace)
    else:
        return ""
    missing = [m for rule in rules for m in _covers(held, rule)]
    if not missing:
        return ""
    return (
        f'user "{user.name}" (groups={json.dumps(user.groups)}) is attempting to grant RBAC permissions '
        f"not currently held: {'; '.join(missing[:20])}"
    )
