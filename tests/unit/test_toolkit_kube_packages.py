"""The container toolkit (role containerd) and the kube packages (role kubernetes_node): pinned and held as
the real repositories publish them (issue 16, item 2).

nvidia-container-toolkit depends on nvidia-container-toolkit-base and libnvidia-container-tools at exactly
its own version, the tools on libnvidia-container1 (>= theirs): pinning the toolkit and its base alone, with a
newer release in the repository, fails ("Depends: libnvidia-container-tools (= 1.18.1-1) but 1.18.2-1 is to
be installed"). pkgs.k8s.io's kubeadm 1.36 depends on nothing and kubelet on kubernetes-cni (>= 1.2.0) only
(kubernetes/release cmd/krel/templates/latest/metadata.yaml): unpinned, kubernetes-cni drifts to the newest
build and cri-tools (crictl, which on-call uses) is not installed at all. Proven with this machine's apt-get
in simulation against the lab mirror's stand-ins, with the roles' own pin content.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from apt_sim import MIRROR, AptSim, build_mirror_module, build_repo, missing_tools
from role_render import ROOT, RoleVars

SPEC = yaml.safe_load((MIRROR / "packages.yml").read_text())
TOOLKIT = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]
KUBE = ["kubeadm", "kubelet", "kubectl", "cri-tools", "kubernetes-cni"]
# the node's distribution packages the kube packages' Depends name (tests/lab/mirror/build_mirror.py)
DISTRIBUTION = {"python3": "3.11.2-1+b1", "python3-yaml": "6.0-3+b2", "openssl": "3.0.15-1~deb12u1"}


def task(role: str, path: str, name_start: str) -> dict:
    tasks = yaml.safe_load((ROOT / "roles" / role / "tasks" / path).read_text())
    (found,) = [t for t in tasks if t.get("name", "").startswith(name_start)]
    return found


def containerd(**overrides: object) -> RoleVars:
    kubernetes = yaml.safe_load((ROOT / "roles/kubernetes/defaults/main.yml").read_text())
    return RoleVars("containerd", **kubernetes, **overrides)


def kubernetes_node(**overrides: object) -> RoleVars:
    kubernetes = RoleVars("kubernetes")
    names = ("kubernetes_version", "kubernetes_minor", "kubernetes_releases")
    return RoleVars("kubernetes_node", **{**{name: kubernetes[name] for name in names}, **overrides})


def toolkit_pin() -> tuple[list[str], str]:
    role = containerd()
    install = task("containerd", "install-nvidia-toolkit.yml", "Install the NVIDIA container toolkit")
    pin = task("containerd", "install-nvidia-toolkit.yml", "Pin the NVIDIA container toolkit")
    return role.template(install["ansible.builtin.apt"]["name"]), role.template(
        pin["ansible.builtin.copy"]["content"]
    )


def kube_pin() -> tuple[list[str], str]:
    role = kubernetes_node()
    install = task("kubernetes_node", "install-and-hold-kube-packages.yml", "Install kubeadm")
    pin = task("kubernetes_node", "repository.yml", "Pin kubeadm")
    return role.template(install["ansible.builtin.apt"]["name"]), role.template(
        pin["ansible.builtin.copy"]["content"]
    )


def held(role_name: str, path: str, already: list[str]) -> list[str]:
    """The packages the role's hold task holds on a node where `apt-mark showhold` lists `already`."""
    read = task(role_name, path, "Read the packages dpkg holds already")
    assert read["ansible.builtin.command"]["argv"] == ["apt-mark", "showhold"]
    assert read["changed_when"] is False and read["check_mode"] is False
    role = {"containerd": containerd, "kubernetes_node": kubernetes_node}[role_name]
    hold = task(role_name, path, "Hold ")
    return list(role(**{read["register"]: {"stdout_lines": already}}).template(hold["loop"]))


