"""playbooks/validate.yml on the lab (README, "On the real servers"): every value checked in one run over SSH,
nothing changed.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_validate_on_lab.py -v

The lab inventory sets every site value and passes every role's checks on its nodes: the run passes and
changes nothing. With several values emptied, one run names each of them, from different stages and roles,
and only the last play fails. The same on a copy of the sample inventory, offline:
tests/unit/test_validate_playbook.py.
"""

from __future__ import annotations

import json

import pytest
from labrun import NODES, playbook, running_nodes

pytestmark = pytest.mark.lab


@pytest.fixture(autouse=True)
def lab_up() -> None:
    if "gpu-node-1" not in running_nodes():
        pytest.skip("the lab is not running (make lab-up)")


def test_the_lab_inventory_passes_and_nothing_changes() -> None:
    run = playbook("playbooks/validate.yml", timeout=900)
    assert run.rc == 0, run.tail()
    assert run.changed() == {**dict.fromkeys(NODES, 0), "localhost": 0}, run.changed_tasks()
    assert "Every site value is set and every role's checks pass" in " ".join(run.output.split())


def test_emptied_values_of_several_stages_are_named_in_one_run() -> None:
    emptied = {
        "model_sync_models": [],
        "vllm_serving_image_digest": "",
        "monitoring_grafana_image_digest": "",
        "llm_gateway_jwt_secret": "",
    }
    run = playbook("playbooks/validate.yml", "-e", json.dumps(emptied), timeout=900)
    assert run.rc != 0
    flat = " ".join(run.output.split())
    for name in emptied:
        assert f"set {name} (" in flat, (name, run.tail())
    assert "refused on gpu-node-1: vllm_serving: vllm_serving_image_digest" in flat, run.tail()
    assert run.failed() == {**dict.fromkeys(NODES, 0), "localhost": 1}, run.recap
    assert set(run.changed().values()) == {0}, run.changed_tasks()
