"""The container images the lab's cluster pulls, built here and pushed to the lab's registry.

No public registry is reachable from this machine (like an air-gapped site), so every image a pod of the lab
runs is built here, under the upstream name and tag the product's manifests and kubeadm name
(registry.k8s.io/kube-apiserver:v1.36.3, quay.io/calico/node:v3.32.1, ...), and pushed to the lab's OCI
registry (distribution's registry, built from its Go module, on the lab mirror: https://lab-mirror:5000). The
nodes' containerd uses that registry as its mirror for registry.k8s.io, quay.io, nvcr.io and docker.io
(roles/containerd's containerd_registry_mirrors; inventories/lab), as an air-gapped site runs.

What each image holds: the real program built from its upstream Go module (tests/lab/gobuild), on an empty
image where upstream's is distroless, or on the lab's plain Debian 12 image where the program needs tools
(kube-proxy's nft and iptables). Where nothing real can run here (GPUs), a named stand-in (docs/lab.md).

An image is rebuilt when its inputs change (a label carries their hash), pushed when the registry lacks it;
the digests the registry gave are written to .lab/images.json for the lab inventory.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import labstate  # beside this file: where the lab's state lives

LAB_SRC = Path(__file__).resolve().parent
REPO = LAB_SRC.parents[1]
STATE = labstate.STATE
REGISTRY_DIR = STATE / "registry"
DIGESTS = STATE / "images.json"  # ref -> {"inputs": hash, "digest": registry digest}
# ref -> digest, what the lab tests read (labrun.pinned_image)
INVENTORY_DIGESTS = STATE / "image-digests.json"
# site value -> digest, what inventories/lab reads (lab_site_digests): each *_image_digest the site pins
# (playbooks/vars/site-values.yml), by the variable's name, so playbooks/validate.yml reads it from the
# inventory alone, before any role's defaults are loaded
SITE_DIGESTS = STATE / "site-digests.json"
# The registry as this machine reaches it (the lab network's bridge); the nodes call it lab-mirror:5000.
REGISTRY_PUSH = "10.89.42.2:5000"
BASE_IMAGE = "localhost/llm-lab-base:bookworm"
LABEL = "llm-lab.image-inputs"

_spec = importlib.util.spec_from_file_location("gobuild", LAB_SRC / "gobuild" / "build.py")
assert _spec is not None and _spec.loader is not None
gobuild = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("gobuild", gobuild)
_spec.loader.exec_module(gobuild)


def log(message: str) -> None:
    print(f"lab-images: {message}", flush=True)


class ImageError(RuntimeError):
    pass


@dataclass(frozen=True)
class Image:
    """One image: its upstream reference, and how the lab makes it."""

    ref: str  # registry/repository:tag, as the product or kubeadm names it
    files: Callable[[], dict[str, Path]]  # path in the image -> file here
    base: str = "scratch"  # "scratch", or the lab's plain Debian 12 image (BASE_IMAGE)
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    user: str = ""
    env: dict[str, str] = field(default_factory=dict)
    run: str = ""  # a RUN step (only on BASE_IMAGE)
    what: str = ""  # a line for docs and logs: real program or stand-in
    site_digest: str = ""  # the site value that pins its digest (SITE_DIGESTS), where the site pins one

    @property
    def repository(self) -> str:
        """The path under the registry host, which is what a mirror is asked for."""
        return self.ref.split("/", 1)[1].rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]


def built(component: str, name: str) -> Path:
    return gobuild.build(gobuild.BY_NAME[component]) / name


def kubernetes_version(component: str = "kubernetes") -> str:
    return gobuild.required_version(gobuild.BY_NAME[component])


def kubeadm_constant(name: str, component: str = "kubernetes") -> str:
    return gobuild.kubeadm_constant(name, kubernetes_version(component))


PATH_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


def control_plane_image(name: str, component: str = "kubernetes") -> Image:
    version = kubernetes_version(component)
    return Image(
        f"registry.k8s.io/{name}:{version}",
        lambda: {f"/usr/local/bin/{name}": built(component, name)},
        env=PATH_ENV,
        what=f"the real {name} (k8s.io/kubernetes {version})",
    )


def kubeadm_images(suffix: str = "") -> list[Image]:
    """What kubeadm of the pinned release (suffix "") or of the lab's upgrade target ("-next") deploys but
    the pause image (one stand-in): control plane, kube-proxy, etcd, CoreDNS, each built from its module."""
    kubernetes = "kubernetes" + suffix
    version = kubernetes_version(kubernetes)
    etcd_tag = kubeadm_constant("DefaultEtcdVersion", kubernetes)
    coredns_tag = kubeadm_constant("CoreDNSVersion", kubernetes)
    return [
        control_plane_image("kube-apiserver", kubernetes),
        control_plane_image("kube-controller-manager", kubernetes),
        control_plane_image("kube-scheduler", kubernetes),
        Image(
            f"registry.k8s.io/kube-proxy:{version}",
            lambda: {"/usr/local/bin/kube-proxy": built(kubernetes, "kube-proxy")},
            base=BASE_IMAGE,  # it runs nft / iptables-restore: upstream's image carries them too
            env=PATH_ENV,
            what=f"the real kube-proxy (k8s.io/kubernetes {version}), nftables, iptables",
        ),
        Image(
            f"registry.k8s.io/etcd:{etcd_tag}",
            lambda: {
                f"/usr/local/bin/{name}": built("etcd" + suffix, name)
                for name in ("etcd", "etcdctl", "etcdutl")
            },
            env=PATH_ENV,
            what=f"the real etcd {etcd_tag.split('-')[0]} (go.etcd.io/etcd/v3)",
        ),
        Image(
            f"registry.k8s.io/coredns/coredns:{coredns_tag}",
            lambda: {"/coredns": built("coredns" + suffix, "coredns")},
            entrypoint=("/coredns",),
            what=f"the real CoreDNS {coredns_tag} (github.com/coredns/coredns)",
        ),
    ]


def images() -> list[Image]:
    """Every image the lab's cluster pulls, and those an upgrade to the lab's next minor pulls."""
    pause = kubeadm_constant("PauseVersion")
    if kubeadm_constant("PauseVersion", "kubernetes-next") != pause:
        raise ImageError(
            f"kubeadm {kubernetes_version('kubernetes-next')} uses pause "
            f"{kubeadm_constant('PauseVersion', 'kubernetes-next')}, not {pause}: add that image too"
        )
    return [
        *kubeadm_images(),
        *kubeadm_images("-next"),
        Image(
            f"registry.k8s.io/pause:{kubeadm_constant('PauseVersion')}",
            lambda: {"/pause": built("lab-programs", "pause")},
            entrypoint=("/pause",),
            user="65535:65535",
            what="STAND-IN: the lab's Go pause (upstream's is C): holds the namespaces, reaps, exits on TERM",
        ),
        Image(
            "nvcr.io/nvidia/k8s/dcgm-exporter:"
            f"{gobuild.role_default('monitoring', 'monitoring_dcgm_exporter_version')}-distroless",
            lambda: {
                "/usr/local/lib/dcgm-exporter/dcgm_exporter.py": LAB_SRC / "nvidia" / "dcgm_exporter.py",
                "/usr/local/lib/dcgm-exporter/pynvml.py": LAB_SRC / "fake_nvml" / "pynvml.py",
            },
            base=BASE_IMAGE,
            run="ln -s /usr/local/lib/dcgm-exporter/dcgm_exporter.py /usr/bin/dcgm-exporter",
            # the real image's environment: the runtime gives it every GPU, the driver's NVML
            env={
                "NVIDIA_VISIBLE_DEVICES": "all",
                "NVIDIA_DRIVER_CAPABILITIES": "compute,utility,compat32",
                "NVIDIA_DISABLE_REQUIRE": "true",
            },
            entrypoint=("/usr/bin/dcgm-exporter",),
            site_digest="monitoring_dcgm_exporter_image_digest",
            what="STAND-IN: dcgm-exporter's flags, counters, metrics of the fake NVML (tests/lab/nvidia)",
        ),
        Image(
            "nvcr.io/nvidia/k8s-device-plugin:"
            + gobuild.role_default("nvidia_device_plugin", "nvidia_device_plugin_version"),
            lambda: {"/usr/bin/nvidia-device-plugin": built("lab-programs", "nvidia-device-plugin")},
            env={"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
            entrypoint=("/usr/bin/nvidia-device-plugin",),
            what="STAND-IN: the kubelet's real device-plugin API over the fake NVML (lab-programs)",
        ),
        *calico_images(),
        *monitoring_images(),
    ]


def monitoring_images() -> list[Image]:
    """Prometheus and Alertmanager built from their modules at the role's tags; Grafana stands in."""

    def ref(variable: str) -> str:
        return gobuild.role_default("monitoring", variable)

    return [
        Image(
            ref("monitoring_prometheus_image"),
            lambda: {f"/bin/{name}": built("prometheus", name) for name in ("prometheus", "promtool")},
            user="65534:65534",
            entrypoint=("/bin/prometheus",),
            site_digest="monitoring_prometheus_image_digest",
            what="the real Prometheus (github.com/prometheus/prometheus; its web UI's built assets are not)",
        ),
        Image(
            ref("monitoring_alertmanager_image"),
            lambda: {f"/bin/{name}": built("alertmanager", name) for name in ("alertmanager", "amtool")},
            user="65534:65534",
            entrypoint=("/bin/alertmanager",),
            site_digest="monitoring_alertmanager_image_digest",
            what="the real Alertmanager (github.com/prometheus/alertmanager)",
        ),
        Image(
            ref("monitoring_grafana_image"),
            lambda: {"/usr/share/grafana/bin/grafana-standin": built("lab-programs", "grafana-standin")},
            user="472:472",
            entrypoint=("/usr/share/grafana/bin/grafana-standin",),
            site_digest="monitoring_grafana_image_digest",
            what="STAND-IN: checks the provisioned files, answers /api/health (Grafana cannot be built here)",
        ),
    ]


