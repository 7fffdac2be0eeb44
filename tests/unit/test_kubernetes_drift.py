"""plugins/filter/kubernetes_drift.py: compare before apply. A converged cluster gets no write (the real API
server's defaults, the metadata it adds, a CRD's status all hold as rendered), and every drift an apply would
put back is found: a field edited, a list entry added, an object deleted."""

from __future__ import annotations

import copy
import importlib.util
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import k8s_live_objects
import pytest
import real_kube
import yaml
from conftest import run_module
from manifests_render import calico_objects

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location(
    "kubernetes_drift", ROOT / "plugins/filter/kubernetes_drift.py"
)
assert _SPEC and _SPEC.loader
drift = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(drift)

DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "serving", "labels": {"app": "web"}},
    "spec": {
        "replicas": 2,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}, "annotations": {}},
            "spec": {
                "containers": [
                    {
                        "name": "web",
                        "image": "example/web:1",
                        "ports": [{"containerPort": 8080}],
                        "env": [{"name": "MODE", "value": "strict"}],
                        "resources": {},
                    }
                ],
                "hostNetwork": False,
            },
        },
    },
}


def as_served(obj: dict[str, Any]) -> dict[str, Any]:
    """OBJ as an API server returns it: metadata and defaults added, empty fields dropped, a status."""
    live = copy.deepcopy(obj)
    live["metadata"] |= {"uid": "1", "resourceVersion": "7", "generation": 1}
    live["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "1"}
    pod = live["spec"]["template"]
    del pod["metadata"]["annotations"]
    del pod["spec"]["hostNetwork"]
    container = pod["spec"]["containers"][0]
    del container["resources"]
    container["ports"][0]["protocol"] = "TCP"
    container["terminationMessagePath"] = "/dev/termination-log"
    live["spec"]["strategy"] = {"type": "RollingUpdate"}
    live["status"] = {"replicas": 2}
    return live


def test_an_object_as_served_holds_as_rendered() -> None:
    assert drift.k8s_not_as_rendered([DEPLOYMENT], [as_served(DEPLOYMENT)]) == []


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda o: o["spec"].update(replicas=3), id="a scalar edited"),
        pytest.param(
            lambda o: o["spec"]["template"]["spec"]["containers"][0]["env"].append(
                {"name": "X", "value": "1"}
            ),
            id="a list entry added",
        ),
        pytest.param(
            lambda o: o["spec"]["template"]["spec"]["containers"][0].pop("env"), id="a field removed"
        ),
        pytest.param(lambda o: o["metadata"]["labels"].update(app="other"), id="a label edited"),
        pytest.param(lambda o: o.update(kind="StatefulSet"), id="another kind of the same name"),
        pytest.param(lambda o: o["metadata"].update(namespace="default"), id="another namespace"),
        pytest.param(
            lambda o: o["spec"]["template"]["spec"].update(hostNetwork=True), id="a false made true"
        ),
    ],
)
def test_a_drifted_object_is_to_apply(edit: Any) -> None:
    live = as_served(DEPLOYMENT)
    edit(live)
    assert drift.k8s_not_as_rendered([DEPLOYMENT], [live]) == [DEPLOYMENT]


def test_a_missing_object_is_to_apply_and_only_what_differs_is_returned_in_order() -> None:
    other = copy.deepcopy(DEPLOYMENT)
    other["metadata"]["name"] = "api"
    third = copy.deepcopy(DEPLOYMENT)
    third["metadata"]["name"] = "batch"
    live = [as_served(DEPLOYMENT), as_served(third)]
    live[1]["spec"]["replicas"] = 5
    assert drift.k8s_not_as_rendered([other, DEPLOYMENT, third], live) == [other, third]


def test_scalars_compare_as_the_api_server_stores_them() -> None:
    assert drift.holds({"port": 8080}, {"port": "8080"})  # int-or-string
    assert drift.holds({"ratio": 1}, {"ratio": 1.0})
    assert not drift.holds({"enabled": True}, {"enabled": "true"})
    assert not drift.holds({"enabled": False}, {"enabled": 0})
    assert not drift.holds({"count": 0}, {"count": False})
    assert drift.holds({"empty": None, "none": [], "text": "", "map": {}}, {})
    # false or 0 in a plain field the API server drops (omitempty); a pointer keeps it: its absence is drift
    assert drift.holds({"hostNetwork": False, "readOnly": False, "minReadySeconds": 0}, {})
    assert not drift.holds({"allowPrivilegeEscalation": False}, {})
    assert not drift.holds({"automountServiceAccountToken": False}, {})
    assert not drift.holds({"replicas": 0}, {})
    assert not drift.holds({"list": []}, {"list": ["a"]})
    assert not drift.holds({"map": {"a": 1}}, {"map": ["a"]})


