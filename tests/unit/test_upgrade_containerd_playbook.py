"""playbooks/upgrade-containerd.yml, and the Kubernetes stage's refusal of a containerd_version the nodes do
not run (roles/containerd/tasks/check-running-version.yml), run by ansible-playbook against the real
control plane of the production pin (real_kube.py; test_gpu_health_agent.Cluster: three GPU Nodes), as
test_upgrade_kubernetes_playbook.py runs upgrade-kubernetes.yml: gpu-node-1 (the control plane), gpu-node-2
and gpu-node-3 are this machine (connection local). What each node runs is written as dpkg and the kubelet
show it: the containerd.io package through a dpkg-query of the node's own (first on the PATH of the node's
Python, which runs the modules: it prints the node's file `containerd.io`, "hi VERSION", and says "no
packages found" without one), and the Node's status.nodeInfo.containerRuntimeVersion through the API.

What runs here is everything before a change: each refusal (named variable, nothing changed), --check's
plan, the no-op, and the stage's refusal. The refusals run with --check: they come in the first play,
before the plan, in a real run as in --check (the playbook has one path through that play), and a refusal
that broke must not let a real run go on to the node plays, whose role containerd would add Docker's
repository and install containerd.io on this machine (every host here is local). The upgrade itself (the
packages of two releases, holds, containerd restarted under running pods) needs root on real nodes and the
mirror's packages: tests/lab/test_containerd_upgrade_on_lab.py (docs/runbook.md, "Upgrade containerd")."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from real_kube import ControlPlane, free_port
from test_gpu_health_agent import NODES, Cluster
from test_kubernetes_version_guard import STAGE, VALIDATION_PLAY, StageSite, plays, recap_failed
from test_oncall_playbooks import recap_changed
from test_upgrade_kubernetes_playbook import (
    BREAKER_REFUSES,
    HELD_BACK,
    RELEASES,
    UpgradeSite,
    said,
    upgrade_site,
)

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "upgrade-containerd.yml"
ANNOTATION = "upgrade-containerd.llm-platform.io/cordoned"
JAMMY = "-1~ubuntu.22.04~jammy"  # Docker's revision of containerd.io for Ubuntu 22.04
# the tasks that change a node or the cluster; none may run before the plan is accepted
CHANGES = (
    "TASK [Upgrade containerd on the",
    "TASK [Mark the Node as cordoned",
    "TASK [Drain",
    "TASK [Install and hold containerd.io",
    "TASK [containerd : Install containerd.io",
    "TASK [Restart containerd",
    "TASK [Uncordon the node",
)
FAKE_DPKG_QUERY = """#!/bin/sh
# dpkg-query --show --showformat=FORMAT containerd.io, as dpkg answers it for the node's file ../containerd.io
# ("hi VERSION"); and dpkg-query -W -f FORMAT, every package as packages_in_place reads them (role
# containerd's check-running-version.yml): dpkg itself, and containerd.io from that file
state="$(dirname "$0")/../containerd.io"
if [ "$1" = -W ]; then
  printf 'dpkg\\tamd64\\t1.21.1ubuntu2.6\\tinstall ok installed\\n'
  [ -f "$state" ] || exit 0
  set -- $(cat "$state")
  case "$1" in hi) want=hold ;; ii) want=install ;; *) echo "unexpected state: $1" >&2; exit 2 ;; esac
  printf 'containerd.io\\tamd64\\t%s\\t%s ok installed\\n' "$2" "$want"
  exit 0