def calico_images() -> list[Image]:
    """Calico's images under their names, standing in (Calico's Go module at the pinned release is not served
    here, BIRD is C): their programs are calico-standin, the data plane kube-router (real; docs/lab.md)."""
    version = gobuild.role_default("calico", "calico_version")

    def standin(*names: str) -> Callable[[], dict[str, Path]]:
        return lambda: {name: built("lab-programs", "calico-standin") for name in names}

    return [
        Image(
            f"quay.io/calico/node:{version}",
            lambda: {
                "/usr/local/bin/kube-router": built("kube-router", "kube-router"),
                "/bin/calico-node": built("lab-programs", "calico-standin"),
            },
            base=BASE_IMAGE,  # kube-router runs iptables, ipset
            env=PATH_ENV,
            entrypoint=("/bin/calico-node",),
            what="STAND-IN programs over the real kube-router v2.1.0 (pod routes, NetworkPolicy)",
        ),
        Image(
            f"quay.io/calico/cni:{version}",
            standin("/opt/cni/bin/install", "/opt/cni/bin/calico-ipam"),
            env=PATH_ENV,
            entrypoint=("/opt/cni/bin/install",),
            what="STAND-IN: writes the bridge + host-local conflist kube-router fills in",
        ),
        Image(
            f"quay.io/calico/kube-controllers:{version}",
            standin("/usr/bin/kube-controllers", "/usr/bin/check-status"),
            user="999:999",  # its pod runs as non-root
            entrypoint=("/usr/bin/kube-controllers",),
            what="STAND-IN: no Calico datastore to reconcile; its probes answer",
        ),
    ]