def test_an_object_read_as_another_version_of_its_group_is_the_same_object() -> None:
    served = as_served(DEPLOYMENT) | {"apiVersion": "apps/v1beta2"}
    assert drift.k8s_not_as_rendered([DEPLOYMENT], [served]) == []
    policy = {"apiVersion": "policy/v1", "kind": "Deployment", "metadata": DEPLOYMENT["metadata"]}
    assert drift.k8s_not_as_rendered([policy], [as_served(DEPLOYMENT)]) == [policy]


def test_kinds_list_each_api_version_kind_and_namespace_once() -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "a"},
    }
    assert drift.k8s_kinds([DEPLOYMENT, crd, DEPLOYMENT, crd | {"metadata": {"name": "b"}}]) == [
        {"api_version": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "namespace": ""},
        {"api_version": "apps/v1", "kind": "Deployment", "namespace": "serving"},
    ]


CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "pools.example.org"},
    "spec": {
        "group": "example.org",
        "names": {"kind": "Pool", "plural": "pools"},
        "scope": "Cluster",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "description": "",
                        "properties": {
                            "size": {"type": "integer", "minimum": 0, "exclusiveMinimum": False},
                            "mode": {"type": "string", "default": "", "enum": ["", "strict"]},
                            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": False},
                        },
                    }
                },
            }
        ],
    },
}


