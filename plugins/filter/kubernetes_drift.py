"""Which rendered Kubernetes objects the cluster does not hold as rendered: compare before apply.

A role that applies a large manifest (Calico's calico.yaml: 38 objects, 23 of them CRDs) pays a GET and a
PATCH per object on every run, about 25 s on the lab, even when nothing changed. Reading what the cluster
holds of them once (library/k8s_live_objects.py: one module call, a list call per kind, the kinds
``k8s_kinds`` names) and applying only the objects that ``k8s_not_as_rendered`` returns makes a converged run
send no write at all, and still finds every drift the apply puts back.

"Held as rendered" is the rule a merge patch of the rendered object would leave unchanged: every field the
rendered object sets has that value in the live object.

- Mappings: each key of the rendered one is in the live one with a value that holds as rendered; keys only
  the live object has are what the API server defaults or other writers own, which the apply leaves alone.
- Lists: the same length, element by element (an entry added, removed or reordered in the cluster differs).
  The apply (``kubernetes.core.k8s``, a strategic merge patch) puts back an entry removed or edited, but
  keeps an entry added to a list the API merges by key (a container's ``env``, a pod's ``volumes``): such an
  object is returned, and applied without a change, on every run, as the role applied every object before
  this comparison. Putting that kind of drift back would need a replace, which also drops what the
  controllers own.
- A rendered ``null``, ``""``, ``[]`` or ``{}`` holds where the live object lacks the field: the API server
  drops empty fields it serialises with ``omitempty``. A rendered ``false`` or ``0`` holds there only for the
  plain (not pointer) fields of the core types that it drops so (``_DROPPED_WHEN_FALSE_OR_ZERO``: hostNetwork,
  a volume mount's readOnly, ...). Any other ``false`` or ``0`` is kept as sent (a pointer:
  ``allowPrivilegeEscalation``, ``automountServiceAccountToken``, ``enableServiceLinks``, ``privileged``,
  ``replicas``), so a live object without it was edited: a security setting removed in the cluster is drift.
- Except in a CustomResourceDefinition's schemas (``spec.versions[*].schema.openAPIV3Schema``), which the
  API server keeps as sent, with its bounds as pointers: there a ``0`` (``minimum: 0``), a ``null``, a
  ``x-kubernetes-preserve-unknown-fields: false`` and anything under ``default``, ``example`` or ``enum``
  must be in the live object; only an empty string, list or map and the plain booleans of JSONSchemaProps
  (``_SCHEMA_PLAIN_BOOLEANS``) are dropped when empty (calico.yaml's 23 CRDs, read back from the real API
  server, hold as rendered: tests/unit/test_kubernetes_drift.py).
- Scalars: equal, with a number and its decimal string form equal (``"1"`` and ``1``: int-or-string).
- ``status`` is not compared (an apply does not write it), nor ``metadata`` other than labels and
  annotations (the server adds uid, resourceVersion, managedFields, ...).

Where the comparison is unsure, it says "differs": the cost is one apply that changes nothing, never a
drift left in place. Found through ``filter_plugins`` in ansible.cfg.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

_COMPARED_METADATA = ("labels", "annotations")
_NOT_COMPARED = ("apiVersion", "kind", "metadata", "status")  # the identity, the metadata above, no status


# JSONSchemaProps' booleans that are not pointers: serialised with omitempty, so a false one is dropped
_SCHEMA_PLAIN_BOOLEANS = frozenset(
    {
        "exclusiveMaximum",
        "exclusiveMinimum",
        "uniqueItems",
        "nullable",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-int-or-string",
    }
)
# JSON values of a schema (any value, kept as sent), compared whole and strictly
_SCHEMA_VALUES = frozenset({"default", "example", "enum"})
# the key a CRD's schema stands under (spec.versions[*].schema.openAPIV3Schema): no other kind has it
_SCHEMA_ROOT = "openAPIV3Schema"


# Plain bool and integer fields of the core API types, serialised with omitempty: a false or 0 sent is not
# stored. (A pointer field keeps a false or 0; see the module's docstring.)
_DROPPED_WHEN_FALSE_OR_ZERO = frozenset(
    {
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "stdin",
        "stdinOnce",
        "tty",
        "readOnly",
        "minReadySeconds",
        "initialDelaySeconds",
        "paused",
        "preserveUnknownFields",  # a CustomResourceDefinition's spec
    }
)


def _dropped_when_empty(key: str, value: Any) -> bool:
    """Whether the API server drops KEY: VALUE from an object it stores (outside a CRD's schema)."""
    if value is False or (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0):
        return key in _DROPPED_WHEN_FALSE_OR_ZERO
    return value is None or value in ("", [], {})


def _dropped_from_schema(key: str, value: Any) -> bool:
    """Whether the API server drops KEY: VALUE from a CRD schema it stores (omitempty of a non-pointer)."""
    if key in _SCHEMA_VALUES:
        return False
    if value is False:
        return key in _SCHEMA_PLAIN_BOOLEANS
    return isinstance(value, (str, list, dict)) and not value


def _scalar_equal(rendered: Any, live: Any) -> bool:
    if rendered == live and type(rendered) is type(live):
        return True
    if isinstance(rendered, bool) or isinstance(live, bool):
        return False
    if isinstance(rendered, (int, float)) and isinstance(live, (int, float)):
        return rendered == live
    if isinstance(rendered, (int, str)) and isinstance(live, (int, str)):
        return str(rendered) == str(live)
    return False


def holds(rendered: Any, live: Any, schema: bool = False) -> bool:
    """Whether LIVE has every field RENDERED sets, with its value (the rule in the module's docstring);
    SCHEMA: RENDERED is (a part of) a CRD's schema, below its _SCHEMA_ROOT, whose empty values are kept."""
    if isinstance(rendered, Mapping):
        if not isinstance(live, Mapping):
            return False
        for key, value in rendered.items():
            if key in live:
                if schema and key in _SCHEMA_VALUES:
                    if value != live[key] or not holds(value, live[key]):
                        return False
                elif not holds(value, live[key], schema or key == _SCHEMA_ROOT):
                    return False
            elif not (_dropped_from_schema(key, value) if schema else _dropped_when_empty(key, value)):
                return False
        return True
    if isinstance(rendered, list):
        return (
            isinstance(live, list)
            and len(rendered) == len(live)
            and all(holds(r, v, schema) for r, v in zip(rendered, live, strict=True))
        )
    return _scalar_equal(rendered, live)


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def _identity(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(API group, kind, namespace, name): the object whichever version of its group it was read as."""
    metadata = obj.get("metadata") or {}
    return (
        _group(str(obj.get("apiVersion", ""))),
        str(obj.get("kind", "")),
        str(metadata.get("namespace") or ""),
        str(metadata.get("name", "")),
    )


def object_holds(rendered: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether the live object holds the rendered one (metadata: labels and annotations only; no status)."""
    body = {key: value for key, value in rendered.items() if key not in _NOT_COMPARED}
    live_body = {key: value for key, value in live.items() if key not in _NOT_COMPARED}
    metadata = rendered.get("metadata") or {}
    live_metadata = live.get("metadata") or {}
    return holds(body, live_body) and all(
        holds(metadata.get(field) or {}, live_metadata.get(field) or {}) for field in _COMPARED_METADATA
    )


def k8s_kinds(objects: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """One entry per apiVersion, kind and namespace of OBJECTS, sorted: the kinds k8s_live_objects reads."""
    kinds = {
        (
            str(obj.get("apiVersion", "")),
            str(obj.get("kind", "")),
            str((obj.get("metadata") or {}).get("namespace") or ""),
        )
        for obj in objects
    }
    return [{"api_version": a, "kind": k, "namespace": n} for a, k, n in sorted(kinds)]


def k8s_not_as_rendered(objects: Iterable[Mapping[str, Any]], live: Iterable[Mapping[str, Any]]) -> list[Any]:
    """The objects of OBJECTS (rendered) that LIVE (what the cluster holds, read with k8s_info) lacks or holds
    otherwise, in OBJECTS' order: the ones to apply."""
    held = {_identity(obj): obj for obj in live}
    return [
        obj for obj in objects if _identity(obj) not in held or not object_holds(obj, held[_identity(obj)])
    ]


def k8s_labelled(objects: Iterable[Mapping[str, Any]], labels: Mapping[str, str]) -> list[Any]:
    """The objects of OBJECTS whose labels hold every key of LABELS with its value, as a label selector's
    matchLabels selects (a key with dots and slashes, which selectattr cannot name)."""
    return [
        obj
        for obj in objects
        if all(
            ((obj.get("metadata") or {}).get("labels") or {}).get(key) == value
            for key, value in labels.items()
        )
    ]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "k8s_kinds": k8s_kinds,
            "k8s_labelled": k8s_labelled,
            "k8s_not_as_rendered": k8s_not_as_rendered,
        }
