"""On-call on the lab (issue 11): the GPU health agent that site.yml installs on every node, the remediation
playbooks ecc-cordon.yml and uncordon.yml, and the agent's RBAC, against the lab's real kube-apiserver
(its RBAC authorizer answers the agent's token) and the lab's fake NVML faults (scripts/lab-fault).

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_oncall_on_lab.py -v

Needs the converged lab (test_site_on_lab.py runs first). Every test puts back the GPU state it found
(fake-nvml show --json / load), uncordons the nodes and removes the agent's annotations, in a finally.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from labrun import (
    AGENT_CORDON,
    AGENT_HISTORY,
    NODES,
    give_back_unhealthy_gpus,
    on_node,
    playbook,
    podman,
    take_back_agent_cordons,
)

pytestmark = pytest.mark.lab

CONTROL_PLANE = "gpu-node-1"
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
CORDON = AGENT_CORDON
HISTORY = AGENT_HISTORY
HELD_BACK = "gpu-health.llm-platform.io/held-back"
LEASE = "-n gpu-health lease gpu-health-breaker"
SAVED = "/root/.test-oncall-gpu-state.json"


def kubectl(args: str) -> str:
    proc = on_node(CONTROL_PLANE, f"{KUBECTL} {args}", timeout=60)
    assert proc.returncode == 0, f"kubectl {args}: {proc.stderr}"
    return proc.stdout


def fault(node: str, *args: str) -> None:
    """What scripts/lab-fault NODE ARGS does: fake-nvml ARGS on the node."""
    proc = podman("exec", node, "fake-nvml", *args, timeout=60)
    assert proc.returncode == 0, proc.stderr


def cordoned() -> list[str]:
    nodes = json.loads(kubectl("get nodes -o json"))["items"]
    return sorted(n["metadata"]["name"] for n in nodes if (n.get("spec") or {}).get("unschedulable"))


def annotations(node: str) -> dict[str, str]:
    return json.loads(kubectl(f"get node {node} -o json"))["metadata"].get("annotations") or {}


def held_back() -> dict[str, Any]:
    lease = json.loads(kubectl(f"get {LEASE} -o json"))
    return json.loads((lease["metadata"].get("annotations") or {}).get(HELD_BACK) or "{}")


def metrics(node: str) -> str:
    script = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9445/metrics').read().decode())"
    return on_node(node, f'python3 -c "{script}"', timeout=30).stdout


def wait(what: Callable[[], Any], timeout: float, step: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(step)


def restore() -> None:
    """GPU state as found, nodes uncordoned, the agent's annotations gone (the Lease's too)."""
    for node in NODES:
        # the GPU state as found, and the lab's kernel log emptied (the Xids injected gone)
        on_node(node, f"test -f {SAVED} && fake-nvml load {SAVED} && rm -f {SAVED}", timeout=60)
        on_node(node, ": > /var/lib/fake-nvml/kmsg", timeout=60)
    for node in NODES:
        kubectl(f"uncordon {node}")
        kubectl(f"annotate node {node} {CORDON}- {HISTORY}-")
    # an agent held back names itself on the Lease until it sees its node healthy: wait for that, then
    # drop whatever is left
    wait(lambda: held_back() == {}, timeout=15)
    kubectl(f"annotate {LEASE} {HELD_BACK}-")
    # the GPUs an uncorrectable error or an Xid marked Unhealthy stay so in the device plugin until its pod is
    # replaced: without this the tests after these found gpu-node-2 offering 2 of its 4 GPUs (2026-12-02)
    give_back_unhealthy_gpus()


@pytest.fixture(autouse=True)
def lab_state() -> Iterator[None]:
    for node in NODES:
        saved = on_node(node, f"fake-nvml show --json > {SAVED}", timeout=60)
        assert saved.returncode == 0, saved.stderr
    # a cordon the agent made for a fault an earlier test injected is taken back; anyone else's stops the test
    take_back_agent_cordons()
    # the tests read the Nodes' cordon history from its start: what earlier runs left (a driver upgrade's
    # entries) goes
    for node in NODES:
        kubectl(f"annotate node {node} {HISTORY}-")
    for node in NODES:
        assert "gpu_health_agent_polls_total" in metrics(node), (
            f"{node}: the GPU health agent does not answer"
        )
    try:
        yield
    finally:
        restore()


def test_agent_cordons_within_30s_playbook_sees_it_uncordon_waits_for_the_fix() -> None:
    started = time.monotonic()
    fault("gpu-node-2", "ecc", "--gpu", "1", "--uncorrectable", "1")
    got = wait(lambda: cordoned(), timeout=30)
    elapsed = time.monotonic() - started
    assert got == ["gpu-node-2"], f"after {elapsed:.1f} s cordoned: {got}"
    assert elapsed < 30
    record = json.loads(annotations("gpu-node-2")[CORDON])
    assert record["by"] == "gpu-health-agent" and record["reasons"] == ["ecc_uncorrectable_volatile"]
    assert record["gpus"][0]["index"] == 1 and record["gpus"][0]["uuid"].startswith("GPU-")
    assert 'gpu_health_agent_cordoned{node="gpu-node-2"} 1' in metrics("gpu-node-2")
    time.sleep(6)  # more than one poll of every agent: no other node follows
    assert cordoned() == ["gpu-node-2"]

    # the ECC playbook on the same state: already cordoned, nothing to change
    again = playbook("playbooks/remediate/ecc-cordon.yml")
    assert again.rc == 0, again.tail()
    assert "already cordoned for the same reasons (no change): gpu-node-2" in again.output
    assert again.changed() == dict.fromkeys(NODES, 0), again.changed_tasks()

    # uncordon.yml refuses while the fault is there, succeeds once it is cleared
    refused = playbook("playbooks/remediate/uncordon.yml", "-e", "node=gpu-node-2")
    assert refused.rc != 0 and "NOT uncordoning gpu-node-2: refused" in refused.output, refused.tail()
    assert cordoned() == ["gpu-node-2"]
    on_node("gpu-node-2", f"fake-nvml load {SAVED}")
    done = playbook("playbooks/remediate/uncordon.yml", "-e", "node=gpu-node-2")
    assert done.rc == 0, done.tail()
    assert cordoned() == []
    after = annotations("gpu-node-2")
    assert CORDON not in after
    assert [h["action"] for h in json.loads(after[HISTORY])] == ["cordon", "uncordon"]


def test_two_faulty_nodes_one_cordoned_the_breaker_names_the_other() -> None:
    fault("gpu-node-2", "ecc", "--gpu", "0", "--uncorrectable", "1")
    # a pending remap no longer cordons (issue 20: reset at the next drain window): an uncontained error does
    fault("gpu-node-3", "xid", "--gpu", "2", "--xid", "95")
    got = wait(lambda: cordoned(), timeout=30)
    assert len(got) == 1 and got[0] in ("gpu-node-2", "gpu-node-3"), got
    other = "gpu-node-3" if got == ["gpu-node-2"] else "gpu-node-2"
    named = wait(lambda: held_back(), timeout=15)
    assert list(named) == [other], named
    assert named[other]["why"].startswith("circuit breaker: 1 of 3 GPU nodes cordoned already")
    assert f'gpu_health_agent_breaker_held_back{{node="{other}",why="circuit breaker' in metrics(other)
    time.sleep(6)
    assert cordoned() == got


def test_corrected_errors_below_the_threshold_cordon_nothing() -> None:
    fault("gpu-node-1", "ecc", "--gpu", "0", "--corrected", "999")
    fault("gpu-node-3", "ecc", "--gpu", "2", "--corrected", "5000")  # over it: degraded, still no cordon
    assert wait(lambda: 'verdict="degraded"} 1' in metrics("gpu-node-3"), timeout=15)
    time.sleep(6)  # another poll of every agent
    assert cordoned() == []
    assert 'gpu_health_agent_node_verdict{node="gpu-node-1",verdict="healthy"} 1' in metrics("gpu-node-1")


AGENT_API_PROBE = r"""
import json, ssl, urllib.request
config = json.load(open('/etc/gpu-health-agent/config.json'))
token = open(config['token_file']).read().strip()
context = ssl.create_default_context(cafile=config['ca_file'])
lease = '/apis/coordination.k8s.io/v1/namespaces/gpu-health/leases/gpu-health-breaker'
def call(method, path, body=None, ctype='application/json'):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(config['api_server'] + path, data=data, method=method)
    req.add_header('Authorization', 'Bearer ' + token)
    req.add_header('Content-Type', ctype)
    try:
        with urllib.request.urlopen(req, context=context, timeout=10) as r:
            return r.status, json.loads(r.read() or b'null')
    except urllib.error.HTTPError as e:
        return e.code, None
