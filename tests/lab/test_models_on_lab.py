"""The model stage on the lab, with real rsync and SSH between the nodes (docs/models.md):

- the lab's model is admitted on gpu-node-1 and `current` points at its verified version on all three
  nodes; a second run changes nothing and verifies from the hash cache;
- every bad variant of tests/modelgen is refused, naming the gate and the file, and nothing moves;
- a push killed half-way leaves the receiving nodes' `current` alone, and the next run completes it.

    make lab-up && .venv/bin/pytest -m lab tests/lab/test_models_on_lab.py -v
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import modelgen  # noqa: E402

NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
LAB_VARS = yaml.safe_load((ROOT / "inventories/lab/group_vars/all.yml").read_text())
SOURCE = LAB_VARS["model_sync_source_node"]
RECEIVERS = tuple(node for node in NODES if node != SOURCE)
GOOD = LAB_VARS["model_sync_models"][0]
INBOX = str(Path(GOOD["source"]).parent.parent)
ROOT_DIR = "/models"


def env() -> dict[str, str]:
    return {
        **os.environ,
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / "tests/lab/containers.conf")),
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.json",
        "ANSIBLE_NOCOLOR": "1",
    }


def on_node(node: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "exec", node, "sh", "-c", command], capture_output=True, text=True, env=env(), timeout=120
    )


def models_playbook(extra: dict[str, Any] | None = None, background: bool = False) -> Any:
    """Run playbooks/models.yml with the JSON callback; extra vars go through a file (typed)."""
    args = [
        str(ROOT / ".venv/bin/ansible-playbook"),
        "-i",
        "inventories/lab/hosts.yml",
        "playbooks/models.yml",
    ]
    if extra:
        handle = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)  # noqa: SIM115
        json.dump(extra, handle)
        handle.close()
        args += ["-e", f"@{handle.name}"]
    if background:
        return subprocess.Popen(
            args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env()
        )
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env(), timeout=900)
    return proc.returncode, parse(proc.stdout), proc.stdout + proc.stderr


def parse(stdout: str) -> dict[str, Any]:
    start = stdout.find("{\n")
    assert start >= 0, stdout[-3000:]
    result, _ = json.JSONDecoder().raw_decode(stdout[start:])
    return result


def task_results(run: dict[str, Any], name_start: str) -> list[tuple[str, dict[str, Any]]]:
    """(host, result) of each task whose name starts with name_start; loop items flattened, skips left out."""
    found = []
    for play in run["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].split(" : ", 1)[-1].startswith(name_start):  # "role : name"
                for host, result in task["hosts"].items():
                    items = result.get("results", [result])
                    found += [(host, item) for item in items if not item.get("skipped")]
    return found


def changed(run: dict[str, Any]) -> dict[str, int]:
    return {host: stats["changed"] for host, stats in run["stats"].items()}


def current(node: str, name: str = GOOD["name"]) -> str:
    return on_node(node, f"readlink {ROOT_DIR}/{name}/current").stdout.strip()


def carry_in(directory: Path, name: str, version: str, listing: str) -> dict[str, Any]:
    """Copy a model and its publisher listing into the source node's inbox, as an operator does."""
    target = f"{INBOX}/{name}/{version}"
    assert on_node(SOURCE, f"rm -rf {target} && mkdir -p {INBOX}/{name}").returncode == 0
    publisher = Path(str(directory) + ".publisher.json")
    publisher.write_text(listing)
    for local, remote in ((publisher, target + ".publisher.json"), (directory, target)):
        copy = subprocess.run(
            ["podman", "cp", str(local), f"{SOURCE}:{remote}"], env=env(), capture_output=True
        )
        assert copy.returncode == 0, copy.stderr
    return {
        "name": name,
        "version": version,
        "source": target,
        "publisher_manifest": target + ".publisher.json",
    }


@pytest.fixture(scope="module")
def converged() -> dict[str, Any]:
    """The lab inventory's models synced (make lab did it already when site.yml ran)."""
    rc, run, output = models_playbook()
    assert rc == 0, output[-6000:]
    return run


def test_current_points_at_the_verified_version_on_every_node(converged):
    manifest = on_node(SOURCE, f"cat {ROOT_DIR}/{GOOD['name']}/{GOOD['version']}.manifest.json")
    files = json.loads(manifest.stdout)["files"]
    for node in NODES:
        assert current(node) == GOOD["version"], node
        sums = on_node(
            node, f"cd {ROOT_DIR}/{GOOD['name']}/current && sha256sum {' '.join(f['path'] for f in files)}"
        )
        assert sums.returncode == 0, (node, sums.stderr)
        assert {line.split()[1]: line.split()[0] for line in sums.stdout.splitlines()} == {
            f["path"]: f["sha256"] for f in files
        }, node
        # served by uid 1001: published versions are root's, readable by all, out of the sync key's reach
        owner = on_node(
            node, f"stat -c '%U %a' {ROOT_DIR}/{GOOD['name']}/{GOOD['version']}/{files[0]['path']}"
        )
        assert owner.stdout.split() == ["root", "644"], (node, owner.stdout)


