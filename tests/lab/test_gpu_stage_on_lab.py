"""The GPU stage (playbooks/gpu.yml) on the running lab, over SSH (issue 4, Must show).

    .venv/bin/pytest tests/lab/test_gpu_stage_on_lab.py -m lab -v

Needs the lab up (`make lab-up`, docs/lab.md); skipped with the reason otherwise. Converges the stage on
the three nodes (unless they are: make test's site runs just did), then checks: a drifted power limit is put
back and reported as changed; wrong inventory values fail before any change, naming the variable. That a
second run and `--check` change nothing is proved for the whole of site.yml (this stage included) by
tests/lab/test_site_on_lab.py. `--check` on a fresh server (no CUDA repository yet) is run on a throw-away
container of the lab image (`gpu-check-fresh`, 10.89.42.19, reached with podman exec) and must report the
install, not fail.
What the converged nodes look like is checked by molecule/gpu_node/tests/test_gpu_node.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventories" / "lab" / "hosts.yml"
PLAYBOOK = ROOT / "playbooks" / "gpu.yml"
NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=\d+\s+failed=(?P<failed>\d+)"
)
# What a run that changes anything would touch on a converged node.
WATCHED = (
    "/var/lib/fake-nvml/state.json",
    "/etc/apt/preferences.d/nvidia-driver.pref",
    "/etc/gpu-tuning.json",
)


def podman(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    env.setdefault("CONTAINERS_CONF", str(ROOT / "tests" / "lab" / "containers.conf"))
    return subprocess.run(["podman", *args], capture_output=True, text=True, env=env, timeout=120)


def on_node(node: str, *command: str) -> str:
    proc = podman("exec", node, *command)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def playbook(*args: str, inventory: Path = INVENTORY) -> tuple[int, str, dict[str, dict[str, int]]]:
    """Run playbooks/gpu.yml on the lab; return rc, the whole output and the recap per host."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    env.setdefault("CONTAINERS_CONF", str(ROOT / "tests" / "lab" / "containers.conf"))
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), str(PLAYBOOK), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    output = proc.stdout + proc.stderr
    recap = {
        m["host"]: {"ok": int(m["ok"]), "changed": int(m["changed"]), "failed": int(m["failed"])}
        for m in map(RECAP.match, output.splitlines())
        if m
    }
    return proc.returncode, output, recap


def power_limits_w(node: str) -> list[int]:
    state = on_node(node, "fake-nvml", "show")
    return [int(w) for w in re.findall(r"power (\d+) W", state)]


def require_lab() -> None:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed: the lab is not set up here (make lab-up, docs/lab.md)")
    running = podman("ps", "--format", "{{.Names}}").stdout.split()
    down = [node for node in NODES if node not in running]
    if down:
        pytest.skip(f"lab nodes not running: {', '.join(down)} (make lab-up)")


FRESH = "gpu-check-fresh"
# on the lab network next to the nodes (.11-.13), clear of lab services (.3-.10) and molecule (.31-.59)
FRESH_IP = "10.89.42.19"
LAB_IMAGE = "localhost/llm-lab-node:bookworm"


