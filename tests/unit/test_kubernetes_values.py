"""plugins/filter/kubernetes_values.py: each rule the API server applies to a value the inventory can set,
with values it accepts and values it refuses (resource.Quantity's grammar, DNS-1123/1035 names, label keys and
values, ports, container resources), and messages that name the variable."""

from __future__ import annotations

import importlib.util
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location(
    "kubernetes_values", ROOT / "plugins/filter/kubernetes_values.py"
)
assert _SPEC and _SPEC.loader
kv = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(kv)


def errors(kind: str, value: Any) -> list[str]:
    return kv.k8s_value_errors([["some_variable", kind, value]])


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", Decimal(8)),
        (8, Decimal(8)),
        ("0", Decimal(0)),
        ("500m", Decimal("0.5")),
        ("64Gi", Decimal(64 * 2**30)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("1.5", Decimal("1.5")),
        ("2.", Decimal(2)),
        (".5", Decimal("0.5")),
        ("+1k", Decimal(1000)),
        ("1E", Decimal(10**18)),
        ("1e3", Decimal(1000)),
        ("12E+6", Decimal(12 * 10**6)),
        ("5e-3", Decimal("0.005")),
        ("100n", Decimal("1E-7")),
        ("3u", Decimal("0.000003")),
        ("8Ei", Decimal(8 * 2**60)),
        (0.25, Decimal("0.25")),
    ],
)
def test_quantities_the_api_server_accepts(text: Any, value: Decimal) -> None:
    assert kv.quantity_value(text) == value
    assert errors("quantity", text) == []


@pytest.mark.parametrize(
    "text",
    [
        "64GB",  # "B" is no suffix
        "1.5Gb",
        "2 cores",
        "8 Gi",  # no space
        " 8Gi",
        "8gi",  # binary suffixes are Ki Mi Gi ...
        "8K",  # decimal kilo is lower-case k
        "8KB",
        "1e",  # an exponent needs digits
        "1Ki5",
        "Gi",
        ".",
        "",
        "1..5",
        "0x10",
        "1,5Gi",
        "inf",
        True,
        None,
        ["8Gi"],
    ],
)
def test_quantities_the_api_server_refuses(text: Any) -> None:
    found = errors("quantity", text)
    assert len(found) == 1 and found[0].startswith("some_variable: "), found
    assert "quantity" in found[0]


def test_a_negative_quantity_is_refused_and_named() -> None:
    assert errors("quantity", "-1Gi") == ["some_variable: '-1Gi' must be greater than or equal to 0"]
    assert errors("quantity", "-0") == []


def test_quantity_value_for_comparisons() -> None:
    assert kv.k8s_quantity_value("16Gi") == 17179869184.0
    assert kv.k8s_quantity_value("10G") < kv.k8s_quantity_value("10Gi")
    with pytest.raises(kv.AnsibleFilterError, match="quantity"):
        kv.k8s_quantity_value("16GB")


NAMES_LABELS_PORTS: list[tuple[str, list[Any], list[Any]]] = [
    (
        "dns_label",
        ["serving", "a", "qwen2-7b", "7b", "a" * 63],
        ["Serving", "qwen2_7b", "-a", "a-", "a.b", "", 7],
    ),
    ("dns_label", [], ["a" * 64]),
    ("dns1035_label", ["serving", "qwen2-7b", "a" * 63], ["7b", "Qwen", "a-", "a.b", "a" * 64, ""]),
    ("dns_subdomain", ["nvidia", "a.b-c.d", "x" * 253], ["Nvidia", "a..b", ".a", "a.", "a_b", "x" * 254]),
    ("statefulset_name", ["qwen2-7b", "a" * 52], ["a" * 53, "Qwen", "7b.x"]),
    (
        "label_key",
        ["app", "app.kubernetes.io/name", "nvidia.com/gpu.present", "k8s-app", "a_b.c", "x" * 63],
        ["", "/app", "app/", "App.io/x", "a b", "-app", "x" * 64, "a/b/c", 1],
    ),
    (
        "label_value",
        ["", "true", "kube-dns", "v0.4.2", "A_b.c", "x" * 63],
        ["-x", "x-", "a b", "x" * 64, True],
    ),
    ("port", [1, 8000, 65535], [0, 65536, "8000", True, -1]),
    ("node_port", [30000, 30001, 32767], [29999, 32768, 8080]),
    ("replicas", [0, 1, 2**31 - 1], [-1, 2**31, "2", 1.5]),
    ("uid", [0, 1001, 2**31 - 1], [-1, 2**31, "1001"]),
    ("cidr", ["10.0.0.0/24", "10.20.0.10/32", "fd00::/64"], ["10.0.0.0", "10.0.0.0/33", "300.0.0.0/8"]),
    ("labels", [{}, {"app.kubernetes.io/name": "prometheus"}], [{"k8s-app": True}, {"bad key": "x"}, ["a"]]),
]


