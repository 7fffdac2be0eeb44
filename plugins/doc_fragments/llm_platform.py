"""Documentation text the project's modules share (``extends_documentation_fragment``).

- ``llm_platform``: the attributes every module states (check_mode, diff_mode, platform). A module adds
  ``support:`` to check_mode and diff_mode in its own ``attributes:`` block.
- ``llm_platform.facts``: the ``facts`` attribute, for modules that return ``ansible_facts``.
- ``llm_platform.nvml``: requirements and the respawn note of the modules that read NVML through
  ``module_utils/nvml_session.py``. The path here is the constant ``NVML_VENV`` of that file.

Found through ``doc_fragment_plugins`` in ansible.cfg; listed in docs/CONTRACTS.md.
"""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode),
      when in diff mode.
  platform:
    description: Target OS/families that can be operated against.
    platforms: posix
    support: full
"""

    FACTS = r"""
options: {}
attributes:
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
    support: full
"""

    NVML = r"""
options: {}
requirements:
  - NVIDIA driver (libnvidia-ml.so.1) on the target
  - nvidia-ml-py (the pynvml module), in the target's Python or in the virtualenv /opt/nvidia-ml-py
notes:
  - When the running Python cannot import C(pynvml), the module re-runs itself under
    C(/opt/nvidia-ml-py/bin/python3), where the C(nvidia_driver) role installs C(nvidia-ml-py).
  - Errors are explained with the fix, for example a driver/library version mismatch after a driver
    upgrade (reload the nvidia kernel modules or reboot). See docs/gpu-modules.md.
"""
