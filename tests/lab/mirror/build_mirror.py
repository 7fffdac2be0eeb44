#!/usr/bin/env python3
"""Build the lab mirror: stand-in vendor packages in signed flat apt repositories,
a PEP 503 index with the lab's fake pynvml under the real distribution name, and
stand-in .run driver installers.

    python tests/lab/mirror/build_mirror.py OUTPUT_DIR

The packages are real .deb files with the vendors' names and versions (see
packages.yml) so that apt sources, pinning, holds and upgrades behave as they do
against NVIDIA's and Kubernetes' repositories. Their payloads are tiny: only what
a test observes. Every package says in its description that it is a lab stand-in.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import model_tool_wheels  # beside this file: the model tools' real wheels for the pypi index
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(1, str(HERE.parent))  # tests/lab: upstream_manifests
import upstream_manifests  # noqa: E402

# tests/lab/gobuild/build.py: the real binaries the kube and containerd packages carry
_spec = importlib.util.spec_from_file_location("gobuild", HERE.parent / "gobuild" / "build.py")
assert _spec is not None and _spec.loader is not None
gobuild = importlib.util.module_from_spec(_spec)
sys.modules["gobuild"] = gobuild
_spec.loader.exec_module(gobuild)
GO_COMPONENTS = (
    "kubernetes",
    "kubernetes-next",
    "containerd",
    "containerd-next",
    "runc",
    "cri-tools",
    "cri-tools-next",
    "cni-plugins",
)

FAKE_NVML_DIR = HERE.parent / "fake_nvml"
NVIDIA_RUNTIME = HERE.parent / "nvidia" / "nvidia_container_runtime.py"
PAYLOADS = HERE / "payloads"
GPG_UID = "LLM Lab Mirror (stand-in vendor archive key) <lab-mirror@llm-lab.invalid>"


def kubernetes_repo_path(versions: list[str]) -> str:
    """pkgs.k8s.io's path of the minor of the first version: ["1.36.3-1.1", ...] -> kubernetes/v1.36/deb."""
    return "kubernetes/v{}/deb".format(".".join(versions[0].split(".")[:2]))


SPEC_KUBERNETES = yaml.safe_load((HERE / "packages.yml").read_text())["kubernetes"]
REPO_PATHS = {
    "cuda": "cuda/ubuntu2204/x86_64",
    "ubuntu-restricted": "ubuntu-restricted",
    # pkgs.k8s.io's repository of the pinned minor, and of the next one (the lab's upgrade target)
    "kubernetes": kubernetes_repo_path(SPEC_KUBERNETES["versions"]),
    "kubernetes-next": kubernetes_repo_path(SPEC_KUBERNETES["next"]["versions"]),
    "docker": "docker/linux/ubuntu",
    "libnvidia-container": "libnvidia-container/stable/deb/amd64",
}


@dataclass
class Package:
    name: str
    version: str
    repo: str
    summary: str
    depends: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # path -> (content, mode)
    binary_files: dict[str, tuple[Path, int]] = field(default_factory=dict)  # path -> (source, mode)
    conffiles: list[str] = field(default_factory=list)
    postinst: str = ""
    prerm: str = ""
    architecture: str = "amd64"
    # "<module> <version>" when the package carries real binaries the lab built from that upstream Go module
    upstream: str = ""


def payload(name: str, **values: str) -> str:
    text = (PAYLOADS / name).read_text()
    for key, value in values.items():
        text = text.replace("@" + key.upper() + "@", value)
    return text


