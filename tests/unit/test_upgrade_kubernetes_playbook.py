"""playbooks/upgrade-kubernetes.yml run by ansible-playbook against the real control plane of the production
pin (real_kube.py; test_gpu_health_agent.Cluster: three GPU Nodes), as test_remove_node_playbook.py runs
remove-node.yml: gpu-node-1 (the control plane), gpu-node-2 and gpu-node-3 are this machine (connection
local). The versions the playbook reads are written here as kubeadm and the kubelets write them: ConfigMap
kube-system/kubeadm-config's ClusterConfiguration (kubernetesVersion) and each Node's status.nodeInfo
(kubeletVersion, containerRuntimeVersion).

What runs here is everything before a change: each refusal, --check's plan, the no-op. The upgrade itself
(pkgs.k8s.io packages, kubeadm upgrade apply/node, kubelet restarts) needs root on real nodes and the packages
of both minors: the lab's to prove (docs/runbook.md, "Upgrade Kubernetes one minor").

roles/kubernetes/vars/main.yml has a row for 1.36 only; these tests give the playbook rows of their own for
the next minors (extra vars), as a site's matrix would have them once checked: the playbook reads the matrix,
it does not know which rows exist."""

from __future__ import annotations

import functools
import http.server
import json
import subprocess
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from real_kube import ControlPlane, Kubelets
from test_gpu_health_agent import NODES, Cluster
from test_oncall_playbooks import Site, recap_changed
from test_remove_node_playbook import said

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "upgrade-kubernetes.yml"
KUBEADM_CONFIG = "/api/v1/namespaces/kube-system/configmaps/kubeadm-config"
# the test's own matrix: 1.36 and 1.37 as roles/kubernetes has them, and a row for 1.38
PACKAGES = {"cni": "1.7.1-1.1"}
RELEASES = {
    "1.36": {"pause": "3.10.2", "containerd": ["2.1", "2.2", "2.3"], "cri_tools": "1.36.0-1.1", **PACKAGES},
    "1.37": {"pause": "3.10.2", "containerd": ["2.2", "2.3"], "cri_tools": "1.37.0-1.1", **PACKAGES},
    "1.38": {"pause": "3.10.2", "containerd": ["2.2", "2.3"], "cri_tools": "1.38.0-1.1", **PACKAGES},
}


def packages_index(minor: str, leave_out: Iterable[str] = ()) -> str:
    """The Packages index of pkgs.k8s.io's flat repository of MINOR (one per minor), as the test matrix's row
    has it: kubeadm, kubelet and kubectl of every patch 0 to 9, cri-tools and kubernetes-cni at the row's
    versions; LEAVE_OUT names "package=version" entries it lacks."""
    row = RELEASES[minor]
    entries = [
        *(f"{name}={minor}.{patch}-1.1" for name in ("kubeadm", "kubelet", "kubectl") for patch in range(10)),
        f"cri-tools={row['cri_tools']}",
        f"kubernetes-cni={row['cni']}",
    ]
    return "".join(
        f"Package: {name}\nArchitecture: amd64\nVersion: {version}\nFilename: {name}_{version}_amd64.deb\n"
        "Description: a stand-in of the test's repository\n\n"
        for name, version in (entry.split("=", 1) for entry in entries if entry not in set(leave_out))
    )


