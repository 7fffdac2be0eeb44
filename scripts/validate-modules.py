#!/usr/bin/env python3
"""Run ansible-test's validate-modules sanity check on the project's modules (library/, module_utils/ and
the doc fragments of plugins/doc_fragments/), which it only checks inside a collection.

It builds a throw-away collection `ansible_collections/llm/platform/` in a temporary directory, rewriting
what a collection spells differently (module_utils imports, doc fragment names and seealso modules become
fully qualified), and runs ansible-test's validator (ansible_test/_util/controller/sanity/validate-modules,
the program `ansible-test sanity --test validate-modules` runs) on it with the Python running this script.
Not through `ansible-test sanity` itself: that first bootstraps a virtualenv with a pip script downloaded
from ci-files.testing.ansible.com, which our build hosts cannot reach; the validator's own requirements
(voluptuous, antsibull-docs-parser) are pinned in pyproject.toml instead.

Errors are printed as ansible-test prints them; exit status 1 when there is any. IGNORED lists the checks
that are Ansible-community policy rather than correctness, each with the reason.

Usage: scripts/validate-modules.py [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE, NAME = "llm", "platform"
FQCN = f"{NAMESPACE}.{NAME}"
PROJECT_MODULE_UTILS = sorted(p.stem for p in (ROOT / "module_utils").glob("*.py"))
DOC_FRAGMENTS = sorted(p.stem for p in (ROOT / "plugins" / "doc_fragments").glob("*.py"))
MODULES = sorted(p.stem for p in (ROOT / "library").glob("*.py"))


def qualify(text: str) -> str:
    """The project's names, as a module of collection llm.platform must spell them."""
    if PROJECT_MODULE_UTILS:
        utils = "|".join(map(re.escape, PROJECT_MODULE_UTILS))
        text = re.sub(
            rf"\bansible\.module_utils\.({utils})\b",
            rf"ansible_collections.{FQCN}.plugins.module_utils.\1",
            text,
        )
    if DOC_FRAGMENTS:
        fragments = "|".join(map(re.escape, DOC_FRAGMENTS))
        text = re.sub(rf"(?m)^(\s+- )({fragments})(\.\w+)?$", rf"\g<1>{FQCN}.\2\3", text)
    if MODULES:
        modules = "|".join(map(re.escape, MODULES))
        text = re.sub(rf"(?m)^(\s+- module: )({modules})$", rf"\g<1>{FQCN}.\2", text)
        text = re.sub(rf"\bM\(({modules})\)", rf"M({FQCN}.\1)", text)
    return text


def build(collection: Path) -> None:
    plugins = collection / "plugins"
    for source, target in (
        (ROOT / "library", plugins / "modules"),
        (ROOT / "module_utils", plugins / "module_utils"),
        (ROOT / "plugins" / "doc_fragments", plugins / "doc_fragments"),
    ):
        target.mkdir(parents=True)
        for path in sorted(source.glob("*.py")):
            (target / path.name).write_text(qualify(path.read_text()))
    (collection / "galaxy.yml").write_text(
        f"namespace: {NAMESPACE}\nname: {NAME}\nversion: 0.1.0\nreadme: README.md\n"
        "authors: [A100 LLM platform team]\n"
    )
    (collection / "README.md").write_text("Throw-away collection built by scripts/validate-modules.py.\n")
    (collection / "meta").mkdir()
    (collection / "meta" / "runtime.yml").write_text("requires_ansible: '>=2.16'\n")


# (code, start of the message) -> why it does not apply to this project
IGNORED = {
    (
        "missing-gplv3-license",
        "",
    ): "the project is Apache-2.0 (pyproject.toml); the GPLv3 header is Ansible's",
    ("invalid-documentation", "DOCUMENTATION.author: Invalid author"): (
        "the modules name the team, not a GitHub handle (an Ansible-community convention)"
    ),
}


def validator() -> Path:
    import ansible_test

    return Path(ansible_test.__file__).parent / "_util/controller/sanity/validate-modules/validate.py"


def validate(workdir: Path, collection: Path) -> list[str]:
    """ansible-test's validate-modules on the collection's modules: 'path:line:column: code: message'."""
    (workdir / "ansible.cfg").write_text("[defaults]\n")  # not the project's: the collection's names apply
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(workdir),
        "ANSIBLE_CONFIG": str(workdir / "ansible.cfg"),
    }
    modules = sorted(
        str(p.relative_to(collection)) for p in (collection / "plugins" / "modules").glob("*.py")
    )
    relative = collection.relative_to(workdir)
    command = [sys.executable, str(validator()), "--format", "json", "--arg-spec"]
    command += ["--collection", str(relative), "--collection-version", "0.1.0", *modules]
    proc = subprocess.run(command, cwd=collection, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 3) or proc.stderr:
        raise SystemExit(
            f"validate-modules did not run (exit {proc.returncode}):\n{proc.stderr}{proc.stdout}"
        )
    problems = []
    for path, report in sorted(json.loads(proc.stdout).items()):
        for error in report["errors"]:
            if any(error["code"] == code and error["msg"].startswith(start) for code, start in IGNORED):
                continue
            where = f"{path}:{error.get('line', 0)}:{error.get('column', 0)}"
            problems.append(f"{where}: {error['code']}: {error['msg']}")
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the collection and print where it is")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="validate-modules-"))
    try:
        collection = workdir / "ansible_collections" / NAMESPACE / NAME
        build(collection)
        problems = validate(workdir, collection)
    finally:
        if args.keep:
            print(f"collection kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    for line in problems:
        print(f"ERROR: {line}")
    checked = ", ".join(MODULES)
    if problems:
        print(f"validate-modules: {len(problems)} error(s) in the project's modules ({checked})")
        return 1
    print(f"validate-modules: clean ({checked})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
