"""Ansible templates the values of a module's arguments, not the keys of a mapping in them:
`"{{ name }}": value` reaches the module as the literal text (set_fact is the one exception; the rule holds it
too). upgrade-containerd.yml's cordon mark sent the annotation name "{{ __annotation }}" to the API server,
which refused it (on the lab, 2026-12-05); upgrade-kubernetes.yml had the same two tasks. A key built from a
variable is built inside the template: `"{{ {name: value} }}"`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TASK_FILES = sorted(
    [
        *ROOT.glob("playbooks/**/*.yml"),
        *ROOT.glob("roles/*/tasks/*.yml"),
        *ROOT.glob("roles/*/handlers/*.yml"),
        *ROOT.glob("molecule/*/*.yml"),
    ]
)


def templated_keys(node: Any, where: str = "") -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and "{{" in key:
                yield f"{where}/{key}"
            yield from templated_keys(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from templated_keys(item, f"{where}[{index}]")


def test_the_files_are_found() -> None:
    assert len(TASK_FILES) > 100


@pytest.mark.parametrize("path", TASK_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_mapping_key_is_a_template(path: Path) -> None:
    for document in yaml.safe_load_all(path.read_text()):
        assert list(templated_keys(document)) == [], path


def test_the_rule_finds_the_defect_it_guards() -> None:
    task = yaml.safe_load('definition:\n  metadata:\n    annotations:\n      "{{ __annotation }}": "x"\n')
    assert list(templated_keys(task)) == ["/definition/metadata/annotations/{{ __annotation }}"]