class Repository:
    """pkgs.k8s.io for the nodes: a flat repository per minor of the test matrix (v<minor>/deb/Packages),
    served over HTTP on 127.0.0.1 from a thread of the test process. The playbook reads each node's
    kubernetes_node_repo_url (-e: the inventory's value), which points here."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for minor in RELEASES:
            self.publish(minor)
        handler = functools.partial(QuietHandler, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="repository", daemon=True)
        self.thread.start()
        # kubernetes_node_repo_url as an inventory sets it: the minor templated in
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v{{{{ kubernetes_minor }}}}/deb/"

    def publish(self, minor: str, leave_out: Iterable[str] = ()) -> None:
        folder = self.root / f"v{minor}" / "deb"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "Packages").write_text(packages_index(minor, leave_out))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class UpgradeSite(Site):
    """The on-call tests' site, running upgrade-kubernetes.yml; the nodes' pkgs.k8s.io is Repository's."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        super().__init__(cluster, tmp)
        self.repository = Repository(tmp / "pkgs.k8s.io")

    def reset(self) -> None:
        """Site's reset, and the upgrade playbooks' own cordon marks taken off the Nodes too."""
        super().reset()
        for name in NODES:
            annotations = self.cluster.node(name)["metadata"].get("annotations") or {}
            marks = {k: None for k in annotations if k.endswith(".llm-platform.io/cordoned")}
            if marks:
                patch = {"metadata": {"annotations": marks}}
                self.cluster.admin.ok("PATCH", f"/api/v1/nodes/{name}", patch, "application/merge-patch+json")

    def close(self) -> None:
        self.repository.close()

    def command(self, playbook: str, *args: str) -> list[str]:
        command = super().command(playbook, *args)
        command[3] = str(PLAYBOOK)  # Site's commands name playbooks/remediate/<playbook>
        return command

    def upgrade(self, *args: str, target: str | None = None) -> subprocess.CompletedProcess[str]:
        extra = {
            "kubernetes_releases": RELEASES,
            "kubernetes_node_repo_url": self.repository.url,
            # role kubernetes_node's checks run on the nodes that install (this machine, which may be a
            # container on cgroup v1): the nodes' cgroups are not what these tests are about
            "kubernetes_node_allow_cgroup_v1": True,
        }
        if target:
            extra["kubernetes_version"] = target
        return self.play("upgrade-kubernetes.yml", "-e", json.dumps(extra), *args)

    def versions(
        self, cluster: str, kubelets: dict[str, str] | None = None, containerd: dict[str, str] | None = None
    ) -> None:
        """The cluster on CLUSTER (kubeadm-config), each kubelet on CLUSTER unless KUBELETS says otherwise,
        each node's containerd 2.3.4 unless CONTAINERD says otherwise."""
        admin = self.cluster.admin
        admin.request("DELETE", KUBEADM_CONFIG)
        configuration = (
            "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n"
            f"kubernetesVersion: v{cluster}\nnetworking:\n  podSubnet: 10.244.0.0/16\n"
        )
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
            "data": {"ClusterConfiguration": configuration},
        }
        admin.ok("POST", "/api/v1/namespaces/kube-system/configmaps", body)
        for name in NODES:
            info = {
                "kubeletVersion": f"v{(kubelets or {}).get(name, cluster)}",
                "containerRuntimeVersion": f"containerd://{(containerd or {}).get(name, '2.3.4')}",
            }
            admin.ok(
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                {"status": {"nodeInfo": info}},
                "application/merge-patch+json",
            )

    def kubeadm_config(self) -> dict[str, Any]:
        return self.cluster.admin.ok("GET", KUBEADM_CONFIG)["data"]

    def node_infos(self) -> dict[str, dict[str, Any]]:
        return {name: self.cluster.node(name)["status"]["nodeInfo"] for name in NODES}


SiteT = TypeVar("SiteT", bound=UpgradeSite)


def upgrade_site(
    kind: type[SiteT], name: str, kube_controllers: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SiteT]:
    """A site of KIND on its own Cluster, the Nodes' kubelets running, cleaned up after the module (the
    upgrade playbooks' tests: this file's and test_upgrade_containerd_playbook.py's)."""
    cluster = Cluster(kube_controllers, tmp_path_factory.mktemp(f"{name}-api"))
    kubelets = Kubelets(kube_controllers, NODES)
    made = kind(cluster, tmp_path_factory.mktemp(f"{name}-site"))
    with kubelets:
        yield made
        made.reset()
        cluster.admin.request("DELETE", KUBEADM_CONFIG)
    made.close()
    cluster.close()
    assert not kubelets.errors, kubelets.errors


@pytest.fixture(scope="module")
def site(kube_controllers: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpgradeSite]:
    yield from upgrade_site(UpgradeSite, "upgrade-k8s", kube_controllers, tmp_path_factory)


@pytest.fixture
def fresh(site: UpgradeSite) -> Iterator[UpgradeSite]:
    site.reset()
    yield site
    site.reset()


def assert_nothing_changed(
    site: UpgradeSite, run: subprocess.CompletedProcess[str], cluster: str, cordoned: Iterable[str] = ()
) -> None:
    assert site.cluster.cordoned() == list(cordoned), said(run)[-3000:]
    assert f"kubernetesVersion: v{cluster}" in site.kubeadm_config()["ClusterConfiguration"]
    changes = ("Unhold kubeadm", "Drain", "Upgrade the control plane, kubeadm", "Restart the kubelet")
    for task in changes:
        assert f"TASK [{task}" not in run.stdout, task


