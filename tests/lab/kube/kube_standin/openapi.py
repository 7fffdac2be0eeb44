"""OpenAPI documents: enough of /openapi/v3 for kubectl (field validation support, patch types, gvk of each
path) and /openapi/v2 in JSON. Schemas are open objects: `kubectl explain` is not served."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from . import SERVER_VERSION
from .resources import Registry, Resource

OPEN_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def v3_root(registry: Registry) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    gvs = sorted({(r.group, r.version) for r in registry.all()})
    for group, version in gvs:
        doc = v3_group_version(registry, group, version)
        digest = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:64].upper()
        paths[_gv_path(group, version)] = {
            "serverRelativeURL": f"/openapi/v3/{_gv_path(group, version)}?hash={digest}"
        }
    for extra in ("api", "apis", "version", ".well-known/openid-configuration", "openid/v1/jwks", "logs"):
        paths[extra] = {"serverRelativeURL": f"/openapi/v3/{extra}?hash=0"}
    return {"paths": paths}


def _params(names: list[str]) -> list[dict[str, Any]]:
    return [{"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}} for n in names]


def _ops(res: Resource, item: bool) -> dict[str, Any]:
    gvk = {"group": res.group, "version": res.version, "kind": res.kind}
    ref = {"schema": OPEN_OBJECT}
    base = {
        "x-kubernetes-group-version-kind": gvk,
        "responses": {"200": {"description": "OK", "content": {"application/json": ref}}},
    }
    ops: dict[str, Any] = {}
    if item:
        ops["get"] = {**base, "x-kubernetes-action": "get", "operationId": f"read{res.kind}"}
        ops["put"] = {
            **base,
            "x-kubernetes-action": "put",
            "operationId": f"replace{res.kind}",
            "parameters": _params(["dryRun", "fieldManager", "fieldValidation"]),
            "requestBody": {"content": {"*/*": ref}, "required": True},
        }
        patch_types = [
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ]
        # kubectl's client-side apply then computes its strategic merge patch from its compiled-in types
        # (the schemas here carry no x-kubernetes-patch-* metadata); CRDs get a JSON merge patch as real.
        ops["patch"] = {
            **base,
            "x-kubernetes-action": "patch",
            "operationId": f"patch{res.kind}",
            "parameters": _params(["dryRun", "fieldManager", "fieldValidation", "force"]),
            "requestBody": {"content": {t: ref for t in patch_types}, "required": True},
        }
        ops["delete"] = {**base, "x-kubernetes-action": "delete", "operationId": f"delete{res.kind}"}
    else:
        ops["get"] = {**base, "x-kubernetes-action": "list", "operationId": f"list{res.kind}"}
        ops["post"] = {
            **base,
            "x-kubernetes-action": "post",
            "operationId": f"create{res.kind}",
            "parameters": _params(["dryRun", "fieldManager", "fieldValidation"]),
            "requestBody": {"content": {"*/*": ref}, "required": True},
        }
    return ops


def v3_group_version(registry: Registry, group: str, version: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    prefix = "/" + _gv_path(group, version)
    for res in registry.all():
        if res.group != group or res.version != version:
            continue
        base = (
            f"{prefix}/namespaces/{{namespace}}/{res.plural}" if res.namespaced else f"{prefix}/{res.plural}"
        )
        paths[base] = _ops(res, item=False)
        if res.verbs != ("create",):
            paths[base + "/{name}"] = _ops(res, item=True)
        rev = ".".join(reversed(group.split("."))) if group else "io.k8s.api.core"
        schemas[f"{rev}.{version}.{res.kind}"] = {
            **OPEN_OBJECT,
            "x-kubernetes-group-version-kind": [{"group": group, "version": version, "kind": res.kind}],
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": SERVER_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def v2(registry: Registry) -> dict[str, Any]:
    definitions = {}
    for res in registry.all():
        definitions[f"{res.group or 'core'}.{res.version}.{res.kind}"] = {
            "type": "object",
            "x-kubernetes-group-version-kind": [
                {"group": res.group, "version": res.version, "kind": res.kind}
            ],
        }
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": SERVER_VERSION},
        "paths": {},
        "definitions": definitions,
    }