def crd_as_served() -> dict[str, Any]:
    """CRD as the API server keeps it: the empty description and the plain false boolean dropped
    (omitempty), a conversion strategy defaulted, a status; the pointers (minimum 0, the false
    preserve-unknown-fields) and the default and enum kept as sent."""
    live = copy.deepcopy(CRD)
    schema = live["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    del schema["description"]
    del schema["properties"]["size"]["exclusiveMinimum"]
    live["spec"]["conversion"] = {"strategy": "None"}
    live["status"] = {"acceptedNames": {"kind": "Pool"}}
    return live


def test_a_crd_as_served_holds_as_rendered() -> None:
    assert drift.k8s_not_as_rendered([CRD], [crd_as_served()]) == []


@pytest.mark.parametrize(
    ("field", "prop"),
    [("minimum", "size"), ("default", "mode"), ("x-kubernetes-preserve-unknown-fields", "extra")],
)
def test_an_empty_value_removed_from_a_crd_schema_is_drift(field: str, prop: str) -> None:
    """The server keeps these as sent (pointers, JSON values): one missing was removed by someone, and
    an apply puts it back; outside a schema the same empty value would hold (omitempty)."""
    live = crd_as_served()
    del live["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][prop][field]
    assert drift.k8s_not_as_rendered([CRD], [live]) == [CRD]


def test_a_crd_schema_enum_compares_whole_and_in_order() -> None:
    live = crd_as_served()
    live["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["mode"]["enum"] = ["strict", ""]
    assert drift.k8s_not_as_rendered([CRD], [live]) == [CRD]


# ------------------------------------------------------------------ Calico's manifest on the real API server

NAMESPACE = "drift-test"


@pytest.fixture
def calico_in_cluster(kube_control_plane: real_kube.ControlPlane) -> Iterator[list[dict[str, Any]]]:
    """Calico's 38 objects as the calico role renders them, created on the real API server (the namespaced
    ones in a namespace of this test's), removed after."""
    objects = calico_objects()
    for obj in objects:
        if obj["metadata"].get("namespace"):
            obj["metadata"]["namespace"] = NAMESPACE
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    kube_control_plane.kubectl("create", "namespace", NAMESPACE)
    created = kube_control_plane.kubectl("create", "-f", "-", stdin=listed)
    try:
        assert created.returncode == 0, created.stderr
        yield objects
    finally:
        kube_control_plane.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=listed)
        kube_control_plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def first_path_to(obj: Any, key: str, value: Any, path: str = "") -> str | None:
    """The JSON pointer of the first KEY: VALUE in OBJ (depth first), or None."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            here = f"{path}/{k.replace('~', '~0').replace('/', '~1')}"
            if k == key and v == value and type(v) is type(value):
                return here
            found = first_path_to(v, key, value, here)
            if found:
                return found
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found = first_path_to(v, key, value, f"{path}/{i}")
            if found:
                return found
    return None


def live(plane: real_kube.ControlPlane, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every object of each kind of OBJECTS (k8s_kinds), as kubectl lists them."""
    found: list[dict[str, Any]] = []
    for kind in drift.k8s_kinds(objects):
        group = kind["api_version"].rpartition("/")[0]
        resource = f"{kind['kind']}.{group}" if group else kind["kind"]
        scope = ["-n", kind["namespace"]] if kind["namespace"] else []
        got = plane.kubectl("get", resource, *scope, "-o", "json")
        assert got.returncode == 0, got.stderr
        found += json.loads(got.stdout)["items"]
    return found


def test_calico_as_the_real_api_server_holds_it_needs_no_apply_and_each_drift_is_found(
    kube_control_plane: real_kube.ControlPlane, calico_in_cluster: list[dict[str, Any]]
) -> None:
    objects = calico_in_cluster
    assert len(objects) == 38
    assert drift.k8s_not_as_rendered(objects, live(kube_control_plane, objects)) == []

    patch = {"spec": {"template": {"spec": {"containers": [{"name": "calico-node", "env": [
        {"name": "CALICO_IPV4POOL_CIDR", "value": "192.168.0.0/16"}]}]}}}}  # fmt: skip
    edited = kube_control_plane.kubectl(
        "-n", NAMESPACE, "patch", "daemonset", "calico-node", "--type=strategic", "-p", json.dumps(patch)
    )
    assert edited.returncode == 0, edited.stderr
    role = next(o for o in objects if o["kind"] == "ClusterRole")
    deleted = kube_control_plane.kubectl("delete", "clusterrole", role["metadata"]["name"])
    assert deleted.returncode == 0, deleted.stderr

    # a CRD's schema bound of 0 removed: the server had kept it as sent (a pointer), so it is drift
    crd, pointer = next((o, p) for o in objects if o["kind"] == "CustomResourceDefinition"
                        for p in [first_path_to(o, "minimum", 0)] if p)  # fmt: skip
    removed = kube_control_plane.kubectl(
        "patch", "crd", crd["metadata"]["name"], "--type=json", "-p",
        json.dumps([{"op": "remove", "path": pointer}]),
    )  # fmt: skip
    assert removed.returncode == 0, removed.stderr

    to_apply = drift.k8s_not_as_rendered(objects, live(kube_control_plane, objects))
    assert [(o["kind"], o["metadata"]["name"]) for o in to_apply] == sorted(
        [
            ("DaemonSet", "calico-node"),
            ("ClusterRole", role["metadata"]["name"]),
            ("CustomResourceDefinition", crd["metadata"]["name"]),
        ],
        key=lambda kind_name: [(o["kind"], o["metadata"]["name"]) for o in objects].index(kind_name),
    )


# ------------------------------------------------------------------ library/k8s_live_objects: the role's read


def read_with_module(plane: real_kube.ControlPlane, objects: list[dict[str, Any]]) -> dict[str, Any]:
    failed, result = run_module(
        k8s_live_objects, {"objects": objects, "kubeconfig": str(plane.admin_kubeconfig)}
    )
    assert not failed, result
    return result


def test_the_module_reads_in_one_call_what_the_cluster_holds_of_the_rendered_objects(
    kube_control_plane: real_kube.ControlPlane,
) -> None:
    """Objects of four kinds, namespaced and not, one of them never created: one module call reads each kind
    once (a list for the two ConfigMaps, a GET for a lone object), returns what kubectl reads of them, and the
    comparison finds exactly what was edited, deleted or never created."""
    suffix = uuid.uuid4().hex[:8]
    namespace = f"live-{suffix}"
    created = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        *[
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
             "data": {"mode": name}}
            for name in ("first", "second")
        ],
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "reader", "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": f"r-{suffix}"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
    ]  # fmt: skip
    never = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "never", "namespace": namespace}}
    objects = [*created, never]
    done = kube_control_plane.kubectl(
        "create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": created})
    )
    assert done.returncode == 0, done.stderr
    try:
        result = read_with_module(kube_control_plane, objects)
        assert result["changed"] is False
        assert result["reads"] == 4  # Namespace, ConfigMap (one list), ServiceAccount, ClusterRole
        # what kubectl reads of the same objects, without managedFields; the one never created is not there
        for obj in result["resources"]:
            assert "managedFields" not in obj["metadata"]
            scope = ["-n", namespace] if obj["metadata"].get("namespace") else []
            got = kube_control_plane.kubectl(
                "get", obj["kind"], obj["metadata"]["name"], *scope, "-o", "json"
            )
            assert got.returncode == 0, got.stderr
            read = json.loads(got.stdout)
            read["metadata"].pop("managedFields", None)  # kubectl leaves it out too
            assert obj == read
        assert sorted(map(drift._identity, result["resources"])) == sorted(map(drift._identity, created))
        assert drift.k8s_not_as_rendered(objects, result["resources"]) == [never]

        patch = json.dumps({"data": {"mode": "edited"}})
        edited = kube_control_plane.kubectl("-n", namespace, "patch", "configmap", "first", "-p", patch)
        assert edited.returncode == 0, edited.stderr
        deleted = kube_control_plane.kubectl("-n", namespace, "delete", "serviceaccount", "reader")
        assert deleted.returncode == 0, deleted.stderr
        to_apply = drift.k8s_not_as_rendered(
            objects, read_with_module(kube_control_plane, objects)["resources"]
        )
        assert [(o["kind"], o["metadata"]["name"]) for o in to_apply] == [
            ("ConfigMap", "first"),
            ("ServiceAccount", "reader"),
            ("ConfigMap", "never"),
        ]
    finally:
        kube_control_plane.kubectl("delete", "--ignore-not-found", "clusterrole", f"r-{suffix}")
        kube_control_plane.kubectl("delete", "namespace", namespace, "--wait=false")