@pytest.mark.parametrize(
    ("cluster", "kubelets", "containerd", "target", "expected"),
    [
        pytest.param(
            "1.36.3", {}, {}, "1.38.0",
            "kubernetes_version 1.38.0 is more than one minor above the cluster's 1.36.3",
            id="skips-a-minor",
        ),
        pytest.param(
            "1.36.3", {}, {}, "1.36.2",
            "kubernetes_version 1.36.2 is older than the cluster's 1.36.3",
            id="downgrade",
        ),
        pytest.param(
            "1.36.3", {}, {"gpu-node-3": "2.1.5"}, "1.37.1",
            "kubernetes_version 1.37.1 (Kubernetes 1.37) supports containerd 2.2, 2.3 "
            "(roles/kubernetes/vars/main.yml): gpu-node-3 runs containerd 2.1.5",
            id="containerd-outside-the-matrix",
        ),
        pytest.param(
            "1.36.3", {"gpu-node-3": "1.35.9"}, {}, "1.37.1",
            "mixed minors (gpu-node-1 1.36.3, gpu-node-2 1.36.3, gpu-node-3 1.35.9; "
            "the control plane 1.36.3): gpu-node-3 out of step",
            id="mixed-minors",
        ),
    ],
)  # fmt: skip
def test_refuses_naming_kubernetes_version_before_any_change(
    fresh: UpgradeSite,
    cluster: str,
    kubelets: dict[str, str],
    containerd: dict[str, str],
    target: str,
    expected: str,
) -> None:
    fresh.versions(cluster, kubelets, containerd)
    before = fresh.node_infos()
    run = fresh.upgrade(target=target)
    assert run.returncode != 0, run.stdout
    assert expected in said(run), said(run)[-3000:]
    assert_nothing_changed(fresh, run, cluster)
    assert fresh.node_infos() == before


def test_a_minor_outside_the_matrix_is_refused_by_the_release_role(fresh: UpgradeSite) -> None:
    fresh.versions("1.36.3")
    run = fresh.upgrade(target="1.39.0")
    assert run.returncode != 0, run.stdout
    assert "kubernetes_version must be 1.MINOR.PATCH of a minor in the supported matrix" in said(run)
    assert_nothing_changed(fresh, run, "1.36.3")


@pytest.mark.parametrize(
    ("missing", "listed"),
    [
        pytest.param("kubelet=1.37.1-1.1", "kubelet 1.37.0-1.1, 1.37.2-1.1", id="the-target-kubelet"),
        pytest.param("cri-tools=1.37.0-1.1", "no cri-tools", id="the-rows-cri-tools"),
    ],
)
def test_a_package_the_repository_lacks_is_refused_before_any_drain(
    fresh: UpgradeSite, missing: str, listed: str
) -> None:
    """The target minor's repository (which the nodes' apt has not been given yet: it is added in the node
    plays) lacks one package the nodes would install: refused naming kubernetes_version, the package and its
    version, before the control plane or any node is touched (a real run: --check would pass the plan too)."""
    fresh.versions("1.36.3")
    before = fresh.node_infos()
    fresh.repository.publish("1.37", leave_out=[missing])
    try:
        run = fresh.upgrade(target="1.37.1")
    finally:
        fresh.repository.publish("1.37")
    text = said(run)
    assert run.returncode != 0, text[-3000:]
    name, version = missing.split("=")
    url = fresh.repository.url.replace("{{ kubernetes_minor }}", "1.37")
    for node in NODES:
        assert (
            f"kubernetes_version 1.37.1: the repository {node} would install Kubernetes 1.37 from ({url}, "
            f"kubernetes_node_repo_url) has no {name} {version} (the index has {listed}"
        ) in text, text[-3000:]
    assert "Nothing was changed." in text
    assert "TASK [Set the pkgs.k8s.io repository" not in run.stdout
    assert_nothing_changed(fresh, run, "1.36.3")
    assert fresh.node_infos() == before


