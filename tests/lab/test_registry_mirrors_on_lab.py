"""containerd_registry_mirrors and containerd_restrict_oom_score_adj (role containerd) on the running lab.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_registry_mirrors_on_lab.py -v

The lab is the feature's first user: its nodes reach no public registry and pull every image from the lab
mirror's OCI registry (TLS with the lab's own CA) under the unchanged names. On the converged lab:
- every node's containerd reads the role's registry hosts directory (`containerd config dump`) and has one
  hosts.toml, marked as the role's, for registry.k8s.io, quay.io, nvcr.io and docker.io, each with a CA;
- a worker pulls through CRI (crictl) an image named registry.k8s.io/... that it does not hold yet;
- a hosts.toml written while containerd runs is used by the next pull, and a removed one no longer is,
  without a restart of containerd (same MainPID): a made-up registry name pulls from the mirror only while
  its directory exists;
- restrict_oom_score_adj: the daemon runs with the lab inventory's value (true: the lab's nodes lack
  CAP_SYS_RESOURCE) and no pod sandbox's oom_score_adj is below containerd's own.
The node is left as found: the test's image and directory are removed.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml
from labrun import NODES, ROOT, on_node, running_nodes

pytestmark = pytest.mark.lab

CRICTL = "crictl --runtime-endpoint unix:///run/containerd/containerd.sock"
WORKER = "gpu-node-3"
ROLE_VARS = yaml.safe_load((ROOT / "roles/containerd/vars/main.yml").read_text())
CERTS_D = ROLE_VARS["__containerd_registry_config_dir"]
MARKER = ROLE_VARS["__containerd_registry_marker"]
KUBERNETES_VERSION = yaml.safe_load((ROOT / "roles/kubernetes/defaults/main.yml").read_text())[
    "kubernetes_version"
]
# on a worker: the control plane's image, which only gpu-node-1 runs
IMAGE_PATH = f"kube-apiserver:v{KUBERNETES_VERSION}"
MADE_UP_REGISTRY = "mirror-test.lab.invalid"


def run(node: str, command: str, timeout: int = 300) -> str:
    done = on_node(node, command, timeout=timeout)
    assert done.returncode == 0, f"{node}: {command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout


def containerd_pid(node: str) -> str:
    return run(node, "systemctl show containerd --property=MainPID --value").strip()


def drop_image(node: str, image: str) -> None:
    on_node(node, f"{CRICTL} rmi {shlex.quote(image)}", timeout=120)  # absent is fine


def pulls(node: str, image: str) -> bool:
    return on_node(node, f"timeout 120 {CRICTL} pull {shlex.quote(image)}", timeout=150).returncode == 0


@pytest.fixture(scope="module", autouse=True)
def lab() -> None:
    if WORKER not in running_nodes():
        pytest.skip("the lab is not running (make lab-up)")
    if on_node(WORKER, "test -S /run/containerd/containerd.sock").returncode != 0:
        pytest.skip("the Kubernetes stage has not run on the lab (make lab)")


@pytest.mark.parametrize("node", NODES)
def test_containerd_reads_the_mirrors_of_the_four_registries(node: str) -> None:
    config = tomllib.loads(run(node, "containerd config dump"))
    assert config["plugins"]["io.containerd.cri.v1.images"]["registry"]["config_path"] == CERTS_D
    for registry in ("registry.k8s.io", "quay.io", "nvcr.io", "docker.io"):
        assert on_node(node, f"test -f {CERTS_D}/{registry}/{MARKER}").returncode == 0, registry
        hosts = tomllib.loads(run(node, f"cat {CERTS_D}/{registry}/hosts.toml"))
        assert hosts["host"], f"{registry}: no mirror endpoint"
        for endpoint, settings in hosts["host"].items():
            assert endpoint.startswith("https://"), endpoint
            assert settings["capabilities"] == ["pull", "resolve"]
            assert "skip_verify" not in settings
            assert settings["ca"] == f"{CERTS_D}/{registry}/ca.crt"
        run(node, f"openssl x509 -noout -in {CERTS_D}/{registry}/ca.crt")


def test_a_worker_pulls_a_registry_k8s_io_image_through_the_mirror() -> None:
    image = f"registry.k8s.io/{IMAGE_PATH}"
    drop_image(WORKER, image)
    try:
        assert pulls(WORKER, image), f"{WORKER} could not pull {image} through the lab mirror"
    finally:
        drop_image(WORKER, image)


def test_a_hosts_toml_change_applies_to_the_next_pull_without_a_restart() -> None:
    # the made-up registry's directory: the lab's registry.k8s.io mirror, server the made-up name
    pid = containerd_pid(WORKER)
    directory = f"{CERTS_D}/{MADE_UP_REGISTRY}"
    image = f"{MADE_UP_REGISTRY}/{IMAGE_PATH}"
    hosts = Path(CERTS_D) / "registry.k8s.io" / "hosts.toml"
    drop_image(WORKER, image)
    try:
        run(
            WORKER,
            f"mkdir -p {directory} && sed 's|^server = .*|server = \"https://{MADE_UP_REGISTRY}\"|' {hosts}"
            f" > {directory}/hosts.toml",
        )
        assert pulls(WORKER, image), f"{image}: the new hosts.toml was not used"
        drop_image(WORKER, image)
        run(WORKER, f"rm -rf {directory}")
        assert not pulls(WORKER, image), f"{image} pulled after its hosts.toml was removed"
        assert containerd_pid(WORKER) == pid, "containerd restarted"
    finally:
        on_node(WORKER, f"rm -rf {directory}")
        drop_image(WORKER, image)


@pytest.mark.parametrize("node", NODES)
def test_no_sandbox_is_below_containerds_oom_score_adj(node: str) -> None:
    config = tomllib.loads(run(node, "containerd config dump"))
    assert config["plugins"]["io.containerd.cri.v1.runtime"]["restrict_oom_score_adj"] is True
    own = int(run(node, f"cat /proc/{containerd_pid(node)}/oom_score_adj"))
    pods = run(node, f"{CRICTL} pods -q --state ready").split()
    assert pods, f"{node}: no pod sandbox runs"
    for pod in pods:
        pid = json.loads(run(node, f"{CRICTL} inspectp -o json {pod}"))["info"]["pid"]
        score = int(run(node, f"cat /proc/{pid}/oom_score_adj"))
        assert score >= own, f"{node}: sandbox {pod} has oom_score_adj {score}, containerd {own}"
