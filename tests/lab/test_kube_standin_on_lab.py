"""The lab's Kubernetes stand-ins on the running lab: kubeadm, kubelet, kube-proxy, ipvsadm, faults.

    flock /tmp/lab.lock .venv/bin/pytest tests/lab/test_kube_standin_on_lab.py -m lab -v

On bare lab nodes (no cluster yet) it installs kubeadm, kubelet and kubectl 1.36.3-1.1 from the lab
mirror's pkgs.k8s.io stand-in with apt (a temporary source list), checks `kubeadm config validate`,
runs `kubeadm init` on gpu-node-1 and `kubeadm join` (with a token from `kubeadm token create
--print-join-command`) on the workers, then judges the cluster with the REAL kubectl 1.36.3 from this
host over https://10.89.42.11:6443, applies the pinned upstream device plugin manifest and injects
each fault of `scripts/lab-fault NODE kube ...`. It ends with `kubeadm reset -f` everywhere and removes
what it installed, so other lab tests see bare nodes again (also after a failure half-way).

When a cluster already runs on the lab (the Kubernetes stage converged it, as `make lab` does), the test
leaves it standing: it installs, initialises, joins and resets nothing, judges that cluster instead (its
device plugin already applied, its control-plane taint as the stage chose), injects and clears the faults,
and checks `kubeadm reset --dry-run` in place of a reset. Skipped only when the lab is not running.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from upstream_manifests import manifest

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "lab" / "kube"))
import fetch_kubectl  # noqa: E402 - beside the stand-in package, not an installed module

NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
CONTROL_PLANE, WORKERS = NODES[0], NODES[1:]
API = "https://10.89.42.11:6443"
VERSION = "1.36.3-1.1"
APT_LIST = "/etc/apt/sources.list.d/lab-kube-standin-test.list"
REPO_LINE = "deb [trusted=yes] http://lab-mirror:8080/kubernetes/v1.36/deb/ /"
APT_CACHED = "/var/cache/apt/archives/kube*.deb /var/cache/apt/archives/cri-tools_*.deb"
DEVICE_PLUGIN = "k8s-device-plugin/v0.20.0/nvidia-device-plugin.yml"  # upstream_manifests.py
GPUS_PER_NODE = "4"

GOOD_CONFIG = """\
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: 10.89.42.11
  bindPort: 6443
nodeRegistration:
  name: gpu-node-1
  criSocket: unix:///run/containerd/containerd.sock
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.36.3
networking:
  podSubnet: 10.244.0.0/16
  serviceSubnet: 10.96.0.0/12
apiServer:
  certSANs: [10.89.42.11]
  extraArgs:
    - {name: audit-policy-file, value: /etc/kubernetes/audit/policy.yaml}
    - {name: audit-log-path, value: /var/log/kubernetes/audit/audit.log}
    - {name: audit-log-maxbackup, value: "10"}
  extraVolumes:
    - name: audit
      hostPath: /etc/kubernetes/audit
      mountPath: /etc/kubernetes/audit
      readOnly: true
      pathType: DirectoryOrCreate
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ipvs
ipvs:
  scheduler: rr
  strictARP: true