def driver_packages(branch: str, upstream: str, flavour: str) -> list[Package]:
    """The package set of one driver release, as NVIDIA's CUDA repo or Ubuntu's archive ships it.

    Names, and the Depends between the driver's own packages, are the real ones (Canonical's packaging,
    which NVIDIA's CUDA repository ships too: debian/templates/control.in of nvidia-graphics-drivers):
    exact `(= VERSION)` where the real ones have it, the `(>= UPSTREAM)` + `(<= UPSTREAM-1)` bracket of
    nvidia-dkms and nvidia-kernel-common, unversioned ones where those are unversioned. Depends on the
    distribution (dkms, adduser, xserver-xorg-core, libc6, ...) are left out: the lab and the unit tests'
    apt simulation resolve the vendor's dependency shape, not Ubuntu's (docs/lab.md).
    """
    suffix = "-server" if flavour == "ubuntu-restricted" else ""
    version = f"{upstream}-0ubuntu0.22.04.1" if suffix else f"{upstream}-0ubuntu1"
    repo = flavour

    def named(base: str) -> str:
        return f"{base}-{branch}{suffix}"

    def exact(base: str) -> str:
        return f"{named(base)} (= {version})"

    def bracket(base: str) -> list[str]:
        # the packaging's "(<= #DEBIAN_VERSION#-1), (>= #DEBIAN_VERSION#)": any build of this upstream version
        return [f"{named(base)} (<= {upstream}-1)", f"{named(base)} (>= {upstream})"]

    firmware = f"nvidia-firmware-{branch}{suffix}-{upstream}"
    lib = payload("libnvidia-ml.so.1", version=upstream)
    # base name -> (files, summary, depends, provides/conflicts the base name)
    parts: dict[str, tuple[dict[str, tuple[str, int]], str, list[str], bool]] = {
        "nvidia-utils": (
            {"/usr/bin/nvidia-smi": (payload("nvidia-smi"), 0o755)},
            "NVIDIA driver support binaries",
            [],
            True,
        ),
        "libnvidia-compute": (
            {"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": (lib, 0o644)},
            "NVIDIA libcompute package (the NVML library)",
            [],
            True,
        ),
        "nvidia-compute-utils": (
            {
                "/usr/bin/nvidia-persistenced": (payload("nvidia-persistenced"), 0o755),
                "/lib/systemd/system/nvidia-persistenced.service": (
                    payload("nvidia-persistenced.service"),
                    0o644,
                ),
            },
            "NVIDIA compute utilities (nvidia-persistenced)",
            [named("libnvidia-compute")],
            True,
        ),
        "nvidia-kernel-common": (
            {},
            "Shared files used with the kernel module",
            [f"{firmware} (= {version})"],
            True,
        ),
        "nvidia-kernel-source": ({}, "NVIDIA kernel source package", [], True),
        "nvidia-dkms": (
            {
                # the modules it builds, their init/exit and their loading at boot (docs/lab.md)
                "/usr/lib/lab-kmod/modules.d/nvidia-dkms.available": (
                    payload("nvidia-kmod.available", version=upstream),
                    0o644,
                ),
                "/usr/lib/lab-kmod/hooks/nvidia": (payload("nvidia-kmod-hook", version=upstream), 0o755),
                "/usr/lib/modules-load.d/lab-nvidia.conf": (payload("nvidia-kmod-load.conf"), 0o644),
            },
            "NVIDIA DKMS package (the kernel modules as the lab's modprobe knows them)",
            bracket("nvidia-kernel-source") + bracket("nvidia-kernel-common"),
            True,
        ),
        "libnvidia-cfg1": ({}, "NVIDIA binary OpenGL/GLX configuration library", [], False),
        "libnvidia-common": ({}, "Shared files used by the NVIDIA libraries", [], True),
        "libnvidia-gl": ({}, "NVIDIA OpenGL/GLX/EGL/GLES GLVND libraries", [named("libnvidia-common")], True),
        "libnvidia-extra": ({}, "Extra libraries for the NVIDIA driver", [], True),
        "libnvidia-decode": (
            {},
            "NVIDIA Video Decoding runtime libraries",
            [exact("libnvidia-compute")],
            True,
        ),
        "libnvidia-encode": ({}, "NVENC Video Encoding runtime library", [], True),
        "libnvidia-fbc1": ({}, "NVIDIA OpenGL-based Framebuffer Capture runtime library", [], True),
        "xserver-xorg-video-nvidia": (
            {},
            "NVIDIA binary Xorg driver (the real one pulls Xorg in)",
            [exact("libnvidia-cfg1")],
            False,
        ),
        "nvidia-headless-no-dkms": (
            {},
            "NVIDIA headless metapackage - no DKMS",
            bracket("nvidia-kernel-common")
            + [exact(base) for base in ("nvidia-kernel-source", "libnvidia-compute", "nvidia-compute-utils")]
            + [exact("libnvidia-cfg1")],
            False,
        ),
        "nvidia-headless": (
            {},
            "NVIDIA headless metapackage",
            [named("nvidia-headless-no-dkms"), named("nvidia-dkms")],
            True,
        ),
        "nvidia-driver": (
            {},
            "NVIDIA driver metapackage (with the Xorg driver)",
            [exact("libnvidia-gl")]
            + bracket("nvidia-dkms")
            + bracket("nvidia-kernel-common")
            + [
                exact(base)
                for base in (
                    "nvidia-kernel-source",
                    "libnvidia-compute",
                    "libnvidia-extra",
                    "nvidia-compute-utils",
                    "libnvidia-decode",
                    "libnvidia-encode",
                    "nvidia-utils",
                    "xserver-xorg-video-nvidia",
                    "libnvidia-cfg1",
                    "libnvidia-fbc1",
                )
            ],
            False,
        ),
    }
    packages = [
        Package(
            name=named(base),
            version=version,
            repo=repo,
            summary=summary,
            files=files,
            depends=depends,
            provides=[base] if alias else [],
            conflicts=[base] if alias else [],
        )
        for base, (files, summary, depends, alias) in parts.items()
    ]
    # the GSP firmware: one package per upstream version (its name carries it), nvidia-kernel-common needs it
    packages.append(
        Package(
            name=firmware,
            version=version,
            repo=repo,
            summary="Firmware files used by the kernel module",
        )
    )
    packages.append(
        Package(
            name=f"nvidia-fabricmanager-{branch}",
            version=f"{upstream}-0ubuntu0.22.04.1" if suffix else f"{upstream}-1",
            repo=repo,
            summary="Fabric Manager for NVSwitch based systems",
            files={
                "/usr/bin/nv-fabricmanager": (payload("nv-fabricmanager", version=upstream), 0o755),
                "/lib/systemd/system/nvidia-fabricmanager.service": (
                    payload("nvidia-fabricmanager.service"),
                    0o644,
                ),
            },
        )
    )
    if not suffix:
        packages.append(
            Package(
                name=f"cuda-drivers-{branch}",
                version=f"{upstream}-1",
                repo=repo,
                summary=f"CUDA drivers metapackage for branch {branch} (pulls nvidia-driver, and so Xorg)",
                depends=[f"nvidia-driver-{branch} (>= {upstream})"],
            )
        )
    return packages


