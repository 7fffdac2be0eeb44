"""The main job on the lab: repair a half-built lab, converge playbooks/site.yml over SSH,
then prove it idempotent (second run and --check report changed=0 on every host).

    make lab-up && .venv/bin/pytest -m lab tests/lab/test_site_on_lab.py -v

Runs first in `make lab-test`: the other lab tests need the converged nodes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)"
    r"\s+unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


def env() -> dict[str, str]:
    return {
        **os.environ,
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / "tests/lab/containers.conf")),
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
    }


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, env=env(), timeout=300)


def on_node(node: str, command: str) -> subprocess.CompletedProcess[str]:
    return podman("exec", node, "sh", "-c", command)


def site(*extra: str) -> tuple[dict[str, dict[str, int]], str]:
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-playbook"),
            "-i",
            "inventories/lab/hosts.yml",
            "playbooks/site.yml",
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env(),
        timeout=1800,
    )
    output = proc.stdout + proc.stderr
    recap = {
        m["host"]: {k: int(v) for k, v in m.groupdict().items() if k != "host"}
        for m in RECAP.finditer(output)
    }
    assert proc.returncode == 0, (
        f"site.yml {' '.join(extra)} failed (rc {proc.returncode}):\n{output[-6000:]}"
    )
    assert set(recap) == set(NODES), f"PLAY RECAP lacks hosts: {sorted(recap)}\n{output[-3000:]}"
    return recap, output


def changed_tasks(output: str) -> list[str]:
    """The task headers followed by a `changed:` line, to name what broke idempotence."""
    names, current = [], ""
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            current = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith("changed:") and current not in names:
            names.append(current)
    return names


def kill_container_processes(name: str) -> None:
    """What the end of a session does to the lab: conmon and the container's init killed, while
    podman's records still say `running`."""
    pids = podman("inspect", name, "--format", "{{.State.ConmonPid}} {{.State.Pid}}").stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # killing conmon may have ended it already
            os.kill(int(pid), signal.SIGKILL)


def test_lab_up_repairs_a_half_created_lab():
    kill_container_processes("gpu-node-1")
    assert podman("rm", "-f", "-t", "2", "gpu-node-2").returncode == 0
    assert podman("stop", "-t", "2", "gpu-node-3").returncode == 0

    proc = subprocess.run(
        [sys.executable, "tests/lab/labctl.py", "up"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env(),
        timeout=900,
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    # podman sometimes notices the killed container itself (then it is restarted), sometimes not
    # (then labctl sees the dead processes and recreates it): either is a repair
    repaired = r"gpu-node-1: (its processes are gone .*; recreating it|was \w+; starting it)"
    assert re.search(repaired, proc.stdout), proc.stdout
    assert "gpu-node-2: created" in proc.stdout
    assert "gpu-node-3: was exited; starting it" in proc.stdout
    running = podman("ps", "--format", "{{.Names}}").stdout.split()
    assert set(NODES) <= set(running)


def test_site_converges_then_reports_no_change():
    first, _ = site()
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in first.values()), first

    second, output = site()
    assert {h: r["changed"] for h, r in second.items()} == dict.fromkeys(NODES, 0), changed_tasks(output)

    checked, output = site("--check", "--diff")
    assert {h: r["changed"] for h, r in checked.items()} == dict.fromkeys(NODES, 0), changed_tasks(output)


@pytest.mark.parametrize("node", NODES)
def test_pynvml_lists_the_four_simulated_a100s(node):
    script = (
        "import pynvml; pynvml.nvmlInit(); "
        "print('\\n'.join(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) "
        "for i in range(pynvml.nvmlDeviceGetCount())))"
    )
    proc = on_node(node, f'/opt/nvidia-ml-py/bin/python3 -c "{script}"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:4] == ["NVIDIA A100-PCIE-40GB"] * 4
    assert proc.stdout.strip().count("\n") == 3


def test_apt_policy_shows_the_stand_in_packages_from_the_lab_mirror():
    proc = on_node("gpu-node-1", "apt-cache policy cuda-drivers-535 cuda-toolkit-12-1")
    assert proc.returncode == 0, proc.stderr
    policy = proc.stdout
    assert "http://lab-mirror:8080/cuda/ubuntu2204/x86_64" in policy
    assert "Installed: 535.183.06-1" in policy
    assert "Installed: 12.1.1-1" in policy
    # the newer 535 release is visible but pinned away
    assert "535.216.03-1" in policy


def test_make_lab_on_the_converged_lab_changes_nothing_and_reports_every_node():
    """The README's main command, as an engineer runs it: lab-up, site.yml, then the report."""
    proc = subprocess.run(["make", "lab"], cwd=ROOT, capture_output=True, text=True, env=env(), timeout=1800)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    recap = {m["host"]: int(m["changed"]) for m in RECAP.finditer(output)}
    assert recap == dict.fromkeys(NODES, 0), changed_tasks(output)
    # one line per node; the YAML callback may wrap it once
    line = (
        r"msg: driver 535\.183\.06 \(CUDA 12\.2\), 4 x NVIDIA A100-PCIE-40GB,[^\n]*"  # first line
        r"(?:\n[^\n]*)?health (\w+)"  # and the wrapped rest, if any
    )
    report = re.findall(line, output)
    assert report == ["healthy"] * 3, output[-3000:]