"""


def podman(*args: str, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    env.setdefault("CONTAINERS_CONF", str(ROOT / "tests" / "lab" / "containers.conf"))
    return subprocess.run(
        ["podman", *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout
    )


def sh(
    node: str, script: str, stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return podman("exec", "-i", node, "bash", "-c", script, stdin=stdin, timeout=timeout)


def ok(node: str, script: str, stdin: str | None = None) -> str:
    result = sh(node, script, stdin)
    assert result.returncode == 0, (
        f"{node}: {script!r} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


def lab_fault(node: str, *args: str) -> None:
    env = {**os.environ, "CONTAINERS_CONF": str(ROOT / "tests" / "lab" / "containers.conf")}
    result = subprocess.run(
        [str(ROOT / "scripts" / "lab-fault"), node, "kube", *args], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float = 60, every_s: float = 1) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")


class Kubectl:
    def __init__(self, binary: Path, kubeconfig: Path, owned: bool) -> None:
        self.base = [str(binary), "--kubeconfig", str(kubeconfig), "--request-timeout", "20s"]
        self.owned = owned  # True: this test made the cluster (and resets it); False: the stage's cluster

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=120)
        if check:
            assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["metadata"]["name"]: n for n in self.json("get", "nodes")["items"]}


def ready(node: dict[str, Any]) -> str:
    for condition in node.get("status", {}).get("conditions", []):
        if condition["type"] == "Ready":
            return condition["status"]
    return "Unknown"


def gpus(node: dict[str, Any]) -> str | None:
    return node.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu")


def lab_running() -> bool:
    try:
        names = podman("ps", "--format", "{{.Names}}", timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return False
    return all(n in names for n in (*NODES, "lab-mirror"))


def reset_everything(installed: set[str]) -> None:
    """Workers first, then the control plane; then what the test installed. Never raises."""
    for node in (*WORKERS, CONTROL_PLANE):
        sh(
            node,
            "command -v kubeadm >/dev/null && kubeadm reset -f; ipvsadm --clear; rm -f "
            "/run/kube-standin/faults.json",
        )
        if node in installed:
            sh(
                node,
                "systemctl disable --now kubelet >/dev/null 2>&1; "
                "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q kubeadm kubelet kubectl "
                "kubernetes-cni cri-tools; "
                f"rm -f {APT_LIST} {APT_CACHED}; "
                "rm -rf /etc/kubernetes /var/lib/kubelet /usr/lib/kube-standin",
            )


def stale_stand_ins() -> list[str]:
    """node:tool pairs whose installed stand-in sources differ from this checkout's."""
    source = ROOT / "tests" / "lab" / "kube" / "kube_standin"
    want = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in source.glob("*.py")}
    stale = []
    for node in NODES:
        for tool in ("kubeadm", "kubelet"):
            listing = sh(
                node, f"cd /usr/lib/kube-standin/{tool}/kube_standin 2>/dev/null && sha256sum *.py"
            ).stdout
            have = {name: digest for digest, name in (line.split() for line in listing.splitlines())}
            if have != want:
                stale.append(f"{node}:{tool}")
    return stale


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    if not lab_running():
        pytest.skip("the lab is not running (make lab-up)")
    kubectl_binary = fetch_kubectl.fetch()
    if sh(CONTROL_PLANE, "test -e /etc/kubernetes/admin.conf").returncode == 0:
        stale = stale_stand_ins()
        if stale:
            pytest.fail(
                "the stage's cluster runs kubeadm/kubelet stand-ins older than this checkout (the mirror "
                f"rebuilt them under the same version {VERSION}): {', '.join(stale)}; reinstall them on the "
                "nodes "
                "(apt-get install --reinstall kubeadm kubelet, then restart kubelet) or recreate the lab"
            )
        kubeconfig = tmp_path_factory.mktemp("kube") / "admin.conf"
        kubeconfig.write_text(ok(CONTROL_PLANE, "cat /etc/kubernetes/admin.conf"))
        kubeconfig.chmod(0o600)
        try:
            yield Kubectl(kubectl_binary, kubeconfig, owned=False)
        finally:
            for node in NODES:  # the faults only; the stage's cluster stays
                sh(node, "rm -f /run/kube-standin/faults.json")
        return
    installed: set[str] = set()
    try:
        for node in NODES:
            if sh(node, "dpkg -s kubeadm >/dev/null 2>&1").returncode != 0:
                installed.add(node)
                ok(
                    node,
                    # the lab rebuilds stand-ins under the same version: no stale .deb from apt's cache
                    f"rm -f {APT_CACHED} && echo '{REPO_LINE}' > {APT_LIST} && "
                    f"apt-get update -q -o Dir::Etc::sourcelist={APT_LIST} -o Dir::Etc::sourceparts=- "
                    "-o APT::Get::List-Cleanup=0 >/dev/null && "
                    "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
                    f"kubeadm={VERSION} kubelet={VERSION} kubectl={VERSION} >/dev/null",
                )
            assert ok(node, "kubeadm version -o short").strip() == "v1.36.3"
            assert (
                ok(
                    node,
                    "kubectl version --client -o json | python3 -c 'import json,sys; "
                    'print(json.load(sys.stdin)["clientVersion"]["gitVersion"])\'',
                ).strip()
                == "v1.36.3"
            )
        ok(CONTROL_PLANE, "cat > /root/kubeadm.yaml", GOOD_CONFIG)
        # no containerd on bare lab nodes: the CRI check is the one preflight error this test ignores
        ignore = "" if sh(CONTROL_PLANE, "test -S /run/containerd/containerd.sock").returncode == 0 else "CRI"
        flag = f" --ignore-preflight-errors={ignore}" if ignore else ""
        init = sh(CONTROL_PLANE, f"kubeadm init --config /root/kubeadm.yaml{flag}", timeout=240)
        assert init.returncode == 0, f"kubeadm init failed:\n{init.stdout}\n{init.stderr}"
        assert "Your Kubernetes control-plane has initialized successfully!" in init.stdout
        join = ok(CONTROL_PLANE, "kubeadm token create --print-join-command").strip()
        assert join.startswith("kubeadm join 10.89.42.11:6443 --token ")
        for node in WORKERS:
            result = sh(node, join + flag, timeout=240)
            assert result.returncode == 0, f"{node}: kubeadm join failed:\n{result.stdout}\n{result.stderr}"
        kubeconfig = tmp_path_factory.mktemp("kube") / "admin.conf"
        kubeconfig.write_text(ok(CONTROL_PLANE, "cat /etc/kubernetes/admin.conf"))
        kubeconfig.chmod(0o600)
        yield Kubectl(kubectl_binary, kubeconfig, owned=True)
    finally:
        reset_everything(installed)