def containerd_io_package(version: str, build: str, builds: dict[str, Path]) -> Package:
    """Docker's containerd.io for Ubuntu 22.04, carrying the REAL containerd (build: the production pin, or
    the newer release of containerd-next) and the runc release the pinned containerd is tested with, built by
    the lab from their Go modules. As Docker's package: it bundles runc, so it provides, conflicts with and
    replaces the distribution's containerd and runc."""
    containerd, runc = builds[build], builds["runc"]
    binaries = {
        f"/usr/bin/{name}": (containerd / name, 0o755)
        for name in ("containerd", "containerd-shim-runc-v2", "ctr")
    }
    binaries["/usr/bin/runc"] = (runc / "runc", 0o755)
    return Package(
        name="containerd.io",
        version=version,
        repo="docker",
        summary="An open and reliable container runtime",
        depends=["libc6 (>= 2.34)", "libseccomp2 (>= 2.5.0)"],
        provides=["containerd", "runc"],
        conflicts=["containerd", "runc"],
        binary_files=binaries,
        files={
            "/lib/systemd/system/containerd.service": (payload("containerd.service"), 0o644),
            # Docker's package ships this file, which disables the CRI plugin Kubernetes needs.
            "/etc/containerd/config.toml": (payload("containerd-config.toml"), 0o644),
        },
        conffiles=["/etc/containerd/config.toml"],
        postinst=(
            "if [ -d /run/systemd/system ]; then\n"
            "  systemctl daemon-reload\n  systemctl enable containerd.service >/dev/null 2>&1 || true\n"
            "  systemctl restart containerd.service || true\nfi\n"
        ),
        upstream=", ".join(
            f"{gobuild.BY_NAME[name].module} {gobuild.required_version(gobuild.BY_NAME[name])}"
            for name in (build, "runc")
        ),
    )