def test_the_toolkit_installs_pins_and_holds_its_four_packages_at_one_version() -> None:
    specs, pin = toolkit_pin()
    version = containerd()["containerd_nvidia_toolkit_version"]
    assert specs == [f"{name}={version}" for name in TOOLKIT]
    assert sorted(re.search(r"^Package: (.*)$", pin, re.MULTILINE)[1].split()) == sorted(TOOLKIT)
    assert f"Pin: version {version}\n" in pin
    assert sorted(held("containerd", "install-nvidia-toolkit.yml", [])) == sorted(TOOLKIT)
    # one read of the holds: what is held already costs no dpkg_selections call
    assert held("containerd", "install-nvidia-toolkit.yml", ["containerd.io", *TOOLKIT]) == []
    assert held("containerd", "install-nvidia-toolkit.yml", TOOLKIT[1:]) == TOOLKIT[:1]


def test_the_kube_packages_are_installed_pinned_and_held_each_at_its_version() -> None:
    role = kubernetes_node()
    specs, pin = kube_pin()
    versions = {
        "kubeadm": role["__kubernetes_node_package_version"],
        "kubelet": role["__kubernetes_node_package_version"],
        "kubectl": role["__kubernetes_node_package_version"],
        "cri-tools": role["kubernetes_node_cri_tools_package_version"],
        "kubernetes-cni": role["kubernetes_node_cni_package_version"],
    }
    assert sorted(specs) == sorted(f"{name}={version}" for name, version in versions.items())
    stanzas = [
        dict(re.findall(r"^(Package|Pin): (.*)$", s, re.MULTILINE))
        for s in pin.split("\n\n")
        if "Package:" in s
    ]
    pinned = {
        name: stanza["Pin"].removeprefix("version ")
        for stanza in stanzas
        for name in stanza["Package"].split()
    }
    assert pinned == versions
    assert sorted(held("kubernetes_node", "install-and-hold-kube-packages.yml", [])) == sorted(KUBE)
    assert held("kubernetes_node", "install-and-hold-kube-packages.yml", [*KUBE, "containerd.io"]) == []
    assert held(
        "kubernetes_node", "install-and-hold-kube-packages.yml", [p for p in KUBE if p != "kubelet"]
    ) == ["kubelet"]


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if missing_tools():
        pytest.skip(f"needs {', '.join(missing_tools())} (Debian's apt and apt-utils: make deps)")
    build_mirror = build_mirror_module()
    root = tmp_path_factory.mktemp("toolkit-kube-repos")
    toolkit = [
        p
        for v in SPEC["libnvidia_container"]["versions"]
        for p in build_mirror.container_toolkit_packages(v, "libnvidia-container")
    ]
    # the pinned packages carry the lab's Go builds; apt's resolution reads only their names and Depends,
    # so stand-in files in the builds' layout do here (no Go build in this test)
    names = ("cni-plugins", "cri-tools", "kubernetes", "cri-tools-next", "kubernetes-next")
    builds = {name: root / "builds" / name for name in names}
    for name, tools in {
        "cni-plugins": ["bridge", "loopback"],
        "cri-tools": ["crictl"],
        "kubernetes": ["kubeadm", "kubelet", "kubectl"],
        "cri-tools-next": ["crictl"],
        "kubernetes-next": ["kubeadm", "kubelet", "kubectl"],
    }.items():
        builds[name].mkdir(parents=True)
        for tool in tools:
            (builds[name] / tool).write_text(f"#!/bin/sh\necho {tool}\n")
    return {
        "toolkit": build_repo(root / "toolkit", toolkit),
        "kube": build_repo(root / "kube", build_mirror.kubernetes_packages(SPEC["kubernetes"], builds)),
        # the next minor's repository, as the lab mirror has it (pkgs.k8s.io's v1.37: its own cri-tools)
        "kube-next": build_repo(
            root / "kube-next", build_mirror.kubernetes_packages(SPEC["kubernetes"]["next"], builds, "-next")
        ),
    }  # fmt: skip


