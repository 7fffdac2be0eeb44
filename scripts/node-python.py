#!/usr/bin/env python3
"""The Python that runs on the nodes, and the checks that hold the code running there to it.

On the servers (Ubuntu 22.04) `/usr/bin/python3` is 3.10, and so is every venv the roles make from it,
while the controller's toolchain (.venv, ansible-core 2.19) needs 3.11 or newer. The node-side code is
what pyproject.toml's `[tool.ruff.per-file-target-version]` maps to the nodes' version: its one home
(library/, module_utils/, roles/*/files, playbooks/files). This script reads it from there for
`make lint` and `make unit`:

  lint [PATH...]    vermin over the node-side files (or PATHs): exit 1 on anything newer than the nodes'
                    Python, standard-library members included (datetime.UTC, tomllib, typing.Self, ...),
                    which ruff's target version does not check (docs/CONTRACTS.md says what was measured)
  version           the nodes' Python version, e.g. 3.10
  interpreter       the path of a Python of that version on this machine: `pythonX.Y` on PATH, else
                    pyenv's newest X.Y.* ($PYENV_ROOT, default ~/.pyenv); exit 1 naming how to get one
  requirements      what the node-side unit tests' venv (.venv310) installs with pip: the test harness
                    at pyproject.toml's dev pins, and the packages the roles put into the nodes' /opt
                    venvs at the roles' pins (model tools, kubernetes client, nvidia-ml-py)
  ansible-core      ansible-core at pyproject.toml's pin (installed without its controller dependencies:
                    only its module_utils are used, as AnsiballZ ships them to a node)
  tests [DIR]       the unit test files (default tests/unit) that exercise node-side code: a test file
                    is node-side when it imports a node-side module (`import gpu_facts`, from
                    `ansible.module_utils` one of the project's), names a node-side file in a string
                    (`ROLE / "files" / "gpu_tuning_apply.py"`), or imports a test file that is
                    node-side; and does not import the controller's Ansible (ansible.* but its
                    module_utils and modules), itself or through a helper file of DIR (role_render.py):
                    that needs 3.11 and runs in the controller's pass
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
# The test harness of the node-side unit tests, at the versions pyproject.toml's dev extras pin.
HARNESS = ("pytest", "pytest-xdist", "jinja2", "pyyaml", "safetensors")


def _pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text())


def node_side_globs() -> tuple[str, list[str]]:
    """(the nodes' version as X.Y, the globs of node-side files) from ruff's per-file target versions."""
    per_file = _pyproject()["tool"]["ruff"]["per-file-target-version"]
    versions = set(per_file.values())
    if len(versions) != 1:
        raise SystemExit(f"{PYPROJECT}: [tool.ruff.per-file-target-version] must name one version")
    (target,) = versions
    match = re.fullmatch(r"py3(\d+)", target)
    if not match:
        raise SystemExit(f"{PYPROJECT}: [tool.ruff.per-file-target-version]: {target!r} is not pyXY")
    return f"3.{match[1]}", list(per_file)


def node_side_files() -> list[Path]:
    _, globs = node_side_globs()
    return sorted({path for pattern in globs for path in ROOT.glob(pattern) if path.is_file()})


def dev_pins() -> dict[str, str]:
    """pyproject.toml's dev extras: normalised project name -> its requirement line."""
    pins = {}
    for line in _pyproject()["project"]["optional-dependencies"]["dev"]:
        name = re.split(r"[\[=<>!~ ]", line, maxsplit=1)[0]
        pins[re.sub(r"[-_.]+", "-", name).lower()] = line
    return pins


def lint(paths: list[str]) -> int:
    version, _ = node_side_globs()
    files = paths or [str(path) for path in node_side_files()]
    if not files:
        raise SystemExit(
            "node-python lint: no node-side file matches pyproject.toml's per-file target versions"
        )
    vermin = [sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())"]  # it has no __main__
    command = [*vermin, "--no-config-file", "--no-tips", "--violations"]
    result = subprocess.run([*command, f"--target={version}-", *files], check=False)
    if result.returncode:
        print(f"node-python lint: code that runs on the nodes must run on Python {version} (Ubuntu 22.04)")
    return result.returncode


def interpreter() -> str:
    version, _ = node_side_globs()
    name = f"python{version}"
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = [shutil.which(name)]
    installed = pyenv_root.glob(f"versions/{version}.*/bin/{name}")
    candidates += [str(p) for p in sorted(installed, key=lambda p: _patch(p.parts[-3]), reverse=True)]
    for candidate in filter(None, candidates):
        # a pyenv shim on PATH fails when no selected pyenv version has the command: ask it
        probe = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2], sys.executable)"],
            capture_output=True,
            text=True,
            check=False,
        )
        found = probe.stdout.split()
        if probe.returncode == 0 and found and found[0] == version:
            return found[1]
    raise SystemExit(
        f"No Python {version} found (neither {name} on PATH nor {pyenv_root}/versions/{version}.*). The "
        f"nodes run Ubuntu 22.04's Python {version}, and make unit runs the node-side unit tests under it. "
        f"Install one with pyenv (`pyenv install {version}`; its build needs build-essential libssl-dev "
        "zlib1g-dev libbz2-dev libreadline-dev libsqlite3-dev libffi-dev liblzma-dev), or a "
        f"{name} package where the distribution has one (Ubuntu 22.04: python{version}-venv)."
    )


