"""Verify what the kubernetes_node role converged (testinfra; run by molecule, or against the lab:
``pytest molecule/kubernetes_node/tests --hosts=ansible://k8s_cluster
--ansible-inventory=inventories/lab/hosts.yml --force-ansible --sudo``).

On the lab the kernel modules live in the lab modprobe's table, which the nodes' Python reads as
/proc/modules, and the sysctls are the values podman set for the node (docs/lab.md).
"""

import pytest

PACKAGE_VERSION = "1.36.3-1.1"
KUBE_PACKAGES = ("kubeadm", "kubelet", "kubectl")
# pinned and held at their own versions (the mirror has a newer build of each)
TOOL_PACKAGES = {"cri-tools": "1.36.0-1.1", "kubernetes-cni": "1.7.1-1.1"}
MODULES = ("overlay", "br_netfilter", "ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "nf_conntrack")
SYSCTLS = {
    "net.bridge.bridge-nf-call-iptables": "1",
    "net.bridge.bridge-nf-call-ip6tables": "1",
    "net.ipv4.ip_forward": "1",
}


@pytest.mark.parametrize("name", KUBE_PACKAGES)
def test_kube_package_pinned_and_held(host, name):
    assert host.package(name).version == PACKAGE_VERSION
    assert name in host.check_output("apt-mark showhold").split()
    # the mirror also has 1.36.4-1.1: the pin keeps 1.36.3-1.1
    policy = host.check_output(f"apt-cache policy {name}")
    assert f"Candidate: {PACKAGE_VERSION}" in policy


@pytest.mark.parametrize(("name", "version"), TOOL_PACKAGES.items())
def test_cri_tools_and_cni_pinned_and_held(host, name, version):
    assert host.package(name).version == version
    assert name in host.check_output("apt-mark showhold").split()
    assert f"Candidate: {version}" in host.check_output(f"apt-cache policy {name}")


def test_pkgs_k8s_io_source(host):
    source = host.file("/etc/apt/sources.list.d/kubernetes.sources")
    assert source.contains("/kubernetes/v1.36/deb/")
    assert source.contains("Signed-By:")


@pytest.mark.parametrize("tool", ("ipvsadm", "ipset", "conntrack"))
def test_ipvs_tools(host, tool):
    assert host.package(tool).is_installed


def test_modules_loaded_now(host):
    loaded = {
        line.split()[0]
        for line in host.check_output("python3 -c \"print(open('/proc/modules').read())\"").split("\n")
        if line.strip()
    }
    assert set(MODULES) <= loaded


def test_modules_loaded_at_boot(host):
    listed = set()
    for path in host.check_output("ls /etc/modules-load.d").split():
        listed |= {
            line.strip() for line in host.file(f"/etc/modules-load.d/{path}").content_string.splitlines()
        }
    assert set(MODULES) <= listed


def test_sysctls_now_and_at_boot(host):
    persisted = host.file("/etc/sysctl.d/90-kubernetes.conf").content_string
    for key, value in SYSCTLS.items():
        assert host.check_output(f"/usr/sbin/sysctl -n {key}") == value
        assert f"{key}={value}" in persisted.replace(" ", "")
