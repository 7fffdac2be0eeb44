"""Issue 11's remediation playbooks on the lab (docs/runbook.md): each fault injected, found and fixed (or
planned) by its playbook, and restored afterwards whatever happens.

- restart-device-plugin.yml: the device plugin of gpu-node-3 loses its registration (`lab-fault NODE kube
  device-plugin-unregistered`): Ready with allocatable nvidia.com/gpu 0; --check names the pod and changes
  nothing; the run deletes that pod, the DaemonSet's new pod registers, the node offers 4 GPUs; a second run
  on the healthy cluster changes nothing.
- driver-mismatch.yml on gpu-node-2 (`lab-fault NODE kernel-version ...` with the driver's modules loaded as
  at boot), with the cluster's own GPU clients running as after site.yml: the GPU health agent (systemd) and
  the device plugin's and dcgm-exporter's pods, whose processes (the lab's device plugin and dcgm-exporter
  stand-in, through the fake NVML library) hold /dev/nvidiactl as the real ones do, so `modprobe -r nvidia`
  is refused under them as on a real node. With no other GPU process the plan is a module reload naming
  what stops meanwhile, and a real run does it: the agent stopped, the node out of the GPU node label (the
  DaemonSets' pods leave), the nvidia_driver role unloads the four modules and loads the installed driver's
  (the lab's modprobe and the nvidia-dkms stand-in, docs/lab.md "Kernel modules"), then the label is back,
  the agent runs again (a new process), new plugin and dcgm-exporter pods run Ready with their processes,
  the node offers its GPUs, no record is left; NVML works with the installed version and a second run
  changes nothing. With a process holding
  /dev/nvidia0 (`lab-fault NODE process --add --hold`) the plan is a rolling reboot naming it (pid, GPU
  device), and a real run goes the nvidia_driver role's reboot path, which on the lab (nvidia_driver_reboot:
  false) leaves /var/run/reboot-required instead of rebooting the container; the GPU clients are left
  running.
- collect-diagnostics.yml: one tarball with every item per node, the serving pods' logs and their endpoints,
  each asked from its pod's own node (a pod's own node is the only host the serving namespace's policies
  admit): every pod's answers (vLLM's /metrics and /health, the gateway's /debug/dump_state and /metrics),
  whichever node it runs on, index.json naming that node; the gateway's /health and /ready on the nodePort of
  its deployed Service, asked from the control plane. A serving pod on
  the control plane (the gateway's image running a few lines of Python) logs its command line and answers
  /debug/dump_state with its arguments, the lab's JWT secret and a join token among them: `kubectl logs`
  shows both, and the tarball has neither, its log and its dump_state collected with both redacted.

Needs a converged lab (make lab) whose lab-kube-fault is this checkout's (make lab-up copies it to the nodes).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shlex
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from labrun import (
    ADMIN_KUBECTL,
    ROOT,
    kube_json,
    on_node,
    playbook,
    podman,
    running_nodes,
    take_back_agent_cordons,
)

pytestmark = pytest.mark.lab

CONTROL_PLANE = "gpu-node-1"
PLUGIN_NODE = "gpu-node-3"
DRIVER_NODE = "gpu-node-2"
GPUS = 4
TOKEN = re.compile(r"[a-z0-9]{6}\.[a-z0-9]{16}")
JWT_SECRET = yaml.safe_load((ROOT / "inventories/lab/group_vars/k8s_cluster.yml").read_text())[
    "llm_gateway_jwt_secret"
]


def sh(node: str, command: str) -> str:
    proc = on_node(node, command)
    assert proc.returncode == 0, f"{node}: {command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def kubectl(*args: str) -> str:
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in args)
    return sh(CONTROL_PLANE, f"kubectl --kubeconfig /etc/kubernetes/admin.conf {quoted}")


def allocatable(node: str) -> str:
    return kube_json("get", "node", node)["status"]["allocatable"].get("nvidia.com/gpu", "absent")


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, every_s: float = 2) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def lab_fault(node: str, *args: str) -> None:
    proc = podman("exec", node, "fake-nvml", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr


KUBE_FAULT = "/usr/local/sbin/lab-kube-fault"  # tests/lab/kube/lab_kube_fault.py, as labctl.py installs it


def kube_fault(node: str, *args: str) -> None:
    proc = podman("exec", node, KUBE_FAULT, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def flat(text: str) -> str:
    """Output on one line, as the YAML callback's single-quoted strings read (`''` is `'`)."""
    return " ".join(text.replace("''", "'").split())


@pytest.fixture(scope="module", autouse=True)
def converged_lab() -> None:
    if not set(running_nodes()) >= {"gpu-node-1", "gpu-node-2", "gpu-node-3"}:
        pytest.skip("the lab is not running (make lab)")
    if on_node(CONTROL_PLANE, "test -e /etc/kubernetes/admin.conf").returncode != 0:
        pytest.fail("the lab has no cluster: converge it first (make lab)")
    # the Kubernetes faults this file injects are the checkout's (make lab-up copies them to every node)
    want = hashlib.sha256((ROOT / "tests/lab/kube/lab_kube_fault.py").read_bytes()).hexdigest()
    stale = [
        node
        for node in ("gpu-node-1", "gpu-node-2", "gpu-node-3")
        if on_node(node, f"sha256sum {KUBE_FAULT}").stdout.split()[:1] != [want]
    ]
    if stale:
        pytest.fail(
            f"{KUBE_FAULT} on {', '.join(stale)} is not this checkout's lab_kube_fault.py: make lab-up"
        )


# --------------------------------------------------------------------------------------- device plugin
def plugin_pods(node: str) -> list[dict[str, Any]]:
    pods = kube_json("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}")["items"]
    return [p for p in pods if any("k8s-device-plugin" in c["image"] for c in p["spec"]["containers"])]


# a new device plugin pod: started (its image is on the node), registered, and its GPUs in the Node's status
# (the kubelet posts it every 10 s)
PLUGIN_POD_START_S = 60


@pytest.fixture
def plugin_fault() -> Iterator[str]:
    assert allocatable(PLUGIN_NODE) == str(GPUS), "the lab must start with every GPU offered"
    kube_fault(PLUGIN_NODE, "device-plugin-unregistered")
    try:
        yield PLUGIN_NODE
    finally:
        kube_fault(PLUGIN_NODE, "clear", "device-plugin-unregistered")
        # a lost registration comes back only with a new plugin pod (the test's playbook run makes one; a
        # failed test leaves that to here, as on-call would)
        if allocatable(PLUGIN_NODE) != str(GPUS):
            for pod in plugin_pods(PLUGIN_NODE):
                kubectl("-n", pod["metadata"]["namespace"], "delete", "pod", pod["metadata"]["name"])
        wait_for(
            f"{PLUGIN_NODE} offering {GPUS} GPUs again",
            lambda: allocatable(PLUGIN_NODE) == str(GPUS),
            PLUGIN_POD_START_S,
        )


def test_device_plugin_fault_found_and_fixed(plugin_fault: str) -> None:
    node = plugin_fault
    wait_for(f"{node} offering 0 GPUs", lambda: allocatable(node) == "0", 40)
    # the fault is the real one: the pod keeps running, and only a new pod registers
    (before,) = plugin_pods(node)
    assert before["status"]["phase"] == "Running"

    check = playbook("playbooks/remediate/restart-device-plugin.yml", "--check")
    assert check.rc == 0, check.tail()
    assert f"offering too few GPUs: {node}" in flat(check.output), check.tail()
    assert f"would delete plugin pods: {before['metadata']['name']}" in flat(check.output), check.tail()
    assert [p["metadata"]["uid"] for p in plugin_pods(node)] == [before["metadata"]["uid"]]
    assert allocatable(node) == "0"

    run = playbook("playbooks/remediate/restart-device-plugin.yml")
    assert run.rc == 0, run.tail()
    assert f"deleted plugin pods: {before['metadata']['name']}" in flat(run.output), run.tail()
    assert f'"{node}": {GPUS}' in flat(run.output), run.tail()  # allocatable after the restart
    assert allocatable(node) == str(GPUS)
    assert [p["metadata"]["uid"] for p in plugin_pods(node)] != [before["metadata"]["uid"]]

    again = playbook("playbooks/remediate/restart-device-plugin.yml")
    assert again.rc == 0, again.tail()
    assert "offering too few GPUs: none (nothing to do)" in flat(again.output), again.tail()
    assert sum(again.changed().values()) == 0, again.changed_tasks()


# --------------------------------------------------------------------------------------- driver mismatch
def nvml_state(node: str) -> dict[str, Any]:
    return json.loads(sh(node, "fake-nvml show --json"))


NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")
MODULE_TABLE = "/run/lab-kmod/modules"  # the lab kernel's /proc/modules (docs/lab.md, "Kernel modules")

GPU_LABEL = yaml.safe_load((ROOT / "roles/nvidia_device_plugin/defaults/main.yml").read_text())[
    "nvidia_device_plugin_node_label"
]
CLIENTS_RECORD = yaml.safe_load((ROOT / "roles/nvidia_driver/vars/main.yml").read_text())[
    "__nvidia_driver_gpu_clients_record"
]
GPU_DAEMONSETS = {"kube-system/nvidia-device-plugin-daemonset", "monitoring/dcgm-exporter"}
# their pods' processes, named like the real binaries (/proc/PID/comm)
GPU_CLIENT_COMMS = {"nvidia-device-p", "dcgm-exporter"}


def gpu_client_pods(node: str) -> dict[str, dict[str, Any]]:
    """namespace/DaemonSet -> its pod on the node, Running and Ready, for the GPU DaemonSets"""
    found = {}
    for pod in kube_json("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}")["items"]:
        owner = (pod["metadata"].get("ownerReferences") or [{}])[0].get("name")
        key = f"{pod['metadata']['namespace']}/{owner}"
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod.get("status", {}).get("conditions", [])
        )
        if key in GPU_DAEMONSETS and ready and not pod["metadata"].get("deletionTimestamp"):
            found[key] = pod
    return found


def gpu_device_holders(node: str) -> set[str]:
    """comm of every process holding a /dev/nvidia* open on the node (what `modprobe -r nvidia` refuses)"""
    script = (
        "for fd in /proc/[0-9]*/fd/*; do case $(readlink $fd 2>/dev/null) in /dev/nvidia*) "
        "p=${fd#/proc/}; cat /proc/${p%%/*}/comm;; esac; done 2>/dev/null | sort -u"
    )
    return set(sh(node, script).split())


def agent_pid(node: str) -> int:
    return int(sh(node, "systemctl show -p MainPID --value gpu-health-agent").strip())


def loaded_modules(node: str) -> list[str]:
    return [line.split()[0] for line in sh(node, f"cat {MODULE_TABLE} 2>/dev/null || true").splitlines()]


def start_gpu_clients_as_after_boot(node: str) -> None:
    """On a server the driver's modules load at boot, before the cluster's GPU clients start, so each holds
    the driver's control device. A lab node converged without a reboot (the lab inventory's
    nvidia_driver_reboot) loads them only when a test does: clients started before that hold nothing (seen on
    a new lab: the test below timed out waiting for them, 2026-12-02). Those are started again, as the node's
    next boot would."""
    if gpu_device_holders(node) >= GPU_CLIENT_COMMS:
        return
    sh(node, "systemctl restart gpu-health-agent")
    for key, pod in gpu_client_pods(node).items():
        kubectl("-n", key.split("/")[0], "delete", "pod", pod["metadata"]["name"], "--wait=true")
    wait_for(
        "the GPU clients started again, Ready and holding the GPUs",
        lambda: set(gpu_client_pods(node)) == GPU_DAEMONSETS and gpu_device_holders(node) >= GPU_CLIENT_COMMS,
        PLUGIN_POD_START_S * 2,
    )


@pytest.fixture
def mismatch() -> Iterator[str]:
    node = DRIVER_NODE
    loaded = nvml_state(node)["kernel_module_version"]
    had_marker = on_node(node, "test -e /var/run/reboot-required").returncode == 0
    table = sh(node, f"cat {MODULE_TABLE} 2>/dev/null || true")
    # the driver's modules loaded as at boot (the nvidia-dkms stand-in lists them for the boot loader),
    # then the libraries move under them
    sh(node, "/usr/local/sbin/lab-modules-load")
    start_gpu_clients_as_after_boot(node)
    lab_fault(node, "kernel-version", "535.104.05")
    try:
        yield node
    finally:
        lab_fault(node, "process", "--gpu", "0", "--clear")
        lab_fault(node, "kernel-version", loaded)
        sh(node, f"printf %s {shlex.quote(table)} > {MODULE_TABLE}")
        if not had_marker:
            on_node(node, "rm -f /var/run/reboot-required")
        # a run that failed half-way may leave the cluster's own GPU clients stopped: back, as on-call would
        labels = kube_json("get", "node", node)["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in GPU_LABEL.items()):
            kubectl("label", "node", node, "--overwrite", *[f"{k}={v}" for k, v in GPU_LABEL.items()])
        sh(node, f"systemctl start gpu-health-agent && rm -f {CLIENTS_RECORD}")
        # the agent cordons the node for the NVML error the mismatch is while it lasts: taken back once it
        # sees the node healthy again (what the operator does after the fix), or the tests after this one find
        # it cordoned (2026-12-02: their pods were not scheduled)
        take_back_agent_cordons(timeout=60)
    assert "NVML init fails" not in sh(node, "fake-nvml show")


def test_driver_mismatch_repair_finishes_with_the_cluster_gpu_clients_running(mismatch: str) -> None:
    node = mismatch
    assert "Driver/library version mismatch" in on_node(node, "nvidia-smi").stdout
    assert set(loaded_modules(node)) >= set(NVIDIA_MODULES)
    library = sh(node, "sed -n 's/^version=//p' /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").strip()
    assert library and library != "535.104.05"

    # the cluster's own GPU clients run as after site.yml, and hold the GPUs: the kernel refuses the unload
    assert sh(node, "systemctl is-active gpu-health-agent").strip() == "active"
    agent_before = agent_pid(node)
    pods_before = gpu_client_pods(node)
    assert set(pods_before) == GPU_DAEMONSETS, pods_before.keys()
    wait_for(
        "the GPU clients' processes holding the GPUs",
        lambda: gpu_device_holders(node) >= GPU_CLIENT_COMMS,
        30,
    )
    refused = on_node(node, "modprobe -r nvidia_uvm && modprobe -r nvidia")
    assert refused.returncode != 0 and "Module nvidia is in use" in refused.stderr, refused
    sh(node, "modprobe nvidia_uvm")

    plan = playbook("playbooks/remediate/driver-mismatch.yml", "-l", node, "-e", "plan_only=true")
    assert plan.rc == 0, plan.tail()
    clients = ", ".join(
        ["unit gpu-health-agent.service"]
        + [f"pod {key.split('/')[0]}/{pods_before[key]['metadata']['name']}" for key in sorted(pods_before)]
    )
    assert (
        "PLAN: reload the nvidia kernel modules (no GPU workload; stopped meanwhile and started again after, "
        f"the GPU clients of the cluster: {clients})"
    ) in flat(plan.output), plan.tail()
    assert plan.changed() == {node: 0}

    # a real run stops them, reloads the modules, and brings them back
    fix = playbook("playbooks/remediate/driver-mismatch.yml", "-l", node)
    assert fix.rc == 0, fix.tail()
    out = flat(fix.output)
    assert f"Stopping the cluster's own GPU clients on {node} for the driver work" in out, fix.tail()
    assert "reloaded the nvidia kernel modules" in out, fix.tail()
    assert f"works: driver {library}, {GPUS} GPU(s)" in out, fix.tail()
    assert (
        "stopped and started again: unit gpu-health-agent.service, "
        "DaemonSet kube-system/nvidia-device-plugin-daemonset, DaemonSet monitoring/dcgm-exporter"
    ) in out, fix.tail()
    for module in NVIDIA_MODULES:  # each one unloaded and loaded again
        assert f"changed: [{node}] => (item={module})" in fix.output, fix.tail()
    assert set(loaded_modules(node)) >= set(NVIDIA_MODULES)
    assert nvml_state(node)["kernel_module_version"] == library
    smi = on_node(node, "nvidia-smi")
    assert smi.returncode == 0 and "mismatch" not in smi.stdout and library in smi.stdout, smi.stdout

    # back: the label, the agent (a new process), new Ready pods whose processes hold the GPUs again
    labels = kube_json("get", "node", node)["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in GPU_LABEL.items()), labels
    assert sh(node, "systemctl is-active gpu-health-agent").strip() == "active"
    assert agent_pid(node) not in (0, agent_before)
    pods_after = gpu_client_pods(node)
    assert set(pods_after) == GPU_DAEMONSETS
    assert all(pods_after[k]["metadata"]["uid"] != pods_before[k]["metadata"]["uid"] for k in GPU_DAEMONSETS)
    wait_for(f"{node} offering its {GPUS} GPUs again", lambda: allocatable(node) == str(GPUS), 30)
    wait_for("the GPU clients' processes back", lambda: gpu_device_holders(node) >= GPU_CLIENT_COMMS, 30)
    assert on_node(node, f"test -e {CLIENTS_RECORD}").returncode != 0  # nothing left to put back

    again = playbook("playbooks/remediate/driver-mismatch.yml", "-l", node)
    assert again.rc == 0, again.tail()
    assert "PLAN: nothing (no mismatch)" in flat(again.output), again.tail()
    assert again.changed() == {node: 0}, again.changed_tasks()


def test_driver_mismatch_rolling_reboot_when_busy(mismatch: str) -> None:
    node = mismatch
    agent_before = agent_pid(node)
    pods_before = gpu_client_pods(node)

    # busy: a process that is none of the cluster's own GPU clients holds a GPU
    lab_fault(node, "process", "--gpu", "0", "--add", "--hold", "--name", "vllm-worker")
    holder = next(p for p in nvml_state(node)["gpus"][0]["processes"] if p.get("holder"))
    busy = playbook("playbooks/remediate/driver-mismatch.yml", "-l", node, "-e", "plan_only=true")
    assert busy.rc == 0, busy.tail()
    # named with its pid and the GPU device it holds (and the cgroup it runs in, where it has one)
    plan = (
        "PLAN: reboot (rolling, one node at a time): processes use the GPUs "
        f"(vllm-worker[{holder['pid']}] on /dev/nvidia0"
    )
    assert plan in flat(busy.output), busy.tail()
    refused = on_node(node, "modprobe -r nvidia_uvm && modprobe -r nvidia")
    assert refused.returncode != 0 and "Module nvidia is in use" in refused.stderr, refused
    sh(node, "modprobe nvidia_uvm")

    # a real run takes the nvidia_driver role's reboot path; the lab's nvidia_driver_reboot: false stops it
    # at the marker instead of rebooting the container
    run = playbook("playbooks/remediate/driver-mismatch.yml", "-l", node)
    assert run.rc == 0, run.tail()
    assert "reboot deferred: /var/run/reboot-required set" in flat(run.output), run.tail()
    assert "driver/library version mismatch and GPUs in use (vllm-worker[" in flat(run.output), run.tail()
    assert on_node(node, "test -e /var/run/reboot-required").returncode == 0
    assert "Driver/library version mismatch" in on_node(node, "nvidia-smi").stdout  # nothing was reloaded
    # a refused reload leaves the cluster's own GPU clients alone
    assert agent_pid(node) == agent_before
    assert {k: p["metadata"]["uid"] for k, p in gpu_client_pods(node).items()} == {
        k: p["metadata"]["uid"] for k, p in pods_before.items()
    }


# --------------------------------------------------------------------------------------- diagnostics
# A pod scheduled, its image pulled from the lab's registry, started, its readiness probe passing
POD_START_S = 120
# The leaky pod's program: prints its command line (secrets included, as a server started with --api-key
# would log it), and answers like the gateway: /health on its http port, /debug/dump_state (its arguments,
# secrets included, as a state dump of its configuration would) and /metrics on its metrics port.
LEAKY_SERVER = (
    "import http.server, json, sys, threading\n"
    "print('command line: ' + ' '.join(sys.argv[1:]), flush=True)\n"
    "ANSWERS = {'/health': 'ok', '/debug/dump_state': json.dumps({'argv': sys.argv[1:]}),\n"
    "           '/metrics': 'leaky_requests_total 0'}\n"
    "class Answer(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = ANSWERS.get(self.path)\n"
    "        self.send_response(200 if body else 404)\n"
    "        self.end_headers()\n"
    "        self.wfile.write((body or '').encode())\n"
    "    def log_message(self, *args):\n"
    "        pass\n"
    "http_port, metrics_port = (http.server.ThreadingHTTPServer(('', p), Answer) for p in (8000, 9000))\n"
    "threading.Thread(target=http_port.serve_forever, daemon=True).start()\n"
    "metrics_port.serve_forever()\n"
)


@pytest.fixture
def leaky_pod() -> Iterator[tuple[str, str]]:
    """A pod in the serving namespace that logs its command line and dumps its arguments, secrets included;
    on the control plane (collect-diagnostics asks its endpoints from there, its own node: a pod's own node is
    always admitted by the NetworkPolicies, the serving namespace's default deny admits nothing else). It runs
    the gateway's image (python3; the lab's registry serves it), as the gateway runs it. Deleted afterwards.
    """
    token = "k3tq9z." + hashlib.sha256(str(time.time()).encode()).hexdigest()[:16]
    gateway = kube_json("get", "deployment", "-n", "serving", "llm-gateway")["spec"]["template"]["spec"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "diag-leaky", "namespace": "serving"},
        "spec": {
            "nodeName": CONTROL_PLANE,
            "securityContext": gateway["securityContext"],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "server",
                    "image": gateway["containers"][0]["image"],
                    "command": ["python3", "-c", LEAKY_SERVER],
                    "args": ["serve", "--jwt-secret", JWT_SECRET, "--join", token],
                    "securityContext": gateway["containers"][0]["securityContext"],
                    # shaped like the gateway: its internal app (dump_state, metrics) on a port of its own
                    "ports": [
                        {"name": "http", "containerPort": 8000},
                        {"name": "metrics", "containerPort": 9000},
                    ],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 2},
                }
            ],
        },
    }
    sh(
        CONTROL_PLANE,
        # printf, not echo: the node's sh (dash) echo turns the JSON's \n escapes into newlines, which the
        # YAML parser then folds into spaces, and the server's script became one line (a SyntaxError)
        f"printf '%s' {shlex.quote(json.dumps(pod))} | {ADMIN_KUBECTL} create -f -",
    )
    try:
        kubectl(
            "wait", "--for=condition=Ready", "-n", "serving", "pod/diag-leaky", f"--timeout={POD_START_S}s"
        )
        yield "diag-leaky", token
    finally:
        on_node(
            CONTROL_PLANE, "kubectl --kubeconfig /etc/kubernetes/admin.conf -n serving delete pod diag-leaky"
        )


def test_collect_diagnostics_every_item_no_secret(leaky_pod: tuple[str, str], tmp_path: Path) -> None:
    pod, token = leaky_pod
    raw = kubectl("logs", "-n", "serving", pod)
    assert JWT_SECRET in raw and token in raw, (
        "the pod's log must carry the secrets for this test to mean anything"
    )

    run = playbook("playbooks/remediate/collect-diagnostics.yml", "-e", f"diagnostics_dir={tmp_path}")
    assert run.rc == 0, run.tail()
    (tarball,) = tmp_path.glob("diagnostics-*.tar.gz")
    assert re.fullmatch(r"diagnostics-\d{8}T\d{6}Z\.tar\.gz", tarball.name)
    assert tarball.stat().st_mode & 0o077 == 0
    files: dict[str, str] = {}
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            if member.isfile():
                handle = tar.extractfile(member)
                assert handle is not None
                files[member.name] = io.TextIOWrapper(handle, encoding="utf-8", errors="replace").read()

    def one(suffix: str) -> str:
        found = [name for name in files if name.endswith(suffix)]
        assert len(found) == 1, f"{suffix}: {found} among {sorted(files)}"
        return files[found[0]]

    for node in ("gpu-node-1", "gpu-node-2", "gpu-node-3"):
        assert "Driver Version" in one(f"nodes/{node}/nvidia-smi-q.txt")
        assert json.loads(one(f"nodes/{node}/gpu_facts.json"))["nvidia"]["gpu_count"] == GPUS
        one(
            f"nodes/{node}/dmesg-xid.txt"
        )  # the lab's containers may not read the kernel log: then an ERROR line
        one(f"nodes/{node}/kubelet.journal.txt")
        one(f"nodes/{node}/containerd.journal.txt")
    log = one(f"pods/serving_{pod}_server.log")
    assert "command line: serve --jwt-secret <redacted:secret> --join <redacted:bootstrap-token>" in log
    index = json.loads(one("index.json"))
    items = {i["file"]: i for i in index["items"]}

    # The serving namespace's NetworkPolicies admit a pod's own node and, besides, the gateway's http port
    # only (Prometheus on the rest; from another node kube-router REJECTs), so each pod's endpoints are asked
    # from the node it runs on: every pod answers, wherever it runs, and index.json names that node.
    def collected(name: str, endpoint: str, node: str, *expected: str) -> None:
        text, item = one(f"http/{name}_{endpoint}.txt"), items[f"{name}_{endpoint}.txt"]
        assert item["ok"] and not text.startswith("ERROR"), (item, text[:300])
        assert item["node"] == node, (name, endpoint, item)
        for part in expected:
            assert part in text, (name, endpoint, part, text[:600])

    # the leaky pod: its internal app asked on its metrics port; its arguments there, scrubbed
    collected(pod, "dump_state", CONTROL_PLANE, "<redacted:secret>", "<redacted:bootstrap-token>")
    collected(pod, "metrics", CONTROL_PLANE, "leaky_requests_total")
    assert items[f"{pod}_dump_state.txt"]["source"].endswith(":9000/debug/dump_state"), items
    # each vLLM pod (one port, no /debug/dump_state): /metrics and /health on its http port
    vllm = kube_json("get", "pods", "-n", "serving", "-l", "app.kubernetes.io/name=vllm")["items"]
    assert vllm, "the serving stage's vLLM pods are where the diagnostics look"
    for item in vllm:
        name, node = item["metadata"]["name"], item["spec"]["nodeName"]
        collected(name, "metrics", node, "vllm:num_requests_waiting", "vllm:request_success_total")
        collected(name, "health", node)
        assert items[f"{name}_health.txt"]["source"].endswith(":8000/health"), items
        assert not [n for n in files if n.endswith(f"http/{name}_dump_state.txt")], f"{name}: no dump_state"
    # each gateway pod: its internal app on its metrics port (the upstreams it routes to, its metrics)
    gateways = kube_json("get", "pods", "-n", "serving", "-l", "app.kubernetes.io/name=llm-gateway")["items"]
    assert gateways, "the serving stage's gateway pods are where the diagnostics look"
    for item in gateways:
        name, node = item["metadata"]["name"], item["spec"]["nodeName"]
        collected(name, "dump_state", node, '"upstreams"')
        collected(name, "metrics", node, "llm_gateway_upstream_weight")
    # the gateway's /health and /ready as clients reach them: the deployed Service's nodePort (the lab's
    # inventory sets none), asked from the control plane on its node_ip
    (node_port,) = [
        p["nodePort"] for p in kube_json("get", "service", "-n", "serving", "llm-gateway")["spec"]["ports"]
    ]
    inventory = yaml.safe_load((ROOT / "inventories/lab/hosts.yml").read_text())["all"]["children"]
    node_ip = inventory["k8s_cluster"]["children"]["control_plane"]["hosts"][CONTROL_PLANE]["node_ip"]
    for path in ("health", "ready"):
        item = items[f"nodeport-{node_port}_{path}.txt"]
        assert item["ok"] and item["node"] == CONTROL_PLANE, item
        assert item["source"] == f"http://{node_ip}:{node_port}/{path}", item
        assert not one(f"http/nodeport-{node_port}_{path}.txt").startswith("ERROR"), item
    assert set(items) >= {
        "nvidia-smi-q.txt",
        "gpu_facts.json",
        "dmesg-xid.txt",
        "kubelet.journal.txt",
        "containerd.journal.txt",
        "kubernetes-nodes.json",
        f"serving_{pod}_server.log",
    }
    # what could not be collected is in the tarball as such, with the error
    for item in index["items"]:
        assert item["ok"] or item["error"], item
    for name, text in files.items():
        assert JWT_SECRET not in text, f"the JWT secret is in {name}"
        assert token not in text, f"the leaky pod's join token is in {name}"
        assert not TOKEN.search(text), f"a join token is in {name}"  # not printed: it may be real
