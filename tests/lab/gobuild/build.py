#!/usr/bin/env python3
"""Build the lab's real components from their upstream Go modules, at the versions production pins.

    build.py [COMPONENT...]          build (or reuse) every component, or those named; print each binary
    build.py --update [COMPONENT...] rewrite a component's go.mod/go.sum from its pin (needs the Go proxy)
    build.py --list                  the components, their modules and versions

Each component is a directory here holding a go.mod (and go.sum) of our own that requires the upstream
module at its pinned version and declares the upstream commands as `tool`s; nothing of upstream is copied
into the repository, and no binary is committed. `go build` of those packages, with the flags upstream's
release builds use (version variables, CGO as upstream builds it), writes the binaries into
$LAB_GO_CACHE/<component>/<key>/ (default ~/.cache/llm-lab/go, outside the work tree so that a fresh clone
reuses them), where <key> hashes the go.mod, the go.sum, the build flags and the Go version: a rebuild
happens only when a pin changes. `go version -m BINARY` shows the upstream module and its version.

Where the versions come from (their one home each, checked here against go.mod before anything builds):
- kubernetes: roles/kubernetes/defaults/main.yml kubernetes_version;
- containerd: roles/containerd/defaults/main.yml containerd_version; runc: the release that containerd
  tag is tested with (its script/setup/runc-version); containerd-next: tests/lab/mirror/packages.yml
  containerd_io's newer build (the lab's containerd upgrade target, a newer containerd.io in Docker's
  repository as the real one has);
- etcd and CoreDNS: the versions kubeadm of that Kubernetes release deploys (its constants.go);
- cri-tools and the CNI plugins: tests/lab/mirror/packages.yml (what pkgs.k8s.io publishes with that minor);
- kubernetes-next, cri-tools-next: packages.yml's next minor (the lab's Kubernetes upgrade target);
  etcd-next, coredns-next: what kubeadm of that release deploys;
- Prometheus and Alertmanager: roles/monitoring/defaults/main.yml image tags.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
CACHE = Path(os.environ.get("LAB_GO_CACHE", Path.home() / ".cache" / "llm-lab" / "go"))


def log(message: str) -> None:
    print(f"lab-go: {message}", flush=True)


class BuildError(RuntimeError):
    pass


def load_yaml(path: Path) -> object:
    """A YAML file's content, parsed once per process while the file is unchanged: `labctl up` asks the same
    defaults and packages.yml ~40 times (every pin, every image). Keyed by the file's size, mtime and inode,
    so a file edited while a process runs is read again; with libyaml's loader where PyYAML has it. Every
    caller gets the same object: read it, never change it."""
    stat = path.stat()
    return _load_yaml(path, stat.st_size, stat.st_mtime_ns, stat.st_ino)


@functools.lru_cache(maxsize=64)
def _load_yaml(path: Path, _size: int, _mtime_ns: int, _inode: int) -> object:
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def role_default(role: str, variable: str) -> str:
    defaults = load_yaml(REPO / "roles" / role / "defaults" / "main.yml")
    return str(defaults[variable])


def mirror_version(key: str, release: str = "") -> str:
    """An upstream version from tests/lab/mirror/packages.yml's kubernetes versions (1.7.1-1.1 -> 1.7.1); of
    its `next` minor (the lab's upgrade target) where release is "next"."""
    packages = load_yaml(REPO / "tests" / "lab" / "mirror" / "packages.yml")
    value = (packages["kubernetes"][release] if release else packages["kubernetes"])[key]
    # a list: the first is what the site pins, the others newer builds that must not be picked up
    return str(value[0] if isinstance(value, list) else value).split("-")[0]


def image_tag(role: str, variable: str) -> str:
    return role_default(role, variable).rsplit(":", 1)[1]


def module_dir(module: str, version: str) -> Path:
    """The module's extracted source in the module cache (downloaded first if needed). Asked once per process
    for each module and version (the pins ask kubeadm's constants ~20 times): a version's source in Go's
    module cache never changes (go makes it read-only); asked again if the cache was emptied meanwhile."""
    found = _module_dir(module, version)
    if not found.is_dir():
        _module_dir.cache_clear()
        found = _module_dir(module, version)
    return found


@functools.cache
def _module_dir(module: str, version: str) -> Path:
    found = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True, check=False
    )
    info = json.loads(found.stdout or "{}")
    if found.returncode != 0 or "Dir" not in info:
        raise BuildError(f"go mod download {module}@{version}: {info.get('Error') or found.stderr.strip()}")
    return Path(info["Dir"])


