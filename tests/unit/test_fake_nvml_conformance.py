"""The lab's fake pynvml against the real nvidia-ml-py installed in the venv.

Every public name the fake defines must exist in the real module with the same kind, value, call
signature, error code or structure layout. That is what lets the GPU modules, tested against the fake,
run unchanged on real GPUs.
"""

from __future__ import annotations
import __future__

import collections.abc
import ctypes
import importlib.metadata
import importlib.util
import inspect
import sys
import typing
from types import ModuleType
from typing import Any

import pynvml as fake
import pytest

REAL_VERSION = "12.535.161"


def _load_real() -> ModuleType:
    dist = importlib.metadata.distribution("nvidia-ml-py")
    path = dist.locate_file("pynvml.py")
    spec = importlib.util.spec_from_file_location("real_pynvml", str(path))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # nvidia-ml-py looks itself up there
    spec.loader.exec_module(module)
    return module


real = _load_real()

# Names the fake adds on purpose to say what it is.
FAKE_ONLY = {"FAKE_NVML"}


def _imported(name: str, value: Any) -> bool:
    """Whether fake.<name> is just something it imported (ctypes, typing, __future__ ...)."""
    return any(
        value is getattr(source, name, object()) for source in (ctypes, typing, collections.abc, __future__)
    )


FAKE_NAMES = sorted(
    name
    for name, value in vars(fake).items()
    if not name.startswith("__")
    and name not in FAKE_ONLY
    and not isinstance(value, ModuleType)
    and (not name.startswith("_") or name.startswith("_nvml"))
    and not _imported(name, value)
)


def test_real_bindings_are_the_pinned_version() -> None:
    assert importlib.metadata.version("nvidia-ml-py") == REAL_VERSION
    assert not hasattr(real, "FAKE_NVML")
    assert fake.FAKE_NVML is True


def test_fake_covers_what_the_modules_call() -> None:
    used = {
        "nvmlInit",
        "nvmlShutdown",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetSerial",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetPersistenceMode",
        "nvmlDeviceSetPersistenceMode",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceSetPowerManagementLimit",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureThreshold",
        "nvmlDeviceSetTemperatureThreshold",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNvLinkRemotePciInfo",
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetComputeRunningProcesses",
        "NVMLError",
        # issue 20: Xid events, the row-remap histogram, field values (the recovery action on R565+)
        "nvmlEventSetCreate",
        "nvmlDeviceRegisterEvents",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlEventSetWait_v2",
        "nvmlEventSetWait",
        "nvmlEventSetFree",
        "nvmlEventTypeXidCriticalError",
        "nvmlEventTypeDoubleBitEccError",
        "c_nvmlEventData_t",
        "c_nvmlEventSet_t",
        "nvmlDeviceGetRowRemapperHistogram",
        "c_nvmlRowRemapperHistogramValues",
        "nvmlDeviceGetFieldValues",
        "c_nvmlFieldValue_t",
        "NVML_FI_DEV_REMAPPED_PENDING",
        "nvmlDeviceGetMemoryErrorCounter",
    }
    assert used <= set(FAKE_NAMES)


