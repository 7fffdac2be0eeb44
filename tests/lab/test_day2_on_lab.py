"""Issue 18's day-2 operations on the lab's real cluster (kubeadm's etcd 3.6 static Pod, the real API server):
etcd backups, etcd restore, certificates (docs/runbook.md: "etcd backups", "Restore etcd from a snapshot",
"Certificates about to expire").

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_day2_on_lab.py -v

- Backups (role etcd_backup, converged by playbooks/kubernetes.yml): etcdctl/etcdutl are those of the etcd
  image the static Pod runs (its image ID recorded); a run of etcd-backup.service saves a snapshot that
  `etcd_backup.py status` finds good, copies it to gpu-node-2 (same sha256), where the control plane's key
  runs rrsync only (no command, no --delete); the exporter on gpu-node-1's node_ip serves the backup's and the
  certificate check's metrics; Prometheus scrapes job control-plane-metrics through its NetworkPolicy.
- Restore: ConfigMaps made, backed up, then one deleted, one changed (corrupted), one made after; a damaged
  snapshot is refused naming snapshot, with etcd left running; --check prints the plan and changes nothing;
  the restore brings the deleted and changed ones back as they were, the later one is gone, the old data
  directory is kept, every node is Ready and CoreDNS ready.
- Certificates: made to end in 20 days the way kubeadm itself would (`kubeadm certs renew all` with a
  configuration whose certificateValidityPeriod is 480h; an operator's kubeconfig by `kubeadm kubeconfig user
  --validity-period 480h`, as the role makes them), they are reported by the verification's line, the
  metrics and Prometheus's alert KubeadmCertificateExpiresSoon; renew-certs.yml --check changes nothing; the
  run renews them, restarts etcd and the API server (new containers; the served certificate is the new one),
  gives the operator a new kubeconfig, and the alert resolves; a second run changes nothing.

Needs a lab converged with this checkout (make lab: the Kubernetes and serving stages).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from labrun import ROOT, kube_json, on_node, playbook, running_nodes

pytestmark = pytest.mark.lab

CONTROL_PLANE = "gpu-node-1"
COPY_NODE = "gpu-node-2"
NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
INVENTORY = yaml.safe_load((ROOT / "inventories/lab/hosts.yml").read_text())
NODE_IP = INVENTORY["all"]["children"]["k8s_cluster"]["children"]["control_plane"]["hosts"][CONTROL_PLANE][
    "node_ip"
]
COPY_IP = INVENTORY["all"]["children"]["k8s_cluster"]["children"]["workers"]["hosts"][COPY_NODE]["node_ip"]
BACKUP = yaml.safe_load((ROOT / "roles/etcd_backup/defaults/main.yml").read_text())
BACKUP_VARS = yaml.safe_load((ROOT / "roles/etcd_backup/vars/main.yml").read_text())
METRICS = yaml.safe_load((ROOT / "roles/control_plane_metrics/defaults/main.yml").read_text())
MONITORING = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
OPERATOR = yaml.safe_load((ROOT / "inventories/lab/group_vars/all.yml").read_text())["common_ops_users"][0][
    "name"
]
HOME = "/usr/local/lib/etcd-backup"  # role etcd_backup's __etcd_backup_home
PROGRAM = f"python3 {HOME}/etcd_backup.py"
ETCDUTL = f"{HOME}/bin/etcdutl"
ADMIN = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
NAMESPACE = "day2-etcd-restore"


def sh(node: str, command: str, timeout: int = 300) -> str:
    proc = on_node(node, command, timeout=timeout)
    assert proc.returncode == 0, f"{node}: {command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def kubectl(*args: str) -> str:
    return sh(CONTROL_PLANE, f"{ADMIN} {shlex.join(args)}")


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, every_s: float = 2) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def flat(text: str) -> str:
    return " ".join(text.replace("''", "'").replace("\\n", " ").split())


def exporter() -> dict[str, float]:
    """The control plane's metrics exporter, as Prometheus reads it (on node_ip)."""
    url = f"http://{NODE_IP}:{METRICS['control_plane_metrics_port']}/metrics"
    text = sh(
        CONTROL_PLANE,
        f"python3 -c \"import urllib.request; print(urllib.request.urlopen('{url}').read().decode())\"",
    )
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def prometheus(query: str) -> list[dict[str, Any]]:
    """An instant query, by the real promtool in the Prometheus pod (its policy admits no other client)."""
    out = sh(
        CONTROL_PLANE,
        f"{ADMIN} -n {MONITORING['monitoring_namespace']} exec deploy/prometheus -- "
        f"/bin/promtool query instant -o json http://127.0.0.1:9090 {shlex.quote(query)}",
    )
    return list(json.loads(out))


