"""Patch types the API accepts: JSON patch (RFC 6902), JSON merge patch (RFC 7386), strategic merge patch
(list merge by patchMergeKey, $patch / $retainKeys / $setElementOrder / $deleteFromPrimitiveList directives)
and a lite server-side apply (field sets per manager; fields a manager stops applying are removed)."""

from __future__ import annotations

import copy
import json
from typing import Any

from .errors import ApiError

# field name -> patchMergeKey, from the Kubernetes API types' `patchMergeKey` tags (context-free)
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "conditions": "type",
    "ownerReferences": "uid",
    "readinessGates": "conditionType",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "addresses": "type",
    "secrets": "name",
    "schedulingGates": "name",
    "podIPs": "ip",
    "hostIPs": "ip",
}
# lists of primitives with patchStrategy=merge
PRIMITIVE_MERGE = {"finalizers"}


def _ports_key(items: list[Any]) -> str | None:
    if any(isinstance(i, dict) and "containerPort" in i for i in items):
        return "containerPort"
    if any(isinstance(i, dict) and "port" in i for i in items):
        return "port"
    return None


def merge_key(field: str, *lists: list[Any]) -> str | None:
    if field == "ports":
        items: list[Any] = []
        for lst in lists:
            items += lst or []
        return _ports_key(items)
    return MERGE_KEYS.get(field)


# ---------------------------------------------------------------- JSON merge patch


def json_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, val in patch.items():
        if val is None:
            out.pop(key, None)
        else:
            out[key] = json_merge_patch(out.get(key), val)
    return out


# ---------------------------------------------------------------- JSON patch


def _unescape(tok: str) -> str:
    return tok.replace("~1", "/").replace("~0", "~")


def _walk(doc: Any, path: str) -> tuple[Any, str]:
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON patch path {path!r}")
    toks = [_unescape(t) for t in path.split("/")[1:]]
    cur = doc
    for tok in toks[:-1]:
        if isinstance(cur, list):
            cur = cur[int(tok)]
        elif isinstance(cur, dict) and tok in cur:
            cur = cur[tok]
        else:
            raise ApiError(
                422,
                "Invalid",
                f"the server rejected our request due to an error in our request: "
                f"doc is missing path: {path!r}",
            )
    return cur, toks[-1]


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    doc = copy.deepcopy(doc)
    if not isinstance(ops, list):
        raise ApiError.bad_request("json patch must be a list of operations")
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        try:
            if kind in ("copy", "move"):
                src_parent, src_key = _walk(doc, op["from"])
                value = copy.deepcopy(
                    src_parent[int(src_key)] if isinstance(src_parent, list) else src_parent[src_key]
                )
                if kind == "move":
                    if isinstance(src_parent, list):
                        src_parent.pop(int(src_key))
                    else:
                        del src_parent[src_key]
                kind, op = "add", {"value": value}
            if path == "" and kind in ("add", "replace"):
                doc = copy.deepcopy(op["value"])
                continue
            parent, key = _walk(doc, path)
            if kind == "test":
                cur = parent[int(key)] if isinstance(parent, list) else parent.get(key)
                if cur != op.get("value"):
                    raise ApiError(422, "Invalid", f"testing value {path} failed")
            elif kind == "add":
                if isinstance(parent, list):
                    if key == "-":
                        parent.append(copy.deepcopy(op["value"]))
                    else:
                        parent.insert(int(key), copy.deepcopy(op["value"]))
                else:
                    parent[key] = copy.deepcopy(op["value"])
            elif kind == "replace":
                if isinstance(parent, list):
                    parent[int(key)] = copy.deepcopy(op["value"])
                else:
                    if key not in parent:
                        raise ApiError(
                            422, "Invalid", f"replace operation does not apply: doc is missing key: {path}"
                        )
                    parent[key] = copy.deepcopy(op["value"])
            elif kind == "remove":
                if isinstance(parent, list):
                    parent.pop(int(key))
                else:
                    if key not in parent:
                        raise ApiError(
                            422, "Invalid", f"remove operation does not apply: doc is missing path: {path}"
                        )
                    del parent[key]
            else:
                raise ApiError.bad_request(f"unknown JSON patch operation {kind!r}")
        except (IndexError, ValueError, KeyError, TypeError) as exc:
            raise ApiError(
                422,
                "Invalid",
                f"the server rejected our request due to an error in our request: {kind} {path}: {exc}",
            ) from exc
    return doc


# ---------------------------------------------------------------- strategic merge patch


