"""Values the roles put into Kubernetes objects, checked as the API server checks them, before any change.

One home for the rules (docs/CONTRACTS.md, "Roles"): the roles that render Kubernetes objects from
inventory values call these filters in their ``tasks/validate.yml``; found through ``filter_plugins`` in
ansible.cfg. The rules follow the API server's own: ``resource.Quantity``'s grammar
(k8s.io/apimachinery/pkg/api/resource/quantity.go), the DNS-1123 label and subdomain and DNS-1035 label of
k8s.io/apimachinery/pkg/util/validation, label keys (qualified names) and values, ports, and the container
resource rules of the core API's validation (a standard resource name or a fully qualified extended one,
quantities not negative, extended resources whole numbers with requests equal to limits, requests not above
limits). Written from those rules, not copied.

Filters:

- ``k8s_value_errors(checks)``: ``checks`` is a list of ``[variable, kind, value]``; returns one message per
  value the API server would refuse, each naming the variable (empty list: all good).
- ``k8s_entry_errors(entries, variable, fields)``: the same for each entry of a list of dicts; ``fields`` maps
  a key of the entry to its kind (or a list of kinds, all of which apply: a model's name is both a Service and
  a StatefulSet name), and each message names ``variable[index] (name).key``. Absent keys are left to the
  role's defaults.
- ``k8s_quantity_value(value)``: the number a quantity stands for (``"16Gi"`` -> 17179869184.0), to compare
  sizes; fails on a value that is not a quantity.

Kinds: quantity, dns_label, dns_subdomain, dns1035_label, statefulset_name, label_key, label_value, labels
(a dict of label keys to values), port, node_port, replicas, uid, cidr, resources (a container's
``{requests: {...}, limits: {...}}``).
"""

from __future__ import annotations

import decimal
import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # imported by the unit tests without Ansible's plugin loader

    class AnsibleFilterError(Exception):  # type: ignore[no-redef]
        """Stands in for Ansible's error outside Ansible."""


# <signedNumber><suffix>: a number with digits on at least one side of an optional point, then a binary SI
# suffix, a decimal SI suffix (empty included) or a decimal exponent e<signedNumber>.
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_INT64_MAX = 2**63 - 1
QUANTITY_HINT = (
    "a Kubernetes quantity is <number><suffix>, the suffix one of Ki Mi Gi Ti Pi Ei (powers of 1024), "
    "n u m k M G T P E (powers of 1000), e<exponent>, or none: e.g. 64Gi, 500m, 8"
)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# The container resources the core API knows without a domain (hugepages-<size> apart).
_STANDARD_CONTAINER_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
# A StatefulSet's pods carry the label controller-revision-hash=<name>-<10-character hash>: a label value of
# at most 63 characters, so the controller cannot create the pods of a longer name (kubernetes#64023).
STATEFULSET_NAME_MAX = 52


