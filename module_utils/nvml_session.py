"""NVML access for the GPU modules: import of pynvml (respawning into the venv NVML_VENV when the running
interpreter lacks it), init/shutdown, and translation of NVML errors into messages an on-call engineer
can act on.

Only the public nvidia-ml-py API is used, so the modules run unchanged against real GPUs and against
the lab's fake ``pynvml``. Nothing from Ansible is imported at import time: the boot-time script of role
gpu_tuning uses this file on nodes without Ansible.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ansible.module_utils.venv_respawn import import_or_respawn, venv_python

if TYPE_CHECKING:
    from ansible.module_utils.basic import AnsibleModule

# The one home of this path: the virtualenv where the nvidia_driver role installs nvidia-ml-py
# (docs/CONTRACTS.md). gpu_facts returns it as `nvml_venv` for the roles.
NVML_VENV = "/opt/nvidia-ml-py"
NVML_VENV_PYTHON = venv_python(NVML_VENV)
KERNEL_MODULE_VERSION_FILE = "/sys/module/nvidia/version"

# NVML return codes (nvmlReturn_t); numeric so that messages work whatever the bindings' version.
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18

UNSUPPORTED_CODES = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND})

PYNVML_MISSING_MSG = (
    "The Python module pynvml (PyPI package nvidia-ml-py) cannot be imported by {python}, and "
    f"{NVML_VENV_PYTHON} does not provide it either. Run the nvidia_driver role, which installs "
    f"nvidia-ml-py into the virtualenv {NVML_VENV} (or by hand: python3 -m venv {NVML_VENV} && "
    f"{NVML_VENV}/bin/pip install nvidia-ml-py)."
)


class NvmlUnavailable(Exception):
    """NVML could not be initialised; ``str()`` is the actionable message."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


def require_pynvml(module: AnsibleModule) -> ModuleType:
    """Return the pynvml module, respawning under NVML_VENV's Python if need be; else fail."""
    return import_or_respawn(module, "pynvml", NVML_VENV, PYNVML_MISSING_MSG)


def error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def is_unsupported(exc: BaseException) -> bool:
    """NOT_SUPPORTED, or a function the installed driver does not export (treated alike: null)."""
    return error_code(exc) in UNSUPPORTED_CODES


def _loaded_kernel_module_version() -> str | None:
    try:
        with open(KERNEL_MODULE_VERSION_FILE, encoding="ascii", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def describe_init_error(exc: BaseException) -> str:
    code = error_code(exc)
    if code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return (
            "NVML library libnvidia-ml.so.1 not found: the NVIDIA driver is not installed on this host. "
            "Install it (role nvidia_driver) and run again."
        )
    if code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        loaded = _loaded_kernel_module_version()
        loaded_text = f" (loaded kernel module: {loaded})" if loaded else ""
        return (
            "Failed to initialize NVML: Driver/library version mismatch (NVML_ERROR_LIB_RM_VERSION_MISMATCH)"
            f"{loaded_text}. The nvidia kernel module still loaded is not the version of the installed "
            "user-space driver, typically after a driver upgrade without a reboot. Fix: drain the node, then "
            "reload the nvidia kernel modules (stop nvidia-persistenced and GPU workloads, then "
            "`modprobe -r nvidia_uvm nvidia_drm nvidia_modeset nvidia && modprobe nvidia`) or reboot it."
        )
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return (
            "NVIDIA kernel module not loaded (NVML_ERROR_DRIVER_NOT_LOADED): run `modprobe nvidia` or "
            "reboot; if it fails, check `dmesg` and that the driver package matches the running kernel."
        )
    if code == NVML_ERROR_NO_PERMISSION:
        return "No permission to open the NVIDIA devices (/dev/nvidia*): run the task with become: true."
    return f"Failed to initialize NVML: {exc} (NVML error {code})."


def describe_error(exc: BaseException, what: str) -> str:
    """Message for an NVML error while doing ``what`` (for example 'reading GPU 2')."""
    code = error_code(exc)
    if code == NVML_ERROR_GPU_IS_LOST:
        return (
            f"{what}: GPU is lost (NVML_ERROR_GPU_IS_LOST): it fell off the bus or stopped responding. "
            "Check `dmesg` for Xid 79, drain the node and reset the GPU or reboot; replace it if it recurs."
        )
    if code == NVML_ERROR_NO_PERMISSION:
        return f"{what}: insufficient permissions (NVML_ERROR_NO_PERMISSION): run the task with become: true."
    if code == NVML_ERROR_RESET_REQUIRED:
        return (
            f"{what}: the GPU requires a reset (NVML_ERROR_RESET_REQUIRED): drain the node, reset or reboot."
        )
    if code in UNSUPPORTED_CODES:
        return f"{what}: not supported by this GPU or driver ({exc})."
    return f"{what}: NVML error {code}: {exc}."


@contextlib.contextmanager
def nvml_session(nvml: ModuleType) -> Iterator[ModuleType]:
    """nvmlInit ... nvmlShutdown; init failures raise NvmlUnavailable with an actionable message."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(describe_init_error(exc), error_code(exc)) from exc
    try:
        yield nvml
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def optional(nvml: ModuleType, function: str, *args: Any) -> Any:
    """Call ``nvml.<function>(*args)``; None when the bindings, driver or GPU do not support it."""
    fn = getattr(nvml, function, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        if is_unsupported(exc):
            return None
        raise