def containerfile(image: Image, names: dict[str, str]) -> str:
    lines = [f"FROM {image.base}"]
    for target, name in names.items():
        lines.append(f"COPY --chmod=0755 {name} {target}")
    if image.run:
        lines.append(f"RUN {image.run}")
    for key, value in image.env.items():
        lines.append(f"ENV {key}={value}")
    if image.user:
        lines.append(f"USER {image.user}")
    if image.entrypoint:
        lines.append(f"ENTRYPOINT {json.dumps(list(image.entrypoint))}")
    if image.cmd:
        lines.append(f"CMD {json.dumps(list(image.cmd))}")
    return "\n".join(lines) + "\n"


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(LAB_SRC / "containers.conf")),
    }
    result = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise ImageError(f"podman {' '.join(args[:2])} ... failed: {result.stderr.strip()[-1500:]}")
    return result


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# The sha256 of each image input file (the Go binaries: ~1 s of hashing on every `labctl up`), kept between
# runs: resolved path -> {"stat": [size, mtime_ns, ctime_ns, inode], "sha256": ...}.
FILE_HASHES = STATE / "file-hashes.json"
# A digest is reused only while the file's size, mtime (ns), ctime (ns) and inode are those it was hashed
# with: what make, ninja and git's index trust to say a file is unchanged (a rebuilt binary is renamed into
# place, a new inode; an edit moves mtime and ctime, and ctime cannot be set back). A file changed within the
# same clock tick as its hashing could keep its mtime (git's "racily clean" case): a file modified or changed
# (mtime or ctime: `cp -p` sets mtime back) less than RACY_S before it was hashed is not kept, so it is hashed
# again next time.
RACY_S = 2.0