@pytest.mark.parametrize(("kind", "good", "bad"), NAMES_LABELS_PORTS)
def test_names_labels_ports(kind: str, good: list[Any], bad: list[Any]) -> None:
    for value in good:
        assert errors(kind, value) == [], (kind, value)
    for value in bad:
        assert errors(kind, value), (kind, value)


GUARANTEED = {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": 2}


@pytest.mark.parametrize(
    "resources",
    [
        {"requests": GUARANTEED, "limits": GUARANTEED},
        {"requests": {"cpu": "500m", "ephemeral-storage": "10Gi"}, "limits": {"cpu": "2"}},
        {"limits": {"nvidia.com/gpu": "1", "hugepages-2Mi": "1Gi", "memory": "2Gi"}},
        {},
    ],
)
def test_container_resources_the_api_server_accepts(resources: dict[str, Any]) -> None:
    assert errors("resources", resources) == []


GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("resources", "says"),
    [
        ({"requests": {"memory": "64GB"}}, "some_variable.requests.memory: '64GB' is not a quantity"),
        ({"limits": {"cpu": "2 cores"}}, "some_variable.limits.cpu: '2 cores' is not a quantity"),
        ({"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}, "requests.cpu: must be less than or equal"),
        (
            {"requests": {GPU: 1}, "limits": {GPU: 2}},
            "some_variable.requests.nvidia.com/gpu: must equal its limit",
        ),
        ({"requests": {GPU: 1}}, "must equal its limit"),
        ({"limits": {GPU: "1.5"}}, "some_variable.limits.nvidia.com/gpu: '1.5' must be a whole number"),
        ({"limits": {"gpu": 1}}, "resource name 'gpu' is neither a standard container resource"),
        ({"limits": {"kubernetes.io/cpu": 1}}, "resource name 'kubernetes.io/cpu' is neither"),
        ({"limits": {"Nvidia.com/gpu": 1}}, "resource name 'Nvidia.com/gpu'"),
        ({"limits": {"memory": "-1Gi"}}, "must be greater than or equal to 0"),
        ({"limit": {"cpu": 1}}, "must be a dict with `requests` and/or `limits`"),
    ],
)
def test_container_resources_the_api_server_refuses(resources: dict[str, Any], says: str) -> None:
    found = errors("resources", resources)
    assert any(says in e for e in found), found


def test_entries_are_named_by_index_name_and_key() -> None:
    models = [
        {"name": "qwen2-7b", "replicas": 2},
        {"name": "7b", "replicas": -1, "resources": {"limits": {"memory": "1.5Gb"}}},
    ]
    fields = {"name": "dns1035_label", "replicas": "replicas", "resources": "resources"}
    assert kv.k8s_entry_errors(models, "vllm_serving_models", fields) == [
        "vllm_serving_models[1] (7b).name: '7b' is not a DNS-1035 label (a Service name) (lower-case "
        "letters, digits and '-', starting with a letter and ending with a letter or digit)",
        "vllm_serving_models[1] (7b).replicas: -1 is not a replica count: an integer from 0 to 2147483647",
        f"vllm_serving_models[1] (7b).resources.limits.memory: '1.5Gb' is not a quantity; {kv.QUANTITY_HINT}",
    ]
    assert kv.k8s_entry_errors("x", "v", fields) == ["v: must be a list, got 'x'"]
    both = {"name": ["dns1035_label", "statefulset_name"]}
    assert kv.k8s_entry_errors([{"name": "a" * 52}], "v", both) == []
    too_long = kv.k8s_entry_errors([{"name": "a" * 53}, {"name": "7b"}], "v", both)
    assert len(too_long) == 2 and "too long for a StatefulSet" in too_long[0] and "DNS-1035" in too_long[1]


def test_an_unknown_kind_is_a_bug_in_the_role_not_the_inventory() -> None:
    with pytest.raises(kv.AnsibleFilterError, match="known kind"):
        kv.k8s_value_errors([["x", "quantityy", "1"]])
