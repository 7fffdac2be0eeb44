#!/usr/bin/env bash
# Make sure this machine has what the lab and the tests need; install it when we
# can (root with apt-get), otherwise say exactly what to install.
#
#   scripts/ensure-host-deps.sh
set -euo pipefail

# command -> Debian package that provides it
declare -A needs=(
  [podman]=podman
  [runc]=runc
  [debootstrap]=debootstrap
  [apt-ftparchive]=apt-utils
  [dpkg-deb]=dpkg
  [gpg]=gnupg
  [ssh]=openssh-client
  [ssh-keygen]=openssh-client
  [iptables]=iptables
  [aardvark-dns]=aardvark-dns
  [make]=make
  # model_admission's ClamAV gate (unit tests scan with a database they build)
  [clamscan]=clamav
  # monitoring role tests: promtool check/test rules and config, amtool check-config
  [promtool]=prometheus
  [amtool]=prometheus-alertmanager
  # the lab's registry CA and certificates (tests/lab/labctl.py)
  [openssl]=openssl
  # runc is built with cgo (its nsenter is C) and seccomp (tests/lab/gobuild): gcc, pkg-config, libseccomp-dev
  [gcc]=gcc
  [pkg-config]=pkg-config
)
# packages whose Debian postinst enables and starts a daemon the tests do not want (it would hold :9090 / :9093)
daemons=(prometheus prometheus-alertmanager)
missing=()
for cmd in "${!needs[@]}"; do
  if ! command -v "$cmd" >/dev/null 2>&1 && ! [ -x "/usr/lib/podman/$cmd" ]; then
    missing+=("${needs[$cmd]}")
  fi
done
if [ ! -f /usr/include/seccomp.h ]; then
  missing+=(libseccomp-dev)
fi
# The lab's Kubernetes, containerd, etcd, ... are built from their Go modules (tests/lab/gobuild): Go 1.26 or
# newer, which Debian 12 does not package (its golang is 1.19).
go_version=$(go env GOVERSION 2>/dev/null || true)
if ! printf '%s\n' "$go_version" | grep -Eq '^go1\.(2[6-9]|[3-9][0-9])'; then
  echo "host-deps: the lab builds Kubernetes from its Go modules and needs Go 1.26 or newer on PATH" \
    "(found: ${go_version:-none}); install it from https://go.dev/dl/ (tar -C /usr/local -xzf go1.26.*.tar.gz)" >&2
  exit 1
fi
# python3 -m venv needs ensurepip, which Debian ships separately.
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "host-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  for unit in "${daemons[@]}"; do
    if printf '%s\n' "${missing[@]}" | grep -qx "$unit" && command -v systemctl >/dev/null 2>&1; then
      systemctl disable --now "$unit.service" >/dev/null 2>&1 || true
    fi
  done
  echo "host-deps: installed ${missing[*]}"
else
  echo "host-deps: missing: ${missing[*]}" >&2
  echo "host-deps: install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
