"""The driver's pin on a lab node (issue 16, item 2, Must show): the role's pin installs and holds one
consistent set of the branch, at the pinned build, although the lab mirror offers a newer one.

    make lab && .venv/bin/pytest -m lab tests/lab/test_driver_pin_on_lab.py -v

Needs the converged lab (make lab; skipped otherwise). What apt does with only the seven packages the role
pinned before is shown without a lab by tests/unit/test_driver_packages.py (this machine's apt-get -s against
the same stand-ins); here the converged node must show the other half: every installed package of the branch
(the role's own pattern, read from its vars) at nvidia_driver_version, every one held, the newer build visible
but no candidate, no display package.
"""

from __future__ import annotations

import re

import pytest
import yaml
from labrun import NODES, ROOT, on_node, running_nodes
from unit.role_render import RoleVars

pytestmark = pytest.mark.lab

LAB_GPU_VARS = yaml.safe_load((ROOT / "inventories/lab/group_vars/gpu_nodes.yml").read_text())
DRIVER = RoleVars(
    "nvidia_driver", **{k: v for k, v in LAB_GPU_VARS.items() if k.startswith("nvidia_driver_")}
)
VERSION = DRIVER["nvidia_driver_version"]
BRANCH = DRIVER["nvidia_driver_branch"]
NEWER = "535.216.03"  # tests/lab/mirror/packages.yml: the newer build of the branch
PATTERN = re.compile(DRIVER["__nvidia_driver_branch_package_regex"])  # the role's own pattern


@pytest.fixture(scope="module", autouse=True)
def lab() -> None:
    down = [node for node in NODES if node not in running_nodes()]
    if down:
        pytest.skip(f"lab nodes not running: {', '.join(down)} (make lab)")


def installed(node: str) -> dict[str, str]:
    proc = on_node(node, "dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\\n'")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    return {name: version for name, version, status in rows if status == "installed"}


@pytest.mark.parametrize("node", NODES)
def test_every_package_of_the_branch_is_at_the_pinned_build_and_held(node: str) -> None:
    branch = {name: version for name, version in installed(node).items() if PATTERN.match(name)}
    assert {"nvidia-headless-535", "nvidia-utils-535", "nvidia-dkms-535", "libnvidia-compute-535"} <= set(
        branch
    )
    assert {name: v for name, v in branch.items() if not v.startswith(f"{VERSION}-")} == {}, (
        "one consistent set"
    )
    held = set(on_node(node, "apt-mark showhold").stdout.split())
    assert sorted(set(branch) - held) == [], "every installed package of the branch is held"


@pytest.mark.parametrize("node", NODES)
def test_the_newer_build_is_offered_but_pinned_away(node: str) -> None:
    policy = on_node(node, f"apt-cache policy nvidia-headless-{BRANCH} libnvidia-gl-{BRANCH}").stdout
    assert f"{NEWER}-" in policy
    candidates = re.findall(r"Candidate: (\S+)", policy)
    assert candidates and all(c.startswith(f"{VERSION}-") for c in candidates), policy


@pytest.mark.parametrize("node", NODES)
def test_a_headless_node_has_no_display_driver(node: str) -> None:
    present = set(installed(node))
    assert (
        not {f"nvidia-driver-{BRANCH}", f"cuda-drivers-{BRANCH}", f"xserver-xorg-video-nvidia-{BRANCH}"}
        & present
    )


def test_apt_refuses_to_move_one_package_of_the_branch_alone() -> None:
    """The holds and the pin together: asking apt for the newer build of one part changes nothing."""
    proc = on_node(NODES[0], f"apt-get -s install libnvidia-compute-{BRANCH}={NEWER}-0ubuntu1")
    assert proc.returncode != 0 or f"Inst libnvidia-compute-{BRANCH}" not in proc.stdout, proc.stdout