fi
[ "$3" = containerd.io ] || { echo "unexpected: $*" >&2; exit 2; }
if [ -f "$state" ]; then printf '%s' "$(cat "$state")"; exit 0; fi
echo "dpkg-query: no packages found matching containerd.io" >&2
exit 1
"""
# apt-cache madison containerd.io, as apt answers it from the node's file ../containerd.io.madison (every
# version the tests name, unless a test leaves some out)
FAKE_APT_CACHE = """#!/bin/sh
[ "$1 $2" = "madison containerd.io" ] || { echo "unexpected: $*" >&2; exit 2; }
cat "$(dirname "$0")/../containerd.io.madison"
"""
# the test matrix with a row whose lines span two majors (1.6 to 3.0): the real matrix lists 2.x lines only,
# so the step from a major's last line to the next major's first is tested on this row (the playbook reads the
# matrix)
ACROSS_MAJORS = {
    **RELEASES,
    "1.36": {**RELEASES["1.36"], "containerd": ["1.6", "1.7", "2.0", "2.1", "2.2", "2.3", "3.0"]},
}
MADISON = "".join(
    f" containerd.io | 2.{minor}.{patch}{JAMMY} | https://download.docker.com/linux/ubuntu jammy/stable "
    "amd64 Packages\n"
    for minor in range(0, 6)
    for patch in range(0, 10)
)


class FakeDpkg:
    """Each node's containerd.io as dpkg-query reports it: a dpkg-query first on the PATH of the node's
    Python."""

    tmp: Path

    def fake_dpkg(self) -> None:
        for name in NODES:
            folder = self.tmp / name
            (folder / "bin").mkdir(exist_ok=True)
            query = folder / "bin" / "dpkg-query"
            query.write_text(FAKE_DPKG_QUERY)
            query.chmod(0o755)
            apt_cache = folder / "bin" / "apt-cache"
            apt_cache.write_text(FAKE_APT_CACHE)
            apt_cache.chmod(0o755)
            (folder / "containerd.io.madison").write_text(MADISON)
            python = folder / "python"
            shebang, rest = python.read_text().split("\n", 1)
            if "bin:$PATH" not in rest:
                python.write_text(f"{shebang}\nexport PATH={folder / 'bin'}:$PATH\n{rest}")

    def package(self, node: str, version: str | None) -> None:
        """NODE has containerd.io VERSION installed and held (None: not installed)."""
        state = self.tmp / node / "containerd.io"
        if version is None:
            state.unlink(missing_ok=True)
        else:
            state.write_text(f"hi {version}{JAMMY}")


class ContainerdSite(FakeDpkg, UpgradeSite):
    """The Kubernetes upgrade tests' site (versions written through the API), running
    upgrade-containerd.yml."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        super().__init__(cluster, tmp)
        self.fake_dpkg()

    def command(self, playbook: str, *args: str) -> list[str]:
        command = super().command(playbook, *args)
        command[3] = str(PLAYBOOK)
        return command

    def runs(
        self, containerd: dict[str, str | None], cluster: str = "1.36.3", default: str = "2.3.4"
    ) -> None:
        """Each node runs containerd DEFAULT (the package and the daemon its kubelet reports) unless
        CONTAINERD says otherwise (None: no containerd.io package)."""
        self.versions(cluster, containerd={n: containerd.get(n) or default for n in NODES})
        for name in NODES:
            self.package(name, containerd.get(name, default))

    def upgrade(
        self, *args: str, target: str | None = None, **extra: Any
    ) -> subprocess.CompletedProcess[str]:
        values: dict[str, Any] = {"kubernetes_releases": RELEASES, **extra}
        if target:
            values["containerd_version"] = target
        return self.play("upgrade-containerd.yml", "-e", json.dumps(values), *args)


@pytest.fixture(scope="module")
def site(
    kube_controllers: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ContainerdSite]:
    yield from upgrade_site(ContainerdSite, "upgrade-containerd", kube_controllers, tmp_path_factory)


@pytest.fixture
def fresh(site: ContainerdSite) -> Iterator[ContainerdSite]:
    site.reset()
    yield site
    site.reset()


def runtimes(site: ContainerdSite) -> dict[str, str]:
    return {n: site.cluster.node(n)["status"]["nodeInfo"]["containerRuntimeVersion"] for n in NODES}


def assert_nothing_changed(
    site: ContainerdSite, run: subprocess.CompletedProcess[str], before: dict[str, str], cordoned: list[str]
) -> None:
    assert site.cluster.cordoned() == cordoned, said(run)[-3000:]
    assert runtimes(site) == before
    for task in CHANGES:
        assert task not in run.stdout, task
    for name in NODES:
        annotations = site.cluster.node(name)["metadata"].get("annotations") or {}
        assert ANNOTATION not in annotations