def test_a_repository_the_nodes_cannot_read_is_refused_before_any_drain(fresh: UpgradeSite) -> None:
    fresh.versions("1.36.3")
    index = fresh.repository.root / "v1.37" / "deb" / "Packages"
    index.unlink()
    try:
        run = fresh.upgrade(target="1.37.1")
    finally:
        fresh.repository.publish("1.37")
    text = said(run)
    assert run.returncode != 0, text[-3000:]
    url = fresh.repository.url.replace("{{ kubernetes_minor }}", "1.37")
    assert (
        "kubernetes_version 1.37.1: gpu-node-2 cannot read the package index of the repository it would "
        f"install Kubernetes 1.37 from ({url}Packages, kubernetes_node_repo_url: 404"
    ) in text, text[-3000:]
    assert_nothing_changed(fresh, run, "1.36.3")


def test_check_prints_the_plan_in_order_and_changes_nothing(fresh: UpgradeSite) -> None:
    fresh.versions("1.36.3")
    run = fresh.upgrade("--check", target="1.37.1")
    assert run.returncode == 0, run.stdout + run.stderr
    text = said(run)
    steps = [
        "gpu-node-1 (control plane): the cluster 1.36.3 -> 1.37.1 (kubeadm upgrade plan, "
        "kubeadm upgrade apply v1.37.1 --yes), then its kubelet 1.36.3 -> 1.37.1",
        "gpu-node-2 (worker 1 of 2): kubelet 1.36.3 -> 1.37.1",
        "gpu-node-3 (worker 2 of 2): kubelet 1.36.3 -> 1.37.1",
    ]
    for step in steps:
        assert step in text, (step, text[-4000:])
    assert [text.index(step) for step in steps] == sorted(text.index(step) for step in steps)
    assert "Check mode: nothing was changed" in text, text[-3000:]
    assert set(recap_changed(run.stdout).values()) == {0}, run.stdout[-3000:]
    assert_nothing_changed(fresh, run, "1.36.3")


def test_check_after_a_stopped_run_plans_only_what_is_left(fresh: UpgradeSite) -> None:
    """The control plane and gpu-node-2 on 1.37.1, gpu-node-3 still on 1.36.3: a run that stopped at
    gpu-node-3. Running again (same kubernetes_version) finishes it."""
    fresh.versions("1.37.1", {"gpu-node-3": "1.36.3"})
    run = fresh.upgrade("--check", target="1.37.1")
    assert run.returncode == 0, run.stdout + run.stderr
    text = said(run)
    assert "gpu-node-3 (worker 2 of 2): kubelet 1.36.3 -> 1.37.1" in text, text[-4000:]
    assert "gpu-node-1 (control plane): on 1.37.1 already" in text, text[-4000:]
    assert "gpu-node-2 (worker 1 of 2): on 1.37.1 already" in text, text[-4000:]
    assert_nothing_changed(fresh, run, "1.37.1")


MARK = "upgrade-kubernetes.llm-platform.io/cordoned"  # the playbook's upgrade_kubernetes_annotation
# the cordon circuit breaker's refusal (playbooks/tasks/breaker-plan.yml) with one GPU node of three out
BREAKER_REFUSES = (
    "The cordon circuit breaker (gpu_health_agent_max_cordoned_percent 34: at most 1 GPU node(s) out of "
    "service at once, never the last schedulable one) does not let this run take out "
)
HELD_BACK = (
    "circuit breaker: 1 of 3 GPU nodes cordoned already (gpu-node-3), at most 1 may be (34% of the GPU "
    "nodes, never the last schedulable one)"
)