@pytest.mark.parametrize("name", FAKE_NAMES)
def test_public_name_matches_real(name: str) -> None:
    assert hasattr(real, name), f"fake pynvml defines {name}, which nvidia-ml-py {REAL_VERSION} does not have"
    mine, theirs = getattr(fake, name), getattr(real, name)
    if inspect.isclass(mine) and issubclass(mine, BaseException):
        assert inspect.isclass(theirs) and issubclass(theirs, BaseException)
        return
    if inspect.isfunction(mine):
        assert callable(theirs)
        fake_params = [(p.name, p.kind, p.default) for p in inspect.signature(mine).parameters.values()]
        real_params = [(p.name, p.kind, p.default) for p in inspect.signature(theirs).parameters.values()]
        assert fake_params == real_params, f"{name}: signature differs from nvidia-ml-py"
        return
    if inspect.isclass(mine) and issubclass(mine, ctypes.Structure) and hasattr(mine, "_fields_"):
        layout = [(f[0], ctypes.sizeof(f[1])) for f in mine._fields_]
        assert layout == [(f[0], ctypes.sizeof(f[1])) for f in theirs._fields_], f"{name}: struct layout"
        assert ctypes.sizeof(mine) == ctypes.sizeof(theirs)
        return
    if inspect.isclass(mine):
        assert inspect.isclass(theirs)
        assert mine.__name__ == theirs.__name__ or (
            issubclass(mine, ctypes._SimpleCData) and ctypes.sizeof(mine) == ctypes.sizeof(theirs)
        ), name
        return
    if isinstance(mine, ctypes._SimpleCData):
        assert type(mine).__name__ == type(theirs).__name__ and mine.value == theirs.value
        return
    assert mine == theirs, f"{name}: {mine!r} != nvidia-ml-py's {theirs!r}"


def test_every_error_class_of_the_real_module_exists_with_its_code() -> None:
    real_errors = {n: c for n, c in vars(real).items() if n.startswith("NVMLError_")}
    fake_errors = {n: c for n, c in vars(fake).items() if n.startswith("NVMLError_")}
    assert set(real_errors) == set(fake_errors)
    for name, cls in real_errors.items():
        assert fake_errors[name]().value == cls().value, name
        assert issubclass(fake_errors[name], fake.NVMLError)


@pytest.mark.parametrize(
    "name",
    [
        "NVMLError_NotSupported",
        "NVMLError_LibRmVersionMismatch",
        "NVMLError_GpuIsLost",
        "NVMLError_NoPermission",
        "NVMLError_LibraryNotFound",
        "NVMLError_InvalidArgument",
        "NVMLError_FunctionNotFound",
        "NVMLError_Uninitialized",
        "NVMLError_DriverNotLoaded",
    ],
)
def test_error_classes_behave_like_the_real_ones(name: str) -> None:
    code = getattr(real, name)().value
    err = fake.NVMLError(code)
    assert type(err).__name__ == name
    assert isinstance(err, getattr(fake, name))
    assert str(err) == str(real.NVMLError(code))
    assert fake.nvmlExceptionClass(code) is getattr(fake, name)


def test_the_recovery_action_field_is_not_in_the_pinned_bindings() -> None:
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION came with driver R565: nvidia-ml-py 12.535 has no such constant,
    so the product names the field by its number (module_utils/gpu_inventory.py) and the fake defines none."""
    from ansible.module_utils.gpu_inventory import NVML_FI_DEV_GET_GPU_RECOVERY_ACTION

    assert not hasattr(real, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
    assert not hasattr(fake, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
    assert NVML_FI_DEV_GET_GPU_RECOVERY_ACTION == 230 and real.NVML_FI_MAX < 230


def test_handles_are_real_device_pointers(pcie_node: Any) -> None:
    fake.nvmlInit()
    try:
        handle = fake.nvmlDeviceGetHandleByIndex(0)
        assert type(handle).__name__ == "LP_struct_c_nvmlDevice_t"
        assert isinstance(handle, fake.c_nvmlDevice_t)
        assert isinstance(fake.nvmlDeviceGetPciInfo(handle), fake.nvmlPciInfo_t)
        assert isinstance(fake.nvmlDeviceGetMemoryInfo(handle), fake.c_nvmlMemory_t)
        assert isinstance(fake.nvmlDeviceGetRemappedRows(handle), tuple)
        assert len(fake.nvmlDeviceGetRemappedRows(handle)) == 4
        assert isinstance(fake.nvmlDeviceGetPowerManagementLimitConstraints(handle), list)
        assert isinstance(fake.nvmlDeviceGetEccMode(handle), list)
        assert isinstance(fake.nvmlDeviceGetName(handle), str)
    finally:
        fake.nvmlShutdown()
