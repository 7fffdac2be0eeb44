#!/usr/bin/python3
"""etcd snapshots of the control plane (role etcd_backup): take, check, keep, copy off the node, restore.

    etcd_backup.py save --config CONFIG_JSON      the timer's run (etcd-backup.service)
    etcd_backup.py status SNAPSHOT                 is SNAPSHOT good? JSON on stdout, exit 1 when not
    etcd_backup.py prune --dir DIR --keep N        keep the N newest good snapshots of DIR (a copy's receiver)
    etcd_backup.py restore SNAPSHOT --data-dir DIR --name NAME --initial-cluster URLS
                           --initial-advertise-peer-urls URLS [--suffix SUFFIX]
                            a new data directory from SNAPSHOT swapped in for DIR (etcd stopped);
                            the old one kept as DIR.before-restore-SUFFIX

A good snapshot is `etcd-snapshot-<UTC time>.db` with its record `etcd-snapshot-<UTC time>.json` beside
it (sha256, size, `etcdutl snapshot status`); a snapshot is written under a hidden name and renamed only
once `etcdutl snapshot status` read it and its record is written, so a cut-short run leaves no file that
looks good. `save` copies the good snapshots off the node (rsync over SSH to a node of the cluster whose
key may only run rrsync into one directory, or to a mounted site path) and writes Prometheus metrics in
the text format to the file the control-plane metrics exporter serves, whatever happened: the newest good
snapshot's time, the run's outcome, each copy's. Python 3.10 standard library only (the node's python3);
etcdctl and etcdutl are those of the etcd image the cluster runs (the role copies them out of it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

SNAPSHOT = re.compile(r"^etcd-snapshot-(\d{8}T\d{6}Z)\.db$")
TIME_FORMAT = "%Y%m%dT%H%M%SZ"
# The restore's revision jump (etcd-io/etcd#16028: `etcdutl snapshot restore --bump-revision
# --mark-compacted`): the restored keyspace's revisions jump past any a client saw before, and older ones
# read as compacted, so the API server's and the kubelets' watches fail and list again instead of going on
# from a revision that now names other data. A billion is far beyond the writes a cluster like this makes
# between a snapshot and its restore.
BUMP_REVISION = 1_000_000_000


class BackupError(RuntimeError):
    pass


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def run(argv: list[str], timeout: float) -> str:
    """A command's stdout; BackupError with its stderr when it fails (never its stdout: no secret is printed
    by etcdctl or etcdutl, but rsync's and ssh's errors are on stderr anyway)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackupError(f"{os.path.basename(argv[0])}: {exc}") from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise BackupError(f"{os.path.basename(argv[0])} exited {done.returncode}: {' '.join(detail[-3:])}")
    return done.stdout


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_path(snapshot: str) -> str:
    return snapshot[: -len(".db")] + ".json"


def write_atomically(path: str, text: str, mode: int = 0o600) -> None:
    directory = os.path.dirname(path) or "."
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def snapshot_status(etcdutl: str, path: str, timeout: float = 120) -> dict[str, Any]:
    """`etcdutl snapshot status -w json`: hash, revision, totalKey, totalSize, version."""
    status = json.loads(run([etcdutl, "snapshot", "status", path, "-w", "json"], timeout))
    if (
        not isinstance(status, dict)
        or min(int(status.get("revision", 0)), int(status.get("totalKey", 0))) <= 0
    ):
        raise BackupError(f"etcdutl snapshot status of {path}: no revision or no keys: {status}")
    return status


