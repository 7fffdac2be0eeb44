"""Decoding of the Kubernetes protobuf envelope for the request bodies kubectl's typed clients send.

kubectl sends built-in objects it builds itself (create namespace/deployment/configmap/secret/serviceaccount,
drain's Eviction, auth can-i's SelfSubjectAccessReview, create token's TokenRequest) as
`application/vnd.kubernetes.protobuf`: the magic "k8s\\0" then a runtime.Unknown message (typeMeta, raw).
The real server decodes every type; this one knows the fields of those messages (numbers from k8s.io/api's
generated.proto) and turns them into the JSON the rest of the server handles. Unknown fields are reported,
not guessed.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .errors import ApiError

MAGIC = b"k8s\x00"

# message -> field number -> (json name, type). Types: s string, i int, b bool, y bytes(base64 in JSON),
# "m:Msg" message, "ms" map<string,string>, "my" map<string,bytes>, "mq" map<string,Quantity>;
# a leading "*" is repeated, a leading "?" a pointer field (its zero value is kept)
Schema = dict[int, tuple[str, str]]
MESSAGES: dict[str, Schema] = {
    "Unknown": {
        1: ("typeMeta", "m:TypeMeta"),
        2: ("raw", "y"),
        3: ("contentEncoding", "s"),
        4: ("contentType", "s"),
    },
    "TypeMeta": {1: ("apiVersion", "s"), 2: ("kind", "s")},
    "ObjectMeta": {
        1: ("name", "s"),
        2: ("generateName", "s"),
        3: ("namespace", "s"),
        5: ("uid", "s"),
        6: ("resourceVersion", "s"),
        7: ("generation", "i"),
        11: ("labels", "ms"),
        12: ("annotations", "ms"),
        13: ("ownerReferences", "*m:OwnerReference"),
        8: ("creationTimestamp", "t"),
        9: ("deletionTimestamp", "t"),
        10: ("deletionGracePeriodSeconds", "?i"),
        14: ("finalizers", "*s"),
        17: ("managedFields", "*m:ManagedFieldsEntry"),
    },
    "ManagedFieldsEntry": {
        1: ("manager", "s"),
        2: ("operation", "s"),
        3: ("apiVersion", "s"),
        4: ("time", "t"),
        6: ("fieldsType", "s"),
        7: ("fieldsV1", "j"),
        8: ("subresource", "s"),
    },
    "OwnerReference": {
        1: ("kind", "s"),
        3: ("name", "s"),
        4: ("uid", "s"),
        5: ("apiVersion", "s"),
        6: ("controller", "?b"),
        7: ("blockOwnerDeletion", "?b"),
    },
    "Namespace": {1: ("metadata", "m:ObjectMeta"), 2: ("spec", "m:NamespaceSpec")},
    "NamespaceSpec": {1: ("finalizers", "*s")},
    "Eviction": {1: ("metadata", "m:ObjectMeta"), 2: ("deleteOptions", "m:DeleteOptions")},
    "DeleteOptions": {
        1: ("gracePeriodSeconds", "?i"),
        2: ("preconditions", "m:Preconditions"),
        3: ("orphanDependents", "?b"),
        4: ("propagationPolicy", "s"),
        5: ("dryRun", "*s"),
    },
    "Preconditions": {1: ("uid", "s"), 2: ("resourceVersion", "s")},
    "ConfigMap": {
        1: ("metadata", "m:ObjectMeta"),
        2: ("data", "ms"),
        3: ("binaryData", "my"),
        4: ("immutable", "?b"),
    },
    "Secret": {
        1: ("metadata", "m:ObjectMeta"),
        2: ("data", "my"),
        3: ("type", "s"),
        4: ("stringData", "ms"),
        5: ("immutable", "?b"),
    },
    "ServiceAccount": {
        1: ("metadata", "m:ObjectMeta"),
        2: ("secrets", "*m:ObjectReference"),
        3: ("imagePullSecrets", "*m:LocalObjectReference"),
        4: ("automountServiceAccountToken", "?b"),
    },
    "ObjectReference": {
        1: ("kind", "s"),
        2: ("namespace", "s"),
        3: ("name", "s"),
        4: ("uid", "s"),
        5: ("apiVersion", "s"),
        6: ("resourceVersion", "s"),
        7: ("fieldPath", "s"),
    },
    "LocalObjectReference": {1: ("name", "s")},
    "SelfSubjectAccessReview": {
        1: ("metadata", "m:ObjectMeta"),
        2: ("spec", "m:SelfSubjectAccessReviewSpec"),
    },
    "SelfSubjectAccessReviewSpec": {
        1: ("resourceAttributes", "m:ResourceAttributes"),
        2: ("nonResourceAttributes", "m:NonResourceAttributes"),
    },
    "SelfSubjectRulesReview": {1: ("metadata", "m:ObjectMeta"), 2: ("spec", "m:SelfSubjectRulesReviewSpec")},
    "SelfSubjectRulesReviewSpec": {1: ("namespace", "s")},
    "SelfSubjectReview": {1: ("metadata", "m:ObjectMeta")},
    "ResourceAttributes": {
        1: ("namespace", "s"),
        2: ("verb", "s"),
        3: ("group", "s"),
        4: ("version", "s"),
        5: ("resource", "s"),
        6: ("subresource", "s"),
        7: ("name", "s"),
    },
    "NonResourceAttributes": {1: ("path", "s"), 2: ("verb", "s")},
    "TokenRequest": {1: ("metadata", "m:ObjectMeta"), 2: ("spec", "m:TokenRequestSpec")},
    "TokenRequestSpec": {
        1: ("audiences", "*s"),
        3: ("boundObjectRef", "m:BoundObjectReference"),
        4: ("expirationSeconds", "?i"),
    },
    "BoundObjectReference": {1: ("kind", "s"), 2: ("apiVersion", "s"), 3: ("name", "s"), 4: ("uid", "s")},
    "Deployment": {1: ("metadata", "m:ObjectMeta"), 2: ("spec", "m:DeploymentSpec")},
    "DeploymentSpec": {
        1: ("replicas", "?i"),
        2: ("selector", "m:LabelSelector"),
        3: ("template", "m:PodTemplateSpec"),
        4: ("strategy", "m:DeploymentStrategy"),
        5: ("minReadySeconds", "i"),
        6: ("revisionHistoryLimit", "?i"),
        7: ("paused", "b"),
        9: ("progressDeadlineSeconds", "?i"),
    },
    "DeploymentStrategy": {1: ("type", "s")},
    "LabelSelector": {1: ("matchLabels", "ms"), 2: ("matchExpressions", "*m:LabelSelectorRequirement")},
    "LabelSelectorRequirement": {1: ("key", "s"), 2: ("operator", "s"), 3: ("values", "*s")},
    "PodTemplateSpec": {1: ("metadata", "m:ObjectMeta"), 2: ("spec", "m:PodSpec")},
    "PodSpec": {
        2: ("containers", "*m:Container"),
        3: ("restartPolicy", "s"),
        7: ("nodeSelector", "ms"),
        8: ("serviceAccountName", "s"),
        10: ("nodeName", "s"),
    },
    "Container": {
        1: ("name", "s"),
        2: ("image", "s"),
        3: ("command", "*s"),
        4: ("args", "*s"),
        6: ("ports", "*m:ContainerPort"),
        7: ("env", "*m:EnvVar"),
        8: ("resources", "m:ResourceRequirements"),
    },
    "ContainerPort": {
        1: ("name", "s"),
        2: ("hostPort", "i"),
        3: ("containerPort", "i"),
        4: ("protocol", "s"),
    },
    "EnvVar": {1: ("name", "s"), 2: ("value", "s")},
    "ResourceRequirements": {1: ("limits", "mq"), 2: ("requests", "mq")},
    "PodDisruptionBudget": {1: ("metadata", "m:ObjectMeta"), 2: ("spec", "m:PodDisruptionBudgetSpec")},
    "PodDisruptionBudgetSpec": {
        1: ("minAvailable", "io"),
        2: ("selector", "m:LabelSelector"),
        3: ("maxUnavailable", "io"),
        4: ("unhealthyPodEvictionPolicy", "?s"),
    },
    "Role": {1: ("metadata", "m:ObjectMeta"), 2: ("rules", "*m:PolicyRule")},
    "CertificateSigningRequest": {
        1: ("metadata", "m:ObjectMeta"),
        2: ("spec", "m:CertificateSigningRequestSpec"),
        3: ("status", "m:CertificateSigningRequestStatus"),
    },
    "CertificateSigningRequestSpec": {
        1: ("request", "y"),
        2: ("username", "s"),
        3: ("uid", "s"),
        4: ("groups", "*s"),
        5: ("usages", "*s"),
        7: ("signerName", "s"),
        8: ("expirationSeconds", "?i"),
    },
    "CertificateSigningRequestStatus": {
        1: ("conditions", "*m:CertificateSigningRequestCondition"),
        2: ("certificate", "y"),
    },
    "CertificateSigningRequestCondition": {
        1: ("type", "s"),
        2: ("reason", "s"),
        3: ("message", "s"),
        4: ("lastUpdateTime", "t"),
        5: ("lastTransitionTime", "t"),
        6: ("status", "s"),
    },
    "ClusterRole": {
        1: ("metadata", "m:ObjectMeta"),
        2: ("rules", "*m:PolicyRule"),
        3: ("aggregationRule", "m:AggregationRule"),
    },
    "AggregationRule": {1: ("clusterRoleSelectors", "*m:LabelSelector")},
    "PolicyRule": {
        1: ("verbs", "*s"),
        2: ("apiGroups", "*s"),
        3: ("resources", "*s"),
        4: ("resourceNames", "*s"),
        5: ("nonResourceURLs", "*s"),
    },
    "RoleBinding": {
        1: ("metadata", "m:ObjectMeta"),
        2: ("subjects", "*m:Subject"),
        3: ("roleRef", "m:RoleRef"),
    },
    "ClusterRoleBinding": {
        1: ("metadata", "m:ObjectMeta"),
        2: ("subjects", "*m:Subject"),
        3: ("roleRef", "m:RoleRef"),
    },
    "Subject": {1: ("kind", "s"), 2: ("apiGroup", "s"), 3: ("name", "s"), 4: ("namespace", "s")},
    "RoleRef": {1: ("apiGroup", "s"), 2: ("kind", "s"), 3: ("name", "s")},
    "Service": {1: ("metadata", "m:ObjectMeta"), 2: ("spec", "m:ServiceSpec")},
    "ServiceSpec": {
        1: ("ports", "*m:ServicePort"),
        2: ("selector", "ms"),
        3: ("clusterIP", "s"),
        4: ("type", "s"),
        5: ("externalIPs", "*s"),
        7: ("sessionAffinity", "s"),
        11: ("externalName", "s"),
    },
    "ServicePort": {
        1: ("name", "s"),
        2: ("protocol", "s"),
        3: ("port", "i"),
        4: ("targetPort", "io"),
        5: ("nodePort", "i"),
    },
    "PriorityClass": {
        1: ("metadata", "m:ObjectMeta"),
        2: ("value", "?i"),
        3: ("globalDefault", "b"),
        4: ("description", "s"),
        5: ("preemptionPolicy", "?s"),
    },
}
KIND_MESSAGE = {
    "CertificateSigningRequest",
    "PodDisruptionBudget",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "Service",
    "PriorityClass",
    "Namespace",
    "Eviction",
    "ConfigMap",
    "Secret",
    "ServiceAccount",
    "SelfSubjectAccessReview",
    "SelfSubjectRulesReview",
    "SelfSubjectReview",
    "TokenRequest",
    "Deployment",
    "DeleteOptions",
}


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    out = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        val: Any
        if wire == 0:
            val, pos = _varint(buf, pos)
        elif wire == 2:
            length, pos = _varint(buf, pos)
            val = buf[pos : pos + length]
            pos += length
        elif wire == 1:
            val, pos = buf[pos : pos + 8], pos + 8
        elif wire == 5:
            val, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.append((num, wire, val))
    return out


def _is_zero(val: Any) -> bool:
    if isinstance(val, int):
        return val == 0
    if not val:
        return True
    try:
        return all(_is_zero(v) for _, _, v in _fields(bytes(val)))
    except (ValueError, IndexError):
        return False


def _scalar(typ: str, val: Any) -> Any:
    import base64

    if typ == "s":
        return bytes(val).decode()
    if typ == "i":
        return val - (1 << 64) if val >= 1 << 63 else val
    if typ == "b":
        return bool(val)
    if typ == "y":
        return base64.b64encode(bytes(val)).decode()
    raise ValueError(typ)


def decode_message(name: str, buf: bytes, where: str = "") -> dict[str, Any]:
    schema = MESSAGES[name]
    out: dict[str, Any] = {}
    for num, _wire, val in _fields(buf):
        if num not in schema:
            if _is_zero(val):  # gogo-protobuf writes every non-pointer field; zero ones carry nothing
                continue
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"this API stand-in cannot decode protobuf field {where or name}#{num}; send JSON "
                "(for kubectl: apply -f, or create -f with a manifest)",
            )
        field, typ = schema[num]
        repeated = typ.startswith("*")
        pointer = typ.startswith("?")
        typ = typ.lstrip("*?")
        if typ.startswith("m:"):
            value: Any = decode_message(typ[2:], val, f"{where or name}.{field}")
        elif typ == "t":  # metav1.Time: seconds, nanos
            tm = {n: v for n, _, v in _fields(val)}
            value = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(tm.get(1, 0))))
            out[field] = value
            continue
        elif typ == "j":  # FieldsV1: raw JSON in field 1
            raw_json = {n: v for n, _, v in _fields(val)}.get(1, b"{}")
            out[field] = json.loads(bytes(raw_json) or b"{}")
            continue
        elif typ == "io":  # IntOrString: type (0 int, 1 string), intVal, strVal
            ios = {n: v for n, _, v in _fields(val)}
            value = bytes(ios.get(3, b"")).decode() if ios.get(1) == 1 else int(ios.get(2, 0))
            out[field] = value
            continue
        elif typ in ("ms", "my", "mq"):
            entry = {n: v for n, _, v in _fields(val)}
            key = bytes(entry.get(1, b"")).decode()
            raw = entry.get(2, b"")
            if typ == "mq":
                q = {n: v for n, _, v in _fields(raw)}
                out.setdefault(field, {})[key] = bytes(q.get(1, b"")).decode()
            else:
                out.setdefault(field, {})[key] = _scalar("s" if typ == "ms" else "y", raw)
            continue
        else:
            value = _scalar(typ, val)
        if not pointer and not repeated and value in ("", 0, False) and not isinstance(value, dict):
            continue  # zero value of a non-pointer field: JSON's omitempty leaves it out
        if repeated:
            out.setdefault(field, []).append(value)
        else:
            out[field] = value
    return out


def decode(body: bytes) -> dict[str, Any]:
    if not body.startswith(MAGIC):
        raise ApiError.bad_request("protobuf body without the k8s envelope")
    unknown = decode_message("Unknown", body[len(MAGIC) :])
    type_meta = unknown.get("typeMeta", {})
    kind = type_meta.get("kind", "")
    if kind not in KIND_MESSAGE:
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"this API stand-in cannot decode {kind or 'untyped'} objects sent as protobuf; send JSON",
        )
    import base64

    obj = decode_message(kind, base64.b64decode(unknown.get("raw", "")), kind)
    obj["apiVersion"] = type_meta.get("apiVersion", "")
    obj["kind"] = kind
    return obj