@pytest.mark.parametrize(
    ("runs", "values", "expected"),
    [
        pytest.param(
            {}, {"containerd_version": "2.4.0"},
            'containerd_version "2.4.0" with kubernetes_version "1.36.3" is outside the supported matrix: '
            "Kubernetes 1.36 supports containerd 2.1, 2.2, 2.3",
            id="outside-the-matrix",
        ),
        pytest.param(
            {}, {"containerd_version": "2.3.5", "containerd_package_version": f"2.3.4{JAMMY}"},
            f'containerd_package_version "2.3.4{JAMMY}" is not a containerd.io package of '
            "containerd_version 2.3.5",
            id="package-not-of-the-version",
        ),
        pytest.param(
            {}, {"containerd_version": "2.2.5"},
            "containerd_version 2.2.5 is on an older line than gpu-node-2 runs "
            f"(containerd.io 2.3.4{JAMMY}): "
            "containerd supports no downgrade to an older minor line",
            id="downgrade-to-an-older-line",
        ),
        pytest.param(
            {n: "2.1.5" for n in NODES}, {"containerd_version": "2.3.4"},
            f"containerd_version 2.3.4 skips a minor line: gpu-node-2 runs containerd.io 2.1.5{JAMMY}, and "
            "containerd supports upgrades from the previous minor line only "
            '(its RELEASES.md, "Upgrade Path"). '
            "Set containerd_version to a 2.2 release first",
            id="skips-a-line",
        ),
        pytest.param(
            {n: "1.6.36" for n in NODES},
            {"containerd_version": "2.0.7", "kubernetes_releases": ACROSS_MAJORS},
            "containerd_version 2.0.7 is on 2.0, the first line of containerd 2, and gpu-node-2 runs "
            f"containerd.io 1.6.36{JAMMY}: containerd supports upgrades between sequential minor releases "
            'only and guarantees nothing across a major (its RELEASES.md, "Upgrade Path"), so 2.0 follows '
            "the last 1.x line alone. That is 1.7 (__containerd_major_last_lines, "
            "roles/containerd/vars/main.yml): set containerd_version to a 1.7 release first",
            id="next-major-from-a-line-before-the-last",
        ),
        pytest.param(
            {}, {"containerd_version": "3.0.0", "kubernetes_releases": ACROSS_MAJORS},
            "containerd_version 3.0.0 is on 3.0, the first line of containerd 3, and gpu-node-2 runs "
            f"containerd.io 2.3.4{JAMMY}: containerd supports upgrades between sequential minor releases "
            'only and guarantees nothing across a major (its RELEASES.md, "Upgrade Path"), so 3.0 follows '
            "the last 2.x line alone. containerd has not released a line after which 3.0 comes, as far as "
            "this project knows (no 2.x line in __containerd_major_last_lines, "
            "roles/containerd/vars/main.yml)",
            id="next-major-after-an-unrecorded-last-line",
        ),
        pytest.param(
            {}, {"containerd_version": "2.3.5", "drain_timeout": 0},
            "drain_timeout and upgrade_containerd_ready_timeout_s must be seconds > 0; got 0, 300.",
            id="drain-timeout-zero",
        ),
        pytest.param(
            {}, {"containerd_version": "2.3.5", "drain_timeout": "ten minutes"},
            "drain_timeout and upgrade_containerd_ready_timeout_s must be seconds > 0; "
            'got "ten minutes", 300.',
            id="drain-timeout-not-seconds",
        ),
        pytest.param(
            {}, {"containerd_version": "2.3.5", "kubernetes_version": "1.36.4"},
            "The cluster runs Kubernetes 1.36.3 (its kubelets: gpu-node-1 1.36.3, gpu-node-2 1.36.3, "
            "gpu-node-3 "
            "1.36.3); the inventory asks kubernetes_version 1.36.4.",
            id="kubernetes-version-not-the-clusters",
        ),
        pytest.param(
            {"gpu-node-3": None}, {"containerd_version": "2.3.5"},
            "gpu-node-3 has no containerd.io package installed (dpkg-query: dpkg-query: no packages found "
            "matching containerd.io)",
            id="no-containerd-io",
        ),
    ],
)  # fmt: skip
def test_refuses_naming_the_variable_before_any_change(
    fresh: ContainerdSite, runs: dict[str, str | None], values: dict[str, Any], expected: str
) -> None:
    fresh.runs(runs)
    before = runtimes(fresh)
    run = fresh.upgrade("--check", **values)
    assert run.returncode != 0, run.stdout
    assert expected in said(run), said(run)[-3000:]
    assert "TASK [Say the plan]" not in run.stdout
    assert_nothing_changed(fresh, run, before, [])


