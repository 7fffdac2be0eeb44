"""The model tools' wheels and the kubernetes.core modules' Python client for the lab mirror's PEP 503
index (air-gapped lab nodes, like a site without PyPI): the pinned requirements of
module_utils/model_tools.py (their one home), the kubernetes client pinned by roles/kubernetes_api_client,
and every dependency, for the nodes' CPython on x86_64 (3.10 as on Ubuntu 22.04; 3.11 for a lab that fell back
to Debian's, labctl.py), downloaded with pip on the host once per set of pins and cached in
CACHE/<hash of the pins>/."""

from __future__ import annotations

import ast
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

MODEL_TOOLS = Path(__file__).resolve().parents[3] / "module_utils" / "model_tools.py"
# manylinux tags a Debian 12 / Ubuntu 22.04 node (glibc 2.35+) installs
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")
# the nodes' python3: 3.10 (Ubuntu 22.04's), or Debian's 3.11 where no 3.10 was found (labctl.node_python)
PYTHON_VERSIONS = ("3.10", "3.11")


def pinned_requirements() -> list[str]:
    """MODEL_TOOLS_REQUIREMENTS' keys, read without importing the module (it needs ansible)."""
    tree = ast.parse(MODEL_TOOLS.read_text())
    for node in ast.walk(tree):
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id == "MODEL_TOOLS_REQUIREMENTS" and value is not None:
            return list(ast.literal_eval(value))
    raise SystemExit(f"build_mirror: no MODEL_TOOLS_REQUIREMENTS in {MODEL_TOOLS}")


def kubernetes_client_requirement() -> str:
    """The kubernetes Python client pinned by roles/kubernetes_api_client (kubernetes.core's client)."""
    defaults = MODEL_TOOLS.parents[1] / "roles" / "kubernetes_api_client" / "defaults" / "main.yml"
    for line in defaults.read_text().splitlines():
        match = re.match(r'^kubernetes_api_client_version:\s*"?([^"\s]+)"?\s*$', line)
        if match:
            return f"kubernetes=={match[1]}"
    raise SystemExit(f"build_mirror: no kubernetes_api_client_version in {defaults}")


def interpreter(python_version: str) -> str:
    """The Python to run pip with for PYTHON_VERSION's wheels. pip evaluates a requirement's environment
    markers (aiohttp's `async-timeout; python_version < "3.11"`) for the interpreter it runs in, whatever
    --python-version says: a 3.10 node's dependencies come from a 3.10 pip (pyenv's, or LAB_PYTHON310's)."""
    if sys.version_info[:2] == tuple(map(int, python_version.split("."))):
        return sys.executable
    candidates = (
        [Path(os.environ["LAB_PYTHON310"]) / "bin" / "python3.10"] if os.environ.get("LAB_PYTHON310") else []
    )
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(
        (pyenv / "versions").glob(f"{python_version}.*/bin/python{python_version}"), reverse=True
    )
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    print(f"lab-mirror: WARNING: no Python {python_version}: its wheels' markers are judged as this Python's")
    return sys.executable


def download(cache: Path, requirements: list[str] | None = None) -> list[Path]:
    requirements = requirements if requirements is not None else pinned_requirements()
    key = "\n".join([*requirements, *PYTHON_VERSIONS, "markers of each version's own pip"])
    target = cache / hashlib.sha256(key.encode()).hexdigest()[:16]
    if not (target / ".complete").is_file():
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        print(f"lab-mirror: downloading the model tools' wheels ({' '.join(requirements)}) into {target}")
        platforms = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
        for python_version in PYTHON_VERSIONS:
            subprocess.run(
                [interpreter(python_version), "-m", "pip", "download", "--quiet",
                 "--disable-pip-version-check",
                 "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version,
                 *platforms, "--dest", str(target), *requirements],
                check=True,
            )  # fmt: skip
        (target / ".complete").write_text("\n".join(requirements) + "\n")
    return sorted(target.glob("*.whl"))


def project_name(wheel: Path) -> str:
    """PEP 503 normalised project name of a wheel file."""
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def add_to_index(pypi_dir: Path, cache: Path) -> int:
    """Copy the wheels into PYPI_DIR/simple/<project>/ with their index pages; rewrite the root page
    to list every project there. Returns the number of wheels."""
    simple = pypi_dir / "simple"
    wheels = download(cache) + download(cache, [kubernetes_client_requirement()])
    for wheel in wheels:
        project = simple / project_name(wheel)
        project.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, project / wheel.name)
    for project in (path for path in simple.iterdir() if path.is_dir()):
        links = []
        for wheel in sorted(project.glob("*.whl")):
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            links.append(f'<a href="{wheel.name}#sha256={digest}">{wheel.name}</a><br>')
        (project / "index.html").write_text(
            "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"
        )
    projects = sorted(path.name for path in simple.iterdir() if path.is_dir())
    (simple / "index.html").write_text(
        "<!DOCTYPE html><html><body>\n"
        + "\n".join(f'<a href="{name}/">{name}</a><br>' for name in projects)
        + "\n</body></html>\n"
    )
    return len(wheels)