def quantity_value(value: Any) -> decimal.Decimal:
    """The number a quantity stands for; ValueError saying why the API server would refuse it."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"not a quantity (a {type(value).__name__}); {QUANTITY_HINT}")
    text = str(value)
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a quantity; {QUANTITY_HINT}")
    number = decimal.Decimal(match["number"])
    suffix = match["suffix"] or ""
    context = decimal.Context(prec=60, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
    if suffix in _BINARY:
        return context.multiply(number, decimal.Decimal(2 ** _BINARY[suffix]))
    if suffix in _DECIMAL:
        return context.scaleb(number, _DECIMAL[suffix])
    exponent = int(suffix[1:])
    if abs(exponent) > _INT64_MAX:  # the API server parses the exponent as a 64-bit integer
        raise ValueError(f"{text!r}: the exponent does not fit in 64 bits; {QUANTITY_HINT}")
    return context.scaleb(number, exponent)


def _quantity(value: Any) -> list[str]:
    try:
        amount = quantity_value(value)
    except ValueError as exc:
        return [str(exc)]
    return [] if amount >= 0 else [f"{value!r} must be greater than or equal to 0"]


def _dns_label(value: Any, pattern: re.Pattern[str] = _DNS_LABEL, what: str = "DNS-1123 label") -> list[str]:
    if not isinstance(value, str) or not value:
        return [f"{value!r} is not a {what} (a non-empty string)"]
    if len(value) > 63:
        return [f"{value!r} is not a {what}: {len(value)} characters, at most 63"]
    if not pattern.match(value):
        rule = (
            "lower-case letters, digits and '-', starting with a letter and ending with a letter or digit"
            if pattern is _DNS1035_LABEL
            else "lower-case letters, digits and '-', starting and ending with a letter or digit"
        )
        return [f"{value!r} is not a {what} ({rule})"]
    return []


def _dns1035_label(value: Any) -> list[str]:
    return _dns_label(value, _DNS1035_LABEL, "DNS-1035 label (a Service name)")


def _dns_subdomain(value: Any) -> list[str]:
    if not isinstance(value, str) or not value:
        return [f"{value!r} is not a DNS-1123 subdomain (a non-empty string)"]
    if len(value) > 253:
        return [f"{value!r} is not a DNS-1123 subdomain: {len(value)} characters, at most 253"]
    if not all(_DNS_LABEL.match(part) for part in value.split(".")):
        return [
            f"{value!r} is not a DNS-1123 subdomain (dot-separated parts of lower-case letters, digits and "
            "'-', each starting and ending with a letter or digit)"
        ]
    return []


def _statefulset_name(value: Any) -> list[str]:
    errors = _dns_label(value)
    if not errors and len(value) > STATEFULSET_NAME_MAX:
        errors = [
            f"{value!r} is too long for a StatefulSet: {len(value)} characters, at most "
            f"{STATEFULSET_NAME_MAX} (its pods' label controller-revision-hash=<name>-<hash> must fit in 63)"
        ]
    return errors


def _label_key(value: Any) -> list[str]:
    if not isinstance(value, str) or not value:
        return [f"{value!r} is not a label key (a non-empty string)"]
    prefix, _, name = value.rpartition("/")
    errors = []
    if "/" in value and (not prefix or _dns_subdomain(prefix)):
        errors.append(f"label key {value!r}: the prefix before '/' must be a DNS-1123 subdomain")
    if len(name) > 63 or not _QUALIFIED_NAME_PART.match(name):
        errors.append(
            f"label key {value!r}: the name must be 1-63 characters of letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        )
    return errors


def _label_value(value: Any) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, str):
        return [f'label value {value!r} must be a string (quote it: "{str(value).lower()}")']
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return [
            f"label value {value!r} must be empty or 1-63 characters of letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        ]
    return []


def _labels(value: Any) -> list[str]:
    if not isinstance(value, Mapping):
        return [f"{value!r} is not a dict of labels"]
    return [
        *(e for key in value for e in _label_key(key)),
        *(e for v in value.values() for e in _label_value(v)),
    ]


def _integer_in(low: int, high: int, what: str) -> Callable[[Any], list[str]]:
    def check(value: Any) -> list[str]:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return [f"{value!r} is not {what}: an integer from {low} to {high}"]
        return []

    return check


def _cidr(value: Any) -> list[str]:
    try:
        ipaddress.ip_network(str(value), strict=False)
    except ValueError:
        return [f"{value!r} is not a CIDR (an address block like 10.0.0.0/24 or fd00::/64)"]
    return [] if "/" in str(value) else [f"{value!r} is not a CIDR: the prefix length (/<bits>) is missing"]


def _native(name: str) -> bool:
    """A resource of the core API's own (no domain, or in kubernetes.io): standard names only."""
    return "/" not in name or "kubernetes.io/" in name


def _resource_name_errors(name: Any) -> list[str]:
    if not isinstance(name, str):
        return [f"resource name {name!r} must be a string"]
    if not _native(name):
        return [f"resource name {name!r}: {e}" for e in _label_key(name)]
    if name in _STANDARD_CONTAINER_RESOURCES or (name.startswith("hugepages-") and not _quantity(name[10:])):
        return []
    return [
        f"resource name {name!r} is neither a standard container resource (cpu, memory, ephemeral-storage, "
        "hugepages-<size>) nor a fully qualified extended resource (<domain>/<name>, e.g. nvidia.com/gpu)"
    ]


def _overcommitable(name: str) -> bool:
    """Requests may be below limits for the native resources other than huge pages."""
    return _native(name) and not name.startswith("hugepages-")