def test_a_node_that_does_not_answer_is_refused_by_name(fresh: ContainerdSite) -> None:
    """gpu-node-3 reached over SSH on a port nobody listens on: named, not left out of the run."""
    inventory = json.loads(fresh.inventory.read_text())
    workers = inventory["all"]["children"]["k8s_cluster"]["children"]["workers"]["hosts"]
    workers["gpu-node-3"] = {
        "ansible_connection": "ssh",
        "ansible_host": "127.0.0.1",
        "ansible_port": free_port(),
    }
    down = fresh.tmp / "hosts-down.json"
    down.write_text(json.dumps(inventory))
    fresh.runs({})
    before = runtimes(fresh)
    run = fresh.upgrade("--check", "-i", str(down), target="2.3.5")
    text = said(run)
    assert run.returncode != 0, text[-3000:]
    assert "gpu-node-3 did not answer (" in text, text[-4000:]
    assert "reads every node before it moves containerd_version on any" in text, text[-4000:]
    assert "TASK [Say the plan]" not in run.stdout
    assert_nothing_changed(fresh, run, before, [])


def test_check_prints_the_plan_workers_first_and_changes_nothing(fresh: ContainerdSite) -> None:
    fresh.runs({})
    before = runtimes(fresh)
    run = fresh.upgrade("--check", target="2.3.5")
    assert run.returncode == 0, said(run)[-3000:]
    text = said(run)
    todo = (
        f"containerd 2.3.4 -> 2.3.5 (containerd.io 2.3.4{JAMMY} -> 2.3.5{JAMMY}): drain, install and hold "
        "containerd.io, restart containerd, verify it, Ready on containerd://2.3.5, uncordon"
    )
    steps = [
        f"gpu-node-2 (worker 1 of 2): {todo}",
        f"gpu-node-3 (worker 2 of 2): {todo}",
        f"gpu-node-1 (control plane, last): {todo}",
    ]
    assert "containerd upgrade, one node at a time, the workers first, the control plane last" in text
    for step in steps:
        assert step in text, (step, text[-4000:])
    assert [text.index(step) for step in steps] == sorted(text.index(step) for step in steps)
    assert "Check mode: nothing was changed" in text, text[-3000:]
    assert set(recap_changed(run.stdout).values()) == {0}, run.stdout[-3000:]
    assert_nothing_changed(fresh, run, before, [])


def test_a_patch_release_back_within_the_line_is_planned(fresh: ContainerdSite) -> None:
    fresh.runs({}, default="2.3.5")
    run = fresh.upgrade("--check", target="2.3.4")
    assert run.returncode == 0, said(run)[-3000:]
    assert (
        f"gpu-node-2 (worker 1 of 2): containerd 2.3.5 -> 2.3.4 (a patch release back within its line) "
        f"(containerd.io 2.3.5{JAMMY} -> 2.3.4{JAMMY})" in said(run)
    ), said(run)[-3000:]


def test_the_next_line_is_planned(fresh: ContainerdSite) -> None:
    fresh.runs({}, default="2.2.5")
    run = fresh.upgrade("--check", target="2.3.4")
    assert run.returncode == 0, said(run)[-3000:]
    assert f"gpu-node-3 (worker 2 of 2): containerd 2.2.5 -> 2.3.4 (containerd.io 2.2.5{JAMMY}" in said(run)


def test_the_next_majors_first_line_is_planned_from_the_last_line_of_the_major(fresh: ContainerdSite) -> None:
    """1.7 is the last 1.x line (role containerd's __containerd_major_last_lines): 2.0 is the line after it.
    From 1.6 the same target is refused (above, next-major-from-a-line-before-the-last)."""
    fresh.runs({}, default="1.7.28")
    run = fresh.upgrade("--check", target="2.0.7", kubernetes_releases=ACROSS_MAJORS)
    assert run.returncode == 0, said(run)[-3000:]
    assert f"gpu-node-2 (worker 1 of 2): containerd 1.7.28 -> 2.0.7 (containerd.io 1.7.28{JAMMY}" in said(run)


