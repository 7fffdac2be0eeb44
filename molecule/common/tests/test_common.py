"""Verify what the common role converged (testinfra, run by molecule)."""

import yaml

NODES = {"mol-common-1": "10.89.42.31", "mol-common-2": "10.89.42.32"}


HOSTS_BLOCK = "cluster nodes (managed by Ansible, role common)"


def test_hostname_is_the_inventory_name(host):
    # prepare.yml renamed the node "<name>-unnamed": only the role puts the name back
    assert host.run("hostname").stdout.strip() == host.backend.get_hostname()


def test_cloud_init_keeps_the_host_name_where_it_is_installed(host):
    # prepare.yml gave only mol-common-1 cloud-init's configuration directory
    dropin = host.file("/etc/cloud/cloud.cfg.d/99-llm-platform-hostname.cfg")
    if host.backend.get_hostname() == "mol-common-1":
        assert yaml.safe_load(dropin.content_string) == {"preserve_hostname": True}
        assert (dropin.user, dropin.group, dropin.mode) == ("root", "root", 0o644)
    else:
        assert not host.file("/etc/cloud").exists


def test_etc_hosts_block_lists_every_cluster_node(host):
    # read the file itself: getent would also answer through the lab network's DNS
    lines = host.file("/etc/hosts").content_string.splitlines()
    begin = lines.index(f"# BEGIN {HOSTS_BLOCK}")
    end = lines.index(f"# END {HOSTS_BLOCK}")
    assert [line.split() for line in lines[begin + 1 : end]] == [[ip, name] for name, ip in NODES.items()]


def test_base_packages_installed(host):
    for package in ("chrony", "rsync", "jq", "python3-apt", "unattended-upgrades"):
        assert host.package(package).is_installed, package


def test_chrony_uses_the_configured_servers_and_starts_at_boot(host):
    config = host.file("/etc/chrony/chrony.conf").content_string
    assert "pool ntp1.lab.invalid iburst" in config
    assert host.service("chrony").is_enabled


def test_the_swap_line_prepare_added_is_commented_out(host):
    lines = host.file("/etc/fstab").content_string.splitlines()
    assert "# /swap.img none swap sw 0 0  # swap off for kubelet (role common)" in lines
    for line in lines:
        fields = line.split()
        assert line.startswith("#") or len(fields) < 3 or fields[2] != "swap"


def test_ops_user_has_exactly_the_configured_key_and_sudo(host):
    ops = host.user("ops")
    assert ops.shell == "/bin/bash"
    keys = host.file("/home/ops/.ssh/authorized_keys").content_string.strip().splitlines()
    assert keys == [
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMolecule0000000000000000000000000000000000001 molecule-test"
    ]
    sudoers = host.file("/etc/sudoers.d/ops-ops")
    assert sudoers.mode == 0o440
    assert "NOPASSWD: ALL" in sudoers.content_string
    assert host.run("visudo -cf /etc/sudoers.d/ops-ops").rc == 0


def test_the_operator_who_left_is_removed(host):
    # prepare.yml created the account; the role's `state: absent` must remove it
    assert not host.user("formerop").exists
    assert not host.file("/etc/sudoers.d/ops-formerop").exists


def test_sshd_effective_config_is_hardened(host):
    effective = host.run("sshd -T").stdout.lower().splitlines()
    assert "permitrootlogin no" in effective
    assert "passwordauthentication no" in effective
    assert "kbdinteractiveauthentication no" in effective
    assert "maxauthtries 3" in effective
    assert "x11forwarding no" in effective
    # sshd -T prints one line per AllowGroups entry
    allow_groups = [line for line in effective if line.startswith("allowgroups ")]
    assert allow_groups == ["allowgroups root", "allowgroups sudo"]
    assert host.service("ssh").is_running
