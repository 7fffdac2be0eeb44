"""scripts/node-python.py: the checks that hold the code running on the nodes to their Python (Ubuntu
22.04's 3.10): make lint's vermin check must refuse what 3.10 lacks, make unit's 3.10 run must select every
test of node-side code, and a machine without a Python 3.10 must be told how to get one."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "node-python.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("node_python", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


node_python = load()


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, check=False
    )


def test_lint_refuses_datetime_utc(tmp_path: Path) -> None:
    newer = tmp_path / "newer.py"
    newer.write_text("import datetime as dt\n\nNOW = dt.datetime.now(dt.UTC)\n")
    older = tmp_path / "older.py"
    older.write_text("import datetime as dt\n\nNOW = dt.datetime.now(dt.timezone.utc)\n")

    refused = run("lint", str(newer))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "'datetime.UTC' member requires !2, 3.11" in refused.stdout
    assert "must run on Python 3.10" in refused.stdout
    passed = run("lint", str(older))
    assert passed.returncode == 0, passed.stdout + passed.stderr


def test_node_side_files_are_what_runs_on_the_nodes() -> None:
    # (directories, not file names: a node-side file's name in a string would make this test node-side)
    version, _ = node_python.node_side_globs()
    folders = {str(path.parent.relative_to(ROOT)) for path in node_python.node_side_files()}
    assert version == "3.10"
    assert {"library", "module_utils", "roles/gpu_tuning/files", "playbooks/files"} <= folders
    assert not {name for name in folders if name.startswith(("tests", "scripts", "serve", "plugins"))}


def test_selection_rule_takes_every_kind_of_node_side_test(tmp_path: Path) -> None:
    files = node_python.node_side_files()
    utils = next(f.stem for f in files if f.parent.name == "module_utils")
    module = next(f.stem for f in files if f.parent.name == "library")
    script = next(f.name for f in files if f.parent.name == "files")
    tests = {
        "test_utils.py": f"from ansible.module_utils.{utils} import something\n",
        "test_module.py": f"import {module}\n",
        "test_script.py": f'SCRIPT = ROOT / "files" / "{script}"\n',
        "test_helper_user.py": "from test_utils import something\n",
        "test_controller.py": f'"""Only here: {script}, {module}."""\nimport yaml\nX = "test_{script}"\n',
    }
    for name, text in tests.items():
        (tmp_path / name).write_text(text)

    selected = {path.name for path in node_python.node_side_tests(tmp_path)}
    assert selected == {"test_utils.py", "test_module.py", "test_script.py", "test_helper_user.py"}


def test_a_test_importing_the_controller_s_ansible_is_never_node_side(tmp_path: Path) -> None:
    """ansible-core's controller code needs 3.11 (typing.Self): a test that imports it, itself, through a
    helper file (role_render.py's templar) or through another test, fails under the nodes' Python, and a
    failed import of it breaks every later test of that worker there. It runs in the controller's pass,
    whatever node-side file it names."""
    files = node_python.node_side_files()
    utils = next(f.stem for f in files if f.parent.name == "module_utils")
    script = next(f.name for f in files if f.parent.name == "files")
    tests = {
        "render_helper.py": "from ansible.parsing.dataloader import DataLoader\n",
        "plain_helper.py": f"from ansible.module_utils.{utils} import something\n",
        "test_when.py": f'from render_helper import DataLoader\nPATH = "{script}"\n',
        "test_templar.py": f"import ansible.template\nfrom ansible.module_utils.{utils} import x\n",
        "test_plain.py": f'from plain_helper import something\nPATH = "{script}"\n',
        "test_plain_user.py": "from test_plain import PATH\n",
        "test_helper_user.py": "from test_when import PATH\nfrom test_plain import PATH as P\n",
    }
    for name, text in tests.items():
        (tmp_path / name).write_text(text)

    selected = {path.name for path in node_python.node_side_tests(tmp_path)}
    assert selected == {"test_plain.py", "test_plain_user.py"}


def test_selection_of_the_project_s_tests() -> None:
    selected = {path.name for path in node_python.node_side_tests(ROOT / "tests" / "unit")}
    assert {
        "test_gpu_health_agent.py",  # runs the agent as a module_utils file
        "test_gpu_health_agent_breaker.py",
        "test_gpu_tuning_apply.py",  # runs roles/gpu_tuning/files/ by path
        "test_model_gpu_gates.py",  # loads playbooks/files/ by path
        "test_oncall_playbooks.py",  # through test_gpu_health_agent's cluster
    } <= selected
    assert not {"test_role_docs.py", "test_node_python.py", "test_serving_manifests.py"} & selected
    # names gpu_xid.py, but evaluates the role's `when` with role_render's templar (the controller's Ansible)
    assert "test_gpu_health_agent_install.py" not in selected


def test_no_python_310_is_a_clear_failure(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path / "bin"), "PYENV_ROOT": str(tmp_path / "pyenv")}
    result = run("interpreter", env=env)
    assert result.returncode == 1
    assert "No Python 3.10 found" in result.stderr
    assert "pyenv install 3.10" in result.stderr


def test_interpreter_is_found_as_pyenv_has_it(tmp_path: Path) -> None:
    # a pyenv shim on PATH that no selected version serves fails: pyenv's newest 3.10.* is taken
    (tmp_path / "bin").mkdir()
    shim = tmp_path / "bin" / "python3.10"
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.10: command not found' >&2\nexit 127\n")
    for patch in ("3.10.9", "3.10.13", "3.9.18"):
        python = tmp_path / "pyenv" / "versions" / patch / "bin" / f"python{patch.rsplit('.', 1)[0]}"
        python.parent.mkdir(parents=True)
        python.write_text(f'#!/bin/sh\necho "{patch.rsplit(".", 1)[0]} $0"\n')
        python.chmod(0o755)
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "PYENV_ROOT": str(tmp_path / "pyenv")}

    result = run("interpreter", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "pyenv" / "versions" / "3.10.13" / "bin" / "python3.10")


@pytest.mark.parametrize("command", ["requirements", "ansible-core"])
def test_venv_pins_come_from_their_homes(command: str) -> None:
    lines = run(command).stdout.split()
    pins = node_python.dev_pins()
    if command == "ansible-core":
        assert lines == [pins["ansible-core"]]
        return
    assert pins["pytest"] in lines
    assert any(line.startswith("picklescan==") for line in lines)  # module_utils/model_tools.py
    assert any(line.startswith("kubernetes==") for line in lines)  # roles/kubernetes_api_client
