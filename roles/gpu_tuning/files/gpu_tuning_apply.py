#!/usr/bin/python3
"""Reapply the GPU settings Ansible manages (gpu-tuning.service, at boot and whenever nvidia-persistenced
starts again): the power limit, target temperature and persistence mode saved in gpu_tuning's JSON file.

Usage: gpu_tuning_apply.py SETTINGS_JSON

The same code as the gpu_settings module: the role installs this script together with the module_utils
files it imports (module_utils/gpu_settings_core.py and what that imports) into one directory, and the
script makes that directory ``ansible.module_utils``, since Ansible itself is not installed on the node.
pynvml comes from the running Python or, if that lacks it, from NVML_VENV (the script re-executes itself
there, as the modules respawn). Exit status 1 when NVML is unavailable or a setting failed.
"""

from __future__ import annotations

import json
import os
import sys
import types


def use_module_utils_beside_this_script() -> None:
    """``import ansible.module_utils.X`` loads X.py from this script's directory."""
    here = os.path.dirname(os.path.abspath(__file__))
    ansible = types.ModuleType("ansible")
    ansible.__path__ = []
    module_utils = types.ModuleType("ansible.module_utils")
    module_utils.__path__ = [here]
    ansible.module_utils = module_utils  # type: ignore[attr-defined]
    sys.modules["ansible"] = ansible
    sys.modules["ansible.module_utils"] = module_utils


def main(argv: list[str]) -> int:
    from ansible.module_utils.gpu_settings_core import apply_saved_settings
    from ansible.module_utils.nvml_session import NVML_VENV, NvmlUnavailable, nvml_session
    from ansible.module_utils.venv_respawn import import_or_reexec

    if len(argv) != 2:
        print(f"usage: {argv[0]} SETTINGS_JSON", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        settings = json.load(f)
    nvml = import_or_reexec("pynvml", NVML_VENV, argv)
    if nvml is None:
        print(
            f"pynvml (nvidia-ml-py) is in neither {sys.executable} nor {NVML_VENV}: GPU settings not applied",
            file=sys.stderr,
        )
        return 1
    try:
        with nvml_session(nvml):
            done, failures = apply_saved_settings(nvml, settings)
    except NvmlUnavailable as exc:
        print(f"GPU settings not applied: {exc}", file=sys.stderr)
        return 1
    for line in done or ["all settings already in place"]:
        print(line)
    for line in failures:
        print(line, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    use_module_utils_beside_this_script()
    sys.exit(main(sys.argv))
