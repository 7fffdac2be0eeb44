"""Driver work and the cluster's own GPU clients (issue 16, item 4): the GPU health agent keeps NVML open,
and the device plugin's and dcgm-exporter's pods hold the GPUs, on every GPU node; a drain leaves
DaemonSets' pods, so before this a module reload failed under them and a reboot was always refused.

- which process is one of the cluster's own GPU clients and which a workload, and how a refusal names it
  (the role's filters, roles/nvidia_driver/filter_plugins/gpu_clients.py);
- the list's one home (the role's vars, shared with playbooks/remediate/driver-mismatch.yml) and where the
  role and the playbook stop and start the clients (before the GPUs are judged free; in an `always`);
- the role's stop and start task files run by ansible-playbook against the real control plane of the
  production pin (real_kube.py; test_gpu_health_agent.Cluster's GPU Nodes): kube-controller-manager's
  DaemonSet controller makes and deletes the DaemonSets' pods, real_kube.Kubelets binds them to their node
  and writes what the node's kubelet would (Running and Ready; the final delete once deleted gracefully):
  the node leaves the GPU node label, the GPU DaemonSets' pods (and only theirs) leave it, a record on the
  node says what stopped; a later run (as after an interruption) puts the label back and waits for the
  pods; --check says what it would stop and changes nothing; driver-mismatch.yml -e plan_only=true names
  them.

Not here: systemd stopping the agent and real processes holding /dev/nvidia* (tests/lab/
test_remediation_on_lab.py::test_driver_mismatch_repair_finishes_with_the_cluster_gpu_clients_running)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from real_kube import ControlPlane, Kubelets
from test_gpu_health_agent import NODES, Cluster
from test_oncall_playbooks import Site
from test_remediation_playbooks import load, module_of, tasks

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "nvidia_driver"
GPU_LABEL = {"nvidia.com/gpu.present": "true"}
NODE = "gpu-node-2"


def _filters() -> dict[str, Callable[..., Any]]:
    spec = importlib.util.spec_from_file_location("gpu_clients", ROLE / "filter_plugins" / "gpu_clients.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


FILTERS = _filters()


def pod(
    name: str, namespace: str, uid: str, owner: str | None, selector: dict[str, str], ready: bool = True
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if owner:
        kind, _, owner_name = owner.partition("/")
        meta["ownerReferences"] = [{"kind": kind, "name": owner_name, "controller": True}]
    return {
        "metadata": meta,
        "spec": {"nodeSelector": selector},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


PLUGIN_DS = "DaemonSet/nvidia-device-plugin-daemonset"
NODE_PODS = [
    pod("nvidia-device-plugin-daemonset-x7k2p", "kube-system", "u-plugin", PLUGIN_DS, GPU_LABEL),
    pod("dcgm-exporter-9qz4m", "monitoring", "u-dcgm", "DaemonSet/dcgm-exporter", GPU_LABEL, ready=False),
    pod("kube-proxy-abcde", "kube-system", "u-proxy", "DaemonSet/kube-proxy", {"kubernetes.io/os": "linux"}),
    pod("qwen2-7b-0", "serving", "u-vllm", "StatefulSet/qwen2-7b", GPU_LABEL),
]  # fmt: skip


def proc(
    pid: int, name: str, devices: list[str], unit: str | None = None, pod_uid: str | None = None
) -> dict[str, Any]:
    daemon = name in ("nvidia-persiste", "nv-fabricmanage")
    return {"pid": pid, "name": name, "user": "root", "devices": devices, "driver_daemon": daemon,
            "unit": unit, "pod_uid": pod_uid}  # fmt: skip


# ------------------------------------------------------------------------------------------- filters
def test_gpu_client_pods_are_the_daemonsets_selecting_the_gpu_label() -> None:
    found = FILTERS["nvidia_driver_gpu_client_pods"](NODE_PODS, GPU_LABEL)
    assert [(p["daemonset"], p["name"], p["uid"], p["ready"]) for p in found] == [
        ("kube-system/nvidia-device-plugin-daemonset", "nvidia-device-plugin-daemonset-x7k2p", "u-plugin",
         True),
        ("monitoring/dcgm-exporter", "dcgm-exporter-9qz4m", "u-dcgm", False),
    ]  # fmt: skip
    # a vLLM pod selecting GPU nodes is a workload (a label change does not move it); another label, none
    assert FILTERS["nvidia_driver_gpu_client_pods"](NODE_PODS, {"example.org/gpu": "a100"}) == []


def test_holders_tell_the_clusters_gpu_clients_from_workloads_and_name_each() -> None:
    processes = [
        proc(17, "nvidia-persiste", ["/dev/nvidiactl"], unit="nvidia-persistenced.service"),
        proc(301, "python3", ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"],
             unit="gpu-health-agent.service"),
        proc(402, "nvidia-device-p", ["/dev/nvidiactl"], pod_uid="u-plugin"),
        proc(403, "dcgm-exporter", ["/dev/nvidia0", "/dev/nvidiactl"], pod_uid="u-dcgm"),
        proc(4242, "vllm-worker", ["/dev/nvidia0"], pod_uid="u-vllm"),
        proc(5151, "python3", ["/dev/nvidia3"], unit="session-7.scope"),
        proc(6161, "a.out", ["/dev/nvidia2"]),
        proc(7171, "ghost", ["/dev/nvidia1"], pod_uid="u-gone"),
    ]  # fmt: skip
    holders = FILTERS["nvidia_driver_gpu_holders"](
        processes, ["gpu-health-agent.service"], NODE_PODS, GPU_LABEL
    )
    assert [(h["pid"], h["client"]) for h in holders] == [
        (301, True), (402, True), (403, True), (4242, False), (5151, False), (6161, False), (7171, False)
    ]  # fmt: skip
    texts = {h["pid"]: h["text"] for h in holders}
    assert texts[4242] == "vllm-worker[4242] on /dev/nvidia0 (pod serving/qwen2-7b-0)"
    assert texts[5151] == "python3[5151] on /dev/nvidia3 (session-7.scope)"
    assert texts[6161] == "a.out[6161] on /dev/nvidia2"
    assert texts[7171] == "ghost[7171] on /dev/nvidia1 (pod u-gone)"
    assert texts[301] == "python3[301] on /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl (gpu-health-agent.service)"
    # without the API's pods (no cluster) a pod's process is a workload: nobody can say it is ours
    holders = FILTERS["nvidia_driver_gpu_holders"](processes, ["gpu-health-agent.service"])
    assert [h["pid"] for h in holders if h["client"]] == [301]


def test_records_merge_and_the_carried_label() -> None:
    merge = FILTERS["nvidia_driver_merge_records"]
    earlier = {
        "units": ["gpu-health-agent.service"],
        "node_label": GPU_LABEL,
        "daemonsets": ["monitoring/dcgm-exporter"],
    }
    now = {
        "units": [],
        "node_label": {},
        "daemonsets": ["kube-system/nvidia-device-plugin-daemonset", "monitoring/dcgm-exporter"],
    }
    assert merge({}, earlier, now) == {
        "units": ["gpu-health-agent.service"],
        "node_label": GPU_LABEL,
        "daemonsets": ["monitoring/dcgm-exporter", "kube-system/nvidia-device-plugin-daemonset"],
    }  # fmt: skip
    assert FILTERS["nvidia_driver_record_empty"]({}) and FILTERS["nvidia_driver_record_empty"](
        merge(None, {})
    )
    assert not FILTERS["nvidia_driver_record_empty"](now)
    carried = FILTERS["nvidia_driver_carried_labels"]
    node = {"metadata": {"labels": {"nvidia.com/gpu.present": "true", "kubernetes.io/os": "linux"}}}
    assert carried(node, GPU_LABEL) == GPU_LABEL
    assert carried({"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}}, GPU_LABEL) == {}
    assert carried({}, GPU_LABEL) == {} and carried(None, GPU_LABEL) == {}


# ---------------------------------------------------------------------------------- one home, where
def role_file(name: str) -> Any:
    return yaml.safe_load((ROLE / name).read_text())


def flat(items: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(section, task) of every task, blocks flattened: section is 'block', 'rescue' or 'always' of the
    innermost block ('' outside any)."""
    out: list[tuple[str, dict[str, Any]]] = []

    def walk(entries: list[dict[str, Any]], section: str) -> None:
        for entry in entries or []:
            if "block" in entry:
                for part in ("block", "rescue", "always"):
                    walk(entry.get(part, []), part)
            else:
                out.append((section, entry))

    walk(items, "")
    return out


