"""The kubeadm roles' node network checks (roles/kubeadm_control_plane/tasks/validate.yml), run on a local
inventory with the network facts of an A100 server: several NICs, an InfiniBand port, secondary addresses.

The pod and service subnets must overlap no network of any interface of the node (not only the default
route's), leaving out only the interfaces the cluster itself makes (kube-proxy's kube-ipvs0 holds every
ClusterIP, Calico's tunnels hold pod addresses); node_ip must be an address of the node (the kubelet's
--node-ip). A refusal names the variable, the interface and its address."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

# `ip addr` of a server as the setup module reports it (prefixed keys; a '-' in a name becomes '_')
SERVER: dict[str, Any] = {
    "ansible_interfaces": ["lo", "eno1", "ens2f0", "ib0"],
    "ansible_lo": {"device": "lo", "ipv4": {"address": "127.0.0.1", "netmask": "255.0.0.0", "prefix": "8"}},
    "ansible_eno1": {
        "device": "eno1",
        "ipv4": {"address": "10.0.0.11", "netmask": "255.255.255.0", "prefix": "24"},
    },
    "ansible_ens2f0": {
        "device": "ens2f0",
        "ipv4": {"address": "192.168.50.11", "netmask": "255.255.255.0", "prefix": "24"},
    },
    "ansible_ib0": {
        "device": "ib0",
        "type": "infiniband",
        "ipv4": {"address": "172.16.0.11", "netmask": "255.255.0.0", "prefix": "16"},
    },
    "ansible_default_ipv4": {"interface": "eno1", "address": "10.0.0.11", "netmask": "255.255.255.0"},
}


def with_interface(facts: dict[str, Any], name: str, *addresses: str) -> dict[str, Any]:
    """FACTS plus interface NAME holding ADDRESSES (a.b.c.d/p; the first primary, the others secondary)."""
    facts = copy.deepcopy(facts)

    def entry(cidr: str) -> dict[str, str]:
        address, prefix = cidr.split("/")
        return {"address": address, "prefix": prefix}

    if name not in facts["ansible_interfaces"]:
        facts["ansible_interfaces"].append(name)
    iface = facts.setdefault("ansible_" + name.replace("-", "_"), {"device": name})
    if "ipv4" not in iface:
        iface["ipv4"] = entry(addresses[0])
        addresses = addresses[1:]
    iface.setdefault("ipv4_secondaries", []).extend(entry(a) for a in addresses)
    return facts


FAKE_FACTS_MODULE = """#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule

