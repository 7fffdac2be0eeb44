"""Verify what the containerd role converged (testinfra; run by molecule, or against the lab:
``pytest molecule/containerd/tests --hosts=ansible://k8s_cluster --ansible-inventory=inventories/lab/hosts.yml
--force-ansible --sudo``).

What the daemon runs with is read from the daemon's side (`containerd config dump`, `ctr`), parsed,
not grepped; the packages are checked pinned and held. The registry mirrors' hosts.toml files are parsed
with tomllib here, on the controller.
"""

import tomllib
from pathlib import Path

import yaml

CONTAINERD = ("containerd.io", "2.3.4-1~ubuntu.22.04~jammy", "2.3.4")
TOOLKIT = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
TOOLKIT_VERSION = "1.18.1-1"
PAUSE = "registry.k8s.io/pause:3.10.2"
CRI_RUNTIME = "io.containerd.cri.v1.runtime"
CRI_SOCKET = "unix:///run/containerd/containerd.sock"  # kubernetes_cri_socket (roles/kubernetes/vars)


def held(host):
    return set(host.check_output("apt-mark showhold").split())


def candidate(host, package):
    policy = host.check_output(f"apt-cache policy {package}")
    return next(line.split()[-1] for line in policy.splitlines() if "Candidate:" in line)


def running_config(host):
    return tomllib.loads(host.check_output("containerd config dump"))


def test_containerd_package_pinned_and_held(host):
    name, version, _ = CONTAINERD
    assert host.package(name).version == version
    assert name in held(host)
    assert candidate(host, name) == version


def test_real_containerd_daemon_answers(host):
    assert host.service("containerd").is_running
    assert host.service("containerd").is_enabled
    # client and server: the running daemon reports its version over its socket
    version = host.check_output("ctr version")
    # the release build's version string: "Version:  v2.3.4"
    assert version.count(f"Version:  v{CONTAINERD[2]}") == 2, version


def test_daemon_runs_with_systemd_cgroups_and_pause_image(host):
    config = running_config(host)
    assert config["version"] >= 3
    runtimes = config["plugins"][CRI_RUNTIME]["containerd"]["runtimes"]
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True
    assert config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == PAUSE
    assert not set(config.get("disabled_plugins", [])) & {"cri", "io.containerd.grpc.v1.cri", CRI_RUNTIME}


def test_cri_plugins_loaded(host):
    rows = {
        tuple(line.split()[:2]): line.split()[-1]
        for line in host.check_output("ctr plugins ls").splitlines()[1:]
    }
    assert rows[("io.containerd.cri.v1", "runtime")] == "ok"
    assert rows[("io.containerd.cri.v1", "images")] == "ok"
    assert rows[("io.containerd.grpc.v1", "cri")] == "ok"


def test_nvidia_runtime_configured_by_nvidia_ctk(host):
    runtimes = running_config(host)["plugins"][CRI_RUNTIME]["containerd"]["runtimes"]
    nvidia = runtimes["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert nvidia["options"]["SystemdCgroup"] is True
    # written by nvidia-ctk's drop-in, which config.toml imports (the role leaves the file to nvidia-ctk)
    assert host.file("/etc/containerd/conf.d/99-nvidia.toml").contains("nvidia-container-runtime")


def test_toolkit_pinned_and_held(host):
    for name in TOOLKIT:
        assert host.package(name).version == TOOLKIT_VERSION
        assert name in held(host)
        # the mirror also has 1.18.2-1: the pin keeps 1.18.1-1
        assert candidate(host, name) == TOOLKIT_VERSION


# --- containerd_registry_mirrors and containerd_restrict_oom_score_adj (molecule.yml's values) ---------

CERTS_D = "/etc/containerd/certs.d"
MARKER = ".managed-by-ansible-role-containerd"
MIRROR_CA = Path(__file__).resolve().parents[1] / "files" / "mirror-ca.crt"


def hosts_toml(host, registry):
    return tomllib.loads(host.file(f"{CERTS_D}/{registry}/hosts.toml").content_string)


def test_daemon_reads_the_registry_hosts_directory_and_restricts_oom_score_adj(host):
    config = running_config(host)
    assert config["plugins"]["io.containerd.cri.v1.images"]["registry"]["config_path"] == CERTS_D
    assert config["plugins"][CRI_RUNTIME]["restrict_oom_score_adj"] is True


def test_registry_k8s_io_goes_through_the_mirror_with_its_ca(host):
    parsed = hosts_toml(host, "registry.k8s.io")
    assert parsed["server"] == "https://registry.k8s.io"
    mirror = {"capabilities": ["pull", "resolve"], "ca": f"{CERTS_D}/registry.k8s.io/ca.crt"}
    assert parsed["host"] == {"https://lab-mirror:5000": mirror}
    ca = host.file(f"{CERTS_D}/registry.k8s.io/ca.crt")
    assert ca.mode == 0o644
    assert ca.content_string.strip() == MIRROR_CA.read_text().strip()
    # the CA the node got is a certificate its openssl reads
    assert "molecule containerd mirror test CA" in host.check_output(
        f"openssl x509 -noout -subject -in {CERTS_D}/registry.k8s.io/ca.crt"
    )


def test_docker_io_tries_both_mirrors_in_order_then_registry_1(host):
    parsed = hosts_toml(host, "docker.io")
    assert parsed["server"] == "https://registry-1.docker.io"
    assert list(parsed["host"]) == ["https://lab-mirror:5000", "https://lab-mirror-2:5000"]
    assert not host.file(f"{CERTS_D}/docker.io/ca.crt").exists


def test_only_the_roles_own_stale_directory_was_removed(host):
    # prepare.yml left a marked directory of a registry not in the list, and a site's own one
    assert not host.file(f"{CERTS_D}/old-mirror.example").exists
    assert host.file(f"{CERTS_D}/site.example/hosts.toml").exists
    assert not host.file(f"{CERTS_D}/site.example/{MARKER}").exists
    assert host.file(f"{CERTS_D}/registry.k8s.io/{MARKER}").exists
    assert host.file(f"{CERTS_D}/docker.io/{MARKER}").exists


def test_crictl_points_at_the_socket_the_daemon_serves(host):
    crictl = host.file("/etc/crictl.yaml")
    assert (crictl.user, crictl.group, crictl.mode) == ("root", "root", 0o644)
    # containerd 2.3 dumps its configuration as version 4: the gRPC address moved from [grpc] into its
    # plugin's table (roles/containerd/tasks/verify-containerd.yml reads both)
    config = running_config(host)
    grpc = config.get("grpc") or config["plugins"]["io.containerd.server.v1.grpc"]
    assert "unix://" + grpc["address"] == CRI_SOCKET
    assert yaml.safe_load(crictl.content_string) == {
        "runtime-endpoint": CRI_SOCKET,
        "image-endpoint": CRI_SOCKET,
        "timeout": 10,
    }