def stat_key(stat: os.stat_result) -> list[int]:
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


class FileHashes:
    """The digest cache: loaded from CACHE once, written back (whole, by rename) when it learnt something. A
    missing, unreadable or malformed cache is an empty one: every file is hashed again."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.entries: dict[str, dict] = {}
        self.changed = False
        try:
            loaded = json.loads(cache.read_text())
        except (OSError, ValueError):
            loaded = {}
        if isinstance(loaded, dict):
            self.entries = {
                path: entry
                for path, entry in loaded.items()
                if isinstance(entry, dict)
                and isinstance(entry.get("sha256"), str)
                and isinstance(entry.get("stat"), list)
            }

    def digest(self, path: Path) -> str:
        resolved = path.resolve()
        stat = resolved.stat()
        key, entry = str(resolved), self.entries.get(str(resolved))
        if entry is not None and entry["stat"] == stat_key(stat):
            return entry["sha256"]
        hashed = sha256_file(resolved)
        after = resolved.stat()
        settled = time.time() - max(after.st_mtime_ns, after.st_ctime_ns) / 1e9 > RACY_S
        if stat_key(after) == stat_key(stat) and settled:
            self.entries[key] = {"stat": stat_key(after), "sha256": hashed}
        else:  # changing while read, or too new to trust its mtime: not kept
            self.entries.pop(key, None)
        self.changed = True
        return hashed

    def save(self) -> None:
        """Write the cache back, without the entries of files gone or changed since (old builds)."""
        if not self.changed:
            return
        kept = {}
        for path, entry in self.entries.items():
            with contextlib.suppress(OSError):
                if stat_key(Path(path).stat()) == entry["stat"]:
                    kept[path] = entry
        with contextlib.suppress(OSError):
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            partial = self.cache.with_name(f"{self.cache.name}.{os.getpid()}.partial")
            partial.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
            partial.replace(self.cache)
        self.changed = False


@functools.cache
def file_hashes() -> FileHashes:
    return FileHashes(FILE_HASHES)


def file_hash(path: Path) -> str:
    """The file's sha256, from the digest cache while the file is unchanged (FILE_HASHES)."""
    return file_hashes().digest(path)


@functools.cache
def local_images() -> dict[str, dict]:
    """Name -> podman's record (Id, Digest, Labels) of every local image: one `podman images` for them all
    instead of an inspect per image. A build clears it."""
    listed = json.loads(podman("images", "--format", "json").stdout or "[]")
    return {name: record for record in listed for name in record.get("Names") or []}


def local_image(name: str, field: str) -> str | None:
    """One field of a local image's record (local_images), or None when podman has no such image."""
    record = local_images().get(name)
    return None if record is None else record.get(field)


def inputs_hash(image: Image, files: dict[str, Path]) -> str:
    h = hashlib.sha256(containerfile(image, {t: Path(t).name for t in files}).encode())
    for target, source in sorted(files.items()):
        h.update(f"{target}\0{file_hash(source)}\0".encode())
    file_hashes().save()
    if image.base != "scratch":
        base = local_image(image.base, "Digest")
        if base is None:  # not listed: inspect names the missing image in its error
            base = podman("image", "inspect", "--format", "{{.Digest}}", image.base).stdout.strip()
        h.update(base.encode())
    return h.hexdigest()[:16]


def ensure_built(image: Image) -> str:
    """Build the image unless podman has it with these inputs; returns the inputs hash."""
    files = image.files()
    wanted = inputs_hash(image, files)
    if (local_image(image.ref, "Labels") or {}).get(LABEL) == wanted:
        return wanted
    log(f"building {image.ref}: {image.what}")
    with tempfile.TemporaryDirectory(prefix="llm-lab-image.") as context:
        names = {}
        for index, (target, source) in enumerate(sorted(files.items())):
            name = f"f{index}-{Path(target).name}"
            shutil.copyfile(source, Path(context) / name)
            names[target] = name
        (Path(context) / "Containerfile").write_text(containerfile(image, names))
        podman("build", "-q", "--label", f"{LABEL}={wanted}", "-t", image.ref, context)
    local_images.cache_clear()
    return wanted


