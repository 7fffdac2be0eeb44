"""Verify what the GPU stage converged (testinfra; run by molecule, or against the lab:
``pytest molecule/gpu_node/tests --hosts=ansible://gpu_nodes --ansible-inventory=inventories/lab/hosts.yml
--force-ansible --sudo``).

The "Must show" list of issue 4: nouveau, initramfs, pinned and held packages, unattended-upgrades,
the CUDA profile script, the GPU settings and the boot-time unit.
"""

import json

import pytest

DRIVER = "535.183.06"
BRANCH = "535"
# the headless set and what it pulls, every one at the pinned build and held
DRIVER_PACKAGES = [
    f"nvidia-headless-{BRANCH}",
    f"nvidia-headless-no-dkms-{BRANCH}",
    f"nvidia-utils-{BRANCH}",
    f"libnvidia-compute-{BRANCH}",
    f"libnvidia-cfg1-{BRANCH}",
    f"nvidia-compute-utils-{BRANCH}",
    f"nvidia-dkms-{BRANCH}",
    f"nvidia-kernel-common-{BRANCH}",
    f"nvidia-kernel-source-{BRANCH}",
    f"nvidia-firmware-{BRANCH}-{DRIVER}",
]
# a headless node: no display metapackage, no Xorg driver
DISPLAY_PACKAGES = [
    f"cuda-drivers-{BRANCH}",
    f"nvidia-driver-{BRANCH}",
    f"xserver-xorg-video-nvidia-{BRANCH}",
]
FABRIC_MANAGER = f"nvidia-fabricmanager-{BRANCH}"
TOOLKIT = ("cuda-toolkit-12-1", "12.1.1")
NVML_PYTHON = "/opt/nvidia-ml-py/bin/python3"


def held_packages(host):
    return set(host.check_output("apt-mark showhold").split())


# What molecule.yml asks for per node: mol-gpu-2 forces fabric manager on; mol-gpu-1 keeps "auto",
# which on the simulated PCIe A100s (NVLink bridges, no NVSwitch) must leave it off.
FABRIC_MANAGER_EXPECTED = {"mol-gpu-1": False, "mol-gpu-2": True}


def node_name(host):
    return host.check_output("hostname")


def test_nouveau_is_blacklisted_with_modeset_0(host):
    lines = host.file("/etc/modprobe.d/blacklist-nouveau.conf").content_string.splitlines()
    assert "blacklist nouveau" in lines
    assert "options nouveau modeset=0" in lines
    assert not host.package("xserver-xorg-video-nouveau").is_installed


def test_the_initramfs_was_rebuilt_by_the_handler(host):
    # Ansible logs every module invocation to the journal; the lab has no kernel
    # in /boot, so the rebuild itself leaves no image to inspect.
    journal = host.check_output("journalctl --no-pager -o cat -t ansible-ansible.legacy.command")
    assert "update-initramfs -u -k all" in journal


def test_reboot_is_marked_as_required(host):
    # the lab inventory sets nvidia_driver_reboot: false, so the role leaves the marker
    assert host.file("/var/run/reboot-required").exists


@pytest.mark.parametrize("package", DRIVER_PACKAGES)
def test_driver_package_is_at_the_pinned_version_and_held(host, package):
    pkg = host.package(package)
    assert pkg.is_installed
    assert pkg.version.startswith(f"{DRIVER}-")
    assert package in held_packages(host)


@pytest.mark.parametrize("package", DISPLAY_PACKAGES)
def test_no_display_driver_package_is_installed(host, package):
    assert not host.package(package).is_installed


def test_newer_driver_is_available_but_not_a_candidate(host):
    policy = host.check_output(f"apt-cache policy nvidia-headless-{BRANCH}")
    assert "535.216.03" in policy, "the lab mirror should offer the newer 535 release"
    candidate = next(line for line in policy.splitlines() if "Candidate:" in line)
    assert DRIVER in candidate