def test_check_after_a_stopped_run_plans_only_what_is_left(fresh: ContainerdSite) -> None:
    """gpu-node-2 done; gpu-node-3's package installed but its kubelet still on the old daemon (the run
    stopped before the restart); the control plane not started. A node cordoned by hand stays cordoned. It
    counts against the circuit breaker as out of service: at the agents' 34% the control plane could not go
    out too (test_a_gpu_node_the_health_agent_cordoned_holds_the_others_back_before_any_change), so this
    site's share is 67% (two GPU nodes of three)."""
    fresh.runs({"gpu-node-2": "2.3.5"})
    fresh.package("gpu-node-3", "2.3.5")
    fresh.cluster.cordon_by_hand("gpu-node-3")
    before = runtimes(fresh)
    run = fresh.upgrade("--check", target="2.3.5", gpu_health_agent_max_cordoned_percent=67)
    assert run.returncode == 0, said(run)[-3000:]
    text = said(run)
    assert (
        f"gpu-node-2 (worker 1 of 2): containerd 2.3.5 (containerd.io 2.3.5{JAMMY}) already: nothing" in text
    )
    assert (
        "gpu-node-3 (worker 2 of 2): containerd 2.3.4 -> 2.3.5 "
        f"(containerd.io 2.3.5{JAMMY} -> 2.3.5{JAMMY}): drain, install and hold containerd.io, restart "
        "containerd, verify it, Ready on containerd://2.3.5, leave cordoned (it was before the run)" in text
    ), text[-4000:]
    assert "gpu-node-1 (control plane, last): containerd 2.3.4 -> 2.3.5" in text
    assert "cordoned before this run, left cordoned after it: gpu-node-3" in text
    assert_nothing_changed(fresh, run, before, ["gpu-node-3"])


def test_check_of_one_node_plans_only_it(fresh: ContainerdSite) -> None:
    fresh.runs({})
    run = fresh.upgrade("--check", "-l", "gpu-node-2", target="2.3.5")
    assert run.returncode == 0, said(run)[-3000:]
    text = said(run)
    assert "gpu-node-2 (worker 1 of 1): containerd 2.3.4 -> 2.3.5" in text, text[-3000:]
    assert "gpu-node-1 (" not in text and "gpu-node-3 (" not in text


def test_a_package_the_nodes_apt_cannot_install_is_refused_before_any_drain(fresh: ContainerdSite) -> None:
    """A containerd.io not in gpu-node-2's apt (a version the repository lacks, or a stale cache): refused
    naming containerd_package_version, before any node is drained (--check would have shown a clean plan)."""
    fresh.runs({})
    madison = fresh.tmp / "gpu-node-2" / "containerd.io.madison"
    madison.write_text("".join(line + "\n" for line in MADISON.splitlines() if f"2.3.5{JAMMY}" not in line))
    try:
        run = fresh.upgrade(target="2.3.5")
    finally:
        madison.write_text(MADISON)
    text = said(run)
    assert run.returncode != 0, text[-3000:]
    says = (
        f"containerd_package_version 2.3.5{JAMMY} is not among the containerd.io versions "
        "the apt of gpu-node-2"
    )
    assert says in text, text[-3000:]
    assert "TASK [Drain" not in run.stdout
    assert fresh.cluster.cordoned() == []