@functools.cache
def registry_context() -> ssl.SSLContext:
    """The registry's TLS context, made once (its CA file read once) and shared by every request."""
    return ssl.create_default_context(cafile=str(REGISTRY_DIR / "ca.crt"))


def registry_digest(image: Image) -> str | None:
    """The digest the lab registry serves for the image's tag, or None."""
    request = urllib.request.Request(
        f"https://{REGISTRY_PUSH}/v2/{image.repository}/manifests/{image.tag}",
        method="HEAD",
        headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json, "
            "application/vnd.docker.distribution.manifest.v2+json"
        },
    )
    try:
        with urllib.request.urlopen(request, context=registry_context(), timeout=30) as response:
            return response.headers.get("Docker-Content-Digest")
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise ImageError(f"registry: HEAD {image.repository}:{image.tag}: HTTP {err.code}") from err
    except (OSError, urllib.error.URLError) as err:
        raise ImageError(f"registry https://{REGISTRY_PUSH} not reachable: {err}") from err


def ensure_pushed(
    image: Image,
    inputs: str,
    recorded: dict[str, dict[str, str]],
    local: str | None = None,
    served_now: dict[str, str | None] | None = None,
) -> str:
    """Push (the local image LOCAL, default the image's own name) unless the registry already serves what
    these inputs built; returns the registry's digest. SERVED_NOW: the registry's digests asked just before
    (ref -> digest or None), each used once; the registry is asked for any other."""
    known = recorded.get(image.ref, {})
    if served_now is not None and image.ref in served_now:
        served = served_now.pop(image.ref)
    else:
        served = registry_digest(image)
    if served and known.get("inputs") == inputs and known.get("digest") == served:
        return served
    certs = REGISTRY_DIR / "client"
    certs.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REGISTRY_DIR / "ca.crt", certs / "ca.crt")
    with tempfile.NamedTemporaryFile(prefix="llm-lab-digest.") as digest_file:
        podman(
            "push", "-q", "--cert-dir", str(certs), "--digestfile", digest_file.name,
            local or image.ref, f"docker://{REGISTRY_PUSH}/{image.repository}:{image.tag}",
        )  # fmt: skip
        digest = Path(digest_file.name).read_text().strip()
    log(f"pushed {image.ref} ({digest[:19]})")
    return digest


def ensure_all(site_images: dict[str, tuple[str, str]] | None = None) -> dict[str, str]:
    """Build and push every image, and push SITE_IMAGES (registry ref -> (local podman image, built elsewhere:
    the gateway; the site value pinning its digest)); write .lab/images.json, .lab/image-digests.json and
    .lab/site-digests.json; return ref -> digest."""
    recorded = json.loads(DIGESTS.read_text()) if DIGESTS.is_file() else {}
    # local_images is the listing labctl.py read first (its node, gateway and simulator images): each build
    # clears it (ensure_built here, labctl's builds), so images built before this call are in it
    work: list[tuple[Image, str, str | None]] = [(image, ensure_built(image), None) for image in images()]
    for ref, (local, site_digest) in (site_images or {}).items():
        local_id = local_image(local, "Id")
        if local_id is None:
            raise ImageError(f"{ref}: podman has no local image {local} to push")
        image = Image(ref, dict, what=f"{local} (built here)", site_digest=site_digest)
        work.append((image, local_id, local))
    # what the registry serves for every image, asked side by side (one HEAD each, ~20 of them)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        asked = [image for image, _, _ in work]
        served = dict(zip([image.ref for image in asked], pool.map(registry_digest, asked), strict=True))
    for image, inputs, local in work:
        # each answer is used once (popped): a second image of the same name asks the registry again
        digest = ensure_pushed(image, inputs, recorded, local, served)
        recorded[image.ref] = {"inputs": inputs, "digest": digest}
        DIGESTS.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    digests = {ref: entry["digest"] for ref, entry in recorded.items()}
    INVENTORY_DIGESTS.write_text(json.dumps(digests, indent=2, sort_keys=True) + "\n")
    site = {image.site_digest: digests[image.ref] for image, _, _ in work if image.site_digest}
    SITE_DIGESTS.write_text(json.dumps(site, indent=2, sort_keys=True) + "\n")
    return digests