def kubernetes_next_version() -> str:
    """The lab's Kubernetes upgrade target: packages.yml's next minor (1.37.2-1.1 -> v1.37.2)."""
    return "v" + mirror_version("versions", "next")


def kubeadm_constant(name: str, version: str = "") -> str:
    """A constant of kubeadm's constants.go (etcd, CoreDNS, pause) at the pinned Kubernetes version, or at
    the version named (the lab's upgrade target)."""
    version = version or "v" + role_default("kubernetes", "kubernetes_version")
    source = module_dir("k8s.io/kubernetes", version)
    text = (source / "cmd" / "kubeadm" / "app" / "constants" / "constants.go").read_text()
    match = re.search(rf'^\s*{name}\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if not match:
        raise BuildError(f"kubeadm's constants.go has no {name}")
    return match[1]


def containerd_io_newer_version() -> str:
    """The newer containerd.io the mirror carries beside the pinned one: 2.3.7-1~ubuntu.22.04~jammy, 2.3.7."""
    packages = load_yaml(REPO / "tests" / "lab" / "mirror" / "packages.yml")
    return "v" + str(packages["containerd_io"]["newer"]).split("-")[0]


def containerd_runc_version() -> str:
    source = module_dir(
        "github.com/containerd/containerd/v2", "v" + role_default("containerd", "containerd_version")
    )
    return (source / "script" / "setup" / "runc-version").read_text().strip()


def k8s_ldflags(version: str) -> list[str]:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return flags


def prometheus_ldflags(version: str) -> list[str]:
    base = "github.com/prometheus/common/version"
    return [
        f"-X {base}.Version={version.lstrip('v')}",
        f"-X {base}.Branch=HEAD",
        f"-X {base}.BuildUser=llm-lab",
    ]


@dataclass(frozen=True)
class Component:
    """One upstream module and the commands built from it."""

    name: str  # the directory here
    module: str  # the upstream module go.mod requires
    pin: Callable[[], str]  # its version, from the version's home
    commands: tuple[str, ...]  # import paths of the main packages built
    ldflags: Callable[[str], list[str]] = lambda _version: []
    cgo: bool = False
    tags: tuple[str, ...] = ()
    # replace lines our go.mod needs: upstream's own module replaces its sibling modules with local paths
    # (ignored in a dependency), so they point at the same release instead; and upstream's replacements
    # of third-party modules, which its release builds use
    replaces: Callable[[str], dict[str, str]] = lambda _version: {}
    own: bool = False  # the lab's own programs (this repository's code): no upstream pin to check
    # (go build's name, the name upstream's release gives it) where they differ: go build names a binary
    # after its package's last path element that is not a major version (go.etcd.io/etcd/server/v3: server)
    renamed: tuple[tuple[str, str], ...] = ()


def k8s_staging_replaces(version: str) -> dict[str, str]:
    """k8s.io/kubernetes replaces its staging modules (k8s.io/api, ...) with ./staging: use v0.MINOR.PATCH."""
    source = module_dir("k8s.io/kubernetes", version)
    gomod = (source / "go.mod").read_text()
    staging = re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/", gomod, re.MULTILINE)
    release = "v0." + ".".join(version.lstrip("v").split(".")[1:])
    return {module: f"{module} {release}" for module in staging}


def etcd_sibling_replaces(version: str) -> dict[str, str]:
    source = module_dir("go.etcd.io/etcd/v3", version)
    gomod = (source / "go.mod").read_text()
    siblings = re.findall(r"^\s*(go\.etcd\.io/etcd/[\w/.-]+) => \./", gomod, re.MULTILINE)
    return {module: f"{module} {version}" for module in siblings}


def upstream_third_party_replaces(module: str) -> Callable[[str], dict[str, str]]:
    def replaces(version: str) -> dict[str, str]:
        gomod = (module_dir(module, version) / "go.mod").read_text()
        found = re.findall(r"^\s*(\S+) => (\S+ v\S+)\s*$", gomod, re.MULTILINE)
        return dict(found)

    return replaces


KUBERNETES_COMMANDS = tuple(
    f"k8s.io/kubernetes/cmd/{name}"
    for name in (
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
        "kubelet",
        "kubeadm",
        "kubectl",
    )
)
CNI_PLUGINS = (
    "main/bridge",
    "main/host-device",
    "main/ipvlan",
    "main/loopback",
    "main/macvlan",
    "main/ptp",
    "main/vlan",
    "ipam/host-local",
    "ipam/static",
    "meta/bandwidth",
    "meta/firewall",
    "meta/portmap",
    "meta/sbr",
    "meta/tuning",
)


def containerd_component(name: str, pin: Callable[[], str]) -> Component:
    """containerd's daemon, shim and ctr, built as upstream's release builds them."""
    return Component(
        name,
        "github.com/containerd/containerd/v2",
        pin,
        tuple(
            f"github.com/containerd/containerd/v2/cmd/{command}"
            for command in ("containerd", "containerd-shim-runc-v2", "ctr")
        ),
        ldflags=lambda version: [
            f"-X github.com/containerd/containerd/v2/version.Version={version}",
            "-X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2",
        ],
        tags=("no_btrfs", "no_devmapper"),
    )


def kubernetes_component(name: str, pin: Callable[[], str]) -> Component:
    return Component(name, "k8s.io/kubernetes", pin, KUBERNETES_COMMANDS, ldflags=k8s_ldflags,
                     replaces=k8s_staging_replaces)  # fmt: skip


def etcd_component(name: str, pin: Callable[[], str]) -> Component:
    return Component(
        name,
        "go.etcd.io/etcd/v3",
        pin,
        # the server's main package is its own module's root (server/main.go); the release's root module
        # holds no command (dummy.go, a test file) but stays required: its version is the pin checked
        (
            "go.etcd.io/etcd/v3",
            "go.etcd.io/etcd/server/v3",
            "go.etcd.io/etcd/etcdctl/v3",
            "go.etcd.io/etcd/etcdutl/v3",
        ),
        replaces=etcd_sibling_replaces,
        renamed=(("server", "etcd"),),
    )


def coredns_component(name: str, pin: Callable[[], str]) -> Component:
    return Component(
        name,
        "github.com/coredns/coredns",
        pin,
        ("github.com/coredns/coredns",),
        ldflags=lambda version: [f"-X github.com/coredns/coredns/coremain.GitCommit={version}"],
    )


def cri_tools_component(name: str, pin: Callable[[], str]) -> Component:
    return Component(
        name,
        "sigs.k8s.io/cri-tools",
        pin,
        ("sigs.k8s.io/cri-tools/cmd/crictl",),
        ldflags=lambda version: [f"-X sigs.k8s.io/cri-tools/pkg/version.Version={version}"],
    )


COMPONENTS = (
    kubernetes_component("kubernetes", lambda: "v" + role_default("kubernetes", "kubernetes_version")),
    etcd_component("etcd", lambda: "v" + kubeadm_constant("DefaultEtcdVersion").split("-")[0]),
    coredns_component("coredns", lambda: kubeadm_constant("CoreDNSVersion")),
    # the lab's Kubernetes upgrade target (packages.yml's next minor) and what kubeadm of it deploys
    kubernetes_component("kubernetes-next", kubernetes_next_version),
    etcd_component(
        "etcd-next",
        lambda: "v" + kubeadm_constant("DefaultEtcdVersion", kubernetes_next_version()).split("-")[0],
    ),
    coredns_component("coredns-next", lambda: kubeadm_constant("CoreDNSVersion", kubernetes_next_version())),
    containerd_component("containerd", lambda: "v" + role_default("containerd", "containerd_version")),
    containerd_component("containerd-next", containerd_io_newer_version),
    Component(
        "runc",
        "github.com/opencontainers/runc",
        containerd_runc_version,
        ("github.com/opencontainers/runc",),
        ldflags=lambda version: [f"-X main.version={version.lstrip('v')}"],
        cgo=True,  # nsenter is C; seccomp links libseccomp, as upstream's release does
        tags=("seccomp",),
    ),
    cri_tools_component("cri-tools", lambda: "v" + mirror_version("cri_tools")),
    cri_tools_component("cri-tools-next", lambda: "v" + mirror_version("cri_tools", "next")),
    Component(
        "cni-plugins",
        "github.com/containernetworking/plugins",
        lambda: "v" + mirror_version("cni"),
        tuple(f"github.com/containernetworking/plugins/plugins/{name}" for name in CNI_PLUGINS),
        ldflags=lambda version: [
            f"-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion={version}"
        ],
    ),
    Component(
        "prometheus",
        "github.com/prometheus/prometheus",
        # Prometheus 2.x tags its Go module v0.MINOR.PATCH (v2.53.0 is module v0.53.0)
        lambda: (
            "v0."
            + ".".join(image_tag("monitoring", "monitoring_prometheus_image").lstrip("v").split(".")[1:])
        ),
        ("github.com/prometheus/prometheus/cmd/prometheus", "github.com/prometheus/prometheus/cmd/promtool"),
        ldflags=lambda version: prometheus_ldflags("2." + version.split(".", 1)[1]),
        replaces=upstream_third_party_replaces("github.com/prometheus/prometheus"),
    ),
    Component(
        "alertmanager",
        "github.com/prometheus/alertmanager",
        lambda: image_tag("monitoring", "monitoring_alertmanager_image"),
        (
            "github.com/prometheus/alertmanager/cmd/alertmanager",
            "github.com/prometheus/alertmanager/cmd/amtool",
        ),
        ldflags=prometheus_ldflags,
    ),
    Component(
        "registry",
        "github.com/distribution/distribution/v3",
        lambda: "v3.0.0",  # the lab's own OCI registry (not a production component): its pin lives here
        ("github.com/distribution/distribution/v3/cmd/registry",),
        ldflags=lambda version: [f"-X github.com/distribution/distribution/v3/version.version={version}"],
    ),
    Component(
        "kube-router",
        "github.com/cloudnativelabs/kube-router/v2",
        # the lab's pod network and NetworkPolicy data plane (docs/lab.md: Calico's own components cannot be
        # built here); v2.1.0 is the release the Go proxy serves
        lambda: "v2.1.0",
        ("github.com/cloudnativelabs/kube-router/v2/cmd/kube-router",),
        ldflags=lambda version: [
            f"-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version={version}"
        ],
    ),
)
LAB_PROGRAMS = Component(
    "lab-programs",
    "lab.local/gobuild/lab-programs",
    lambda: "devel",
    # the lab's own programs (docs/lab.md: each stands in where nothing real can run here)
    ("./cmd/pause", "./cmd/nvidia-device-plugin", "./cmd/calico-standin", "./cmd/grafana-standin"),
    own=True,
)
BY_NAME = {component.name: component for component in (*COMPONENTS, LAB_PROGRAMS)}


def go(*args: str, cwd: Path, cgo: bool = False, mod: str = "readonly") -> subprocess.CompletedProcess[str]:
    """go ARGS in CWD: the local toolchain, go.mod read-only unless updating, CGO where upstream uses it."""
    env = {
        **os.environ,
        "GOFLAGS": f"-mod={mod} -buildvcs=false",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": str(int(cgo)),
    }
    return subprocess.run(["go", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)


@functools.cache
def go_version() -> str:
    """The Go toolchain's version (asked once per process: every build's cache key holds it)."""
    return subprocess.run(
        ["go", "env", "GOVERSION"], capture_output=True, text=True, check=True
    ).stdout.strip()


def required_version(component: Component) -> str:
    if component.own:
        return "devel"
    gomod = (HERE / component.name / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(component.module)} (v\S+)", gomod, re.MULTILINE)
    if not match:
        raise BuildError(
            f"{component.name}/go.mod does not require {component.module}: run build.py --update"
        )
    return match[1]


def check_pin(component: Component) -> str:
    """go.mod's version of the module, refused unless it is the pin's (its home named)."""
    if component.own:
        return "devel"
    pinned, required = component.pin(), required_version(component)
    if pinned != required:
        raise BuildError(
            f"{component.name}: go.mod requires {component.module} {required} but the pin is {pinned}: "
            f"run `tests/lab/gobuild/build.py --update {component.name}` (needs the Go module proxy)"
        )
    return required


def update(component: Component) -> None:
    """Rewrite go.mod/go.sum: the pinned module, its replace lines, the commands as tools."""
    if component.own:
        tidy = go("mod", "tidy", cwd=HERE / component.name, mod="mod")
        if tidy.returncode != 0:
            raise BuildError(f"{component.name}: go mod tidy: {tidy.stderr.strip()[-2000:]}")
        return
    version = component.pin()
    directory = HERE / component.name
    directory.mkdir(exist_ok=True)
    replaces = component.replaces(version)
    lines = [f"module lab.local/gobuild/{component.name}", "", f"go {go_version().removeprefix('go')}", ""]
    if replaces:
        lines += [
            "replace (",
            *(f"\t{module} => {target}" for module, target in sorted(replaces.items())),
            ")",
            "",
        ]
    (directory / "go.mod").write_text("\n".join(lines))
    (directory / "go.sum").unlink(missing_ok=True)
    log(f"{component.name}: go get -tool {component.module}@{version} ({len(component.commands)} commands)")
    for command in component.commands:
        got = go("get", "-tool", f"{command}@{version}", cwd=directory, mod="mod")
        if got.returncode != 0:
            raise BuildError(
                f"{component.name}: go get -tool {command}@{version}: {got.stderr.strip()[-2000:]}"
            )
    tidy = go("mod", "tidy", cwd=directory, mod="mod")
    if tidy.returncode != 0 and TEST_ONLY_REFUSED in tidy.stderr:
        # tidy also loads the tests of the packages it keeps: etcd 3.7.0's root package (a test file that
        # imports its test suite) reaches go.etcd.io/etcd/cache/v3 v3.7.0, which the Go proxy refuses. A
        # module only tests need does not stop the commands building (the build proves it): -e goes past it.
        log(f"{component.name}: go mod tidy: {TEST_ONLY_REFUSED} refused by the Go proxy; again with -e")
        tidy = go("mod", "tidy", "-e", cwd=directory, mod="mod")
    if tidy.returncode != 0:
        raise BuildError(f"{component.name}: go mod tidy: {tidy.stderr.strip()[-2000:]}")


# the one module go mod tidy may leave unresolved (above): only etcd's test suite imports it
TEST_ONLY_REFUSED = "go.etcd.io/etcd/cache/v3"


def build_key(component: Component, version: str) -> str:
    directory = HERE / component.name
    h = hashlib.sha256()
    sources = ["go.mod", "go.sum"]
    if component.own:  # its code is here: every Go file counts
        sources += sorted(str(path.relative_to(directory)) for path in directory.rglob("*.go"))
    for name in sources:
        if (directory / name).is_file():
            h.update(name.encode() + b"\0" + (directory / name).read_bytes())
    spec = {
        "commands": component.commands,
        "ldflags": component.ldflags(version),
        "cgo": component.cgo,
        "tags": component.tags,
        "go": go_version(),
    }
    if component.renamed:  # only then: the other components' keys stay
        spec["renamed"] = component.renamed
    h.update(json.dumps(spec, sort_keys=True).encode())
    return h.hexdigest()[:16]


def output_dir(component: Component) -> Path:
    version = required_version(component)
    return CACHE / component.name / f"{version}-{build_key(component, version)}"


def upstream_modules(binary: Path) -> list[tuple[str, str]]:
    """(module, version) of the binary's main package's module and its dependencies, as `go version -m`
    shows them (a replaced module counts with the version it was replaced by)."""
    shown = subprocess.run(["go", "version", "-m", str(binary)], capture_output=True, text=True, check=True)
    found = []
    for line in shown.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] in ("mod", "dep"):
            found.append((fields[1], fields[2]))
        elif len(fields) >= 3 and fields[0] == "=>" and found:
            found[-1] = (found[-1][0], fields[2])
    return found


def build(component: Component) -> Path:
    """The directory holding the component's binaries, built unless the cache has them (one build at a time
    per component: a second caller waits for the first's result)."""
    version = check_pin(component)
    target = output_dir(component)
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f"{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").is_file():
            return target
        return _build(component, version, target)


