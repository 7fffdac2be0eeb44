"""Every role's manual is its defaults/main.yml plus meta/argument_specs.yml, and the two agree.

Covers every directory under roles/, so a new role is checked without editing this file: each variable in
defaults/main.yml is an option of the argument specs (entry point main) with a description, a type that fits
its default and the same default, and the other way round; every entry point has the options of main; the
variables carry the role's name; ansible-doc renders the specs; the README is prose that points there instead
of a variable table (docs/CONTRACTS.md, "Roles").
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(path.name for path in (ROOT / "roles").iterdir() if (path / "tasks").is_dir())
ANSIBLE_DOC = Path(sys.executable).parent / "ansible-doc"
# the Python types a default of each argument-spec type may have
TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "path": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
    "raw": (object,),
}


def load(role: str, path: str) -> Any:
    return yaml.safe_load((ROOT / "roles" / role / path).read_text())


def defaults(role: str) -> dict[str, Any]:
    return load(role, "defaults/main.yml") or {}


def specs(role: str) -> dict[str, Any]:
    return load(role, "meta/argument_specs.yml")["argument_specs"]


@cache
def rendered() -> dict[str, Any]:
    result = subprocess.run(
        [str(ANSIBLE_DOC), "-t", "role", "-r", str(ROOT / "roles"), "--json", *ROLES],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_every_role_is_found() -> None:
    assert {"common", "nvidia_driver", "cuda_toolkit", "gpu_tuning", "cuda_repository"} <= set(ROLES)


@pytest.mark.parametrize("role", ROLES)
def test_defaults_and_argument_specs_agree(role: str) -> None:
    values = defaults(role)
    options = specs(role)["main"].get("options") or {}
    assert set(values) - set(options) == set(), "in defaults/main.yml but not in meta/argument_specs.yml"
    assert set(options) - set(values) == set(), "in meta/argument_specs.yml but not in defaults/main.yml"
    for name, value in values.items():
        option = options[name]
        assert name.startswith(f"{role}_"), f"{name}: variables carry the role's name"
        assert str(option.get("description", "")).strip(), f"{name}: no description"
        assert option.get("type") in TYPES, f"{name}: type {option.get('type')!r}"
        assert "default" in option, f"{name}: no default in the argument specs"
        assert option["default"] == value, f"{name}: specs {option['default']!r}, defaults {value!r}"
        assert not option.get("required"), f"{name}: required, yet defaults/main.yml gives it a value"
        # bool is an int in Python: only a bool option may default to true/false
        is_bool = isinstance(value, bool)
        fits = isinstance(value, TYPES[option["type"]])
        fits = fits and (option["type"] == "raw" or is_bool == (option["type"] == "bool"))
        assert fits, f"{name}: default {value!r} is not a {option['type']}"
        if option["type"] == "list" and "elements" in option and option["elements"] in TYPES:
            wrong = [item for item in value if not isinstance(item, TYPES[option["elements"]])]
            assert wrong == [], f"{name}: elements {wrong!r} are not {option['elements']}"


@pytest.mark.parametrize("role", ROLES)
def test_every_entry_point_has_the_options_of_main(role: str) -> None:
    entry_points = specs(role)
    main = entry_points["main"].get("options") or {}
    for name, entry_point in entry_points.items():
        assert (entry_point.get("options") or {}) == main, name


@pytest.mark.parametrize("role", ROLES)
def test_ansible_doc_renders_the_argument_specs(role: str) -> None:
    entry_points = rendered()[role]["entry_points"]
    assert set(entry_points) == set(specs(role))
    assert set(entry_points["main"].get("options") or {}) == set(defaults(role))


@pytest.mark.parametrize("role", ROLES)
def test_readme_points_to_the_manual_instead_of_a_variable_table(role: str) -> None:
    readme = (ROOT / "roles" / role / "README.md").read_text()
    assert "defaults/main.yml" in readme
    assert f"ansible-doc -t role -r roles {role}" in readme
    tables = [line for line in readme.splitlines() if line.startswith("|") and f"`{role}_" in line]
    assert tables == [], "variable table in README.md: the argument specs are the manual"
