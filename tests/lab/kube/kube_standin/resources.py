"""The resource types the stand-in serves: built-in ones plus those CustomResourceDefinitions add."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = tuple(ALL_VERBS)
    crd: bool = False
    # printer columns of a CRD: (name, type, jsonPath)
    columns: tuple[tuple[str, str, str], ...] = field(default=())

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def key(self) -> tuple[str, str]:
        """Storage identity: group and plural (versions of one group share storage)."""
        return (self.group, self.plural)


_CORE_NS = [
    (
        "pods",
        "Pod",
        ("po",),
        ("status", "log", "eviction", "binding", "exec", "ephemeralcontainers"),
        ("all",),
    ),
    ("services", "Service", ("svc",), ("status", "proxy"), ("all",)),
    ("endpoints", "Endpoints", ("ep",), (), ()),
    ("configmaps", "ConfigMap", ("cm",), (), ()),
    ("secrets", "Secret", (), (), ()),
    ("serviceaccounts", "ServiceAccount", ("sa",), ("token",), ()),
    ("events", "Event", ("ev",), (), ()),
    ("persistentvolumeclaims", "PersistentVolumeClaim", ("pvc",), ("status",), ()),
    ("replicationcontrollers", "ReplicationController", ("rc",), ("status", "scale"), ("all",)),
    ("resourcequotas", "ResourceQuota", ("quota",), ("status",), ()),
    ("limitranges", "LimitRange", ("limits",), (), ()),
    ("podtemplates", "PodTemplate", (), (), ()),
]
_CORE_CLUSTER = [
    ("namespaces", "Namespace", ("ns",), ("status", "finalize"), ()),
    ("nodes", "Node", ("no",), ("status", "proxy"), ()),
    ("persistentvolumes", "PersistentVolume", ("pv",), ("status",), ()),
]
# group, version, plural, kind, namespaced, short names, subresources, categories
_GROUPS: list[tuple[str, str, str, str, bool, tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = [
    ("apps", "v1", "deployments", "Deployment", True, ("deploy",), ("status", "scale"), ("all",)),
    ("apps", "v1", "replicasets", "ReplicaSet", True, ("rs",), ("status", "scale"), ("all",)),
    ("apps", "v1", "statefulsets", "StatefulSet", True, ("sts",), ("status", "scale"), ("all",)),
    ("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), ("status",), ("all",)),
    ("apps", "v1", "controllerrevisions", "ControllerRevision", True, (), (), ()),
    ("batch", "v1", "jobs", "Job", True, (), ("status",), ("all",)),
    ("batch", "v1", "cronjobs", "CronJob", True, ("cj",), ("status",), ("all",)),
    (
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        True,
        ("hpa",),
        ("status",),
        (),
    ),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), ("status",), ()),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role", True, (), (), ()),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, (), (), ()),
    ("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, (), (), ()),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, (), (), ()),
    ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, ("netpol",), (), ()),
    ("networking.k8s.io", "v1", "ingresses", "Ingress", True, ("ing",), ("status",), ()),
    ("networking.k8s.io", "v1", "ingressclasses", "IngressClass", False, (), (), ()),
    ("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False, (), (), ()),
    ("coordination.k8s.io", "v1", "leases", "Lease", True, (), (), ()),
    ("events.k8s.io", "v1", "events", "Event", True, ("ev",), (), ()),
    ("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True, (), (), ()),
    ("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, ("pc",), (), ()),
    ("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, ("sc",), (), ()),
    ("storage.k8s.io", "v1", "csidrivers", "CSIDriver", False, (), (), ()),
    ("storage.k8s.io", "v1", "csinodes", "CSINode", False, (), (), ()),
    ("storage.k8s.io", "v1", "volumeattachments", "VolumeAttachment", False, (), ("status",), ()),
    (
        "certificates.k8s.io",
        "v1",
        "certificatesigningrequests",
        "CertificateSigningRequest",
        False,
        ("csr",),
        ("status", "approval"),
        (),
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
        (),
        (),
        (),
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
        (),
        (),
        (),
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        ("crd", "crds"),
        ("status",),
        ("api-extensions",),
    ),
    (
        "apiregistration.k8s.io",
        "v1",
        "apiservices",
        "APIService",
        False,
        (),
        ("status",),
        ("api-extensions",),
    ),
    ("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", "FlowSchema", False, (), ("status",), ()),
    (
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "prioritylevelconfigurations",
        "PriorityLevelConfiguration",
        False,
        (),
        ("status",),
        (),
    ),
]
# create-only "virtual" resources (reviews)
_REVIEWS = [
    ("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False),
    ("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", False),
    ("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False),
    ("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False),
    ("authorization.k8s.io", "v1", "localsubjectaccessreviews", "LocalSubjectAccessReview", True),
    ("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview", False),
]
# group -> preferred version first
GROUP_ORDER = [
    "apiregistration.k8s.io",
    "apps",
    "events.k8s.io",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "networking.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "storage.k8s.io",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "scheduling.k8s.io",
    "coordination.k8s.io",
    "node.k8s.io",
    "discovery.k8s.io",
    "flowcontrol.apiserver.k8s.io",
]


def builtin_resources() -> list[Resource]:
    out = [Resource("", "v1", p, k, True, s, sub, c) for p, k, s, sub, c in _CORE_NS]
    out += [Resource("", "v1", p, k, False, s, sub, c) for p, k, s, sub, c in _CORE_CLUSTER]
    out.append(Resource("", "v1", "bindings", "Binding", True, verbs=("create",)))
    out += [Resource(g, v, p, k, ns, s, sub, c) for g, v, p, k, ns, s, sub, c in _GROUPS]
    out += [Resource(g, v, p, k, ns, verbs=("create",)) for g, v, p, k, ns in _REVIEWS]
    return out


class Registry:
    """Which group/version/resource exists; CRDs add and remove entries at run time."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._builtin = builtin_resources()
        self._crd: dict[str, list[Resource]] = {}  # CRD name -> its served versions

    def all(self) -> list[Resource]:
        with self._lock:
            out = list(self._builtin)
            for lst in self._crd.values():
                out += lst
            return out

    def lookup(self, group: str, version: str, plural: str) -> Resource | None:
        for res in self.all():
            if res.group == group and res.version == version and res.plural == plural:
                return res
        return None

    def by_kind(self, group: str, kind: str) -> Resource | None:
        for res in self.all():
            if res.group == group and res.kind == kind:
                return res
        return None

    def storage_key(self, group: str, plural: str) -> bool:
        return any(r.group == group and r.plural == plural for r in self.all())

    def groups(self) -> dict[str, list[str]]:
        """group -> versions (preferred first), core group excluded."""
        found: dict[str, list[str]] = {}
        for res in self.all():
            if res.group and res.version not in found.setdefault(res.group, []):
                found[res.group].append(res.version)
        order = {g: i for i, g in enumerate(GROUP_ORDER)}
        return dict(sorted(found.items(), key=lambda kv: (order.get(kv[0], 1000), kv[0])))

    def crd_changed(self, crd: dict[str, Any], deleted: bool = False) -> None:
        name = crd.get("metadata", {}).get("name", "")
        with self._lock:
            self._crd.pop(name, None)
            if deleted:
                return
            spec = crd.get("spec", {})
            names = spec.get("names", {})
            out = []
            for ver in spec.get("versions", []):
                if not ver.get("served", True):
                    continue
                subs = ver.get("subresources") or {}
                subresources = tuple(s for s in ("status", "scale") if s in subs)
                cols = tuple(
                    (c.get("name", ""), c.get("type", "string"), c.get("jsonPath", ""))
                    for c in ver.get("additionalPrinterColumns", []) or []
                )
                out.append(
                    Resource(
                        spec.get("group", ""),
                        ver.get("name", "v1"),
                        names.get("plural", ""),
                        names.get("kind", ""),
                        spec.get("scope", "Namespaced") == "Namespaced",
                        tuple(names.get("shortNames", []) or []),
                        subresources,
                        tuple(names.get("categories", []) or []),
                        crd=True,
                        columns=cols,
                    )
                )
            # storage version first so it is the preferred one
            out.sort(
                key=lambda r: (
                    0
                    if any(v.get("name") == r.version and v.get("storage") for v in spec.get("versions", []))
                    else 1
                )
            )
            self._crd[name] = out