def test_a_gpu_node_the_health_agent_cordoned_holds_the_others_back_before_any_change(
    fresh: ContainerdSite,
) -> None:
    """gpu-node-3 cordoned by the GPU health agent: within the breaker's 34% (one GPU node of three) the run
    may take neither other node out: refused before any change, naming them and
    gpu_health_agent_max_cordoned_percent. gpu-node-3 alone (out already) may go, and stays cordoned."""
    fresh.runs({})
    fresh.cluster.cordon_by_agent("gpu-node-3")
    before = runtimes(fresh)
    run = fresh.upgrade("--check", target="2.3.5")
    text = said(run)
    assert run.returncode != 0, text[-3000:]
    # in the order the run takes them: the workers, then the control plane
    assert f"{BREAKER_REFUSES}gpu-node-2: {HELD_BACK}; gpu-node-1: {HELD_BACK}. " in text, text[-3000:]
    assert "or leave these out of the run (-l). Nothing was changed." in text
    assert "gpu-node-3: circuit" not in text
    assert "TASK [Say the plan]" not in run.stdout
    assert_nothing_changed(fresh, run, before, ["gpu-node-3"])

    run = fresh.upgrade("--check", "-l", "gpu-node-3", target="2.3.5")
    text = said(run)
    assert run.returncode == 0, text[-3000:]
    assert "gpu-node-3 (worker 1 of 1): containerd 2.3.4 -> 2.3.5" in text, text[-3000:]
    assert "leave cordoned (it was before the run)" in text
    assert "GPU nodes cordoned by others now: gpu-node-3" in text


def test_all_on_the_target_is_a_no_op(fresh: ContainerdSite) -> None:
    fresh.runs({})
    before = runtimes(fresh)
    run = fresh.upgrade(target="2.3.4")
    assert run.returncode == 0, said(run)[-3000:]
    text = said(run)
    assert "Nothing to do: every node of the run runs its containerd_version" in text, text[-3000:]
    assert set(recap_changed(run.stdout).values()) == {0}, run.stdout[-3000:]
    assert_nothing_changed(fresh, run, before, [])


# --- the Kubernetes stage: its validation play refuses what only this playbook may move ---------------------


class ContainerdStageSite(FakeDpkg, StageSite):
    """The Kubernetes version guard's site (the stage, or its validation play alone), with each node's
    containerd.io through the fake dpkg-query."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        super().__init__(cluster, tmp)
        self.fake_dpkg()
        # every node a member of the cluster (kubeadm's kubelet.conf), unless a test says otherwise
        self.kubelet_conf = tmp / "kubelet.conf"
        self.kubelet_conf.write_text("# a node's kubeconfig, as kubeadm join writes it\n")

    def run(
        self, *args: str, extra: dict[str, Any] | None = None, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        values = {"__kubernetes_kubelet_kubeconfig": str(self.kubelet_conf), **(extra or {})}
        return super().run(*args, extra=values, **kwargs)


@pytest.fixture(scope="module")
def stage_site(site: ContainerdSite, tmp_path_factory: pytest.TempPathFactory) -> ContainerdStageSite:
    """On the upgrade tests' cluster (one set of Nodes on the API server at a time)."""
    return ContainerdStageSite(site.cluster, tmp_path_factory.mktemp("containerd-guard-site"))


@pytest.fixture
def stage(stage_site: ContainerdStageSite) -> Iterator[ContainerdStageSite]:
    stage_site.reset()
    stage_site.versions("1.36.3")
    for name in NODES:
        stage_site.package(name, "2.3.4")
    yield stage_site
    stage_site.reset()


def stage_refused(run: subprocess.CompletedProcess[str], *expected: str) -> None:
    text = said(run)
    assert run.returncode != 0, text[-3000:]
    for part in expected:
        assert part in text, (part, text[-4000:])
    assert plays(run) == [VALIDATION_PLAY], plays(run)
    # every host fails: none goes on to the stage's next play
    assert {h for h, n in recap_failed(run.stdout).items() if n} == set(NODES), run.stdout[-3000:]
    assert set(recap_changed(run.stdout).values()) == {0}, run.stdout[-3000:]


