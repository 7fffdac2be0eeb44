"""Object semantics of the API server: defaults, validation, optimistic concurrency, patches, deletion,
subresources. The HTTP layer (apiserver.py) and the controllers (controllers.py) both go through here."""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
import re
import time
import uuid
from typing import Any

from . import merge
from .errors import ApiError
from .resources import Registry, Resource
from .selectors import (
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
    selector_from_label_selector,
)
from .store import Store, now_iso

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# kinds whose names only need to be valid path segments (RBAC, ...)
PATH_SEGMENT_NAMES = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ServiceAccount"}
LABEL_NAME_KINDS = {"Namespace", "Service"}
# status kept on create (the kubelet creates its Node with status; Events and similar have no status)
KEEP_STATUS_ON_CREATE = {"Node", "Event", "CertificateSigningRequest"}
NO_GENERATION = {
    "ConfigMap",
    "Secret",
    "Event",
    "Endpoints",
    "EndpointSlice",
    "ServiceAccount",
    "Lease",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "Node",
    "Namespace",
    "Pod",
}
SERVICE_CIDR = ipaddress.ip_network("10.96.0.0/12")


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = obj["metadata"] = {}
    return meta


def _body_without(obj: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in keys}


def pod_ready(pod: dict[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    if pod.get("status", {}).get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions", []) or []
    )


def int_or_percent(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        pct = int(value[:-1])
        raw = total * pct / 100
        return int(-(-raw // 1)) if round_up else int(raw)
    return int(value)


class Api:
    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry
        self.on_change: list[Any] = []  # callables(event) the controllers register
        for crd in store.select("apiextensions.k8s.io", "customresourcedefinitions"):
            registry.crd_changed(crd)

    # ------------------------------------------------------------------ lookup
    def resource(self, group: str, version: str, plural: str) -> Resource:
        res = self.registry.lookup(group, version, plural)
        if res is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return res

    def res_for(self, api_version: str, kind: str) -> Resource:
        group, _, version = api_version.rpartition("/")
        for res in self.registry.all():
            if res.group == group and res.version == version and res.kind == kind:
                return res
        raise ApiError(404, "NotFound", f"no matches for kind {kind!r} in version {api_version!r}")

    def _decorate(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        obj["apiVersion"] = res.group_version
        obj["kind"] = res.kind
        return obj

    def get(self, res: Resource, namespace: str, name: str) -> dict[str, Any]:
        obj = self.store.get(res.group, res.plural, namespace if res.namespaced else "", name)
        if obj is None:
            raise ApiError.not_found(res.group, res.plural, name)
        return self._decorate(res, obj)

    def try_get(self, res: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.get(res, namespace, name)
        except ApiError:
            return None

    def select(
        self,
        res: Resource,
        namespace: str | None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> tuple[list[dict[str, Any]], str]:
        lreq = parse_label_selector(label_selector)
        freq = parse_field_selector(field_selector, res.kind)
        with self.store.lock:
            items = self.store.select(res.group, res.plural, namespace if res.namespaced else None)
            rv = str(self.store.rv)
        out = [
            self._decorate(res, o)
            for o in items
            if labels_match(lreq, o["metadata"].get("labels")) and fields_match(freq, o)
        ]
        return out, rv

    def builtin(self, group: str, plural: str) -> Resource:
        for res in self.registry.all():
            if res.group == group and res.plural == plural:
                return res
        raise KeyError(plural)

    # ------------------------------------------------------------------ validation and defaults
    def _check_identity(self, res: Resource, namespace: str, obj: dict[str, Any], name: str | None) -> None:
        if not isinstance(obj, dict):
            raise ApiError.bad_request("the body of the request was in an unknown format")
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if kind and kind != res.kind:
            raise ApiError.bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({res.kind})"
            )
        if api_version and api_version != res.group_version:
            raise ApiError.bad_request(
                f"the API version in the data ({api_version}) does not match the expected "
                f"API version ({res.group_version})"
            )
        meta = _meta(obj)
        if res.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and body_ns != namespace:
                raise ApiError.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if name is not None and meta.get("name") and meta["name"] != name:
            raise ApiError.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        if name is not None:
            meta["name"] = name

    def _validate(self, res: Resource, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        name = meta.get("name", "")
        causes: list[tuple[str, str, str]] = []
        if not name:
            causes.append(
                ("FieldValueRequired", "metadata.name", "Required value: name or generateName is required")
            )
        elif res.kind in PATH_SEGMENT_NAMES and res.kind != "ServiceAccount":
            if "/" in name or name in (".", ".."):
                causes.append(
                    ("FieldValueInvalid", "metadata.name", f"Invalid value: \"{name}\": may not contain '/'")
                )
        else:
            pattern = DNS1123_LABEL if res.kind in LABEL_NAME_KINDS else DNS1123_SUBDOMAIN
            if len(name) > 253 or not pattern.match(name):
                causes.append(
                    (
                        "FieldValueInvalid",
                        "metadata.name",
                        f'Invalid value: "{name}": a lowercase RFC 1123 '
                        f"{'label' if pattern is DNS1123_LABEL else 'subdomain'} must consist of lower case "
                        "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                        "character",
                    )
                )
        for key, val in (meta.get("labels") or {}).items():
            if (
                not isinstance(val, str)
                or len(val) > 63
                or not re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?", val)
            ):
                causes.append(
                    (
                        "FieldValueInvalid",
                        f"metadata.labels: Invalid value: {val!r}",
                        f"label {key!r} value must be 63 characters or less, alphanumeric, '-', '_' or '.'",
                    )
                )
        spec = obj.get("spec") or {}
        if res.kind == "Pod":
            causes += self._validate_pod_spec(spec, "spec")
        elif res.kind in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"):
            template = spec.get("template") or {}
            causes += self._validate_pod_spec(template.get("spec") or {}, "spec.template.spec")
            sel = spec.get("selector")
            if not sel:
                causes.append(("FieldValueRequired", "spec.selector", "Required value"))
            else:
                reqs = selector_from_label_selector(sel) or []
                if not labels_match(reqs, (template.get("metadata") or {}).get("labels")):
                    causes.append(
                        (
                            "FieldValueInvalid",
                            "spec.template.metadata.labels",
                            f"Invalid value: {json.dumps((template.get('metadata') or {}).get('labels'))}: "
                            "`selector` does not match template `labels`",
                        )
                    )
            if isinstance(spec.get("replicas"), int) and spec["replicas"] < 0:
                causes.append(
                    (
                        "FieldValueInvalid",
                        "spec.replicas",
                        f"Invalid value: {spec['replicas']}: must be greater than or equal to 0",
                    )
                )
        elif res.kind == "Service":
            for i, port in enumerate(spec.get("ports") or []):
                if not isinstance(port.get("port"), int):
                    causes.append(("FieldValueRequired", f"spec.ports[{i}].port", "Required value"))
        elif res.kind == "CustomResourceDefinition":
            names = spec.get("names") or {}
            if name != f"{names.get('plural')}.{spec.get('group')}":
                causes.append(
                    (
                        "FieldValueInvalid",
                        "metadata.name",
                        f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group',
                    )
                )
        if causes:
            raise ApiError.invalid(res.group, res.kind, name, causes)

    @staticmethod
    def _validate_pod_spec(spec: dict[str, Any], where: str) -> list[tuple[str, str, str]]:
        causes = []
        containers = spec.get("containers")
        if not containers:
            causes.append(("FieldValueRequired", f"{where}.containers", "Required value"))
        for i, ctr in enumerate(containers or []):
            if not ctr.get("name"):
                causes.append(("FieldValueRequired", f"{where}.containers[{i}].name", "Required value"))
            if not ctr.get("image"):
                causes.append(("FieldValueRequired", f"{where}.containers[{i}].image", "Required value"))
        return causes

    def _default_pod_spec(self, spec: dict[str, Any]) -> None:
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("securityContext", {})
        for ctr in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            image = str(ctr.get("image", ""))
            tag = image.rsplit("/", 1)[-1]
            latest = ":" not in tag or tag.endswith(":latest")
            ctr.setdefault("imagePullPolicy", "Always" if latest and "@" not in image else "IfNotPresent")
            ctr.setdefault("terminationMessagePath", "/dev/termination-log")
            ctr.setdefault("terminationMessagePolicy", "File")
            ctr.setdefault("resources", {})
            for port in ctr.get("ports") or []:
                port.setdefault("protocol", "TCP")

    def _defaults(self, res: Resource, obj: dict[str, Any]) -> None:
        spec = obj.get("spec")
        kind = res.kind
        if kind == "Namespace":
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            _meta(obj).setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        elif kind == "Pod" and isinstance(spec, dict):
            self._default_pod_spec(spec)
            spec.setdefault("serviceAccountName", spec.get("serviceAccount", "default"))
            spec.setdefault("serviceAccount", spec["serviceAccountName"])
            spec.setdefault("priority", 0)
            spec.setdefault("enableServiceLinks", True)
            spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
            tolerations = spec.setdefault("tolerations", [])
            for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
                if not any(t.get("key") == taint for t in tolerations):
                    tolerations.append(
                        {"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
                    )
        elif kind in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet") and isinstance(spec, dict):
            tspec = spec.setdefault("template", {}).setdefault("spec", {})
            self._default_pod_spec(tspec)
            if kind != "DaemonSet":
                spec.setdefault("replicas", 1)
            if kind != "ReplicaSet":
                spec.setdefault("revisionHistoryLimit", 10)
            if kind == "Deployment":
                spec.setdefault(
                    "strategy",
                    {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}},
                )
                spec.setdefault("progressDeadlineSeconds", 600)
            elif kind == "DaemonSet":
                spec.setdefault(
                    "updateStrategy",
                    {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                )
            elif kind == "StatefulSet":
                spec.setdefault("podManagementPolicy", "OrderedReady")
                spec.setdefault(
                    "updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
                )
        elif kind == "Service" and isinstance(spec, dict):
            spec.setdefault("type", "ClusterIP")
            spec.setdefault("sessionAffinity", "None")
            if spec.get("clusterIP") != "None" and not spec.get("clusterIP"):
                spec["clusterIP"] = self._allocate_cluster_ip()
            if spec["clusterIP"] != "None":
                spec.setdefault("clusterIPs", [spec["clusterIP"]])
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
            spec.setdefault("internalTrafficPolicy", "Cluster")
            for port in spec.get("ports") or []:
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
        elif kind == "Secret":
            obj.setdefault("type", "Opaque")
            string_data = obj.pop("stringData", None)
            if isinstance(string_data, dict):
                data = obj.setdefault("data", {})
                for key, val in string_data.items():
                    data[key] = base64.b64encode(str(val).encode()).decode()
        elif kind == "Node":
            obj.setdefault("spec", {})
        elif kind == "PriorityClass":
            obj.setdefault("preemptionPolicy", "PreemptLowerPriority")
        elif kind == "CustomResourceDefinition" and isinstance(spec, dict):
            spec.setdefault("conversion", {"strategy": "None"})

    def _pod_priority(self, spec: dict[str, Any], pod: str) -> None:
        """Priority admission: spec.priority from spec.priorityClassName (or the globalDefault class)."""
        name = spec.get("priorityClassName")
        classes = self.store.select("scheduling.k8s.io", "priorityclasses")
        if name:
            found = next((c for c in classes if c["metadata"]["name"] == name), None)
            if found is None:
                raise ApiError(
                    403,
                    "Forbidden",
                    f'pods "{pod}" is forbidden: no PriorityClass with name {name} was found',
                )
        else:
            found = next((c for c in classes if c.get("globalDefault")), None)
            if found is not None:
                spec["priorityClassName"] = found["metadata"]["name"]
        spec["priority"] = int(found.get("value", 0)) if found else 0
        if found and found.get("preemptionPolicy"):
            spec["preemptionPolicy"] = found["preemptionPolicy"]

    def _allocate_cluster_ip(self) -> str:
        used = {s.get("spec", {}).get("clusterIP") for s in self.store.select("", "services")}
        for offset in range(10, SERVICE_CIDR.num_addresses - 1):
            candidate = str(SERVICE_CIDR.network_address + offset)
            if candidate not in used:
                return candidate
        raise ApiError(500, "InternalError", "no cluster IP left in 10.96.0.0/12")

    # ------------------------------------------------------------------ writes
    def _namespace_ok(self, res: Resource, namespace: str, creating: bool) -> None:
        if not res.namespaced:
            return
        ns = self.store.get("", "namespaces", "", namespace)
        if ns is None:
            raise ApiError.not_found("", "namespaces", namespace)
        if creating and ns["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f'{res.plural} "" is forbidden: unable to create new content in '
                f"namespace {namespace} because it is being terminated",
            )

    def create(
        self,
        res: Resource,
        namespace: str,
        body: dict[str, Any],
        dry_run: bool = False,
        field_manager: str = "",
    ) -> dict[str, Any]:
        if res.plural in ("bindings",):
            raise ApiError.method_not_allowed()
        obj = copy.deepcopy(body)
        self._check_identity(res, namespace, obj, None)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        self._defaults(res, obj)
        if res.kind == "Pod" and isinstance(obj.get("spec"), dict):
            self._pod_priority(obj["spec"], obj["metadata"].get("name", ""))
        self._validate(res, obj)
        with self.store.lock:
            self._namespace_ok(res, namespace, True)
            key_ns = namespace if res.namespaced else ""
            if self.store.get(res.group, res.plural, key_ns, meta["name"]) is not None:
                raise ApiError.already_exists(res.group, res.plural, meta["name"])
            for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(field, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_iso()
            if res.crd or (res.kind not in NO_GENERATION and "spec" in obj):
                meta["generation"] = 1
            if "status" in res.subresources and res.kind not in KEEP_STATUS_ON_CREATE:
                obj.pop("status", None)
            if res.kind == "Pod":
                obj["status"] = {"phase": "Pending", "qosClass": self._qos(obj)}
            elif res.kind == "Namespace":
                obj["status"] = {"phase": "Active"}
            elif res.kind == "CustomResourceDefinition":
                obj["status"] = self._crd_status(obj)
            self._decorate(res, obj)
            if field_manager:
                self._record_manager(obj, field_manager, "Update")
            if dry_run:
                meta["resourceVersion"] = str(self.store.rv)
                return obj
            return self._commit(res, obj, "ADDED")

    @staticmethod
    def _qos(pod: dict[str, Any]) -> str:
        ctrs = pod.get("spec", {}).get("containers", []) or []
        reqs = [c.get("resources", {}) or {} for c in ctrs]
        if not any(r.get("requests") or r.get("limits") for r in reqs):
            return "BestEffort"
        if all(
            r.get("limits")
            and all(
                r.get("limits", {}).get(k) == r.get("requests", {}).get(k, v) for k, v in r["limits"].items()
            )
            and {"cpu", "memory"} <= set(r["limits"])
            for r in reqs
        ):
            return "Guaranteed"
        return "Burstable"

    @staticmethod
    def _crd_status(crd: dict[str, Any]) -> dict[str, Any]:
        spec = crd.get("spec", {})
        t = now_iso()
        return {
            "acceptedNames": spec.get("names", {}),
            "storedVersions": [v["name"] for v in spec.get("versions", []) if v.get("storage")],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": t,
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": t,
                },
            ],
        }

    @staticmethod
    def _record_manager(obj: dict[str, Any], manager: str, operation: str) -> None:
        meta = obj["metadata"]
        entries = [
            e
            for e in meta.get("managedFields") or []
            if not (e.get("manager") == manager and e.get("operation") == operation)
        ]
        entries.append(
            {
                "manager": manager,
                "operation": operation,
                "apiVersion": obj.get("apiVersion"),
                "time": now_iso(),
                "fieldsType": "FieldsV1",
                "fieldsV1": merge.fields_v1(
                    merge.field_paths(_body_without(obj, "status") if operation != "Apply" else obj)
                ),
            }
        )
        meta["managedFields"] = entries

    def _commit(self, res: Resource, obj: dict[str, Any], event: str) -> dict[str, Any]:
        saved = self.store.save(res.group, res.plural, obj, event)
        if event == "DELETED":
            self.store.extra.get("applied", {}).pop(saved["metadata"].get("uid"), None)
        if res.kind == "CustomResourceDefinition":
            self.registry.crd_changed(saved, deleted=event == "DELETED")
            if event == "DELETED":  # the custom objects go with their definition
                spec = saved.get("spec") or {}
                group, plural = spec.get("group", ""), (spec.get("names") or {}).get("plural", "")
                for key in self.store.keys(group, plural):
                    gone = self.store.get(*key)
                    if gone is not None:
                        self.store.save(group, plural, gone, "DELETED")
        for hook in self.on_change:
            hook(res, saved, event)
        return self._decorate(res, saved)

    def update(
        self,
        res: Resource,
        namespace: str,
        name: str,
        body: dict[str, Any],
        subresource: str = "",
        dry_run: bool = False,
        field_manager: str = "",
        _apply_manager: str = "",
    ) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        self._check_identity(res, namespace, obj, name)
        with self.store.lock:
            self._namespace_ok(res, namespace, False)
            old = self.get(res, namespace, name)
            want_rv = obj["metadata"].get("resourceVersion")
            if want_rv and want_rv != old["metadata"]["resourceVersion"]:
                raise ApiError.conflict(
                    res.group,
                    res.plural,
                    name,
                    "the object has been modified; please apply "
                    "your changes to the latest version and try again",
                )
            if subresource in ("status", "approval"):
                new = copy.deepcopy(old)
                if "status" in obj:
                    new["status"] = obj["status"]
                else:
                    new.pop("status", None)
            else:
                new = obj
                if "status" in res.subresources:
                    if "status" in old:
                        new["status"] = old["status"]
                    else:
                        new.pop("status", None)
                self._defaults(res, new)
                self._validate(res, new)
                if res.kind == "Namespace":
                    new["status"] = old.get("status", {})
            nmeta, ometa = new["metadata"], old["metadata"]
            for field in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if field in ometa:
                    nmeta[field] = ometa[field]
                else:
                    nmeta.pop(field, None)
            if not subresource and "managedFields" not in nmeta and "managedFields" in ometa:
                nmeta["managedFields"] = ometa["managedFields"]
            if ometa.get("deletionTimestamp") and set(nmeta.get("finalizers") or []) - set(
                ometa.get("finalizers") or []
            ):
                raise ApiError.invalid(
                    res.group,
                    res.kind,
                    name,
                    [
                        (
                            "FieldValueForbidden",
                            "metadata.finalizers",
                            "Forbidden: no new finalizers can be added if the object is being deleted",
                        )
                    ],
                )
            if "generation" in nmeta and _body_without(new, "metadata", "status") != _body_without(
                old, "metadata", "status"
            ):
                nmeta["generation"] = int(ometa.get("generation", 1)) + 1
            nmeta["resourceVersion"] = ometa["resourceVersion"]
            self._decorate(res, new)
            if field_manager and not _apply_manager:
                self._record_manager(new, field_manager, "Update")
            if self._same(new, old):
                return old
            if dry_run:
                return new
            if nmeta.get("deletionTimestamp") and not nmeta.get("finalizers"):
                return self._commit(res, new, "DELETED")
            return self._commit(res, new, "MODIFIED")

    @staticmethod
    def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
        def strip(o: dict[str, Any]) -> dict[str, Any]:
            o = copy.deepcopy(o)
            o["metadata"].pop("managedFields", None)
            o["metadata"].pop("resourceVersion", None)
            return o

        return strip(a) == strip(b)

    def patch(
        self,
        res: Resource,
        namespace: str,
        name: str,
        content_type: str,
        raw: bytes,
        subresource: str = "",
        dry_run: bool = False,
        field_manager: str = "",
        force: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Returns (object, created)."""
        ctype = content_type.split(";")[0].strip()
        try:
            patch = json.loads(raw or b"null")
        except ValueError as exc:
            if ctype == "application/apply-patch+yaml":
                patch = _tiny_yaml(raw.decode())
            else:
                raise ApiError.bad_request(f"error decoding patch: {exc}") from exc
        with self.store.lock:
            current = self.try_get(res, namespace, name)
            if ctype == "application/apply-patch+yaml":
                if not field_manager:
                    raise ApiError.bad_request(
                        "PATCH, application/apply-patch+yaml requires fieldManager to be set"
                    )
                if not isinstance(patch, dict):
                    raise ApiError.bad_request("apply patch must be an object")
                return self._apply(res, namespace, name, current, patch, subresource, dry_run, field_manager)
            if current is None:
                raise ApiError.not_found(res.group, res.plural, name)
            if ctype == "application/json-patch+json":
                new = merge.json_patch(current, patch)
            elif ctype == "application/merge-patch+json":
                new = merge.json_merge_patch(current, patch)
            elif ctype == "application/strategic-merge-patch+json":
                if res.crd:
                    raise ApiError(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in an unknown format - accepted media types include: "
                        "application/json-patch+json, application/merge-patch+json, "
                        "application/apply-patch+yaml",
                    )
                new = merge.strategic_merge(current, patch)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {ctype!r}")
            if not isinstance(new, dict):
                raise ApiError.bad_request("patch did not produce an object")
            new_meta = _meta(new)
            if not (isinstance(patch, dict) and (patch.get("metadata") or {}).get("resourceVersion")):
                new_meta["resourceVersion"] = current["metadata"]["resourceVersion"]
            return self.update(res, namespace, name, new, subresource, dry_run, field_manager), False

    def _apply(
        self,
        res: Resource,
        namespace: str,
        name: str,
        current: dict[str, Any] | None,
        config: dict[str, Any],
        subresource: str,
        dry_run: bool,
        manager: str,
    ) -> tuple[dict[str, Any], bool]:
        self._check_identity(res, namespace, config, name)
        sets: dict[str, dict[str, list[list[str]]]] = self.store.extra.setdefault("applied", {})
        if current is None:
            if subresource:
                raise ApiError.not_found(res.group, res.plural, name)
            obj = self.create(res, namespace, config, dry_run=True)
            obj["metadata"].pop("resourceVersion", None)
            self._record_manager(obj, manager, "Apply")
            if dry_run:
                return obj, True
            created = self.create(res, namespace, obj)
            sets[created["metadata"]["uid"]] = {manager: [list(p) for p in merge.field_paths(config)]}
            self.store.mark_dirty()
            return created, True
        uid = current["metadata"]["uid"]
        mine = sets.get(uid, {})
        previous = {tuple(p) for p in mine.get(manager, [])}
        others = {tuple(p) for m, ps in mine.items() if m != manager for p in ps}
        merged = merge.server_side_apply(current, config, previous, others)
        merged["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        self._record_manager(merged, manager, "Apply")
        result = self.update(res, namespace, name, merged, subresource, dry_run, _apply_manager=manager)
        if not dry_run:
            sets.setdefault(uid, {})[manager] = [list(p) for p in merge.field_paths(config)]
            self.store.mark_dirty()
        return result, False

    # ------------------------------------------------------------------ delete
    def delete(
        self,
        res: Resource,
        namespace: str,
        name: str,
        options: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        options = options or {}
        with self.store.lock:
            obj = self.get(res, namespace, name)
            meta = obj["metadata"]
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != meta["uid"]:
                raise ApiError.conflict(
                    res.group,
                    res.plural,
                    name,
                    f"Precondition failed: UID in precondition: {pre['uid']}, UID in object "
                    f"meta: {meta['uid']}",
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise ApiError.conflict(
                    res.group,
                    res.plural,
                    name,
                    "Precondition failed: ResourceVersion in precondition: "
                    f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                    f"{meta['resourceVersion']}",
                )
            policy = options.get("propagationPolicy") or (
                "Orphan" if options.get("orphanDependents") else "Background"
            )
            if dry_run:
                return obj
            if res.kind == "Namespace" and name in ("default", "kube-system", "kube-public"):
                raise ApiError(
                    403,
                    "Forbidden",
                    f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                    {"name": name, "kind": "namespaces"},
                )
            if res.kind == "Namespace":
                if not meta.get("deletionTimestamp"):
                    meta["deletionTimestamp"] = now_iso()
                    meta["deletionGracePeriodSeconds"] = 0
                    obj["status"] = {"phase": "Terminating"}
                    return self._commit(res, obj, "MODIFIED")
                return obj
            if policy == "Foreground" and "foregroundDeletion" not in (meta.get("finalizers") or []):
                meta.setdefault("finalizers", []).append("foregroundDeletion")
            if policy == "Orphan":
                self._orphan_dependents(meta["uid"])
            if meta.get("finalizers"):
                if not meta.get("deletionTimestamp"):
                    meta["deletionTimestamp"] = now_iso()
                    meta["deletionGracePeriodSeconds"] = 0
                    return self._commit(res, obj, "MODIFIED")
                return obj
            gone = self._commit(res, obj, "DELETED")
            if res.kind == "Pod":
                return gone
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": name, "group": res.group, "kind": res.plural, "uid": meta["uid"]},
            }

    def _orphan_dependents(self, owner_uid: str) -> None:
        for res in self.registry.all():
            if "create" not in res.verbs or res.verbs == ("create",):
                continue
            for obj in self.store.select(res.group, res.plural):
                refs = obj["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == owner_uid for r in refs):
                    obj["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != owner_uid]
                    self._commit(res, obj, "MODIFIED")

    def delete_collection(
        self,
        res: Resource,
        namespace: str | None,
        label_selector: str,
        field_selector: str,
        options: dict[str, Any] | None,
        dry_run: bool,
    ) -> dict[str, Any]:
        items, _ = self.select(res, namespace, label_selector, field_selector)
        deleted = []
        for item in items:
            meta = item["metadata"]
            try:
                self.delete(res, meta.get("namespace", ""), meta["name"], options, dry_run)
                deleted.append(item)
            except ApiError as exc:
                if exc.code != 404:
                    raise
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.group_version,
            "metadata": {"resourceVersion": str(self.store.rv)},
            "items": deleted,
        }

    # ------------------------------------------------------------------ subresources
    def evict(self, namespace: str, name: str, body: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        pods = self.builtin("", "pods")
        with self.store.lock:
            pod = self.get(pods, namespace, name)
            phase = pod.get("status", {}).get("phase")
            ignore_pdb = phase in ("Succeeded", "Failed", "Pending") or bool(
                pod["metadata"].get("deletionTimestamp")
            )
            if not ignore_pdb:
                pdbs = [
                    p
                    for p in self.store.select("policy", "poddisruptionbudgets", namespace)
                    if labels_match(
                        selector_from_label_selector(p.get("spec", {}).get("selector"))
                        or [("\0", "exists", [])],
                        pod["metadata"].get("labels"),
                    )
                ]
                if len(pdbs) > 1:
                    raise ApiError(
                        500,
                        "InternalError",
                        "This pod has more than one PodDisruptionBudget, which the "
                        "eviction subresource does not support.",
                    )
                if pdbs:
                    status = self.pdb_status(pdbs[0])
                    healthy = pod_ready(pod)
                    if healthy and status["disruptionsAllowed"] <= 0:
                        raise ApiError.too_many_requests(
                            "Cannot evict pod as it would violate the pod's disruption budget.",
                            [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {pdbs[0]['metadata']['name']} needs "
                                    f"{status['desiredHealthy']} healthy pods and has "
                                    f"{status['currentHealthy']} currently",
                                }
                            ],
                        )
                    if not healthy and status["currentHealthy"] < status["desiredHealthy"]:
                        raise ApiError.too_many_requests(
                            "Cannot evict pod as it would violate the pod's disruption budget.",
                            [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {pdbs[0]['metadata']['name']} does "
                                    "not "
                                    "allow "
                                    "evicting pods currently",
                                }
                            ],
                        )
            self.delete(pods, namespace, name, (body or {}).get("deleteOptions") or {}, dry_run)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def pdb_status(self, pdb: dict[str, Any]) -> dict[str, Any]:
        ns = pdb["metadata"]["namespace"]
        spec = pdb.get("spec", {})
        reqs = selector_from_label_selector(spec.get("selector"))
        pods = [
            p
            for p in self.store.select("", "pods", ns)
            if reqs is not None
            and labels_match(reqs, p["metadata"].get("labels"))
            and not p["metadata"].get("deletionTimestamp")
        ]
        expected = len(pods)
        healthy = sum(1 for p in pods if pod_ready(p))
        if "minAvailable" in spec:
            desired = int_or_percent(spec["minAvailable"], expected, True)
        elif "maxUnavailable" in spec:
            desired = max(0, expected - int_or_percent(spec["maxUnavailable"], expected, True))
        else:
            desired = expected
        allowed = max(0, healthy - desired)
        return {
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "disruptionsAllowed": allowed,
            "observedGeneration": pdb["metadata"].get("generation", 1),
        }

    def bind(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        pods = self.builtin("", "pods")
        with self.store.lock:
            pod = self.get(pods, namespace, name)
            node = (body.get("target") or {}).get("name")
            if not node:
                raise ApiError.invalid(
                    pods.group, "Binding", name, [("FieldValueRequired", "target.name", "Required value")]
                )
            if pod.get("spec", {}).get("nodeName"):
                raise ApiError.conflict(
                    "", "pods", name, f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"'
                )
            pod["spec"]["nodeName"] = node
            conds = [
                c
                for c in pod.setdefault("status", {}).get("conditions", [])
                if c.get("type") != "PodScheduled"
            ]
            conds.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": now_iso(),
                }
            )
            pod["status"]["conditions"] = conds
            self._commit(pods, pod, "MODIFIED")
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def pod_log(self, namespace: str, name: str, container: str, tail: int | None) -> str:
        pod = self.get(self.builtin("", "pods"), namespace, name)
        containers = [c.get("name") for c in pod.get("spec", {}).get("containers", [])]
        if not container:
            if len(containers) > 1:
                raise ApiError.bad_request(
                    f"a container name must be specified for pod {name}, choose one of: "
                    f"[{' '.join(containers)}]"
                )
            container = containers[0]
        if container not in containers:
            raise ApiError.bad_request(f"container {container} is not valid for pod {name}")
        node = pod.get("spec", {}).get("nodeName")
        if not node or pod.get("status", {}).get("phase") == "Pending":
            raise ApiError.bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            )
        spec = next(c for c in pod["spec"]["containers"] if c.get("name") == container)
        image = spec.get("image")
        started = pod.get("status", {}).get("startTime", pod["metadata"]["creationTimestamp"])
        # as a server that logs its command line at start (vLLM prints its arguments), secrets included
        argv = " ".join(str(a) for a in [*(spec.get("command") or []), *(spec.get("args") or [])])
        lines = [
            f"{started} lab stand-in: container {container} ({image}) started on node {node}",
            *([f"{started} lab stand-in: command line: {argv}"] if argv else []),
            f"{started} lab stand-in: no real process runs in this container (see docs/lab.md)",
            f"{started} lab stand-in: ready",
        ]
        if tail is not None:
            lines = lines[-tail:] if tail > 0 else []
        return "".join(line + "\n" for line in lines)

    def scale(self, res: Resource, namespace: str, name: str, body: dict[str, Any] | None) -> dict[str, Any]:
        obj = self.get(res, namespace, name)
        if body is not None:
            replicas = (body.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError.invalid(
                    "autoscaling",
                    "Scale",
                    name,
                    [
                        (
                            "FieldValueInvalid",
                            "spec.replicas",
                            "Invalid value: must be greater than or equal to 0",
                        )
                    ],
                )
            want = (body.get("metadata") or {}).get("resourceVersion")
            obj["spec"]["replicas"] = replicas
            if want:
                obj["metadata"]["resourceVersion"] = want
            obj = self.update(res, namespace, name, obj)
        sel = obj.get("spec", {}).get("selector", {})
        reqs = ",".join(f"{k}={v}" for k, v in (sel.get("matchLabels") or {}).items())
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: obj["metadata"].get(k)
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            },
            "spec": {"replicas": obj.get("spec", {}).get("replicas", 0)},
            "status": {"replicas": obj.get("status", {}).get("replicas", 0), "selector": reqs},
        }

    def now(self) -> float:
        return time.time()


def _tiny_yaml(text: str) -> Any:
    """Apply bodies are JSON from kubectl and the Python client; YAML bodies need a YAML parser we lack."""
    raise ApiError(
        415,
        "UnsupportedMediaType",
        "this stand-in accepts apply patches written as JSON (YAML is a superset: send JSON)",
    )