module = AnsibleModule(argument_spec={"facts": {"type": "dict", "required": True}}, supports_check_mode=True)
module.exit_json(changed=False, ansible_facts=module.params["facts"])
"""


def run_validate(
    tmp_path: Path, facts: dict[str, Any], node_ip: str = "10.0.0.11", **values: Any
) -> tuple[int, str]:
    """kubeadm_control_plane's validate.yml on gpu-node-1 (local connection) with FACTS as its facts, and
    VALUES as extra variables."""
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "fake_facts.py").write_text(FAKE_FACTS_MODULE)
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(ROOT / ".venv/bin/python"),
        "node_ip": node_ip,
    }
    inventory = {
        "all": {"children": {"k8s_cluster": {"children": {"control_plane": {"hosts": {"gpu-node-1": host}}}}}}
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    play = [
        {
            "hosts": "gpu-node-1",
            "gather_facts": False,
            "tasks": [
                {"name": "The server's facts", "fake_facts": {"facts": facts}},
                {"ansible.builtin.include_role": {"name": "kubeadm_control_plane", "tasks_from": "validate"}},
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-playbook"),
            "-i",
            str(tmp_path / "hosts.yml"),
            str(tmp_path / "play.yml"),
            "-e",
            json.dumps(values),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_LIBRARY": f"{tmp_path / 'library'}:{ROOT / 'library'}",
            "ANSIBLE_NOCOLOR": "1",
        },
        timeout=180,
    )
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def test_a_server_with_its_networks_clear_of_the_cluster_passes(tmp_path: Path) -> None:
    rc, out = run_validate(tmp_path, SERVER)
    assert rc == 0, out[-3000:]


@pytest.mark.parametrize(
    ("facts", "named"),
    [
        (
            with_interface(SERVER, "ens2f1", "10.244.7.11/24"),
            "kubeadm_control_plane_pod_subnet (10.244.0.0/16) overlaps the network of node gpu-node-1: "
            "ens2f1 10.244.7.11/24",
        ),
        (
            with_interface(SERVER, "ib1", "10.100.0.11/16"),
            "kubeadm_control_plane_service_subnet (10.96.0.0/12) overlaps the network of node gpu-node-1: "
            "ib1 10.100.0.11/16",
        ),
        (
            with_interface(SERVER, "eno1", "10.244.200.5/24"),  # a secondary address of the default NIC
            "kubeadm_control_plane_pod_subnet (10.244.0.0/16) overlaps the network of node gpu-node-1: "
            "eno1 10.244.200.5/24",
        ),
        (
            with_interface(SERVER, "br-storage", "10.0.0.0/8"),  # a wider network that holds the pod subnet
            "kubeadm_control_plane_pod_subnet (10.244.0.0/16) overlaps the network of node gpu-node-1: "
            "br-storage 10.0.0.0/8",
        ),
    ],
    ids=["second-nic-in-pod-subnet", "infiniband-in-service-subnet", "secondary-address", "dash-in-name"],
)
def test_an_interface_in_a_cluster_subnet_is_refused_naming_it(
    tmp_path: Path, facts: dict[str, Any], named: str
) -> None:
    rc, out = run_validate(tmp_path, facts)
    assert rc != 0
    assert named in out, out[-3000:]


def test_the_clusters_own_interfaces_do_not_count(tmp_path: Path) -> None:
    """On a running node kube-ipvs0 holds every ClusterIP, Calico's tunnels pod addresses: a rerun passes."""
    facts = with_interface(SERVER, "kube-ipvs0", "10.96.0.1/32", "10.96.0.10/32")
    facts = with_interface(facts, "tunl0", "10.244.12.0/32")
    facts = with_interface(facts, "vxlan.calico", "10.244.12.1/32")
    rc, out = run_validate(tmp_path, facts)
    assert rc == 0, out[-3000:]


def test_a_node_ip_the_node_does_not_hold_is_refused(tmp_path: Path) -> None:
    rc, out = run_validate(tmp_path, SERVER, node_ip="10.0.0.99")
    assert rc != 0
    assert "node_ip of gpu-node-1 (10.0.0.99) is not an address of this node" in out, out[-3000:]
    assert "eno1 10.0.0.11/24" in out  # what it holds, to pick from


R = "kubeadm_control_plane_"  # the role's prefix


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({R + "pod_subnet": "10.244.0.0"}, R + "pod_subnet must be a network in CIDR notation"),
        ({R + "service_subnet": "10.96.0.1/12"}, R + "service_subnet must be a network in CIDR notation"),
        ({R + "service_subnet": "10.244.0.0/24"}, "overlaps kubeadm_control_plane_service_subnet"),
        ({R + "proxy_mode": "userspace"}, R + "proxy_mode must be ipvs, nftables or iptables"),
        ({R + "operator_cert_validity_hours": 24}, "or every run would issue new certificates"),
        ({R + "operator_cert_renew_days": "3"}, R + "operator_cert_renew_days must be a whole number"),
    ],
    ids=["pod-subnet-no-prefix", "service-host-bits", "subnets-overlap", "proxy-mode", "cert-life", "type"],
)
def test_each_value_check_of_the_one_task_refuses_naming_the_variable(
    tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    """The checks the role made in an assert task each, made in one value_checks task: each still refuses."""
    rc, out = run_validate(tmp_path, SERVER, **values)
    assert rc != 0
    assert named in out, out[-3000:]


def networks_module() -> ModuleType:
    path = ROOT / "roles/kubeadm_control_plane/filter_plugins/kubeadm_networks.py"
    spec = importlib.util.spec_from_file_location("kubeadm_networks", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_address_of_every_interface_is_read() -> None:
    facts = {k.removeprefix("ansible_"): v for k, v in with_interface(SERVER, "eno1", "10.1.0.5/16").items()}
    addresses = networks_module().node_ipv4_addresses(facts)
    assert {(a["interface"], a["address"]) for a in addresses} == {
        ("lo", "127.0.0.1/8"),
        ("eno1", "10.0.0.11/24"),
        ("eno1", "10.1.0.5/16"),
        ("ens2f0", "192.168.50.11/24"),
        ("ib0", "172.16.0.11/16"),
    }
