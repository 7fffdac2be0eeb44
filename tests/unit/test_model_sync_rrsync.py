"""roles/model_sync/tasks/rrsync.yml: the sync key's forced command is the rrsync the installed rsync package
provides, run on a local inventory with the package's paths moved into a temporary directory.

rsync 3.2.4 and later (Debian 12, Ubuntu 22.04's jammy-updates) install /usr/bin/rrsync; Ubuntu 22.04's
release rsync 3.2.3 ships it only as /usr/share/doc/rsync/scripts/rrsync.gz, which the role installs as
/usr/local/bin/rrsync. Where neither exists the role refuses, naming both paths and the ways out. On the lab
(nodes laid out as jammy's 3.2.3): tests/lab/test_models_on_lab.py."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PERL_RRSYNC = b"#!/usr/bin/perl\n# rrsync of rsync 3.2.3 (stand-in)\nprint 'ok';\n"


def paths(tmp_path: Path) -> dict[str, str]:
    return {
        "__model_sync_rrsync_packaged": str(tmp_path / "usr/bin/rrsync"),
        "__model_sync_rrsync_doc_copy": str(tmp_path / "usr/share/doc/rsync/scripts/rrsync.gz"),
        "__model_sync_rrsync_installed": str(tmp_path / "usr/local/bin/rrsync"),
    }


def packaged(tmp_path: Path) -> None:
    path = Path(paths(tmp_path)["__model_sync_rrsync_packaged"])
    path.parent.mkdir(parents=True)
    path.write_text("#!/usr/bin/env python3\n")
    path.chmod(0o755)


def doc_copy(tmp_path: Path, content: bytes = PERL_RRSYNC) -> None:
    path = Path(paths(tmp_path)["__model_sync_rrsync_doc_copy"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(content))
    Path(paths(tmp_path)["__model_sync_rrsync_installed"]).parent.mkdir(parents=True, exist_ok=True)


def run(tmp_path: Path, *extra: str, role_read: bool = False, **variables: object) -> tuple[int, str, str]:
    """rrsync.yml on localhost; returns rc, the chosen rrsync (or '') and the output on one line.

    Entered alone (tasks_from, as etcd_backup enters it), or with ROLE_READ as the role runs it
    (authorize-source.yml): after the role's read of the same paths (prepare-nodes.yml), rsync not installed
    since. The output says whether rrsync.yml's own read (LOOKED) and the decompress task (INSTALLED) ran."""
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"gpu-node-2": None}}}))
    role = {"name": "model_sync", "tasks_from": "rrsync"}
    include: dict[str, object] = {"ansible.builtin.include_role": role}
    read: list[dict[str, object]] = []
    if role_read:
        found = paths(tmp_path)
        read = [
            {
                "name": "Read as the role does",
                "files_in_place": {
                    "stat": list(found.values()),
                    "slurp": [found["__model_sync_rrsync_doc_copy"]],
                },
                "register": "__model_sync_found",
            }
        ]
        include["vars"] = {
            "__model_sync_rrsync_read": "{{ __model_sync_found }}",
            "__model_sync_rsync_package": {"changed": False, "skipped": True},
        }
    said = (
        "CHOSEN={{ __model_sync_rrsync }} LOOKED={{ __model_sync_rrsync_look is not skipped }}"
        " INSTALLED={{ __model_sync_rrsync_install is not skipped }}"
    )
    play = [
        {
            "hosts": "gpu-node-2",
            "gather_facts": False,
            "tasks": [*read, include, {"name": "Chosen", "ansible.builtin.debug": {"msg": said}}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    values = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(ROOT / ".venv/bin/python"),
        **paths(tmp_path),
        **variables,
    }
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-playbook"),
            "-i",
            str(tmp_path / "hosts.yml"),
            str(tmp_path / "play.yml"),
            "-e",
            json.dumps(values),
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        timeout=180,
    )
    out = " ".join((proc.stdout + proc.stderr).split())
    chosen = re.search(r"CHOSEN=(\S*)", out)
    return proc.returncode, chosen.group(1).strip("'\"") if chosen else "", out


def changed(out: str) -> int:
    return int(re.search(r"changed=(\d+)", out).group(1))  # type: ignore[union-attr]


def ran(out: str, what: str) -> bool:
    """Whether rrsync.yml's read (LOOKED) or its decompress task (INSTALLED) ran."""
    return re.search(what + r"=(\w+)", out).group(1) == "True"  # type: ignore[union-attr]


def test_the_packages_rrsync_is_used_where_it_installs_one(tmp_path: Path) -> None:
    packaged(tmp_path)
    doc_copy(tmp_path)  # rsync 3.2.7 keeps no documentation copy, but one would change nothing
    rc, chosen, out = run(tmp_path)
    assert rc == 0, out[-3000:]
    assert chosen == paths(tmp_path)["__model_sync_rrsync_packaged"]
    assert not Path(paths(tmp_path)["__model_sync_rrsync_installed"]).exists()
    assert changed(out) == 0


def test_jammys_documentation_copy_is_installed_and_used(tmp_path: Path) -> None:
    doc_copy(tmp_path)
    installed = Path(paths(tmp_path)["__model_sync_rrsync_installed"])
    # --check: says it would install, writes nothing, does not fail on the rrsync it has not installed
    rc, chosen, out = run(tmp_path, "--check")
    assert rc == 0, out[-3000:]
    assert changed(out) >= 1 and not installed.exists()
    rc, chosen, out = run(tmp_path)
    assert rc == 0, out[-3000:]
    assert chosen == str(installed)
    assert installed.read_bytes() == PERL_RRSYNC and installed.stat().st_mode & 0o777 == 0o755
    rc, _, out = run(tmp_path)
    assert rc == 0 and changed(out) == 0, out[-3000:]
    # installed as the documentation copy holds it: the decompress task does not run again
    assert ran(out, "LOOKED") and not ran(out, "INSTALLED"), out[-3000:]
    # an rsync update that changes the documentation copy updates the installed script
    doc_copy(tmp_path, PERL_RRSYNC + b"# updated\n")
    rc, _, out = run(tmp_path)
    assert rc == 0 and changed(out) == 1 and installed.read_bytes().endswith(b"# updated\n"), out[-3000:]


def test_run_by_the_role_its_read_decides_and_drift_is_put_right(tmp_path: Path) -> None:
    """As authorize-source.yml runs it: no second read, and the copy installed from the documentation is
    decompressed again only where it differs from it (content, mode)."""
    doc_copy(tmp_path)
    installed = Path(paths(tmp_path)["__model_sync_rrsync_installed"])
    rc, chosen, out = run(tmp_path, role_read=True)
    assert rc == 0 and chosen == str(installed), out[-3000:]
    assert ran(out, "INSTALLED") and not ran(out, "LOOKED"), out[-3000:]
    rc, chosen, out = run(tmp_path, role_read=True)
    assert rc == 0 and chosen == str(installed) and changed(out) == 0, out[-3000:]
    assert not ran(out, "INSTALLED") and not ran(out, "LOOKED"), out[-3000:]
    rc, _, out = run(tmp_path, "--check", role_read=True)
    assert rc == 0 and changed(out) == 0, out[-3000:]
    for drift in (lambda: installed.write_bytes(PERL_RRSYNC + b"# edited\n"), lambda: installed.chmod(0o700)):
        drift()
        rc, chosen, out = run(tmp_path, role_read=True)
        assert rc == 0 and chosen == str(installed) and changed(out) == 1, out[-3000:]
        assert installed.read_bytes() == PERL_RRSYNC and installed.stat().st_mode & 0o777 == 0o755


def test_the_installed_copy_goes_once_the_package_installs_rrsync(tmp_path: Path) -> None:
    """rsync upgraded from 3.2.3 to 3.2.7 (jammy-updates): the package's rrsync, no stale Perl copy left."""
    doc_copy(tmp_path)
    assert run(tmp_path)[0] == 0
    packaged(tmp_path)
    rc, chosen, out = run(tmp_path)
    assert rc == 0, out[-3000:]
    assert chosen == paths(tmp_path)["__model_sync_rrsync_packaged"]
    assert not Path(paths(tmp_path)["__model_sync_rrsync_installed"]).exists()


def test_no_rrsync_at_all_is_refused_naming_the_paths_and_the_ways_out(tmp_path: Path) -> None:
    rc, _, out = run(tmp_path)
    assert rc != 0
    for named in (
        paths(tmp_path)["__model_sync_rrsync_packaged"],
        paths(tmp_path)["__model_sync_rrsync_doc_copy"],
        "rsync 3.2.4 or later",
        "model_sync_rrsync_path",
    ):
        assert named in out, (named, out[-3000:])


@pytest.mark.parametrize("executable", [True, False], ids=["executable", "not-executable"])
def test_a_sites_own_rrsync_is_used_when_set(tmp_path: Path, executable: bool) -> None:
    own = tmp_path / "opt/rrsync"
    own.parent.mkdir(parents=True)
    own.write_text("#!/bin/sh\n")
    own.chmod(0o755 if executable else 0o644)
    doc_copy(tmp_path)
    rc, chosen, out = run(tmp_path, model_sync_rrsync_path=str(own))
    if executable:
        assert rc == 0 and chosen == str(own), out[-3000:]
    else:
        assert rc != 0 and f"model_sync_rrsync_path {own} is not an executable" in out, out[-3000:]
    assert not Path(paths(tmp_path)["__model_sync_rrsync_installed"]).exists()