def test_the_module_gets_a_lone_object_by_name_and_skips_unserved_kinds(
    kube_control_plane: real_kube.ControlPlane,
) -> None:
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "absent", "namespace": "kube-system"}},
        {
            "apiVersion": "example.invalid/v1",
            "kind": "Widget",
            "metadata": {"name": "w", "namespace": "default"},
        },
    ]
    result = read_with_module(kube_control_plane, objects)
    assert result["reads"] == 2  # the Namespace and the ConfigMap; Widget is not served
    kubeconfig = yaml.safe_load(kube_control_plane.admin_kubeconfig.read_text())
    assert result["server"] == kubeconfig["clusters"][0]["cluster"]["server"]
    assert [(o["apiVersion"], o["kind"], o["metadata"]["name"]) for o in result["resources"]] == [
        ("v1", "Namespace", "kube-system")
    ]
    assert [o["metadata"]["name"] for o in drift.k8s_not_as_rendered(objects, result["resources"])] == [
        "absent",
        "w",
    ]


def test_the_module_reads_a_kind_of_all_of_whole_with_one_list_call(
    kube_control_plane: real_kube.ControlPlane,
) -> None:
    """all_of: every Namespace and every ConfigMap of kube-system, whatever their names, beside a rendered
    ConfigMap of kube-system (read once, whole) and a lone rendered object of another kind."""
    objects = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "absent", "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "view"}},
    ]
    all_of = [
        {"apiVersion": "v1", "kind": "Namespace"},
        {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "kube-system"},
    ]
    failed, result = run_module(
        k8s_live_objects,
        {"objects": objects, "all_of": all_of, "kubeconfig": str(kube_control_plane.admin_kubeconfig)},
    )
    assert not failed, result
    assert result["reads"] == 3  # ConfigMaps of kube-system (one list), the ClusterRole, the Namespaces
    read = [(o["kind"], o["metadata"]["name"]) for o in result["resources"]]
    for kind, namespace in (("configmap", ["-n", "kube-system"]), ("namespace", [])):
        listed = kube_control_plane.kubectl("get", kind, *namespace, "-o", "json")
        assert listed.returncode == 0, listed.stderr
        names = sorted(item["metadata"]["name"] for item in json.loads(listed.stdout)["items"])
        assert names and sorted(name for k, name in read if k.lower() == kind) == names
    assert ("ClusterRole", "view") in read  # the API server's own