def _build(component: Component, version: str, target: Path) -> Path:
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    flags = ["-trimpath", "-ldflags", " ".join(["-s", "-w", *component.ldflags(version)])]
    if component.tags:
        flags += ["-tags", ",".join(component.tags)]
    log(f"{component.name}: building {component.module} {version} ({len(component.commands)} commands)")
    started = time.monotonic()
    built = go("build", *flags, "-o", str(staging) + "/", *component.commands, cwd=HERE / component.name,
               cgo=component.cgo)  # fmt: skip
    if built.returncode != 0:
        raise BuildError(f"{component.name}: go build failed:\n{built.stderr.strip()[-4000:]}")
    for built_name, name in component.renamed:
        (staging / built_name).rename(staging / name)
    for binary in sorted(staging.iterdir()) if not component.own else []:
        named = upstream_modules(binary)
        if not any(
            version == found and module.startswith(component.module.split("/v")[0]) for module, found in named
        ):
            raise BuildError(f"{binary.name}: go version -m names no {component.module} {version}: {named}")
    (staging / ".complete").write_text(f"{component.module} {version} {go_version()}\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    log(f"{component.name}: built in {time.monotonic() - started:.0f}s -> {target}")
    return target


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("components", nargs="*", help=f"some of: {' '.join(BY_NAME)}")
    parser.add_argument("--update", action="store_true", help="rewrite go.mod/go.sum from the pins")
    parser.add_argument("--list", action="store_true", help="the components and their pins")
    args = parser.parse_args()
    unknown = [name for name in args.components if name not in BY_NAME]
    if unknown:
        parser.error(f"unknown component(s) {' '.join(unknown)}; known: {' '.join(BY_NAME)}")
    chosen = [BY_NAME[name] for name in args.components] or list(COMPONENTS)
    try:
        if shutil.which("go") is None:
            raise BuildError("no `go` on PATH: the lab builds its Kubernetes from Go modules (Go 1.26)")
        for component in chosen:
            if args.list:
                print(f"{component.name}\t{component.module}\t{required_version(component)}")
            elif args.update:
                update(component)
            else:
                print(build(component))
    except BuildError as err:
        print(f"lab-go: ERROR: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
