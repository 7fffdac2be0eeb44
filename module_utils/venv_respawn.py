"""Import a Python module, else find it in a virtualenv of its own: "import X, else re-run under
VENV/bin/python3, where it must be".

The project installs third-party Python packages its modules need (nvidia-ml-py, model tools) into
virtualenvs under /opt instead of the system's Python. ``import_or_respawn`` is for Ansible modules (it
respawns through ``ansible.module_utils.common.respawn``); ``import_or_reexec`` is the same for a plain
script such as a systemd unit's (it ``exec``s itself under the venv's interpreter).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

# Nothing from Ansible at import time: the boot-time script of role gpu_tuning imports this file on nodes
# where Ansible is not installed (only import_or_respawn needs it, and runs only inside a module).
if TYPE_CHECKING:
    from ansible.module_utils.basic import AnsibleModule


def venv_python(venv: str) -> str:
    """The interpreter of a virtualenv: VENV/bin/python3."""
    return os.path.join(venv, "bin", "python3")


def runnable(interpreter: str) -> bool:
    """Whether this process may execute ``interpreter`` (a venv's python3 link is followed)."""
    return os.access(interpreter, os.X_OK)


def try_import(name: str) -> tuple[ModuleType | None, str | None]:
    """(module, None), or (None, the ImportError's traceback)."""
    try:
        return importlib.import_module(name), None
    except ImportError:
        return None, traceback.format_exc()


def import_all_or_respawn(
    module: AnsibleModule, names: Sequence[str], venv: str, missing_msg: str
) -> dict[str, ModuleType]:
    """Import every module in ``names`` and return them by name. When this interpreter lacks one, re-run
    the Ansible module under ``venv_python(venv)`` if that interpreter has it (does not return); else
    ``fail_json`` with ``missing_msg.format(name=<the missing module>, python=<this interpreter>)``.
    Respawns at most once.

    The venv's interpreter is not probed first (``respawn.probe_interpreters_for_module``): the probe is
    one more Python start that imports ansible.module_utils.basic, about 0.4 s of a node's core on every
    call of a GPU module. The respawned module imports again and, when the venv lacks the module too,
    fails here with ``missing_msg`` naming the venv's interpreter."""
    from ansible.module_utils.common import respawn

    imported: dict[str, ModuleType] = {}
    missing: list[tuple[str, str | None]] = []
    for name in names:
        found, error = try_import(name)
        if found is None:
            missing.append((name, error))
        else:
            imported[name] = found
    if not missing:
        return imported
    first, error = missing[0]
    if not respawn.has_respawned():
        interpreter = venv_python(venv)
        if runnable(interpreter):
            respawn.respawn_module(interpreter)  # does not return
    module.fail_json(msg=missing_msg.format(name=first, python=sys.executable), exception=error)
    raise AssertionError("fail_json returned")  # pragma: no cover


def import_or_respawn(module: AnsibleModule, name: str, venv: str, missing_msg: str) -> ModuleType:
    """``import_all_or_respawn`` for one module: return it, respawn under the venv, or fail."""
    return import_all_or_respawn(module, [name], venv, missing_msg)[name]


def import_or_reexec(name: str, venv: str, argv: list[str] | None = None) -> ModuleType | None:
    """For a script: return the imported module ``name``; when this interpreter lacks it and is not the
    venv's, ``exec`` ``venv_python(venv) argv...`` (does not return); None when the venv's interpreter is
    missing or is this one (the caller reports that)."""
    imported, _ = try_import(name)
    if imported is not None:
        return imported
    interpreter = venv_python(venv)
    # sys.prefix, not the executable: a venv's python3 is a link to the system's
    if os.path.realpath(sys.prefix) == os.path.realpath(venv) or not os.access(interpreter, os.X_OK):
        return None
    args = sys.argv if argv is None else argv
    os.execv(interpreter, [interpreter, *args])
    return None  # pragma: no cover (execv does not return)