def snapshots() -> list[str]:
    listing = sh(CONTROL_PLANE, f"ls -1 {BACKUP['etcd_backup_dir']}").split()
    return sorted(name for name in listing if re.fullmatch(r"etcd-snapshot-\d{8}T\d{6}Z\.db", name))


def back_up() -> str:
    """One run of the backup service (it waits for the snapshot, the check and the copy); the new snapshot."""
    before = snapshots()
    time.sleep(1.1)  # a snapshot's name is its second
    sh(CONTROL_PLANE, "systemctl start etcd-backup.service", timeout=600)
    after = snapshots()
    assert after and after[-1] not in before, (before, after)
    return f"{BACKUP['etcd_backup_dir']}/{after[-1]}"


def etcd_container() -> str:
    return sh(CONTROL_PLANE, "crictl ps --state running --name '^etcd$' -q").strip()


@pytest.fixture(scope="module", autouse=True)
def converged_lab() -> None:
    if not set(running_nodes()) >= set(NODES):
        pytest.skip("the lab is not running (make lab)")
    if on_node(CONTROL_PLANE, "test -e /etc/kubernetes/admin.conf").returncode != 0:
        pytest.fail("the lab has no cluster: converge it first (make lab)")
    if on_node(CONTROL_PLANE, "systemctl cat etcd-backup.timer").returncode != 0:
        pytest.fail(
            "no etcd-backup.timer on gpu-node-1: converge playbooks/kubernetes.yml of this checkout first"
        )
    namespace = MONITORING["monitoring_namespace"]
    if on_node(CONTROL_PLANE, f"{ADMIN} -n {namespace} get deployment prometheus").returncode != 0:
        run = playbook("playbooks/serving.yml", timeout=900)
        assert run.rc == 0, f"serving.yml failed (rc {run.rc}):\n{run.tail()}"


# ----------------------------------------------------------------------------------------------- backups
def test_backups_are_taken_checked_copied_and_measured() -> None:
    # the tools are those of the etcd image the static Pod runs
    image = yaml.safe_load(sh(CONTROL_PLANE, "cat /etc/kubernetes/manifests/etcd.yaml"))["spec"][
        "containers"
    ][0]["image"]
    image_id = json.loads(sh(CONTROL_PLANE, f"crictl inspecti -o json {image}"))["status"]["id"]
    assert sh(CONTROL_PLANE, f"cat {HOME}/bin/image-id").strip() == image_id
    assert image.rsplit(":", 1)[1].split("-")[0] in sh(CONTROL_PLANE, f"{ETCDUTL} version")

    snapshot = back_up()
    checked = json.loads(sh(CONTROL_PLANE, f"{PROGRAM} status {snapshot} --etcdutl {ETCDUTL}"))
    assert checked["ok"] and checked["status"]["totalKey"] > 0, checked
    name = snapshot.rsplit("/", 1)[1]
    copy = f"{BACKUP['etcd_backup_copy_to_node_dir']}/{CONTROL_PLANE}/{name}"
    assert sh(COPY_NODE, f"sha256sum {copy}").split()[0] == checked["record"]["sha256"]

    # the control plane's key runs rrsync into its directory only: no command, no deletion there
    key = f"ssh -i {BACKUP_VARS['__etcd_backup_ssh_key']} -o BatchMode=yes -o UserKnownHostsFile="
    key += f"{BACKUP_VARS['__etcd_backup_known_hosts']} -o StrictHostKeyChecking=yes"
    user = f"{BACKUP['etcd_backup_copy_user']}@{COPY_IP}"
    shell = on_node(CONTROL_PLANE, f"{key} {user} id")
    assert shell.returncode != 0 and "uid=" not in shell.stdout, shell.stdout + shell.stderr
    authorized = sh(COPY_NODE, f"cat /var/lib/{BACKUP['etcd_backup_copy_user']}/.ssh/authorized_keys")
    assert f'restrict,from="{NODE_IP}",command="' in authorized
    rrsync = re.search(r'command="(\S+) ', authorized)
    assert rrsync, authorized
    # -no-del where the node's rrsync has it (rsync 3.2.4 and later: Ubuntu 22.04's jammy-updates); the lab
    # mirrors the release's rsync 3.2.3, whose Perl rrsync knows only -ro and -wo (the role asks, as here)
    no_del = on_node(COPY_NODE, f"grep -q -e no-del {rrsync[1]}").returncode == 0
    wanted = " -wo -no-del " if no_del else " -wo "
    directory = f'{BACKUP["etcd_backup_copy_to_node_dir"]}/{CONTROL_PLANE}"'
    assert f"{wanted}{directory}" in authorized, (no_del, authorized)
    if no_del:
        empty = "mkdir -p /tmp/day2-empty && rsync -r --delete"
        wipe = on_node(CONTROL_PLANE, f"{empty} -e '{key}' /tmp/day2-empty/ {user}:")
        assert wipe.returncode != 0, wipe.stdout + wipe.stderr
    assert on_node(COPY_NODE, f"test -f {copy}").returncode == 0

    got = exporter()
    assert got["etcd_backup_last_run_success"] == 1
    assert got[f'etcd_backup_copy_success{{destination="{COPY_NODE}"}}'] == 1
    assert time.time() - got["etcd_backup_last_success_timestamp_seconds"] < 600
    assert got["etcd_backup_max_age_seconds"] == BACKUP["etcd_backup_max_age_hours"] * 3600
    assert got["kubeadm_certificate_check_success"] == 1

    # Prometheus reaches the exporter through the monitoring namespace's policy
    def scraped() -> bool:
        up = prometheus('up{job="control-plane-metrics"}')
        return bool(up) and up[0]["value"][1] == "1" and up[0]["metric"]["node"] == CONTROL_PLANE

    wait_for("Prometheus scraping job control-plane-metrics", scraped, 120, every_s=5)
    assert prometheus('ALERTS{alertname="EtcdBackupTooOld"}') == []