def _resources(value: Any) -> list[str]:
    if not isinstance(value, Mapping) or set(value) - {"requests", "limits"}:
        return [
            f"{value!r} must be a dict with `requests` and/or `limits`, each a dict of resource: quantity"
        ]
    errors: list[str] = []
    amounts: dict[str, dict[str, decimal.Decimal]] = {"requests": {}, "limits": {}}
    for part in ("requests", "limits"):
        items = value.get(part) or {}
        if not isinstance(items, Mapping):
            errors.append(f".{part} must be a dict of resource: quantity, got {items!r}")
            continue
        for name, amount in items.items():
            problems = _resource_name_errors(name) + _quantity(amount)
            if not problems and not _overcommitable(name) and quantity_value(amount) % 1 != 0:
                problems = [f"{amount!r} must be a whole number (an extended resource)"]
            errors += [f".{part}.{name}: {p}" for p in problems]
            if not problems:
                amounts[part][name] = quantity_value(amount)
    requests, limits = amounts["requests"], amounts["limits"]
    for name, request in requests.items():
        if _overcommitable(name):
            if name in limits and request > limits[name]:
                errors.append(f".requests.{name}: must be less than or equal to the {name} limit")
        elif limits.get(name) != request:
            errors.append(
                f".requests.{name}: must equal its limit (an extended resource cannot be overcommitted; "
                f"limit {value.get('limits', {}).get(name)!r})"
            )
    return errors


KINDS: dict[str, Callable[[Any], list[str]]] = {
    "quantity": _quantity,
    "dns_label": _dns_label,
    "dns_subdomain": _dns_subdomain,
    "dns1035_label": _dns1035_label,
    "statefulset_name": _statefulset_name,
    "label_key": _label_key,
    "label_value": _label_value,
    "labels": _labels,
    "port": _integer_in(1, 65535, "a port"),
    # kube-apiserver's default --service-node-port-range, which kubeadm keeps
    "node_port": _integer_in(30000, 32767, "a NodePort of the default range"),
    "replicas": _integer_in(0, 2**31 - 1, "a replica count"),
    # runAsUser/runAsGroup; 0 (root) is refused apart, by the roles that run as non-root
    "uid": _integer_in(0, 2**31 - 1, "a uid/gid"),
    "cidr": _cidr,
    "resources": _resources,
}


def k8s_value_errors(checks: list[Any]) -> list[str]:
    """One message per refused value of CHECKS ([variable, kind, value] each), naming the variable."""
    errors = []
    for check in checks:
        if not isinstance(check, (list, tuple)) or len(check) != 3 or check[1] not in KINDS:
            raise AnsibleFilterError(
                f"k8s_value_errors: {check!r} is not [variable, kind, value] of a known kind"
            )
        variable, kind, value = check
        errors += [f"{variable}{'' if e.startswith('.') else ': '}{e}" for e in KINDS[kind](value)]
    return errors


def k8s_entry_errors(entries: Any, variable: str, fields: Mapping[str, Any]) -> list[str]:
    """The same per entry of ENTRIES (a list of dicts): FIELDS maps a key to its kind or list of kinds;
    messages name VARIABLE[index] (name).key. Keys an entry leaves out are the role's defaults, unchecked."""
    if not isinstance(entries, list):
        return [f"{variable}: must be a list, got {entries!r}"]
    errors = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise AnsibleFilterError(f"{variable}[{index}] must be a dict, got {entry!r}")
        name = f" ({entry['name']})" if isinstance(entry.get("name"), str) else ""
        for key, kinds in fields.items():
            if key not in entry:
                continue
            for kind in [kinds] if isinstance(kinds, str) else kinds:
                found = k8s_value_errors([[f"{variable}[{index}]{name}.{key}", kind, entry[key]]])
                if found:  # the first rule a value breaks is enough to say
                    errors += found
                    break
    return errors


def k8s_quantity_value(value: Any) -> float:
    """The number QUANTITY stands for, as a float for comparisons in templates."""
    try:
        return float(quantity_value(value))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    """k8s_value_errors, k8s_entry_errors, k8s_quantity_value."""

    def filters(self) -> dict[str, Any]:
        return {
            "k8s_value_errors": k8s_value_errors,
            "k8s_entry_errors": k8s_entry_errors,
            "k8s_quantity_value": k8s_quantity_value,
        }
