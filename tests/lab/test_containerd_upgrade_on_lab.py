"""playbooks/upgrade-containerd.yml on the lab's real cluster (issue 18; docs/runbook.md, "Upgrade
containerd"): the three nodes from containerd 2.3.4 (the site's pin) to 2.3.7 and back, one node at a time,
under traffic.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_containerd_upgrade_on_lab.py -v -s

Both are real containerd releases built from their Go modules (tests/lab/gobuild: containerd and
containerd-next), each in a containerd.io package of the lab mirror's Docker repository
(tests/lab/mirror/packages.yml, containerd_io).
1. Before: apt's candidate for containerd.io is the pinned one, though the repository has a newer one; the
   Kubernetes stage with the newer containerd_version refuses before any change, naming containerd_version
   and upgrade-containerd.yml (it would install it on every node at once, without a drain).
2. --check prints the plan (the workers first, the control plane last) and changes nothing.
3. The upgrade, while chat completions go to the gateway's NodePort of every node (tests/lab/traffic.py):
   every Node reports containerd://2.3.7, containerd.io 2.3.7 is installed and held, no node is left
   cordoned, no request failed.
4. Back to the site's pin (a patch release back within the line, the runbook's undo), under traffic too:
   every node on 2.3.4 again; a second run has nothing to do.
Always afterwards (the fixture): the nodes are put back on the site's pin and uncordoned.

A long test (LONG_LAB_TESTS): about 8 minutes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import yaml
from labrun import ADMIN_KUBECTL, NODES, ROOT, Run, on_node, playbook
from traffic import Traffic

pytestmark = pytest.mark.lab

CONTROL_PLANE = NODES[0]
PACKAGES = yaml.safe_load((ROOT / "tests/lab/mirror/packages.yml").read_text())["containerd_io"]
PINNED_PACKAGE, NEWER_PACKAGE = PACKAGES["version"], PACKAGES["newer"]
PINNED, NEWER = PINNED_PACKAGE.split("-")[0], NEWER_PACKAGE.split("-")[0]
TO_NEWER = ("-e", f"containerd_version={NEWER}", "-e", f"containerd_package_version={NEWER_PACKAGE}")


def sh(node: str, command: str) -> str:
    proc = on_node(node, command, timeout=120)
    assert proc.returncode == 0, f"{node}: {command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def nodes() -> dict[str, dict]:
    got = json.loads(sh(CONTROL_PLANE, f"{ADMIN_KUBECTL} get nodes -o json"))
    return {n["metadata"]["name"]: n for n in got["items"]}


def runtimes() -> dict[str, str]:
    return {name: n["status"]["nodeInfo"]["containerRuntimeVersion"] for name, n in nodes().items()}


def cordoned() -> list[str]:
    return sorted(name for name, n in nodes().items() if (n.get("spec") or {}).get("unschedulable"))


def installed(node: str) -> str:
    return sh(node, "dpkg-query --show --showformat='${Version}' containerd.io").strip()


def upgrade(*extra: str) -> Run:
    return playbook("playbooks/upgrade-containerd.yml", *extra, timeout=1800)


def upgrade_under_traffic(what: str, *extra: str) -> tuple[Run, Traffic]:
    """The playbook run while chat completions go to the gateway; what it took and what failed printed."""
    began = time.monotonic()
    with Traffic("lab-containerd-upgrade") as traffic:
        run = upgrade(*extra)
    print(
        f"\n{what}: rc {run.rc}, {time.monotonic() - began:.0f} s; chat completions sent {traffic.sent}, "
        f"failed {len(traffic.failures)}" + "".join(f"\n  {f}" for f in traffic.failures)
    )
    return run, traffic


@pytest.fixture
def pinned_again() -> Iterator[None]:
    """Whatever happens, every node ends on the site's containerd (the playbook's undo) and schedulable."""
    before = cordoned()
    yield
    if any(installed(node) != PINNED_PACKAGE for node in NODES) or set(runtimes().values()) != {
        f"containerd://{PINNED}"
    }:
        back = upgrade()
        assert back.rc == 0, back.tail()
    assert cordoned() == before


def test_containerd_moves_one_node_at_a_time_under_traffic_and_back(pinned_again: None):
    assert set(runtimes().values()) == {f"containerd://{PINNED}"}, runtimes()
    policy = sh(NODES[1], "apt-cache policy containerd.io")
    assert f"Candidate: {PINNED_PACKAGE}" in policy and NEWER_PACKAGE in policy, policy

    # 1. the Kubernetes stage refuses the newer version before any change
    refused = playbook("playbooks/kubernetes.yml", *TO_NEWER, "--check", timeout=900)
    assert refused.rc != 0
    flat = " ".join(refused.output.split())
    says = f"containerd on the nodes is not the inventory's containerd_version {NEWER}"
    assert says in flat, refused.tail()
    assert "playbooks/upgrade-containerd.yml" in flat, refused.tail()

    # 2. the plan, and nothing changed
    plan = upgrade(*TO_NEWER, "--check")
    assert plan.rc == 0, plan.tail()
    flat = " ".join(plan.output.split())
    assert "containerd upgrade, one node at a time, the workers first, the control plane last" in flat
    assert f"{NODES[1]} (worker 1 of 2): containerd {PINNED} -> {NEWER}" in flat, plan.tail()
    assert f"{CONTROL_PLANE} (control plane, last): containerd {PINNED} -> {NEWER}" in flat, plan.tail()
    assert set(runtimes().values()) == {f"containerd://{PINNED}"}, runtimes()

    # 3. the upgrade, under traffic
    run, traffic = upgrade_under_traffic(f"upgrade {PINNED} -> {NEWER}", *TO_NEWER)
    assert run.rc == 0, run.tail()
    assert set(runtimes().values()) == {f"containerd://{NEWER}"}, runtimes()
    for node in NODES:
        assert installed(node) == NEWER_PACKAGE
        assert "containerd.io" in sh(node, "apt-mark showhold").split()
        assert f"{node}: containerd {PINNED} -> {NEWER}" in " ".join(run.output.split()), run.tail()
    assert cordoned() == []
    assert traffic.sent > 0
    assert traffic.failures == [], f"{len(traffic.failures)} of {traffic.sent} requests failed"

    # 4. back to the site's pin, under traffic too; then nothing to do
    back, back_traffic = upgrade_under_traffic(f"back {NEWER} -> {PINNED}")
    assert back.rc == 0, back.tail()
    assert set(runtimes().values()) == {f"containerd://{PINNED}"}, runtimes()
    assert {installed(node) for node in NODES} == {PINNED_PACKAGE}
    assert cordoned() == []
    assert back_traffic.failures == [], f"{len(back_traffic.failures)} of {back_traffic.sent} requests failed"

    again = upgrade("--check")
    assert again.rc == 0 and "Nothing to do: every node of the run runs its containerd_version" in " ".join(
        again.output.split()
    ), again.tail()