# ----------------------------------------------------------------------------------------------- restore
def config_map(name: str) -> dict[str, str] | None:
    got = on_node(CONTROL_PLANE, f"{ADMIN} -n {NAMESPACE} get configmap {name} -o json")
    return json.loads(got.stdout)["data"] if got.returncode == 0 else None


@pytest.fixture
def restore_objects() -> Iterator[None]:
    on_node(CONTROL_PLANE, f"{ADMIN} delete namespace {NAMESPACE} --ignore-not-found --wait=true")
    old = set(sh(CONTROL_PLANE, "ls -d /var/lib/etcd.before-restore-* 2>/dev/null || true").split())
    kubectl("create", "namespace", NAMESPACE)
    kubectl("-n", NAMESPACE, "create", "configmap", "kept", "--from-literal=v=1")
    kubectl("-n", NAMESPACE, "create", "configmap", "changed", "--from-literal=v=original")
    try:
        yield
    finally:
        on_node(CONTROL_PLANE, f"{ADMIN} delete namespace {NAMESPACE} --ignore-not-found --wait=false")
        made = (
            set(sh(CONTROL_PLANE, "ls -d /var/lib/etcd.before-restore-* 2>/dev/null || true").split()) - old
        )
        for directory in made:  # this test's way back, not needed once the test passed or failed
            on_node(CONTROL_PLANE, f"rm -rf {directory}")
        on_node(CONTROL_PLANE, "rm -f /var/backups/day2-damaged.db")


def test_a_restore_brings_back_what_was_deleted_and_corrupted(restore_objects: None) -> None:
    snapshot = back_up()
    kubectl("-n", NAMESPACE, "delete", "configmap", "kept")
    kubectl(
        "-n", NAMESPACE, "patch", "configmap", "changed", "--type=merge", "-p", '{"data":{"v":"corrupted"}}'
    )
    kubectl("-n", NAMESPACE, "create", "configmap", "after", "--from-literal=v=made after the snapshot")

    # a damaged snapshot: refused, naming snapshot, etcd untouched
    sh(CONTROL_PLANE, f"head -c 8192 {snapshot} > /var/backups/day2-damaged.db")
    etcd = etcd_container()
    damaged = playbook("playbooks/remediate/etcd-restore.yml", "-e", "snapshot=/var/backups/day2-damaged.db")
    assert damaged.rc != 0
    assert "snapshot=/var/backups/day2-damaged.db refused, nothing was changed" in flat(damaged.output), (
        damaged.tail()
    )
    assert etcd_container() == etcd and config_map("kept") is None

    check = playbook("playbooks/remediate/etcd-restore.yml", "-e", f"snapshot={snapshot}", "--check")
    assert check.rc == 0, check.tail()
    assert f"Check mode: would restore {snapshot} (revision" in flat(check.output), check.tail()
    assert etcd_container() == etcd and config_map("kept") is None and config_map("after") is not None

    run = playbook("playbooks/remediate/etcd-restore.yml", "-e", f"snapshot={snapshot}", timeout=1200)
    assert run.rc == 0, run.tail()
    out = flat(run.output)
    assert (
        f"restored {snapshot} (revision" in out
        and "old data directory kept: /var/lib/etcd.before-restore-" in out
    )
    assert etcd_container() != etcd
    assert config_map("kept") == {"v": "1"}
    assert config_map("changed") == {"v": "original"}
    assert config_map("after") is None
    # healthy: the verification's line per node (kubernetes-verify.yml), and the API's own view
    for node in NODES:
        assert f"{node}: Ready, " in out, run.tail()
    for node in kube_json("get", "nodes")["items"]:
        ready = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready == ["True"], node["metadata"]["name"]
    coredns = kube_json("-n", "kube-system", "get", "deployment", "coredns")["status"]
    assert coredns.get("readyReplicas") == coredns.get("replicas"), coredns