@pytest.fixture
def fresh_node(tmp_path: Path) -> Iterator[Path]:
    """A never-converged server: a throw-away lab-image container; yields an inventory for it."""
    require_lab()
    podman("rm", "--force", "--time", "0", FRESH)
    started = podman(
        "run", "--detach", "--name", FRESH, "--hostname", FRESH, "--systemd", "always",
        "--network", "llmlab", "--ip", FRESH_IP, "--no-hosts", LAB_IMAGE, "/sbin/init",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        (tmp_path / "group_vars").mkdir()
        shutil.copy(
            INVENTORY.parent / "group_vars" / "gpu_nodes.yml", tmp_path / "group_vars" / "gpu_nodes.yml"
        )
        (tmp_path / "hosts.yml").write_text(
            "all:\n  children:\n    gpu_nodes:\n      hosts:\n"
            f"        {FRESH}:\n          ansible_connection: containers.podman.podman\n"
            "          ansible_python_interpreter: /usr/bin/python3\n"
        )
        yield tmp_path / "hosts.yml"
    finally:
        podman("rm", "--force", "--time", "0", FRESH)


def test_check_mode_on_a_fresh_node_reports_the_install(fresh_node: Path) -> None:
    rc, output, recap = playbook("--check", inventory=fresh_node)
    assert rc == 0, output[-4000:]
    assert recap[FRESH]["failed"] == 0
    assert recap[FRESH]["changed"] > 0
    assert "would install nvidia-headless-535=535.183.06-*, nvidia-utils-535=535.183.06-*" in " ".join(
        output.split()
    )
    assert "would install cuda-toolkit-12-1=12.1.1-*" in " ".join(output.split())
    # --check wrote nothing
    listing = podman("exec", FRESH, "ls", "/etc/apt/sources.list.d/").stdout.split()
    assert "cuda.sources" not in listing


@pytest.fixture(scope="module")
def converged() -> None:
    """The stage converged on the three nodes: in make test test_site_on_lab.py has just done it (its site
    runs include this stage), so the stage runs here only where a node lacks what it writes."""
    require_lab()
    present = [podman("exec", node, "test", "-s", path).returncode == 0 for node in NODES for path in WATCHED]
    if all(present):
        return
    rc, output, recap = playbook()
    assert rc == 0, output[-4000:]
    assert set(recap) == set(NODES)


def test_drifted_power_limit_is_put_back_and_reported(converged: None) -> None:
    on_node("gpu-node-2", "fake-nvml", "power", "--gpu", "1", "--limit-w", "180")
    assert power_limits_w("gpu-node-2")[1] == 180
    rc, output, recap = playbook("--limit", "gpu-node-2")
    assert rc == 0, output[-4000:]
    assert recap["gpu-node-2"]["changed"] >= 1
    assert power_limits_w("gpu-node-2") == [200, 200, 200, 200]


@pytest.mark.parametrize(
    ("extra_vars", "expected"),
    [
        ('{"gpu_tuning_power_limit_w": "abc"}', "gpu_tuning_power_limit_w"),
        ('{"nvidia_driver_branch": "abc"}', "nvidia_driver_branch must be a driver branch"),
        (
            '{"gpu_tuning_power_limit_w": 500}',
            "gpu_tuning_power_limit_w is 500 W, outside the range 150-250 W",
        ),
        ('{"gpu_tuning_nvlink_pairs": [[0, 1], [2, 7]]}', "gpu_tuning_nvlink_pairs names GPU index 7"),
        # key=value extra vars are strings: named, not a Python error, and not after the packages
        ("gpu_tuning_power_limit_w=180", "gpu_tuning_power_limit_w must be a whole number"),
        ("nvidia_driver_reboot=false", "nvidia_driver_reboot must be true or false"),
    ],
    ids=[
        "power-not-an-int",
        "branch-not-a-branch",
        "power-out-of-range",
        "nvlink-pair-no-such-gpu",
        "power-as-a-string",
        "reboot-as-a-string",
    ],
)
def test_wrong_values_fail_before_any_change(converged: None, extra_vars: str, expected: str) -> None:
    before = on_node("gpu-node-1", "sha256sum", *WATCHED)
    rc, output, recap = playbook("--limit", "gpu-node-1", "-e", extra_vars)
    assert rc != 0
    assert expected in output, output[-4000:]
    assert (recap["gpu-node-1"]["changed"], recap["gpu-node-1"]["failed"]) == (0, 1)
    # nothing ran past the pre-task validation: no role task at all
    assert "TASK [nvidia_driver : Start the run with no reason to reboot]" not in output
    after = on_node("gpu-node-1", "sha256sum", *WATCHED)
    assert before == after
