#!/usr/bin/env bash
# Build the lab node image: Debian 12 (bookworm) with systemd, sshd, sudo and python3,
# standing in for a bare Ubuntu 22.04 server.
#
#   tests/lab/image/build_image.sh IMAGE_TAG INPUTS_HASH [PYTHON310_PREFIX] [BASE_TAG]
#
# debootstrap (about 60 s from the Debian mirror) -> BASE_TAG (plain Debian 12 with its python3 3.11: the
# base of the lab's application images) -> customise the tree -> podman import as IMAGE_TAG.
# The image carries the label llm-lab.inputs=<hash> so lab.sh knows when it is stale.
# PYTHON310_PREFIX: a CPython 3.10 (labctl.py finds pyenv's) that becomes the
# node's python3, as on Ubuntu 22.04; empty: the node keeps Debian's 3.11 (labctl.py says so loudly).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tag=${1:?image tag}
inputs_hash=${2:?inputs hash}
python310=${3:-}
base_tag=${4:-}
mirror=${LAB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d /var/tmp/llm-lab-rootfs.XXXXXX)
# an interrupted debootstrap leaves /proc (and more) mounted in the tree: unmount before removing it
cleanup() {
  awk -v root="$root" 'index($2, root) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l
  rm -rf "$work"
}
trap cleanup EXIT
root=$work/rootfs