def test_config_validate_is_strict(cluster: Kubectl) -> None:
    ok(CONTROL_PLANE, "cat > /root/good.yaml", GOOD_CONFIG)
    assert ok(CONTROL_PLANE, "kubeadm config validate --config /root/good.yaml").strip() == "ok"
    unknown = GOOD_CONFIG.replace("cgroupDriver: systemd", "cgroupDriver: systemd\ncgroupDrivr: systemd")
    ok(CONTROL_PLANE, "cat > /root/unknown.yaml", unknown)
    result = sh(CONTROL_PLANE, "kubeadm config validate --config /root/unknown.yaml")
    assert result.returncode == 1
    assert 'unknown field "cgroupDrivr"' in result.stderr
    wrong = GOOD_CONFIG.replace("bindPort: 6443", 'bindPort: "6443"')
    ok(CONTROL_PLANE, "cat > /root/wrong.yaml", wrong)
    result = sh(CONTROL_PLANE, "kubeadm config validate --config /root/wrong.yaml")
    assert result.returncode == 1
    assert "cannot unmarshal string" in result.stderr and "bindPort of type int32" in result.stderr
    # v1beta3's map-shaped extraArgs is a type error in v1beta4
    old = GOOD_CONFIG.replace(
        "  extraArgs:\n    - {name: audit-policy-file, value: /etc/kubernetes/audit/policy.yaml}",
        "  extraArgs:\n    audit-policy-file: /etc/kubernetes/audit/policy.yaml\n  extraArgsX:",
    )
    ok(CONTROL_PLANE, "cat > /root/old.yaml", old)
    assert sh(CONTROL_PLANE, "kubeadm config validate --config /root/old.yaml").returncode == 1
    # a second init on an initialised node is refused by preflight
    again = sh(CONTROL_PLANE, "kubeadm init --config /root/good.yaml --ignore-preflight-errors=CRI")
    assert (
        again.returncode == 1
        and "FileAvailable--etc-kubernetes-manifests-kube-apiserver.yaml" in again.stderr
    )
    again = sh(
        WORKERS[0],
        "kubeadm join 10.89.42.11:6443 --token abcdef.0123456789abcdef "
        "--discovery-token-unsafe-skip-ca-verification --ignore-preflight-errors=CRI",
    )
    assert again.returncode == 1 and "FileAvailable--etc-kubernetes-kubelet.conf" in again.stderr


