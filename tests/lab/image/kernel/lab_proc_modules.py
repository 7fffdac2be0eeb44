"""LAB STAND-IN: /proc/modules for a kernel without loadable modules (docs/lab.md).

Loaded at interpreter start by lab-proc-modules.pth. Only where the kernel has no
/proc/modules (this lab's), Python's open() of that path reads the lab modprobe's
table, /run/lab-kmod/modules (empty until something is loaded), and a missing
/lib/modules/<release>/modules.builtin reads as empty. On a kernel that has /proc/modules
nothing changes.
"""

import builtins
import os

_PROC_MODULES = "/proc/modules"
_TABLE = "/run/lab-kmod/modules"

if not os.path.exists(_PROC_MODULES):
    _real_open = builtins.open
    # Nor does such a kernel have a list of built-in modules on disk: read it as empty.
    _BUILTIN = f"/lib/modules/{os.uname().release}/modules.builtin"

    def _open(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        if file == _PROC_MODULES:
            file = _TABLE if os.path.exists(_TABLE) else os.devnull
        elif file == _BUILTIN and not os.path.exists(_BUILTIN):
            file = os.devnull
        return _real_open(file, *args, **kwargs)

    builtins.open = _open
