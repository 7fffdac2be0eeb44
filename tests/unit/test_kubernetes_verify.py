"""playbooks/kubernetes-verify.yml's per-node verdict, templated offline with what its reads return.

Besides Ready, kube-proxy, IPVS, CoreDNS and GPUs, a node whose Node object carries an InternalIP other than
its node_ip (a kubelet without --node-ip took its host name's or default route's address), or whose Calico
address differs from node_ip, is a problem naming both addresses and the way out. On the lab:
tests/lab/test_kubernetes_stage_on_lab.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import real_kube
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[2]


def problems(node: dict[str, Any], gpu_facts: dict[str, Any] | None = None) -> list[str]:
    play = yaml.safe_load((ROOT / "playbooks/kubernetes-verify.yml").read_text())[0]
    (summary,) = [task for task in play["tasks"] if task.get("name") == "Summary"]
    variables: dict[str, Any] = {
        k: trust_as_template(v) if isinstance(v, str) else v for k, v in summary["vars"].items()
    }
    variables |= {
        "inventory_hostname": "gpu-node-2",
        "node_ip": "10.0.0.12",
        "verify_nodes": {"resources": [node]},
        "verify_coredns": {"resources": [{"spec": {"replicas": 2}, "status": {"readyReplicas": 2}}]},
        "verify_kubernetes_service": {"resources": [{"spec": {"clusterIP": "10.96.0.1"}}]},
        "verify_proxy_mode": {"content": "ipvs"},
        "verify_ipvs": {"stdout": "TCP  10.96.0.1:443 rr"},
        "groups": {"gpu_nodes": ["gpu-node-2"]},
        "ansible_facts": {"nvidia": {"gpu_count": 0}} if gpu_facts is None else gpu_facts,
    }
    templar = Templar(loader=DataLoader(), variables=variables)
    return list(templar.template(trust_as_template("{{ verify_problems }}")))


def node(internal_ip: str, calico: str | None = None) -> dict[str, Any]:
    annotations = {"projectcalico.org/IPv4Address": calico} if calico else {}
    return {
        "metadata": {"name": "gpu-node-2", "annotations": annotations},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [
                {"type": "InternalIP", "address": internal_ip},
                {"type": "Hostname", "address": "gpu-node-2"},
            ],
            "allocatable": {},
        },
    }


@pytest.mark.parametrize("calico", [None, "10.0.0.12/24"], ids=["calico-not-yet", "calico-on-node-ip"])
def test_a_node_on_its_node_ip_is_fine(calico: str | None) -> None:
    assert problems(node("10.0.0.12", calico)) == []


def test_a_kubelet_on_another_address_is_a_problem_saying_what_to_do() -> None:
    (problem,) = problems(node("172.16.0.12"))
    assert problem.startswith("InternalIP 172.16.0.12, not node_ip 10.0.0.12")
    assert "--node-ip=10.0.0.12" in problem and "/var/lib/kubelet/kubeadm-flags.env" in problem


def test_the_gpu_count_is_the_one_this_run_read() -> None:
    """The count the GPU stage (or the report's first play) put in the facts: no second NVML read, and a node
    that offers fewer is a problem; a node whose GPUs were never read (no NVML) counts none."""
    offering_two = node("10.0.0.12")
    offering_two["status"]["allocatable"] = {"nvidia.com/gpu": "2"}
    assert problems(offering_two, {"nvidia": {"gpu_count": 2}}) == []
    assert problems(offering_two, {"nvidia": {"gpu_count": 4}}) == ["allocatable nvidia.com/gpu 2 of 4 GPUs"]
    no_count = {"nvidia": {"device_processes": []}}
    assert problems(offering_two, no_count) == ["allocatable nvidia.com/gpu 2 of 0 GPUs"]


def test_only_this_node_is_read_from_the_list() -> None:
    other = node("10.0.0.13")
    other["metadata"]["name"] = "gpu-node-3"
    other["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert problems(other) == ["node not Ready (absent)"]


def test_calico_on_another_address_is_a_problem() -> None:
    (problem,) = problems(node("10.0.0.12", "172.16.0.12/16"))
    assert problem.startswith("Calico address 172.16.0.12, not node_ip 10.0.0.12")


def certificates(validity: str | None, tmp_path: Path) -> tuple[bool, str]:
    """The verification's certificate line (task Certificates, templated as Ansible does) over what the real
    kubeadm of the pin answers for a PKI its init phase made, renewed with VALIDITY when given (its
    certificateValidityPeriod, as the lab test shortens them): (the assert holds, the message it prints)."""
    config = tmp_path / "kubeadm-config.yaml"
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
    config.write_text(yaml.safe_dump_all([init, cluster]))
    assert real_kube.kubeadm("init", "phase", "certs", "all", "--config", str(config)).returncode == 0
    if validity:
        config.write_text(yaml.safe_dump_all([init, {**cluster, "certificateValidityPeriod": validity}]))
        assert real_kube.kubeadm("certs", "renew", "all", "--config", str(config)).returncode == 0
    checked = real_kube.kubeadm("certs", "check-expiration", "--config", str(config), "-o", "json")
    assert checked.returncode == 0, checked.stderr
    play = yaml.safe_load((ROOT / "playbooks/kubernetes-verify.yml").read_text())[0]
    (task,) = [task for task in play["tasks"] if task.get("name") == "Certificates"]
    variables: dict[str, Any] = {
        k: trust_as_template(v) if isinstance(v, str) else v for k, v in task["vars"].items()
    }
    variables |= {"verify_api": "gpu-node-1", "verify_certificates": {"rc": 0, "stdout": checked.stdout}}
    templar = Templar(loader=DataLoader(), variables=variables)
    assertion = task["ansible.builtin.assert"]
    held = templar.template(trust_as_template("{{ " + assertion["that"] + " }}"))
    message = assertion["success_msg"] if held else assertion["fail_msg"]
    return bool(held), " ".join(str(templar.template(trust_as_template(message))).split())


def test_the_summary_names_the_earliest_certificate(tmp_path: Path) -> None:
    held, line = certificates(None, tmp_path)
    assert held and line.startswith("certificates (gpu-node-1, kubeadm certs check-expiration): earliest ")
    assert "(364 days)" in line or "(365 days)" in line
    assert "earliest authority " in line and "RENEW" not in line


def test_a_certificate_ending_within_30_days_says_renew(tmp_path: Path) -> None:
    held, line = certificates("480h", tmp_path)
    assert held and "(19 days), RENEW: playbooks/remediate/renew-certs.yml" in line


def test_an_ended_certificate_fails_the_verification(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renew = real_kube.kubeadm

    def renew_then_wait(*args: str) -> Any:
        done = renew(*args)
        if args[:2] == ("certs", "renew"):
            time.sleep(2)  # past the 1 s the certificates were given
        return done

    monkeypatch.setattr(real_kube, "kubeadm", renew_then_wait)
    held, line = certificates("1s", tmp_path)
    assert not held and "a certificate has ended: playbooks/remediate/renew-certs.yml" in line


@pytest.mark.parametrize("pressure", ["DiskPressure", "MemoryPressure", "PIDPressure"])
def test_a_node_under_pressure_is_a_problem_though_ready(pressure: str) -> None:
    """Ready stays True under pressure, while the kubelet evicts the node's pods and the scheduler places
    none there: the converge then fails later on pods that never become ready, unless this names it."""
    under = node("10.0.0.12")
    under["status"]["conditions"] += [
        {"type": kind, "status": str(kind == pressure)}
        for kind in ("DiskPressure", "MemoryPressure", "PIDPressure")
    ]
    (problem,) = problems(under)
    assert problem.startswith(f"{pressure}: the kubelet evicts the pods of this node"), problem
    assert "kubectl describe node gpu-node-2" in problem
    assert ("free the disk of /var/lib/containerd" in problem) == (pressure == "DiskPressure"), problem


def test_pressure_conditions_that_are_false_are_fine() -> None:
    calm = node("10.0.0.12")
    calm["status"]["conditions"] += [
        {"type": kind, "status": "False"} for kind in ("DiskPressure", "MemoryPressure", "PIDPressure")
    ]
    assert problems(calm) == []
