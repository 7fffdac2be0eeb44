"""playbooks/remediate/renew-certs.yml --check run by ansible-playbook on this machine over a PKI the real
kubeadm of the pin made (its init phase; `kubeadm` on the play's PATH is the real one, pointed at that PKI by
kubeadm_control_plane_config_path): a fresh set is left alone, a set renewed with a 480 h validity (as the lab
test makes them end soon) would be renewed; --check changes no file. The real run (renewal, restart of the
static Pods, the served certificate) is the lab's: tests/lab/test_day2_on_lab.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import real_kube
import yaml
from playbook_text import flat

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def site(tmp_path: Path) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "apiVersion": "kubeadm.k8s.io/v1beta4",
        "kind": "ClusterConfiguration",
        "kubernetesVersion": real_kube.kubernetes_version(),
        "certificatesDir": str(tmp_path / "pki"),
    }
    init = {
        "apiVersion": "kubeadm.k8s.io/v1beta4",
        "kind": "InitConfiguration",
        "localAPIEndpoint": {"advertiseAddress": real_kube.ADVERTISE},
    }
    config = tmp_path / "kubeadm-config.yaml"
    config.write_text(yaml.safe_dump_all([init, cluster]))
    assert real_kube.kubeadm("init", "phase", "certs", "all", "--config", str(config)).returncode == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubeadm").symlink_to(real_kube.binary("kubeadm"))
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "node_ip": "127.0.0.1",
    }
    inventory = tmp_path / "hosts.json"
    inventory.write_text(
        json.dumps(
            {"all": {"children": {"k8s_cluster": {"children": {"control_plane": {"hosts": {"cp": host}}}}}}}
        )
    )
    return {
        "tmp": tmp_path,
        "config": config,
        "init": init,
        "cluster": cluster,
        "inventory": inventory,
        "path": f"{bin_dir}:{os.environ['PATH']}",
    }


def check(site: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    extra = site["tmp"] / "extra.json"
    extra.write_text(
        json.dumps(
            {
                "kubeadm_control_plane_config_path": str(site["config"]),
                "etcd_backup_copy_to_path": str(site["tmp"] / "copies"),  # no worker here to copy to
            }
        )
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": site["path"],
    }
    return subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "ansible-playbook"),
            "-i",
            str(site["inventory"]),
            str(ROOT / "playbooks" / "remediate" / "renew-certs.yml"),
            "--check",
            "-e",
            f"@{extra}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def digests(pki: Path) -> dict[str, str]:
    return {str(p.relative_to(pki)): hashlib.sha256(p.read_bytes()).hexdigest() for p in pki.rglob("*.crt")}


def test_a_fresh_set_is_left_alone(site: dict[str, Any]) -> None:
    done = check(site)
    assert done.returncode == 0, done.stdout[-4000:]
    out = flat(done.stdout)
    assert "(renew_certs_within_days 90): nothing to renew" in out
    assert "no renewal, no restart" in out and "check mode: nothing renewed" in out


def test_a_set_ending_soon_would_be_renewed_and_nothing_changes(site: dict[str, Any]) -> None:
    short = site["tmp"] / "short.yaml"
    short.write_text(
        yaml.safe_dump_all([site["init"], {**site["cluster"], "certificateValidityPeriod": "480h"}])
    )
    assert real_kube.kubeadm("certs", "renew", "all", "--config", str(short)).returncode == 0
    before = digests(site["tmp"] / "pki")
    done = check(site)
    assert done.returncode == 0, done.stdout[-4000:]
    out = flat(done.stdout)
    assert "the earliest certificate: " in out and "nothing to renew" not in out
    assert "Check mode: would renew every certificate kubeadm manages (" in out
    assert "then restart the static Pods of /etc/kubernetes/manifests" in out
    assert digests(site["tmp"] / "pki") == before