def test_control_plane_files(cluster: Kubectl) -> None:
    """The static Pod manifest carries the ClusterConfiguration's apiServer extras (the audit flags) as
    kubeadm renders them; the PKI's SANs and identities are kubeadm's."""
    stored = cluster.json("get", "configmap", "kubeadm-config", "-n", "kube-system")["data"]
    config = yaml.safe_load(stored["ClusterConfiguration"])
    api = config.get("apiServer") or {}
    manifest = ok(CONTROL_PLANE, "cat /etc/kubernetes/manifests/kube-apiserver.yaml")
    assert any(a["name"] == "audit-policy-file" for a in api.get("extraArgs") or [])
    for arg in api.get("extraArgs") or []:
        assert f"--{arg['name']}={arg['value']}" in manifest
    for volume in api.get("extraVolumes") or []:
        assert f"mountPath: {volume['mountPath']}" in manifest
    service_ip = str(ipaddress.ip_network(config["networking"]["serviceSubnet"]).network_address + 1)
    sans = ok(CONTROL_PLANE, "openssl x509 -in /etc/kubernetes/pki/apiserver.crt -noout -ext subjectAltName")
    assert (
        f"IP Address:{service_ip}" in sans
        and "IP Address:10.89.42.11" in sans
        and "DNS:kubernetes.default.svc" in sans
    )
    subject = ok(
        CONTROL_PLANE,
        "grep client-certificate-data /etc/kubernetes/super-admin.conf | awk '{print $2}' "
        "| base64 -d | openssl x509 -noout -subject",
    )
    assert "O = system:masters" in subject
    for node in WORKERS:  # TLS bootstrap: the worker's kubelet holds a certificate the CA signed
        subject = ok(node, "openssl x509 -in /var/lib/kubelet/pki/kubelet-client-current.pem -noout -subject")
        assert f"CN = system:node:{node}" in subject and "O = system:nodes" in subject
        assert sh(node, "test -e /etc/kubernetes/bootstrap-kubelet.conf").returncode != 0


def test_three_nodes_ready(cluster: Kubectl) -> None:
    nodes = wait_for(
        "three Ready nodes",
        lambda: (n := cluster.nodes()) and len(n) == 3 and all(ready(x) == "True" for x in n.values()) and n,
    )
    assert sorted(nodes) == sorted(NODES)
    cp = nodes[CONTROL_PLANE]
    assert "node-role.kubernetes.io/control-plane" in cp["metadata"]["labels"]
    if cluster.owned:  # kubeadm's default taint (the stage removes it by default)
        assert {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"} in cp["spec"][
            "taints"
        ]
    for name, node in nodes.items():
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses["InternalIP"] == f"10.89.42.1{NODES.index(name) + 1}"
        assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.3"
        if cluster.owned:
            assert gpus(node) is None  # no device plugin yet: the kubelet knows no GPUs
    leases = cluster.json("get", "leases", "-n", "kube-node-lease")["items"]
    assert sorted(lease["metadata"]["name"] for lease in leases) == sorted(NODES)
    # what kubeadm init created, judged by kubectl
    for ns, kind, name in (
        ("kube-system", "configmap", "kubeadm-config"),
        ("kube-system", "configmap", "kubelet-config"),
        ("kube-system", "configmap", "kube-proxy"),
        ("kube-system", "daemonset", "kube-proxy"),
        ("kube-system", "deployment", "coredns"),
        ("kube-system", "service", "kube-dns"),
        ("kube-public", "configmap", "cluster-info"),
        ("default", "service", "kubernetes"),
    ):
        cluster.run("get", kind, name, "-n", ns)
    assert (
        cluster.json("get", "service", "kube-dns", "-n", "kube-system")["spec"]["clusterIP"] == "10.96.0.10"
    )
    wait_for(
        "CoreDNS available",
        lambda: (
            cluster.json("get", "deployment", "coredns", "-n", "kube-system")
            .get("status", {})
            .get("availableReplicas")
            == 2
        ),
    )


