"""The lab's kube-apiserver stand-in: HTTPS, authentication, RBAC, REST semantics, watch, discovery, OpenAPI;
controllers and scheduler run in the same process (controllers.py).

python3 -m kube_standin.apiserver --bind ADDR --port N --tls-cert F --tls-key F --client-ca F --state-file F
                                  [--service-account-key F]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import signal
import socket
import ssl
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import SERVER_VERSION, openapi, protobuf, tables
from .api import Api
from .auth import (
    ANONYMOUS,
    BOOTSTRAP_BINDINGS,
    BOOTSTRAP_CLUSTER_ROLES,
    MASTERS,
    RBAC_GROUP,
    Authenticator,
    Authorizer,
    User,
    escalation_check,
)
from .errors import ApiError
from .resources import Registry, Resource
from .selectors import fields_match, labels_match, parse_field_selector, parse_label_selector
from .store import Store, now_iso

NON_RESOURCE_PUBLIC = ("/healthz", "/livez", "/readyz", "/version")


class Server:
    """Everything a request needs; one per process."""

    def __init__(
        self, state_file: str | None, sa_key: str | None = None, ca_file: str | None = None, address: str = ""
    ) -> None:
        self.store = Store(state_file)
        self.registry = Registry()
        self.api = Api(self.store, self.registry)
        self.authn = Authenticator(self.store, sa_key)
        self.authz = Authorizer(self.store)
        self.ca_pem = ""
        if ca_file:
            with open(ca_file, encoding="utf-8") as fh:
                self.ca_pem = fh.read()
        self.address = address
        self.node_grace = 50.0  # kube-controller-manager --node-monitor-grace-period (1.32+ default)
        # kube-controller-manager --allocate-node-cidrs / --cluster-cidr / --node-cidr-mask-size
        self.cluster_cidr: ipaddress.IPv4Network | None = None
        self.node_cidr_mask = 24
        self.port = 6443
        self.advertise = ""
        self.started = time.time()
        self._bootstrap()
        from .controllers import Controllers

        self.controllers = Controllers(self)

    def _bootstrap(self) -> None:
        """What the real API server reconciles at start: default namespaces, bootstrap RBAC policy."""
        ns_res = self.registry.lookup("", "v1", "namespaces")
        assert ns_res is not None
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            if self.store.get("", "namespaces", "", ns) is None:
                self.api.create(ns_res, "", {"metadata": {"name": ns}})
        cr = self.registry.lookup("rbac.authorization.k8s.io", "v1", "clusterroles")
        crb = self.registry.lookup("rbac.authorization.k8s.io", "v1", "clusterrolebindings")
        assert cr is not None and crb is not None
        labels = {"kubernetes.io/bootstrapping": "rbac-defaults"}
        for name, rules in BOOTSTRAP_CLUSTER_ROLES.items():
            if self.store.get(cr.group, cr.plural, "", name) is None:
                self.api.create(
                    cr,
                    "",
                    {
                        "metadata": {
                            "name": name,
                            "labels": labels,
                            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
                        },
                        "rules": rules,
                    },
                )
        for name, (role, subjects) in BOOTSTRAP_BINDINGS.items():
            if self.store.get(crb.group, crb.plural, "", name) is None:
                self.api.create(
                    crb,
                    "",
                    {
                        "metadata": {"name": name, "labels": labels},
                        "roleRef": {
                            "apiGroup": "rbac.authorization.k8s.io",
                            "kind": "ClusterRole",
                            "name": role,
                        },
                        "subjects": [
                            {"kind": kind, "name": who.split(":")[1], "namespace": who.split(":")[0]}
                            if kind == "ServiceAccount"
                            else {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": who}
                            for kind, who in subjects
                        ],
                    },
                )
        sa = self.registry.lookup("", "v1", "serviceaccounts")
        assert sa is not None
        # kube-controller-manager --use-service-account-credentials: a ServiceAccount per controller
        # (the lab's CSR signer acts as this one)
        if self.store.get("", "serviceaccounts", "kube-system", "certificate-controller") is None:
            self.api.create(sa, "kube-system", {"metadata": {"name": "certificate-controller"}})
        svc = self.registry.lookup("", "v1", "services")
        assert svc is not None
        pc = self.registry.lookup("scheduling.k8s.io", "v1", "priorityclasses")
        assert pc is not None
        for name, value, what in (
            (
                "system-node-critical",
                2000001000,
                "Used for system critical pods that must not be moved from their current node.",
            ),
            (
                "system-cluster-critical",
                2000000000,
                "Used for system critical pods that must run in the cluster, "
                "but can be moved to another node if necessary.",
            ),
        ):
            if self.store.get(pc.group, pc.plural, "", name) is None:
                self.api.create(pc, "", {"metadata": {"name": name}, "value": value, "description": what})
        if self.store.get("", "services", "default", "kubernetes") is None:
            self.api.create(
                svc,
                "default",
                {
                    "metadata": {
                        "name": "kubernetes",
                        "labels": {"component": "apiserver", "provider": "kubernetes"},
                    },
                    "spec": {
                        "clusterIP": "10.96.0.1",
                        "ports": [{"name": "https", "port": 443, "targetPort": 6443}],
                    },
                },
            )

    def advertise_ip(self) -> str:
        """The address other hosts reach this server on (default/kubernetes endpoints)."""
        if self.advertise:
            return self.advertise
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect(("10.255.255.255", 1))  # no packet is sent: only picks the outgoing interface
                self.advertise = str(sock.getsockname()[0])
        except OSError:
            self.advertise = "127.0.0.1"
        return self.advertise

    # -------------------------------------------------------------- discovery documents
    def api_versions(self) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.address}],
        }

    def api_groups(self) -> dict[str, Any]:
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self.api_group(g, vs) for g, vs in self.registry.groups().items()],
        }

    @staticmethod
    def api_group(group: str, versions: list[str]) -> dict[str, Any]:
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        found = [r for r in self.registry.all() if r.group == group and r.version == version]
        if not found:
            return None
        resources: list[dict[str, Any]] = []
        for r in found:
            entry: dict[str, Any] = {
                "name": r.plural,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": list(r.verbs),
            }
            if r.short_names:
                entry["shortNames"] = list(r.short_names)
            if r.categories:
                entry["categories"] = list(r.categories)
            resources.append(entry)
            for sub in r.subresources:
                kind, verbs = r.kind, ["get", "patch", "update"]
                if sub == "scale":
                    kind = "Scale"
                    entry_group = {"group": "autoscaling", "version": "v1"}
                else:
                    entry_group = {}
                if sub == "eviction":
                    kind, verbs = "Eviction", ["create"]
                    entry_group = {"group": "policy", "version": "v1"}
                elif sub == "token":
                    kind, verbs = "TokenRequest", ["create"]
                    entry_group = {"group": "authentication.k8s.io", "version": "v1"}
                elif sub == "binding":
                    kind, verbs = "Binding", ["create"]
                elif sub in ("log",):
                    kind, verbs = "Pod", ["get"]
                elif sub in ("exec", "proxy"):
                    kind, verbs = "PodExecOptions" if sub == "exec" else "NodeProxyOptions", ["create", "get"]
                elif sub == "finalize":
                    verbs = ["update"]
                elif sub == "approval" or sub == "ephemeralcontainers":
                    verbs = ["get", "patch", "update"]
                resources.append(
                    {
                        "name": f"{r.plural}/{sub}",
                        "singularName": "",
                        "namespaced": r.namespaced,
                        "kind": kind,
                        "verbs": verbs,
                        **entry_group,
                    }
                )
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kube-standin"
    sys_version = ""
    srv: Server  # set on the class by serve()

    def log_message(self, format: str, *args: Any) -> None:
        if self.srv_verbose:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

    srv_verbose = False

    # -------------------------------------------------------------- plumbing
    def _send_json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_text(self, code: int, text: str, ctype: str = "text/plain") -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                out += self.rfile.read(size)
                self.rfile.readline()
            return out
        return self.rfile.read(length) if length else b""

    def _json_body(self, raw: bytes) -> Any:
        ctype = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        if ctype == "application/vnd.kubernetes.protobuf":
            return protobuf.decode(raw)
        if "protobuf" in ctype or "cbor" in ctype:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - "
                "accepted media types include: application/json, "
                "application/yaml",
            )
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError.bad_request(f"the body of the request was in an unknown format: {exc}") from exc

    def _user(self) -> User:
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            user = self.srv.authn.from_token(auth[7:].strip())
            if user is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            return user
        cert = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        return self.srv.authn.from_cert(cert) or ANONYMOUS

    def _accepts_json(self) -> bool:
        accept = self.headers.get("Accept", "") or "*/*"
        return any(
            t.split(";")[0].strip()
            in ("application/json", "*/*", "application/*", "application/yaml", "application/json-seq", "")
            for t in accept.split(",")
        )

    def _wants_table(self) -> bool:
        return "as=Table" in (self.headers.get("Accept") or "")

    # -------------------------------------------------------------- dispatch
    def do_GET(self) -> None:
        self._handle("GET")

    def do_HEAD(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        try:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            raw = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else b""
            user = self._user()
            if not self._accepts_json() and not url.path.startswith("/openapi/v2"):
                raise ApiError(
                    406,
                    "NotAcceptable",
                    "only the following media types are accepted: application/json, application/yaml",
                )
            self._route(method, url.path, query, raw, user)
        except ApiError as exc:
            self._send_json(exc.code, exc.status(), exc.headers)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True
        except Exception as exc:  # the real server answers 500 with a Status, never a dropped connection
            traceback.print_exc()
            self._send_json(500, ApiError(500, "InternalError", f"Internal error occurred: {exc}").status())

    def _route(self, method: str, path: str, query: dict[str, str], raw: bytes, user: User) -> None:
        segs = [s for s in path.split("/") if s]
        srv = self.srv
        if not segs or segs[0] not in ("api", "apis"):
            return self._non_resource(method, path, segs, query, user)
        if segs[0] == "api":
            if len(segs) == 1:
                self._authorize_path(user, path)
                return self._send_json(200, srv.api_versions())
            group, version, rest = "", segs[1], segs[2:]
        else:
            if len(segs) == 1:
                self._authorize_path(user, path)
                return self._send_json(200, srv.api_groups())
            if len(segs) == 2:
                self._authorize_path(user, path)
                versions = srv.registry.groups().get(segs[1])
                if not versions:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                return self._send_json(
                    200, {"kind": "APIGroup", "apiVersion": "v1", **srv.api_group(segs[1], versions)}
                )
            group, version, rest = segs[1], segs[2], segs[3:]
        if not rest:
            self._authorize_path(user, path)
            doc = srv.resource_list(group, version)
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._send_json(200, doc)
        namespace = ""
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
        ):
            namespace, rest = rest[1], rest[2:]
        if rest[0] == "watch":  # legacy /watch/ prefix
            query["watch"] = "true"
            rest = rest[1:]
            if rest and rest[0] == "namespaces" and len(rest) >= 3:
                namespace, rest = rest[1], rest[2:]
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else ""
        sub = "/".join(rest[2:])
        res = srv.api.resource(group, version, plural)
        if not res.namespaced and namespace:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub and sub not in res.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        watching = query.get("watch") in ("1", "true", "True")
        verb = {
            "GET": "get" if name else ("watch" if watching else "list"),
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }[method]
        if method == "POST" and name and not sub:
            raise ApiError.method_not_allowed()
        if res.verbs == ("create",) and method != "POST":
            raise ApiError.method_not_allowed()
        body_name = name
        if verb == "create" and not sub and raw:
            try:
                body_name = (json.loads(raw).get("metadata") or {}).get("name", "")
            except (ValueError, AttributeError):
                body_name = ""
        if not srv.authz.allowed(
            user, verb, group, plural, sub, namespace, body_name if verb != "create" or sub else ""
        ):
            raise ApiError.forbidden(user.name, verb, group, plural, namespace, name, sub)
        self._resource(method, res, namespace, name, sub, query, raw, user, verb)
        return None

    def _authorize_path(self, user: User, path: str) -> None:
        if not self.srv.authz.allowed(user, "get", path=path):
            raise ApiError(403, "Forbidden", f'forbidden: User "{user.name}" cannot get path "{path}"')

    def _non_resource(
        self, method: str, path: str, segs: list[str], query: dict[str, str], user: User
    ) -> None:
        if method != "GET":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        self._authorize_path(user, path.rstrip("/") or "/")
        if path.rstrip("/") in ("/healthz", "/livez", "/readyz") or (
            segs and segs[0] in ("healthz", "livez", "readyz")
        ):
            if "verbose" in query:
                return self._send_text(200, f"[+]ping ok\n[+]etcd ok\n{segs[0]} check passed\n")
            return self._send_text(200, "ok")
        if path.rstrip("/") == "/version":
            return self._send_json(
                200,
                {
                    "major": "1",
                    "minor": SERVER_VERSION.split(".")[1],
                    "emulationMajor": "1",
                    "emulationMinor": SERVER_VERSION.split(".")[1],
                    "minCompatibilityMajor": "1",
                    "minCompatibilityMinor": str(int(SERVER_VERSION.split(".")[1]) - 1),
                    "gitVersion": SERVER_VERSION,
                    "gitCommit": "lab-standin",
                    "gitTreeState": "clean",
                    "buildDate": "2026-11-01T00:00:00Z",
                    "goVersion": "go1.26 (lab stand-in, python)",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                },
            )
        if path.rstrip("/") == "/openapi/v3":
            return self._send_json(200, openapi.v3_root(self.srv.registry))
        if len(segs) >= 3 and segs[:2] == ["openapi", "v3"]:
            gv = segs[2:]
            if gv[0] == "api" and len(gv) == 2:
                return self._send_json(200, openapi.v3_group_version(self.srv.registry, "", gv[1]))
            if gv[0] == "apis" and len(gv) == 3 and self.srv.registry.groups().get(gv[1]):
                return self._send_json(200, openapi.v3_group_version(self.srv.registry, gv[1], gv[2]))
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if path.rstrip("/") == "/openapi/v2":
            accept = self.headers.get("Accept", "") or "*/*"
            if not any(t.split(";")[0].strip() in ("application/json", "*/*") for t in accept.split(",")):
                # the real server answers protobuf here; this one only speaks JSON (see docs/lab.md)
                raise ApiError(
                    406, "NotAcceptable", "only the following media types are accepted: application/json"
                )
            return self._send_json(200, openapi.v2(self.srv.registry))
        if path.rstrip("/") == "/.well-known/openid-configuration":
            return self._send_json(
                200,
                {
                    "issuer": self.srv.authn.issuer,
                    "jwks_uri": "/openid/v1/jwks",
                    "response_types_supported": ["id_token"],
                    "subject_types_supported": ["public"],
                    "id_token_signing_alg_values_supported": ["HS256"],
                },
            )
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    # -------------------------------------------------------------- resources
    def _resource(
        self,
        method: str,
        res: Resource,
        namespace: str,
        name: str,
        sub: str,
        query: dict[str, str],
        raw: bytes,
        user: User,
        verb: str,
    ) -> None:
        api = self.srv.api
        dry_run = query.get("dryRun") == "All"
        manager = query.get("fieldManager", "")
        if method == "GET" and not name:
            if verb == "watch":
                return self._watch(res, namespace or None, query)
            items, rv = api.select(
                res, namespace or None, query.get("labelSelector", ""), query.get("fieldSelector", "")
            )
            if self._wants_table():
                return self._send_json(
                    200, tables.table(res, items, rv, query.get("includeObject", "Metadata"))
                )
            return self._send_json(
                200,
                {
                    "kind": f"{res.kind}List",
                    "apiVersion": res.group_version,
                    "metadata": {"resourceVersion": rv},
                    "items": items,
                },
            )
        if method == "GET":
            if sub == "log":
                tail = query.get("tailLines")
                return self._send_text(
                    200, api.pod_log(namespace, name, query.get("container", ""), int(tail) if tail else None)
                )
            if sub == "scale":
                return self._send_json(200, api.scale(res, namespace, name, None))
            obj = api.get(res, namespace, name)
            if self._wants_table() and not sub:
                return self._send_json(
                    200,
                    tables.table(
                        res, [obj], obj["metadata"]["resourceVersion"], query.get("includeObject", "Metadata")
                    ),
                )
            return self._send_json(200, obj)
        if method == "POST":
            body = self._json_body(raw) or {}
            if sub == "eviction":
                return self._send_json(201, api.evict(namespace, name, body, dry_run))
            if sub == "binding":
                return self._send_json(201, api.bind(namespace, name, body))
            if res.plural == "bindings":
                return self._send_json(
                    201, api.bind(namespace, (body.get("metadata") or {}).get("name", ""), body)
                )
            if sub == "token":
                return self._send_json(201, self._token_request(namespace, name, body))
            if res.verbs == ("create",):
                return self._send_json(201, self._review(res, namespace, body, user))
            if sub:
                raise ApiError.method_not_allowed()
            self._no_escalation(res, namespace, body, user)
            return self._send_json(201, api.create(res, namespace, body, dry_run, manager))
        if method == "PUT":
            body = self._json_body(raw) or {}
            self._no_escalation(res, namespace, body, user)
            if sub == "scale":
                return self._send_json(200, api.scale(res, namespace, name, body))
            return self._send_json(
                200,
                api.update(
                    res, namespace, name, body, sub if sub in ("status", "approval") else "", dry_run, manager
                ),
            )
        if method == "PATCH":
            ctype = self.headers.get("Content-Type", "application/merge-patch+json")
            if sub == "scale":
                current = api.scale(res, namespace, name, None)
                from . import merge as _merge

                patched = (
                    _merge.json_merge_patch(current, json.loads(raw or b"{}"))
                    if "json-patch" not in ctype
                    else _merge.json_patch(current, json.loads(raw or b"[]"))
                )
                return self._send_json(200, api.scale(res, namespace, name, patched))
            if res.group == RBAC_GROUP and MASTERS not in user.groups:
                preview, _ = api.patch(res, namespace, name, ctype, raw, "", True, manager)
                self._no_escalation(res, namespace, preview, user)
            obj, created = api.patch(
                res,
                namespace,
                name,
                ctype,
                raw,
                sub if sub in ("status", "approval") else "",
                dry_run,
                manager,
                query.get("force") == "true",
            )
            return self._send_json(201 if created else 200, obj)
        if method == "DELETE":
            options = self._json_body(raw) or {}
            for key in ("propagationPolicy", "gracePeriodSeconds"):
                if key in query:
                    options[key] = query[key]
            if not name:
                return self._send_json(
                    200,
                    api.delete_collection(
                        res,
                        namespace or None,
                        query.get("labelSelector", ""),
                        query.get("fieldSelector", ""),
                        options,
                        dry_run,
                    ),
                )
            return self._send_json(200, api.delete(res, namespace, name, options, dry_run))
        raise ApiError.method_not_allowed()

    def _no_escalation(self, res: Resource, namespace: str, body: Any, user: User) -> None:
        if res.group != RBAC_GROUP or not isinstance(body, dict):
            return
        body.setdefault("metadata", {})
        why = escalation_check(self.srv.authz, user, res.plural, namespace, body)
        if why:
            name = body["metadata"].get("name", "")
            raise ApiError(
                403,
                "Forbidden",
                f'{res.plural}.{res.group} "{name}" is forbidden: {why}',
                {"name": name, "group": res.group, "kind": res.plural},
            )

    def _token_request(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        sa = self.srv.api.get(self.srv.api.builtin("", "serviceaccounts"), namespace, name)
        spec = body.get("spec") or {}
        token, exp = self.srv.authn.mint(
            namespace,
            name,
            sa["metadata"]["uid"],
            int(spec.get("expirationSeconds") or 3600),
            spec.get("audiences"),
            spec.get("boundObjectRef"),
        )
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": None},
            "spec": {**spec, "expirationSeconds": exp - int(time.time())},
            "status": {
                "token": token,
                "expirationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp)),
            },
        }

    def _review(self, res: Resource, namespace: str, body: dict[str, Any], user: User) -> dict[str, Any]:
        spec = body.get("spec") or {}
        out = {**body, "apiVersion": res.group_version, "kind": res.kind}
        out.setdefault("metadata", {})["creationTimestamp"] = None
        if res.kind == "SelfSubjectReview":
            out["status"] = {"userInfo": user.info()}
        elif res.kind == "TokenReview":
            who = self.srv.authn.from_token(spec.get("token", ""))
            out["status"] = {"authenticated": who is not None, **({"user": who.info()} if who else {})}
        elif res.kind in ("SelfSubjectAccessReview", "SubjectAccessReview", "LocalSubjectAccessReview"):
            subject = (
                user
                if res.kind == "SelfSubjectAccessReview"
                else User(spec.get("user", ""), list(spec.get("groups") or []))
            )
            attrs = spec.get("resourceAttributes")
            if attrs:
                ok = self.srv.authz.allowed(
                    subject,
                    attrs.get("verb", ""),
                    attrs.get("group", ""),
                    attrs.get("resource", ""),
                    attrs.get("subresource", ""),
                    attrs.get("namespace", "") or namespace,
                    attrs.get("name", ""),
                )
            else:
                nra = spec.get("nonResourceAttributes") or {}
                ok = self.srv.authz.allowed(subject, nra.get("verb", ""), path=nra.get("path", ""))
            out["status"] = {"allowed": ok, **({"reason": "RBAC: allowed"} if ok else {})}
        elif res.kind == "SelfSubjectRulesReview":
            rules = self.srv.authz.rules_for(user, spec.get("namespace", ""))
            out["status"] = {
                "resourceRules": [r for r in rules if r.get("resources")],
                "nonResourceRules": [r for r in rules if r.get("nonResourceURLs")],
                "incomplete": False,
            }
        return out

    # -------------------------------------------------------------- watch
    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, res: Resource, namespace: str | None, query: dict[str, str]) -> None:
        store = self.srv.store
        lreq = parse_label_selector(query.get("labelSelector", ""))
        freq = parse_field_selector(query.get("fieldSelector", ""), res.kind)
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.time() + timeout
        rv_param = query.get("resourceVersion", "")
        initial = query.get("sendInitialEvents") == "true"

        def matches(obj: dict[str, Any]) -> bool:
            return labels_match(lreq, obj["metadata"].get("labels")) and fields_match(freq, obj)

        pending: list[dict[str, Any]] = []
        with store.lock:
            if rv_param in ("", "0") or initial:
                items, rv = self.srv.api.select(
                    res, namespace, query.get("labelSelector", ""), query.get("fieldSelector", "")
                )
                pending = [{"type": "ADDED", "object": o} for o in items]
                last = int(rv)
                if initial:
                    pending.append(
                        {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": res.kind,
                                "apiVersion": res.group_version,
                                "metadata": {
                                    "resourceVersion": rv,
                                    "annotations": {"k8s.io/initial-events-end": "true"},
                                },
                            },
                        }
                    )
            else:
                last = int(rv_param)
                if store.events_since(last) is None:
                    pending = [
                        {
                            "type": "ERROR",
                            "object": ApiError(
                                410, "Expired", f"too old resource version: {last} ({store.rv})"
                            ).status(),
                        }
                    ]
                    last = -1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        try:
            for first in pending:
                self._write_chunk(json.dumps(first, separators=(",", ":")).encode() + b"\n")
            while last >= 0 and time.time() < deadline:
                with store.lock:
                    events = store.events_since(last)
                    if events is not None and not events:
                        store.changed.wait(min(1.0, max(0.01, deadline - time.time())))
                        events = store.events_since(last)
                if events is None:
                    break
                for ev in events:
                    last = ev.rv
                    if ev.group != res.group or ev.plural != res.plural:
                        continue
                    if namespace is not None and res.namespaced and ev.namespace != namespace:
                        continue
                    if not matches(ev.obj):
                        continue
                    obj = dict(ev.obj, apiVersion=res.group_version, kind=res.kind)
                    self._write_chunk(
                        json.dumps({"type": ev.type, "object": obj}, separators=(",", ":")).encode() + b"\n"
                    )
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            pass
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, ssl.SSLError, TimeoutError)):
            return
        super().handle_error(request, client_address)


def make_ssl_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def serve(
    bind: str,
    port: int,
    server: Server,
    ctx: ssl.SSLContext | None,
    verbose: bool = False,
) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"srv": server, "srv_verbose": verbose})
    family_server: type[_Server] = _Server
    if ":" in bind:
        family_server = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
    httpd = family_server((bind, port), handler)
    if ctx is not None:
        # handshake in the worker thread, not the accept loop: a slow client must not stall the others
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
        orig = httpd.finish_request

        def finish_request(request: Any, client_address: Any) -> None:
            try:
                request.settimeout(30)
                request.do_handshake()
                request.settimeout(None)
            except (ssl.SSLError, OSError):
                return
            orig(request, client_address)

        httpd.finish_request = finish_request  # type: ignore[method-assign]
    server.port = int(httpd.server_address[1])
    if bind not in ("0.0.0.0", "::"):
        server.advertise = bind
    server.address = f"{server.advertise_ip()}:{server.port}"
    return httpd


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kube_standin.apiserver", description=__doc__.splitlines()[0])
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=6443)
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    parser.add_argument("--client-ca", required=True)
    parser.add_argument("--state-file", required=True)
    parser.add_argument("--service-account-key")
    parser.add_argument("--advertise-address", help="address put in /api's serverAddressByClientCIDRs")
    parser.add_argument("--allocate-node-cidrs", action="store_true", help="as kube-controller-manager's")
    parser.add_argument("--cluster-cidr", help="as kube-controller-manager's: the pod network (IPv4)")
    parser.add_argument("--node-cidr-mask-size", type=int, default=24, help="as kube-controller-manager's")
    parser.add_argument(
        "--node-monitor-grace-period",
        default="50s",
        help="as kube-controller-manager's: how long a node may go without a heartbeat before it is Unknown",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    for opt in ("tls_cert", "tls_key", "client_ca"):
        try:
            open(getattr(args, opt), "rb").close()
        except OSError as exc:
            parser.error(f"--{opt.replace('_', '-')}: {exc}")
    server = Server(args.state_file, args.service_account_key, args.client_ca)
    if args.allocate_node_cidrs:
        if not args.cluster_cidr:
            parser.error("--allocate-node-cidrs needs --cluster-cidr")
        try:
            server.cluster_cidr = ipaddress.IPv4Network(args.cluster_cidr)
        except ValueError as exc:
            parser.error(f"--cluster-cidr: {exc}")
        server.node_cidr_mask = args.node_cidr_mask_size
    grace = str(args.node_monitor_grace_period)
    try:
        server.node_grace = (
            float(grace[:-1]) * (60 if grace.endswith("m") else 1) if grace[-1] in "sm" else float(grace)
        )
    except ValueError:
        parser.error(f"--node-monitor-grace-period: not a duration: {grace!r} (e.g. 50s)")
    httpd = serve(
        args.bind,
        args.port,
        server,
        make_ssl_context(args.tls_cert, args.tls_key, args.client_ca),
        args.verbose,
    )
    if args.advertise_address:
        server.advertise = args.advertise_address
        server.address = f"{args.advertise_address}:{server.port}"
    server.controllers.start()
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(
        f"kube-standin {SERVER_VERSION} serving on https://{args.bind}:{args.port} at {now_iso()}", flush=True
    )
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        server.controllers.stop()
        server.store.close()


if __name__ == "__main__":
    main()