@pytest.mark.parametrize("metapackage", ["cuda", "cuda-drivers"])
def test_driver_pulling_metapackages_are_not_installable(host, metapackage):
    assert not host.package(metapackage).is_installed
    policy = host.check_output(f"apt-cache policy {metapackage}")
    assert "Candidate: (none)" in policy


def test_fabric_manager_is_there_exactly_where_expected(host):
    name = node_name(host)
    assert name in FABRIC_MANAGER_EXPECTED, f"no fabric manager expectation for {name}"
    package = host.package(FABRIC_MANAGER)
    if not FABRIC_MANAGER_EXPECTED[name]:
        assert not package.is_installed, f"{FABRIC_MANAGER} installed on {name}, which has no NVSwitch"
        return
    assert package.is_installed, f"{FABRIC_MANAGER} missing on {name}, where it is forced on"
    assert package.version.startswith(f"{DRIVER}-")
    assert FABRIC_MANAGER in held_packages(host)
    assert host.service("nvidia-fabricmanager").is_enabled
    assert host.service("nvidia-fabricmanager").is_running


def test_toolkit_is_pinned_held_and_reports_12_1(host):
    name, version = TOOLKIT
    assert host.package(name).version.startswith(f"{version}-")
    assert name in held_packages(host)
    assert "release 12.1," in host.check_output("/usr/local/cuda-12.1/bin/nvcc --version")


def test_nvidia_packages_are_excluded_from_unattended_upgrades(host):
    dump = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    for entry in ("nvidia-", "libnvidia-", "cuda-drivers", "cuda-"):
        assert f'"{entry}";' in dump, entry


def test_cuda_profile_script_puts_the_toolkit_on_the_paths(host):
    env = host.check_output("bash -lc 'echo $PATH; echo $LD_LIBRARY_PATH; command -v nvcc'").splitlines()
    assert "/usr/local/cuda-12.1/bin" in env[0].split(":")
    assert "/usr/local/cuda-12.1/lib64" in env[1].split(":")
    assert env[2] == "/usr/local/cuda-12.1/bin/nvcc"


def test_persistenced_is_enabled_and_running(host):
    service = host.service("nvidia-persistenced")
    assert service.is_enabled
    assert service.is_running


def test_nvidia_ml_py_is_installed_for_the_gpu_modules(host):
    host.run_expect([0], f"{NVML_PYTHON} -c 'import pynvml'")


def nvml_gpus(host):
    script = (
        "import json, pynvml as n; n.nvmlInit(); "
        "print(json.dumps([{'limit_w': n.nvmlDeviceGetPowerManagementLimit(h) // 1000, "
        "'persistence': n.nvmlDeviceGetPersistenceMode(h)} "
        "for h in (n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount()))]))"
    )
    return json.loads(host.check_output(f'{NVML_PYTHON} -c "{script}"'))


def test_every_gpu_is_capped_at_200_w_with_persistence_mode_on(host):
    gpus = nvml_gpus(host)
    assert len(gpus) == 4
    for index, gpu in enumerate(gpus):
        assert gpu == {"limit_w": 200, "persistence": 1}, f"GPU {index}"


def test_boot_time_unit_is_enabled_after_persistenced(host):
    unit = host.file("/etc/systemd/system/gpu-tuning.service").content_string
    assert "After=nvidia-persistenced.service" in unit
    assert "Type=oneshot" in unit
    assert host.service("gpu-tuning").is_enabled
    settings = json.loads(host.file("/etc/gpu-tuning.json").content_string)
    assert settings["power_limit_w"] == 200
    assert settings["persistence_mode"] is True


def test_boot_time_script_reapplies_a_drifted_power_limit(host):
    # what happens at boot: the unit's script puts a drifted GPU back
    host.run_expect([0], "fake-nvml power --gpu 1 --limit-w 180")
    assert nvml_gpus(host)[1]["limit_w"] == 180
    host.run_expect([0], "systemctl restart gpu-tuning.service")
    assert nvml_gpus(host)[1]["limit_w"] == 200
