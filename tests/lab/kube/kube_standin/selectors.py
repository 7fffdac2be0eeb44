"""Label and field selectors as the API server parses them (labels.Parse / fields.ParseSelector)."""

from __future__ import annotations

import re
from typing import Any

from .errors import ApiError

Requirement = tuple[str, str, list[str]]  # key, operator, values

_SET_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_label_selector(expr: str) -> list[Requirement]:
    reqs: list[Requirement] = []
    for part in _split_top(expr or ""):
        part = part.strip()
        if not part:
            continue
        m = _SET_RE.match(part)
        if m:
            values = [v.strip() for v in m.group(3).split(",") if v.strip()]
            reqs.append((m.group(1), m.group(2), values))
            continue
        for op in ("!=", "==", "="):
            if op in part:
                key, value = part.split(op, 1)
                reqs.append((key.strip(), "!=" if op == "!=" else "=", [value.strip()]))
                break
        else:
            if part.startswith("!"):
                reqs.append((part[1:].strip(), "!", []))
            elif re.fullmatch(r"[A-Za-z0-9_./-]+", part):
                reqs.append((part, "exists", []))
            else:
                raise ApiError.bad_request(f"unable to parse requirement: {part!r}")
    return reqs


def labels_match(reqs: list[Requirement], labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    for key, op, values in reqs:
        present = key in labels
        val = labels.get(key)
        if op == "=" and val != values[0]:
            return False
        if op == "!=" and val == values[0]:
            return False
        if op == "in" and val not in values:
            return False
        if op == "notin" and present and val in values:
            return False
        if op == "exists" and not present:
            return False
        if op == "!" and present:
            return False
    return True


def selector_from_label_selector(sel: dict[str, Any] | None) -> list[Requirement] | None:
    """metav1.LabelSelector -> requirements; None means 'matches nothing' (nil selector)."""
    if sel is None:
        return None
    reqs: list[Requirement] = [(k, "=", [str(v)]) for k, v in (sel.get("matchLabels") or {}).items()]
    for expr in sel.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}.get(
            expr.get("operator", "")
        )
        if op is None:
            raise ApiError.invalid_simple(f"invalid label selector operator {expr.get('operator')!r}")
        reqs.append((expr.get("key", ""), op, [str(v) for v in expr.get("values") or []]))
    return reqs


def _get_path(obj: dict[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


# field selectors each kind supports (beyond metadata.name / metadata.namespace), as the real server has them
FIELD_LABELS: dict[str, set[str]] = {
    "Pod": {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
    "Node": {"spec.unschedulable"},
    "Event": {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
        "regarding.kind",
        "regarding.name",
        "regarding.namespace",
        "regarding.uid",
    },
    "Secret": {"type"},
    "Namespace": {"status.phase"},
    "ReplicaSet": {"status.replicas"},
    "Job": {"status.successful"},
    "CertificateSigningRequest": {"spec.signerName"},
}


def parse_field_selector(expr: str, kind: str) -> list[Requirement]:
    reqs: list[Requirement] = []
    for part in (expr or "").split(","):
        part = part.strip()
        if not part:
            continue
        for op in ("!=", "==", "="):
            if op in part:
                key, value = part.split(op, 1)
                key = key.strip()
                if key not in ("metadata.name", "metadata.namespace") and key not in FIELD_LABELS.get(
                    kind, set()
                ):
                    raise ApiError.bad_request(
                        f"field label not supported: {key}"
                        if kind not in ("Event",)
                        else f'"{key}" is not a known field selector: only "metadata.name", '
                        '"metadata.namespace"'
                    )
                reqs.append((key, "!=" if op == "!=" else "=", [value.strip()]))
                break
        else:
            raise ApiError.bad_request(f"invalid selector: '{expr}'; can't understand '{part}'")
    return reqs


def _field_value(obj: dict[str, Any], key: str) -> str:
    if key == "source" and obj.get("kind") == "Event":
        return str((obj.get("source") or {}).get("component", ""))
    val = _get_path(obj, key)
    if val is None:
        return "false" if key in ("spec.unschedulable", "spec.hostNetwork") else ""
    if isinstance(val, bool):
        return "true" if val else "false"
    return str(val)


def fields_match(reqs: list[Requirement], obj: dict[str, Any]) -> bool:
    for key, op, values in reqs:
        val = _field_value(obj, key)
        if op == "=" and val != values[0]:
            return False
        if op == "!=" and val == values[0]:
            return False
    return True
