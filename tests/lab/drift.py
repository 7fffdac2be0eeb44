"""Drift made behind Ansible's back on the converged lab, and how a site run must report it (issue 19:
whatever makes the no-op faster must keep finding it). tests/lab/test_site_on_lab.py makes it after the
first converge: `--check --diff` must name exactly these twelve, `make lab` must put back exactly these.

- a power cap changed on one GPU of gpu-node-2 (the fake NVML's `power`, as an operator's nvidia-smi -pl);
- kubelet unheld on gpu-node-2 (`apt-mark unhold`);
- net.bridge.bridge-nf-call-ip6tables set to 0 on gpu-node-2 (a net.* parameter: the lab nodes' other
  parameters are read-only, docs/lab.md; this one is the node's own network namespace and the least
  disruptive of the role's three);
- the gateway's ConfigMap edited in the cluster (a comment appended to gateway.yaml);
- /etc/crictl.yaml on gpu-node-2 edited by hand (a comment appended) and made 0600: a file of a role whose
  write tasks run only for what files_in_place finds different (containerd's configure-containerd.yml);
- gpu-tuning.service disabled by hand on gpu-node-2 without a daemon-reload (`systemctl --no-reload
  disable`, as removing its link by hand would: systemd's cached UnitFileState still says enabled): a unit
  whose enabling runs only when files_in_place finds it not enabled (gpu_tuning's tasks/main.yml reads it,
  write-boot-unit.yml enables it);
- chrony stopped by hand on gpu-node-2 (`systemctl stop`): a unit whose start runs only when files_in_place
  finds it not running (common's time_sync.yml);
- sshd_config's Include line removed by hand on gpu-node-2: an edit whose lineinfile task runs only when
  files_in_place's edits find it missing (common's ssh_hardening.yml; its handler reloads sshd);
- a pinned distribution uninstalled from the model tools' venv on the source node (gpu-node-1, `pip
  uninstall`): a venv whose pip task runs only when packages_in_place finds it not as pinned (model_sync's
  prepare-source.yml);
- the monitoring namespace's NetworkPolicy `prometheus` edited in the cluster (its ingress port): an object
  applied only where the role's one read finds it not held as rendered (monitoring's apply-workloads.yml);
- the GPU health agent's copy of the cluster CA on gpu-node-2 edited by hand (a line appended): a copy that
  runs only where files_in_place's stat finds its checksum, mode or owner other than the CA's
  (gpu_health_agent's configure-service.yml; its handler restarts the agent);
- a key the inventory does not list appended to the operator's authorized_keys on gpu-node-2: keys whose
  authorized_key task (exclusive) runs only where the role's read of that file finds them not exactly the
  inventory's (common's ops_users.yml).

Each expected value comes from its one home: the role's defaults and the lab inventory.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import struct
import subprocess
import sys

import yaml
from labrun import ADMIN_KUBECTL, NODES, OPERATOR, ROOT, Run, on_node
from unit.role_render import RoleVars

NODE = "gpu-node-2"
CONTROL_PLANE = NODES[0]
GPU = 1
DRIFT_POWER_W = 180
PACKAGE = "kubelet"
SYSCTL = "net.bridge.bridge-nf-call-ip6tables"
FILE_MARK = "# edited by hand by tests/lab/test_site_on_lab.py"

_LAB_VARS: dict[str, object] = {}
for _name in ("all.yml", "gpu_nodes.yml", "k8s_cluster.yml"):
    _LAB_VARS |= yaml.safe_load((ROOT / "inventories/lab/group_vars" / _name).read_text()) or {}


def _role(role: str) -> RoleVars:
    return RoleVars(role, **{k: v for k, v in _LAB_VARS.items() if k.startswith(f"{role}_")})


# each value's one home: the role's defaults and the lab inventory
POWER_W = int(_role("gpu_tuning")["gpu_tuning_power_limit_w"])
SYSCTL_VALUE = str(_role("kubernetes_node")["kubernetes_node_sysctls"][SYSCTL])
NAMESPACE = _role("llm_gateway")["llm_gateway_namespace"]
CONFIGMAP = "llm-gateway-config"  # roles/llm_gateway/templates/configmap.yml.j2
FILE = str(_role("containerd")["__containerd_crictl_config"])
FILE_MODE = "644"  # roles/containerd/tasks/configure-containerd.yml
UNIT = str(_role("gpu_tuning")["__gpu_tuning_unit"])
SERVICE = str(_role("common")["common_chrony_service"])
SSHD_CONFIG = str(_role("common")["__common_sshd_config"])
SSHD_INCLUDE = str(_role("common")["__common_sshd_include"])
SSH_SERVICE = str(_role("common")["common_ssh_service"])
# the model tools' venv and pins, from their one home through the script the role's lookup runs
_TOOLS = json.loads(
    subprocess.run(
        [sys.executable, str(ROOT / "roles/model_sync/files/model_tools_contract.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
)
TOOLS_VENV = str(_TOOLS["venv"])
# any of the pins serves; the second (a scanner the admission gates run, not the models' loading)
TOOLS_REQUIREMENT = str(_TOOLS["requirements"][1])
TOOLS_NODE = str(_LAB_VARS["model_sync_source_node"])
TOOLS_DISTRIBUTION = TOOLS_REQUIREMENT.split("==")[0]
MONITORING_NAMESPACE = _role("monitoring")["monitoring_namespace"]
POLICY = "prometheus"  # roles/monitoring/templates/network-policy.yml.j2
AGENT_CA = str(_role("gpu_health_agent")["__gpu_health_agent_ca"])
CA_MARK = "# edited by hand by tests/lab/test_site_on_lab.py"
# the operator's keys (common's read takes <home base>/<name>/.ssh/authorized_keys); the slipped-in key: an
# ed25519 public key in OpenSSH's form (its blob: the type, then 32 bytes), no one's
OPS_KEYS = f"{_role('common')['__common_ops_home_base']}/{OPERATOR}/.ssh/authorized_keys"
_BLOB = struct.pack(">I", 11) + b"ssh-ed25519" + struct.pack(">I", 32) + bytes(range(32))
SLIPPED_KEY = f"ssh-ed25519 {base64.b64encode(_BLOB).decode()} slipped-in-by-tests-lab"

# (task name start, host its result is reported on): what the first run must change, and nothing else
EXPECTED_TASKS = {
    "power": "Apply power cap, target temperature and persistence mode",
    "hold": "Hold kubeadm, kubelet, kubectl, cri-tools and kubernetes-cni",
    "sysctl": "Set the kernel parameters now and at boot",
    "configmap": "Apply the gateway's objects the cluster does not hold as rendered",
    "file": "Point crictl at containerd's CRI socket",
    "unit": f"Enable {UNIT}",
    "service": "Start chrony unless systemd's conditions ruled it out",
    "edit": "Make sshd read its drop-in directory first",
    "reload": "Reload sshd",
    "venv": f"Install the model tools into {TOOLS_VENV}",
    "policy": "Apply the monitoring namespace's network policy",
    "ca": "Copy the cluster CA where the agent's user can read it",
    "restart": "Restart the GPU health agent",
    "keys": "Set the operators' authorized keys (exactly these)",
}
# the serving play applies the gateway's objects once, reported on the control plane; the model tools live on
# the source node
ELSEWHERE = {"configmap": CONTROL_PLANE, "venv": TOOLS_NODE, "policy": CONTROL_PLANE}
EXPECTED = {(task, ELSEWHERE.get(key, NODE)) for key, task in EXPECTED_TASKS.items()}


def run_on(node: str, command: str) -> str:
    proc = on_node(node, command, timeout=120)
    assert proc.returncode == 0, f"{node}: {command}: {proc.stderr}"
    return proc.stdout


def power_limits_w() -> list[int]:
    return [int(w) for w in re.findall(r"power (\d+) W", run_on(NODE, "fake-nvml show"))]


def held() -> set[str]:
    return set(run_on(NODE, "apt-mark showhold").split())


def sysctl_value() -> str:
    return run_on(NODE, f"cat /proc/sys/{SYSCTL.replace('.', '/')}").strip()


def file_state() -> tuple[str, bool]:
    """(the permission bits in octal, whether the hand edit is in it) of FILE on NODE."""
    mode = run_on(NODE, f"stat -c %a {FILE}").strip()
    return mode, FILE_MARK in run_on(NODE, f"cat {FILE}")


def unit_state() -> tuple[str, str]:
    """(whether UNIT is enabled, whether SERVICE runs) on NODE, as systemctl says them."""
    enabled = on_node(NODE, f"systemctl is-enabled {UNIT}", timeout=60).stdout.strip()
    active = on_node(NODE, f"systemctl is-active {SERVICE}", timeout=60).stdout.strip()
    return enabled, active


def without_line(line: str, path: str) -> str:
    """A shell command that removes every line of ``path`` equal to ``line``, keeping the file (its mode and
    owner)."""
    kept = f"{path}.kept"
    return f"grep -vxF {shlex.quote(line)} {path} > {kept}; cat {kept} > {path}; rm {kept}"


def include_present() -> bool:
    """Whether SSHD_CONFIG on NODE has the role's Include line."""
    return SSHD_INCLUDE in run_on(NODE, f"cat {SSHD_CONFIG}").splitlines()


