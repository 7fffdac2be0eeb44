"""The model stage on the lab, with real rsync and SSH between the nodes (docs/models.md):

- the lab's model is admitted on gpu-node-1 and `current` points at its verified version on all three
  nodes; a second run changes nothing and verifies from the hash cache;
- every bad variant of tests/modelgen is refused, naming the gate and the file, and nothing moves;
- a push killed half-way leaves the receiving nodes' `current` alone, and the next run completes it;
- the sync key runs only rrsync, write-only, into the staging area: on the lab's jammy-like rsync 3.2.3
  layout, the Perl script from the package's documentation copy, installed as /usr/local/bin/rrsync.

    make lab-up && .venv/bin/pytest -m lab tests/lab/test_models_on_lab.py -v
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from labrun import NODES, ROOT, Run, background_playbook, env, extra_vars, on_node, parse_json, playbook

pytestmark = pytest.mark.lab

sys.path.insert(0, str(ROOT / "tests"))
import modelgen  # noqa: E402

LAB_VARS = yaml.safe_load((ROOT / "inventories/lab/group_vars/all.yml").read_text())
SOURCE = LAB_VARS["model_sync_source_node"]
RECEIVERS = tuple(node for node in NODES if node != SOURCE)
GOOD = LAB_VARS["model_sync_models"][0]
INBOX = str(Path(GOOD["source"]).parent.parent)
ROOT_DIR = "/models"
MODELS = "playbooks/models.yml"


def models_playbook(extra: dict[str, Any] | None = None) -> Run:
    """Run playbooks/models.yml with the JSON callback; extra vars go through a file (typed)."""
    return playbook(MODELS, *(extra_vars(extra) if extra else ()), timeout=900, json_callback=True)


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
            ["podman", "cp", str(local), f"{SOURCE}:{remote}"], env=env(), capture_output=True, text=True
        )
        assert copy.returncode == 0, copy.stderr
    return {
        "name": name,
        "version": version,
        "source": target,
        "publisher_manifest": target + ".publisher.json",
    }


@pytest.fixture(scope="module")
def converged() -> Run:
    """The lab inventory's models synced (make lab did it already when site.yml ran)."""
    run = models_playbook()
    assert run.rc == 0, run.tail()
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
    run = models_playbook()
    assert run.rc == 0, run.tail()
    assert run.changed() == dict.fromkeys(NODES, 0), run.tail()
    verified = run.task_results("Verify against its manifest")
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
    # the lab's rsync is laid out as Ubuntu 22.04's release 3.2.3: no /usr/bin/rrsync, only the Perl script
    # as a documentation example, which the role installs as /usr/local/bin/rrsync (the pushes ran through it)
    for node in RECEIVERS:
        assert on_node(node, "test -e /usr/bin/rrsync").returncode != 0, f"{node}: has /usr/bin/rrsync"
        same = on_node(node, "zcat /usr/share/doc/rsync/scripts/rrsync.gz | cmp - /usr/local/bin/rrsync")
        assert same.returncode == 0, (node, same.stdout + same.stderr)
        assert on_node(node, "test -x /usr/local/bin/rrsync").returncode == 0, node
    keys = on_node(RECEIVERS[0], "cat /var/lib/modelsync/.ssh/authorized_keys")
    assert keys.stdout.count("ssh-ed25519") == 1
    assert keys.stdout.startswith(
        'restrict,from="10.89.42.11",command="/usr/local/bin/rrsync -wo /models/.incoming"'
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

    run = models_playbook({"model_sync_models": models})

    assert run.rc != 0
    refusal = next(result for _, result in run.task_results("Fail when the admission refused a model"))
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
    throttled = extra_vars({"model_sync_models": [second], "model_sync_rsync_bwlimit_kbps": 2000})
    push = background_playbook(MODELS, *throttled)
    try:
        pids: list[str] = []
        # one push per receiving node, in parallel: kill them once both run
        while time.monotonic() - started < 240 and len(pids) < len(RECEIVERS) and push.poll() is None:
            pids = on_node(SOURCE, "pgrep -u modelsync -x rsync || true").stdout.split()
            time.sleep(0.5)
        if len(pids) < len(RECEIVERS):
            push.kill()
            early, _ = push.communicate(timeout=60)
            pytest.fail(
                f"rsync pushes on the source node: {pids}; playbook rc {push.returncode}:\n{early[-4000:]}"
            )
        time.sleep(3)
        on_node(SOURCE, "kill -9 " + " ".join(pids))
        output, _ = push.communicate(timeout=300)
    finally:
        push.kill()
    assert push.returncode != 0
    interrupted = Run(push.returncode, output, result=parse_json(output))
    stopped = [result["msg"] for _, result in interrupted.task_results("Fail when the push stopped half-way")]
    assert stopped and all("stopped" in msg and "qwen2-tiny version v2" in msg for msg in stopped), output[
        -3000:
    ]
    assert current(SOURCE) == "v2"  # the source node's own copy verified: it serves v2 already
    for node in RECEIVERS:
        assert current(node) == GOOD["version"], node
        assert on_node(node, f"test -e {ROOT_DIR}/{GOOD['name']}/v2").returncode != 0, node

    run = models_playbook({"model_sync_models": [second]})
    assert run.rc == 0, run.tail()
    for node in NODES:
        assert current(node) == "v2", node
    # the second run pushed what was missing and moved the verified copy into place on both receivers
    assert {host for host, _ in run.task_results("Move the copy into place")} == set(RECEIVERS)

    # back to what the lab inventory lists: v1 is kept (model_sync_keep_versions 2), so it is a switch back
    run = models_playbook()
    assert run.rc == 0, run.tail()
    for node in NODES:
        assert current(node) == GOOD["version"], node
