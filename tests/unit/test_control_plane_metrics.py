"""roles/control_plane_metrics/files/control_plane_metrics.py: the certificate check reads the real kubeadm
of the production pin (`kubeadm certs check-expiration -o json` over a PKI its init phase made, then renewed
with a short certificateValidityPeriod, as the lab test makes certificates end soon), and the exporter serves
the metrics files over HTTP as Prometheus reads them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import real_kube
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "roles" / "control_plane_metrics" / "files" / "control_plane_metrics.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("control_plane_metrics", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


metrics_program = load()


def samples(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


@pytest.fixture
def kubeadm(tmp_path: Path) -> Path:
    """A PKI made by the real kubeadm's init phase, and a kubeadm wrapper that checks it (the real one reads
    /etc/kubernetes/pki; --config points it at this one)."""
    config = tmp_path / "kubeadm-config.yaml"
    documents = [
        {
            "apiVersion": "kubeadm.k8s.io/v1beta4",
            "kind": "InitConfiguration",
            "localAPIEndpoint": {"advertiseAddress": real_kube.ADVERTISE},
            "nodeRegistration": {"name": "gpu-node-1"},
        },
        {
            "apiVersion": "kubeadm.k8s.io/v1beta4",
            "kind": "ClusterConfiguration",
            "kubernetesVersion": real_kube.kubernetes_version(),
            "certificatesDir": str(tmp_path / "pki"),
        },
    ]
    config.write_text(yaml.safe_dump_all(documents))
    made = real_kube.kubeadm("init", "phase", "certs", "all", "--config", str(config))
    assert made.returncode == 0, made.stderr
    wrapper = tmp_path / "kubeadm"
    wrapper.write_text(f'#!/bin/sh\nexec {real_kube.binary("kubeadm")} "$@" --config {config}\n')
    wrapper.chmod(0o755)
    return wrapper


def check(kubeadm: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "certificates", "--out", str(out), "--kubeadm", str(kubeadm)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_certificates_as_kubeadm_lists_them(kubeadm: Path, tmp_path: Path) -> None:
    out = tmp_path / "kubeadm_certificates.prom"
    done = check(kubeadm, out)
    assert done.returncode == 0, done.stderr
    got = samples(out.read_text())
    year = time.time() + 365 * 86400
    apiserver = got[
        'kubeadm_certificate_expiration_timestamp_seconds{certificate="apiserver",kind="certificate"}'
    ]
    assert abs(apiserver - year) < 2 * 86400
    authority = got['kubeadm_certificate_expiration_timestamp_seconds{certificate="ca",kind="authority"}']
    assert authority > time.time() + 9 * 365 * 86400
    assert got["kubeadm_certificate_check_success"] == 1
    # kubeadm's own list, the etcd client certificate the backups use among them; the kubeconfig files this
    # PKI has none of (admin.conf, ...) are kubeadm's "missing": no sample, nothing to renew
    listed = {name.split('certificate="')[1].split('"')[0] for name in got if "certificate=" in name}
    assert {
        "apiserver",
        "etcd-healthcheck-client",
        "etcd-server",
        "front-proxy-client",
        "ca",
        "etcd-ca",
    } <= listed
    assert "admin.conf" not in listed


def test_short_lived_certificates_read_as_ending_soon(kubeadm: Path, tmp_path: Path) -> None:
    """The lab test's way to make certificates end soon: kubeadm certs renew with a configuration whose
    certificateValidityPeriod is short (kubeadm 1.36's renew has no validity flag)."""
    config = Path(kubeadm.read_text().split("--config ")[1].strip())
    documents = list(yaml.safe_load_all(config.read_text()))
    documents[1]["certificateValidityPeriod"] = "480h"
    short = tmp_path / "short.yaml"
    short.write_text(yaml.safe_dump_all(documents))
    renewed = real_kube.kubeadm("certs", "renew", "all", "--config", str(short))
    assert renewed.returncode == 0, renewed.stderr
    out = tmp_path / "kubeadm_certificates.prom"
    assert check(kubeadm, out).returncode == 0
    got = samples(out.read_text())
    apiserver = got[
        'kubeadm_certificate_expiration_timestamp_seconds{certificate="apiserver",kind="certificate"}'
    ]
    assert abs(apiserver - (time.time() + 20 * 86400)) < 3600  # 480 h: inside the alert's 30 days


def test_a_failing_kubeadm_is_reported(tmp_path: Path) -> None:
    broken = tmp_path / "kubeadm"
    broken.write_text(
        "#!/bin/sh\necho 'error: open /etc/kubernetes/pki/ca.crt: permission denied' >&2\nexit 1\n"
    )
    broken.chmod(0o755)
    out = tmp_path / "kubeadm_certificates.prom"
    done = check(broken, out)
    assert done.returncode == 1 and "exited 1: error: open /etc/kubernetes/pki/ca.crt" in done.stderr
    got = samples(out.read_text())
    assert got["kubeadm_certificate_check_success"] == 0
    assert not [name for name in got if name.startswith("kubeadm_certificate_expiration")]


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    directory = tmp_path / "metrics"
    directory.mkdir()
    port = real_kube.free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            "serve",
            "--listen",
            "127.0.0.1",
            "--port",
            str(port),
            "--dir",
            str(directory),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(url + "/healthz", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, "the exporter did not start"
                time.sleep(0.1)
        yield url, directory
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_exporter_serves_every_metrics_file(exporter: tuple[str, Path]) -> None:
    url, directory = exporter
    (directory / "etcd_backup.prom").write_text("etcd_backup_last_success_timestamp_seconds 1796100000.000\n")
    (directory / "kubeadm_certificates.prom").write_text("kubeadm_certificate_check_success 1")
    (directory / "notes.txt").write_text("not a metrics file")
    response = urllib.request.urlopen(url + "/metrics", timeout=5)
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.read().decode()
    got = samples(text)
    assert got["etcd_backup_last_success_timestamp_seconds"] == 1796100000
    assert got["kubeadm_certificate_check_success"] == 1
    mtime = got['control_plane_metrics_file_mtime_seconds{file="etcd_backup.prom"}']
    assert abs(mtime - (directory / "etcd_backup.prom").stat().st_mtime) < 0.01
    assert "not a metrics file" not in text
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url + "/etcd_backup.prom", timeout=5)
    assert refused.value.code == 404


def test_every_family_has_help_and_type(tmp_path: Path) -> None:
    """What Prometheus's parser wants: each family's HELP and TYPE before its samples (the exporter's own,
    the certificate check's; the etcd backup's: tests/unit/test_etcd_backup.py writes them)."""
    texts = [
        metrics_program.exposition(str(tmp_path)),
        metrics_program.certificate_metrics(None, "", 0.0),
    ]
    for text in texts:
        declared = set()
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                declared.add(line.split()[2])
            elif line and not line.startswith("#"):
                assert line.split("{")[0].split()[0] in declared, line