out = {}
out['get node'] = call('GET', '/api/v1/nodes/gpu-node-3')[0]
out['list nodes'] = call('GET', '/api/v1/nodes?labelSelector=nvidia.com%2Fgpu.present%3Dtrue')[0]
patch = {'metadata': {'annotations': {'test-oncall-rbac': None}}}
out['patch node'] = call('PATCH', '/api/v1/nodes/gpu-node-3', patch, 'application/merge-patch+json')[0]
code, body = call('GET', lease)
out['get lease'] = code
out['update lease'] = call('PUT', lease, body)[0]
out['list secrets'] = call('GET', '/api/v1/namespaces/gpu-health/secrets')[0]
out['get kube-system secrets'] = call('GET', '/api/v1/namespaces/kube-system/secrets')[0]
out['delete pod'] = call('DELETE', '/api/v1/namespaces/kube-system/pods/anything')[0]
out['delete node'] = call('DELETE', '/api/v1/nodes/gpu-node-3')[0]
event = {'metadata': {'generateName': 'x-'}, 'involvedObject': {'kind': 'Node', 'name': 'gpu-node-3'}}
out['create event'] = call('POST', '/api/v1/namespaces/default/events', event)[0]
out['create kube-system event'] = call('POST', '/api/v1/namespaces/kube-system/events', event)[0]
out['delete lease'] = call('DELETE', lease)[0]
print(json.dumps(out))
"""


def test_agent_token_rbac_on_the_lab_api() -> None:
    """With the token the role gave the agent on gpu-node-2, against the lab's API: what it needs, no more."""
    script = base64.b64encode(AGENT_API_PROBE.encode()).decode()
    proc = on_node("gpu-node-2", f"echo {script} | base64 -d | python3 -", timeout=60)
    assert proc.returncode == 0, proc.stderr
    codes = json.loads(proc.stdout)
    allowed = ("get node", "list nodes", "patch node", "get lease", "update lease")
    assert {k: codes[k] for k in allowed} == dict.fromkeys(allowed, 200), codes
    # a Node's Events live in namespace default: the agent writes its notices there (issue 20), nowhere else
    assert codes.pop("create event") == 201, codes
    assert {k: v for k, v in codes.items() if k not in allowed} == {
        k: 403 for k in codes if k not in allowed
    }, codes
