"""The lab's stand-in for nvidia-ml-py's ``pynvml`` (NVML bindings), driven by a JSON state file.

A drop-in for the subset of nvidia-ml-py 12.535 that this project's GPU modules use, plus the obvious
neighbours: the same function names, argument order, return types (ctypes structures where NVML
returns structures, ``c_nvmlDevice_t`` handles), constants, and ``NVMLError`` subclasses generated per
error code exactly as the real module does. ``tests/unit/test_fake_nvml_conformance.py`` checks every
public name here against the installed nvidia-ml-py.

What stands for the hardware:

* The NVML "library" exists iff the file ``$FAKE_NVML_LIBRARY`` (default
  ``/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1``) exists; its ``version=<v>`` line is the user-space
  driver version. Missing file: ``nvmlInit`` raises ``NVMLError_LibraryNotFound``.
* The state file ``$FAKE_NVML_STATE`` (default ``/var/lib/fake-nvml/state.json``) is the kernel side:
  the loaded kernel module version and the GPUs. Missing file: ``NVMLError_DriverNotLoaded``; a kernel
  module version different from the library's: ``NVMLError_LibRmVersionMismatch``.
* Writes (power limit, persistence mode, GPU target temperature) need root like NVML
  (``NVMLError_NoPermission``), check ranges (``NVMLError_InvalidArgument``) and update the state file
  under a lock with an atomic rename, so idempotence is real.

The state file is written by ``fake_nvml_ctl.py`` (``fake-nvml init``), which also injects faults.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import string
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from ctypes import (
    POINTER,
    Structure,
    Union,
    c_char,
    c_double,
    c_int,
    c_int64,
    c_longlong,
    c_uint,
    c_uint32,
    c_ulong,
    c_ulonglong,
    c_void_p,
    cast,
)
from typing import Any, NoReturn

# The package this file stands in for, so tools that print it can tell the two apart.
FAKE_NVML = True

_DEFAULT_STATE = "/var/lib/fake-nvml/state.json"
_DEFAULT_LIBRARY = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"

# ---------------------------------------------------------------------------------------------------
# Constants (values as in nvidia-ml-py 12.535)
# ---------------------------------------------------------------------------------------------------
_nvmlEnableState_t = c_uint
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1

_nvmlBrandType_t = c_uint
NVML_BRAND_UNKNOWN = 0
NVML_BRAND_TESLA = 2
NVML_BRAND_NVIDIA = 14

_nvmlTemperatureThresholds_t = c_uint
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3
NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN = 4
NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR = 5
NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MAX = 6
NVML_TEMPERATURE_THRESHOLD_COUNT = 7

_nvmlTemperatureSensors_t = c_uint
NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_COUNT = 1

_nvmlComputeMode_t = c_uint
NVML_COMPUTEMODE_DEFAULT = 0
NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1
NVML_COMPUTEMODE_PROHIBITED = 2
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
NVML_COMPUTEMODE_COUNT = 4

_nvmlMemoryLocation_t = c_uint
NVML_MEMORY_LOCATION_L1_CACHE = 0
NVML_MEMORY_LOCATION_L2_CACHE = 1
NVML_MEMORY_LOCATION_DEVICE_MEMORY = 2
NVML_MEMORY_LOCATION_DRAM = 2
NVML_MEMORY_LOCATION_REGISTER_FILE = 3
NVML_MEMORY_LOCATION_TEXTURE_MEMORY = 4
NVML_MEMORY_LOCATION_TEXTURE_SHM = 5
NVML_MEMORY_LOCATION_CBU = 6
NVML_MEMORY_LOCATION_SRAM = 7
NVML_MEMORY_LOCATION_COUNT = 8

NVML_NVLINK_MAX_LINKS = 18

NVML_NVLINK_CAP_P2P_SUPPORTED = 0
NVML_NVLINK_CAP_SYSMEM_ACCESS = 1
NVML_NVLINK_CAP_P2P_ATOMICS = 2
NVML_NVLINK_CAP_SYSMEM_ATOMICS = 3
NVML_NVLINK_CAP_SLI_BRIDGE = 4
NVML_NVLINK_CAP_VALID = 5
NVML_NVLINK_CAP_COUNT = 6

_nvmlNvLinkDeviceType_t = c_uint
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF

_nvmlEccBitType_t = c_uint
NVML_SINGLE_BIT_ECC = 0
NVML_DOUBLE_BIT_ECC = 1
NVML_ECC_ERROR_TYPE_COUNT = 2

_nvmlEccCounterType_t = c_uint
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_ECC_COUNTER_TYPE_COUNT = 2

_nvmlMemoryErrorType_t = c_uint
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_MEMORY_ERROR_TYPE_COUNT = 2

_nvmlReturn_t = c_uint
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_UNKNOWN = 999

_nvmlPageRetirementCause_t = c_uint
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_PAGE_RETIREMENT_CAUSE_COUNT = 2

_nvmlGpuTopologyLevel_t = c_uint
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_CPU = NVML_TOPOLOGY_NODE
NVML_TOPOLOGY_SYSTEM = 50

_nvmlGpuP2PStatus_t = c_uint
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_NOT_SUPPORTED = 5

_nvmlDeviceArchitecture_t = c_uint
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF

nvmlFlagDefault = 0
nvmlFlagForce = 1
NVML_INIT_FLAG_NO_GPUS = 1
NVML_INIT_FLAG_NO_ATTACH = 2

NVML_DEVICE_UUID_BUFFER_SIZE = 80
NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96
NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80
NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE = 80
NVML_DEVICE_NAME_BUFFER_SIZE = 64
NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96
NVML_DEVICE_SERIAL_BUFFER_SIZE = 30
NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16
NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT = "%04X:%02X:%02X.0"
NVML_DEVICE_PCI_BUS_ID_FMT = "%08X:%02X:%02X.0"

_nvmlValueType_t = c_uint
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_COUNT = 6

# Field ids (nvmlDeviceGetFieldValues) the simulation answers; NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230)
# came with driver R565 and is not in nvidia-ml-py 12.535: the fake answers it by number only where the
# state says the driver reports it (fake-nvml recovery-action).
NVML_FI_DEV_REMAPPED_COR = 142
NVML_FI_DEV_REMAPPED_UNC = 143
NVML_FI_DEV_REMAPPED_PENDING = 144
NVML_FI_DEV_REMAPPED_FAILURE = 145
NVML_FI_MAX = 197

# Event types (nvmlDeviceRegisterEvents)
nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypePState = 0x0000000000000004
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeClock = 0x0000000000000010
nvmlEventTypePowerSourceChange = 0x0000000000000080
nvmlEventMigConfigChange = 0x0000000000000100
nvmlEventTypeNone = 0x0000000000000000
nvmlEventTypeAll = (
    nvmlEventTypeNone
    | nvmlEventTypeSingleBitEccError
    | nvmlEventTypeDoubleBitEccError
    | nvmlEventTypePState
    | nvmlEventTypeClock
    | nvmlEventTypePowerSourceChange
    | nvmlEventTypeXidCriticalError
    | nvmlEventMigConfigChange
)

NVML_VALUE_NOT_AVAILABLE_ulonglong = c_ulonglong(-1)
NVML_VALUE_NOT_AVAILABLE_uint = c_uint(-1)


# ---------------------------------------------------------------------------------------------------
# Errors: the same class hierarchy nvidia-ml-py generates (NVMLError_<CamelCase> per NVML_ERROR_*)
# ---------------------------------------------------------------------------------------------------
class NVMLError(Exception):
    _valClassMapping: dict[int, type[NVMLError]] = {}  # noqa: RUF012  (mirrors nvidia-ml-py)
    _errcode_to_string: dict[int, str] = {  # noqa: RUF012
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(typ, value: int) -> NVMLError:  # signature of nvidia-ml-py
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return NVMLError._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return self.value == getattr(other, "value", None)

    def __hash__(self) -> int:
        return hash(self.value)


def nvmlExceptionClass(nvmlErrorCode: int) -> type[NVMLError]:
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError(f"nvmlErrorCode {nvmlErrorCode} is not valid")
    return NVMLError._valClassMapping[nvmlErrorCode]


def _extractNVMLErrorsAsClasses() -> None:
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val: int) -> Any:
            def new(typ: type[NVMLError]) -> NVMLError:
                return NVMLError.__new__(typ, val)

            return new

        new_error_class = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        new_error_class.__module__ = __name__
        setattr(this_module, class_name, new_error_class)
        NVMLError._valClassMapping[err_val] = new_error_class


_extractNVMLErrorsAsClasses()


def _raise(code: int) -> NoReturn:
    raise NVMLError(code)


# ---------------------------------------------------------------------------------------------------
# Structures (field layout as in nvidia-ml-py)
# ---------------------------------------------------------------------------------------------------
class nvmlFriendlyObject:
    def __init__(self, dictionary: dict[str, Any]) -> None:
        for x in dictionary:
            setattr(self, x, dictionary[x])

    def __str__(self) -> str:
        return self.__dict__.__str__()


def nvmlStructToFriendlyObject(struct: Any) -> nvmlFriendlyObject:
    d = {}
    for x in struct._fields_:
        key = x[0]
        value = getattr(struct, key)
        d[key] = value.decode() if isinstance(value, bytes) else value
    return nvmlFriendlyObject(d)


class _PrintableStructure(Structure):
    _fmt_: dict[str, str] = {}  # noqa: RUF012

    def __str__(self) -> str:
        result = []
        for x in self._fields_:
            key = x[0]
            value = getattr(self, key)
            fmt = self._fmt_.get(key, self._fmt_.get("<default>", "%s"))
            result.append(("%s: " + fmt) % (key, value))
        return self.__class__.__name__ + "(" + ", ".join(result) + ")"

    def __getattribute__(self, name: str) -> Any:
        res = super().__getattribute__(name)
        if isinstance(res, bytes):
            return res.decode()
        return res

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, str):
            value = value.encode()
        super().__setattr__(name, value)


class struct_c_nvmlDevice_t(Structure):
    pass  # opaque handle


c_nvmlDevice_t = POINTER(struct_c_nvmlDevice_t)


class nvmlPciInfo_t(_PrintableStructure):
    _fields_ = (
        ("busIdLegacy", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    )
    _fmt_ = {  # noqa: RUF012
        "domain": "0x%08X",
        "bus": "0x%02X",
        "device": "0x%02X",
        "pciDeviceId": "0x%08X",
        "pciSubSystemId": "0x%08X",
    }


class c_nvmlMemory_t(_PrintableStructure):
    _fields_ = (
        ("total", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    )
    _fmt_ = {"<default>": "%d B"}  # noqa: RUF012


class c_nvmlMemory_v2_t(_PrintableStructure):
    _fields_ = (
        ("version", c_uint),
        ("total", c_ulonglong),
        ("reserved", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    )
    _fmt_ = {"<default>": "%d B"}  # noqa: RUF012


nvmlMemory_v2 = 0x02000028


class c_nvmlProcessInfo_v2_t(_PrintableStructure):
    _fields_ = (
        ("pid", c_uint),
        ("usedGpuMemory", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    )
    _fmt_ = {"usedGpuMemory": "%d B"}  # noqa: RUF012


c_nvmlProcessInfo_t = c_nvmlProcessInfo_v2_t


class c_nvmlValue_t(Union):
    _fields_ = (
        ("dVal", c_double),
        ("uiVal", c_uint),
        ("ulVal", c_ulong),
        ("ullVal", c_ulonglong),
        ("sllVal", c_longlong),
        ("siVal", c_int),
    )


class c_nvmlFieldValue_t(_PrintableStructure):
    _fields_ = (
        ("fieldId", c_uint32),
        ("scopeId", c_uint32),
        ("timestamp", c_int64),
        ("latencyUsec", c_int64),
        ("valueType", _nvmlValueType_t),
        ("nvmlReturn", _nvmlReturn_t),
        ("value", c_nvmlValue_t),
    )


class c_nvmlRowRemapperHistogramValues(Structure):
    _fields_ = (
        ("max", c_uint),
        ("high", c_uint),
        ("partial", c_uint),
        ("low", c_uint),
        ("none", c_uint),
    )


class struct_c_nvmlEventSet_t(Structure):
    pass  # opaque handle


c_nvmlEventSet_t = POINTER(struct_c_nvmlEventSet_t)


class c_nvmlEventData_t(_PrintableStructure):
    _fields_ = (
        ("device", c_nvmlDevice_t),
        ("eventType", c_ulonglong),
        ("eventData", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    )
    _fmt_ = {"eventType": "0x%08X"}  # noqa: RUF012


# ---------------------------------------------------------------------------------------------------
# The simulated driver: library file, state file, handles
# ---------------------------------------------------------------------------------------------------
_HANDLE_BASE = 0x6E760000  # handle value = base + GPU slot; never dereferenced
_lock = threading.Lock()
_nvmlLib_refcount = 0


def _state_path() -> str:
    return os.environ.get("FAKE_NVML_STATE", _DEFAULT_STATE)


def _library_path() -> str:
    return os.environ.get("FAKE_NVML_LIBRARY", _DEFAULT_LIBRARY)


def _library_version() -> str | None:
    """User-space driver version from the stand-in library file; None when there is no library."""
    try:
        with open(_library_path(), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "version":
            return value.strip()
    return ""


def _load_state() -> dict[str, Any]:
    try:
        with open(_state_path(), encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        _raise(NVML_ERROR_DRIVER_NOT_LOADED)
    except (OSError, ValueError):
        _raise(NVML_ERROR_UNKNOWN)
    if not isinstance(state, dict):
        _raise(NVML_ERROR_UNKNOWN)
    return state


@contextlib.contextmanager
def _locked_state() -> Iterator[dict[str, Any]]:
    """Read-modify-write of the state file: exclusive lock, then write a temp file and rename it."""
    path = _state_path()
    directory = os.path.dirname(os.path.abspath(path))
    try:
        lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError:
        _raise(NVML_ERROR_NO_PERMISSION)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        state = _load_state()
        yield state
        fd, tmp = tempfile.mkstemp(prefix=".state-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(state, f, indent=2, sort_keys=True)
                f.write("\n")
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    finally:
        os.close(lock_fd)


def _begin(function: str) -> dict[str, Any]:
    """Common prologue: NVML initialised, the 'driver' has the function, fresh state."""
    if _nvmlLib_refcount <= 0:
        _raise(NVML_ERROR_UNINITIALIZED)
    state = _load_state()
    if function in state.get("missing_functions", []):
        _raise(NVML_ERROR_FUNCTION_NOT_FOUND)
    return state


def _present(state: dict[str, Any]) -> list[dict[str, Any]]:
    """GPUs the driver enumerates, in index order (a removed GPU is off the bus)."""
    return [g for g in state.get("gpus", []) if g.get("present", True)]


def _make_handle(gpu: dict[str, Any]) -> Any:
    return cast(c_void_p(_HANDLE_BASE + int(gpu["slot"])), c_nvmlDevice_t)


def _gpu(state: dict[str, Any], handle: Any) -> dict[str, Any]:
    if not isinstance(handle, c_nvmlDevice_t):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    address = cast(handle, c_void_p).value or 0
    slot = address - _HANDLE_BASE
    for gpu in _present(state):
        if gpu["slot"] == slot:
            if gpu.get("lost"):
                _raise(NVML_ERROR_GPU_IS_LOST)
            return gpu
    # The handle's GPU has left the bus since the handle was taken.
    _raise(NVML_ERROR_GPU_IS_LOST)


def _device(function: str, handle: Any) -> dict[str, Any]:
    return _gpu(_begin(function), handle)


def _require(value: Any) -> Any:
    """A null in the state means the GPU does not support the query."""
    if value is None:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return value


def _require_root() -> None:
    if os.geteuid() != 0:
        _raise(NVML_ERROR_NO_PERMISSION)


def _pci_struct(pci: dict[str, Any]) -> nvmlPciInfo_t:
    info = nvmlPciInfo_t()
    info.domain = int(pci["domain"])
    info.bus = int(pci["bus"])
    info.device = int(pci["device"])
    info.pciDeviceId = int(pci.get("pci_device_id", 0))
    info.pciSubSystemId = int(pci.get("pci_subsystem_id", 0))
    info.busId = NVML_DEVICE_PCI_BUS_ID_FMT % (info.domain, info.bus, info.device)
    info.busIdLegacy = NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT % (info.domain, info.bus, info.device)
    return info


def _link(gpu: dict[str, Any], link: int) -> dict[str, Any]:
    if not 0 <= int(link) < NVML_NVLINK_MAX_LINKS:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    for entry in gpu.get("nvlinks") or []:
        if entry["link"] == int(link):
            return entry
    # The GPU has fewer links than NVML's maximum.
    _raise(NVML_ERROR_NOT_SUPPORTED)


# ---------------------------------------------------------------------------------------------------
# Init, shutdown, system queries
# ---------------------------------------------------------------------------------------------------
def nvmlInitWithFlags(flags: int) -> None:
    global _nvmlLib_refcount
    library_version = _library_version()
    if library_version is None:
        _raise(NVML_ERROR_LIBRARY_NOT_FOUND)
    state = _load_state()
    if state.get("kernel_module_version") != library_version:
        _raise(NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with _lock:
        _nvmlLib_refcount += 1
        _open_control_device()
    return None


# The driver's control device, which the real library opens at its first init and holds until the last
# shutdown: so a process using NVML shows up holding /dev/nvidiactl (gpu_facts' device_processes, and the
# lab's nvidia module refuses to unload under it), as every NVML client does on a server. The lab's driver
# stand-in makes the node's /dev/nvidiactl when it loads the module; where there is none (a unit test on the
# controller, a node without the driver), nothing is held.
_CONTROL_DEVICE = os.environ.get("FAKE_NVML_CONTROL_DEVICE", "/dev/nvidiactl")
_control_fd: int | None = None


def _open_control_device() -> None:
    global _control_fd
    if _control_fd is None and os.path.exists(_CONTROL_DEVICE):
        try:
            _control_fd = os.open(_CONTROL_DEVICE, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            _control_fd = None


def _close_control_device() -> None:
    global _control_fd
    if _control_fd is not None:
        os.close(_control_fd)
        _control_fd = None


def nvmlInit() -> None:
    nvmlInitWithFlags(0)
    return None


def nvmlShutdown() -> None:
    global _nvmlLib_refcount
    with _lock:
        if _nvmlLib_refcount <= 0:
            _raise(NVML_ERROR_UNINITIALIZED)
        _nvmlLib_refcount -= 1
        if _nvmlLib_refcount == 0:
            _close_control_device()
    return None


def nvmlErrorString(result: int) -> str:
    return NVMLError._errcode_to_string.get(result, "Unknown Error")


def nvmlSystemGetDriverVersion() -> str:
    _begin("nvmlSystemGetDriverVersion")
    return _library_version() or ""


def nvmlSystemGetNVMLVersion() -> str:
    state = _begin("nvmlSystemGetNVMLVersion")
    return str(state.get("nvml_version", ""))


def nvmlSystemGetCudaDriverVersion() -> int:
    state = _begin("nvmlSystemGetCudaDriverVersion")
    return int(state["cuda_driver_version"])


def nvmlSystemGetCudaDriverVersion_v2() -> int:
    state = _begin("nvmlSystemGetCudaDriverVersion_v2")
    return int(state["cuda_driver_version"])


def nvmlSystemGetProcessName(pid: int) -> str:
    state = _begin("nvmlSystemGetProcessName")
    for gpu in _present(state):
        for proc in gpu.get("processes", []):
            if proc["pid"] == int(pid):
                return str(proc.get("name", ""))
    _raise(NVML_ERROR_NOT_FOUND)


# ---------------------------------------------------------------------------------------------------
# Device enumeration and identity
# ---------------------------------------------------------------------------------------------------
def nvmlDeviceGetCount() -> int:
    return len(_present(_begin("nvmlDeviceGetCount")))


def nvmlDeviceGetHandleByIndex(index: int) -> Any:
    gpus = _present(_begin("nvmlDeviceGetHandleByIndex"))
    if not 0 <= int(index) < len(gpus):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    gpu = gpus[int(index)]
    if gpu.get("lost"):
        _raise(NVML_ERROR_GPU_IS_LOST)
    return _make_handle(gpu)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> Any:
    wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
    for gpu in _present(_begin("nvmlDeviceGetHandleByUUID")):
        if gpu["uuid"] == wanted:
            if gpu.get("lost"):
                _raise(NVML_ERROR_GPU_IS_LOST)
            return _make_handle(gpu)
    _raise(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetHandleByPciBusId(pciBusId: str | bytes) -> Any:
    wanted = (pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId).upper()
    for gpu in _present(_begin("nvmlDeviceGetHandleByPciBusId")):
        info = _pci_struct(gpu["pci"])
        if wanted in (info.busId.upper(), info.busIdLegacy.upper()):
            if gpu.get("lost"):
                _raise(NVML_ERROR_GPU_IS_LOST)
            return _make_handle(gpu)
    _raise(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle: Any) -> int:
    state = _begin("nvmlDeviceGetIndex")
    gpu = _gpu(state, handle)
    return [g["slot"] for g in _present(state)].index(gpu["slot"])


def nvmlDeviceGetMinorNumber(handle: Any) -> int:
    return int(_device("nvmlDeviceGetMinorNumber", handle)["minor_number"])


def nvmlDeviceGetName(handle: Any) -> str:
    return str(_device("nvmlDeviceGetName", handle)["name"])


def nvmlDeviceGetUUID(handle: Any) -> str:
    return str(_device("nvmlDeviceGetUUID", handle)["uuid"])


def nvmlDeviceGetSerial(handle: Any) -> str:
    return str(_require(_device("nvmlDeviceGetSerial", handle).get("serial")))


def nvmlDeviceGetBrand(handle: Any) -> int:
    return int(_device("nvmlDeviceGetBrand", handle).get("brand", NVML_BRAND_NVIDIA))


def nvmlDeviceGetArchitecture(device: Any) -> int:
    return int(_device("nvmlDeviceGetArchitecture", device).get("architecture", NVML_DEVICE_ARCH_AMPERE))


def nvmlDeviceGetCudaComputeCapability(handle: Any) -> tuple[int, int]:
    major, minor = _device("nvmlDeviceGetCudaComputeCapability", handle).get("compute_capability", [8, 0])
    return (int(major), int(minor))


def nvmlDeviceGetVbiosVersion(handle: Any) -> str:
    return str(_require(_device("nvmlDeviceGetVbiosVersion", handle).get("vbios_version")))


def nvmlDeviceGetPciInfo_v3(handle: Any) -> nvmlPciInfo_t:
    return _pci_struct(_device("nvmlDeviceGetPciInfo_v3", handle)["pci"])


def nvmlDeviceGetPciInfo(handle: Any) -> nvmlPciInfo_t:
    return nvmlDeviceGetPciInfo_v3(handle)


def nvmlDeviceGetMemoryInfo(handle: Any, version: int | None = None) -> Any:
    gpu = _device("nvmlDeviceGetMemoryInfo" if not version else "nvmlDeviceGetMemoryInfo_v2", handle)
    memory = gpu["memory"]
    used = int(memory.get("used", 0)) + sum(int(p.get("used_memory", 0)) for p in gpu.get("processes", []))
    total = int(memory["total"])
    used = min(used, total)
    if not version:
        info = c_nvmlMemory_t()
        info.total, info.used, info.free = total, used, total - used
        return info
    info2 = c_nvmlMemory_v2_t()
    info2.version = version
    reserved = int(memory.get("reserved", 0))
    info2.total, info2.reserved = total, reserved
    info2.used = used
    info2.free = max(total - reserved - used, 0)
    return info2


def nvmlDeviceGetComputeMode(handle: Any) -> int:
    return int(_device("nvmlDeviceGetComputeMode", handle).get("compute_mode", NVML_COMPUTEMODE_DEFAULT))


def nvmlDeviceGetComputeRunningProcesses_v3(handle: Any) -> list[nvmlFriendlyObject]:
    gpu = _device("nvmlDeviceGetComputeRunningProcesses_v3", handle)
    procs = []
    for proc in gpu.get("processes", []):
        info = c_nvmlProcessInfo_t()
        info.pid = int(proc["pid"])
        info.usedGpuMemory = int(proc.get("used_memory", 0))
        info.gpuInstanceId = 0xFFFFFFFF
        info.computeInstanceId = 0xFFFFFFFF
        procs.append(nvmlStructToFriendlyObject(info))
    return procs


def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[nvmlFriendlyObject]:
    return nvmlDeviceGetComputeRunningProcesses_v3(handle)


# ---------------------------------------------------------------------------------------------------
# Persistence mode and power
# ---------------------------------------------------------------------------------------------------
def nvmlDeviceGetPersistenceMode(handle: Any) -> int:
    return int(_device("nvmlDeviceGetPersistenceMode", handle)["persistence_mode"])


def nvmlDeviceSetPersistenceMode(handle: Any, mode: int) -> None:
    _device("nvmlDeviceSetPersistenceMode", handle)
    _require_root()
    if int(mode) not in (NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    with _locked_state() as state:
        _gpu(state, handle)["persistence_mode"] = int(mode)
    return None


def _power(function: str, handle: Any) -> dict[str, Any]:
    return dict(_require(_device(function, handle).get("power")))


def nvmlDeviceGetPowerManagementMode(handle: Any) -> int:
    _power("nvmlDeviceGetPowerManagementMode", handle)
    return NVML_FEATURE_ENABLED


def nvmlDeviceGetPowerManagementLimit(handle: Any) -> int:
    return int(_power("nvmlDeviceGetPowerManagementLimit", handle)["limit_mw"])


def nvmlDeviceGetPowerManagementLimitConstraints(handle: Any) -> list[int]:
    power = _power("nvmlDeviceGetPowerManagementLimitConstraints", handle)
    return [int(power["min_mw"]), int(power["max_mw"])]


def nvmlDeviceGetPowerManagementDefaultLimit(handle: Any) -> int:
    return int(_power("nvmlDeviceGetPowerManagementDefaultLimit", handle)["default_mw"])


def nvmlDeviceGetEnforcedPowerLimit(handle: Any) -> int:
    power = _power("nvmlDeviceGetEnforcedPowerLimit", handle)
    return int(power.get("enforced_mw") or power["limit_mw"])


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    return int(_power("nvmlDeviceGetPowerUsage", handle)["draw_mw"])


def nvmlDeviceSetPowerManagementLimit(handle: Any, limit: int) -> None:
    power = _power("nvmlDeviceSetPowerManagementLimit", handle)
    _require_root()
    if not int(power["min_mw"]) <= int(limit) <= int(power["max_mw"]):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    with _locked_state() as state:
        gpu_power = _gpu(state, handle)["power"]
        gpu_power["limit_mw"] = int(limit)
        gpu_power["enforced_mw"] = int(limit)
    return None


# ---------------------------------------------------------------------------------------------------
# Temperature
# ---------------------------------------------------------------------------------------------------
_THRESHOLD_KEYS = {
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown",
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown",
    NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "mem_max",
    NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max",
    NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN: "target_min",
    NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR: "target",
    NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MAX: "target_max",
}


def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:
    temperature = _device("nvmlDeviceGetTemperature", handle)["temperature"]
    if int(sensor) != NVML_TEMPERATURE_GPU:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return int(_require(temperature.get("gpu")))


def nvmlDeviceGetTemperatureThreshold(handle: Any, threshold: int) -> int:
    temperature = _device("nvmlDeviceGetTemperatureThreshold", handle)["temperature"]
    if int(threshold) not in _THRESHOLD_KEYS:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return int(_require(temperature.get(_THRESHOLD_KEYS[int(threshold)])))


def nvmlDeviceSetTemperatureThreshold(handle: Any, threshold: int, temp: int) -> None:
    temperature = _device("nvmlDeviceSetTemperatureThreshold", handle)["temperature"]
    # Only the GPU target temperature (acoustic threshold) is settable, and only where supported.
    if int(threshold) != NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR or temperature.get("target") is None:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    _require_root()
    if not int(temperature["target_min"]) <= int(temp) <= int(temperature["target_max"]):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    with _locked_state() as state:
        _gpu(state, handle)["temperature"]["target"] = int(temp)
    return None


# ---------------------------------------------------------------------------------------------------
# ECC, remapped rows, retired pages
# ---------------------------------------------------------------------------------------------------
def _ecc(function: str, handle: Any) -> dict[str, Any]:
    return dict(_require(_device(function, handle).get("ecc")))


def nvmlDeviceGetEccMode(handle: Any) -> list[int]:
    ecc = _ecc("nvmlDeviceGetEccMode", handle)
    return [int(ecc["current"]), int(ecc["pending"])]


def nvmlDeviceGetCurrentEccMode(handle: Any) -> int:
    return nvmlDeviceGetEccMode(handle)[0]


def nvmlDeviceGetPendingEccMode(handle: Any) -> int:
    return nvmlDeviceGetEccMode(handle)[1]


def _ecc_count(ecc: dict[str, Any], errorType: int, counterType: int) -> int:
    if not ecc["current"]:
        # NVML has no ECC counters while ECC is off.
        _raise(NVML_ERROR_NOT_SUPPORTED)
    counter = {NVML_VOLATILE_ECC: "volatile", NVML_AGGREGATE_ECC: "aggregate"}.get(int(counterType))
    kind = {NVML_MEMORY_ERROR_TYPE_CORRECTED: "corrected", NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrected"}
    error = kind.get(int(errorType))
    if counter is None or error is None:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return int(ecc[counter][error])


def nvmlDeviceGetTotalEccErrors(handle: Any, errorType: int, counterType: int) -> int:
    return _ecc_count(_ecc("nvmlDeviceGetTotalEccErrors", handle), errorType, counterType)


def nvmlDeviceGetMemoryErrorCounter(handle: Any, errorType: int, counterType: int, locationType: int) -> int:
    ecc = _ecc("nvmlDeviceGetMemoryErrorCounter", handle)
    if int(locationType) != NVML_MEMORY_LOCATION_DEVICE_MEMORY:
        # The simulation keeps DRAM counters only; every error lands in device memory.
        _ecc_count(ecc, errorType, counterType)
        return 0
    return _ecc_count(ecc, errorType, counterType)


def nvmlDeviceGetRemappedRows(device: Any) -> tuple[int, int, int, int]:
    rows = _require(_device("nvmlDeviceGetRemappedRows", device).get("remapped_rows"))
    return (int(rows["correctable"]), int(rows["uncorrectable"]), int(rows["pending"]), int(rows["failure"]))


def nvmlDeviceGetRetiredPages(device: Any, sourceFilter: int) -> list[int]:
    pages = _require(_device("nvmlDeviceGetRetiredPages", device).get("retired_pages"))
    key = {
        NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: "single_bit",
        NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: "double_bit",
    }.get(int(sourceFilter))
    if key is None:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return [int(address) for address in pages.get(key, [])]


def nvmlDeviceGetRetiredPagesPendingStatus(device: Any) -> int:
    pages = _require(_device("nvmlDeviceGetRetiredPagesPendingStatus", device).get("retired_pages"))
    return int(pages.get("pending", 0))


# The bank availability histogram: how many DRAM banks have all (max), most (high), some (partial), few (low)
# or none of their spare rows left. A GPU whose state has no histogram says Not Supported.
_HISTOGRAM_KEYS = ("max", "high", "partial", "low", "none")


def nvmlDeviceGetRowRemapperHistogram(device: Any) -> c_nvmlRowRemapperHistogramValues:
    rows = _require(_device("nvmlDeviceGetRowRemapperHistogram", device).get("remapped_rows"))
    histogram = _require(rows.get("histogram"))
    values = c_nvmlRowRemapperHistogramValues()
    for key in _HISTOGRAM_KEYS:
        setattr(values, key, int(histogram.get(key, 0)))
    return values


# ---------------------------------------------------------------------------------------------------
# Field values
# ---------------------------------------------------------------------------------------------------
_FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, R565 and later


def _field_value(gpu: dict[str, Any], field_id: int) -> int | None:
    rows = gpu.get("remapped_rows")
    remap_keys = {
        NVML_FI_DEV_REMAPPED_COR: "correctable",
        NVML_FI_DEV_REMAPPED_UNC: "uncorrectable",
        NVML_FI_DEV_REMAPPED_PENDING: "pending",
        NVML_FI_DEV_REMAPPED_FAILURE: "failure",
    }
    if field_id in remap_keys and rows is not None:
        return int(rows[remap_keys[field_id]])
    if field_id == _FIELD_RECOVERY_ACTION and gpu.get("recovery_action") is not None:
        return int(gpu["recovery_action"])
    return None  # a field this driver does not report


def nvmlDeviceGetFieldValues(handle: Any, fieldIds: list[Any]) -> Any:
    """As NVML: the call succeeds and each value carries its own return code (Not Supported for a field
    the simulated driver does not report, as a 535 driver for the recovery action)."""
    gpu = _device("nvmlDeviceGetFieldValues", handle)
    values = (c_nvmlFieldValue_t * len(fieldIds))()
    now_us = int(time.time() * 1_000_000)
    for i, field_id in enumerate(fieldIds):
        try:
            values[i].fieldId, values[i].scopeId = field_id
        except TypeError:
            values[i].fieldId = field_id
        value = _field_value(gpu, int(values[i].fieldId))
        values[i].timestamp = now_us
        values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT
        if value is None:
            values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        else:
            values[i].nvmlReturn = NVML_SUCCESS
            values[i].value.uiVal = value
    return values


# ---------------------------------------------------------------------------------------------------
# Events. The state's "events" queue (fake-nvml xid appends to it) stands for the driver's: an event set
# sees the events queued after it was created, for the GPUs and types registered on it.
# ---------------------------------------------------------------------------------------------------
_EVENT_SET_BASE = 0x6E650000
# Xid, double/single-bit ECC, P-state, clock and MIG change events, as an A100 reports them
_SUPPORTED_EVENT_TYPES = (
    nvmlEventTypeSingleBitEccError
    | nvmlEventTypeDoubleBitEccError
    | nvmlEventTypePState
    | nvmlEventTypeXidCriticalError
    | nvmlEventTypeClock
    | nvmlEventMigConfigChange
)
_event_sets: dict[int, dict[str, Any]] = {}


def _event_set(eventSet: Any) -> dict[str, Any]:
    if not isinstance(eventSet, c_nvmlEventSet_t):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    found = _event_sets.get((cast(eventSet, c_void_p).value or 0) - _EVENT_SET_BASE)
    if found is None:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    return found


def nvmlEventSetCreate() -> Any:
    state = _begin("nvmlEventSetCreate")
    with _lock:
        number = max(_event_sets, default=0) + 1
        _event_sets[number] = {"after": int(state.get("event_seq", 0)), "slots": {}}
    return cast(c_void_p(_EVENT_SET_BASE + number), c_nvmlEventSet_t)


def nvmlDeviceGetSupportedEventTypes(handle: Any) -> int:
    _device("nvmlDeviceGetSupportedEventTypes", handle)
    return _SUPPORTED_EVENT_TYPES


def nvmlDeviceRegisterEvents(handle: Any, eventTypes: int, eventSet: Any) -> None:
    gpu = _device("nvmlDeviceRegisterEvents", handle)
    registered = _event_set(eventSet)
    if int(eventTypes) & ~_SUPPORTED_EVENT_TYPES:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    slots = registered["slots"]
    slots[gpu["slot"]] = slots.get(gpu["slot"], 0) | int(eventTypes)
    return None


def nvmlEventSetWait_v2(eventSet: Any, timeoutms: int) -> c_nvmlEventData_t:
    """The next event for the set, waiting up to timeoutms; NVMLError_Timeout when none comes."""
    registered = _event_set(eventSet)
    deadline = time.monotonic() + max(int(timeoutms), 0) / 1000
    while True:
        state = _begin("nvmlEventSetWait_v2")
        for event in state.get("events", []):
            if int(event["seq"]) <= registered["after"]:
                continue
            registered["after"] = int(event["seq"])
            if registered["slots"].get(event["slot"], 0) & int(event["type"]):
                data = c_nvmlEventData_t()
                data.device = _make_handle({"slot": event["slot"]})
                data.eventType = int(event["type"])
                data.eventData = int(event.get("data", 0))
                data.gpuInstanceId = 0xFFFFFFFF
                data.computeInstanceId = 0xFFFFFFFF
                return data
        if time.monotonic() >= deadline:
            _raise(NVML_ERROR_TIMEOUT)
        time.sleep(0.02)


def nvmlEventSetWait(eventSet: Any, timeoutms: int) -> c_nvmlEventData_t:
    return nvmlEventSetWait_v2(eventSet, timeoutms)


def nvmlEventSetFree(eventSet: Any) -> None:
    _event_set(eventSet)
    with _lock:
        _event_sets.pop((cast(eventSet, c_void_p).value or 0) - _EVENT_SET_BASE, None)
    return None


# ---------------------------------------------------------------------------------------------------
# NVLink and topology
# ---------------------------------------------------------------------------------------------------
def nvmlDeviceGetNvLinkState(device: Any, link: int) -> int:
    return int(bool(_link(_device("nvmlDeviceGetNvLinkState", device), link)["active"]))


def nvmlDeviceGetNvLinkVersion(device: Any, link: int) -> int:
    return int(_link(_device("nvmlDeviceGetNvLinkVersion", device), link).get("version", 3))


def nvmlDeviceGetNvLinkCapability(device: Any, link: int, capability: int) -> int:
    entry = _link(_device("nvmlDeviceGetNvLinkCapability", device), link)
    if not 0 <= int(capability) < NVML_NVLINK_CAP_COUNT:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    if int(capability) == NVML_NVLINK_CAP_SLI_BRIDGE:
        return 0
    return (
        1
        if int(capability) in (NVML_NVLINK_CAP_P2P_SUPPORTED, NVML_NVLINK_CAP_VALID)
        else int(entry.get("remote_type") == "gpu")
    )


def nvmlDeviceGetNvLinkRemotePciInfo(device: Any, link: int) -> nvmlPciInfo_t:
    return _pci_struct(_link(_device("nvmlDeviceGetNvLinkRemotePciInfo_v2", device), link)["remote_pci"])


def nvmlDeviceGetNvLinkRemoteDeviceType(handle: Any, link: int) -> int:
    entry = _link(_device("nvmlDeviceGetNvLinkRemoteDeviceType", handle), link)
    return {"gpu": NVML_NVLINK_DEVICE_TYPE_GPU, "switch": NVML_NVLINK_DEVICE_TYPE_SWITCH}.get(
        str(entry.get("remote_type")), NVML_NVLINK_DEVICE_TYPE_UNKNOWN
    )


def nvmlDeviceGetTopologyCommonAncestor(device1: Any, device2: Any) -> int:
    state = _begin("nvmlDeviceGetTopologyCommonAncestor")
    a, b = _gpu(state, device1), _gpu(state, device2)
    if a["slot"] == b["slot"]:
        return NVML_TOPOLOGY_INTERNAL
    return int(state["pcie_topology"][a["slot"]][b["slot"]])


def nvmlDeviceGetP2PStatus(device1: Any, device2: Any, p2pIndex: int) -> int:
    state = _begin("nvmlDeviceGetP2PStatus")
    _gpu(state, device1)
    _gpu(state, device2)
    return NVML_P2P_STATUS_OK