def test_a_gpu_node_the_health_agent_cordoned_holds_the_others_back_before_any_change(
    fresh: UpgradeSite,
) -> None:
    """gpu-node-3 cordoned by the GPU health agent: within the breaker's 34% (one GPU node of three) the run
    may take no other GPU node out, and it cannot leave one out (every kubelet moves): refused before any
    change, naming the nodes held back and gpu_health_agent_max_cordoned_percent. gpu-node-3 itself, out
    already, is no reason to refuse; with a wider share (the agents' setting, -e) the run plans and leaves it
    cordoned."""
    fresh.versions("1.36.3")
    fresh.cluster.cordon_by_agent("gpu-node-3")
    before = fresh.node_infos()
    run = fresh.upgrade(target="1.37.1")
    text = said(run)
    assert run.returncode != 0, text[-3000:]
    assert f"{BREAKER_REFUSES}gpu-node-1: {HELD_BACK}; gpu-node-2: {HELD_BACK}. " in text, text[-3000:]
    assert "none can be left out" in text and "Nothing was changed." in text
    assert "gpu-node-3: circuit" not in text
    assert "PLAY [Upgrade Kubernetes - check each node" not in run.stdout
    assert_nothing_changed(fresh, run, "1.36.3", ["gpu-node-3"])
    assert fresh.node_infos() == before
    for name in NODES:
        assert MARK not in (fresh.cluster.node(name)["metadata"].get("annotations") or {})

    wider = fresh.upgrade(
        "--check", "-e", json.dumps({"gpu_health_agent_max_cordoned_percent": 67}), target="1.37.1"
    )
    text = said(wider)
    assert wider.returncode == 0, text[-3000:]
    assert (
        "the circuit breaker allows 2 GPU node(s) out of service at once "
        "(gpu_health_agent_max_cordoned_percent); GPU nodes cordoned by others now: gpu-node-3" in text
    ), text[-3000:]
    assert "cordoned before this run, left cordoned after it: gpu-node-3" in text


def test_a_node_a_stopped_run_left_cordoned_is_finished_though_on_the_target(fresh: UpgradeSite) -> None:
    """Everything on 1.37.1, but gpu-node-1 still cordoned with this playbook's mark: a run that stopped at
    its uncordon (the lab's first 1.37 upgrade: the API restarting under the new kubelet). Running again
    finishes it; a node a person cordoned (no mark) is no reason to run."""
    fresh.versions("1.37.1")
    merge = "application/merge-patch+json"
    fresh.cluster.cordon_by_hand("gpu-node-3")
    person = fresh.upgrade("--check", target="1.37.1")
    assert "Nothing to do: the control plane and every kubelet run 1.37.1" in said(person), said(person)[
        -3000:
    ]
    marked = {"spec": {"unschedulable": True}, "metadata": {"annotations": {MARK: "true"}}}
    fresh.cluster.admin.ok("PATCH", "/api/v1/nodes/gpu-node-1", marked, merge)
    try:
        run = fresh.upgrade("--check", target="1.37.1")
        assert run.returncode == 0, run.stdout + run.stderr
        text = said(run)
        assert "Nothing to do" not in text, text[-3000:]
        assert (
            "gpu-node-1 (control plane): on 1.37.1 already, but left cordoned by a run that stopped: its "
            "steps again (drain, restart; the packages are in place), uncordon" in text
        ), text[-3000:]
        assert "gpu-node-3 (worker 2 of 2): on 1.37.1 already: nothing" in text, text[-3000:]
        assert "cordoned before this run, left cordoned after it: gpu-node-3" in text, text[-3000:]
    finally:
        unmark = {"metadata": {"annotations": {MARK: None}}}
        fresh.cluster.admin.ok("PATCH", "/api/v1/nodes/gpu-node-1", unmark, merge)


# one node taken out of service as the three upgrade playbooks' node tasks do: the shared task file alone
CORDON_PLAY = """
- name: Take one node out of service within the circuit breaker (tasks/cordon-within-breaker.yml)
  hosts: "{{{{ node }}}}"
  gather_facts: false
  tasks:
    - name: Load the API client's settings
      ansible.builtin.include_role:
        name: kubernetes_api_client
        tasks_from: validate
        public: true

    - name: Cordon within the circuit breaker
      ansible.builtin.include_tasks: {tasks}
      vars:
        __cordon_by: upgrade-kubernetes.yml
        __cordon_what: kubernetes-upgrade
        __cordon_annotation: {mark}
        __cordon_keep: "{{{{ keep | default(false) | bool }}}}"
        __cordon_api_host: gpu-node-1
"""


def cordon_within_breaker(
    site: UpgradeSite, node: str, *args: str, inventory: Path | None = None
) -> subprocess.CompletedProcess[str]:
    play = site.tmp / "cordon-within-breaker.yml"
    play.write_text(
        CORDON_PLAY.format(tasks=ROOT / "playbooks" / "tasks" / "cordon-within-breaker.yml", mark=MARK)
    )
    command = Site.command(site, str(play), "-e", f"node={node}", *args)
    if inventory:
        command[2] = str(inventory)
    return subprocess.run(command, cwd=ROOT, env=site.env(), capture_output=True, text=True, timeout=300)


