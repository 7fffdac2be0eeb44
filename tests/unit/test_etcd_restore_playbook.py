"""playbooks/remediate/etcd-restore.yml run by ansible-playbook on this machine (a one-host inventory, the
control plane local): what it refuses, naming `snapshot`, before any change, and what --check says and leaves
alone, over a real snapshot of the real etcd of the pin (real_kube.py) and the etcd manifest kubeadm wrote for
it. The real run (static Pods stopped, restored, started) is the lab's: tests/lab/test_day2_on_lab.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import real_kube
from playbook_text import flat

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "roles" / "etcd_backup" / "files" / "etcd_backup.py"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A control plane with one good snapshot in its backup directory, and the inventory and extra vars that
    point the playbook at them (the role's program, the real etcdutl, kubeadm's etcd manifest)."""
    tmp = tmp_path_factory.mktemp("etcd-restore")
    with real_kube.control_plane(tmp / "plane") as plane:
        backups = tmp / "backups"
        config = {
            "etcdctl": str(real_kube.binary("etcdctl")),
            "etcdutl": str(real_kube.binary("etcdutl")),
            "endpoint": f"https://127.0.0.1:{plane.etcd_ports['client']}",
            "cacert": str(plane.pki / "etcd" / "ca.crt"),
            "cert": str(plane.pki / "etcd" / "healthcheck-client.crt"),
            "key": str(plane.pki / "etcd" / "healthcheck-client.key"),
            "dir": str(backups),
            "keep": 3,
            "max_age_s": 10800,
        }
        (tmp / "config.json").write_text(json.dumps(config))
        saved = subprocess.run(
            [sys.executable, str(PROGRAM), "save", "--config", str(tmp / "config.json")],
            capture_output=True,
            text=True,
        )
        assert saved.returncode == 0, saved.stderr
        inventory = tmp / "hosts.json"
        host = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "node_ip": "127.0.0.1",
        }
        inventory.write_text(
            json.dumps(
                {
                    "all": {
                        "children": {
                            "k8s_cluster": {"children": {"control_plane": {"hosts": {"local-cp": host}}}},
                        }
                    }
                }
            )
        )
        extra = {
            "etcd_backup_dir": str(backups),
            "etcd_backup_copy_to_path": str(tmp / "site-copies"),  # no worker here to copy to
            "__etcd_backup_python": sys.executable,
            "__etcd_backup_program": str(PROGRAM),
            "__etcd_backup_etcdutl": config["etcdutl"],
            "__etcd_backup_manifest": str(plane.dir / "manifests" / "etcd.yaml"),
        }
        yield {"tmp": tmp, "plane": plane, "inventory": inventory, "extra": extra, "backups": backups}


def play(site: dict[str, Any], *args: str, **values: Any) -> subprocess.CompletedProcess[str]:
    extra = site["tmp"] / "extra.json"
    extra.write_text(json.dumps({**site["extra"], **values}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [
            str(
                ROOT / ".venv" / "bin" / "ansible-playbook"
            ),  # the controller's; the modules run on sys.executable
            "-i",
            str(site["inventory"]),
            str(ROOT / "playbooks" / "remediate" / "etcd-restore.yml"),
            "-e",
            f"@{extra}",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def manifests(site: dict[str, Any]) -> list[str]:
    return sorted(p.name for p in (site["plane"].dir / "manifests").iterdir())


@pytest.mark.parametrize("snapshot", [None, "", "etcd-snapshot.db"], ids=["none", "empty", "relative"])
def test_no_snapshot_named_is_refused(site: dict[str, Any], snapshot: str | None) -> None:
    done = play(site, **({} if snapshot is None else {"snapshot": snapshot}))
    assert done.returncode != 0
    assert "Pass -e snapshot=<an absolute path of a snapshot file on local-cp> or -e snapshot=latest" in flat(
        done.stdout
    )


def test_a_damaged_snapshot_is_refused_before_any_change(site: dict[str, Any]) -> None:
    (good,) = site["backups"].glob("*.db")
    damaged = site["tmp"] / "damaged.db"
    damaged.write_bytes(good.read_bytes()[:4096])
    before = manifests(site)
    done = play(site, snapshot=str(damaged))
    assert done.returncode != 0
    assert f"snapshot={damaged} refused, nothing was changed: etcdutl exited 1" in flat(done.stdout), (
        done.stdout
    )
    assert manifests(site) == before and "changed=0" in done.stdout
    missing = play(site, snapshot=str(site["tmp"] / "gone.db"))
    assert missing.returncode != 0 and "gone.db: no such file" in flat(missing.stdout)


def test_latest_without_a_good_snapshot_is_refused(site: dict[str, Any]) -> None:
    empty = site["tmp"] / "empty"
    empty.mkdir(exist_ok=True)
    done = play(site, snapshot="latest", etcd_backup_dir=str(empty))
    assert done.returncode != 0
    assert f"snapshot=latest refused, nothing was changed: no good snapshot in {empty}" in flat(done.stdout)


def test_check_mode_says_the_plan_and_changes_nothing(site: dict[str, Any]) -> None:
    (good,) = site["backups"].glob("*.db")
    record = json.loads(good.with_suffix(".json").read_text())
    data_dir = site["plane"].dir / "etcd"
    before = (manifests(site), sorted(p.name for p in data_dir.parent.iterdir()))
    done = play(site, "--check", snapshot="latest")
    assert done.returncode == 0, done.stdout[-4000:]
    out = flat(done.stdout)
    assert f"Check mode: would restore {good} (revision {record['status']['revision']}," in out
    assert f"into {data_dir} as member {real_kube.NODE_NAME}" in out
    assert f"the old data kept as {data_dir}.before-restore-" in out
    assert "Check mode: nothing changed; would restore" in out
    assert (manifests(site), sorted(p.name for p in data_dir.parent.iterdir())) == before
    assert site["plane"].admin.raw("GET", "/readyz")[0] == 200  # etcd and the API server never stopped