def strategic_merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, val in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(out.get(field), list):
                out[field] = [x for x in out[field] if x not in (val or [])]
            continue
        if val is None:
            out.pop(key, None)
        elif isinstance(val, dict):
            merged = strategic_merge(out.get(key), val)
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
        elif isinstance(val, list):
            out[key] = _merge_list(key, out.get(key), val)
        else:
            out[key] = copy.deepcopy(val)
    if isinstance(retain, list):
        for key in list(out):
            if key not in retain:
                del out[key]
    order = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    for field, wanted in order.items():
        mk = merge_key(field, out.get(field) or [])
        if isinstance(out.get(field), list) and isinstance(wanted, list):
            out[field] = _reorder(out[field], wanted, mk)
    return out


def _reorder(items: list[Any], wanted: list[Any], mk: str | None) -> list[Any]:
    def ident(x: Any) -> Any:
        return json.dumps(x.get(mk) if mk and isinstance(x, dict) else x, sort_keys=True)

    pos = {ident(w): i for i, w in enumerate(wanted)}
    return sorted(items, key=lambda x: pos.get(ident(x), len(pos)))


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    current = current if isinstance(current, list) else []
    if field in PRIMITIVE_MERGE:
        out = list(current)
        for item in patch:
            if item not in out:
                out.append(item)
        return out
    mk = merge_key(field, current, patch)
    if mk is None or not all(isinstance(i, dict) for i in patch):
        # atomic list: replace, but honour a lone {"$patch": "replace"} marker
        return [
            copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and "$patch" in i and len(i) == 1)
        ]
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [copy.deepcopy(i) for i in patch if i.get("$patch") != "replace"]
    out = [copy.deepcopy(i) for i in current]
    for item in patch:
        key = item.get(mk)
        idx = next((n for n, c in enumerate(out) if isinstance(c, dict) and c.get(mk) == key), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append(strategic_merge({}, item))
        else:
            out[idx] = strategic_merge(out[idx], item)
    return out


# ---------------------------------------------------------------- server-side apply (lite)

Path = tuple[str, ...]


def field_paths(obj: Any, prefix: Path = ()) -> set[Path]:
    """Leaf and intermediate paths of an applied configuration; list items of merge-keyed lists by key."""
    out: set[Path] = set()
    if isinstance(obj, dict):
        for key, val in obj.items():
            here = (*prefix, f"f:{key}")
            out.add(here)
            if isinstance(val, dict):
                out |= field_paths(val, here)
            elif isinstance(val, list):
                mk = merge_key(key, val)
                if mk and all(isinstance(i, dict) for i in val):
                    for item in val:
                        item_path = (*here, f"k:{json.dumps({mk: item.get(mk)}, separators=(',', ':'))}")
                        out.add(item_path)
                        out |= field_paths(item, item_path)
    return out


def fields_v1(paths: set[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        cur = tree
        for part in path:
            cur = cur.setdefault(part, {})
        cur.setdefault(".", {}) if path and path[-1].startswith("k:") else None
    return tree


def paths_from_fields_v1(tree: dict[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, val in tree.items():
        if key == ".":
            continue
        here = (*prefix, key)
        out.add(here)
        if isinstance(val, dict):
            out |= paths_from_fields_v1(val, here)
    return out


def remove_path(obj: dict[str, Any], path: Path) -> None:
    cur: Any = obj
    for part in path[:-1]:
        cur = _step(cur, part)
        if cur is None:
            return
    last = path[-1]
    if isinstance(cur, dict) and last.startswith("f:"):
        cur.pop(last[2:], None)
    elif isinstance(cur, list) and last.startswith("k:"):
        ((key, value),) = json.loads(last[2:]).items()
        cur[:] = [i for i in cur if not (isinstance(i, dict) and i.get(key) == value)]


def _step(cur: Any, part: str) -> Any:
    if isinstance(cur, dict) and part.startswith("f:"):
        return cur.get(part[2:])
    if isinstance(cur, list) and part.startswith("k:"):
        ((key, value),) = json.loads(part[2:]).items()
        return next((i for i in cur if isinstance(i, dict) and i.get(key) == value), None)
    return None


def server_side_apply(
    live: dict[str, Any] | None, config: dict[str, Any], previous: set[Path], others: set[Path]
) -> dict[str, Any]:
    """Merge config onto live; drop fields this manager applied before and no longer applies."""
    merged = strategic_merge(live or {}, config)
    now = field_paths(config)
    # deepest first so a removed parent does not hide a child removal
    for path in sorted(previous - now - others, key=len, reverse=True):
        if path[:2] in {("f:metadata", "f:name"), ("f:metadata", "f:namespace")} or path in {
            ("f:apiVersion",),
            ("f:kind",),
        }:
            continue
        if any(path[:n] in now for n in range(1, len(path))) or len(path) == 1:
            remove_path(merged, path)
    return merged
