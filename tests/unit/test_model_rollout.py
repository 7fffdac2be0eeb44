"""playbooks/canary.yml, promote.yml and remediate/rollback-model.yml refuse bad input before anything
changes, naming the variable (or the missing or damaged weights path), on a local inventory: the refusals
come before any API call. What they do on a cluster, with the gateway running for real in front of two
simulators: tests/lab/test_canary_on_lab.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = {
    "canary": "playbooks/canary.yml",
    "promote": "playbooks/promote.yml",
    "rollback": "playbooks/remediate/rollback-model.yml",
}


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A one-node inventory (local connection) and the serving values the playbooks validate."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": str(ROOT / ".venv/bin/python")}
    inventory = {
        "all": {
            "children": {
                "k8s_cluster": {"children": {"control_plane": {"hosts": {"gpu-node-1": local}}}},
                # the gpu stage's values vllm_serving reads (group_vars/gpu_nodes.yml in an inventory)
                "gpu_nodes": {
                    "children": {"control_plane": {}},
                    "vars": {"nvidia_driver_branch": "535", "nvidia_driver_expected_gpu_count": 4},
                },
            }
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    variables = {
        "ansible_become": False,
        "vllm_serving_image_digest": "sha256:" + "ab" * 32,
        "vllm_serving_models_root": str(tmp_path / "models"),
        "vllm_serving_models": [{"name": "qwen2-7b", "served_model_name": "qwen2-7b-chat", "replicas": 1}],
        "model_sync_models": [{"name": "qwen2-7b", "version": "v1"}],
        "llm_gateway_image_digest": "sha256:" + "cd" * 32,
        "llm_gateway_jwt_secret": "x" * 40,
    }
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(variables))
    return tmp_path


def run(site: Path, playbook: str, *extra: str) -> tuple[int, str]:
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-playbook"),
            "-i",
            str(site / "hosts.yml"),
            PLAYBOOKS[playbook],
            "-e",
            f"@{site / 'vars.yml'}",
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        timeout=180,
    )
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


@pytest.mark.parametrize(
    ("playbook", "extra", "says"),
    [
        (
            "canary",
            [],
            "model (model_rollout_model) must be the served name of one vllm_serving_models entry",
        ),
        (
            "promote",
            ["-e", "model=qwen2-7b"],
            "must be the served name of one vllm_serving_models entry (qwen2-7b-chat)",
        ),
        ("rollback", ["-e", "model=nope"], 'got "nope"'),
        ("canary", ["-e", "model=qwen2-7b-chat"], "canary needs version (model_rollout_version)"),
        ("canary", ["-e", "model=qwen2-7b-chat", "-e", "version=current"], "(not `current`)"),
        (
            "canary",
            ["-e", "model=qwen2-7b-chat", "-e", "version=v2", "-e", "weight=ten"],
            # the role's argument spec refuses it first
            "argument 'model_rollout_weight' is of type str and we were unable to convert to int",
        ),
        ("canary", ["-e", "model=qwen2-7b-chat", "-e", "version=v2", "-e", "weight=150"], 'got "150"'),
    ],
    ids=[
        "no-model",
        "name-not-served-name",
        "unknown-model",
        "no-version",
        "version-current",
        "weight-text",
        "weight-over-100",
    ],
)
def test_bad_input_is_refused_naming_the_variable(
    site: Path, playbook: str, extra: list[str], says: str
) -> None:
    rc, out = run(site, playbook, *extra)
    assert rc != 0 and says in out, out[-3000:]
    assert "changed=0" in out


def test_a_canary_name_too_long_for_a_statefulset_is_refused(site: Path) -> None:
    """<name>-canary names a StatefulSet: at most 52 characters, or its pods are never created."""
    name = "m" * 46
    models = {"vllm_serving_models": [{"name": name, "served_model_name": "long", "replicas": 1}]}
    synced = {"model_sync_models": [{"name": name, "version": "v1"}]}
    extra = ("-e", json.dumps(models), "-e", json.dumps(synced), "-e", "model=long", "-e", "version=v2")
    rc, out = run(site, "canary", *extra)
    says = f"the canary's StatefulSet {name}-canary: '{name}-canary' is too long"
    assert rc != 0 and says in out, out[-3000:]
    assert "changed=0" in out


def test_a_version_not_synced_is_refused_naming_the_path(site: Path) -> None:
    rc, out = run(site, "canary", "-e", "model=qwen2-7b-chat", "-e", "version=v2")
    missing = site / "models" / "qwen2-7b" / "v2.manifest.json"
    assert rc != 0 and f"{missing} does not exist: version v2 of qwen2-7b is not synced" in out, out[-3000:]


def test_weights_that_do_not_match_their_manifest_are_refused(site: Path) -> None:
    version = site / "models" / "qwen2-7b" / "v2"
    version.mkdir(parents=True)
    weights = version / "model.safetensors"
    weights.write_bytes(b"weights as published")
    entry = {"path": "model.safetensors", "size": weights.stat().st_size}
    entry["sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    manifest = {
        "format": "model-manifest/1",
        "algorithm": "sha256",
        "file_count": 1,
        "total_size": entry["size"],
    }
    (version.parent / "v2.manifest.json").write_text(json.dumps({**manifest, "files": [entry]}))
    weights.write_bytes(b"weights as corrupted")  # same size, other bytes
    rc, out = run(site, "canary", "-e", "model=qwen2-7b-chat", "-e", "version=v2")
    assert rc != 0 and f"{version} does not match its manifest" in out, out[-3000:]
    assert 'mismatched ["model.safetensors"]' in out, out[-3000:]


# ------------------------------------------------------------------------- the gateway's rollout, waited for
ROLE_TASKS = ROOT / "roles" / "model_rollout" / "tasks"
GATEWAY_TASKS = ROOT / "roles" / "llm_gateway" / "tasks"


def flat_tasks(path: Path) -> list[dict[str, object]]:
    """The tasks of a task file in order, blocks flattened (a block's `when` carried into its tasks)."""
    found: list[dict[str, object]] = []

    def walk(items: list[dict[str, object]], when: list[object]) -> None:
        for task in items or []:
            if "block" in task:
                inner = [*when, *([task["when"]] if "when" in task else [])]
                walk(task["block"], inner)  # type: ignore[arg-type]
            else:
                found.append({**task, "_when": [*when, *([task["when"]] if "when" in task else [])]})

    walk(yaml.safe_load(path.read_text()), [])
    return found


def includes(task: dict[str, object]) -> str:
    """What a task includes: 'llm_gateway', 'llm_gateway/wait-rolled-out', 'write-state.yml', or ''."""
    role = task.get("ansible.builtin.include_role")
    if isinstance(role, dict):
        return "/".join(filter(None, [role["name"], role.get("tasks_from")]))
    return str(task.get("ansible.builtin.include_tasks") or "")


def test_every_change_of_the_weights_waits_for_the_gateways_rollout() -> None:
    """The gateway's pods route with the configuration they started with (its checksum rolls them): after
    write-state.yml re-renders it, the weights hold only once the Deployment has rolled out, the old pods gone
    (terminating ones still serve what they hold). So write-state waits for it (llm_gateway's
    wait-rolled-out) before anything relies on the new weights: the canary's removal, the stable StatefulSet's
    move, the summary."""
    steps = [includes(t) for t in flat_tasks(ROLE_TASKS / "write-state.yml")]
    assert "llm_gateway" in steps and "llm_gateway/wait-rolled-out" in steps, steps
    assert steps.index("llm_gateway/wait-rolled-out") > steps.index("llm_gateway"), steps
    assert steps[-1] == "llm_gateway/wait-rolled-out", "nothing after the wait may rely on the old weights"
    for action in ("promote.yml", "rollback.yml"):
        tasks = flat_tasks(ROLE_TASKS / action)
        removal = next(i for i, t in enumerate(tasks) if "canary's StatefulSet" in str(t.get("name")))
        before = [includes(t) for t in tasks[:removal]]
        assert "write-state.yml" in before, f"{action}: the canary is removed before the weights moved"
        last = max(i for i, t in enumerate(tasks[:removal]) if includes(t) == "write-state.yml")
        assert tasks[last]["_when"] == tasks[removal]["_when"], f"{action}: a removal without its wait"


def test_the_gateway_wait_is_sized_and_judged_by_the_deployment() -> None:
    """llm_gateway's wait-rolled-out.yml: the Deployment as the role rendered it, read from the cluster; its
    wait from its own settings, done when rolled out (no old pod left), stopped early when the controller
    gives up; an assert that says what was not done. Nothing is applied in check mode: no wait there."""
    tasks = flat_tasks(GATEWAY_TASKS / "wait-rolled-out.yml")
    text = (GATEWAY_TASKS / "wait-rolled-out.yml").read_text()
    for used in ("k8s_deployment_rollout_wait_s", "k8s_deployment_rolled_out", "k8s_deployment_stalled"):
        assert used in text, used
    (wait,) = [t for t in tasks if "until" in t]
    until = str(wait["until"])
    assert "k8s_deployment_rolled_out" in until and "k8s_deployment_stalled" in until
    assert "k8s_deployment_rollout_wait_s" in str(wait["retries"])
    assert "_llm_gateway_objects" in text, "the Deployment's name and namespace as the role rendered them"
    asserts = [t for t in tasks if "ansible.builtin.assert" in t]
    assert asserts and "k8s_deployment_rolled_out" in str(asserts[-1]["ansible.builtin.assert"]["that"])
    assert all("not ansible_check_mode" in str(t["_when"]) for t in tasks), "check mode applies nothing"