def check(etcdutl: str, path: str) -> dict[str, Any]:
    """Whether PATH is a snapshot to trust: `etcdutl snapshot status` reads it, and when its record is beside
    it, the file's sha256 is the one recorded when it was taken."""
    result: dict[str, Any] = {"snapshot": path, "ok": False, "error": "", "status": {}, "record": None}
    try:
        if not os.path.isfile(path):
            raise BackupError(f"{path}: no such file")
        result["status"] = snapshot_status(etcdutl, path)
        record = record_path(path)
        if os.path.isfile(record):
            with open(record, encoding="utf-8") as handle:
                result["record"] = json.load(handle)
            digest = sha256(path)
            if digest != result["record"].get("sha256"):
                raise BackupError(
                    f"{path}: sha256 {digest} is not the {result['record'].get('sha256')} recorded when it "
                    f"was taken ({record}): the file changed since"
                )
        result["ok"] = True
    except (BackupError, OSError, ValueError) as exc:
        result["error"] = str(exc)
    return result


def good_snapshots(directory: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, record) of the good snapshots of DIRECTORY, oldest first: a snapshot name with its record."""
    found = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    for name in names:
        if not SNAPSHOT.match(name):
            continue
        path = os.path.join(directory, name)
        try:
            with open(record_path(path), encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue  # no record: never finished, or not ours
        found.append((path, record))
    return found


def prune(directory: str, keep: int) -> list[str]:
    """Remove all but the KEEP newest good snapshots (and their records); returns what was removed."""
    removed = []
    snapshots = good_snapshots(directory)
    for path, _ in snapshots[: max(0, len(snapshots) - keep)]:
        for doomed in (path, record_path(path)):
            try:
                os.unlink(doomed)
                removed.append(doomed)
            except FileNotFoundError:
                pass
    return removed


def take(config: dict[str, Any], now: dt.datetime) -> tuple[str, dict[str, Any]]:
    """One snapshot: saved under a hidden name, checked, recorded, then given its good name."""
    directory = config["dir"]
    name = f"etcd-snapshot-{now.strftime(TIME_FORMAT)}.db"
    final = os.path.join(directory, name)
    partial = os.path.join(directory, f".{name}.partial")
    timeout = float(config.get("timeout_s", 300))
    try:
        run(
            [
                config["etcdctl"],
                f"--endpoints={config['endpoint']}",
                f"--cacert={config['cacert']}",
                f"--cert={config['cert']}",
                f"--key={config['key']}",
                f"--command-timeout={int(timeout)}s",
                "snapshot",
                "save",
                partial,
            ],
            timeout + 30,
        )
        status = snapshot_status(config["etcdutl"], partial)
        record = {
            "snapshot": name,
            "created": now.isoformat(),
            "created_unix": now.timestamp(),
            "sha256": sha256(partial),
            "size": os.path.getsize(partial),
            "status": status,
            "endpoint": config["endpoint"],
        }
        os.chmod(partial, 0o600)
        write_atomically(record_path(final), json.dumps(record, indent=2) + "\n")
        os.replace(partial, final)
        return final, record
    finally:
        for leftover in (partial, partial + ".part"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def copy_to_path(source: str, destination: str) -> None:
    """The good snapshots of SOURCE missing in DESTINATION, each written under a hidden name and renamed, the
    snapshot before its record: a copy cut short is never a good snapshot there either."""
    os.makedirs(destination, mode=0o700, exist_ok=True)
    for path, _ in good_snapshots(source):
        for part in (path, record_path(path)):
            target = os.path.join(destination, os.path.basename(part))
            if os.path.isfile(target) and os.path.getsize(target) == os.path.getsize(part):
                continue
            temporary = os.path.join(destination, f".{os.path.basename(part)}.partial")
            shutil.copyfile(part, temporary)
            with open(temporary, "rb") as handle:
                os.fsync(handle.fileno())
            os.chmod(temporary, 0o600)
            os.replace(temporary, target)


def copy_off(config: dict[str, Any], copy: dict[str, Any]) -> None:
    """Every good snapshot of the directory (with its record) to one destination, the missing ones.

    A node: rsync over SSH with this node's key, which the receiver lets run rrsync, write-only, into one
    directory (hidden names, a snapshot being written, stay here); the receiver keeps its newest ones itself
    (`prune`, its etcd-backup-prune.timer), and where its rrsync has -no-del this node cannot delete them.
    A site path (a mount): copied and kept in order from here."""
    if copy["kind"] == "node":
        timeout = float(config.get("copy_timeout_s", 1800))
        ssh = (
            f"ssh -i {copy['ssh_key']} -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes"
            f" -o UserKnownHostsFile={copy['known_hosts']} -o ConnectTimeout=20"
        )
        argv = ["rsync", "-rtp", "--chmod=F600,D700", "--exclude=.*", f"--timeout={int(min(timeout, 300))}"]
        run([*argv, "-e", ssh, config["dir"] + "/", f"{copy['user']}@{copy['address']}:"], timeout)
    else:
        copy_to_path(config["dir"], copy["path"])
        prune(copy["path"], int(config["keep"]))


def metrics_text(config: dict[str, Any], outcome: dict[str, Any]) -> str:
    snapshots = good_snapshots(config["dir"])
    newest = snapshots[-1][1] if snapshots else {}
    lines = [
        "# HELP etcd_backup_last_success_timestamp_seconds When the newest good etcd snapshot on the control "
        "plane was taken (0: none).",
        "# TYPE etcd_backup_last_success_timestamp_seconds gauge",
        f"etcd_backup_last_success_timestamp_seconds {float(newest.get('created_unix', 0)):.3f}",
        "# HELP etcd_backup_last_snapshot_size_bytes Size of the newest good etcd snapshot.",
        "# TYPE etcd_backup_last_snapshot_size_bytes gauge",
        f"etcd_backup_last_snapshot_size_bytes {int(newest.get('size', 0))}",
        "# HELP etcd_backup_snapshots Good etcd snapshots kept on the control plane.",
        "# TYPE etcd_backup_snapshots gauge",
        f"etcd_backup_snapshots {len(snapshots)}",
        "# HELP etcd_backup_max_age_seconds Age of the newest good snapshot past which EtcdBackupTooOld "
        "fires.",
        "# TYPE etcd_backup_max_age_seconds gauge",
        f"etcd_backup_max_age_seconds {float(config['max_age_s']):.0f}",
        "# HELP etcd_backup_last_run_timestamp_seconds When the backup last ran.",
        "# TYPE etcd_backup_last_run_timestamp_seconds gauge",
        f"etcd_backup_last_run_timestamp_seconds {outcome['ran']:.3f}",
        "# HELP etcd_backup_last_run_success 1 when the last run took and checked a snapshot.",
        "# TYPE etcd_backup_last_run_success gauge",
        f"etcd_backup_last_run_success {1 if outcome['saved'] else 0}",
        "# HELP etcd_backup_copy_success 1 when the last run copied every good snapshot to the destination.",
        "# TYPE etcd_backup_copy_success gauge",
    ]
    for destination, ok in sorted(outcome["copies"].items()):
        label = destination.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'etcd_backup_copy_success{{destination="{label}"}} {1 if ok else 0}')
    return "\n".join(lines) + "\n"


def save(config: dict[str, Any]) -> int:
    os.makedirs(config["dir"], mode=0o700, exist_ok=True)
    outcome: dict[str, Any] = {"ran": time.time(), "saved": False, "copies": {}}
    failures = []
    try:
        with open(os.path.join(config["dir"], ".lock"), "w", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # one run at a time (timer and a manual start)
            try:
                path, record = take(config, utc_now())
                outcome["saved"] = True
                status = record["status"]
                print(
                    f"saved {path}: revision {status['revision']}, {status['totalKey']} keys, "
                    f"{record['size']} bytes, sha256 {record['sha256']}"
                )
                for removed in prune(config["dir"], int(config["keep"])):
                    print(f"removed {removed} (keeping the {config['keep']} newest)")
            except (BackupError, OSError, ValueError) as exc:
                failures.append(f"snapshot failed: {exc}")
            # the good snapshots leave the node even when this run's failed (an earlier copy may have)
            for copy in config.get("copies", []):
                try:
                    copy_off(config, copy)
                    outcome["copies"][copy["name"]] = True
                    print(f"copied the good snapshots to {copy['name']}")
                except (BackupError, OSError) as exc:
                    outcome["copies"][copy["name"]] = False
                    failures.append(f"copy to {copy['name']} failed: {exc}")
    except BlockingIOError:
        print("another etcd backup runs now: nothing done", file=sys.stderr)
        return 1
    finally:
        if config.get("metrics_file"):
            write_atomically(config["metrics_file"], metrics_text(config, outcome), mode=0o644)
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


def data_dir_locked(data_dir: str) -> bool:
    """etcd holds an exclusive lock on its backend (member/snap/db) while it runs."""
    backend = os.path.join(data_dir, "member", "snap", "db")
    if not os.path.exists(backend):
        return False
    with open(backend, "rb") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def restore(args: argparse.Namespace) -> int:
    checked = check(args.etcdutl, args.snapshot)
    if not checked["ok"]:
        print(json.dumps({"restored": False, "error": f"refused: {checked['error']}"}))
        return 1
    data_dir = args.data_dir.rstrip("/")
    if data_dir_locked(data_dir):
        refused = f"refused: etcd still runs on {data_dir} (its lock is held)"
        print(json.dumps({"restored": False, "error": refused}))
        return 1
    suffix = args.suffix or utc_now().strftime(TIME_FORMAT)
    new = f"{data_dir}.restore-{suffix}"
    old = f"{data_dir}.before-restore-{suffix}"
    for taken in (new, old):
        if os.path.exists(taken):
            print(json.dumps({"restored": False, "error": f"refused: {taken} exists already"}))
            return 1
    try:
        run(
            [
                args.etcdutl,
                "snapshot",
                "restore",
                args.snapshot,
                f"--data-dir={new}",
                f"--name={args.name}",
                f"--initial-cluster={args.initial_cluster}",
                f"--initial-advertise-peer-urls={args.initial_advertise_peer_urls}",
                f"--bump-revision={BUMP_REVISION}",
                "--mark-compacted",
            ],
            timeout=1800,
        )
    except BackupError as exc:
        shutil.rmtree(new, ignore_errors=True)
        print(json.dumps({"restored": False, "error": str(exc)}))
        return 1
    os.chmod(new, 0o700)
    if os.path.exists(data_dir):
        os.rename(data_dir, old)
    os.rename(new, data_dir)
    print(
        json.dumps(
            {
                "restored": True,
                "snapshot": args.snapshot,
                "revision": checked["status"].get("revision"),
                "data_dir": data_dir,
                "old_data_dir": old if os.path.exists(old) else "",
            }
        )
    )
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="etcd_backup.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    saving = commands.add_parser("save", help="take, check, keep and copy off a snapshot")
    saving.add_argument("--config", required=True)
    status = commands.add_parser("status", help="check a snapshot")
    status.add_argument("snapshot")
    status.add_argument("--etcdutl", default="etcdutl")
    pruning = commands.add_parser("prune", help="keep the newest good snapshots of a directory")
    pruning.add_argument("--dir", required=True)
    pruning.add_argument("--keep", type=int, required=True)
    restoring = commands.add_parser("restore", help="restore a snapshot into the data directory")
    restoring.add_argument("snapshot")
    restoring.add_argument("--etcdutl", default="etcdutl")
    restoring.add_argument("--data-dir", required=True)
    restoring.add_argument("--name", required=True)
    restoring.add_argument("--initial-cluster", required=True)
    restoring.add_argument("--initial-advertise-peer-urls", required=True)
    restoring.add_argument("--suffix", default="")
    args = parser.parse_args(argv)
    if args.command == "save":
        with open(args.config, encoding="utf-8") as handle:
            return save(json.load(handle))
    if args.command == "status":
        checked = check(args.etcdutl, args.snapshot)
        print(json.dumps(checked))
        return 0 if checked["ok"] else 1
    if args.command == "prune":
        for removed in prune(args.dir, args.keep):
            print(f"removed {removed}")
        return 0
    return restore(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