# ------------------------------------------------------------------------------------------ certificates
def apiserver_days() -> float:
    got = exporter()
    end = got['kubeadm_certificate_expiration_timestamp_seconds{certificate="apiserver",kind="certificate"}']
    return (end - time.time()) / 86400


@pytest.fixture
def short_certificates() -> Iterator[None]:
    """Certificates made to end in 20 days the way kubeadm itself does it, the operator's kubeconfig too."""
    config = yaml.safe_load_all(sh(CONTROL_PLANE, "cat /etc/kubernetes/kubeadm-config.yaml"))
    documents = [
        {**d, "certificateValidityPeriod": "480h"} if d.get("kind") == "ClusterConfiguration" else d
        for d in config
    ]
    sh(CONTROL_PLANE, f"cat > /root/day2-short-validity.yaml <<'EOF'\n{yaml.safe_dump_all(documents)}EOF")
    sh(CONTROL_PLANE, "kubeadm certs renew all --config /root/day2-short-validity.yaml")
    home = sh(CONTROL_PLANE, f"getent passwd {OPERATOR}").split(":")[5]
    sh(
        CONTROL_PLANE,
        "kubeadm kubeconfig user --config /etc/kubernetes/kubeadm-config.yaml --client-name "
        f"{OPERATOR} --validity-period 480h > {home}/.kube/config.new && "
        f"chown {OPERATOR}: {home}/.kube/config.new && chmod 0600 {home}/.kube/config.new && "
        f"mv {home}/.kube/config.new {home}/.kube/config",
    )
    sh(CONTROL_PLANE, "systemctl start kubeadm-certificates-metrics.service")
    try:
        yield
    finally:
        on_node(CONTROL_PLANE, "rm -f /root/day2-short-validity.yaml")
        if (
            apiserver_days() < 30
        ):  # the test failed before the renewal: leave the lab with a year's certificates
            playbook("playbooks/remediate/renew-certs.yml", timeout=1200)


def test_short_certificates_are_reported_then_renewed(short_certificates: None) -> None:
    assert 19 < apiserver_days() < 21
    verify = playbook("playbooks/kubernetes-verify.yml")
    assert verify.rc == 0, verify.tail()
    assert "(19 days), RENEW: playbooks/remediate/renew-certs.yml" in flat(verify.output), verify.tail()

    def alert(state: str) -> Callable[[], bool]:
        return lambda: any(
            a["metric"].get("certificate") == "apiserver"
            for a in prometheus(f'ALERTS{{alertname="KubeadmCertificateExpiresSoon",alertstate="{state}"}}')
        )

    wait_for("KubeadmCertificateExpiresSoon firing", alert("firing"), 180, every_s=5)

    disk = sh(CONTROL_PLANE, "sha256sum /etc/kubernetes/pki/apiserver.crt")
    check = playbook("playbooks/remediate/renew-certs.yml", "--check")
    assert check.rc == 0, check.tail()
    assert "Check mode: would renew every certificate kubeadm manages" in flat(check.output), check.tail()
    assert sh(CONTROL_PLANE, "sha256sum /etc/kubernetes/pki/apiserver.crt") == disk

    etcd = etcd_container()
    apiserver = sh(CONTROL_PLANE, "crictl ps --state running --name '^kube-apiserver$' -q").strip()
    run = playbook("playbooks/remediate/renew-certs.yml", timeout=1200)
    assert run.rc == 0, run.tail()
    out = flat(run.output)
    assert "renewed; earliest before:" in out and f"operators given a new kubeconfig: {OPERATOR}" in out, (
        run.tail()
    )
    assert apiserver_days() > 360
    assert etcd_container() != etcd
    assert sh(CONTROL_PLANE, "crictl ps --state running --name '^kube-apiserver$' -q").strip() != apiserver
    served = sh(
        CONTROL_PLANE,
        f"echo | openssl s_client -connect {NODE_IP}:6443 2>/dev/null | openssl x509 -noout -enddate",
    )
    assert served == sh(CONTROL_PLANE, "openssl x509 -noout -enddate -in /etc/kubernetes/pki/apiserver.crt")
    kubectl_as_operator = on_node(CONTROL_PLANE, f"su - {OPERATOR} -c 'kubectl get nodes'")
    assert kubectl_as_operator.returncode == 0, kubectl_as_operator.stderr

    wait_for("KubeadmCertificateExpiresSoon resolved", lambda: not alert("firing")(), 180, every_s=5)
    again = playbook("playbooks/remediate/renew-certs.yml")
    assert again.rc == 0 and "nothing to renew" in flat(again.output), again.tail()
    assert sum(again.changed().values()) == 0, again.changed_tasks()
