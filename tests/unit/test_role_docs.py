"""The GPU roles' documentation cannot drift from their defaults (docs/gpu-roles.md).

Every variable in a role's defaults/main.yml is in its argument specs (with the same default), in its
README and in the production group_vars, and every variable is prefixed with the role's name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("nvidia_driver", "cuda_toolkit", "gpu_tuning")
PRODUCTION = yaml.safe_load((ROOT / "inventories/production/group_vars/gpu_nodes.yml").read_text())


def load(role: str, path: str) -> dict:
    return yaml.safe_load((ROOT / "roles" / role / path).read_text())


@pytest.mark.parametrize("role", ROLES)
def test_defaults_specs_readme_and_production_agree(role: str) -> None:
    defaults = load(role, "defaults/main.yml")
    specs = load(role, "meta/argument_specs.yml")["argument_specs"]
    readme = (ROOT / "roles" / role / "README.md").read_text()
    for entry_point in ("main", "validate"):
        options = specs[entry_point]["options"]
        assert set(options) == set(defaults), entry_point
        for name, value in defaults.items():
            assert options[name].get("default") == value, name
    for name in defaults:
        assert name.startswith(f"{role}_"), name
        assert f"`{name}`" in readme, f"{name} missing from roles/{role}/README.md"
        assert name in PRODUCTION, f"{name} missing from inventories/production/group_vars/gpu_nodes.yml"
