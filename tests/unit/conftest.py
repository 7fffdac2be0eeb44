"""Unit-test harness for the GPU modules.

* ``tests/lab/fake_nvml`` goes first on ``sys.path``, so ``import pynvml`` is the lab's fake.
* The project's ``module_utils/`` is added to ``ansible.module_utils``' package path, as Ansiballz would
  ship it, and ``library/`` is importable, so modules are driven through their ``main()``.
* ``fake_node`` writes a fresh NVML state (and library file) per test via FAKE_NVML_STATE/_LIBRARY.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE_NVML_DIR = ROOT / "tests" / "lab" / "fake_nvml"
sys.path.insert(0, str(FAKE_NVML_DIR))
sys.path.insert(1, str(ROOT / "library"))

import ansible.module_utils  # noqa: E402
from ansible.module_utils import _internal as ansible_module_internal  # noqa: E402
from ansible.module_utils import basic  # noqa: E402
from ansible.module_utils.common import warnings as ansible_warnings  # noqa: E402
from ansible.module_utils.testing import patch_module_args  # noqa: E402

if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))

import fake_nvml_ctl  # noqa: E402
import pynvml  # noqa: E402
import real_kube  # noqa: E402

SHAPES = ("a100-pcie-40gb-x4", "a100-sxm4-40gb-x8")
DRIVER = fake_nvml_ctl.DEFAULT_DRIVER_VERSION


class AnsibleExitJson(Exception):
    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result)
        self.result = result


class AnsibleFailJson(Exception):
    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result)
        self.result = result


class FakeNode:
    """One simulated machine: its state file, its library file, and helpers to change both."""

    def __init__(self, directory: Path, shape: str, host: str = "gpu-node-1") -> None:
        self.state_path = directory / "state.json"
        self.library_path = directory / "libnvidia-ml.so.1"
        self.kmsg_path = directory / "kmsg"  # the kernel log fake-nvml xid writes (FAKE_NVML_KMSG)
        self.shape = shape
        self.host = host
        self.library_path.write_text(f"# lab stand-in\nversion={DRIVER}\n")
        self.state_path.write_text(json.dumps(fake_nvml_ctl.build_state(shape, host)))

    @property
    def gpu_count(self) -> int:
        return len(self.state()["gpus"])

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text())

    def edit(self, change: Callable[[dict[str, Any]], None]) -> None:
        state = self.state()
        change(state)
        self.state_path.write_text(json.dumps(state))

    def gpu(self, slot: int) -> dict[str, Any]:
        return self.state()["gpus"][slot]

    def ctl(self, *args: str) -> int:
        return fake_nvml_ctl.main(list(args))

    def remove_library(self) -> None:
        self.library_path.unlink()


@pytest.fixture(autouse=True)
def _clean_nvml_and_warnings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Modules run in this process as on a node. Once any test imports controller code
    # (ansible.template, ansible.parsing), ansible-core marks the process a controller and
    # sends module warnings to its Display instead of the module result: undo that here.
    monkeypatch.setattr(ansible_module_internal, "is_controller", False)
    ansible_warnings._global_warnings.clear()
    yield
    pynvml._nvmlLib_refcount = 0
    ansible_warnings._global_warnings.clear()


@pytest.fixture
def make_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNode]:
    def make(shape: str = SHAPES[0], host: str = "gpu-node-1") -> FakeNode:
        node = FakeNode(tmp_path, shape, host)
        monkeypatch.setenv("FAKE_NVML_STATE", str(node.state_path))
        monkeypatch.setenv("FAKE_NVML_LIBRARY", str(node.library_path))
        monkeypatch.setenv("FAKE_NVML_KMSG", str(node.kmsg_path))
        return node

    return make


@pytest.fixture(params=SHAPES)
def node(request: pytest.FixtureRequest, make_node: Callable[..., FakeNode]) -> FakeNode:
    """A fresh machine of each shape."""
    return make_node(request.param)


@pytest.fixture
def pcie_node(make_node: Callable[..., FakeNode]) -> FakeNode:
    return make_node("a100-pcie-40gb-x4")


@pytest.fixture
def hgx_node(make_node: Callable[..., FakeNode]) -> FakeNode:
    return make_node("a100-sxm4-40gb-x8")


@pytest.fixture
def not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml.os, "geteuid", lambda: 1000)


def run_module(
    module: ModuleType, args: dict[str, Any] | None = None, *, check_mode: bool = False, diff: bool = False
) -> tuple[bool, dict[str, Any]]:
    """Run ``module.main()``; return (failed, result) with the module's warnings under 'warnings'."""
    module_args = dict(args or {})
    if check_mode:
        module_args["_ansible_check_mode"] = True
    if diff:
        module_args["_ansible_diff"] = True

    def exit_json(self: basic.AnsibleModule, **kwargs: Any) -> None:
        raise AnsibleExitJson(kwargs)

    def fail_json(self: basic.AnsibleModule, msg: str, **kwargs: Any) -> None:
        kwargs.pop("exception", None)
        raise AnsibleFailJson({"msg": msg, "failed": True, **kwargs})

    with (
        patch_module_args(module_args),
        mock.patch.object(basic.AnsibleModule, "exit_json", exit_json),
        mock.patch.object(basic.AnsibleModule, "fail_json", fail_json),
    ):
        try:
            module.main()
        except AnsibleExitJson as done:
            failed, result = False, done.result
        except AnsibleFailJson as done:
            failed, result = True, done.result
        else:
            raise AssertionError("module returned without exit_json/fail_json")
    result["warnings"] = list(ansible_warnings.get_warning_messages())
    assert pynvml._nvmlLib_refcount == 0, "module left NVML initialised"
    return failed, result


# ------------------------------------------------------------------ the real Kubernetes control plane


@pytest.fixture(scope="session")
def kube_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[real_kube.ControlPlane]:
    """etcd and kube-apiserver of the production pin on 127.0.0.1 (real_kube.py), one per xdist worker,
    stopped and removed at the end of the session."""
    with real_kube.control_plane(tmp_path_factory.mktemp("real-kube")) as plane:
        yield plane


@pytest.fixture(scope="session")
def kube_controllers(kube_control_plane: real_kube.ControlPlane) -> real_kube.ControlPlane:
    """The control plane with kube-controller-manager running the controllers unit tests need
    (real_kube.CONTROLLERS)."""
    kube_control_plane.start_controllers()
    return kube_control_plane
