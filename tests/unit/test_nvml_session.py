"""module_utils.nvml_session: pynvml import and respawn, NVML start-up, error messages."""

from __future__ import annotations

import sys
from typing import Any

import gpu_facts
import gpu_health
import gpu_settings
import gpu_topology
import pynvml
import pytest
from ansible.module_utils import nvml_session, venv_respawn
from ansible.module_utils.common import respawn
from conftest import FakeNode, run_module

MODULES = [gpu_facts, gpu_settings, gpu_topology, gpu_health]
MINIMAL_ARGS: dict[str, dict[str, Any]] = {"gpu_settings": {"power_limit_w": 200}}


class Respawned(Exception):
    pass


@pytest.fixture
def without_pynvml(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The running interpreter cannot import pynvml; record respawn attempts."""
    calls: dict[str, Any] = {"runnable": None, "respawn": None}
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    monkeypatch.setattr(respawn, "has_respawned", lambda: False)

    def runnable(interpreter: str) -> bool:
        calls["runnable"] = interpreter
        return interpreter == calls.get("interpreter")

    def respawn_module(interpreter: str) -> None:
        calls["respawn"] = interpreter
        raise Respawned(interpreter)

    monkeypatch.setattr(venv_respawn, "runnable", runnable)
    monkeypatch.setattr(respawn, "respawn_module", respawn_module)
    return calls


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_missing_pynvml_names_the_package_and_the_role(
    pcie_node: FakeNode, without_pynvml: dict[str, Any], module: Any
) -> None:
    failed, result = run_module(module, MINIMAL_ARGS.get(module.__name__, {}))
    assert failed
    assert "nvidia-ml-py" in result["msg"]
    assert "nvidia_driver role" in result["msg"] and "/opt/nvidia-ml-py" in result["msg"]
    assert without_pynvml["runnable"] == "/opt/nvidia-ml-py/bin/python3"
    assert without_pynvml["respawn"] is None


def test_respawns_into_the_nvidia_ml_py_venv(pcie_node: FakeNode, without_pynvml: dict[str, Any]) -> None:
    without_pynvml["interpreter"] = "/opt/nvidia-ml-py/bin/python3"
    with pytest.raises(Respawned):
        run_module(gpu_facts)
    assert without_pynvml["respawn"] == "/opt/nvidia-ml-py/bin/python3"


def test_no_second_respawn(
    pcie_node: FakeNode, without_pynvml: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(respawn, "has_respawned", lambda: True)
    without_pynvml["interpreter"] = "/opt/nvidia-ml-py/bin/python3"
    failed, result = run_module(gpu_facts)
    assert failed and "nvidia-ml-py" in result["msg"]
    assert without_pynvml["respawn"] is None and without_pynvml["runnable"] is None


def err(name: str) -> Any:
    return getattr(pynvml, name)()


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ("NVMLError_LibraryNotFound", ["libnvidia-ml.so.1", "NVIDIA driver is not installed"]),
        (
            "NVMLError_LibRmVersionMismatch",
            ["Driver/library version mismatch", "NVML_ERROR_LIB_RM_VERSION_MISMATCH", "modprobe", "reboot"],
        ),
        ("NVMLError_DriverNotLoaded", ["modprobe nvidia"]),
        ("NVMLError_NoPermission", ["become: true"]),
        ("NVMLError_Unknown", ["Failed to initialize NVML", "Unknown Error"]),
    ],
)
def test_init_error_messages(error: str, expected: list[str]) -> None:
    message = nvml_session.describe_init_error(err(error))
    for text in expected:
        assert text in message


def test_mismatch_message_names_the_loaded_kernel_module(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    version_file = tmp_path / "version"
    version_file.write_text("535.104.05\n")
    monkeypatch.setattr(nvml_session, "KERNEL_MODULE_VERSION_FILE", str(version_file))
    message = nvml_session.describe_init_error(err("NVMLError_LibRmVersionMismatch"))
    assert "loaded kernel module: 535.104.05" in message


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ("NVMLError_GpuIsLost", "NVML_ERROR_GPU_IS_LOST"),
        ("NVMLError_NoPermission", "become: true"),
        ("NVMLError_ResetRequired", "requires a reset"),
        ("NVMLError_NotSupported", "not supported"),
        ("NVMLError_FunctionNotFound", "not supported"),
        ("NVMLError_Timeout", "NVML error 10"),
    ],
)
def test_device_error_messages(error: str, expected: str) -> None:
    assert expected in nvml_session.describe_error(err(error), "GPU 1")


def test_unsupported_means_none() -> None:
    class Bindings:
        NVMLError = pynvml.NVMLError

        @staticmethod
        def nvmlDeviceGetThing(handle: Any) -> int:
            raise pynvml.NVMLError_FunctionNotFound()

        @staticmethod
        def nvmlDeviceGetLost(handle: Any) -> int:
            raise pynvml.NVMLError_GpuIsLost()

    assert nvml_session.optional(Bindings, "nvmlDeviceGetThing", None) is None
    assert nvml_session.optional(Bindings, "nvmlDeviceGetNotInTheseBindings", None) is None
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml_session.optional(Bindings, "nvmlDeviceGetLost", None)


def test_session_shuts_nvml_down_on_error(pcie_node: FakeNode) -> None:
    with pytest.raises(RuntimeError), nvml_session.nvml_session(pynvml):
        assert pynvml._nvmlLib_refcount == 1
        raise RuntimeError("boom")
    assert pynvml._nvmlLib_refcount == 0


def test_session_raises_nvml_unavailable(pcie_node: FakeNode) -> None:
    pcie_node.remove_library()
    with pytest.raises(nvml_session.NvmlUnavailable) as info, nvml_session.nvml_session(pynvml):
        pass
    assert info.value.code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND


def test_unexpected_nvml_error_while_reading(pcie_node: FakeNode, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> int:
        raise pynvml.NVMLError_Unknown()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", broken)
    for module in (gpu_facts, gpu_topology, gpu_settings):
        failed, result = run_module(module, MINIMAL_ARGS.get(module.__name__, {}))
        assert failed and "Unknown Error" in result["msg"]
    failed, result = run_module(gpu_health)
    assert not failed and result["reasons"] == ["nvml_error"]