def test_second_run_changes_nothing_and_verifies_from_the_cache(converged):
    rc, run, output = models_playbook()
    assert rc == 0, output[-6000:]
    assert changed(run) == dict.fromkeys(NODES, 0), output[-6000:]
    verified = task_results(run, "Verify against its manifest")
    assert {host for host, _ in verified} == set(NODES)
    for host, result in verified:
        assert result["matches"], (host, result)
        assert (
            result["stats"]["hashed_files"] == 0 and result["stats"]["cache_hits"] == result["file_count"]
        ), (
            host,
            result["stats"],
        )


def test_the_sync_key_runs_only_rrsync_into_the_staging_area(converged):
    keys = on_node(RECEIVERS[0], "cat /var/lib/modelsync/.ssh/authorized_keys")
    assert keys.stdout.count("ssh-ed25519") == 1
    assert keys.stdout.startswith(
        'restrict,from="10.89.42.11",command="/usr/bin/rrsync -wo /models/.incoming"'
    )
    # from the source node, with the key: no shell, whatever the command asked for
    shell = on_node(
        SOURCE,
        "su -s /bin/sh modelsync -c 'ssh -i /var/lib/modelsync/.ssh/id_model_sync -o BatchMode=yes "
        "-o UserKnownHostsFile=/var/lib/modelsync/.ssh/known_hosts modelsync@10.89.42.12 id'",
    )
    assert shell.returncode != 0 and "uid=" not in shell.stdout, shell.stdout + shell.stderr
    assert on_node(SOURCE, "test -e /var/lib/modelsync/.ssh/id_model_sync").returncode == 0
    for node in RECEIVERS:
        assert on_node(node, "test -e /var/lib/modelsync/.ssh/id_model_sync").returncode != 0, node


def test_each_bad_variant_is_refused_naming_gate_and_file(converged, tmp_path):
    models = [GOOD]
    for variant in modelgen.VARIANTS:
        directory = modelgen.write_variant(tmp_path / variant / "v1", variant, GOOD["version"])
        listing = modelgen.publisher_listing(
            modelgen.write_good_model(tmp_path / "good" / variant, GOOD["version"])
        )
        models.append(carry_in(directory, f"bad-{variant.replace('_', '-')}", "v1", listing))

    rc, run, _output = models_playbook({"model_sync_models": models})

    assert rc != 0
    refusal = next(result for _, result in task_results(run, "Fail when the admission refused a model"))
    lines = refusal["msg"]
    for variant, (gate, filename) in modelgen.EXPECTED_REFUSAL.items():
        line = next(line for line in lines if f"model bad-{variant.replace('_', '-')} version v1" in line)
        assert gate in line and filename in line, (variant, line)
    assert not any(f"model {GOOD['name']} " in line for line in lines), lines
    for node in NODES:
        assert current(node) == GOOD["version"], node
        assert on_node(node, f"ls -d {ROOT_DIR}/bad-* 2>/dev/null").stdout == "", node


def test_a_push_killed_half_way_leaves_current_and_the_next_run_completes_it(converged, tmp_path):
    directory = modelgen.write_good_model(tmp_path / "v2", "v2")
    (directory / "notes").mkdir()
    # big enough that the throttled push is still running when it is killed
    (directory / "notes" / "padding.txt").write_text("padding line of the interrupted-sync test\n" * 600_000)
    second = carry_in(directory, GOOD["name"], "v2", modelgen.publisher_listing(directory, "sha256sum"))

    started = time.monotonic()
    playbook = models_playbook({"model_sync_models": [second], "model_sync_rsync_bwlimit_kbps": 2000}, True)
    try:
        pids: list[str] = []
        # one push per receiving node, in parallel: kill them once both run
        while time.monotonic() - started < 240 and len(pids) < len(RECEIVERS):
            pids = on_node(SOURCE, "pgrep -u modelsync -x rsync || true").stdout.split()
            time.sleep(0.5)
        assert len(pids) >= len(RECEIVERS), f"rsync pushes on the source node: {pids}"
        time.sleep(3)
        on_node(SOURCE, "kill -9 " + " ".join(pids))
        output, _ = playbook.communicate(timeout=300)
    finally:
        playbook.kill()
    assert playbook.returncode != 0
    stopped = [
        result["msg"] for _, result in task_results(parse(output), "Fail when the push stopped half-way")
    ]
    assert stopped and all("stopped" in msg and "qwen2-tiny version v2" in msg for msg in stopped), output[
        -3000:
    ]
    assert current(SOURCE) == "v2"  # the source node's own copy verified: it serves v2 already
    for node in RECEIVERS:
        assert current(node) == GOOD["version"], node
        assert on_node(node, f"test -e {ROOT_DIR}/{GOOD['name']}/v2").returncode != 0, node

    rc, run, output = models_playbook({"model_sync_models": [second]})
    assert rc == 0, output[-6000:]
    for node in NODES:
        assert current(node) == "v2", node
    # the second run pushed what was missing and moved the verified copy into place on both receivers
    assert {host for host, _ in task_results(run, "Move the copy into place")} == set(RECEIVERS)

    # back to what the lab inventory lists: v1 is kept (model_sync_keep_versions 2), so it is a switch back
    rc, _run, output = models_playbook()
    assert rc == 0, output[-6000:]
    for node in NODES:
        assert current(node) == GOOD["version"], node
