#!/usr/bin/env python3
"""Bring the simulated three-node A100 lab up, repair it, show it, or destroy it.

    labctl.py up        image (if missing or stale), mirror, network, nodes; repairs what it finds
    labctl.py status    one line per lab container
    labctl.py destroy   containers, network, image and the lab state (.lab): nothing left behind
    labctl.py replace-nodes   the three nodes as new servers (containers and disks removed), then up
    labctl.py image [--rebuild]
    labctl.py mirror

Every podman call uses tests/lab/containers.conf through CONTAINERS_CONF, so the
host's /etc/containers stays untouched. See docs/lab.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import hashlib
import io
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import images  # beside this file: the images the lab's cluster pulls
import labstate  # beside this file: where the lab's state lives
import yaml

REPO = Path(__file__).resolve().parents[2]
LAB_SRC = REPO / "tests" / "lab"
STATE = labstate.STATE  # per machine, reached as .lab (tests/lab/labstate.py)
IMAGE = "localhost/llm-lab-node:bookworm"
# Plain Debian 12 (its python3 is 3.11), made by the same build: the base of the lab's application images
# (the gateway), as production builds them on a slim Debian 12 Python image.
BASE_IMAGE = "localhost/llm-lab-base:bookworm"
NETWORK = "llmlab"
SUBNET = "10.89.42.0/24"
MIRROR_NAME = "lab-mirror"
MIRROR_IP = "10.89.42.2"
LABEL = "llm-lab"
SSH_KEY = STATE / "ssh" / "id_ed25519"
GPU_SHAPE = "a100-pcie-40gb-x4"
# What a node needs to boot systemd, given by hand and not through podman's systemd mode (--systemd=always).
# On this cgroup v1 (hybrid) host, podman 4.3's systemd mode bind-mounts the name=systemd hierarchy at its
# root over the node's own (a node's mountinfo shows its root as `/../..`), so the three nodes' systemds
# shared one /system.slice and one /kubepods.slice there. A node stopping (its container removed: a replaced
# worker) then stopped and removed the cgroups the other nodes' containerd and pods ran in, and runc refused
# every new container on them ("create mountpoint for /sys/fs/cgroup/systemd mount: ... no such file or
# directory"): etcd and the API server could not restart. Without that mode, runc mounts the hierarchy at the
# node's own cgroup (the root of its cgroup namespace), as it does every other controller, and each node's
# systemd owns its subtree alone. The rest of what the mode gives: tmpfs on /run, /run/lock, /tmp and
# /var/log/journal, and `container=podman`, by which systemd knows it runs in a container (its stop signal,
# SIGRTMIN+3, is the image's STOPSIGNAL).
SYSTEMD_MODE_ARGS = (
    "--systemd=false",
    "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp", "--tmpfs", "/var/log/journal",
    "-e", "container=podman",
)  # fmt: skip


@dataclass(frozen=True)
class Node:
    name: str
    ip: str
    ssh_port: int


NODES = (
    Node("gpu-node-1", "10.89.42.11", 2201),
    Node("gpu-node-2", "10.89.42.12", 2202),
    Node("gpu-node-3", "10.89.42.13", 2203),
)


def shown(path: Path) -> str:
    """A path as messages name it: relative to the checkout when inside it, or inside the state directory
    that the checkout's .lab links to (.lab/ssh_config)."""
    if path.is_relative_to(REPO):
        return str(path.relative_to(REPO))
    if labstate.LINK.is_symlink() and path.is_relative_to(STATE) and labstate.LINK.resolve() == STATE:
        return str(Path(".lab") / path.relative_to(STATE))
    return str(path)


def log(message: str) -> None:
    print(f"lab: {message}", flush=True)


def podman(*args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(LAB_SRC / "containers.conf"))
    result = subprocess.run(["podman", *args], env=env, text=True, capture_output=capture)
    if check and result.returncode != 0:
        raise LabError(f"podman {' '.join(args[:3])} ... failed: {(result.stderr or '').strip()}")
    return result


class LabError(RuntimeError):
    pass