# Everything the product roles may ask apt for on a Debian 12 node must be here: the lab
# nodes have no route to a Debian mirror (like an air-gapped site), only the lab mirror.
packages=(
  systemd systemd-sysv dbus openssh-server sudo
  python3 python3-venv python3-apt python3-debian
  kmod iproute2 iputils-ping procps less jq rsync curl ca-certificates gnupg
  chrony initramfs-tools unattended-upgrades lsb-release cron ethtool
  ipvsadm ipset conntrack iptables nftables
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

if [ -n "$base_tag" ]; then
  echo "lab-image: importing the plain Debian 12 tree as $base_tag"
  tar -C "$root" -c . | podman import --quiet --change "LABEL llm-lab.inputs=$inputs_hash" - "$base_tag" >/dev/null
fi

# Build-time-only Debian sources (the finished node has none): python-apt's source for the node's 3.10,
# and bullseye's rsync for the rrsync layout of Ubuntu 22.04 (below).
build_sources=$root/etc/apt/sources.list.d/lab-build.list
cp /etc/resolv.conf "$root/etc/resolv.conf"
printf '%s\n' "deb-src $mirror bookworm main" "deb $mirror bullseye main" >"$build_sources"
chroot "$root" apt-get -qq -o APT::Default-Release=bookworm update

if [ -n "$python310" ]; then
  py_version=$("$python310/bin/python3.10" -c 'import platform; print(platform.python_version())')
  echo "lab-image: CPython $py_version from $python310 as the node's python3 (Ubuntu 22.04's is 3.10)"
  # the interpreter, its standard library and headers; not its test suite, static library or the
  # packages pip put into this machine's copy
  tar -C "$python310" --exclude='lib/python3.10/test' --exclude='lib/python3.10/site-packages/*' \
    --exclude='lib/python3.10/config-3.10-x86_64-linux-gnu/*.a' -cf - bin/python3.10 lib include |
    tar -C "$root/usr/local" -xf -
  # the build's prefix is in its sysconfig data (include and library paths): the node's is /usr/local
  grep -rlF "$python310" "$root"/usr/local/lib/python3.10/_sysconfigdata_*.py \
    "$root/usr/local/lib/python3.10/config-3.10-x86_64-linux-gnu" "$root/usr/local/lib/pkgconfig" 2>/dev/null |
    xargs -r sed -i "s#$python310#/usr/local#g"
  rm -f "$root"/usr/local/lib/python3.10/__pycache__/_sysconfigdata_*.pyc
  chroot "$root" ldconfig
  # /usr/bin/python3 (Debian's points at 3.11) is the node's 3.10, the interpreter both inventories name;
  # Debian's 3.11 stays as /usr/bin/python3.11.
  chroot "$root" dpkg-divert --local --rename --divert /usr/bin/python3.debian --add /usr/bin/python3 >/dev/null
  ln -sf /usr/local/bin/python3.10 "$root/usr/bin/python3.10"
  ln -sf python3.10 "$root/usr/bin/python3"
  # Ubuntu's 3.10 reads the Debian packages' modules from /usr/lib/python3/dist-packages: so does this one
  echo /usr/lib/python3/dist-packages >"$root/usr/local/lib/python3.10/site-packages/00-debian-dist-packages.pth"
  # python3-apt (the apt modules' binding) is built for Debian's 3.11: build its extensions for 3.10 from
  # the same source version, as Ubuntu 22.04's python3-apt is built for its 3.10
  apt_version=$(chroot "$root" dpkg-query -W -f='${Version}' python3-apt)
  echo "lab-image: building python-apt $apt_version for Python 3.10"
  chroot "$root" apt-get -qq -o APT::Default-Release=bookworm install --no-install-recommends \
    g++ libapt-pkg-dev dpkg-dev >/dev/null
  mount -t proc proc "$root/proc"
  mount --bind /dev "$root/dev"
  chroot "$root" sh -ec "
    mkdir -p /tmp/python-apt && cd /tmp/python-apt
    apt-get -qq source --download-only python-apt=$apt_version >/dev/null 2>&1
    dpkg-source -x --no-check python-apt_*.dsc src >/dev/null
    /usr/local/bin/python3.10 -m venv /tmp/python-apt/venv
    cd src && DEBVER=$apt_version /tmp/python-apt/venv/bin/python setup.py -q build_ext >build.log 2>&1 \
      || { tail -30 build.log >&2; exit 1; }
    cp build/lib.*/apt_pkg.cpython-310-*.so build/lib.*/apt_inst.cpython-310-*.so /usr/lib/python3/dist-packages/
    cd / && rm -rf /tmp/python-apt" || { echo "lab-image: building python-apt for 3.10 failed" >&2; exit 1; }
  umount "$root/dev" "$root/proc"
  chroot "$root" apt-get -qq purge g++ libapt-pkg-dev dpkg-dev >/dev/null
  chroot "$root" apt-get -qq autoremove --purge >/dev/null
  chroot "$root" python3 -c 'import sys, apt, apt_pkg, debian.deb822; assert sys.version_info[:2] == (3, 10)'
fi

# Ubuntu 22.04's rsync 3.2.3 ships rrsync only as a compressed documentation copy (newer builds install
# /usr/bin/rrsync): the node gets that layout, with bullseye's rsync 3.2.3 script (the same release).
chroot "$root" sh -ec '
  cd /tmp && apt-get -qq download rsync/bullseye >/dev/null 2>&1
  mkdir -p /tmp/rsync-3.2.3 && dpkg-deb -x rsync_3.2.3*.deb /tmp/rsync-3.2.3
  mkdir -p /usr/lib/lab
  dpkg-divert --local --rename --divert /usr/lib/lab/rrsync.bookworm --add /usr/bin/rrsync >/dev/null
  mkdir -p /usr/share/doc/rsync/scripts
  gzip -9n </tmp/rsync-3.2.3/usr/share/rsync/scripts/rrsync >/usr/share/doc/rsync/scripts/rrsync.gz
  rm -rf /tmp/rsync-3.2.3 /tmp/rsync_*.deb'
rm -f "$build_sources"

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
# binfmt_misc is this machine's kernel table: a privileged node would register binary formats
# on the host, and its automount, triggered by several nodes booting at once, hung one node's
# boot for systemd's whole 90 s job timeout (CI of 2026-12-02). systemd-logind runs, as on a
# server: `shutdown -r` (what ansible.builtin.reboot runs) asks it, and fails where it is masked.
# A privileged node sees this machine's virtual consoles: logind must not take or spawn on them.
mkdir -p "$root/etc/systemd/logind.conf.d"
cat >"$root/etc/systemd/logind.conf.d/lab-no-consoles.conf" <<'CONF'
[Login]
NAutoVTs=0
ReserveVT=0
CONF
for unit in systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
  systemd-modules-load.service sys-kernel-config.mount systemd-remount-fs.service \
  getty@tty1.service console-getty.service \
  systemd-binfmt.service proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount \
  clamav-freshclam.service; do
  chroot "$root" systemctl mask "$unit" >/dev/null 2>&1 || true
done
# Kernel stand-ins (docs/lab.md): this machine's kernel has no loadable modules and
# /proc/sys is read-only in the nodes, so modprobe keeps a module table that Python reads
# as /proc/modules, sysctl accepts writes of values the node already has, and a unit
# loads /etc/modules-load.d at boot in place of the masked systemd-modules-load.
kernel=$here/kernel
install -m 0755 "$kernel/modprobe" "$kernel/sysctl" "$kernel/lab-modules-load" "$kernel/lab-proc-sys" \
  "$root/usr/local/sbin/"
install -D -m 0644 "$kernel/modules.available" "$root/usr/local/lib/lab-kmod/modules.available"
install -m 0644 "$kernel/lab_proc_modules.py" "$kernel/lab-proc-modules.pth" "$root/usr/lib/python3/dist-packages/"
# .pth files run only from a site directory: the 3.10's too
if [ -n "$python310" ]; then install -m 0644 "$kernel/lab-proc-modules.pth" "$root/usr/local/lib/python3.10/site-packages/"; fi
install -m 0644 "$kernel/lab-modules-load.service" "$kernel/lab-proc-sys.service" "$root/etc/systemd/system/"
chroot "$root" systemctl enable lab-modules-load.service lab-proc-sys.service >/dev/null 2>&1
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