def _patch(folder: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in folder.split("."))


def requirements() -> list[str]:
    pins = dev_pins()
    missing = [name for name in HARNESS if name not in pins]
    if missing:
        raise SystemExit(f"node-python requirements: pyproject.toml's dev extras do not pin {missing}")
    contract = subprocess.run(
        [sys.executable, str(ROOT / "roles" / "model_sync" / "files" / "model_tools_contract.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    model_tools = json.loads(contract.stdout)["requirements"]
    client_defaults = ROOT / "roles" / "kubernetes_api_client" / "defaults" / "main.yml"
    client = yaml.safe_load(client_defaults.read_text())["kubernetes_api_client_version"]
    driver_defaults = ROOT / "roles" / "nvidia_driver" / "defaults" / "main.yml"
    nvml = yaml.safe_load(driver_defaults.read_text())["nvidia_driver_nvml_py_version"]
    return [pins[name] for name in HARNESS] + model_tools + [f"kubernetes=={client}", f"nvidia-ml-py=={nvml}"]


def _imports(tree: ast.AST) -> Iterable[str]:
    """Dotted names a module imports (`from a.b import c` gives a.b and a.b.c)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _strings(tree: ast.AST) -> Iterable[str]:
    """String constants, docstrings left out (a docstring may mention what the test does not run)."""
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value


def _controller_import(name: str) -> bool:
    """Whether NAME is ansible-core's controller code (ansible.parsing, ansible.template, ...: 3.11 or newer),
    not what AnsiballZ ships to a node (ansible.module_utils) or a module."""
    return (name == "ansible" or name.startswith("ansible.")) and not name.startswith(
        ("ansible.module_utils", "ansible.modules")
    )


def _importers_too(stems: set[str], imported: dict[str, set[str]]) -> set[str]:
    """STEMS and every test that imports one of them, directly or through another test (IMPORTED: each
    test's imported test files)."""
    grown, found = True, set(stems)
    while grown:
        grown = False
        for stem, uses in imported.items():
            if stem not in found and uses & found:
                found.add(stem)
                grown = True
    return found


def node_side_tests(directory: Path) -> list[Path]:
    files = node_side_files()
    modules = {f.stem for f in files if f.parent.name == "library"}
    modules |= {f"ansible.module_utils.{f.stem}" for f in files if f.parent.name == "module_utils"}
    # a node-side file's name standing alone in a string ("a/gpu_tuning_apply.py"; not "test_x.py")
    named = re.compile("|".join(rf"(?<![\w.]){re.escape(f.name)}(?!\w)" for f in files))
    tests = sorted(directory.glob("test_*.py"))
    # the directory's helper files (role_render.py, ...) that import the controller's Ansible
    controller_helpers = {
        helper.stem
        for helper in directory.glob("*.py")
        if not helper.name.startswith("test_")
        and any(_controller_import(name) for name in _imports(ast.parse(helper.read_text(), str(helper))))
    }
    direct, imported, controller = set(), {}, set()
    for test in tests:
        tree = ast.parse(test.read_text(), str(test))
        names = set(_imports(tree))
        imported[test.stem] = {name.split(".")[0] for name in names if name.startswith("test_")}
        if any(_controller_import(name) or name.split(".")[0] in controller_helpers for name in names):
            controller.add(test.stem)
        if names & modules or any(named.search(text) for text in _strings(tree)):
            direct.add(test.stem)
    selected = _importers_too(direct, imported)
    controller = _importers_too(controller, imported)
    # a test that imports the controller's Ansible cannot run under the nodes' Python, whatever it names: it
    # runs in the controller's pass (role_render's templar evaluating a role's `when`, ...)
    return [test for test in tests if test.stem in selected and test.stem not in controller]


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "lint":
        return lint(args)
    if command == "version":
        print(node_side_globs()[0])
    elif command == "interpreter":
        print(interpreter())
    elif command == "requirements":
        print("\n".join(requirements()))
    elif command == "ansible-core":
        print(dev_pins()["ansible-core"])
    elif command == "tests":
        found = node_side_tests(Path(args[0]) if args else ROOT / "tests" / "unit")
        if not found:
            raise SystemExit("node-python tests: no node-side unit test found")
        print("\n".join(str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path) for path in found))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
