"""roles/etcd_backup/files/etcd_backup.py against the real etcd, etcdctl and etcdutl of the production pin
(real_kube.py: kubeadm's PKI, etcd with kubeadm's flags, the real kube-apiserver in front of it).

- save: a snapshot taken with kubeadm's etcd-healthcheck-client certificate, checked by `etcdutl snapshot
  status`, recorded (sha256), kept to N, copied to a site path (kept to N there too), the metrics written;
  with etcd down the run fails, says why, and the metrics still name the newest good snapshot;
- status: a truncated or altered snapshot is refused, naming why;
- restore, as playbooks/remediate/etcd-restore.yml drives it: refused while etcd runs; with etcd and the API
  server stopped, the objects deleted and changed after the snapshot are back as they were, one made after it
  is gone, the old data directory is kept, and revisions continue past a billion (watches list again).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import real_kube
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "roles" / "etcd_backup" / "files" / "etcd_backup.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("etcd_backup", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


etcd_backup = load()


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[real_kube.ControlPlane]:
    """A control plane of this module's own: the restore test stops and replaces its etcd."""
    with real_kube.control_plane(tmp_path_factory.mktemp("etcd-backup-plane")) as made:
        yield made


def config(plane: real_kube.ControlPlane, tmp: Path, **more: Any) -> dict[str, Any]:
    etcd = plane.pki / "etcd"
    return {
        "etcdctl": str(real_kube.binary("etcdctl")),
        "etcdutl": str(real_kube.binary("etcdutl")),
        "endpoint": f"https://127.0.0.1:{plane.etcd_ports['client']}",
        "cacert": str(etcd / "ca.crt"),
        "cert": str(etcd / "healthcheck-client.crt"),
        "key": str(etcd / "healthcheck-client.key"),
        "dir": str(tmp / "backups"),
        "keep": 2,
        "copies": [],
        "metrics_file": str(tmp / "etcd_backup.prom"),
        "max_age_s": 10800,
        "timeout_s": 60,
        **more,
    }


