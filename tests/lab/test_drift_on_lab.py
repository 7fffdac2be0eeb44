"""Drift is still found and put back by a no-op site run (issue 19, Must show): whatever makes the no-op
faster must keep this.

    make lab && .venv/bin/pytest -m lab tests/lab/test_drift_on_lab.py -v

Needs the converged lab (make lab; skipped when its nodes are down). Four changes made behind Ansible's back,
then ONE `playbooks/site.yml` run (about 5 minutes) and one more (the no-op):

- a power cap changed on one GPU of gpu-node-2 (the fake NVML's `power`, as an operator's nvidia-smi -pl);
- kubelet unheld on gpu-node-2 (`apt-mark unhold`);
- net.bridge.bridge-nf-call-ip6tables set to 0 on gpu-node-2 (a net.* parameter: the lab nodes' other
  parameters are read-only, docs/lab.md; this one is the node's own network namespace and the least
  disruptive of the role's three);
- the gateway's ConfigMap edited in the cluster (a comment appended to gateway.yaml: the gateway reads the
  same configuration).

The first run must put back exactly those four (each its task, changed on its host: gpu-node-2, and for the
ConfigMap the control plane, where the serving play applies it) and change nothing else: gpu-node-3 changed=0.
The second must change nothing. Whatever the outcome, the drift is put back by hand at the end, so a failure
here leaves no drifted lab to the tests after it.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator

import pytest
import yaml
from labrun import ADMIN_KUBECTL, NODES, ROOT, Run, on_node, playbook, running_nodes
from unit.role_render import RoleVars

pytestmark = pytest.mark.lab

NODE = "gpu-node-2"
CONTROL_PLANE = NODES[0]
GPU = 1
DRIFT_POWER_W = 180
PACKAGE = "kubelet"
SYSCTL = "net.bridge.bridge-nf-call-ip6tables"

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

# (task name start, host its result is reported on): what the first run must change, and nothing else
EXPECTED = {
    ("Apply power cap, target temperature and persistence mode", NODE),
    ("Hold kubeadm, kubelet, kubectl, cri-tools and kubernetes-cni", NODE),
    ("Set the kernel parameters now and at boot", NODE),
    ("Apply the gateway's ConfigMap, Service, PodDisruptionBudget and Deployment", CONTROL_PLANE),
}


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


def gateway_config() -> str:
    got = run_on(CONTROL_PLANE, f"{ADMIN_KUBECTL} -n {NAMESPACE} get configmap {CONFIGMAP} -o json")
    return json.loads(got)["data"]["gateway.yaml"]


def set_gateway_config(text: str) -> None:
    patch = json.dumps([{"op": "replace", "path": "/data/gateway.yaml", "value": text}])
    run_on(
        CONTROL_PLANE,
        f"{ADMIN_KUBECTL} -n {NAMESPACE} patch configmap {CONFIGMAP} --type json -p {shlex.quote(patch)}",
    )


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


@pytest.fixture(scope="module")
def drifted() -> Iterator[str]:
    down = [node for node in NODES if node not in running_nodes()]
    if down:
        pytest.skip(f"lab nodes not running: {', '.join(down)} (make lab)")
    # the converged lab as the product leaves it, or this test proves nothing
    limits = power_limits_w()
    assert limits and set(limits) == {POWER_W}, f"not converged ({limits}): run make lab first"
    assert PACKAGE in held() and sysctl_value() == SYSCTL_VALUE, "not converged: run make lab first"
    config = gateway_config()
    try:
        run_on(NODE, f"fake-nvml power --gpu {GPU} --limit-w {DRIFT_POWER_W}")
        run_on(NODE, f"apt-mark unhold {PACKAGE}")
        run_on(NODE, f"sysctl -w {SYSCTL}=0")
        set_gateway_config(config + "\n# edited in the cluster by tests/lab/test_drift_on_lab.py\n")
        assert power_limits_w()[GPU] == DRIFT_POWER_W
        assert PACKAGE not in held()
        assert sysctl_value() == "0"
        assert gateway_config() != config
        yield config
    finally:
        # by hand, whatever the runs did: the lab as it was
        run_on(NODE, f"fake-nvml power --gpu {GPU} --limit-w {POWER_W}")
        run_on(NODE, f"apt-mark hold {PACKAGE}")
        run_on(NODE, f"sysctl -w {SYSCTL}={SYSCTL_VALUE}")
        if gateway_config() != config:
            set_gateway_config(config)


@pytest.fixture(scope="module")
def first_run(drifted: str) -> Run:
    run = playbook("playbooks/site.yml", json_callback=True)
    assert run.rc == 0, f"site.yml failed (rc {run.rc}):\n{run.tail()}"
    assert set(run.recap) == set(NODES), run.tail(3000)
    return run


def test_the_site_run_puts_back_each_drift(first_run: Run, drifted: str) -> None:
    assert set(power_limits_w()) == {POWER_W}
    assert PACKAGE in held()
    assert sysctl_value() == SYSCTL_VALUE
    assert gateway_config() == drifted


def test_the_site_run_changes_the_drifted_things_only(first_run: Run) -> None:
    changed = changed_results(first_run)

    def labels(task: str, host: str) -> list[str]:
        return [label for name, at, label in changed if name.startswith(task) and at == host]

    missing = [(task, host) for task, host in sorted(EXPECTED) if not labels(task, host)]
    assert missing == [], f"drift not reported as changed: {missing}; changed: {changed}"
    unexpected = [
        (name, host, label)
        for name, host, label in changed
        if not any(name.startswith(task) and host == at for task, at in EXPECTED)
    ]
    assert unexpected == [], "changed what had not drifted"
    # within the expected tasks, exactly the drifted item
    assert labels("Hold kubeadm", NODE) == [PACKAGE]
    assert labels("Set the kernel parameters", NODE) == [f"{SYSCTL}={SYSCTL_VALUE}"]
    assert labels("Apply the gateway's", CONTROL_PLANE) == [f"ConfigMap/{CONFIGMAP}"]
    assert first_run.changed()[NODES[2]] == 0
    assert first_run.changed()[NODE] >= 3 and first_run.changed()[CONTROL_PLANE] >= 1


def test_the_next_run_changes_nothing(first_run: Run) -> None:
    run = playbook("playbooks/site.yml")
    assert run.rc == 0, run.tail()
    assert run.changed_nothing(), f"changed: {run.changed()}; tasks: {run.changed_tasks()}"
