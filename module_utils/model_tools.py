"""Where the model modules' Python tools live on a node, and how a module gets at them.

``model_admission`` needs ``tokenizers``, ``picklescan`` and ``bandit``. They are not in the node's system
Python; the ``model_sync`` role installs them, at the versions pinned here, into the virtualenv
``MODEL_TOOLS_VENV``. A module that cannot import them re-runs itself under that venv's Python
(ansible.module_utils.common.respawn), as the GPU modules do with ``/opt/nvidia-ml-py``.

This file is the one home of the venv path and of the pinned versions (docs/CONTRACTS.md, "Model modules").
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from ansible.module_utils.venv_respawn import import_all_or_respawn, venv_python

if TYPE_CHECKING:
    from ansible.module_utils.basic import AnsibleModule

MODEL_TOOLS_VENV = "/opt/model-tools"
MODEL_TOOLS_PYTHON = venv_python(MODEL_TOOLS_VENV)

# PyPI requirement -> the module it provides; the model_sync role pip-installs exactly these, into a venv
# of the node's python3 (Ubuntu 22.04: 3.10), so each must install on 3.10. picklescan: 1.0.4, not 1.0.5
# (Requires-Python >=3.11); both have the same safe and unsafe globals (1.0.5 only adds --strict, which
# refuses "suspicious" globals: gate_pickle refuses every global that is not innocuous anyway).
MODEL_TOOLS_REQUIREMENTS: dict[str, str] = {
    "tokenizers==0.23.3": "tokenizers",
    "picklescan==1.0.4": "picklescan",
    "bandit==1.9.4": "bandit",
}

TOOLS_MISSING_MSG = (
    "The Python module {name} cannot be imported by {python}, and "
    + MODEL_TOOLS_PYTHON
    + " does not provide it either. Run the model_sync role, which installs the model tools into the "
    "virtualenv "
    + MODEL_TOOLS_VENV
    + " (or by hand: python3 -m venv "
    + MODEL_TOOLS_VENV
    + " && "
    + MODEL_TOOLS_VENV
    + "/bin/pip install "
    + " ".join(MODEL_TOOLS_REQUIREMENTS)
    + ")."
)


def import_tools(module: AnsibleModule, names: list[str]) -> dict[str, ModuleType]:
    """Import the tools ``names``; respawn under the tools venv (once) when one is missing, else fail."""
    if not names:
        return {}
    return import_all_or_respawn(module, names, MODEL_TOOLS_VENV, TOOLS_MISSING_MSG)
