"""Unit tests of the lab's node-side Kubernetes stand-ins (no lab needed): kubeadm's config decoding and
command line, the cluster-info JWS, the ipvsadm stand-in. The whole flow runs on the lab in
tests/lab/test_kube_standin_on_lab.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "lab" / "kube"))

from kube_standin import kubeadm, kubeadm_api  # noqa: E402 - the stand-in package lives in tests/lab/kube

GOOD = """\
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint: {advertiseAddress: 10.89.42.11, bindPort: 6443}
nodeRegistration:
  name: gpu-node-1
  criSocket: unix:///run/containerd/containerd.sock
  taints: []
bootstrapTokens: [{token: abcdef.0123456789abcdef, ttl: 24h0m0s}]
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.36.3
networking: {podSubnet: 10.244.0.0/16, serviceSubnet: 10.96.0.0/12}
apiServer:
  extraArgs: [{name: audit-log-maxage, value: "30"}]
  extraVolumes:
    - {name: audit, hostPath: /var/log/kubernetes, mountPath: /var/log/kubernetes, readOnly: false}
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
maxPods: 110
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ipvs
ipvs: {scheduler: rr, strictARP: true, syncPeriod: 30s}
"""


def decode(text: str) -> kubeadm_api.Decoded:
    return kubeadm_api.decode(kubeadm.load_all(text), "test.yaml")


def test_good_config_decodes_clean() -> None:
    out = decode(GOOD)
    assert out.errors == [] and out.unknown == []
    assert sorted(out.documents) == [
        "ClusterConfiguration",
        "InitConfiguration",
        "KubeProxyConfiguration",
        "KubeletConfiguration",
    ]
    assert kubeadm.semantic_errors(out.documents) == []


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("bindPort: 6443", 'bindPort: "6443"', "cannot unmarshal string into Go struct field APIEndpoint"),
        ("strictARP: true", 'strictARP: "true"', "KubeProxyIPVSConfiguration.ipvs.strictARP of type bool"),
        ("maxPods: 110", "maxPods: 1.5", "of type int32"),
        ('value: "30"', "value: 30", "cannot unmarshal number into Go struct field Arg"),
        ("syncPeriod: 30s", "syncPeriod: 30", "of type v1.Duration"),
        ("ttl: 24h0m0s", "ttl: one day", 'invalid duration "one day"'),
        (
            'extraArgs: [{name: audit-log-maxage, value: "30"}]',
            "extraArgs: {audit-log-maxage: '30'}",
            "cannot unmarshal object into Go struct field APIServer.apiServer.extraArgs "
            "of type []v1beta4.Arg",
        ),
        ("taints: []", "taints: node-role", "of type []v1.Taint"),
    ],
)
def test_wrong_types_are_errors(old: str, new: str, expected: str) -> None:
    assert GOOD.count(old) == 1
    out = decode(GOOD.replace(old, new))
    assert any(expected in e for e in out.errors), out.errors


def test_unknown_fields_are_reported_with_their_kind() -> None:
    out = decode(GOOD.replace("cgroupDriver: systemd", "cgroupDriver: systemd\ncgroupDrivr: systemd"))
    assert out.errors == []
    assert out.unknown == [
        "kubelet.config.k8s.io/v1beta1, Kind=KubeletConfiguration: "
        'strict decoding error: unknown field "cgroupDrivr"'
    ]
    nested = decode(GOOD.replace("podSubnet: 10.244.0.0/16", "podSubnet: 10.244.0.0/16, podCIDR: x"))
    assert any('unknown field "networking.podCIDR"' in u for u in nested.unknown)


def test_old_api_and_unknown_kind_are_refused() -> None:
    out = decode(GOOD.replace("kubeadm.k8s.io/v1beta4", "kubeadm.k8s.io/v1beta3", 1))
    assert any("old API spec" in e for e in out.errors)
    out = decode(GOOD.replace("kind: KubeletConfiguration", "kind: KubeletConfig"))
    assert any('no kind "KubeletConfig"' in e for e in out.errors)


def test_semantic_validation() -> None:
    docs = decode(GOOD.replace("mode: ipvs", "mode: userspace").replace("/16,", "/33,")).documents
    errors = kubeadm.semantic_errors(docs)
    assert any('mode: Unsupported value: "userspace"' in e for e in errors)
    assert any("networking.podSubnet" in e for e in errors)
    docs = decode(GOOD.replace("kubernetesVersion: v1.36.3", "kubernetesVersion: v1.29.6")).documents
    assert any("only supports deploying clusters" in e for e in kubeadm.semantic_errors(docs))


def run_kubeadm(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kube_standin.kubeadm", *args],
        cwd=ROOT / "tests" / "lab" / "kube",
        capture_output=True,
        text=True,
        env={"KUBE_STANDIN_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )


def test_config_validate_command(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    result = run_kubeadm(tmp_path, "config", "validate", "--config", str(good))
    assert (result.returncode, result.stdout.strip()) == (0, "ok")
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("mode: ipvs", "mode: ipvs\nmodee: ipvs"))
    result = run_kubeadm(tmp_path, "config", "validate", "--config", str(bad))
    assert result.returncode == 1 and 'unknown field "modee"' in result.stderr


def test_init_refuses_config_mixed_with_flags(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(GOOD)
    result = run_kubeadm(
        tmp_path, "init", "--config", str(config), "--node-name", "x", "--skip-phases", "addon"
    )
    assert result.returncode == 1
    assert "can not mix '--config' with arguments ['node-name']" in result.stderr


def test_version_outputs(tmp_path: Path) -> None:
    assert run_kubeadm(tmp_path, "version", "-o", "short").stdout.strip() == "v1.36.3"
    info = json.loads(run_kubeadm(tmp_path, "version", "-o", "json").stdout)
    assert info["clientVersion"]["gitVersion"] == "v1.36.3"


def test_render_args_overrides_by_name_and_sorts() -> None:
    args = kubeadm.render_args(
        {"secure-port": "6443", "authorization-mode": "Node,RBAC"},
        [
            {"name": "authorization-mode", "value": "RBAC"},
            {"name": "audit-log-path", "value": "/var/log/a.log"},
        ],
    )
    assert args == ["--audit-log-path=/var/log/a.log", "--authorization-mode=RBAC", "--secure-port=6443"]


def test_cluster_info_signature_is_hs256_detached() -> None:
    jws = kubeadm.jws_detached("payload", "abcdef", "0123456789abcdef")
    _header, empty, signature = jws.split(".")
    assert empty == "" and signature
    assert kubeadm.jws_detached("payload", "abcdef", "0123456789abcdef") == jws
    assert kubeadm.jws_detached("payload!", "abcdef", "0123456789abcdef") != jws


def test_ipvsadm_stand_in_lists_the_table(tmp_path: Path) -> None:
    table = tmp_path / "table.json"
    table.write_text(
        json.dumps(
            {
                "virtual_servers": [
                    {
                        "protocol": "TCP",
                        "address": "10.96.0.1",
                        "port": 443,
                        "scheduler": "rr",
                        "real_servers": [
                            {"address": "10.89.42.11", "port": 6443, "forward": "Masq", "weight": 1}
                        ],
                    }
                ]
            }
        )
    )
    script = ROOT / "tests" / "lab" / "image" / "kernel" / "ipvsadm"
    env = {"LAB_IPVS_TABLE": str(table), "PATH": "/usr/bin:/bin"}
    if Path("/proc/net/ip_vs").exists():
        pytest.skip("this kernel has IPVS: the stand-in execs the real ipvsadm")
    out = subprocess.run([sys.executable, str(script), "-Ln"], capture_output=True, text=True, env=env).stdout
    lines = out.splitlines()
    assert lines[0] == "IP Virtual Server version 1.2.1 (size=4096)"
    assert lines[3].split() == ["TCP", "10.96.0.1:443", "rr"]
    assert lines[4].split() == ["->", "10.89.42.11:6443", "Masq", "1", "0", "0"]
    add = subprocess.run(
        [sys.executable, str(script), "-A", "-t", "1.2.3.4:80"], capture_output=True, env=env
    )
    assert add.returncode == 2
    subprocess.run([sys.executable, str(script), "--clear"], check=True, env=env)
    assert not table.exists()


def test_kubelet_flags_carry_a_node_ip_only_from_kubelet_extra_args(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As real kubeadm (phases/kubelet/flags.go): --node-ip reaches the kubelet only from
    nodeRegistration.kubeletExtraArgs; the stand-in adding one of its own hid a role that set none."""
    monkeypatch.setattr(kubeadm, "ROOT", str(tmp_path))
    flags = tmp_path / "var/lib/kubelet/kubeadm-flags.env"
    cri = "unix:///run/containerd/containerd.sock"
    kubeadm.write_kubelet_files({}, cri, [], "registry.k8s.io")
    assert "--node-ip" not in flags.read_text()
    kubeadm.write_kubelet_files({}, cri, [{"name": "node-ip", "value": "10.0.0.11"}], "registry.k8s.io")
    assert flags.read_text().count("--node-ip") == 1 and "--node-ip=10.0.0.11" in flags.read_text()