def test_kube_proxy_ipvs(cluster: Kubectl) -> None:
    for node in NODES:
        mode = wait_for(
            f"kube-proxy /proxyMode on {node}",
            lambda n=node: sh(n, "curl -sf http://127.0.0.1:10249/proxyMode").stdout.strip(),
        )
        assert mode == "ipvs"
        listing = wait_for(
            f"the kubernetes service in ipvsadm -Ln on {node}",
            lambda n=node: (out := ok(n, "ipvsadm -Ln")) and "10.96.0.1:443" in out and out,
        )
        assert listing.startswith("IP Virtual Server version")
        lines = listing.splitlines()
        service = next(i for i, line in enumerate(lines) if line.split()[:2] == ["TCP", "10.96.0.1:443"])
        assert lines[service + 1].split()[:3] == ["->", "10.89.42.11:6443", "Masq"]


def apply_device_plugin(cluster: Kubectl) -> None:
    cluster.run("apply", "-f", str(manifest(DEVICE_PLUGIN)))
    # the control-plane taint keeps the plugin (which tolerates only nvidia.com/gpu) off gpu-node-1
    wait_for("4 GPUs on the workers", lambda: all(gpus(cluster.nodes()[n]) == GPUS_PER_NODE for n in WORKERS))
    time.sleep(3)
    assert gpus(cluster.nodes()[CONTROL_PLANE]) is None
    cluster.run("taint", "node", CONTROL_PLANE, "node-role.kubernetes.io/control-plane:NoSchedule-")
    wait_for("4 GPUs on every node", lambda: all(gpus(n) == GPUS_PER_NODE for n in cluster.nodes().values()))


def test_device_plugin_makes_gpus_allocatable(cluster: Kubectl) -> None:
    if cluster.owned:
        apply_device_plugin(cluster)
    else:  # the stage applied the plugin and verified the GPUs; they are still offered
        wait_for(
            "4 GPUs on every node", lambda: all(gpus(n) == GPUS_PER_NODE for n in cluster.nodes().values())
        )
    # a GPU that fell off the bus is not offered
    ok(WORKERS[1], "fake-nvml gpu --gpu 3 --lost")
    try:
        wait_for("3 GPUs on gpu-node-3", lambda: gpus(cluster.nodes()[WORKERS[1]]) == "3")
    finally:
        ok(WORKERS[1], "fake-nvml gpu --gpu 3 --restore")
    wait_for("4 GPUs on gpu-node-3 again", lambda: gpus(cluster.nodes()[WORKERS[1]]) == GPUS_PER_NODE)


def test_fault_not_ready(cluster: Kubectl) -> None:
    node = WORKERS[0]
    lab_fault(node, "not-ready")
    try:
        wait_for(f"{node} NotReady", lambda: ready(cluster.nodes()[node]) == "False", 30)
        # kubectl's STATUS column: "NotReady", or "NotReady,SchedulingDisabled" on a cordoned node
        table = cluster.run("get", "nodes").stdout
        rows = {row.split()[0]: row.split()[1].split(",") for row in table.splitlines()[1:] if row.strip()}
        assert "NotReady" in rows[node], table
    finally:
        lab_fault(node, "clear", "not-ready")
    wait_for(f"{node} Ready again", lambda: ready(cluster.nodes()[node]) == "True", 30)


def test_fault_stop_heartbeat(cluster: Kubectl) -> None:
    """A hung kubelet: no status, no Lease; the node lifecycle controller turns the Node Unknown."""
    node = WORKERS[0]
    lab_fault(node, "stop-heartbeat")
    try:
        wait_for(f"{node} Unknown", lambda: ready(cluster.nodes()[node]) == "Unknown", 90, 3)
    finally:
        lab_fault(node, "clear", "stop-heartbeat")
    wait_for(f"{node} Ready again", lambda: ready(cluster.nodes()[node]) == "True", 30)