def container_toolkit_packages(version: str, repo: str) -> list[Package]:
    """NVIDIA's container toolkit as nvidia.github.io/libnvidia-container publishes it: the toolkit depends on
    its -base and on libnvidia-container-tools at exactly its own version (nvidia-container-toolkit's
    packaging/debian/control), the tools on libnvidia-container1 at least at theirs (shlibs)."""
    upstream = version.split("-")[0]
    return [
        Package(
            name="nvidia-container-toolkit-base",
            version=version,
            repo=repo,
            summary="NVIDIA Container Toolkit base",
            files={
                "/usr/bin/nvidia-ctk": (payload("nvidia-ctk", version=upstream), 0o755),
                # the runtime containerd's `nvidia` handler runs (tests/lab/nvidia: the lab's GPUs for runc)
                "/usr/bin/nvidia-container-runtime": (NVIDIA_RUNTIME.read_text(), 0o755),
            },
        ),
        Package(
            name="libnvidia-container1",
            version=version,
            repo=repo,
            summary="NVIDIA container runtime library",
        ),
        Package(
            name="libnvidia-container-tools",
            version=version,
            repo=repo,
            summary="NVIDIA container runtime library (command-line tools)",
            depends=[f"libnvidia-container1 (>= {upstream})"],
        ),
        Package(
            name="nvidia-container-toolkit",
            version=version,
            repo=repo,
            summary="NVIDIA Container toolkit",
            depends=[
                f"nvidia-container-toolkit-base (= {version})",
                f"libnvidia-container-tools (= {version})",
                "libnvidia-container-tools (<< 2.0.0)",
            ],
        ),
    ]


def driver_repository_packages(spec: dict) -> list[Package]:
    """Every driver package of the mirror: each release of NVIDIA's CUDA repo, Ubuntu's -server builds of the
    releases marked `server` (the branches the roles install), and the cuda-drivers metapackage that always
    follows the newest branch."""
    packages: list[Package] = []
    newest_branch = max(spec["driver_branches"], key=lambda b: [int(x) for x in b["upstream"].split(".")])
    for release in spec["driver_branches"]:
        packages += driver_packages(release["branch"], release["upstream"], "cuda")
        if release.get("server"):
            packages += driver_packages(release["branch"], release["upstream"], "ubuntu-restricted")
    packages.append(
        Package(
            name="cuda-drivers",
            version=f"{newest_branch['upstream']}-1",
            repo="cuda",
            summary="CUDA drivers metapackage: always the newest branch (the trap the roles avoid)",
            depends=[f"cuda-drivers-{newest_branch['branch']} (>= {newest_branch['upstream']})"],
        )
    )
    return packages


def all_packages(spec: dict, cache: Path) -> list[Package]:
    packages = driver_repository_packages(spec)
    for toolkit in spec["cuda_toolkits"]:
        release = toolkit["release"]
        prefix = f"/usr/local/cuda-{release}"
        priority = release.replace(".", "")
        packages.append(
            Package(
                name=toolkit["name"],
                version=toolkit["version"],
                repo="cuda",
                summary=f"CUDA Toolkit {release} meta-package",
                files={
                    f"{prefix}/bin/nvcc": (payload("nvcc", release=release, nvcc=toolkit["nvcc"]), 0o755),
                    f"{prefix}/version.json": (
                        json.dumps(
                            {"cuda": {"name": "CUDA SDK", "version": toolkit["version"].split("-")[0]}}
                        )
                        + "\n",
                        0o644,
                    ),
                },
                postinst=f"update-alternatives --install /usr/local/cuda cuda {prefix} {priority}\n",
                prerm=f'if [ "$1" = remove ]; then update-alternatives --remove cuda {prefix}; fi\n',
            )
        )
    meta = spec["cuda_metapackage"]
    packages.append(
        Package(
            name="cuda",
            version=meta["version"],
            repo="cuda",
            summary="CUDA metapackage: newest toolkit AND newest driver (the trap the roles avoid)",
            depends=[
                f"{meta['toolkit']} (>= {meta['version'].split('-')[0]})",
                f"cuda-drivers (>= {meta['min_driver']})",
            ],
        )
    )
    packages += container_toolkit_packages(spec["container_toolkit"]["version"], "cuda")
    for version in spec["libnvidia_container"]["versions"]:
        packages += container_toolkit_packages(version, "libnvidia-container")
    builds = {name: gobuild.build(gobuild.BY_NAME[name]) for name in GO_COMPONENTS}
    packages.append(containerd_io_package(spec["containerd_io"]["version"], "containerd", builds))
    packages.append(containerd_io_package(spec["containerd_io"]["newer"], "containerd-next", builds))
    packages += kubernetes_packages(spec["kubernetes"], builds)
    packages += kubernetes_packages(spec["kubernetes"]["next"], builds, "-next")
    return packages