def test_the_module_refuses_a_whole_kind_it_cannot_place(kube_control_plane: real_kube.ControlPlane) -> None:
    for entry, says in (
        ({"apiVersion": "v1", "kind": "ConfigMap"}, "all_of: ConfigMap (v1) is namespaced"),
        ({"kind": "Node"}, "all_of[0] must set apiVersion and kind"),
    ):
        failed, result = run_module(
            k8s_live_objects,
            {"objects": [], "all_of": [entry], "kubeconfig": str(kube_control_plane.admin_kubeconfig)},
        )
        assert failed and says in result["msg"], result


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        (
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
            "ConfigMap x (v1) is namespaced",
        ),
        (
            {"apiVersion": "v1", "metadata": {"name": "x"}},
            "objects[0] must set apiVersion, kind and metadata.name",
        ),
    ],
)
def test_the_module_refuses_an_object_it_cannot_place(
    kube_control_plane: real_kube.ControlPlane, obj: dict[str, Any], says: str
) -> None:
    failed, result = run_module(
        k8s_live_objects, {"objects": [obj], "kubeconfig": str(kube_control_plane.admin_kubeconfig)}
    )
    assert failed and says in result["msg"], result


def test_the_module_names_an_unreadable_kubeconfig(tmp_path: Path) -> None:
    failed, result = run_module(
        k8s_live_objects, {"objects": [], "kubeconfig": str(tmp_path / "absent.conf")}
    )
    assert failed and str(tmp_path / "absent.conf") in result["msg"], result


def test_a_security_setting_removed_in_the_cluster_is_drift(
    kube_control_plane: real_kube.ControlPlane,
) -> None:
    """The API server keeps a pointer's false as sent (allowPrivilegeEscalation, automountServiceAccountToken)
    and drops a plain field's (hostNetwork): the Deployment as served holds as rendered, and the same object
    with allowPrivilegeEscalation removed by a JSON patch does not."""
    namespace = f"sec-{uuid.uuid4().hex[:8]}"
    deployment = copy.deepcopy(DEPLOYMENT)
    deployment["metadata"]["namespace"] = namespace
    pod = deployment["spec"]["template"]["spec"]
    pod["automountServiceAccountToken"] = False
    pod["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": False, "privileged": False}
    assert kube_control_plane.kubectl("create", "namespace", namespace).returncode == 0
    try:
        created = kube_control_plane.kubectl("create", "-f", "-", stdin=json.dumps(deployment))
        assert created.returncode == 0, created.stderr
        assert (
            drift.k8s_not_as_rendered(
                [deployment], read_with_module(kube_control_plane, [deployment])["resources"]
            )
            == []
        )
        path = "/spec/template/spec/containers/0/securityContext/allowPrivilegeEscalation"
        removed = kube_control_plane.kubectl(
            "-n", namespace, "patch", "deployment", "web", "--type=json",
            "-p", json.dumps([{"op": "remove", "path": path}]),
        )  # fmt: skip
        assert removed.returncode == 0, removed.stderr
        live_now = read_with_module(kube_control_plane, [deployment])["resources"]
        assert drift.k8s_not_as_rendered([deployment], live_now) == [deployment]
    finally:
        kube_control_plane.kubectl("delete", "namespace", namespace, "--wait=false")


def test_labelled_selects_as_match_labels_does() -> None:
    mine = {
        "metadata": {
            "name": "a",
            "labels": {"app.kubernetes.io/managed-by": "serving_network_policy", "x": "1"},
        }
    }
    other = {"metadata": {"name": "b", "labels": {"app.kubernetes.io/managed-by": "someone-else"}}}
    bare = {"metadata": {"name": "c"}}
    empty = {"metadata": {"name": "d", "labels": None}}
    objects = [mine, other, bare, empty]
    assert drift.k8s_labelled(objects, {"app.kubernetes.io/managed-by": "serving_network_policy"}) == [mine]
    assert (
        drift.k8s_labelled(objects, {"app.kubernetes.io/managed-by": "serving_network_policy", "x": "2"})
        == []
    )
    assert drift.k8s_labelled(objects, {}) == objects