def test_fault_device_plugin_unregistered(cluster: Kubectl) -> None:
    node = WORKERS[1]
    lab_fault(node, "device-plugin-unregistered")
    try:
        wait_for(f"{node} offering 0 GPUs", lambda: gpus(cluster.nodes()[node]) == "0", 30)
        assert ready(cluster.nodes()[node]) == "True"  # the article's trap: Ready, yet no GPUs
        pods = cluster.json(
            "get",
            "pods",
            "-n",
            "kube-system",
            "-l",
            "name=nvidia-device-plugin-ds",
            "--field-selector",
            f"spec.nodeName={node}",
        )["items"]
        assert pods and pods[0]["status"]["phase"] == "Running"
    finally:
        lab_fault(node, "clear", "device-plugin-unregistered")
    wait_for(f"{node} offering 4 GPUs again", lambda: gpus(cluster.nodes()[node]) == GPUS_PER_NODE, 30)


def test_fault_crashloop(cluster: Kubectl) -> None:
    node = WORKERS[0]
    pods = cluster.json(
        "get",
        "pods",
        "-n",
        "kube-system",
        "-l",
        "k8s-app=kube-proxy",
        "--field-selector",
        f"spec.nodeName={node}",
    )["items"]
    name = pods[0]["metadata"]["name"]

    def status() -> dict[str, Any]:
        return cluster.json("get", "pod", name, "-n", "kube-system")["status"]["containerStatuses"][0]

    lab_fault(node, "crashloop", "--pod", name, "--namespace", "kube-system")
    try:
        crashed = wait_for(
            f"{name} in CrashLoopBackOff with a restart",
            lambda: (
                (s := status()).get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"
                and s["restartCount"] >= 1
                and s
            ),
            45,
        )
        assert crashed["ready"] is False
        table = cluster.run("get", "pod", name, "-n", "kube-system").stdout
        assert "CrashLoopBackOff" in table
    finally:
        lab_fault(node, "clear", "crashloop")
    wait_for(f"{name} Ready again", lambda: status().get("ready") is True, 30)


def test_reset_returns_node_to_bare(cluster: Kubectl) -> None:
    node = WORKERS[1]
    dry = sh(node, "kubeadm reset -f --dry-run")
    assert dry.returncode == 0 and "/etc/kubernetes/kubelet.conf" in dry.stdout
    assert sh(node, "test -e /etc/kubernetes/kubelet.conf && systemctl is-active kubelet").returncode == 0
    assert ready(cluster.nodes()[node]) == "True"
    # a live node's name cannot be taken over by a join
    join = ok(CONTROL_PLANE, "kubeadm token create --print-join-command").strip()
    taken = sh(node, join + " --ignore-preflight-errors=all --dry-run")
    assert (
        taken.returncode == 1
        and f'a Node with name "{node}" and status "Ready" already exists' in taken.stderr
    )
    if not cluster.owned:
        return  # the stage's cluster: no real reset
    result = sh(node, "kubeadm reset -f")
    assert result.returncode == 0, result.stderr
    assert sh(node, "test -e /etc/kubernetes/kubelet.conf").returncode != 0
    assert sh(node, "systemctl is-active kubelet").stdout.strip() != "active"
    # real kubeadm reset leaves the Node object: it turns NotReady/Unknown, an operator deletes it
    assert node in cluster.nodes()
    cluster.run("delete", "node", node)
    join = ok(CONTROL_PLANE, "kubeadm token create --print-join-command").strip()
    ignore = (
        ""
        if sh(node, "test -S /run/containerd/containerd.sock").returncode == 0
        else " --ignore-preflight-errors=CRI"
    )
    result = sh(node, join + ignore, timeout=240)
    assert result.returncode == 0, result.stderr
    wait_for(f"{node} Ready after re-join", lambda: ready(cluster.nodes().get(node, {})) == "True", 60)