def kubernetes_packages(k8s: dict, builds: dict[str, Path], suffix: str = "") -> list[Package]:
    """pkgs.k8s.io's packages of one minor, each in every version packages.yml lists: of the pinned minor,
    or (suffix "-next") of the next one, from the -next builds, into the repository kubernetes-next.
    Depends as pkgs.k8s.io builds them (kubernetes/release cmd/krel/templates/latest/metadata.yaml):
    kubelet (>= 1.28) needs kubernetes-cni (>= 1.2.0), kubeadm (>= 1.32) and kubectl need nothing, cri-tools
    nothing.

    The first version of each list is the one the site pins: its package carries the real binaries the lab
    built (tests/lab/gobuild). The others are newer builds that must never be installed: their programs only
    say so and fail, so a pin that lets one in fails loudly."""
    cni = builds["cni-plugins"]
    crictl = builds["cri-tools" + suffix] / "crictl"
    kubernetes = builds["kubernetes" + suffix]
    repo = "kubernetes" + suffix
    crictl_built = gobuild.required_version(gobuild.BY_NAME["cri-tools" + suffix])
    cni_built = gobuild.required_version(gobuild.BY_NAME["cni-plugins"])
    if "v" + k8s["cni"][0].split("-")[0] != cni_built:
        raise SystemExit(
            f"build_mirror: packages.yml's kubernetes-cni {k8s['cni'][0]} is not the lab's build {cni_built}"
        )

    def trap(tool: str, version: str) -> str:
        return payload("newer-build-trap", tool=tool, version=version)

    packages = []
    for index, version in enumerate(k8s["cri_tools"]):
        built = index == 0
        packages.append(
            Package(
                name="cri-tools",
                version=version,
                repo=repo,
                summary="Command-line utility for interacting with a container runtime",
                binary_files={"/usr/bin/crictl": (crictl, 0o755)} if built else {},
                files={} if built else {"/usr/bin/crictl": (trap("crictl", version), 0o755)},
                upstream=f"sigs.k8s.io/cri-tools {crictl_built}" if built else "",
            )
        )
    for index, version in enumerate(k8s["cni"]):
        built = index == 0
        plugins = sorted(path for path in cni.iterdir() if path.is_file() and not path.name.startswith("."))
        packages.append(
            Package(
                name="kubernetes-cni",
                version=version,
                repo=repo,
                summary="Binaries required to provision kubernetes container networking",
                binary_files={f"/opt/cni/bin/{path.name}": (path, 0o755) for path in plugins}
                if built
                else {},
                files={} if built else {"/opt/cni/bin/README.lab": (trap("kubernetes-cni", version), 0o644)},
                upstream=f"github.com/containernetworking/plugins {cni_built}" if built else "",
            )
        )
    pinned_k8s = "v" + k8s["versions"][0].split("-")[0]
    built_k8s = gobuild.required_version(gobuild.BY_NAME["kubernetes" + suffix])
    if pinned_k8s != built_k8s:
        raise SystemExit(
            f"build_mirror: packages.yml's kubernetes {pinned_k8s} is not the lab's build {built_k8s}"
        )
    for index, version in enumerate(k8s["versions"]):
        built = index == 0
        for tool in ("kubeadm", "kubectl", "kubelet"):
            files: dict[str, tuple[str, int]] = {}
            binaries: dict[str, tuple[Path, int]] = {}
            if built:
                binaries[f"/usr/bin/{tool}"] = (kubernetes / tool, 0o755)
            else:
                files[f"/usr/bin/{tool}"] = (trap(tool, version), 0o755)
            depends = []
            if tool == "kubelet":
                files["/lib/systemd/system/kubelet.service"] = (payload("kubelet.service"), 0o644)
                depends.append("kubernetes-cni (>= 1.2.0)")
            if tool == "kubeadm":
                files["/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf"] = (
                    payload("10-kubeadm.conf"),
                    0o644,
                )
            packages.append(
                Package(
                    name=tool,
                    version=version,
                    repo=repo,
                    summary=f"Kubernetes {tool}",
                    files=files,
                    binary_files=binaries,
                    depends=depends,
                    upstream=f"k8s.io/kubernetes {built_k8s}" if built else "",
                )
            )
    return packages