def test_pinning_the_toolkit_and_its_base_alone_fails(repos: dict[str, Path], tmp_path: Path) -> None:
    version = containerd()["containerd_nvidia_toolkit_version"]
    newer = [v for v in SPEC["libnvidia_container"]["versions"] if v != version]
    assert newer, "the mirror must offer a newer toolkit than the one pinned"
    old_pin = (
        "Package: nvidia-container-toolkit nvidia-container-toolkit-base\n"
        f"Pin: version {version}\nPin-Priority: 1001\n"
    )
    result = AptSim(tmp_path, repos["toolkit"]).install(
        [f"nvidia-container-toolkit={version}", f"nvidia-container-toolkit-base={version}"],
        preferences=old_pin,
    )
    assert not result.ok, result.output
    assert f"Depends: libnvidia-container-tools (= {version}) but {newer[0]} is to be installed" in " ".join(
        result.output.split()
    ), result.output


def test_the_toolkit_pin_resolves_the_four_at_one_version(repos: dict[str, Path], tmp_path: Path) -> None:
    specs, pin = toolkit_pin()
    version = containerd()["containerd_nvidia_toolkit_version"]
    result = AptSim(tmp_path, repos["toolkit"]).install(specs, preferences=pin)
    assert result.ok, result.output
    assert result.installed == dict.fromkeys(TOOLKIT, version)


def test_the_kube_pin_resolves_every_package_at_its_pinned_version(
    repos: dict[str, Path], tmp_path: Path
) -> None:
    specs, pin = kube_pin()
    result = AptSim(tmp_path, repos["kube"], installed=DISTRIBUTION).install(specs, preferences=pin)
    assert result.ok, result.output
    assert result.installed == dict(spec.split("=", 1) for spec in specs)


def test_raising_kubernetes_version_to_the_next_minor_moves_every_pin_into_its_repository(
    repos: dict[str, Path], tmp_path: Path
) -> None:
    """kubernetes_version alone raised (as the runbook's upgrade says): the pins of cri-tools and
    kubernetes-cni follow the minor's row, and every package resolves in the next minor's repository. The
    control: the running minor's cri-tools pin does not (that build is not there), which failed an upgrade
    half-way before the pins followed the row."""
    target = SPEC["kubernetes"]["next"]["versions"][0].split("-")[0]
    minor = target.rsplit(".", 1)[0]
    role = kubernetes_node(kubernetes_version=target, kubernetes_minor=minor)
    install = task("kubernetes_node", "install-and-hold-kube-packages.yml", "Install kubeadm")
    pin = task("kubernetes_node", "repository.yml", "Pin kubeadm")
    specs = role.template(install["ansible.builtin.apt"]["name"])
    result = AptSim(tmp_path / "next", repos["kube-next"], installed=DISTRIBUTION).install(
        specs, preferences=role.template(pin["ansible.builtin.copy"]["content"])
    )
    assert result.ok, result.output
    assert result.installed["cri-tools"] == SPEC["kubernetes"]["next"]["cri_tools"][0]
    assert result.installed["kubeadm"] == SPEC["kubernetes"]["next"]["versions"][0]
    running_pins, _ = kube_pin()
    stale = [spec for spec in running_pins if spec.startswith("cri-tools=")]
    kept = AptSim(tmp_path / "stale", repos["kube-next"], installed=DISTRIBUTION).install(stale)
    assert not kept.ok


def test_unpinned_kubelet_takes_the_newest_cni(repos: dict[str, Path], tmp_path: Path) -> None:
    """The control: without their own pin, kubernetes-cni drifts (kubelet asks for >= 1.2.0 only)."""
    role = kubernetes_node()
    version = role["__kubernetes_node_package_version"]
    result = AptSim(tmp_path, repos["kube"], installed=DISTRIBUTION).install([f"kubelet={version}"])
    assert result.ok, result.output
    assert (
        result.installed["kubernetes-cni"]
        == SPEC["kubernetes"]["cni"][-1]
        != role["kubernetes_node_cni_package_version"]
    )