def digest(paths: list[Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for path in sorted(paths):
        h.update(str(path.relative_to(REPO)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


# The servers run Ubuntu 22.04, whose python3 is 3.10: the nodes' python3 (and every venv the roles make
# from it) is a CPython 3.10 copied from this machine (a pyenv build, as the build machines carry), so
# node-side code newer than 3.10 fails on the lab first. LAB_PYTHON310 names its prefix explicitly.
NODE_PYTHON = "3.10"


def find_python310() -> tuple[Path, str] | None:
    """(prefix, version) of a CPython 3.10 on this machine (pyenv's, or LAB_PYTHON310), or None: one probe
    each candidate, which also gives its version."""
    candidates: list[Path] = []
    if os.environ.get("LAB_PYTHON310"):
        candidates.append(Path(os.environ["LAB_PYTHON310"]))
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted((pyenv_root / "versions").glob(f"{NODE_PYTHON}.*"), reverse=True)
    for prefix in candidates:
        python = prefix / "bin" / f"python{NODE_PYTHON}"
        if not python.is_file():
            continue
        probe = subprocess.run(
            [str(python), "-c",
             "import platform, sys, ensurepip, venv; "
             "print(sys.version_info[:2] == (3, 10), platform.python_version(), sys.prefix)"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        fields = probe.stdout.strip().split(" ", 2)
        usable = probe.returncode == 0 and len(fields) == 3 and fields[0] == "True"
        if usable and Path(fields[2]) == prefix.resolve():
            return prefix.resolve(), fields[1]
    return None


@functools.cache
def node_python() -> tuple[Path | None, str]:
    """(prefix, version) of the nodes' python3: a 3.10 found here, else the image's own (Debian's 3.11).
    CI (CI=true) refuses the fallback: node-side code must be proven on 3.10."""
    found = find_python310()
    if found is not None:
        return found
    message = (
        f"no CPython {NODE_PYTHON} on this machine (looked at $LAB_PYTHON310 and "
        f"~/.pyenv/versions/{NODE_PYTHON}.*): the lab nodes fall back to Debian's Python 3.11, so node-side "
        f"code is NOT proven on Ubuntu 22.04's 3.10. Install one (`pyenv install {NODE_PYTHON}`), or set "
        "LAB_PYTHON310=<its prefix>."
    )
    if os.environ.get("CI") == "true":
        raise LabError(message)
    log(f"WARNING: {message}")
    return None, "3.11"


def image_inputs_hash() -> str:
    _, python_version = node_python()
    return digest(
        [
            LAB_SRC / "image" / "build_image.sh",
            *sorted(p for p in (LAB_SRC / "image" / "kernel").iterdir() if p.is_file()),
        ],
        extra=f"python {python_version}",
    )


def image_label(name: str, label: str = "llm-lab.inputs") -> str | None:
    """A label of a local image ("" when it has none), or None when podman has no such image: from the one
    `podman images` listing of every local image (images.local_images), which each build here clears."""
    labels = images.local_image(name, "Labels")
    if labels is None and images.local_image(name, "Id") is None:
        return None
    return (labels or {}).get(label, "")


def image_digest(name: str) -> str:
    """A local image's digest (the listing's, as `podman image inspect --format {{.Digest}}` gives it)."""
    found = images.local_image(name, "Digest")
    if not found:
        raise LabError(f"podman has no image {name} (podman images)")
    return found


def ensure_image(rebuild: bool = False) -> None:
    wanted = image_inputs_hash()
    current = image_label(IMAGE)
    if current == wanted and not rebuild:
        log(f"image {IMAGE} is current ({wanted})")
        return
    reason = "rebuild asked" if rebuild else ("missing" if current is None else "its build inputs changed")
    log(f"building image {IMAGE} ({reason})")
    env = dict(
        os.environ, CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF", str(LAB_SRC / "containers.conf"))
    )
    prefix, python_version = node_python()
    log(f"the nodes' python3: {python_version}" + (f" (from {prefix})" if prefix else " (Debian's)"))
    subprocess.run(
        [str(LAB_SRC / "image" / "build_image.sh"), IMAGE, wanted, str(prefix or ""), BASE_IMAGE],
        check=True,
        env=env,
    )
    images.local_images.cache_clear()  # the listing is read again: the new image and its label
    # the build it replaced is left untagged: drop it (containers still using it keep it)
    podman("image", "prune", "-f", "--filter", "label=llm-lab.inputs", check=False)


GATEWAY_IMAGE = "localhost/llm-gateway:0.1.0"
# where inventories/lab has the gateway's pods pull it from: the lab registry as the site's registry
GATEWAY_REGISTRY_REF = "lab-mirror:5000/llm-platform/llm-gateway:0.1.0"
# The vLLM simulator, under the name of the vLLM image the product deploys (roles/vllm_serving's defaults)
VLLM_SIM_IMAGE = "localhost/llm-lab-vllm-sim:0.4.2"


def vllm_image_ref() -> str:
    defaults = yaml.safe_load((REPO / "roles" / "vllm_serving" / "defaults" / "main.yml").read_text())
    return f"{defaults['vllm_serving_image_repository']}:{defaults['vllm_serving_image_tag']}"


# llm_gateway_image_digest of inventories/lab: the digest of the gateway image built here
GATEWAY_DIGEST_FILE = STATE / "llm-gateway-image.digest"


def ensure_wheel_image(local: str, containerfile: Path, projects: list[Path], label: str, what: str) -> None:
    """An image built with podman from CONTAINERFILE on the lab's plain Debian 12 image (pinned by digest),
    installing wheels of PROJECTS built here (no package index in the build); rebuilt when their sources or
    the base change."""
    base = image_digest(BASE_IMAGE)
    inputs = [containerfile]
    for project in projects:
        inputs += [project / "pyproject.toml", *sorted((project / "src").rglob("*.py"))]
    wanted = digest(inputs, extra=base)
    if image_label(local, label) == wanted:
        return
    log(f"building image {local}: {what} ({shown(containerfile)}, base {BASE_IMAGE}@{base[:19]})")
    wheels = STATE / "wheels" / local.rsplit("/", 1)[-1].split(":")[0]
    subprocess.run(["rm", "-rf", str(wheels)], check=True)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", *map(str, projects), "-w", str(wheels)],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        raise LabError(
            f"pip wheel {' '.join(map(str, projects))} failed: {built.stdout[-1500:]}{built.stderr[-1500:]}"
        )
    podman(
        "build", "-q", "-f", str(containerfile), "--label", f"{label}={wanted}",
        "--build-arg", f"BASE_IMAGE={BASE_IMAGE.rsplit(':', 1)[0]}@{base}",
        "-t", local, str(wheels),
    )  # fmt: skip
    images.local_images.cache_clear()


def ensure_gateway_image() -> None:
    """The gateway image from serve/Containerfile; writes its local digest (the canary tests run it)."""
    serve = REPO / "serve"
    ensure_wheel_image(
        GATEWAY_IMAGE, serve / "Containerfile", [serve], "llm-lab.gateway-inputs", "the gateway"
    )
    gateway_digest = image_digest(GATEWAY_IMAGE)
    GATEWAY_DIGEST_FILE.write_text(gateway_digest + "\n")
    log(f"image {GATEWAY_IMAGE}@{gateway_digest} ({shown(GATEWAY_DIGEST_FILE)})")


def ensure_vllm_sim_image() -> None:
    """The vLLM simulator image (serve/tools/Containerfile.lab): the lab's stand-in for vLLM's image."""
    serve = REPO / "serve"
    ensure_wheel_image(
        VLLM_SIM_IMAGE, serve / "tools" / "Containerfile.lab", [serve, serve / "tools"],
        "llm-lab.vllm-sim-inputs",
        "STAND-IN for vLLM: 0.4.2's command line and start-up checks, then the simulator",
    )  # fmt: skip


def ensure_ssh_key() -> None:
    if SSH_KEY.exists():
        return
    SSH_KEY.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "llm-lab", "-f", str(SSH_KEY)], check=True
    )
    log(f"created the lab SSH key {shown(SSH_KEY)}")


def ensure_network() -> None:
    # one inspect: it fails where the network does not exist (what `podman network exists` asked first)
    found = podman(
        "network", "inspect", NETWORK, "--format", "{{range .Subnets}}{{.Subnet}} {{end}}", check=False
    )
    if found.returncode == 0:
        subnets = found.stdout
        if SUBNET in subnets.split():
            return
        log(f"network {NETWORK} has the wrong subnet ({subnets.strip()}); recreating it")
        remove_containers()
        podman("network", "rm", "-f", NETWORK)
    podman("network", "create", "--subnet", SUBNET, "--label", LABEL, NETWORK)
    log(f"created network {NETWORK} ({SUBNET})")


def cluster_networks() -> list[str]:
    """The cluster's own networks, the pods' and the Services' (role kubeadm_control_plane's defaults, which
    the lab inventory keeps)."""
    role = REPO / "roles" / "kubeadm_control_plane"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    return [defaults[f"kubeadm_control_plane_{kind}_subnet"] for kind in ("pod", "service")]


def ensure_cluster_networks_unrouted() -> None:
    """A site's routers have no route to the cluster's own networks: a packet a node sends there without a
    route of its own (while it boots or shuts down, before or after its pod routes) is answered "unreachable".
    This machine, the nodes' gateway, would send it on to its default route, where this sandbox's HTTP proxy
    answers any connection (with a 404): an unreachable route here for each network, as on a site."""
    for network in cluster_networks():
        found = subprocess.run(
            ["ip", "route", "show", "exact", network], capture_output=True, text=True, check=True
        ).stdout.split()
        if found[:2] == ["unreachable", network]:
            continue
        if found:
            raise LabError(
                f"this machine has a route for {network}, the cluster's network ({' '.join(found)}): the lab "
                "would replace it with an unreachable one. Remove it, or give the lab's cluster another "
                "network in roles/kubeadm_control_plane/defaults/main.yml"
            )
        subprocess.run(["ip", "route", "add", "unreachable", network], check=True)


# the lab network's DNS server (the nodes resolve lab-mirror and each other through it): podman's
# aardvark-dns, one per machine, started by netavark with the first container of a network with DNS
AARDVARK_PID = Path("/run/containers/networks/aardvark-dns/aardvark.pid")


def aardvark_alive() -> bool:
    try:
        pid = int(AARDVARK_PID.read_text().strip())
        return Path(f"/proc/{pid}/comm").read_text().strip() == "aardvark-dns"
    except (OSError, ValueError):
        return False


def ensure_network_dns(resolved: dict[str, bool] | None = None, timeout_s: float = 20) -> None:
    """Every node resolves the mirror. aardvark-dns dies with the session that started it, and its pid file
    stays: netavark then signals that pid (dead, or another process's by now) instead of starting a new one
    when the containers start again, and the nodes' apt, pulls and joins fail on names. Started again here
    (the stale pid file removed, `podman network reload`), then checked from every node. RESOLVED: node ->
    whether it resolved the mirror just now (bring_up_node asks in the exec it makes anyway)."""

    def unresolved() -> list[str]:
        return [
            node.name
            for node in NODES
            if podman("exec", node.name, "getent", "hosts", MIRROR_NAME, check=False).returncode != 0
        ]

    if resolved is not None and set(resolved) == {node.name for node in NODES}:
        missing = [name for name, found in resolved.items() if not found]
    else:
        missing = unresolved()
    if not missing:
        return
    log(
        f"{', '.join(missing)}: {MIRROR_NAME} does not resolve (aardvark-dns, the lab network's DNS, is "
        "gone); starting it again"
    )
    if not aardvark_alive():
        AARDVARK_PID.unlink(missing_ok=True)
    podman("network", "reload", "--all")
    deadline = time.monotonic() + timeout_s
    while (missing := unresolved()) and time.monotonic() < deadline:
        time.sleep(1)
    if missing:
        raise LabError(
            f"{', '.join(missing)}: {MIRROR_NAME} does not resolve after `podman network reload --all` "
            f"(aardvark-dns: {AARDVARK_PID}); try: podman exec {missing[0]} getent hosts {MIRROR_NAME}"
        )


# The kubelet's default hard eviction thresholds on the disk of its images (imagefs.available<15%) and of
# its pods (nodefs.available<10%), both percentages of the filesystem's size. The lab nodes keep both on the
# host's disk (podman's storage: the nodes' root filesystems and containerd volumes), which they share with
# everything else on the machine: below 15% free, every node goes DiskPressure, its kubelet evicts the pods
# and the scheduler places none (seen in CI: the converge then failed on pods that never became ready).
KUBELET_IMAGEFS_AVAILABLE = 0.15
# what a `make test` adds on top (a fresh clone with its two venvs, the nodes' logs and pulled images)
LAB_DISK_MARGIN = 6 * 2**30


def disk_headroom() -> tuple[int, int, str]:
    """(bytes free to the kubelet, bytes its imagefs threshold plus the margin needs, podman's storage)."""
    root = podman("info", "--format", "{{.Store.GraphRoot}}").stdout.strip()
    stat = os.statvfs(root)
    needed = int(stat.f_blocks * stat.f_frsize * KUBELET_IMAGEFS_AVAILABLE) + LAB_DISK_MARGIN
    return stat.f_bavail * stat.f_frsize, needed, root


def ensure_disk_headroom() -> None:
    """Refuse to start the lab on a disk the kubelets would evict from: free space above their 15% threshold
    plus what a test run writes. Old builds of the lab's images (untagged) are removed first."""
    free, needed, root = disk_headroom()
    if free >= needed:
        return
    for label in ("llm-lab.inputs", images.LABEL):
        podman("image", "prune", "-f", "--filter", f"label={label}", check=False)
    free, needed, root = disk_headroom()
    if free < needed:
        gib = 2**30
        raise LabError(
            f"the disk of {root} has {free / gib:.1f} GiB free: the lab needs {needed / gib:.1f} GiB (the "
            f"kubelet's imagefs.available threshold, {KUBELET_IMAGEFS_AVAILABLE:.0%} of the disk, plus "
            f"{LAB_DISK_MARGIN / gib:.0f} GiB for a test run), or every node goes DiskPressure and its pods "
            "are evicted; free space (old checkouts, `podman image prune`, Go's build cache: `go clean "
            "-cache`; docs/lab.md, Troubleshooting) and run it again"
        )
    log(f"disk: {free / 2**30:.1f} GiB free, old lab image builds removed")


def mirror_inputs() -> list[Path]:
    files = [p for p in (LAB_SRC / "mirror").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    # the model tools' pinned wheels are served by the mirror's PEP 503 index; the kube and containerd.io
    # packages carry the binaries tests/lab/gobuild builds from the pins of its go.mod files
    gobuild = [LAB_SRC / "gobuild" / "build.py", *sorted((LAB_SRC / "gobuild").glob("*/go.*"))]
    client = REPO / "roles" / "kubernetes_api_client" / "defaults" / "main.yml"  # the kubernetes client's pin
    return [
        *files,
        LAB_SRC / "fake_nvml" / "pynvml.py",
        LAB_SRC / "nvidia" / "nvidia_container_runtime.py",  # the toolkit package carries it
        REPO / "module_utils" / "model_tools.py",
        client,
        LAB_SRC / "upstream_manifests.py",  # which upstream manifests the mirror serves, and their pins
        *gobuild,
    ]


def ensure_mirror_content() -> None:
    wanted = digest(mirror_inputs())
    stamp = STATE / "mirror" / "inputs"
    if stamp.exists() and stamp.read_text() == wanted and (STATE / "mirror" / "www").is_dir():
        return
    log("building the mirror's stand-in packages")
    subprocess.run(
        [
            sys.executable,
            str(LAB_SRC / "mirror" / "build_mirror.py"),
            str(STATE / "mirror" / "www"),
            str(STATE / "gnupg"),
        ],
        check=True,
    )
    stamp.write_text(wanted)


# container_state's answers for containers read together (prefetch_container_states), each used once
PREFETCHED_STATES: dict[str, dict] = {}


def prefetch_container_states(names: list[str]) -> None:
    """One `podman container inspect` of NAMES instead of one each (~0.1 s a podman call): container_state
    answers each name from it once. Where one is missing (the inspect fails), nothing is kept and each is
    inspected alone, as before."""
    result = podman("container", "inspect", *names, check=False)
    if result.returncode != 0:
        return
    try:
        found = {record["Name"].lstrip("/"): record for record in json.loads(result.stdout)}
    except (ValueError, KeyError, TypeError, AttributeError):
        return
    if set(found) == set(names):
        PREFETCHED_STATES.update(found)


def container_state(name: str) -> dict | None:
    if (prefetched := PREFETCHED_STATES.pop(name, None)) is not None:
        return prefetched
    result = podman("container", "inspect", name, check=False)
    if result.returncode != 0:
        return None
    return json.loads(result.stdout)[0]


def process_alive(pid: int) -> bool:
    """True for a live process; False for none, or a zombie nobody reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def is_orphaned(state: dict) -> bool:
    """podman records it as running, but its conmon or its init is dead (killed with the session)."""
    status = state["State"]["Status"]
    if status == "stopping":
        return True
    if status != "running":
        return False
    pids = [state["State"].get("ConmonPid") or 0, state["State"].get("Pid") or 0]
    return any(pid > 0 and not process_alive(pid) for pid in pids)


# where conmon writes a container's exit code for podman (podman's engine tmp_dir for root, /run/libpod)
PODMAN_EXITS = Path("/run/libpod/exits")


def record_exit(state: dict) -> None:
    """Do what the killed conmon did not: kill what is left of the container's processes and write its exit
    file (128 + SIGKILL), so podman records it exited."""
    pid = state["State"].get("Pid") or 0
    if pid > 0 and process_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if PODMAN_EXITS.is_dir():
        (PODMAN_EXITS / state["Id"]).write_text("137")


def node_volume(name: str) -> str:
    """The volume holding a node's /var/lib/containerd: its disk, gone with the node."""
    return f"llm-lab-{name}-containerd"


def force_remove(name: str) -> None:
    """rm -f, tolerating podman noticing the dead container half-way ("container not running"); a node's
    disk (its containerd volume) goes with it, as a replaced server comes with empty disks."""
    PREFETCHED_STATES.pop(name, None)
    for _ in range(3):
        podman("rm", "-f", "-t", "2", name, check=False)
        if container_state(name) is None:
            podman("volume", "rm", "-f", node_volume(name), check=False)
            return
        time.sleep(1)
    raise LabError(f"{name}: could not remove the container; try: podman rm -f {name}")


def ensure_container(name: str, config_key: str, run_args: list[str]) -> bool:
    """Create, start or recreate one container; True when it had to be (re)created."""
    inputs = config_key + "\0".join(run_args) + image_inputs_hash()
    config = hashlib.sha256(inputs.encode()).hexdigest()[:16]
    state = container_state(name)
    if state is not None and state["Config"]["Labels"].get("llm-lab.config") != config:
        log(f"{name}: made with another lab configuration; recreating it")
        force_remove(name)
        state = None
    if state is not None and is_orphaned(state):
        # podman still records it as running, but its processes were killed with the session that started
        # them, conmon included: conmon never wrote the exit file podman waits for, so podman can neither
        # stop nor start it. Written here, podman records it exited and starts it again, disk kept (a server
        # back from a power cut); where that fails, it is recreated below.
        log(f"{name}: its processes are gone but podman says {state['State']['Status']!r}; starting it again")
        record_exit(state)
        state = container_state(name)
    if state is None:
        podman(
            "run",
            "-d",
            "--name",
            name,
            "--label",
            f"{LABEL}=1",
            "--label",
            f"llm-lab.config={config}",
            *run_args,
        )
        log(f"{name}: created")
        return True
    if not state["State"]["Running"]:
        log(f"{name}: was {state['State']['Status']}; starting it")
        if podman("start", name, check=False).returncode != 0:
            log(f"{name}: would not start; recreating it")
            force_remove(name)
            return ensure_container(name, config_key, run_args)
    return False


REGISTRY_DIR = STATE / "registry"
REGISTRY_PORT = 5000


def openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LabError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def ensure_registry_pki() -> None:
    """The lab registry's CA and server certificate (lab-mirror, 10.89.42.2), made once; nodes trust its CA
    through containerd's registry mirror configuration (inventories/lab: containerd_registry_mirrors)."""
    directory = REGISTRY_DIR
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "storage").mkdir(exist_ok=True)
    ca, key, cert = directory / "ca.crt", directory / "server.key", directory / "server.crt"
    if not (ca.is_file() and cert.is_file() and key.is_file()):
        log("making the lab registry's CA and TLS certificate (.lab/registry)")
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(directory / "ca.key"),
                "-out", str(ca), "-days", "3650", "-subj", "/CN=llm-lab registry CA")  # fmt: skip
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                "-out", str(directory / "server.csr"), "-subj", f"/CN={MIRROR_NAME}")  # fmt: skip
        extensions = directory / "server.ext"
        extensions.write_text(
            f"subjectAltName=DNS:{MIRROR_NAME},IP:{MIRROR_IP}\nbasicConstraints=CA:FALSE\n"
            "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        )
        openssl("x509", "-req", "-in", str(directory / "server.csr"), "-CA", str(ca), "-CAkey",
                str(directory / "ca.key"), "-CAcreateserial", "-days", "3650", "-out", str(cert),
                "-extfile", str(extensions))  # fmt: skip
    (directory / "config.yml").write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        "storage:\n  filesystem: {rootdirectory: /srv/registry/storage}\n  delete: {enabled: true}\n"
        f"http:\n  addr: 0.0.0.0:{REGISTRY_PORT}\n"
        "  tls: {certificate: /srv/registry/server.crt, key: /srv/registry/server.key}\n"
    )


def wait_for_registry(timeout_s: float = 60) -> None:
    context = ssl.create_default_context(cafile=str(REGISTRY_DIR / "ca.crt"))
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(
                f"https://{MIRROR_IP}:{REGISTRY_PORT}/v2/", context=context, timeout=5
            ):
                return
        except (OSError, urllib.error.URLError) as err:
            last = str(err)
        time.sleep(1)
    raise LabError(
        f"the lab registry https://{MIRROR_IP}:{REGISTRY_PORT}/v2/ no answer in {timeout_s:.0f}s ({last});"
        f" its log: .lab/registry/registry.log"
    )


def ensure_go_builds() -> None:
    """Every component tests/lab/gobuild builds, in its cache (a no-op when there). The mirror's packages
    (kept in STATE, rebuilt only when their inputs change) carry some of these binaries: a Go cache emptied
    under a current mirror is filled again here, and the builds are reproducible, so the nodes' binaries
    still match the cache byte for byte (test_real_kubernetes_on_lab.py)."""
    for component in images.gobuild.COMPONENTS:
        go_build(component.name)


def ensure_mirror() -> None:
    ensure_go_builds()
    ensure_mirror_content()
    ensure_registry_pki()
    registry = go_build("registry")
    ensure_container(
        MIRROR_NAME,
        "mirror",
        [
            "--hostname", MIRROR_NAME, "--network", NETWORK, "--ip", MIRROR_IP,
            "-v", f"{STATE / 'mirror'}:/srv/mirror:ro",
            "-v", f"{REGISTRY_DIR}:/srv/registry",
            "-v", f"{registry}:/opt/registry:ro",
            IMAGE,
            # the apt repositories and PyPI index on :8080, distribution's registry (TLS) on :5000
            "sh", "-c",
            "/opt/registry/registry serve /srv/registry/config.yml >>/srv/registry/registry.log 2>&1 & "
            "exec python3 -m http.server 8080 --bind 0.0.0.0 --directory /srv/mirror/www",
        ],
    )  # fmt: skip
    wait_for_registry()


def go_build(component: str) -> Path:
    """The directory of a component's binaries (tests/lab/gobuild/build.py; built once per pin)."""
    try:
        return images.gobuild.build(images.gobuild.BY_NAME[component])
    except images.gobuild.BuildError as err:
        raise LabError(str(err)) from err


def ensure_images() -> None:
    """Every image the lab's cluster pulls, built and pushed to the lab registry (tests/lab/images.py)."""
    try:
        # the gateway, built from serve/Containerfile, goes to the lab registry standing in for the site's own
        digests = images.ensure_all(
            {
                GATEWAY_REGISTRY_REF: (GATEWAY_IMAGE, "llm_gateway_image_digest"),
                vllm_image_ref(): (VLLM_SIM_IMAGE, "vllm_serving_image_digest"),
            }
        )
    except images.ImageError as err:
        raise LabError(str(err)) from err
    log(
        f"{len(digests)} images in the lab registry (digests in .lab/image-digests.json, the site's pins in "
        ".lab/site-digests.json)"
    )


def ensure_node(node: Node) -> None:
    created = ensure_container(
        node.name,
        f"node {node.ssh_port}",
        [
            "--hostname", node.name, "--network", NETWORK, "--ip", node.ip, "--no-hosts",
            "-p", f"127.0.0.1:{node.ssh_port}:22",
            # the real kubelet runs pods with containerd and runc inside the node: nested containers need a
            # privileged node with a cgroup namespace of its own (its cgroups are its root, as the kubelet's
            # systemd driver expects); /proc/sys is made read-only but for the node's network parameters at
            # boot (lab-proc-sys.service), so nothing in the node changes this machine's kernel parameters
            "--privileged", "--cgroupns=private",
            # a server that reboots comes back on: `systemctl reboot` in the node ends its container (systemd
            # is PID 1 of its PID namespace) and podman starts it again, disk kept; `podman stop` is a
            # power-off and stays one
            "--restart=always",
            # systemd as PID 1 without podman's systemd mode (SYSTEMD_MODE_ARGS)
            *SYSTEMD_MODE_ARGS,
            # containerd's overlayfs snapshots cannot live on the node's own overlay root: a volume
            "-v", f"{node_volume(node.name)}:/var/lib/containerd",
            "-v", f"{SSH_KEY}.pub:/home/labadmin/.ssh/authorized_keys:ro",
            IMAGE,
        ],
    )  # fmt: skip
    if created:
        wait_for_systemd(node)


def wait_for_systemd(node: Node, timeout_s: float = 240) -> None:
    """Until the node's boot is done. The limit is well past systemd's own 90 s job timeout: a unit that
    hangs fails at 90 s and the node comes up degraded, which the stages' own checks then report; three
    nodes restarting with their Kubernetes state on 2 cores take minutes, not seconds."""
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        state = podman("exec", node.name, "systemctl", "is-system-running", check=False).stdout.strip()
        if state in ("running", "degraded"):
            return
        time.sleep(1)
    jobs = podman("exec", node.name, "systemctl", "list-jobs", "--no-legend", check=False).stdout.strip()
    raise LabError(
        f"{node.name}: systemd did not come up within {timeout_s:.0f}s (last state: {state!r}); "
        f"jobs still running: {jobs or 'none listed'} (podman exec {node.name} journalctl -b)"
    )


BOOT_UNIT = "fake-nvml-boot.service"


# What install_node_files puts on a node: (source under tests/lab, or None for the content in NODE_FILE_TEXT;
# path on the node; mode). The fake NVML and its control CLI; the Kubernetes faults (scripts/lab-fault NODE
# kube ...), done to the real components; the unit by which a reboot clears the simulated GPUs as it clears a
# driver's state; and Ubuntu's apt hook that the nodes' Debian lacks (docs/lab.md).
NODE_FILES = (
    ("fake_nvml/pynvml.py", "/usr/local/lib/fake-nvml/pynvml.py", 0o644),
    ("fake_nvml/fake_nvml_ctl.py", "/usr/local/lib/fake-nvml/fake_nvml_ctl.py", 0o644),
    (None, "/usr/local/sbin/fake-nvml", 0o755),
    ("kube/lab_kube_fault.py", "/usr/local/sbin/lab-kube-fault", 0o755),
    (f"fake_nvml/{BOOT_UNIT}", f"/etc/systemd/system/{BOOT_UNIT}", 0o644),
    (None, "/etc/apt/apt.conf.d/15update-stamp", 0o644),
)
NODE_FILE_TEXT = {
    "/usr/local/sbin/fake-nvml": (
        b'#!/bin/sh\nexec /usr/bin/python3 /usr/local/lib/fake-nvml/fake_nvml_ctl.py "$@"\n'
    ),
    # Ubuntu 22.04's update-notifier-common ships this hook: every successful `apt update` touches the stamp
    # apt's cache_valid_time (and common's read of the lists' age) reads. Debian's apt has no such file, so
    # without it the lab refreshed apt's lists on every run where Ubuntu does once an hour.
    "/etc/apt/apt.conf.d/15update-stamp": (
        b"APT::Update::Post-Invoke-Success "
        b'{"touch /var/lib/apt/periodic/update-success-stamp 2>/dev/null || true";};\n'
    ),
}


def node_files_archive() -> bytes:
    """NODE_FILES as one tar stream (root-owned, the sources' times), for one `tar -x` on the node."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as archive:
        for source, target, mode in NODE_FILES:
            data = NODE_FILE_TEXT[target] if source is None else (LAB_SRC / source).read_bytes()
            entry = tarfile.TarInfo(target.lstrip("/"))
            entry.size, entry.mode = len(data), mode
            entry.mtime = int((LAB_SRC / (source or "labctl.py")).stat().st_mtime)
            archive.addfile(entry, io.BytesIO(data))
    return stream.getvalue()


def install_node_files(node: Node) -> dict[str, str] | None:
    """In one exec: the node's boot state (systemctl is-system-running); once booted, NODE_FILES copied and
    the boot unit enabled, whether its GPU state exists, whether it resolves the mirror (ensure_network_dns's
    check). None while the node has not booted (or cannot be reached): nothing was installed."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(LAB_SRC / "containers.conf"))
    script = (
        'state=$(systemctl is-system-running 2>/dev/null || true); echo "systemd $state"; '
        'case "$state" in running|degraded) ;; *) exit 0 ;; esac; '
        f"tar -x -C / --no-same-owner && systemctl enable --quiet {BOOT_UNIT} || exit 1; "
        "if test -f /var/lib/fake-nvml/state.json; then echo gpu-state yes; else echo gpu-state no; fi; "
        f"if getent hosts {MIRROR_NAME} >/dev/null; then echo dns yes; else echo dns no; fi"
    )
    result = subprocess.run(
        ["podman", "exec", "-i", node.name, "sh", "-c", script],
        input=node_files_archive(), env=env, capture_output=True, check=False,
    )  # fmt: skip
    found = {}
    for line in result.stdout.decode().splitlines():
        key, _, value = line.partition(" ")
        found[key] = value
    if found.get("systemd") not in ("running", "degraded"):
        return None
    if result.returncode != 0 or "dns" not in found:
        raise LabError(
            f"{node.name}: installing the lab's node files failed: {result.stderr.decode().strip()}"
        )
    return found


def bring_up_node(node: Node) -> bool:
    """A started node container made ready: booted, the lab's files installed, its GPU state created once,
    reached over SSH. True when it resolves the mirror (ensure_network_dns)."""
    found = install_node_files(node)
    if found is None:  # still booting
        wait_for_systemd(node)
        found = install_node_files(node)
        if found is None:
            raise LabError(f"{node.name}: systemd stopped running while the lab's files were installed")
    if found["gpu-state"] != "yes":
        podman("exec", node.name, "fake-nvml", "init", "--shape", GPU_SHAPE, "--host", node.name)
        log(f"{node.name}: simulated GPUs initialised ({GPU_SHAPE})")
    wait_for_ssh(node)
    return found["dns"] == "yes"


def carry_in_models() -> None:
    """What an operator does for the model stage: carry the weights the lab inventory lists
    (model_sync_models) into the source node's inbox, with the publisher's listing, and give the
    node the lab's ClamAV database (EICAR signature). The models are tests/modelgen's tiny
    Qwen2-shaped model; each model version is generated from its version string."""
    lab_vars = yaml.safe_load((REPO / "inventories" / "lab" / "group_vars" / "all.yml").read_text())
    source = lab_vars["model_sync_source_node"]
    sys.path.insert(0, str(REPO / "tests"))
    import modelgen

    database = lab_vars["model_sync_clamav_database"]
    models = lab_vars.get("model_sync_models") or []
    # which of the directories are there, in one exec
    listed = podman(
        "exec", source, "sh", "-c", 'for d; do if test -d "$d"; then echo "$d"; fi; done', "sh",
        database, *(model["source"] for model in models),
    ).stdout.splitlines()  # fmt: skip
    if database not in listed:
        local = modelgen.write_eicar_database(STATE / "clamav")
        podman("exec", source, "mkdir", "-p", str(Path(database).parent))
        podman("cp", str(local), f"{source}:{database}")
        log(f"{source}: lab ClamAV database (EICAR signature) in {database}")
    for model in models:
        if model["source"] in listed:
            continue
        local = STATE / "models" / model["name"] / model["version"]
        listing = local.with_name(local.name + ".publisher.json")
        subprocess.run(["rm", "-rf", str(local)], check=True)
        modelgen.write_good_model(local, model["version"])
        modelgen.write_publisher_manifest(listing, "hf_json", model["version"])
        parents = {str(Path(model[key]).parent) for key in ("source", "publisher_manifest")}
        podman("exec", source, "mkdir", "-p", *sorted(parents))
        podman("cp", str(listing), f"{source}:{model['publisher_manifest']}")
        podman("cp", str(local), f"{source}:{model['source']}")
        log(f"{source}: carried model {model['name']} {model['version']} into {model['source']}")


def wait_for_ssh(node: Node, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", node.ssh_port), timeout=2):
                pass
            result = subprocess.run(
                ["ssh", "-F", str(STATE / "ssh_config"), "-o", "ConnectTimeout=5", node.name, "true"],
                capture_output=True,
                text=True,
            )
            if result.returncode == 0:
                return
            last = result.stderr.strip()
        except OSError as err:
            last = str(err)
        time.sleep(1)
    raise LabError(f"{node.name}: no SSH on 127.0.0.1:{node.ssh_port} within {timeout_s:.0f}s ({last})")


def write_ssh_config() -> None:
    lines = []
    for node in NODES:
        lines += [
            f"Host {node.name}",
            "  HostName 127.0.0.1",
            f"  Port {node.ssh_port}",
            "  User labadmin",
            f"  IdentityFile {SSH_KEY}",
            "  IdentitiesOnly yes",
            # Node host keys are new each time a node is recreated: nothing to pin in a lab.
            "  StrictHostKeyChecking no",
            "  UserKnownHostsFile /dev/null",
            "  LogLevel ERROR",
            "",
        ]
    (STATE / "ssh_config").write_text("\n".join(lines))


def remove_containers() -> None:
    names = podman("ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}").stdout.split()
    for name in names:
        force_remove(name)
    if names:
        log(f"removed containers: {' '.join(names)}")


def cmd_up(_: argparse.Namespace) -> None:
    started = time.monotonic()
    labstate.link_checkout()
    ensure_disk_headroom()
    ensure_ssh_key()
    write_ssh_config()
    ensure_image()
    ensure_gateway_image()
    ensure_vllm_sim_image()
    ensure_network()
    ensure_cluster_networks_unrouted()
    ensure_mirror()
    # the nodes' states in one call, read just before ensure_node uses them
    prefetch_container_states([node.name for node in NODES])
    for node in NODES:
        ensure_node(node)
    # the three nodes side by side: each step waits on its own node (its boot, podman exec, SSH)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(NODES)) as pool:
        futures = {node.name: pool.submit(bring_up_node, node) for node in NODES}
        resolved = {name: done.result() for name, done in futures.items()}
    ensure_network_dns(resolved)
    carry_in_models()
    ensure_images()
    log(
        f"up in {time.monotonic() - started:.0f}s: "
        + ", ".join(f"{n.name} (ssh 127.0.0.1:{n.ssh_port})" for n in NODES)
    )
    log(f"ssh into a node: ssh -F {shown(STATE / 'ssh_config')} gpu-node-1")


def cmd_replace_nodes(args: argparse.Namespace) -> None:
    """Three new servers under the same names: the node containers and their disks removed, then `up`. What a
    test that cannot be undone in place (a Kubernetes upgrade: kubeadm does not downgrade) leaves behind is
    gone; `make lab` then builds the cluster at the site's versions again (the mirror and images stay)."""
    for node in NODES:
        force_remove(node.name)
        log(f"{node.name}: removed with its disk")
    cmd_up(args)


def cmd_status(_: argparse.Namespace) -> None:
    result = podman(
        "ps",
        "-a",
        "--filter",
        f"label={LABEL}",
        "--format",
        "{{.Names}}\t{{.Status}}\t{{.Ports}}",
        check=False,
    )
    print(result.stdout.strip() or "lab: no lab containers")
    print(f"image {IMAGE}: {'present' if image_label(IMAGE) else 'absent'}")


def cmd_destroy(_: argparse.Namespace) -> None:
    remove_containers()
    if podman("network", "exists", NETWORK, check=False).returncode == 0:
        podman("network", "rm", "-f", NETWORK)
        log(f"removed network {NETWORK}")
    for network in cluster_networks():  # the lab's own unreachable routes only
        subprocess.run(["ip", "route", "del", "unreachable", network], check=False, capture_output=True)
    # the current image and earlier builds it replaced (left untagged), all carry the inputs label
    built = set(podman("images", "-a", "-q", "--filter", "label=llm-lab.inputs").stdout.split())
    # and the images the lab's cluster pulls (tests/lab/images.py), built here too
    built |= set(podman("images", "-a", "-q", "--filter", f"label={images.LABEL}").stdout.split())
    if built:
        podman("rmi", "-f", *sorted(built))
        log(
            f"removed {len(built)} lab image(s) ({IMAGE}, {BASE_IMAGE}, the cluster's images, earlier builds)"
        )
    if STATE.exists():
        subprocess.run(["rm", "-rf", str(STATE)], check=True)
        log(f"removed {shown(STATE)}/")
    labstate.unlink_checkout()
    log("destroyed: nothing of the lab is left")


def cmd_image(args: argparse.Namespace) -> None:
    ensure_image(rebuild=args.rebuild)


def cmd_mirror(_: argparse.Namespace) -> None:
    labstate.link_checkout()
    ensure_image()
    ensure_network()
    ensure_cluster_networks_unrouted()
    ensure_mirror()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up").set_defaults(func=cmd_up)
    sub.add_parser("status").set_defaults(func=cmd_status)
    sub.add_parser(
        "replace-nodes", help="the three nodes as new servers (empty disks), then up"
    ).set_defaults(func=cmd_replace_nodes)
    sub.add_parser("destroy").set_defaults(func=cmd_destroy)
    image = sub.add_parser("image")
    image.add_argument("--rebuild", action="store_true", help="rebuild even if the image is current")
    image.set_defaults(func=cmd_image)
    sub.add_parser("mirror").set_defaults(func=cmd_mirror)
    args = parser.parse_args()
    try:
        args.func(args)
    except (LabError, subprocess.CalledProcessError) as err:
        print(f"lab: ERROR: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