def control_file(pkg: Package) -> str:
    lines = [
        f"Package: {pkg.name}",
        f"Version: {pkg.version}",
        f"Architecture: {pkg.architecture}",
        "Maintainer: LLM platform lab <lab@llm-lab.invalid>",
        "Section: lab",
        "Priority: optional",
    ]
    for key, values in (("Depends", pkg.depends), ("Provides", pkg.provides), ("Conflicts", pkg.conflicts)):
        if values:
            lines.append(f"{key}: {', '.join(values)}")
    if pkg.conflicts:
        lines.append(f"Replaces: {', '.join(pkg.conflicts)}")
    if pkg.upstream:
        lines.append(f"Description: {pkg.summary} (lab build of the real program)")
        lines.append(f" The real binaries, built by the lab from the upstream Go module {pkg.upstream}")
        lines.append(" (tests/lab/gobuild), under the vendor's package name, version and Depends.")
    else:
        lines.append(f"Description: {pkg.summary} (LAB STAND-IN)")
        lines.append(" Lab stand-in for the vendor package of this name and version. It installs only")
        lines.append(" what the project's tests observe; it contains no vendor software.")
    return "\n".join(lines) + "\n"


def build_deb(pkg: Package, out_dir: Path, scratch: Path) -> Path:
    root = scratch / pkg.repo / f"{pkg.name}_{pkg.version}"  # one package may be in two repositories
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(control_file(pkg))
    for script, body in (("postinst", pkg.postinst), ("prerm", pkg.prerm)):
        if body:
            path = root / "DEBIAN" / script
            path.write_text("#!/bin/sh\nset -e\n" + body)
            path.chmod(0o755)
    doc = root / "usr/share/doc" / pkg.name / "README.lab"
    doc.parent.mkdir(parents=True)
    doc.write_text(f"{pkg.name} {pkg.version}: lab stand-in, see docs/lab.md of the project.\n")
    for path, (content, mode) in pkg.files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(mode)
    for path, (source, mode) in pkg.binary_files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(mode)
    if pkg.conffiles:
        (root / "DEBIAN" / "conffiles").write_text("".join(f"{path}\n" for path in pkg.conffiles))
    deb = out_dir / f"{pkg.name}_{pkg.version}_{pkg.architecture}.deb"
    # real binaries (hundreds of MB) are stored, not compressed: the mirror is local, its rebuilds are not
    compression = "-Znone" if pkg.upstream else "-Zgzip"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", compression, "--build", str(root), str(deb)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return deb