def tools_version() -> str:
    """The version of TOOLS_DISTRIBUTION in the model tools' venv on TOOLS_NODE, '' when not installed."""
    proc = on_node(TOOLS_NODE, f"{TOOLS_VENV}/bin/pip show {TOOLS_DISTRIBUTION}", timeout=120)
    return next(
        (line.split(":", 1)[1].strip() for line in proc.stdout.splitlines() if line.startswith("Version:")),
        "",
    )


def gateway_config() -> str:
    got = run_on(CONTROL_PLANE, f"{ADMIN_KUBECTL} -n {NAMESPACE} get configmap {CONFIGMAP} -o json")
    return json.loads(got)["data"]["gateway.yaml"]


def set_gateway_config(text: str) -> None:
    patch = json.dumps([{"op": "replace", "path": "/data/gateway.yaml", "value": text}])
    run_on(
        CONTROL_PLANE,
        f"{ADMIN_KUBECTL} -n {NAMESPACE} patch configmap {CONFIGMAP} --type json -p {shlex.quote(patch)}",
    )


def policy_port() -> int:
    """The port of the first ingress rule of the monitoring NetworkPolicy POLICY."""
    got = run_on(
        CONTROL_PLANE, f"{ADMIN_KUBECTL} -n {MONITORING_NAMESPACE} get networkpolicy {POLICY} -o json"
    )
    return int(json.loads(got)["spec"]["ingress"][0]["ports"][0]["port"])