def test_the_stage_refuses_a_raised_containerd_version_in_its_validation_play(
    stage: ContainerdStageSite,
) -> None:
    """The whole stage, --check: it stops in its validation play, before role containerd."""
    run = stage.run("--check", target="1.36.3", stage=True, extra={"containerd_version": "2.3.5"})
    stage_refused(
        run,
        "containerd on the nodes is not the inventory's containerd_version 2.3.5 "
        "(containerd_package_version): "
        f"gpu-node-1 runs containerd.io 2.3.4{JAMMY}, the inventory asks 2.3.5{JAMMY};",
        "This stage would install it on every node at once and restart containerd there",
        'run playbooks/upgrade-containerd.yml (--check first; docs/runbook.md, "Upgrade containerd";',
        "or set containerd_version back to 2.3.4. Nothing was changed.",
    )


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_the_validation_play_refuses_an_upgrade_left_half_way(
    stage: ContainerdStageSite, check: bool
) -> None:
    stage.package("gpu-node-2", "2.3.5")
    run = stage.run(*(["--check"] if check else []), target="1.36.3", extra={"containerd_version": "2.3.5"})
    stage_refused(
        run,
        f"gpu-node-1 runs containerd.io 2.3.4{JAMMY}, the inventory asks 2.3.5{JAMMY}; "
        f"gpu-node-3 runs containerd.io 2.3.4{JAMMY}, the inventory asks 2.3.5{JAMMY}.",
        "or set containerd_version back to what the nodes run.",
    )
    assert "gpu-node-2 runs containerd.io" not in said(run)


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_the_nodes_containerd_and_a_new_node_pass(stage: ContainerdStageSite, check: bool) -> None:
    """The inventory's containerd is the nodes'; gpu-node-3 has none yet (a new node): it converges as
    before."""
    stage.package("gpu-node-3", None)
    run = stage.run(*(["--check"] if check else []), target="1.36.3")
    assert run.returncode == 0, said(run)[-4000:]
    assert set(recap_changed(run.stdout).values()) == {0}, run.stdout[-3000:]
    assert "TASK [containerd : Refuse a containerd version other than the one the nodes run]" in run.stdout


def test_nodes_on_the_inventorys_containerd_are_read_once(stage: ContainerdStageSite) -> None:
    """Every node at containerd_package_version (a converged cluster): one read each (packages_in_place) tells
    that none is apart; the membership and dpkg reads are skipped on every node."""
    run = stage.run("--check", target="1.36.3")
    assert run.returncode == 0, said(run)[-4000:]
    for task in (
        "Read whether the node is a member of a cluster (kubeadm's kubelet.conf)",
        "Read the containerd.io package the node runs (dpkg)",
    ):
        shown = run.stdout.split(f"TASK [containerd : {task}]", 1)[1].split("TASK [", 1)[0]
        assert sorted(re.findall(r"^skipping: \[([^\]]+)\]", shown, re.M)) == sorted(NODES), shown
        assert "ok: [" not in shown, shown


def test_a_host_that_is_no_member_passes_with_another_containerd(stage: ContainerdStageSite) -> None:
    """No kubelet.conf (a node removed with remove-node.yml that joins again, a cluster whose kubeadm init
    never finished): nothing runs there to drain, so the stage may install the inventory's containerd."""
    missing = str(stage.kubelet_conf.with_name("absent.conf"))
    run = stage.run(
        "--check",
        target="1.36.3",
        extra={"containerd_version": "2.3.5", "__kubernetes_kubelet_kubeconfig": missing},
    )
    assert run.returncode == 0, said(run)[-4000:]


def test_validate_playbook_checks_the_running_containerd_as_the_stage_does() -> None:
    def included(play: dict[str, Any]) -> bool:
        for task in play["tasks"]:
            given = task.get("vars") or {}
            role = task.get("ansible.builtin.include_role") or {}
            if (role.get("name"), role.get("tasks_from")) == ("containerd", "check-running-version"):
                return True
            if (given.get("validate_role"), given.get("validate_tasks_from")) == (
                "containerd",
                "check-running-version",
            ):
                return True
        return False

    stage_play = yaml.safe_load(STAGE.read_text())[0]
    (play,) = [
        p
        for p in yaml.safe_load((ROOT / "playbooks/validate.yml").read_text())
        if p["name"].startswith("Kubernetes")
    ]
    assert included(stage_play) and included(play)


def test_the_docs_name_the_playbook() -> None:
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    assert "## Upgrade containerd" in runbook
    assert "| [Upgrade containerd](#upgrade-containerd) | `upgrade-containerd.yml` |" in runbook
    (row,) = [
        line
        for line in (ROOT / "README.md").read_text().splitlines()
        if "`playbooks/upgrade-containerd.yml`" in line and line.startswith("|")
    ]
    assert re.search(r'\(\[docs/runbook\.md\]\(docs/runbook\.md\), "Upgrade containerd"\) \|$', row), row