def gpg(gnupg_home: Path, *args: str) -> None:
    subprocess.run(
        ["gpg", "--batch", "--yes", "--quiet", "--homedir", str(gnupg_home), *args],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def ensure_key(gnupg_home: Path) -> None:
    gnupg_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    listing = subprocess.run(
        ["gpg", "--batch", "--homedir", str(gnupg_home), "--list-secret-keys", GPG_UID],
        capture_output=True,
    )
    if listing.returncode != 0:
        gpg(gnupg_home, "--passphrase", "", "--quick-gen-key", GPG_UID, "ed25519", "sign", "never")


def write_packages_index(repo_dir: Path) -> None:
    """The flat repository's Packages file (apt-ftparchive), all an unsigned `[trusted=yes]` source needs."""
    packages = subprocess.run(
        ["apt-ftparchive", "packages", "."], cwd=repo_dir, check=True, capture_output=True, text=True
    ).stdout
    (repo_dir / "Packages").write_text(packages)


def build_flat_repo(packages: list[Package], repo_dir: Path) -> None:
    """Build packages into repo_dir with its Packages index, unsigned (the unit tests' apt simulations)."""
    repo_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        for pkg in packages:
            build_deb(pkg, repo_dir, Path(scratch))
    write_packages_index(repo_dir)


def index_flat_repo(repo_dir: Path, origin: str, gnupg_home: Path) -> None:
    write_packages_index(repo_dir)
    release = subprocess.run(
        [
            "apt-ftparchive",
            "-o",
            f"APT::FTPArchive::Release::Origin={origin}",
            "-o",
            "APT::FTPArchive::Release::Label=LLM lab stand-in",
            "release",
            ".",
        ],
        cwd=repo_dir,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (repo_dir / "Release").write_text(release)
    gpg(
        gnupg_home,
        "--local-user",
        GPG_UID,
        "--clearsign",
        "-o",
        str(repo_dir / "InRelease"),
        str(repo_dir / "Release"),
    )
    gpg(
        gnupg_home,
        "--local-user",
        GPG_UID,
        "-abs",
        "-o",
        str(repo_dir / "Release.gpg"),
        str(repo_dir / "Release"),
    )


def build_wheel(version: str, out_dir: Path) -> Path:
    """Package the lab's fake pynvml as nvidia-ml-py, the distribution the roles install."""
    source = FAKE_NVML_DIR / "pynvml.py"
    if not source.is_file():
        raise SystemExit(f"build_mirror: {source} is missing (the lab's fake pynvml)")
    dist = f"nvidia_ml_py-{version}"
    wheel = out_dir / f"{dist}-py3-none-any.whl"
    files = {
        "pynvml.py": source.read_bytes(),
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: nvidia-ml-py\nVersion: {version}\n"
            "Summary: LAB STAND-IN: the project's fake pynvml, driven by /var/lib/fake-nvml/state.json\n"
        ).encode(),
        f"{dist}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: llm-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist}.dist-info/top_level.txt": b"pynvml\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return wheel


def write_simple_index(pypi_dir: Path, project: str, wheel: Path) -> None:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    project_dir = pypi_dir / "simple" / project
    project_dir.mkdir(parents=True, exist_ok=True)
    shutil.move(str(wheel), project_dir / wheel.name)
    (project_dir / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{wheel.name}#sha256={digest}">{wheel.name}</a></body></html>\n'
    )
    (pypi_dir / "simple" / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{project}/">{project}</a></body></html>\n'
    )


# Byte-exact upstream manifests (Calico, the NVIDIA device plugin, ...), served at
# http://lab-mirror:8080/upstream/<project>/<version>/<file> with the SAME bytes (and so the same sha256)
# the roles pin for the upstream URLs: from ../shared/upstream/ where the checkout has it, otherwise
# downloaded from the pinned URL into the lab's cache (tests/lab/upstream_manifests.py, their one home);
# never copied into the repository.
def copy_upstream_manifests(target: Path, cache: Path) -> None:
    for path in upstream_manifests.MANIFESTS:
        try:
            source = upstream_manifests.manifest(path, cache=cache)
        except upstream_manifests.UpstreamError as error:
            raise SystemExit(f"build_mirror: {error}") from error
        destination = target / path
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination)


def build(output: Path, gnupg_home: Path) -> None:
    spec = yaml.safe_load((HERE / "packages.yml").read_text())
    ensure_key(gnupg_home)
    staging = Path(tempfile.mkdtemp(prefix="llm-lab-mirror."))
    try:
        tree = staging / "tree"
        packages = all_packages(spec, gnupg_home.parent / "cache")
        for rel in REPO_PATHS.values():
            (tree / rel).mkdir(parents=True)
        with tempfile.TemporaryDirectory() as scratch:
            for pkg in packages:
                build_deb(pkg, tree / REPO_PATHS[pkg.repo], Path(scratch))
        for repo, rel in REPO_PATHS.items():
            index_flat_repo(tree / rel, f"llm-lab-{repo}", gnupg_home)
        (tree / "keys").mkdir()
        key = subprocess.run(
            ["gpg", "--batch", "--homedir", str(gnupg_home), "--armor", "--export", GPG_UID],
            check=True,
            capture_output=True,
        ).stdout
        (tree / "keys" / "lab-archive-key.asc").write_bytes(key)
        (tree / "nvidia").mkdir()
        for upstream in spec["run_installers"]:
            runfile = tree / "nvidia" / f"NVIDIA-Linux-x86_64-{upstream}.run"
            runfile.write_text(
                payload(
                    "nvidia-installer.run",
                    version=upstream,
                    lib=payload("libnvidia-ml.so.1", version=upstream),
                    smi=payload("nvidia-smi"),
                )
            )
            runfile.chmod(0o755)
        (tree / "pypi").mkdir()
        write_simple_index(tree / "pypi", "nvidia-ml-py", build_wheel(spec["pypi"]["nvidia-ml-py"], staging))
        model_tool_wheels.add_to_index(tree / "pypi", gnupg_home.parent / "cache" / "wheels")
        copy_upstream_manifests(tree / "upstream", gnupg_home.parent / "cache" / "upstream")
        # Swap in whole so a running mirror never serves a half-written tree for long.
        if output.exists():
            old = output.with_name(output.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            output.rename(old)
            shutil.rmtree(old)
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(tree), output)
        count = len(packages)
        print(
            f"lab-mirror: {count} stand-in packages in {len(REPO_PATHS)} signed repos,"
            " a pypi index and .run installers"
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: build_mirror.py OUTPUT_DIR GNUPG_HOME")
    os.umask(0o022)
    build(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())


if __name__ == "__main__":
    main()