def save_at(conf: dict[str, Any], moment: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """One run of `save` at a given time (the snapshot's name is its second)."""
    when = etcd_backup.dt.datetime.fromisoformat(moment)
    monkeypatch.setattr(etcd_backup, "utc_now", lambda: when)
    return int(etcd_backup.save(conf))


def metrics(path: str) -> dict[str, float]:
    values = {}
    for line in Path(path).read_text().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def names(directory: str | Path) -> list[str]:
    return sorted(p.name for p in Path(directory).iterdir() if not p.name.startswith("."))


def test_save_checks_keeps_copies_and_reports(
    plane: real_kube.ControlPlane,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    site = tmp_path / "site"
    conf = config(plane, tmp_path, copies=[{"kind": "path", "name": str(site), "path": str(site)}])
    for moment in ("2026-12-01T10:00:00+00:00", "2026-12-01T11:00:00+00:00", "2026-12-01T12:00:00+00:00"):
        assert save_at(conf, moment, monkeypatch) == 0, capsys.readouterr().err
    kept = ["etcd-snapshot-20261201T110000Z.db", "etcd-snapshot-20261201T110000Z.json"]
    kept += ["etcd-snapshot-20261201T120000Z.db", "etcd-snapshot-20261201T120000Z.json"]
    assert names(conf["dir"]) == kept  # keep 2: the oldest went, with its record
    assert names(site) == kept  # the site path holds the same, kept to the same number
    out = capsys.readouterr().out
    assert "removed " in out and "etcd-snapshot-20261201T100000Z.db (keeping the 2 newest)" in out
    assert f"copied the good snapshots to {site}" in out

    newest = Path(conf["dir"]) / kept[2]
    record = json.loads((Path(conf["dir"]) / kept[3]).read_text())
    assert record["sha256"] == etcd_backup.sha256(str(newest)) and record["size"] == newest.stat().st_size
    assert record["status"]["totalKey"] > 0 and record["status"]["revision"] > 0
    assert oct(newest.stat().st_mode & 0o777) == "0o600"

    got = metrics(conf["metrics_file"])
    created = etcd_backup.dt.datetime.fromisoformat("2026-12-01T12:00:00+00:00").timestamp()
    assert got["etcd_backup_last_success_timestamp_seconds"] == created
    assert got["etcd_backup_last_run_success"] == 1 and got["etcd_backup_snapshots"] == 2
    assert got["etcd_backup_max_age_seconds"] == 10800
    assert got[f'etcd_backup_copy_success{{destination="{site}"}}'] == 1
    assert got["etcd_backup_last_snapshot_size_bytes"] == newest.stat().st_size


def test_a_failed_run_says_why_and_keeps_the_last_good_time(
    plane: real_kube.ControlPlane,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conf = config(plane, tmp_path)
    assert save_at(conf, "2026-12-01T10:00:00+00:00", monkeypatch) == 0
    # a wrong endpoint stands for etcd down; a copy to a node that cannot be reached fails too
    conf["endpoint"] = f"https://127.0.0.1:{real_kube.free_port()}"
    conf["timeout_s"] = 3
    conf["copies"] = [
        {
            "kind": "node",
            "name": "gpu-node-2",
            "user": "etcdbackup",
            "address": "127.0.0.1",
            "ssh_key": str(tmp_path / "no-key"),
            "known_hosts": str(tmp_path / "known_hosts"),
        }
    ]
    monkeypatch.setattr(etcd_backup, "copy_off", _unreachable)
    assert save_at(conf, "2026-12-01T11:00:00+00:00", monkeypatch) == 1
    err = capsys.readouterr().err
    assert "snapshot failed: etcdctl exited" in err and "copy to gpu-node-2 failed: ssh: connect" in err
    assert names(conf["dir"]) == ["etcd-snapshot-20261201T100000Z.db", "etcd-snapshot-20261201T100000Z.json"]
    got = metrics(conf["metrics_file"])
    assert got["etcd_backup_last_run_success"] == 0
    assert got["etcd_backup_last_success_timestamp_seconds"] == (
        etcd_backup.dt.datetime.fromisoformat("2026-12-01T10:00:00+00:00").timestamp()
    )
    assert got['etcd_backup_copy_success{destination="gpu-node-2"}'] == 0


def _unreachable(config: dict[str, Any], copy: dict[str, Any]) -> None:
    raise etcd_backup.BackupError("ssh: connect to host 127.0.0.1 port 22: Connection refused")


def test_no_snapshot_yet_reads_as_never(plane: real_kube.ControlPlane, tmp_path: Path) -> None:
    conf = config(plane, tmp_path)
    text = etcd_backup.metrics_text(conf, {"ran": 5.0, "saved": False, "copies": {}})
    assert "etcd_backup_last_success_timestamp_seconds 0.000" in text and "etcd_backup_snapshots 0" in text


def test_status_refuses_a_damaged_snapshot(
    plane: real_kube.ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = config(plane, tmp_path)
    assert save_at(conf, "2026-12-01T10:00:00+00:00", monkeypatch) == 0
    good = Path(conf["dir"]) / "etcd-snapshot-20261201T100000Z.db"
    etcdutl = conf["etcdutl"]
    assert etcd_backup.check(etcdutl, str(good))["ok"]

    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(good.read_bytes()[:4096])
    refused = etcd_backup.check(etcdutl, str(truncated))
    assert not refused["ok"] and "etcdutl exited" in refused["error"], refused

    altered = tmp_path / "altered" / good.name
    altered.parent.mkdir()
    data = bytearray(good.read_bytes())
    data[-100] ^= 0xFF  # inside the hash etcdctl appends: bbolt still opens it
    altered.write_bytes(bytes(data))
    (altered.parent / good.with_suffix(".json").name).write_text(good.with_suffix(".json").read_text())
    refused = etcd_backup.check(etcdutl, str(altered))
    assert not refused["ok"] and "the file changed since" in refused["error"], refused

    missing = etcd_backup.check(etcdutl, str(tmp_path / "nothing.db"))
    assert not missing["ok"] and "no such file" in missing["error"]

    # the command line the restore playbook runs: JSON on stdout, exit 1
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "status", str(truncated), "--etcdutl", etcdutl],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and json.loads(done.stdout)["ok"] is False


def test_prune_keeps_the_newest_good_ones_only(tmp_path: Path) -> None:
    for stamp in ("20261201T100000Z", "20261201T110000Z", "20261201T120000Z"):
        (tmp_path / f"etcd-snapshot-{stamp}.db").write_text("x")
        (tmp_path / f"etcd-snapshot-{stamp}.json").write_text("{}")
    (tmp_path / "etcd-snapshot-20261201T130000Z.db").write_text("no record: not good, not counted")
    (tmp_path / ".etcd-snapshot-20261201T140000Z.db.partial").write_text("being written")
    (tmp_path / "notes.txt").write_text("not ours")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "prune", "--dir", str(tmp_path), "--keep", "2"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert names(tmp_path) == [
        "etcd-snapshot-20261201T110000Z.db",
        "etcd-snapshot-20261201T110000Z.json",
        "etcd-snapshot-20261201T120000Z.db",
        "etcd-snapshot-20261201T120000Z.json",
        "etcd-snapshot-20261201T130000Z.db",
        "notes.txt",
    ]


def etcd_flags(plane: real_kube.ControlPlane) -> dict[str, str]:
    """The flags of kubeadm's etcd static Pod, as etcd-restore.yml reads them from its manifest."""
    pod = yaml.safe_load((plane.dir / "manifests" / "etcd.yaml").read_text())
    command = pod["spec"]["containers"][0]["command"]
    return dict(re.match(r"^--([^=]+)=(.*)$", flag).groups() for flag in command[1:])  # type: ignore[union-attr]


def config_map(plane: real_kube.ControlPlane, name: str) -> dict[str, Any] | None:
    code, body = plane.admin.request("GET", f"/api/v1/namespaces/default/configmaps/{name}")
    return body if code == 200 else None


def test_restore_brings_back_the_snapshot(
    plane: real_kube.ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def make(name: str, value: str) -> None:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}}
        plane.admin.ok("POST", "/api/v1/namespaces/default/configmaps", body)

    make("kept", "1")
    make("changed", "original")
    conf = config(plane, tmp_path)
    assert save_at(conf, "2026-12-01T10:00:00+00:00", monkeypatch) == 0
    snapshot = str(Path(conf["dir"]) / "etcd-snapshot-20261201T100000Z.db")
    plane.admin.ok("DELETE", "/api/v1/namespaces/default/configmaps/kept")
    patch = {"data": {"v": "corrupted"}}
    plane.admin.ok(
        "PATCH", "/api/v1/namespaces/default/configmaps/changed", patch, "application/merge-patch+json"
    )
    make("after", "made after the snapshot")

    flags = etcd_flags(plane)
    restore = [
        sys.executable, str(SCRIPT), "restore", snapshot, "--etcdutl", conf["etcdutl"],
        "--data-dir", flags["data-dir"], "--name", flags["name"],
        "--initial-cluster", flags["initial-cluster"],
        "--initial-advertise-peer-urls", flags["initial-advertise-peer-urls"], "--suffix", "test",
    ]  # fmt: skip
    running = subprocess.run(restore, capture_output=True, text=True)
    assert running.returncode == 1 and "etcd still runs on" in json.loads(running.stdout)["error"]
    assert not Path(flags["data-dir"] + ".before-restore-test").exists()

    plane.stop_component("kube-apiserver")  # as etcd-restore.yml moves the static Pod manifests away
    plane.stop_component("etcd")
    done = subprocess.run(restore, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["restored"] and result["old_data_dir"] == flags["data-dir"] + ".before-restore-test"
    assert (Path(result["old_data_dir"]) / "member" / "snap" / "db").is_file()  # the way back is kept
    plane.start_component("etcd")
    plane.start_component("kube-apiserver")

    assert (config_map(plane, "kept") or {}).get("data") == {"v": "1"}
    assert (config_map(plane, "changed") or {}).get("data") == {"v": "original"}
    assert config_map(plane, "after") is None
    make("new", "after the restore")
    assert int((config_map(plane, "new") or {})["metadata"]["resourceVersion"]) > etcd_backup.BUMP_REVISION