def set_policy_port(port: int) -> None:
    patch = json.dumps([{"op": "replace", "path": "/spec/ingress/0/ports/0/port", "value": port}])
    run_on(
        CONTROL_PLANE,
        f"{ADMIN_KUBECTL} -n {MONITORING_NAMESPACE} patch networkpolicy {POLICY} --type json"
        f" -p {shlex.quote(patch)}",
    )


def ca_edited() -> bool:
    """Whether the hand edit is in the agent's copy of the CA on NODE."""
    return CA_MARK in run_on(NODE, f"cat {AGENT_CA}")


def key_slipped_in() -> bool:
    """Whether the slipped-in key is in the operator's authorized_keys on NODE."""
    return SLIPPED_KEY in run_on(NODE, f"cat {OPS_KEYS}").splitlines()


def _label(item: object) -> str:
    """A loop item as the tasks label it: a package, key=value, Kind/name."""
    if isinstance(item, dict) and "key" in item:
        return f"{item['key']}={item['value']}"
    if isinstance(item, dict) and "kind" in item:
        return f"{item['kind']}/{item.get('metadata', {}).get('name', '')}"
    return "" if item is None else str(item)


def changed_results(run: Run) -> list[tuple[str, str, str]]:
    """(task, host, item label) of every changed result of a JSON-callback run, handlers included."""
    assert run.result is not None
    found = []
    for play in run.result["plays"]:
        for task in play["tasks"]:
            name = task["task"]["name"].split(" : ", 1)[-1]
            for host, result in task["hosts"].items():
                for item in result.get("results", [result]):
                    if item.get("changed"):
                        found.append((name, host, _label(item.get("item"))))
    return found


