"""The lab's Kubernetes is the real one (issue 17, "Must show"): each test asserts what a real component of
the running lab answers, read from it, not what a stand-in was made to say.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_real_kubernetes_on_lab.py -v

Needs the lab converged through the serving stage (make lab), and Go (`go version -m`).

1. Every binary tests/lab/gobuild/build.py builds names its upstream module at the version its go.mod
   requires (`go version -m`), and the nodes' kubelet, kubeadm, kubectl, crictl, containerd, its runc shim,
   ctr, runc and CNI plugins are those binaries, byte for byte.
2. `kubectl version` against the lab: the server is the pin of roles/kubernetes.
3. Every object the product renders (the unit tests' renderers: tests/unit/manifests_render.py,
   monitoring_render.py, role_render.py) with the lab inventory's values is accepted by the lab's API server
   with `kubectl apply --validate=strict --dry-run=server`.
4. Broken objects are refused with the real messages: an unknown field (strict decoding), a bad quantity,
   a RuntimeClass or ServiceAccount that does not exist (admission).
5. The audit log on the control plane names the operator who cordoned a node (the product's audit policy).
6. Serving by traffic: the gateway and vLLM (simulator) pods Ready through their probes; chat completions
   through NodePort 30001 of every node reach the simulator; the serving namespace's NetworkPolicies hold by
   traffic (a pod without the gateway's labels is refused, the gateway is let through, DNS answers);
   Prometheus scrapes every target it discovers.
7. The faults of lab-kube-fault (tests/lab/kube/lab_kube_fault.py) are real: the kubelet stopped makes the
   Node's Ready Unknown after the node controller's grace period; the device plugin unregistered leaves
   allocatable nvidia.com/gpu 0 while its pod runs, until the pod is replaced; a crash-looping pod goes
   CrashLoopBackOff with its restarts counted; a broken static pod manifest leaves kube-scheduler's mirror pod
   in an image pull error. Each is undone in a `finally`, which waits until the node, plugin or pod is back.

Every wait is bounded by the setting it waits on, read from the running component (the kubelet's /configz,
kube-controller-manager's command line or its own --help default), plus a named margin.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import shlex
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from labrun import (
    ADMIN_KUBECTL,
    LAB_INVENTORY,
    LIVE_PODS,
    NODES,
    OPERATOR,
    ROOT,
    as_operator,
    kube_json,
    on_node,
    podman,
    running_nodes,
    wait_for,
)

pytestmark = pytest.mark.lab

CONTROL_PLANE = NODES[0]


def _gobuild() -> Any:
    """tests/lab/gobuild/build.py, loaded as images.py loads it (one module for both)."""
    import images

    return images.gobuild


gobuild = _gobuild()
ROLE_DEFAULTS = {
    role: yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    for role in ("kubernetes", "kubeadm_control_plane")
}

# Margins over the real settings, each for what the setting does not cover on these machines (two shared
# cores, nested containers): a loop's own period, the kubelet's next status, an image pulled from the lab's
# registry, a process started.
POLL_S = 1
LOOP_MARGIN_S = 15  # the controller's or kubelet's loop that acts on the setting, and this machine's load
KUBELET_START_S = 60  # a kubelet started again: its start-up, its first relist, its first Ready status
POD_START_S = 120  # a pod scheduled, its image pulled from the lab's registry, started, its probes passing


# ------------------------------------------------------------------------------------------------ helpers
def kubectl(args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return on_node(CONTROL_PLANE, f"{ADMIN_KUBECTL} {args}", timeout=timeout)


def sh(node: str, command: str, timeout: int = 120) -> str:
    done = on_node(node, command, timeout=timeout)
    assert done.returncode == 0, f"{node}: {command}: {done.stdout}{done.stderr}"
    return done.stdout


def go_duration(text: str) -> float:
    """Seconds of a Go duration as components print them (20s, 1m0s, 5m0s, 1h0m0s, 500ms)."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"([\d.]+)(ms|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a Go duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


@cache
def kubelet_config(node: str) -> dict[str, Any]:
    """The kubelet's configuration in effect, as the kubelet itself reports it (/configz, through the API)."""
    done = kubectl(f"get --raw /api/v1/nodes/{node}/proxy/configz")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout)["kubeletconfig"])


def kubelet_setting_s(node: str, name: str) -> float:
    return go_duration(str(kubelet_config(node)[name]))


@cache
def controller_manager_setting_s(flag: str) -> float:
    """A duration flag of kube-controller-manager: its value on the running command line (the static pod's
    manifest kubeadm wrote), else the default the binary itself states in its --help."""
    manifest = yaml.safe_load(sh(CONTROL_PLANE, "cat /etc/kubernetes/manifests/kube-controller-manager.yaml"))
    for argument in manifest["spec"]["containers"][0]["command"]:
        if argument.startswith(f"--{flag}="):
            return go_duration(argument.split("=", 1)[1])
    binary = gobuild.output_dir(gobuild.BY_NAME["kubernetes"]) / "kube-controller-manager"
    shown = subprocess.run([str(binary), "--help"], capture_output=True, text=True, check=False).stdout
    match = re.search(rf"--{re.escape(flag)} duration\s.*?\(default ([0-9hms.]+)\)", shown, re.DOTALL)
    assert match, f"kube-controller-manager --help names no default for --{flag}"
    return go_duration(match[1])


def ready_condition(node: str) -> dict[str, Any]:
    item = kube_json("get", "node", node)
    return next(c for c in item["status"]["conditions"] if c["type"] == "Ready")


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def lab_fault(node: str, *args: str) -> str:
    """lab-kube-fault ARGS on NODE (what scripts/lab-fault NODE kube ARGS runs)."""
    return sh(node, "lab-kube-fault " + " ".join(shlex.quote(a) for a in args))


def copy_to_node(node: str, text: str, name: str) -> str:
    """TEXT as /tmp/NAME on NODE (podman cp: a file too large for a command line); returns the path."""
    with tempfile.NamedTemporaryFile("w", suffix=f"-{name}") as handle:
        handle.write(text)
        handle.flush()
        copied = podman("cp", handle.name, f"{node}:/tmp/{name}")
    assert copied.returncode == 0, copied.stderr
    return f"/tmp/{name}"