def included(task: dict[str, Any]) -> str:
    for key in ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks"):
        if key in task:
            return str(task[key]).removesuffix(".yml")
    if "ansible.builtin.include_role" in task:
        return str(task["ansible.builtin.include_role"].get("tasks_from", ""))
    return ""


def test_the_list_has_one_home_the_agents_unit() -> None:
    clients = role_file("vars/main.yml")["__nvidia_driver_gpu_clients"]
    agent_unit = yaml.safe_load((ROOT / "roles/gpu_health_agent/vars/main.yml").read_text())[
        "__gpu_health_agent_unit"
    ]
    assert clients == {"units": [agent_unit]}
    # no copy elsewhere: the playbook and the role's files read the list
    for path in [*ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("roles/*/tasks/*.yml")]:
        assert not re.search(re.escape(agent_unit) + r"(?!\.j2)", path.read_text()), (
            f"{path.relative_to(ROOT)} names {agent_unit}: use the list"
        )


def test_the_role_stops_them_before_judging_the_gpus_free_and_starts_them_in_always() -> None:
    main = flat(role_file("tasks/main.yml"))
    starts = [section for section, task in main if included(task) == "start-gpu-clients"]
    assert starts == ["always"]
    block = next(t for t in role_file("tasks/main.yml") if "always" in t)
    inside = [included(t) or t.get("ansible.builtin.meta", "") for t in block["block"]]
    # the initramfs rebuild reboot-if-needed.yml flushes first, here too: its include there has a gate
    assert inside == [
        "flush_handlers",
        "reboot-if-needed",
        "start-persistenced",
        "fix-version-mismatch",
        "reboot-if-needed",
    ]

    reboot = [included(t) or t["name"] for _, t in flat(role_file("tasks/reboot-if-needed.yml"))]
    order = [
        step
        for step in reboot
        if step in ("stop-gpu-clients", "find-gpu-workloads", "Reboot to load the NVIDIA driver")
    ]
    # judged once before anything stops (a refusal leaves them alone), once after, then the reboot
    assert order[:4] == [
        "find-gpu-workloads",
        "stop-gpu-clients",
        "find-gpu-workloads",
        "Reboot to load the NVIDIA driver",
    ]
    fix = [included(t) for _, t in flat(role_file("tasks/fix-version-mismatch.yml")) if included(t)]
    assert fix == ["read-gpu-facts", "handle-version-mismatch"]
    mismatch = [included(t) for _, t in flat(role_file("tasks/handle-version-mismatch.yml")) if included(t)]
    assert mismatch.index("stop-gpu-clients") < mismatch.index("reload-kernel-modules")
    assert mismatch.count("find-gpu-workloads") == 2  # before the stop and after it: what is left decides


