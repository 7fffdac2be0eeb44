#!/usr/bin/env bash
# Build the lab node image: Debian 12 (bookworm) with systemd, sshd, sudo and python3,
# standing in for a bare Ubuntu 22.04 server.
#
#   tests/lab/image/build_image.sh IMAGE_TAG INPUTS_HASH
#
# debootstrap (about 60 s from the Debian mirror) -> customise the tree -> podman import.
# The image carries the label llm-lab.inputs=<hash> so lab.sh knows when it is stale.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tag=${1:?image tag}
inputs_hash=${2:?inputs hash}
mirror=${LAB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d /var/tmp/llm-lab-rootfs.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs

# Everything the product roles may ask apt for on a Debian 12 node must be here: the lab
# nodes have no route to a Debian mirror (like an air-gapped site), only the lab mirror.
packages=(
  systemd systemd-sysv dbus openssh-server sudo
  python3 python3-venv python3-apt python3-debian
  kmod iproute2 iputils-ping procps less jq rsync curl ca-certificates gnupg
  chrony initramfs-tools unattended-upgrades lsb-release cron ethtool
  runc ipvsadm ipset conntrack
  python3-yaml
  openssh-client clamav clamav-freshclam
)
echo "lab-image: debootstrap bookworm from $mirror (about a minute)"
debootstrap --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" \
  bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -20 "$work/debootstrap.log" >&2
  echo "lab-image: debootstrap failed (full log above); is $mirror reachable?" >&2
  exit 1
}

echo "lab-image: customising the tree"
# No Debian source: the nodes only see the lab mirror, which the roles configure.
echo "# lab node: no Debian mirror (air-gapped); see docs/lab.md" >"$root/etc/apt/sources.list"
rm -f "$root"/var/lib/apt/lists/*_Packages "$root"/var/lib/apt/lists/*_Release* 2>/dev/null || true
cat >"$root/etc/hosts" <<'HOSTS'
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
HOSTS
# Host keys are made on each node's first boot, not shared by every node.
rm -f "$root"/etc/ssh/ssh_host_*
mkdir -p "$root/etc/systemd/system/ssh.service.d"
cat >"$root/etc/systemd/system/ssh.service.d/lab-hostkeys.conf" <<'UNIT'
[Service]
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
UNIT
chroot "$root" systemctl enable ssh.service >/dev/null 2>&1
# Units that cannot work in a container, masked so systemd reaches "running" (freshclam: no
# ClamAV mirror in reach; labctl installs the lab's own signature database, docs/lab.md).
for unit in systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
  systemd-modules-load.service sys-kernel-config.mount systemd-remount-fs.service \
  getty@tty1.service console-getty.service systemd-logind.service \
  clamav-freshclam.service; do
  chroot "$root" systemctl mask "$unit" >/dev/null 2>&1 || true
done
# Kernel stand-ins (docs/lab.md): this machine's kernel has no loadable modules and
# /proc/sys is read-only in the nodes, so modprobe keeps a module table that Python reads
# as /proc/modules, sysctl accepts writes of values the node already has, and a unit
# loads /etc/modules-load.d at boot in place of the masked systemd-modules-load.
kernel=$here/kernel
install -m 0755 "$kernel/modprobe" "$kernel/sysctl" "$kernel/lab-modules-load" "$root/usr/local/sbin/"
install -D -m 0644 "$kernel/modules.available" "$root/usr/local/lib/lab-kmod/modules.available"
install -m 0644 "$kernel/lab_proc_modules.py" "$kernel/lab-proc-modules.pth" "$root/usr/lib/python3/dist-packages/"
install -m 0644 "$kernel/lab-modules-load.service" "$root/etc/systemd/system/"
chroot "$root" systemctl enable lab-modules-load.service >/dev/null 2>&1
# No ip_vs in this kernel: Debian's ipvsadm is diverted and the stand-in lists the table the
# lab's kube-proxy stand-in writes (it execs the real one where /proc/net/ip_vs exists).
chroot "$root" dpkg-divert --local --rename --divert /sbin/ipvsadm.distrib --add /sbin/ipvsadm >/dev/null
install -m 0755 "$kernel/ipvsadm" "$root/sbin/ipvsadm"
# The bootstrap user, like the cloud image's default user on the real servers.
chroot "$root" useradd --create-home --shell /bin/bash labadmin
chroot "$root" passwd --lock labadmin >/dev/null
install -d -m 0700 -o 1000 -g 1000 "$root/home/labadmin/.ssh"
echo 'labadmin ALL=(ALL) NOPASSWD:ALL' >"$root/etc/sudoers.d/labadmin"
chmod 0440 "$root/etc/sudoers.d/labadmin"
: >"$root/etc/machine-id"
chroot "$root" apt-get clean

echo "lab-image: importing as $tag"
tar -C "$root" -c . | podman import --quiet \
  --change 'CMD ["/sbin/init"]' \
  --change 'STOPSIGNAL=SIGRTMIN+3' \
  --change "LABEL llm-lab.inputs=$inputs_hash" \
  - "$tag" >/dev/null
echo "lab-image: built $tag"