def dry_run(objects: list[dict[str, Any]], name: str) -> subprocess.CompletedProcess[str]:
    """`kubectl apply --validate=strict --dry-run=server -o json` of OBJECTS on the control plane: each object
    is sent with fieldValidation=Strict and dryRun=All. One object goes alone, so that what answers is the
    API server (kubectl checks a List's items against the server's OpenAPI schema first, in its own words)."""
    document = objects[0] if len(objects) == 1 else {"apiVersion": "v1", "kind": "List", "items": objects}
    path = copy_to_node(CONTROL_PLANE, json.dumps(document), name)
    try:
        return kubectl(f"apply --validate=strict --dry-run=server -o json -f {path}", timeout=300)
    finally:
        on_node(CONTROL_PLANE, f"rm -f {path}")


def create(obj: dict[str, Any], name: str) -> subprocess.CompletedProcess[str]:
    """`kubectl create` of OBJ on the control plane (a change: the caller deletes what it made)."""
    path = copy_to_node(CONTROL_PLANE, json.dumps(obj), name)
    try:
        return kubectl(f"create -f {path}")
    finally:
        on_node(CONTROL_PLANE, f"rm -f {path}")


def identity(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


@pytest.fixture(scope="module", autouse=True)
def converged_lab() -> None:
    if CONTROL_PLANE not in running_nodes():
        pytest.skip("the lab is not running (make lab-up)")
    if on_node(CONTROL_PLANE, "test -s /etc/kubernetes/admin.conf").returncode != 0:
        pytest.fail("no cluster on gpu-node-1: converge the lab first (make lab)")


# ------------------------------------------------------------------------- 1. binaries from their modules
def component_binaries() -> list[tuple[Any, Path]]:
    found = []
    for component in gobuild.COMPONENTS:
        directory = gobuild.output_dir(component)
        assert (directory / ".complete").is_file(), f"{component.name}: not built ({directory}): make lab"
        found += [(component, path) for path in sorted(directory.iterdir()) if not path.name.startswith(".")]
    return found


# the nodes' binaries, from the lab's packages (kubelet, kubeadm, kubectl, cri-tools, containerd.io,
# kubernetes-cni): path on the node -> (component, binary)
NODE_BINARIES = {
    "/usr/bin/kubelet": ("kubernetes", "kubelet"),
    "/usr/bin/kubeadm": ("kubernetes", "kubeadm"),
    "/usr/bin/kubectl": ("kubernetes", "kubectl"),
    "/usr/bin/crictl": ("cri-tools", "crictl"),
    "/usr/bin/containerd": ("containerd", "containerd"),
    "/usr/bin/containerd-shim-runc-v2": ("containerd", "containerd-shim-runc-v2"),
    "/usr/bin/ctr": ("containerd", "ctr"),
    "/usr/bin/runc": ("runc", "runc"),
    **{
        f"/opt/cni/bin/{p.rsplit('/', 1)[1]}": ("cni-plugins", p.rsplit("/", 1)[1])
        for p in gobuild.CNI_PLUGINS
    },
}


def test_every_lab_binary_names_its_upstream_module_at_the_pinned_version() -> None:
    binaries = component_binaries()
    assert {component.name for component, _ in binaries} == {c.name for c in gobuild.COMPONENTS}
    for component, binary in binaries:
        required = gobuild.required_version(component)
        assert required == component.pin(), f"{component.name}: go.mod {required}, pin {component.pin()}"
        (main_module, version), *_ = gobuild.upstream_modules(binary)
        # the main package's module: the component's module, or a module of its release (etcd's server is
        # go.etcd.io/etcd/server/v3, released with go.etcd.io/etcd/v3 at the same version)
        family = component.module.split("/v")[0]
        assert main_module.startswith(family) and version == required, (
            f"{binary}: go version -m names {main_module} {version}, not {component.module} {required}"
        )


def test_the_nodes_run_those_binaries_byte_for_byte() -> None:
    def sha256(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    wanted = {
        on_node_path: sha256(gobuild.output_dir(gobuild.BY_NAME[component]) / name)
        for on_node_path, (component, name) in NODE_BINARIES.items()
    }
    for node in NODES:
        listed = sh(node, "sha256sum " + " ".join(NODE_BINARIES))
        have = {path: digest for digest, path in (line.split() for line in listed.splitlines())}
        assert have == wanted, {path: (have.get(path), digest) for path, digest in wanted.items()}


# ---------------------------------------------------------------------------------- 2. kubectl version
def test_kubectl_version_reports_the_pinned_server() -> None:
    version = kube_json("version")
    pin = "v" + str(ROLE_DEFAULTS["kubernetes"]["kubernetes_version"])
    assert version["serverVersion"]["gitVersion"] == pin, version["serverVersion"]
    assert version["clientVersion"]["gitVersion"] == pin, version["clientVersion"]
    assert version["serverVersion"]["gitTreeState"] == "clean"
    for node in kube_json("get", "nodes")["items"]:
        assert node["status"]["nodeInfo"]["kubeletVersion"] == pin, node["metadata"]["name"]


# ------------------------------------------------------------ 3. every rendered object, strictly validated
# The roles whose objects are rendered here, and the play vars the serving stage loads over the inventory.
RENDERED_ROLES = (
    "kubernetes",
    "kubeadm_control_plane",
    "calico",
    "nvidia_device_plugin",
    "gpu_health_agent",
    "vllm_serving",
    "llm_gateway",
    "serving_network_policy",
    "monitoring",
)
SERVING_PLAY_VARS = ROOT / "playbooks" / "vars" / "serving.yml"
# role variables the roles compute from the inventory that a renderer of plain Jinja cannot
COMPUTED = ("_vllm_serving_versions",)


@cache
def lab_values() -> dict[str, Any]:
    """What a play of the product gives the control plane for the rendered roles' variables, templated by
    Ansible as plain data: the roles' defaults, the lab inventory over them, the serving stage's play vars
    (playbooks/vars/serving.yml), the roles' vars (COMPUTED only)."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar, trust_as_template
    from ansible.vars.manager import VariableManager

    init_plugin_loader()  # the lookups and filters of ansible.builtin, as the CLI loads them

    def trusted(path: Path) -> dict[str, Any]:
        values = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
        return {k: trust_as_template(v) if isinstance(v, str) else v for k, v in values.items()}

    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(ROOT / LAB_INVENTORY)])
    host = inventory.get_host(CONTROL_PLANE)
    variables: dict[str, Any] = {}
    for role in RENDERED_ROLES:
        variables |= trusted(ROOT / "roles" / role / "defaults" / "main.yml")
    public = [name for name in variables if not name.startswith("_")]
    variables |= VariableManager(loader=loader, inventory=inventory).get_vars(host=host)
    variables |= trusted(SERVING_PLAY_VARS)
    for role in RENDERED_ROLES:
        variables |= trusted(ROOT / "roles" / role / "vars" / "main.yml")
    templar = Templar(loader=loader, variables=variables)
    return {name: json.loads(json.dumps(templar.template(variables[name]))) for name in (*public, *COMPUTED)}


def live_monitoring_inputs() -> dict[str, Any]:
    """What the monitoring role reads from the cluster before it renders its policy
    (tasks/read-inputs.yml): the API server's port (the kubernetes Service's EndpointSlice) and the
    Nodes' InternalIPs."""
    slices = kube_json(
        "-n", "default", "get", "endpointslices", "-l", "kubernetes.io/service-name=kubernetes"
    )["items"]
    addresses = sorted(
        {
            address["address"]
            for node in kube_json("get", "nodes")["items"]
            for address in node["status"]["addresses"]
            if address["type"] == "InternalIP"
        }
    )
    return {
        "__monitoring_api_server_port": slices[0]["ports"][0]["port"],
        "__monitoring_node_addresses": addresses,
    }


def rendered_objects(tmp_path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(source, object) of every object the product applies, rendered by the unit tests' renderers."""
    from unit import manifests_render, monitoring_render
    from unit.role_render import RoleVars

    values = lab_values()
    objects = manifests_render.api_objects(**values)
    rbac = RoleVars("gpu_health_agent", **values).render_template("gpu-health-agent-rbac.yaml.j2")
    objects += [("gpu_health_agent/rbac", doc) for doc in yaml.safe_load_all(rbac) if doc]
    for model in values["vllm_serving_models"]:
        objects += [
            (f"vllm_serving/{template}", manifests_render.vllm_serving_object(template, model, **values))
            for template in manifests_render.VLLM_SERVING_TEMPLATES
        ]
    serving_names = [n for n in values if n.startswith(("llm_gateway_", "serving_network_policy_"))]
    gateway, _ = manifests_render.gateway_objects(
        tmp_path, {**{n: values[n] for n in serving_names}, "_llm_gateway_rollout_state": ""}
    )
    objects += [("serving_network_policy", doc) for doc in gateway["policies"]]
    objects += [("llm_gateway/secret", gateway["secret"]), *(("llm_gateway", o) for o in gateway["objects"])]
    monitoring = monitoring_render.all_objects(**{**values, **live_monitoring_inputs()})
    objects += [("monitoring", doc) for doc in monitoring]
    return objects


def test_every_rendered_object_is_accepted_by_the_api_server_strictly(tmp_path: Path) -> None:
    objects = rendered_objects(tmp_path)
    kinds = {obj["kind"] for _, obj in objects}
    # what the issue names: Calico, the device plugin, the RuntimeClass, vLLM, the gateway, the policies,
    # monitoring's workloads and configuration, the GPU health agent's RBAC
    assert {
        "CustomResourceDefinition", "DaemonSet", "RuntimeClass", "StatefulSet", "Service",
        "PodDisruptionBudget", "Deployment", "ConfigMap", "Secret", "NetworkPolicy", "ClusterRole",
        "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount", "Lease",
    } <= kinds, kinds  # fmt: skip
    # the objects go into the namespaces the converged lab has (a dry run creates no namespace)
    namespaces = {obj["metadata"].get("namespace") for _, obj in objects} - {None}
    existing = {item["metadata"]["name"] for item in kube_json("get", "namespaces")["items"]}
    assert namespaces <= existing, f"namespaces missing: {namespaces - existing}: converge the lab (make lab)"

    applied = dry_run([obj for _, obj in objects], "lab-rendered-objects.json")
    assert applied.returncode == 0, applied.stderr[-6000:]
    answered = json.loads(applied.stdout)
    items = answered["items"] if answered.get("kind") == "List" else [answered]
    assert sorted(identity(item) for item in items) == sorted(identity(obj) for _, obj in objects)
    # the answer is the API server's: the StatefulSet as it would be stored, defaulted where the template
    # says nothing (revisionHistoryLimit, the pod's schedulerName and dnsPolicy)
    (statefulset, *_) = (item for item in items if item["kind"] == "StatefulSet")
    pod_spec = statefulset["spec"]["template"]["spec"]
    assert statefulset["spec"]["revisionHistoryLimit"] == 10, statefulset["spec"]
    assert (pod_spec["schedulerName"], pod_spec["dnsPolicy"]) == ("default-scheduler", "ClusterFirst")


# ---------------------------------------------------------------------- 4. broken objects, real messages
@cache
def pause_image() -> str:
    """The pause image of kubeadm's constants at the pin (the lab's registry serves it)."""
    return f"registry.k8s.io/pause:{gobuild.kubeadm_constant('PauseVersion')}"


def pod(name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    """A Pod running the pause image; CONTAINER (a dict) is merged into its one container, the rest of SPEC
    into its spec."""
    container = {"name": "pause", "image": pause_image(), **spec.pop("container", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [container], **spec},
    }


QUANTITY = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
# case -> (the Pod's name, what is broken in it, the API server's answer, read from the lab's)
BROKEN: dict[str, tuple[str, dict[str, Any], str]] = {
    # strict field validation: the decoder refuses what the schema does not know
    "unknown-field": (
        "lab-broken-field",
        {"container": {"startupprobe": {}}},
        'Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
        'unknown field "spec.containers[0].startupprobe"',
    ),
    "bad-quantity": (
        "lab-broken-quantity",
        {"container": {"resources": {"limits": {"memory": "1.5Gb"}}}},
        'Pod in version "v1" cannot be handled as a Pod: '
        f"quantities must match the regular expression '{QUANTITY}'",
    ),
    # admission: RuntimeClass and ServiceAccount admission plugins look the names up
    "no-such-runtimeclass": (
        "lab-broken-runtimeclass",
        {"runtimeClassName": "lab-no-such-class"},
        'pods "lab-broken-runtimeclass" is forbidden: '
        'pod rejected: RuntimeClass "lab-no-such-class" not found',
    ),
    "no-such-serviceaccount": (
        "lab-broken-serviceaccount",
        {"serviceAccountName": "lab-no-such-account"},
        'pods "lab-broken-serviceaccount" is forbidden: error looking up service account '
        'default/lab-no-such-account: serviceaccount "lab-no-such-account" not found',
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_object_is_refused_with_the_real_message(case: str) -> None:
    name, fault, message = BROKEN[case]
    refused = dry_run([pod(name, **fault)], f"lab-broken-{case}.json")
    assert refused.returncode != 0, refused.stdout
    assert message in refused.stderr, refused.stderr
    # the same Pod without its one fault is accepted: the refusal is that fault's
    control = pod(name)
    accepted = dry_run([control], f"lab-control-{case}.json")
    assert accepted.returncode == 0, accepted.stderr


# --------------------------------------------------------------------------------------- 5. audit log
def apiserver_flag(flag: str) -> str:
    manifest = yaml.safe_load(sh(CONTROL_PLANE, "cat /etc/kubernetes/manifests/kube-apiserver.yaml"))
    values = [
        a.split("=", 1)[1] for a in manifest["spec"]["containers"][0]["command"] if a.startswith(f"--{flag}=")
    ]
    assert len(values) == 1, f"kube-apiserver's --{flag}: {values}"
    return values[0]


@pytest.fixture
def cordoned_by_operator() -> Iterator[tuple[str, dt.datetime]]:
    """A node cordoned by the lab's operator with their own kubeconfig, and when; uncordoned afterwards."""
    node = NODES[2]
    assert not kube_json("get", "node", node)["spec"].get("unschedulable"), f"{node} is cordoned already"
    started = dt.datetime.now(dt.UTC)  # the nodes share this machine's clock
    cordon = as_operator(f"kubectl cordon {node}")
    try:
        assert cordon.returncode == 0, cordon.stderr
        yield node, started
    finally:
        uncordon = as_operator(f"kubectl uncordon {node}")
        assert uncordon.returncode == 0, uncordon.stderr


def test_the_audit_log_names_the_operator_who_cordoned_a_node(
    cordoned_by_operator: tuple[str, dt.datetime],
) -> None:
    node, started = cordoned_by_operator
    log = apiserver_flag("audit-log-path")
    log_dir = ROLE_DEFAULTS["kubeadm_control_plane"]["kubeadm_control_plane_audit_log_dir"]
    assert log.startswith(f"{log_dir}/"), log
    assert apiserver_flag("audit-policy-file").startswith(
        ROLE_DEFAULTS["kubeadm_control_plane"]["kubeadm_control_plane_audit_policy_dir"] + "/"
    )

    def cordon_events() -> list[dict[str, Any]]:
        lines = on_node(CONTROL_PLANE, f'grep -F \'"username":"{OPERATOR}"\' {log}').stdout.splitlines()
        events = [json.loads(line) for line in lines]
        return [
            e
            for e in events
            if e["verb"] == "patch"
            and e.get("objectRef", {}).get("resource") == "nodes"
            and e["objectRef"].get("name") == node
            and (e.get("requestObject") or {}).get("spec", {}).get("unschedulable") is True
            and dt.datetime.fromisoformat(e["requestReceivedTimestamp"]) >= started  # this test's, not older
        ]

    # the log backend writes as the request completes (--audit-log-mode blocking, the default)
    (event,) = wait_for(
        f"an audit event of {OPERATOR} cordoning {node} in {log}", cordon_events, LOOP_MARGIN_S
    )
    assert event["user"]["username"] == OPERATOR
    assert event["level"] == "Request"  # the policy's rule for nodes: the body (spec.unschedulable) is there
    assert event["stage"] == "ResponseComplete" and event["responseStatus"]["code"] == 200
    assert event["userAgent"].startswith("kubectl/")


# ------------------------------------------------------------------------------------ 6. serving by traffic
def test_coredns_keeps_a_replica_through_a_drain() -> None:
    """kubeadm's CoreDNS gets the product's PodDisruptionBudget (role kubeadm_control_plane): it selects
    every CoreDNS Pod the Deployment runs, and with them Ready lets one at a time be evicted, so a drain of a
    node that holds both replicas leaves one answering."""
    deployment = kube_json("-n", "kube-system", "get", "deployment", "coredns")
    budget = kube_json("-n", "kube-system", "get", "poddisruptionbudget", "coredns")
    replicas = int(deployment["spec"]["replicas"])
    assert replicas >= 2, deployment["spec"]
    status = budget["status"]
    assert status["expectedPods"] == replicas, status
    assert status["currentHealthy"] == replicas and status["disruptionsAllowed"] == 1, status


def serving_pods(name: str) -> list[dict[str, Any]]:
    namespace = lab_values()["vllm_serving_namespace"]
    return list(
        kube_json("-n", namespace, "get", "pods", LIVE_PODS, "-l", f"app.kubernetes.io/name={name}")["items"]
    )


def test_gateway_and_simulator_pods_are_ready_through_their_probes() -> None:
    values = lab_values()
    replicas = sum(int(model["replicas"]) for model in values["vllm_serving_models"])
    for name, count, probes in (
        ("vllm", replicas, ("startupProbe", "readinessProbe", "livenessProbe")),
        ("llm-gateway", None, ("readinessProbe", "livenessProbe")),
    ):
        pods = serving_pods(name)
        assert pods and (count is None or len(pods) == count), (name, [p["metadata"]["name"] for p in pods])
        for item in pods:
            container = item["spec"]["containers"][0]
            for probe in probes:  # HTTP probes the kubelet runs against the container
                assert "httpGet" in container[probe], (item["metadata"]["name"], probe)
            assert item["status"]["phase"] == "Running" and pod_ready(item), item["status"]
            (status,) = item["status"]["containerStatuses"]
            assert status["ready"] and status["started"] and "running" in status["state"], status


def chat(node_ip: str, token: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    model = lab_values()["vllm_serving_models"][0]
    body = {
        "model": model.get("served_model_name", model["name"]),
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    request = urllib.request.Request(
        f"http://{node_ip}:{lab_values()['llm_gateway_node_port']}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.status, {k.lower(): v for k, v in answer.headers.items()}, json.loads(answer.read())


def in_pod(namespace: str, pod_name: str, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """python3 -c SCRIPT ARGS in the pod's first container (the gateway's image has python3)."""
    quoted = " ".join(shlex.quote(a) for a in (script, *args))
    return kubectl(f"-n {namespace} exec {pod_name} -- python3 -c {quoted}", timeout=60)


def finished_requests(namespace: str, gateway_pod: str, vllm_pods: list[dict[str, Any]]) -> float:
    """vllm:request_success_total summed over the simulator pods, read from a gateway pod (the policy admits
    it on their http port)."""
    script = (
        "import sys, urllib.request\n"
        "total = 0.0\n"
        "for ip in sys.argv[1:]:\n"
        "    text = urllib.request.urlopen(f'http://{ip}:8000/metrics', timeout=5).read().decode()\n"
        "    total += sum(float(l.split()[-1]) for l in text.splitlines()\n"
        "                 if l.startswith('vllm:request_success_total'))\n"
        "print(total)\n"
    )
    done = in_pod(namespace, gateway_pod, script, *(p["status"]["podIP"] for p in vllm_pods))
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


def test_a_request_to_node_port_30001_of_every_node_reaches_the_simulator_through_the_gateway() -> None:
    values = lab_values()
    namespace = values["vllm_serving_namespace"]
    model = values["vllm_serving_models"][0]
    gateway_pod = serving_pods("llm-gateway")[0]["metadata"]["name"]
    vllm_pods = serving_pods("vllm")
    before = finished_requests(namespace, gateway_pod, vllm_pods)
    token = jwt.encode(
        {"sub": "lab-real-kubernetes-test", "exp": int(time.time()) + 600},
        values["llm_gateway_jwt_secret"],
        algorithm="HS256",
    )
    inventory = yaml.safe_load((ROOT / LAB_INVENTORY).read_text())["all"]["children"]["k8s_cluster"][
        "children"
    ]
    node_ips = sorted(host["node_ip"] for group in inventory.values() for host in group["hosts"].values())
    assert len(node_ips) == len(NODES)
    for node_ip in node_ips:  # kube-proxy on each node forwards its NodePort
        status, headers, answer = chat(node_ip, token)
        assert status == 200, answer
        assert headers["x-llm-gateway-upstream"] == model["name"], headers
        assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"], answer
        assert answer["usage"]["completion_tokens"] == 4, answer
    # the simulators counted them: the answers came from them, not from the gateway
    assert finished_requests(namespace, gateway_pod, vllm_pods) - before >= len(node_ips)


# python3 -c CONNECT ADDRESS PORT: what a TCP connection from the pod to ADDRESS:PORT comes to
CONNECT = (
    "import socket, sys\n"
    "s = socket.socket(); s.settimeout(5)\n"
    "try:\n"
    "    s.connect((sys.argv[1], int(sys.argv[2]))); print('connected')\n"
    "except ConnectionRefusedError:\n"
    "    print('refused')\n"
    "except OSError as err:\n"
    "    print(type(err).__name__)\n"
)
HEALTH = (
    "import sys, urllib.request\n"
    "print(urllib.request.urlopen(f'http://{sys.argv[1]}:8000/health', timeout=5).status)\n"
)
RESOLVE = "import socket, sys; socket.setdefaulttimeout(5); print(socket.gethostbyname(sys.argv[1]))"


@pytest.fixture
def unlabelled_pod() -> Iterator[tuple[str, str]]:
    """A pod in the serving namespace without the gateway's labels (its image: the gateway's, for python3),
    deleted afterwards."""
    values = lab_values()
    namespace = values["vllm_serving_namespace"]
    deployment = kube_json("-n", namespace, "get", "deployment", "llm-gateway")
    gateway = deployment["spec"]["template"]["spec"]
    name = "lab-policy-probe"
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": name}},
        "spec": {
            "securityContext": gateway["securityContext"],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "probe",
                    "image": gateway["containers"][0]["image"],
                    "command": ["python3", "-c", "import time; time.sleep(3600)"],
                    "securityContext": gateway["containers"][0]["securityContext"],
                }
            ],
        },
    }
    created = create(probe, "lab-policy-probe.json")
    try:
        assert created.returncode == 0, created.stderr
        waited = kubectl(f"-n {namespace} wait --for=condition=Ready pod/{name} --timeout={POD_START_S}s",
                         timeout=POD_START_S + 30)  # fmt: skip
        assert waited.returncode == 0, waited.stderr
        yield namespace, name
    finally:
        kubectl(f"-n {namespace} delete pod {name} --ignore-not-found --wait=true --timeout=60s", timeout=90)


def test_network_policies_hold_by_traffic(unlabelled_pod: tuple[str, str]) -> None:
    namespace, probe = unlabelled_pod
    values = lab_values()
    gateway_pod = serving_pods("llm-gateway")[0]["metadata"]["name"]
    for vllm in serving_pods("vllm"):
        ip = vllm["status"]["podIP"]
        # refused: kube-router's policy chains end in REJECT (icmp-port-unreachable), so a connection the
        # policy forbids is refused at once; a timeout would be a route that does not work, not the policy
        denied = in_pod(namespace, probe, CONNECT, ip, "8000")
        assert denied.returncode == 0 and denied.stdout.strip() == "refused", (
            ip,
            denied.stdout,
            denied.stderr,
        )
        allowed = in_pod(namespace, gateway_pod, CONNECT, ip, "8000")
        assert allowed.returncode == 0 and allowed.stdout.strip() == "connected", (ip, allowed.stdout)
        health = in_pod(namespace, gateway_pod, HEALTH, ip)
        assert health.returncode == 0 and health.stdout.strip() == "200", (ip, health.stdout, health.stderr)
    # the gateway's own egress: vLLM and DNS only (Prometheus, for one, is refused)
    monitoring = values["monitoring_namespace"]
    prometheus = kube_json(
        "-n", monitoring, "get", "pods", LIVE_PODS, "-l", "app.kubernetes.io/name=prometheus"
    )
    for item in prometheus["items"]:
        elsewhere = in_pod(namespace, gateway_pod, CONNECT, item["status"]["podIP"], "9090")
        assert elsewhere.stdout.strip() == "refused", (elsewhere.stdout, elsewhere.stderr)
    # DNS: a Service's name resolves to its ClusterIP from a pod (the gateway's egress admits kube-dns)
    for model in values["vllm_serving_models"]:
        spec = kube_json("-n", namespace, "get", "service", model["name"])["spec"]
        service = spec["clusterIP"]
        name = f"{model['name']}.{namespace}.svc.cluster.local"
        resolved = in_pod(namespace, gateway_pod, RESOLVE, name)
        assert resolved.returncode == 0 and resolved.stdout.strip() == service, (
            resolved.stdout,
            resolved.stderr,
        )
        # the unlabelled pod gets no answer: default-deny holds its egress to DNS too
        unresolved = in_pod(namespace, probe, RESOLVE, name)
        assert unresolved.returncode != 0, unresolved.stdout


def test_prometheus_scrapes_every_target_it_discovers() -> None:
    namespace = lab_values()["monitoring_namespace"]
    data = kube_json("-n", namespace, "get", "configmap", "prometheus-config")["data"]
    config = yaml.safe_load(data["prometheus.yml"])
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    interval = go_duration(config["global"]["scrape_interval"])

    def up() -> list[dict[str, Any]]:
        # promtool in Prometheus's own pod asks it on its loopback (the policy admits only Grafana in)
        done = kubectl(
            f"-n {namespace} exec deploy/prometheus -- "
            "/bin/promtool query instant -o json http://127.0.0.1:9090 up"
        )
        assert done.returncode == 0, done.stderr
        return list(json.loads(done.stdout))

    def all_up() -> list[dict[str, Any]] | None:
        series = up()
        found = {s["metric"]["job"] for s in series}
        return series if found == jobs and all(s["value"][1] == "1" for s in series) else None

    # two scrape intervals: a target discovered since the last scrape has had one
    series = wait_for(f"every job of {sorted(jobs)} scraped and up", all_up, 2 * interval + LOOP_MARGIN_S)
    by_job: dict[str, set[str]] = {}
    for s in series:
        by_job.setdefault(s["metric"]["job"], set()).add(s["metric"].get("pod") or s["metric"]["instance"])
    assert by_job["vllm"] == {p["metadata"]["name"] for p in serving_pods("vllm")}
    assert by_job["llm-gateway"] == {p["metadata"]["name"] for p in serving_pods("llm-gateway")}


# ------------------------------------------------------------------------------------- 7. the real faults
NOT_READY_NODE = NODES[2]
PLUGIN_NODE = NODES[1]
CRASHLOOP_NODE = NODES[1]
GPU = "nvidia.com/gpu"
# the kubelet renews its Lease every quarter of nodeLeaseDurationSeconds (kubelet.go,
# nodeLeaseRenewIntervalFraction = 0.25)
LEASE_RENEW_FRACTION = 0.25
# the kubelet's first back-off after a container exits (kubelet.go, backOffPeriod = 10 s), doubled at each
# restart up to crashLoopBackOff.maxContainerRestartPeriod of its configuration
CRASHLOOP_FIRST_BACKOFF_S = 10
# each restart is a container created and started in the nested runtime and its exit seen by the kubelet's
# next relist: a 15 s margin past the back-offs was not enough once on this machine under a full make test's
# load (2026-12-02: restart 2 not seen within 75 s)
CRASHLOOP_MARGIN_S = 4 * LOOP_MARGIN_S


@pytest.fixture
def kubelet_stopped() -> Iterator[str]:
    """NOT_READY_NODE's kubelet stopped (lab-kube-fault not-ready); started again afterwards, and waited for
    until the Node is Ready."""
    node = NOT_READY_NODE
    assert ready_condition(node)["status"] == "True", f"{node} must start Ready"
    # read (and kept: kubelet_config caches it) while the kubelet still answers
    status_every = kubelet_setting_s(node, "nodeStatusUpdateFrequency")
    lab_fault(node, "not-ready")
    try:
        yield node
    finally:
        lab_fault(node, "clear", "not-ready")
        wait_for(
            f"{node} Ready again",
            lambda: ready_condition(node)["status"] == "True",
            KUBELET_START_S + status_every,
        )


def test_kubelet_stopped_makes_the_node_unknown_after_the_grace_period(kubelet_stopped: str) -> None:
    node = kubelet_stopped
    stopped = time.monotonic()
    grace = controller_manager_setting_s("node-monitor-grace-period")  # 50 s by default in 1.36
    monitor_period = controller_manager_setting_s("node-monitor-period")
    renew = kubelet_config(node)["nodeLeaseDurationSeconds"] * LEASE_RENEW_FRACTION
    # not at once: the node controller waits out the grace period from the kubelet's last heartbeat
    assert ready_condition(node)["status"] == "True"
    condition = wait_for(
        f"{node} Ready=Unknown",
        lambda: (c := ready_condition(node))["status"] == "Unknown" and c,
        grace + monitor_period + LOOP_MARGIN_S,
    )
    took = time.monotonic() - stopped
    assert took >= grace - renew - POLL_S, (
        f"Unknown after {took:.0f} s, before the grace period ({grace:.0f} s)"
    )
    assert condition["reason"] == "NodeStatusUnknown", condition
    assert condition["message"] == "Kubelet stopped posting node status.", condition

    def unreachable() -> bool:
        taints = kube_json("get", "node", node)["spec"].get("taints") or []
        return any(taint["key"] == "node.kubernetes.io/unreachable" for taint in taints)

    # the node controller taints it on its next pass, so that pods that do not tolerate it leave
    wait_for(f"{node} tainted node.kubernetes.io/unreachable", unreachable, monitor_period + LOOP_MARGIN_S)


def allocatable_gpus(node: str) -> str:
    return str(kube_json("get", "node", node)["status"]["allocatable"].get(GPU, "absent"))


def plugin_pods(node: str) -> list[dict[str, Any]]:
    """The device plugin's pods on NODE (its upstream image's name, owned by its DaemonSet)."""
    pods = kube_json("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}")["items"]
    return [
        p
        for p in pods
        if any("k8s-device-plugin" in c["image"] for c in p["spec"]["containers"])
        and not p["metadata"].get("deletionTimestamp")
    ]


def delete_plugin_pods(node: str) -> None:
    """What playbooks/remediate/restart-device-plugin.yml does: its DaemonSet starts a new pod, which
    registers."""
    for item in plugin_pods(node):
        done = kubectl(
            f"-n {item['metadata']['namespace']} delete pod {item['metadata']['name']} --wait=true"
        )
        assert done.returncode == 0, done.stderr


@pytest.fixture
def plugin_unregistered() -> Iterator[tuple[str, str, float]]:
    """PLUGIN_NODE's device plugin unregistered (lab-kube-fault); yields the node, its GPU count and its
    kubelet's nodeStatusUpdateFrequency. Afterwards, as on-call would, its pod replaced if the GPUs are not
    back, and waited for until the node offers them all again."""
    node = PLUGIN_NODE
    gpus = str(kube_json("get", "node", node)["status"]["capacity"][GPU])
    assert allocatable_gpus(node) == gpus, f"{node} must start with every GPU allocatable"
    # read before the fault: it restarts the kubelet, whose /configz then refuses connections until it is up
    # again (CI, 2026-12-04: read just after the fault, "dial tcp ...:10250: connect: connection refused")
    status_every = kubelet_setting_s(node, "nodeStatusUpdateFrequency")
    lab_fault(node, "device-plugin-unregistered")
    try:
        yield node, gpus, status_every
    finally:
        lab_fault(node, "clear", "device-plugin-unregistered")
        if allocatable_gpus(node) != gpus:
            delete_plugin_pods(node)
        wait_for(
            f"{node} offering {gpus} GPUs again",
            lambda: allocatable_gpus(node) == gpus,
            POD_START_S + status_every,
        )


def test_device_plugin_unregistered_leaves_allocatable_zero_while_its_pod_runs(
    plugin_unregistered: tuple[str, str, float],
) -> None:
    node, gpus, status_every = plugin_unregistered
    (before,) = plugin_pods(node)
    # the kubelet posts the Node's resources every nodeStatusUpdateFrequency
    wait_for(
        f"{node} allocatable {GPU} 0", lambda: allocatable_gpus(node) == "0", status_every + LOOP_MARGIN_S
    )
    # the plugin's pod runs on, Ready: nothing but the node's resources shows the fault
    (still,) = plugin_pods(node)
    assert still["metadata"]["uid"] == before["metadata"]["uid"]
    assert still["status"]["phase"] == "Running" and pod_ready(still), still["status"]
    # the fix on-call runs (restart-device-plugin.yml): a new plugin pod registers again
    delete_plugin_pods(node)
    wait_for(
        f"{node} offering {gpus} GPUs", lambda: allocatable_gpus(node) == gpus, POD_START_S + status_every
    )
    (after,) = plugin_pods(node)
    assert after["metadata"]["uid"] != before["metadata"]["uid"]


CRASHLOOP_NAMESPACE = "lab-real-kubernetes-test"
CRASHLOOP_POD = "lab-crashloop"


@pytest.fixture
def crashlooping_pod() -> Iterator[str]:
    """A pause pod of this test's own, in a namespace of its own, on CRASHLOOP_NODE, whose container
    lab-kube-fault kills each time it runs; the fault cleared and the namespace deleted afterwards."""
    made = kubectl(f"create namespace {CRASHLOOP_NAMESPACE}")
    try:
        assert made.returncode == 0, made.stderr
        # a pod is admitted once the namespace's ServiceAccount `default` exists (ServiceAccount admission):
        # the controller manager makes it at once
        wait_for(
            f"ServiceAccount {CRASHLOOP_NAMESPACE}/default",
            lambda: kubectl(f"-n {CRASHLOOP_NAMESPACE} get serviceaccount default").returncode == 0,
            LOOP_MARGIN_S,
        )
        looping = pod(
            CRASHLOOP_POD,
            CRASHLOOP_NAMESPACE,
            nodeSelector={"kubernetes.io/hostname": CRASHLOOP_NODE},
            automountServiceAccountToken=False,
            terminationGracePeriodSeconds=0,
        )
        created = create(looping, "lab-crashloop.json")
        assert created.returncode == 0, created.stderr
        waited = kubectl(
            f"-n {CRASHLOOP_NAMESPACE} wait --for=condition=Ready pod/{CRASHLOOP_POD} "
            f"--timeout={POD_START_S}s",
            timeout=POD_START_S + 30,
        )
        assert waited.returncode == 0, waited.stderr
        lab_fault(CRASHLOOP_NODE, "crashloop", "--pod", CRASHLOOP_POD, "--namespace", CRASHLOOP_NAMESPACE)
        yield CRASHLOOP_POD
    finally:
        on_node(CRASHLOOP_NODE, "lab-kube-fault clear crashloop")
        kubectl(
            f"delete namespace {CRASHLOOP_NAMESPACE} --ignore-not-found --wait=true --timeout=120s",
            timeout=150,
        )


def test_a_crash_looping_pod_goes_crash_loop_back_off_with_its_restarts_counted(
    crashlooping_pod: str,
) -> None:
    """The real kubelet's back-off: each kill counted as a restart, the restarts spaced by a back-off that
    doubles (10 s, 20 s, ...), and its BackOff events (kubectl describe's "Back-off restarting failed
    container", what kubectl get's CrashLoopBackOff comes from). The container's state during the back-off is
    not asserted: this kubelet shows `waiting: CrashLoopBackOff` only until its next sync of the pod and the
    last `terminated` state after (seen 2026-12-02: waiting after the first kill, terminated for the whole
    20 s and 40 s back-offs), so a poll for the waiting reason passed or failed by timing."""
    longest = go_duration(
        str(kubelet_config(CRASHLOOP_NODE)["crashLoopBackOff"]["maxContainerRestartPeriod"])
    )

    def backoff(restart: int) -> float:
        return min(CRASHLOOP_FIRST_BACKOFF_S * 2**restart, longest)

    def status() -> dict[str, Any]:
        item = kube_json("-n", CRASHLOOP_NAMESPACE, "get", "pod", crashlooping_pod)
        (container,) = item["status"].get("containerStatuses") or [{}]
        return dict(container)

    # when the restart count first reached each value: the first kill is restarted at once, the second
    # after backoff(0), the third after backoff(1)
    counted: dict[int, float] = {}
    last: dict[str, Any] = {}
    deadline = time.monotonic() + backoff(0) + backoff(1) + CRASHLOOP_MARGIN_S
    while len(counted) < 3 and time.monotonic() < deadline:
        last = status()
        restarts = int(last.get("restartCount", 0))
        if restarts > 0 and restarts not in counted:
            counted[restarts] = time.monotonic()
        time.sleep(1)
    assert len(counted) >= 3, f"restart counts seen {sorted(counted)}, not three; last status {last}"
    first, second, third = sorted(counted)[:3]
    # the kill loop runs every second and a poll takes a second or two: a gap may look that much shorter
    slack = 3.0
    # each gap at least its back-off (the second one doubled: a back-off that did not grow fails here); load
    # only lengthens a gap, so no upper bound
    for restart, after, waited in ((first, second, backoff(0)), (second, third, backoff(1))):
        gap = counted[after] - counted[restart]
        assert gap >= waited - slack, (
            f"restarts {restart} and {after} {gap:.0f} s apart: no {waited:.0f} s back-off"
        )
    terminated = last["lastState"].get("terminated") or last["state"].get("terminated") or {}
    assert terminated.get("exitCode") == 137, last  # killed by the fault, not exited on its own
    events = kube_json(
        "-n",
        CRASHLOOP_NAMESPACE,
        "get",
        "events",
        "--field-selector",
        f"involvedObject.name={crashlooping_pod},reason=BackOff",
    )["items"]
    assert any("Back-off restarting failed container" in e.get("message", "") for e in events), events


def scheduler_pod() -> dict[str, Any] | None:
    done = kubectl(f"-n kube-system get pod kube-scheduler-{CONTROL_PLANE} -o json")
    return json.loads(done.stdout) if done.returncode == 0 else None


@pytest.fixture
def scheduler_manifest_broken() -> Iterator[tuple[str, float]]:
    """kube-scheduler's static pod manifest naming an image that does not exist (lab-kube-fault); yields
    its image and its pod's termination grace period; the manifest put back afterwards, and waited for
    until the scheduler runs Ready again."""
    before = scheduler_pod()
    assert before and pod_ready(before), "kube-scheduler must start Running and Ready"
    image = before["spec"]["containers"][0]["image"]
    lab_fault(CONTROL_PLANE, "static-pod-broken", "--component", "kube-scheduler")
    try:
        yield image, float(before["spec"]["terminationGracePeriodSeconds"])
    finally:
        lab_fault(CONTROL_PLANE, "clear", "static-pod-broken")

        def back() -> bool:
            now = scheduler_pod()
            return bool(now and now["spec"]["containers"][0]["image"] == image and pod_ready(now))

        # the kubelet reads the manifest again within fileCheckFrequency, then the pod starts and its
        # startup and readiness probes pass
        wait_for(
            "kube-scheduler Running and Ready with its own image again",
            back,
            kubelet_setting_s(CONTROL_PLANE, "fileCheckFrequency") + POD_START_S,
        )


def test_a_broken_static_pod_manifest_shows_an_image_pull_error(
    scheduler_manifest_broken: tuple[str, float],
) -> None:
    image, termination_grace = scheduler_manifest_broken
    broken = image.replace("registry.k8s.io/", "registry.k8s.io/lab-broken-", 1)

    def pull_error() -> dict[str, Any] | None:
        now = scheduler_pod()
        if not now or now["spec"]["containers"][0]["image"] != broken:
            return None
        (container,) = now["status"].get("containerStatuses") or [{}]
        waiting = container.get("state", {}).get("waiting", {})
        return waiting if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

    # the kubelet reads the static pod manifests every fileCheckFrequency, stops the running scheduler
    # (within its termination grace period) and starts the new pod, whose pull fails at once (the lab's
    # registry has no such repository)
    waiting = wait_for(
        f"kube-scheduler's mirror pod pulling {broken} and failing",
        pull_error,
        kubelet_setting_s(CONTROL_PLANE, "fileCheckFrequency") + termination_grace + LOOP_MARGIN_S,
    )
    assert broken in waiting.get("message", broken), waiting