def test_driver_mismatch_stops_and_starts_them_with_the_roles_files() -> None:
    (play, _summary) = load("driver-mismatch.yml")
    steps = flat(play["tasks"])
    files = [(section, included(t)) for section, t in steps if included(t)]
    assert ("always", "start-gpu-clients") in files
    fix = next(t for t in play["tasks"] if "always" in t)
    assert [included(t) for t in fix["block"]] == ["fix-version-mismatch", "reboot-if-needed"]
    assert "read-gpu-clients" in [f for _, f in files]
    modules = {module_of(t) for t in tasks(play)}
    assert not modules & {"ansible.builtin.systemd_service", "kubernetes.core.k8s"}  # the role's, not a copy


# --------------------------------------------------------------------------- against the real control plane
GPU_DAEMONSETS = {
    ("kube-system", "nvidia-device-plugin-daemonset"): "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
    ("monitoring", "dcgm-exporter"): "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless",
}


def daemonset(namespace: str, name: str, image: str, selector: dict[str, str] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": name, "image": image}]}
    if selector:
        spec["nodeSelector"] = selector
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


class Clients:
    """The site of test_oncall_playbooks (every node local, the real control plane) with the GPU DaemonSets,
    one more DaemonSet on every node, and a play that runs one of the role's task files on NODE."""

    def __init__(self, site: Site, tmp: Path) -> None:
        self.site = site
        self.admin = site.cluster.admin
        self.record = tmp / "stopped-gpu-clients.json"
        # kube-system is the API server's own; monitoring stays with the session's control plane (no namespace
        # controller runs to finish its deletion): made by an earlier run of this module on the worker, kept
        code, out = self.admin.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}},
        )
        assert code < 300 or code == 409, out
        for (namespace, name), image in GPU_DAEMONSETS.items():
            self.admin.ok(
                "POST",
                f"/apis/apps/v1/namespaces/{namespace}/daemonsets",
                daemonset(namespace, name, image, GPU_LABEL),
            )
        self.admin.ok(
            "POST",
            "/apis/apps/v1/namespaces/kube-system/daemonsets",
            daemonset("kube-system", "kube-proxy", "registry.k8s.io/kube-proxy:v1.36.3", None),
        )  # fmt: skip
        for task_file in ("stop-gpu-clients", "start-gpu-clients"):
            include = {"name": "nvidia_driver", "tasks_from": task_file}
            play = [
                {"hosts": NODE, "gather_facts": False, "tasks": [{"ansible.builtin.include_role": include}]}
            ]
            (tmp / f"{task_file}.yml").write_text(yaml.safe_dump(play))
        self.tmp = tmp

    def close(self) -> None:
        """The DaemonSets and their pods deleted (no garbage collector runs to delete the pods)."""
        names = [*GPU_DAEMONSETS, ("kube-system", "kube-proxy")]
        for namespace, name in names:
            self.admin.request("DELETE", f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}")
        for namespace, name in names:
            self.admin.request(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3D{name}&gracePeriodSeconds=0",
            )

    def pods(self, node: str = NODE) -> dict[str, dict[str, Any]]:
        """(namespace/daemonset) -> pod on the node, Running and Ready ones only"""
        items = self.admin.ok("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")["items"]
        out = {}
        for item in items:
            owner = (item["metadata"].get("ownerReferences") or [{}])[0].get("name")
            conditions = (item.get("status") or {}).get("conditions") or []
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            if ready and not item["metadata"].get("deletionTimestamp"):
                out[f"{item['metadata']['namespace']}/{owner}"] = item
        return out

    def labels(self) -> dict[str, str]:
        return self.site.cluster.node(NODE)["metadata"].get("labels") or {}

    def run(self, task_file: str, *args: str) -> Any:
        return self.site.play(
            str(self.tmp / f"{task_file}.yml"),
            "-e", f"__nvidia_driver_admin_kubeconfig={self.site.kubeconfig}",
            "-e", f"__nvidia_driver_gpu_clients_record={self.record}",
            "-e", '{"nvidia_driver_gpu_clients_timeout_s": 60}',
            *args,
        )  # fmt: skip