def reads_not_in_place(run: Run) -> list[tuple[str, str, list[str]]]:
    """(task, host, differ) of every result of a JSON-callback run of files_in_place or packages_in_place (the
    reads that let a role skip its write and package tasks) that found something not as its role wants it. On
    a converged node there is none: a template the role renders differently from what its template task wrote,
    or a package want the role's tasks do not meet, would show here on every run (and cost the no-op its
    tasks)."""
    assert run.result is not None
    found = []
    for play in run.result["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if "checked" in result and result.get("differ"):
                    found.append((task["task"]["name"].split(" : ", 1)[-1], host, result["differ"]))
    return found


def inject() -> dict[str, str]:
    """Make the twelve drifts on the converged lab; the gateway's configuration and the policy's port as they
    were (``config``, ``port``)."""
    limits = power_limits_w()
    assert limits and set(limits) == {POWER_W}, f"not converged ({limits})"
    assert PACKAGE in held() and sysctl_value() == SYSCTL_VALUE, "not converged"
    assert file_state() == (FILE_MODE, False), f"not converged ({FILE}: {file_state()})"
    assert unit_state() == ("enabled", "active"), f"not converged ({UNIT}, {SERVICE}: {unit_state()})"
    assert include_present(), f"not converged ({SSHD_CONFIG} lacks {SSHD_INCLUDE!r})"
    assert tools_version() == TOOLS_REQUIREMENT.split("==")[1], (
        f"not converged ({TOOLS_VENV}: {tools_version()})"
    )
    assert not ca_edited(), f"not converged ({AGENT_CA} edited)"
    assert not key_slipped_in(), f"not converged ({OPS_KEYS} holds the slipped-in key)"
    config = gateway_config()
    port = policy_port()
    run_on(NODE, f"fake-nvml power --gpu {GPU} --limit-w {DRIFT_POWER_W}")
    run_on(NODE, f"apt-mark unhold {PACKAGE}")
    run_on(NODE, f"sysctl -w {SYSCTL}=0")
    run_on(NODE, f"echo {shlex.quote(FILE_MARK)} >> {FILE} && chmod 600 {FILE}")
    run_on(NODE, f"systemctl --no-reload disable {UNIT} && systemctl stop {SERVICE}")
    run_on(NODE, without_line(SSHD_INCLUDE, SSHD_CONFIG))
    run_on(TOOLS_NODE, f"{TOOLS_VENV}/bin/pip uninstall -y -q {TOOLS_DISTRIBUTION}")
    set_gateway_config(config + "\n# edited in the cluster by tests/lab/test_site_on_lab.py\n")
    set_policy_port(port + 1)
    run_on(NODE, f"echo {shlex.quote(CA_MARK)} >> {AGENT_CA}")
    run_on(NODE, f"echo {shlex.quote(SLIPPED_KEY)} >> {OPS_KEYS}")
    assert power_limits_w()[GPU] == DRIFT_POWER_W
    assert PACKAGE not in held()
    assert sysctl_value() == "0"
    assert file_state() == ("600", True)
    assert unit_state() == ("disabled", "inactive")
    assert not include_present()
    assert tools_version() == ""
    assert gateway_config() != config
    assert policy_port() == port + 1
    assert ca_edited()
    assert key_slipped_in()
    return {"config": config, "port": str(port)}


def put_back(made: dict[str, str]) -> None:
    """By hand, whatever the runs did: the lab as the product leaves it (``made``: what inject returned)."""
    run_on(NODE, f"fake-nvml power --gpu {GPU} --limit-w {POWER_W}")
    run_on(NODE, f"apt-mark hold {PACKAGE}")
    run_on(NODE, f"sysctl -w {SYSCTL}={SYSCTL_VALUE}")
    run_on(NODE, f"{without_line(FILE_MARK, FILE)}; chmod {FILE_MODE} {FILE}")
    run_on(NODE, f"systemctl enable {UNIT} && systemctl start {SERVICE}")
    if not include_present():
        run_on(
            NODE,
            f"sed -i {shlex.quote('1i ' + SSHD_INCLUDE)} {SSHD_CONFIG} && systemctl reload {SSH_SERVICE}",
        )
    if not tools_version():
        index = f"--index-url {_LAB_VARS['model_sync_pip_index_url']}"
        trusted = f"--trusted-host {_LAB_VARS['model_sync_pip_trusted_host']}"
        run_on(
            TOOLS_NODE,
            f"{TOOLS_VENV}/bin/pip install -q {index} {trusted} {shlex.quote(TOOLS_REQUIREMENT)}",
        )
    if gateway_config() != made["config"]:
        set_gateway_config(made["config"])
    if policy_port() != int(made["port"]):
        set_policy_port(int(made["port"]))
    if ca_edited():
        run_on(NODE, without_line(CA_MARK, AGENT_CA))
    if key_slipped_in():
        run_on(NODE, without_line(SLIPPED_KEY, OPS_KEYS))


def unexpected_changes(run: Run) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """(expected tasks not reported changed, changes that are not the drift) of a JSON-callback run; within
    the expected tasks, exactly the drifted item."""
    changed = changed_results(run)
    drifted_items = {
        EXPECTED_TASKS["hold"]: PACKAGE,
        EXPECTED_TASKS["sysctl"]: f"{SYSCTL}={SYSCTL_VALUE}",
        EXPECTED_TASKS["configmap"]: f"ConfigMap/{CONFIGMAP}",
    }
    missing = [
        (task, host)
        for task, host in sorted(EXPECTED)
        if not any(name.startswith(task) and at == host for name, at, _ in changed)
    ]
    other = []
    for name, host, label in changed:
        task = next((task for task, at in EXPECTED if name.startswith(task) and at == host), None)
        if task is None or (task in drifted_items and label != drifted_items[task]):
            other.append((name, host, label))
    return missing, other