def lease_holder(site: UpgradeSite) -> Any:
    return site.cluster.admin.ok("GET", site.cluster.lease_path)["spec"].get("holderIdentity")


def test_the_shared_cordon_takes_a_gpu_node_out_within_the_breaker_and_gives_the_lease_back(
    fresh: UpgradeSite,
) -> None:
    run = cordon_within_breaker(fresh, "gpu-node-2")
    assert run.returncode == 0, said(run)[-3000:]
    assert fresh.cluster.cordoned() == ["gpu-node-2"]
    annotations = fresh.cluster.node("gpu-node-2")["metadata"]["annotations"]
    assert annotations[MARK].startswith("cordoned by upgrade-kubernetes.yml for the kubernetes-upgrade at ")
    history = json.loads(annotations["gpu-health.llm-platform.io/history"])
    assert history[-1]["action"] == "kubernetes-upgrade" and history[-1]["by"] == "upgrade-kubernetes.yml"
    assert lease_holder(fresh) is None

    # the same node again (a run that stopped after its cordon): out already, left as it is
    fresh.cluster.cordon_by_agent("gpu-node-3")
    again = cordon_within_breaker(fresh, "gpu-node-2")
    assert again.returncode == 0, said(again)[-3000:]


def test_the_shared_cordon_refuses_a_gpu_node_past_the_breaker_and_gives_the_lease_back(
    fresh: UpgradeSite,
) -> None:
    fresh.cluster.cordon_by_agent("gpu-node-3")
    run = cordon_within_breaker(fresh, "gpu-node-2")
    assert run.returncode != 0, said(run)[-3000:]
    assert (
        f"NOT taking gpu-node-2 out of service: {HELD_BACK} (gpu_health_agent_max_cordoned_percent 34)"
        in said(run)
    ), said(run)[-3000:]
    assert fresh.cluster.cordoned() == ["gpu-node-3"]
    assert MARK not in (fresh.cluster.node("gpu-node-2")["metadata"].get("annotations") or {})
    assert lease_holder(fresh) is None


def test_the_shared_cordon_takes_a_node_outside_the_gpu_nodes_out_uncounted(fresh: UpgradeSite) -> None:
    """gpu-node-2 not in the inventory's gpu_nodes: the breaker does not count it (it guards GPU capacity), so
    with gpu-node-3 cordoned by the agent it is cordoned all the same, marked; one cordoned before the run by
    someone else (keep) is left as it is."""
    inventory = json.loads(fresh.inventory.read_text())
    inventory["all"]["children"]["gpu_nodes"] = {"hosts": {"gpu-node-1": {}, "gpu-node-3": {}}}
    hosts = fresh.tmp / "hosts-one-cpu-node.json"
    hosts.write_text(json.dumps(inventory))
    fresh.cluster.cordon_by_agent("gpu-node-3")
    run = cordon_within_breaker(fresh, "gpu-node-2", inventory=hosts)
    assert run.returncode == 0, said(run)[-3000:]
    assert fresh.cluster.cordoned() == ["gpu-node-2", "gpu-node-3"]
    annotations = fresh.cluster.node("gpu-node-2")["metadata"]["annotations"]
    assert annotations[MARK].startswith("cordoned by upgrade-kubernetes.yml for the kubernetes-upgrade at ")
    assert "gpu-health.llm-platform.io/history" not in annotations

    fresh.reset()
    fresh.cluster.cordon_by_hand("gpu-node-2")
    keep = cordon_within_breaker(fresh, "gpu-node-2", "-e", "keep=true", inventory=hosts)
    assert keep.returncode == 0, said(keep)[-3000:]
    assert MARK not in (fresh.cluster.node("gpu-node-2")["metadata"].get("annotations") or {})


def test_all_on_the_target_is_a_no_op(fresh: UpgradeSite) -> None:
    fresh.versions("1.36.3")
    run = fresh.upgrade(target="1.36.3")
    assert run.returncode == 0, run.stdout + run.stderr
    text = said(run)
    assert "Nothing to do: the control plane and every kubelet run 1.36.3" in text, text[-3000:]
    assert set(recap_changed(run.stdout).values()) == {0}, run.stdout[-3000:]
    assert_nothing_changed(fresh, run, "1.36.3")
