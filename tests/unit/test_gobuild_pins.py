"""The lab builds its Kubernetes, containerd, ... from Go modules at exactly the versions production pins
(tests/lab/gobuild/build.py): each go.mod requires the version its home says, so a pin changed in a role
without `build.py --update` fails here, not later on the lab with the old binaries."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gobuild_under_test", ROOT / "tests/lab/gobuild/build.py")
assert _spec is not None and _spec.loader is not None
gobuild = importlib.util.module_from_spec(_spec)
sys.modules["gobuild_under_test"] = gobuild
_spec.loader.exec_module(gobuild)

# components whose pin is read from the repository alone (etcd's and CoreDNS's come from kubeadm's constants
# in the Kubernetes module, runc's from containerd's: the lab's build checks those against the module cache)
LOCAL_PINS = [
    "kubernetes",
    "containerd",
    "cri-tools",
    "cni-plugins",
    "prometheus",
    "alertmanager",
    "registry",
]


@pytest.mark.parametrize("name", LOCAL_PINS)
def test_go_mod_requires_the_version_its_home_pins(name: str) -> None:
    component = gobuild.BY_NAME[name]
    assert gobuild.required_version(component) == component.pin()


def test_kubernetes_is_the_roles_version() -> None:
    defaults = (ROOT / "roles/kubernetes/defaults/main.yml").read_text()
    assert (
        f'kubernetes_version: "{gobuild.required_version(gobuild.BY_NAME["kubernetes"]).lstrip("v")}"'
        in defaults
    )


def test_a_changed_pin_is_refused_naming_the_update_command(monkeypatch: pytest.MonkeyPatch) -> None:
    component = gobuild.BY_NAME["containerd"]
    moved = gobuild.Component(component.name, component.module, lambda: "v2.3.5", component.commands)
    with pytest.raises(
        gobuild.BuildError,
        match=r"requires github.com/containerd/containerd/v2 v2.3.4 but the pin "
        r"is v2.3.5: run `tests/lab/gobuild/build.py --update containerd`",
    ):
        gobuild.check_pin(moved)


def test_every_component_has_its_go_mod() -> None:
    for component in gobuild.BY_NAME.values():
        assert (gobuild.HERE / component.name / "go.mod").is_file(), component.name