def one_line(text: str) -> str:
    """Output on one line, as the YAML callback's single-quoted strings read (`''` is `'`)."""
    return " ".join(text.replace("''", "'").split())


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout}s: {what}")


ALL_THREE = {
    "kube-system/nvidia-device-plugin-daemonset",
    "monitoring/dcgm-exporter",
    "kube-system/kube-proxy",
}


@pytest.fixture(scope="module")
def clients(kube_controllers: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clients]:
    cluster = Cluster(kube_controllers, tmp_path_factory.mktemp("driver-api"))
    kubelets = Kubelets(kube_controllers, NODES)
    with kubelets:
        site = Site(cluster, tmp_path_factory.mktemp("driver-site"))
        site.reset()
        made = Clients(site, tmp_path_factory.mktemp("driver-plays"))
        try:
            wait_for("the three DaemonSets' pods Ready on every node", lambda: set(made.pods()) == ALL_THREE)
            yield made
        finally:
            made.close()
    cluster.close()
    assert not kubelets.errors, kubelets.errors


def test_check_mode_says_what_it_would_stop_and_changes_nothing(clients: Clients) -> None:
    before = {k: p["metadata"]["uid"] for k, p in clients.pods().items()}
    check = clients.run("stop-gpu-clients", "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    text = one_line(check.stdout)
    plugin = before["kube-system/nvidia-device-plugin-daemonset"]
    names = {k: p["metadata"]["name"] for k, p in clients.pods().items()}
    assert (
        f"Check mode: a real run would stop the cluster's own GPU clients on {NODE} for the driver work, "
        "started again afterwards: node label nvidia.com/gpu.present removed, so the pods of the GPU "
        f"DaemonSets leave: kube-system/{names['kube-system/nvidia-device-plugin-daemonset']}, "
        f"monitoring/{names['monitoring/dcgm-exporter']}."
    ) in text, check.stdout
    assert plugin and {k: p["metadata"]["uid"] for k, p in clients.pods().items()} == before
    assert clients.labels().get("nvidia.com/gpu.present") == "true"
    assert not clients.record.exists()


def test_stop_takes_only_the_gpu_daemonsets_off_and_a_later_run_puts_them_back(clients: Clients) -> None:
    before = clients.pods()
    stop = clients.run("stop-gpu-clients")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "nvidia.com/gpu.present" not in clients.labels()
    left = clients.pods()
    assert set(left) == {"kube-system/kube-proxy"}  # the other DaemonSet stays
    assert (
        left["kube-system/kube-proxy"]["metadata"]["uid"]
        == before["kube-system/kube-proxy"]["metadata"]["uid"]
    )
    # on the node, for a run after an interruption
    assert json.loads(clients.record.read_text()) == {
        "units": [],
        "node_label": GPU_LABEL,
        "daemonsets": ["kube-system/nvidia-device-plugin-daemonset", "monitoring/dcgm-exporter"],
    }
    # other GPU nodes keep theirs
    assert set(clients.pods("gpu-node-3")) == ALL_THREE

    # a separate run (the first one died): the record says what to put back
    start = clients.run("start-gpu-clients")
    assert start.returncode == 0, start.stdout + start.stderr
    assert clients.labels().get("nvidia.com/gpu.present") == "true"
    back = clients.pods()
    assert set(back) == ALL_THREE  # Running and Ready when the run ended
    assert (
        back["kube-system/nvidia-device-plugin-daemonset"]["metadata"]["uid"]
        != (before["kube-system/nvidia-device-plugin-daemonset"]["metadata"]["uid"])
    )
    assert not clients.record.exists()
    text = one_line(start.stdout)
    assert (
        f"Started again the cluster's own GPU clients on {NODE}: "
        "DaemonSet kube-system/nvidia-device-plugin-daemonset, DaemonSet monitoring/dcgm-exporter "
        "(node label nvidia.com/gpu.present back)."
    ) in text, start.stdout

    again = clients.run("start-gpu-clients")
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout
    assert "Started again" not in again.stdout


def test_driver_mismatch_plan_names_what_stops_meanwhile(clients: Clients) -> None:
    clients.site.fault(NODE, "kernel-version", "535.104.05")
    try:
        # in a PID namespace of its own, with its own /proc: the plan's scan for processes holding
        # /dev/nvidia* (module_utils/gpu_host.py) reads /proc, where this machine's may show a running lab's
        # GPU clients (its nodes' device plugins and dcgm-exporters): the plan would name them, and reboot
        command = clients.site.command(
            "driver-mismatch.yml",
            "-l", NODE,
            "-e", "plan_only=true",
            "-e", f"__nvidia_driver_admin_kubeconfig={clients.site.kubeconfig}",
        )  # fmt: skip
        plan = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", *command],
            cwd=ROOT,
            env=clients.site.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        clients.site.fault(NODE, "reset")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    names = {k: p["metadata"]["name"] for k, p in clients.pods().items()}
    text = one_line(plan.stdout)
    assert (
        "PLAN: reload the nvidia kernel modules (no GPU workload; stopped meanwhile and started again after, "
        "the GPU clients of the cluster: "
        f"pod kube-system/{names['kube-system/nvidia-device-plugin-daemonset']}, "
        f"pod monitoring/{names['monitoring/dcgm-exporter']})"
    ) in text, plan.stdout
    assert set(clients.pods()) == ALL_THREE and clients.labels().get("nvidia.com/gpu.present") == "true"
