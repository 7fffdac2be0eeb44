"""kubeadm stand-in for the lab: ``python3 -m kube_standin.kubeadm`` (installed as /usr/bin/kubeadm).

Subcommands as real kubeadm 1.36 has them: ``init``, ``join``, ``token create``, ``reset``,
``config validate``, ``version``. It decodes ``--config`` like kubeadm (see kubeadm_api.py), writes a
real PKI (openssl), kubeconfigs and static pod manifests, starts the API server stand-in as the
systemd unit ``kube-apiserver-standin.service`` (where real kubeadm has the kubelet run the static pod),
creates the objects kubeadm creates, and starts the kubelet stand-in. What differs from the real tool
is listed in docs/lab.md ("Lab Kubernetes").
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import kubeadm_api, pki
from .nodeclient import ApiError, Client
from .yamlio import YAMLError, dump, load_all

VERSION = os.environ.get("KUBE_STANDIN_VERSION", "v1.36.3")
MIN_CONTROL_PLANE = (1, 35)
ROOT = os.environ.get("KUBE_STANDIN_ROOT", "")  # a filesystem prefix, for running off a lab node
KUBE_DIR = "/etc/kubernetes"
KUBELET_DIR = "/var/lib/kubelet"
ETCD_DIR = "/var/lib/etcd"
APISERVER_UNIT = "kube-apiserver-standin.service"
APISERVER_ENV = f"{KUBE_DIR}/kube-apiserver-standin.env"
APISERVER_STATE = f"{ETCD_DIR}/kube-standin-state.json"  # the stand-in's etcd
DEFAULT_CRI = "unix:///var/run/containerd/containerd.sock"
DEFAULT_SERVICE_SUBNET = "10.96.0.0/12"
IMAGE_REPOSITORY = "registry.k8s.io"
COREDNS_TAG = "v1.12.1"
PAUSE_TAG = "3.10.1"
TOKEN_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
LAB_CSR_ROLE = "lab:kube-controller-manager-csr"
# flags real kubeadm allows next to --config (anything else: "can not mix '--config' with arguments")
CONFIG_COMPATIBLE = {
    "config",
    "ignore_preflight_errors",
    "skip_phases",
    "upload_certs",
    "dry_run",
    "v",
    "certificate_key",
    "skip_token_print",
    "skip_certificate_key_print",
    "patches",
    "rootfs",
}
INIT_PHASES = (
    "preflight",
    "certs",
    "kubeconfig",
    "etcd",
    "control-plane",
    "kubelet-start",
    "wait-control-plane",
    "upload-config",
    "upload-certs",
    "mark-control-plane",
    "bootstrap-token",
    "kubelet-finalize",
    "addon",
    "addon/coredns",
    "addon/kube-proxy",
    "show-join-command",
)
JOIN_PHASES = (
    "preflight",
    "control-plane-prepare",
    "kubelet-start",
    "control-plane-join",
    "wait-control-plane",
)


class KubeadmError(Exception):
    pass


def p(path: str) -> Path:
    return Path(ROOT + path)


def log(message: str) -> None:
    print(message, flush=True)


def warn(message: str) -> None:
    stamp = dt.datetime.now().strftime("%m%d %H:%M:%S.%f")
    print(f"W{stamp} {os.getpid():>7} kubeadm.go] {message}", file=sys.stderr, flush=True)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ----------------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------------
def read_config(path: str, strict: bool) -> dict[str, dict[str, Any]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise KubeadmError(f"unable to read config from {path!r} : {exc.strerror}") from None
    try:
        docs = load_all(text)
    except YAMLError as exc:
        raise KubeadmError(f"{path}: error converting YAML to JSON: {exc}") from None
    decoded = kubeadm_api.decode(docs, path)
    if decoded.errors:
        raise KubeadmError("\n".join(decoded.errors))
    if decoded.unknown:
        if strict:
            raise KubeadmError("\n".join(decoded.unknown))
        for complaint in decoded.unknown:
            warn(f'"{complaint}"')
    return decoded.documents


def semantic_errors(docs: dict[str, dict[str, Any]]) -> list[str]:
    """The validation kubeadm runs on decoded configs (the subset the stand-in knows)."""
    errors = []
    cluster = docs.get("ClusterConfiguration", {})
    net = cluster.get("networking") or {}
    for key in ("podSubnet", "serviceSubnet"):
        value = net.get(key)
        if value:
            for cidr in value.split(","):
                try:
                    ipaddress.ip_network(cidr.strip(), strict=False)
                except ValueError:
                    errors.append(f'networking.{key}: Invalid value: "{value}": couldn\'t parse subnet')
    version = cluster.get("kubernetesVersion")
    if version:
        match = re.match(r"^v?(\d+)\.(\d+)\.(\d+)$", version)
        if not match:
            errors.append(f'kubernetesVersion: Invalid value: "{version}": not a valid version')
        else:
            mm = (int(match[1]), int(match[2]))
            ours = tuple(int(x) for x in VERSION[1:].split(".")[:2])
            if mm < MIN_CONTROL_PLANE:
                errors.append(
                    "this version of kubeadm only supports deploying clusters with the "
                    "control plane version "
                    f">= {MIN_CONTROL_PLANE[0]}.{MIN_CONTROL_PLANE[1]}.0. Current version: {version}"
                )
            elif mm > ours:
                errors.append(
                    f"the specified version to deploy ({version}) is newer than kubeadm ({VERSION})"
                )
    for kind in ("InitConfiguration", "JoinConfiguration"):
        doc = docs.get(kind, {})
        address = (doc.get("localAPIEndpoint") or {}).get("advertiseAddress")
        if address:
            try:
                ipaddress.ip_address(address)
            except ValueError:
                errors.append(
                    f'localAPIEndpoint.advertiseAddress: Invalid value: "{address}": must be a valid IP'
                )
        cri = (doc.get("nodeRegistration") or {}).get("criSocket")
        if cri and not cri.startswith("unix://"):
            errors.append(f'nodeRegistration.criSocket: Invalid value: "{cri}": URL scheme must be unix://')
    proxy = docs.get("KubeProxyConfiguration", {})
    mode = proxy.get("mode")
    if mode not in (None, "", "iptables", "ipvs", "nftables"):
        errors.append(
            f'KubeProxyConfiguration.mode: Unsupported value: "{mode}": '
            'supported values: "iptables", "ipvs", "nftables"'
        )
    scheduler = (proxy.get("ipvs") or {}).get("scheduler")
    if scheduler not in (None, "", "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh"):
        errors.append(
            f'KubeProxyConfiguration.ipvs.scheduler: Invalid value: "{scheduler}": unknown scheduler'
        )
    kubelet = docs.get("KubeletConfiguration", {})
    driver = kubelet.get("cgroupDriver")
    if driver not in (None, "systemd", "cgroupfs"):
        errors.append(
            f'KubeletConfiguration.cgroupDriver: Invalid value: "{driver}": must be systemd or cgroupfs'
        )
    return errors


def default_ip() -> str:
    """The address of the interface with the default route, as kubeadm picks it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def first_ip(cidr: str, offset: int) -> str:
    net = ipaddress.ip_network(cidr.split(",")[0].strip(), strict=False)
    return str(net.network_address + offset)


def duration_hours(value: str | None, default: float) -> float:
    if not value:
        return default
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d*)?)(h|m|s|ms|us|ns)", value):
        total += float(number) * {"h": 1, "m": 1 / 60, "s": 1 / 3600}.get(unit, 0)
    return total or default


class Settings:
    """The effective init configuration: defaults, then the config file, then flags."""

    def __init__(self, args: argparse.Namespace, docs: dict[str, dict[str, Any]]) -> None:
        init = docs.get("InitConfiguration", {})
        cluster = docs.get("ClusterConfiguration", {})
        reg = init.get("nodeRegistration") or {}
        endpoint = init.get("localAPIEndpoint") or {}
        net = cluster.get("networking") or {}
        self.docs = docs
        self.advertise = getattr(args, "apiserver_advertise_address", None) or endpoint.get(
            "advertiseAddress"
        )
        self.advertise = self.advertise or default_ip()
        self.port = int(getattr(args, "apiserver_bind_port", None) or endpoint.get("bindPort") or 6443)
        self.node_name = (args.node_name or reg.get("name") or socket.gethostname()).lower()
        self.cri = args.cri_socket or reg.get("criSocket") or DEFAULT_CRI
        self.taints = reg.get("taints")  # None: kubeadm's default control-plane taint; []: none
        self.ignore = set(reg.get("ignorePreflightErrors") or [])
        self.skip_phases = set(init.get("skipPhases") or [])
        self.bootstrap_tokens = init.get("bootstrapTokens") or [{}]
        self.service_subnet = (
            getattr(args, "service_cidr", None) or net.get("serviceSubnet") or DEFAULT_SERVICE_SUBNET
        )
        self.pod_subnet = getattr(args, "pod_network_cidr", None) or net.get("podSubnet") or ""
        self.dns_domain = net.get("dnsDomain") or "cluster.local"
        self.version = (
            getattr(args, "kubernetes_version", None) or cluster.get("kubernetesVersion") or VERSION
        )
        if not self.version.startswith("v"):
            self.version = "v" + self.version
        self.cluster_name = cluster.get("clusterName") or "kubernetes"
        self.cert_dir = cluster.get("certificatesDir") or f"{KUBE_DIR}/pki"
        self.image_repo = cluster.get("imageRepository") or IMAGE_REPOSITORY
        self.algorithm = cluster.get("encryptionAlgorithm") or "RSA-2048"
        self.cert_hours = duration_hours(cluster.get("certificateValidityPeriod"), 8760)
        self.ca_hours = duration_hours(cluster.get("caCertificateValidityPeriod"), 87600)
        self.endpoint = cluster.get("controlPlaneEndpoint") or ""
        self.cert_sans = list((cluster.get("apiServer") or {}).get("certSANs") or [])
        self.cluster = cluster
        self.kubelet = docs.get("KubeletConfiguration", {})
        self.proxy = docs.get("KubeProxyConfiguration", {})

    @property
    def server(self) -> str:
        host = self.endpoint or f"{self.advertise}:{self.port}"
        if ":" not in host.rsplit("]", 1)[-1]:
            host = f"{host}:{self.port}"
        return f"https://{host}"

    @property
    def local_server(self) -> str:
        return f"https://{self.advertise}:{self.port}"


# ----------------------------------------------------------------------------------------------------
# preflight
# ----------------------------------------------------------------------------------------------------
def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def preflight(checks: list[tuple[str, str | None]], ignore: set[str]) -> None:
    """checks: (name, failure message or None). Fatal unless ignored (by name or 'all')."""
    log("[preflight] Running pre-flight checks")
    fatal = []
    lowered = {i.lower() for i in ignore}
    for name, failure in checks:
        if failure is None:
            continue
        if "all" in lowered or name.lower() in lowered:
            warn(f"[preflight] WARNING: {failure} (ignored: {name})")
            continue
        fatal.append(f"\t[ERROR {name}]: {failure}")
    if fatal:
        raise KubeadmError(
            "error execution phase preflight: [preflight] Some fatal errors occurred:\n"
            + "\n".join(fatal)
            + "\n[preflight] If you know what you are doing, you can make a check non-fatal with "
            "`--ignore-preflight-errors=...`"
        )


def common_checks(cri: str) -> list[tuple[str, str | None]]:
    checks: list[tuple[str, str | None]] = []
    checks.append(("IsPrivilegedUser", None if os.geteuid() == 0 or ROOT else "user is not running as root"))
    socket_path = cri.removeprefix("unix://")
    cri_ok = Path(socket_path).is_socket() or Path(socket_path.replace("/var/run/", "/run/")).is_socket()
    checks.append(
        (
            "CRI",
            None
            if cri_ok
            else "container runtime is not running: validate service connection: "
            f"validate CRI v1 runtime API "
            f'for endpoint "{cri}": rpc error: code = Unavailable desc = connection error: dial unix '
            f"{socket_path}: connect: no such file or directory",
        )
    )
    try:
        forward = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
    except OSError:
        forward = "1"
    checks.append(
        (
            "FileContent--proc-sys-net-ipv4-ip_forward",
            None if forward == "1" else "/proc/sys/net/ipv4/ip_forward contents are not set to 1",
        )
    )
    return checks


def file_check(path: str) -> tuple[str, str | None]:
    name = "FileAvailable-" + path.replace("/", "-")
    return name, (f"{path} already exists" if p(path).exists() else None)


# ----------------------------------------------------------------------------------------------------
# files: PKI, kubeconfigs, manifests, kubelet config
# ----------------------------------------------------------------------------------------------------
def kubeconfig(cluster_name: str, server: str, ca_pem: bytes, user: str, user_entry: dict[str, str]) -> str:
    context = f"{user}@{cluster_name}"
    return dump(
        {
            "apiVersion": "v1",
            "clusters": [
                {
                    "cluster": {"certificate-authority-data": b64(ca_pem), "server": server},
                    "name": cluster_name,
                }
            ],
            "contexts": [{"context": {"cluster": cluster_name, "user": user}, "name": context}],
            "current-context": context,
            "kind": "Config",
            "preferences": {},
            "users": [{"name": user, "user": user_entry}],
        }
    )


def write_file(path: str, text: str, mode: int = 0o600) -> None:
    target = p(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(target, mode)


def phase_certs(s: Settings) -> None:
    d = p(s.cert_dir)
    d.mkdir(parents=True, exist_ok=True)
    algo, hours = s.algorithm, s.cert_hours
    log(f'[certs] Using certificateDir folder "{s.cert_dir}"')
    pki.new_ca(d / "ca.crt", d / "ca.key", "kubernetes", s.ca_hours, algo)
    log('[certs] Generating "ca" certificate and key')
    dns = [
        s.node_name,
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        f"kubernetes.default.svc.{s.dns_domain}",
    ]
    ips = [first_ip(s.service_subnet, 1), s.advertise]
    for san in s.cert_sans + ([s.endpoint.rsplit(":", 1)[0]] if s.endpoint else []):
        try:
            ipaddress.ip_address(san)
            ips.append(san)
        except ValueError:
            dns.append(san)
    leaves = [
        (pki.Leaf("apiserver", "kube-apiserver", usages=("serverAuth",), dns=dns, ips=ips), "ca"),
        (
            pki.Leaf("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["kubeadm:cluster-admins"]),
            "ca",
        ),
    ]
    for leaf, ca in leaves:
        pki.sign(
            d / f"{ca}.crt",
            d / f"{ca}.key",
            leaf,
            d / f"{leaf.name}.crt",
            d / f"{leaf.name}.key",
            hours,
            algo,
        )
        log(f'[certs] Generating "{leaf.name}" certificate and key')
        if leaf.name == "apiserver":
            log(f"[certs] apiserver serving cert is signed for DNS names {dns} and IPs {ips}")
    pki.new_ca(d / "front-proxy-ca.crt", d / "front-proxy-ca.key", "front-proxy-ca", s.ca_hours, algo)
    log('[certs] Generating "front-proxy-ca" certificate and key')
    leaf = pki.Leaf("front-proxy-client", "front-proxy-client")
    pki.sign(
        d / "front-proxy-ca.crt",
        d / "front-proxy-ca.key",
        leaf,
        d / "front-proxy-client.crt",
        d / "front-proxy-client.key",
        hours,
        algo,
    )
    log('[certs] Generating "front-proxy-client" certificate and key')
    etcd = d / "etcd"
    pki.new_ca(etcd / "ca.crt", etcd / "ca.key", "etcd-ca", s.ca_hours, algo)
    log('[certs] Generating "etcd/ca" certificate and key')
    local = ["localhost", s.node_name]
    local_ips = ["127.0.0.1", "::1", s.advertise]
    for leaf in (
        pki.Leaf("server", s.node_name, usages=("serverAuth", "clientAuth"), dns=local, ips=local_ips),
        pki.Leaf("peer", s.node_name, usages=("serverAuth", "clientAuth"), dns=local, ips=local_ips),
        pki.Leaf("healthcheck-client", "kube-etcd-healthcheck-client"),
    ):
        pki.sign(
            etcd / "ca.crt",
            etcd / "ca.key",
            leaf,
            etcd / f"{leaf.name}.crt",
            etcd / f"{leaf.name}.key",
            hours,
            algo,
        )
        log(f'[certs] Generating "etcd/{leaf.name}" certificate and key')
    leaf = pki.Leaf("apiserver-etcd-client", "kube-apiserver-etcd-client")
    pki.sign(
        etcd / "ca.crt",
        etcd / "ca.key",
        leaf,
        d / "apiserver-etcd-client.crt",
        d / "apiserver-etcd-client.key",
        hours,
        algo,
    )
    log('[certs] Generating "apiserver-etcd-client" certificate and key')
    pki.key_pair(d / "sa.key", d / "sa.pub")
    log('[certs] Generating "sa" key and public key')


KUBECONFIGS = {
    # file: (user name, CN, organisations, server: "cluster" endpoint or "local")
    "admin.conf": ("kubernetes-admin", "kubernetes-admin", ["kubeadm:cluster-admins"], "cluster"),
    "super-admin.conf": ("kubernetes-super-admin", "kubernetes-super-admin", ["system:masters"], "cluster"),
    "kubelet.conf": ("system:node:{node}", "system:node:{node}", ["system:nodes"], "cluster"),
    "controller-manager.conf": (
        "system:kube-controller-manager",
        "system:kube-controller-manager",
        [],
        "local",
    ),
    "scheduler.conf": ("system:kube-scheduler", "system:kube-scheduler", [], "local"),
}


def phase_kubeconfig(s: Settings) -> None:
    d = p(s.cert_dir)
    ca_pem = (d / "ca.crt").read_bytes()
    log(f'[kubeconfig] Using kubeconfig folder "{KUBE_DIR}"')
    scratch = p(KUBE_DIR) / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    for name, (user, cn, orgs, where) in KUBECONFIGS.items():
        user, cn = user.format(node=s.node_name), cn.format(node=s.node_name)
        cert, key = scratch / f"{name}.crt", scratch / f"{name}.key"
        pki.sign(d / "ca.crt", d / "ca.key", pki.Leaf(name, cn, orgs), cert, key, s.cert_hours, s.algorithm)
        entry = {"client-certificate-data": b64(cert.read_bytes()), "client-key-data": b64(key.read_bytes())}
        server = s.server if where == "cluster" else s.local_server
        write_file(f"{KUBE_DIR}/{name}", kubeconfig(s.cluster_name, server, ca_pem, user, entry))
        cert.unlink()
        key.unlink()
        log(f'[kubeconfig] Writing "{name}" kubeconfig file')
    shutil.rmtree(scratch, ignore_errors=True)


def render_args(defaults: dict[str, str], extra: list[dict[str, str]]) -> list[str]:
    """kubeadm's argument building: extraArgs override defaults by name; v1beta4 allows repeats."""
    merged: dict[str, list[str]] = {k: [v] for k, v in defaults.items()}
    overridden: set[str] = set()
    for arg in extra or []:
        name, value = arg.get("name", ""), arg.get("value", "")
        if name not in overridden:
            merged[name] = []
            overridden.add(name)
        merged[name].append(value)
    return [f"--{name}={value}" for name in sorted(merged) for value in merged[name]]


def static_pod(
    name: str,
    image: str,
    command: list[str],
    mounts: list[dict[str, Any]],
    port: int,
    host: str,
    scheme: str = "HTTPS",
) -> dict[str, Any]:
    volumes, volume_mounts = [], []
    for m in mounts:
        volumes.append(
            {
                "hostPath": {"path": m["hostPath"], "type": m.get("pathType") or "DirectoryOrCreate"},
                "name": m["name"],
            }
        )
        vm = {"mountPath": m["mountPath"], "name": m["name"]}
        if m.get("readOnly"):
            vm["readOnly"] = True
        volume_mounts.append(vm)
    probe = {
        "httpGet": {
            "host": host,
            "path": "/livez" if name == "kube-apiserver" else "/healthz",
            "port": port,
            "scheme": scheme,
        },
        "failureThreshold": 8,
        "initialDelaySeconds": 10,
        "periodSeconds": 10,
        "timeoutSeconds": 15,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "labels": {"component": name, "tier": "control-plane"},
            "name": name,
            "namespace": "kube-system",
        },
        "spec": {
            "containers": [
                {
                    "command": [name, *command] if name != "etcd" else ["etcd", *command],
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "livenessProbe": probe,
                    "name": name,
                    "resources": {"requests": {"cpu": "250m" if name == "kube-apiserver" else "100m"}},
                    "volumeMounts": volume_mounts,
                }
            ],
            "hostNetwork": True,
            "priority": 2000001000,
            "priorityClassName": "system-node-critical",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": volumes,
        },
        "status": {},
    }


CA_MOUNTS = [
    {"name": "ca-certs", "hostPath": "/etc/ssl/certs", "mountPath": "/etc/ssl/certs", "readOnly": True},
    {
        "name": "etc-ca-certificates",
        "hostPath": "/etc/ca-certificates",
        "mountPath": "/etc/ca-certificates",
        "readOnly": True,
    },
    {
        "name": "k8s-certs",
        "hostPath": "/etc/kubernetes/pki",
        "mountPath": "/etc/kubernetes/pki",
        "readOnly": True,
    },
]


def phase_manifests(s: Settings) -> None:
    pk = s.cert_dir
    api = s.cluster.get("apiServer") or {}
    defaults = {
        "advertise-address": s.advertise,
        "allow-privileged": "true",
        "authorization-mode": "Node,RBAC",
        "client-ca-file": f"{pk}/ca.crt",
        "enable-admission-plugins": "NodeRestriction",
        "enable-bootstrap-token-auth": "true",
        "etcd-cafile": f"{pk}/etcd/ca.crt",
        "etcd-certfile": f"{pk}/apiserver-etcd-client.crt",
        "etcd-keyfile": f"{pk}/apiserver-etcd-client.key",
        "etcd-servers": "https://127.0.0.1:2379",
        "kubelet-client-certificate": f"{pk}/apiserver-kubelet-client.crt",
        "kubelet-client-key": f"{pk}/apiserver-kubelet-client.key",
        "kubelet-preferred-address-types": "InternalIP,ExternalIP,Hostname",
        "proxy-client-cert-file": f"{pk}/front-proxy-client.crt",
        "proxy-client-key-file": f"{pk}/front-proxy-client.key",
        "requestheader-allowed-names": "front-proxy-client",
        "requestheader-client-ca-file": f"{pk}/front-proxy-ca.crt",
        "requestheader-extra-headers-prefix": "X-Remote-Extra-",
        "requestheader-group-headers": "X-Remote-Group",
        "requestheader-username-headers": "X-Remote-User",
        "secure-port": str(s.port),
        "service-account-issuer": f"https://kubernetes.default.svc.{s.dns_domain}",
        "service-account-key-file": f"{pk}/sa.pub",
        "service-account-signing-key-file": f"{pk}/sa.key",
        "service-cluster-ip-range": s.service_subnet,
        "tls-cert-file": f"{pk}/apiserver.crt",
        "tls-private-key-file": f"{pk}/apiserver.key",
    }
    manifests = {
        "kube-apiserver": static_pod(
            "kube-apiserver",
            f"{s.image_repo}/kube-apiserver:{s.version}",
            render_args(defaults, api.get("extraArgs")),
            CA_MOUNTS + list(api.get("extraVolumes") or []),
            s.port,
            s.advertise,
        ),
    }
    cm = s.cluster.get("controllerManager") or {}
    cm_defaults = {
        "authentication-kubeconfig": f"{KUBE_DIR}/controller-manager.conf",
        "authorization-kubeconfig": f"{KUBE_DIR}/controller-manager.conf",
        "bind-address": "127.0.0.1",
        "client-ca-file": f"{pk}/ca.crt",
        "cluster-name": s.cluster_name,
        "cluster-signing-cert-file": f"{pk}/ca.crt",
        "cluster-signing-key-file": f"{pk}/ca.key",
        "controllers": "*,bootstrapsigner,tokencleaner",
        "kubeconfig": f"{KUBE_DIR}/controller-manager.conf",
        "leader-elect": "true",
        "requestheader-client-ca-file": f"{pk}/front-proxy-ca.crt",
        "root-ca-file": f"{pk}/ca.crt",
        "service-account-private-key-file": f"{pk}/sa.key",
        "service-cluster-ip-range": s.service_subnet,
        "use-service-account-credentials": "true",
    }
    if s.pod_subnet:
        cm_defaults.update({"allocate-node-cidrs": "true", "cluster-cidr": s.pod_subnet})
    manifests["kube-controller-manager"] = static_pod(
        "kube-controller-manager",
        f"{s.image_repo}/kube-controller-manager:{s.version}",
        render_args(cm_defaults, cm.get("extraArgs")),
        CA_MOUNTS + list(cm.get("extraVolumes") or []),
        10257,
        "127.0.0.1",
    )
    sched = s.cluster.get("scheduler") or {}
    sched_defaults = {
        "authentication-kubeconfig": f"{KUBE_DIR}/scheduler.conf",
        "authorization-kubeconfig": f"{KUBE_DIR}/scheduler.conf",
        "bind-address": "127.0.0.1",
        "kubeconfig": f"{KUBE_DIR}/scheduler.conf",
        "leader-elect": "true",
    }
    manifests["kube-scheduler"] = static_pod(
        "kube-scheduler",
        f"{s.image_repo}/kube-scheduler:{s.version}",
        render_args(sched_defaults, sched.get("extraArgs")),
        list(sched.get("extraVolumes") or []),
        10259,
        "127.0.0.1",
    )
    etcd_local = (s.cluster.get("etcd") or {}).get("local") or {}
    data_dir = etcd_local.get("dataDir") or ETCD_DIR
    etcd_defaults = {
        "advertise-client-urls": f"https://{s.advertise}:2379",
        "cert-file": f"{pk}/etcd/server.crt",
        "client-cert-auth": "true",
        "data-dir": data_dir,
        "key-file": f"{pk}/etcd/server.key",
        "listen-client-urls": f"https://127.0.0.1:2379,https://{s.advertise}:2379",
        "name": s.node_name,
        "trusted-ca-file": f"{pk}/etcd/ca.crt",
    }
    manifests["etcd"] = static_pod(
        "etcd",
        f"{s.image_repo}/etcd:3.6.5-0",
        render_args(etcd_defaults, etcd_local.get("extraArgs")),
        [
            {"name": "etcd-data", "hostPath": data_dir, "mountPath": data_dir},
            {"name": "etcd-certs", "hostPath": f"{pk}/etcd", "mountPath": f"{pk}/etcd"},
        ],
        2381,
        "127.0.0.1",
        "HTTP",
    )
    for name, pod in manifests.items():
        write_file(f"{KUBE_DIR}/manifests/{name}.yaml", dump(pod))
        log(f'[control-plane] Creating static Pod manifest for "{name}"')


def kubelet_config(s: Settings) -> dict[str, Any]:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"cacheTTL": "0s", "enabled": True},
            "x509": {"clientCAFile": f"{s.cert_dir}/ca.crt"},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "systemd",
        "clusterDNS": [first_ip(s.service_subnet, 10)],
        "clusterDomain": s.dns_domain,
        "containerRuntimeEndpoint": "",
        "rotateCertificates": True,
        "staticPodPath": f"{KUBE_DIR}/manifests",
    }
    config.update({k: v for k, v in s.kubelet.items() if k not in ("apiVersion", "kind")})
    return config


def proxy_config(s: Settings) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "bindAddress": "0.0.0.0",
        "clientConnection": {"kubeconfig": "/var/lib/kube-proxy/kubeconfig.conf"},
        "clusterCIDR": s.pod_subnet,
        "mode": "",
    }
    config.update({k: v for k, v in s.proxy.items() if k not in ("apiVersion", "kind")})
    return config


def write_kubelet_files(
    config: dict[str, Any], cri: str, extra: list[dict[str, str]], image_repo: str
) -> None:
    # as real kubeadm, no --node-ip of its own: one comes only from nodeRegistration.kubeletExtraArgs
    write_file(f"{KUBELET_DIR}/config.yaml", dump(config), 0o644)
    flags = [
        f"--container-runtime-endpoint={cri}",
        f"--pod-infra-container-image={image_repo}/pause:{PAUSE_TAG}",
    ]
    flags += [f"--{a['name']}={a.get('value', '')}" for a in extra or []]
    write_file(f"{KUBELET_DIR}/kubeadm-flags.env", f'KUBELET_KUBEADM_ARGS="{" ".join(flags)}"\n', 0o644)
    log(f'[kubelet-start] Writing kubelet configuration to file "{KUBELET_DIR}/config.yaml"')
    log(
        "[kubelet-start] Writing kubelet environment file with flags to file "
        f'"{KUBELET_DIR}/kubeadm-flags.env"'
    )


def systemctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if ROOT:  # off-node runs do not touch the host's services
        return subprocess.CompletedProcess(args, 0, "", "")
    proc = subprocess.run(["systemctl", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise KubeadmError(f"systemctl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def start_kubelet() -> None:
    log("[kubelet-start] Starting the kubelet")
    systemctl("daemon-reload", check=False)
    systemctl("enable", "kubelet.service", check=False)
    systemctl("restart", "kubelet.service")


# ----------------------------------------------------------------------------------------------------
# the API: wait, objects kubeadm creates
# ----------------------------------------------------------------------------------------------------
def wait_healthy(client: Client, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            answer = client.get("/readyz")
            if answer in ("ok", None) or answer:
                return
        except ApiError as err:
            last = str(err)
        time.sleep(0.5)
    raise KubeadmError(
        "error execution phase wait-control-plane: the API server stand-in did not become healthy within "
        f"{timeout_s:.0f}s ({last}); see: journalctl -u {APISERVER_UNIT}"
    )


def token_secret(
    token_id: str, secret: str, ttl_hours: float, description: str, groups: list[str], usages: list[str]
) -> dict[str, Any]:
    data = {
        "token-id": token_id,
        "token-secret": secret,
        "auth-extra-groups": ",".join(groups),
    }
    if description:
        data["description"] = description
    if ttl_hours > 0:
        expires = dt.datetime.now(dt.UTC) + dt.timedelta(hours=ttl_hours)
        data["expiration"] = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
    for usage in usages:
        data[f"usage-bootstrap-{usage}"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"bootstrap-token-{token_id}", "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "data": {k: b64(v.encode()) for k, v in data.items()},
    }


def new_token() -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return (
        "".join(secrets.choice(alphabet) for _ in range(6))
        + "."
        + "".join(secrets.choice(alphabet) for _ in range(16))
    )


def jws_detached(payload: str, token_id: str, token_secret_value: str) -> str:
    """The detached JWS (HS256) the bootstrap signer puts in cluster-info for each signing token."""
    header = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "kid": token_id}).encode()).rstrip(b"=")
    body = base64.urlsafe_b64encode(payload.encode()).rstrip(b"=")
    signature = hmac.new(token_secret_value.encode(), header + b"." + body, hashlib.sha256).digest()
    return header.decode() + ".." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()


def create_token(
    client: Client,
    token: str,
    ttl_hours: float,
    description: str = "",
    groups: list[str] | None = None,
    usages: list[str] | None = None,
) -> None:
    match = TOKEN_RE.match(token)
    if not match:
        raise KubeadmError(
            f'the bootstrap token "{token}" was not of the form "[a-z0-9]{{6}}.[a-z0-9]{{16}}"'
        )
    groups = groups or ["system:bootstrappers:kubeadm:default-node-token"]
    usages = usages or ["signing", "authentication"]
    client.create(
        "/api/v1/namespaces/kube-system/secrets",
        token_secret(match[1], match[2], ttl_hours, description, groups, usages),
    )
    if "signing" in usages:
        sign_cluster_info(client, match[1], match[2])


def sign_cluster_info(client: Client, token_id: str, secret: str) -> None:
    """What the controller-manager's bootstrapsigner does; the stand-in has no controller-manager."""
    try:
        info = client.get("/api/v1/namespaces/kube-public/configmaps/cluster-info")
    except ApiError as err:
        if err.status == 404:
            return
        raise
    payload = info["data"]["kubeconfig"]
    client.merge_patch(
        "/api/v1/namespaces/kube-public/configmaps/cluster-info",
        {"data": {f"jws-kubeconfig-{token_id}": jws_detached(payload, token_id, secret)}},
    )


def join_command(server: str, token: str, ca_hash: str) -> str:
    host = server.removeprefix("https://")
    return f"kubeadm join {host} --token {token} --discovery-token-ca-cert-hash {ca_hash}"


def upload_config(client: Client, s: Settings) -> None:
    cluster_doc = {
        "apiVersion": kubeadm_api.KUBEADM_API,
        "kind": "ClusterConfiguration",
        "apiServer": s.cluster.get("apiServer") or {},
        "certificatesDir": s.cert_dir,
        "clusterName": s.cluster_name,
        "controllerManager": s.cluster.get("controllerManager") or {},
        "dns": s.cluster.get("dns") or {},
        "encryptionAlgorithm": s.algorithm,
        "etcd": s.cluster.get("etcd") or {"local": {"dataDir": ETCD_DIR}},
        "imageRepository": s.image_repo,
        "kubernetesVersion": s.version,
        "networking": {"dnsDomain": s.dns_domain, "serviceSubnet": s.service_subnet}
        | ({"podSubnet": s.pod_subnet} if s.pod_subnet else {}),
        "proxy": s.cluster.get("proxy") or {},
        "scheduler": s.cluster.get("scheduler") or {},
    }
    if s.endpoint:
        cluster_doc["controlPlaneEndpoint"] = s.endpoint
    log(
        '[upload-config] Storing the configuration used in ConfigMap "kubeadm-config" in the '
        '"kube-system" Namespace'
    )
    client.apply(
        "/api/v1/namespaces/kube-system/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
            "data": {"ClusterConfiguration": dump(cluster_doc)},
        },
    )
    log(
        '[kubelet] Creating a ConfigMap "kubelet-config" in namespace kube-system with the '
        "configuration for the kubelets"
    )
    client.apply(
        "/api/v1/namespaces/kube-system/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kubelet-config", "namespace": "kube-system"},
            "data": {"kubelet": dump(kubelet_config(s))},
        },
    )


def rbac(client: Client) -> None:
    """The RBAC kubeadm creates (bindings for admins and for joining nodes)."""
    rb = "/apis/rbac.authorization.k8s.io/v1"
    bindings = [
        ("kubeadm:cluster-admins", "cluster-admin", "Group", "kubeadm:cluster-admins"),
        (
            "kubeadm:kubelet-bootstrap",
            "system:node-bootstrapper",
            "Group",
            "system:bootstrappers:kubeadm:default-node-token",
        ),
        (
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            "Group",
            "system:bootstrappers:kubeadm:default-node-token",
        ),
        (
            "kubeadm:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "Group",
            "system:nodes",
        ),
        (
            "kubeadm:get-nodes",
            "kubeadm:get-nodes",
            "Group",
            "system:bootstrappers:kubeadm:default-node-token",
        ),
        # lab: the real API server's bootstrap policy lets the controller-manager approve and sign CSRs;
        # the stand-in's has no controller-manager roles, so the lab's kubeadm binds one (docs/lab.md)
        ("lab:kube-controller-manager-csr", LAB_CSR_ROLE, "User", "system:kube-controller-manager"),
    ]
    csr_rules = [
        {
            "apiGroups": ["certificates.k8s.io"],
            "resources": ["certificatesigningrequests"],
            "verbs": ["get", "list", "watch", "delete"],
        },
        {
            "apiGroups": ["certificates.k8s.io"],
            "resources": ["certificatesigningrequests/approval", "certificatesigningrequests/status"],
            "verbs": ["update", "patch"],
        },
        {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "verbs": ["approve", "sign"]},
    ]
    try:
        for role_name, rules in (
            ("kubeadm:get-nodes", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]),
            (LAB_CSR_ROLE, csr_rules),
        ):
            client.ensure(
                f"{rb}/clusterroles",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": role_name},
                    "rules": rules,
                },
            )
        for name, role, kind, subject in bindings:
            client.ensure(
                f"{rb}/clusterrolebindings",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}],
                },
            )
        for ns, name, rules in (
            (
                "kube-public",
                "kubeadm:bootstrap-signer-clusterinfo",
                [
                    {
                        "apiGroups": [""],
                        "resources": ["configmaps"],
                        "resourceNames": ["cluster-info"],
                        "verbs": ["get"],
                    }
                ],
            ),
            (
                "kube-system",
                "kubeadm:nodes-kubeadm-config",
                [
                    {
                        "apiGroups": [""],
                        "resources": ["configmaps"],
                        "resourceNames": ["kubeadm-config"],
                        "verbs": ["get"],
                    }
                ],
            ),
            (
                "kube-system",
                "kubeadm:kubelet-config",
                [
                    {
                        "apiGroups": [""],
                        "resources": ["configmaps"],
                        "resourceNames": ["kubelet-config"],
                        "verbs": ["get"],
                    }
                ],
            ),
        ):
            client.ensure(
                f"{rb}/namespaces/{ns}/roles",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": name, "namespace": ns},
                    "rules": rules,
                },
            )
            subjects = (
                [{"kind": "User", "name": "system:anonymous"}]
                if ns == "kube-public"
                else [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}
                    for g in ("system:bootstrappers:kubeadm:default-node-token", "system:nodes")
                ]
            )
            client.ensure(
                f"{rb}/namespaces/{ns}/rolebindings",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": name, "namespace": ns},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                    "subjects": subjects,
                },
            )
    except ApiError as err:
        if err.status != 404:  # a stand-in that serves no RBAC API: nothing to bind
            raise


def addon_kube_proxy(client: Client, s: Settings) -> None:
    kubeconfig_conf = dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "cluster": {
                        "certificate-authority": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                        "server": s.server,
                    },
                    "name": "default",
                }
            ],
            "contexts": [
                {
                    "context": {"cluster": "default", "namespace": "default", "user": "default"},
                    "name": "default",
                }
            ],
            "current-context": "default",
            "users": [
                {
                    "name": "default",
                    "user": {"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"},
                }
            ],
        }
    )
    ns = "/api/v1/namespaces/kube-system"
    client.ensure(
        f"{ns}/serviceaccounts",
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
        },
    )
    rb = "/apis/rbac.authorization.k8s.io/v1"
    client.ensure(
        f"{rb}/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kubeadm:node-proxier"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:node-proxier",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "kube-proxy", "namespace": "kube-system"}],
        },
    )
    client.ensure(
        f"{rb}/namespaces/kube-system/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": ["kube-proxy"],
                    "verbs": ["get"],
                }
            ],
        },
    )
    client.ensure(
        f"{rb}/namespaces/kube-system/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kube-proxy"},
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Group",
                    "name": "system:bootstrappers:kubeadm:default-node-token",
                }
            ],
        },
    )
    client.apply(
        f"{ns}/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": {"app": "kube-proxy"}},
            "data": {"config.conf": dump(proxy_config(s)), "kubeconfig.conf": kubeconfig_conf},
        },
    )
    labels = {"k8s-app": "kube-proxy"}
    client.apply(
        "/apis/apps/v1/namespaces/kube-system/daemonsets",
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "updateStrategy": {"type": "RollingUpdate"},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "kube-proxy",
                                "image": f"{s.image_repo}/kube-proxy:{s.version}",
                                "command": [
                                    "/usr/local/bin/kube-proxy",
                                    "--config=/var/lib/kube-proxy/config.conf",
                                    "--hostname-override=$(NODE_NAME)",
                                ],
                                "env": [
                                    {
                                        "name": "NODE_NAME",
                                        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                                    }
                                ],
                                "securityContext": {"privileged": True},
                                "volumeMounts": [
                                    {"mountPath": "/var/lib/kube-proxy", "name": "kube-proxy"},
                                    {"mountPath": "/run/xtables.lock", "name": "xtables-lock"},
                                    {"mountPath": "/lib/modules", "name": "lib-modules", "readOnly": True},
                                ],
                            }
                        ],
                        "hostNetwork": True,
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                        "priorityClassName": "system-node-critical",
                        "serviceAccountName": "kube-proxy",
                        "tolerations": [{"operator": "Exists"}],
                        "volumes": [
                            {"name": "kube-proxy", "configMap": {"name": "kube-proxy"}},
                            {
                                "name": "xtables-lock",
                                "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"},
                            },
                            {"name": "lib-modules", "hostPath": {"path": "/lib/modules"}},
                        ],
                    },
                },
            },
        },
    )
    log("[addons] Applied essential addon: kube-proxy")


def addon_coredns(client: Client, s: Settings) -> None:
    dns = s.cluster.get("dns") or {}
    repository = dns.get("imageRepository") or f"{s.image_repo}/coredns"
    image = f"{repository}/coredns:{dns.get('imageTag') or COREDNS_TAG}"
    ns = "/api/v1/namespaces/kube-system"
    labels = {"k8s-app": "kube-dns"}
    corefile = (
        ".:53 {\n    errors\n    health {\n       lameduck 5s\n    }\n    ready\n"
        f"    kubernetes {s.dns_domain} in-addr.arpa ip6.arpa {{\n       pods insecure\n"
        "       fallthrough in-addr.arpa ip6.arpa\n       ttl 30\n    }\n    prometheus :9153\n"
        "    forward . /etc/resolv.conf {\n       max_concurrent 1000\n    }\n    cache 30 {\n"
        "       disable success cluster.local\n       disable denial cluster.local\n    }\n"
        "    loop\n    reload\n    loadbalance\n}\n"
    )
    client.ensure(
        f"{ns}/serviceaccounts",
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
        },
    )
    client.apply(
        f"{ns}/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "data": {"Corefile": corefile},
        },
    )
    client.apply(
        "/apis/apps/v1/namespaces/kube-system/deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "coredns",
                                "image": image,
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"containerPort": 53, "name": "dns", "protocol": "UDP"},
                                    {"containerPort": 53, "name": "dns-tcp", "protocol": "TCP"},
                                    {"containerPort": 9153, "name": "metrics", "protocol": "TCP"},
                                ],
                                "resources": {
                                    "limits": {"memory": "170Mi"},
                                    "requests": {"cpu": "100m", "memory": "70Mi"},
                                },
                                "volumeMounts": [
                                    {"mountPath": "/etc/coredns", "name": "config-volume", "readOnly": True}
                                ],
                            }
                        ],
                        "dnsPolicy": "Default",
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                        "priorityClassName": "system-cluster-critical",
                        "serviceAccountName": "coredns",
                        "tolerations": [
                            {"key": "CriticalAddonsOnly", "operator": "Exists"},
                            {"key": CONTROL_PLANE_LABEL, "effect": "NoSchedule"},
                        ],
                        "volumes": [
                            {
                                "name": "config-volume",
                                "configMap": {
                                    "name": "coredns",
                                    "items": [{"key": "Corefile", "path": "Corefile"}],
                                },
                            }
                        ],
                    },
                },
            },
        },
    )
    client.ensure(
        f"{ns}/services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "kube-dns",
                "namespace": "kube-system",
                "labels": {
                    "k8s-app": "kube-dns",
                    "kubernetes.io/cluster-service": "true",
                    "kubernetes.io/name": "CoreDNS",
                },
            },
            "spec": {
                "clusterIP": first_ip(s.service_subnet, 10),
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                    {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153},
                ],
            },
        },
    )
    log("[addons] Applied essential addon: CoreDNS")


def ensure_core(client: Client, s: Settings) -> None:
    """What the real API server makes by itself; created here when the stand-in has not."""
    for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
        client.ensure(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
    client.ensure(
        "/api/v1/namespaces/default/services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "kubernetes",
                "namespace": "default",
                "labels": {"component": "apiserver", "provider": "kubernetes"},
            },
            "spec": {
                "clusterIP": first_ip(s.service_subnet, 1),
                "type": "ClusterIP",
                "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": s.port}],
            },
        },
    )


def mark_control_plane(client: Client, s: Settings, timeout_s: float = 60) -> None:
    log(
        f"[mark-control-plane] Marking the node {s.node_name} as control-plane by adding the labels: "
        f"[{CONTROL_PLANE_LABEL} node.kubernetes.io/exclude-from-external-load-balancers]"
    )
    taints = [{"key": CONTROL_PLANE_LABEL, "effect": "NoSchedule"}] if s.taints is None else list(s.taints)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            node = client.get(f"/api/v1/nodes/{s.node_name}")
            break
        except ApiError as err:
            if err.status != 404 or time.monotonic() > deadline:
                raise KubeadmError(
                    f"error execution phase mark-control-plane: timed out waiting for the Node {s.node_name} "
                    f"(is the kubelet running? journalctl -u kubelet): {err}"
                ) from None
            time.sleep(1)
    existing = node.get("spec", {}).get("taints") or []
    merged = existing + [
        t
        for t in taints
        if not any(e.get("key") == t.get("key") and e.get("effect") == t.get("effect") for e in existing)
    ]
    client.merge_patch(
        f"/api/v1/nodes/{s.node_name}",
        {
            "metadata": {
                "labels": {
                    CONTROL_PLANE_LABEL: "",
                    "node.kubernetes.io/exclude-from-external-load-balancers": "",
                },
                "annotations": {"kubeadm.alpha.kubernetes.io/cri-socket": s.cri},
            },
            "spec": {"taints": merged or None},
        },
    )
    if taints:
        log(
            f"[mark-control-plane] Marking the node {s.node_name} as control-plane by adding the taints "
            f"{[t['key'] + ':' + t['effect'] for t in taints]}"
        )


# ----------------------------------------------------------------------------------------------------
# commands
# ----------------------------------------------------------------------------------------------------
def parse_phases(value: str | None, valid: tuple[str, ...]) -> set[str]:
    phases = {x.strip() for x in (value or "").split(",") if x.strip()}
    for phase in phases:
        if phase not in valid:
            raise KubeadmError(f'invalid phase name: "{phase}"; valid phases: {", ".join(valid)}')
    return phases


def check_mixing(args: argparse.Namespace, given: set[str]) -> None:
    if not args.config:
        return
    mixed = sorted(name.replace("_", "-") for name in given - CONFIG_COMPATIBLE)
    if mixed:
        raise KubeadmError(f"can not mix '--config' with arguments {mixed}")


def cmd_init(args: argparse.Namespace, given: set[str]) -> None:
    if args.dry_run:
        raise KubeadmError("kubeadm init --dry-run is not simulated by the lab stand-in (docs/lab.md)")
    check_mixing(args, given)
    docs = read_config(args.config, strict=False) if args.config else {}
    errors = semantic_errors(docs)
    if errors:
        raise KubeadmError("\n".join(errors))
    s = Settings(args, docs)
    skip = parse_phases(args.skip_phases, INIT_PHASES) | s.skip_phases
    ignore = s.ignore | {x.strip() for x in (args.ignore_preflight_errors or "").split(",") if x.strip()}
    log(f"[init] Using Kubernetes version: {s.version}")
    if "preflight" not in skip:
        checks = common_checks(s.cri)
        checks += [
            file_check(f"{KUBE_DIR}/manifests/{n}.yaml")
            for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
        ]
        checks.append((f"Port-{s.port}", f"Port {s.port} is in use" if port_in_use(s.port) else None))
        checks.append(("Port-10250", "Port 10250 is in use" if port_in_use(10250) else None))
        etcd_dir = p(ETCD_DIR)
        checks.append(
            (
                "DirAvailable--var-lib-etcd",
                f"{ETCD_DIR} is not empty" if etcd_dir.is_dir() and any(etcd_dir.iterdir()) else None,
            )
        )
        preflight(checks, ignore)
    if "certs" not in skip:
        phase_certs(s)
    if "kubeconfig" not in skip:
        phase_kubeconfig(s)
    if "control-plane" not in skip:
        phase_manifests(s)
    if "kubelet-start" not in skip:
        reg = docs.get("InitConfiguration", {}).get("nodeRegistration") or {}
        write_kubelet_files(kubelet_config(s), s.cri, reg.get("kubeletExtraArgs") or [], s.image_repo)
    # The API server stand-in: a systemd unit instead of the kubelet running the static pod.
    write_file(
        APISERVER_ENV,
        "# written by kubeadm init (lab stand-in): flags of the API server stand-in\n"
        f"KUBE_APISERVER_STANDIN_ARGS=--bind 0.0.0.0 --port {s.port} --tls-cert {s.cert_dir}/apiserver.crt "
        f"--tls-key {s.cert_dir}/apiserver.key --client-ca {s.cert_dir}/ca.crt --state-file "
        f"{APISERVER_STATE} "
        f"--service-account-key {s.cert_dir}/sa.key\n",
        0o600,
    )
    p(ETCD_DIR).mkdir(mode=0o700, parents=True, exist_ok=True)
    log(
        "[wait-control-plane] Waiting for the kubelet to boot up the control plane as static Pods "
        f"(lab: starting {APISERVER_UNIT})"
    )
    systemctl("daemon-reload", check=False)
    systemctl("enable", "--now", APISERVER_UNIT)
    if "kubelet-start" not in skip:
        start_kubelet()
    client = Client.from_kubeconfig(str(p(f"{KUBE_DIR}/super-admin.conf")))
    wait_healthy(client, 60)
    log("[control-plane-check] kube-apiserver is healthy")
    ensure_core(client, s)
    if "upload-config" not in skip:
        upload_config(client, s)
    if "mark-control-plane" not in skip:
        mark_control_plane(client, s)
    token = ""
    if "bootstrap-token" not in skip:
        log("[bootstrap-token] Configuring bootstrap tokens, cluster-info ConfigMap, RBAC Roles")
        rbac(client)
        ca_pem = p(f"{s.cert_dir}/ca.crt").read_bytes()
        info_doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"cluster": {"certificate-authority-data": b64(ca_pem), "server": s.server}, "name": ""}
            ],
            "contexts": None,
            "current-context": "",
            "preferences": {},
            "users": None,
        }
        client.apply(
            "/api/v1/namespaces/kube-public/configmaps",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "cluster-info", "namespace": "kube-public"},
                "data": {"kubeconfig": dump(info_doc)},
            },
        )
        for spec in s.bootstrap_tokens:
            token = spec.get("token") or getattr(args, "token", None) or new_token()
            ttl = duration_hours(spec.get("ttl") or getattr(args, "token_ttl", None), 24)
            create_token(
                client, token, ttl, spec.get("description", ""), spec.get("groups"), spec.get("usages")
            )
    if "addon" not in skip:
        if "addon/coredns" not in skip and not (s.cluster.get("dns") or {}).get("disabled"):
            addon_coredns(client, s)
        if "addon/kube-proxy" not in skip and not (s.cluster.get("proxy") or {}).get("disabled"):
            addon_kube_proxy(client, s)
    log("\nYour Kubernetes control-plane has initialized successfully!\n")
    log("To start using your cluster, you need to run the following as a regular user:\n")
    log(
        "  mkdir -p $HOME/.kube\n  sudo cp -i /etc/kubernetes/admin.conf $HOME/.kube/config\n"
        "  sudo chown $(id -u):$(id -g) $HOME/.kube/config\n"
    )
    if token and "show-join-command" not in skip:
        ca_hash = pki.ca_cert_hash(p(f"{s.cert_dir}/ca.crt").read_bytes())
        log("Then you can join any number of worker nodes by running the following on each as root:\n")
        log(join_command(s.server, token, ca_hash).replace(" --discovery", " \\\n\t--discovery"))


def cmd_token_create(args: argparse.Namespace) -> None:
    client = Client.from_kubeconfig(args.kubeconfig)
    token = args.token or new_token()
    create_token(client, token, duration_hours(args.ttl, 24), args.description or "")
    if args.print_join_command:
        ca_pem = client_ca(args.kubeconfig)
        print(join_command(client.server, token, pki.ca_cert_hash(ca_pem)) + " ")
    else:
        print(token)


def client_ca(kubeconfig_path: str) -> bytes:
    from .yamlio import load_yaml_file

    config = load_yaml_file(kubeconfig_path)
    return base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"])


def discover(endpoint: str, token: str, ca_hashes: list[str], unsafe: bool) -> tuple[bytes, str]:
    """Token discovery: cluster-info from kube-public (unauthenticated TLS), JWS check, CA pin."""
    match = TOKEN_RE.match(token)
    if not match:
        raise KubeadmError(
            f'the bootstrap token "{token}" was not of the form "[a-z0-9]{{6}}.[a-z0-9]{{16}}"'
        )
    token_id, secret = match[1], match[2]
    insecure = Client(f"https://{endpoint}", None, insecure=True)
    log(f'[discovery] Trying to connect to API Server "{endpoint}"')
    try:
        info = insecure.get("/api/v1/namespaces/kube-public/configmaps/cluster-info")
    except ApiError as err:
        raise KubeadmError(
            f"error execution phase preflight: couldn't validate the identity of the API Server: {err}"
        ) from None
    payload = info.get("data", {}).get("kubeconfig", "")
    signature = info.get("data", {}).get(f"jws-kubeconfig-{token_id}")
    if not signature:
        raise KubeadmError(
            "error execution phase preflight: couldn't validate the identity of the API Server: "
            f'could not find a JWS signature in the cluster-info ConfigMap for token ID "{token_id}"'
        )
    if not hmac.compare_digest(signature, jws_detached(payload, token_id, secret)):
        raise KubeadmError(
            "error execution phase preflight: couldn't validate the identity of the API Server: "
            "failed to verify JWS signature of received cluster info object, can't trust this API Server"
        )
    from .yamlio import load_all as _load

    info_config = _load(payload)[0]
    ca_pem = base64.b64decode(info_config["clusters"][0]["cluster"]["certificate-authority-data"])
    server = info_config["clusters"][0]["cluster"]["server"]
    if not unsafe:
        actual = pki.ca_cert_hash(ca_pem)
        if actual not in ca_hashes:
            raise KubeadmError(
                "error execution phase preflight: couldn't validate the identity of the API Server: "
                f'cluster CA found in cluster-info ConfigMap is invalid: none of the public keys "{actual}" '
                "are pinned"
            )
    log(
        "[discovery] Cluster info signature and contents are valid and TLS certificate "
        f'validates against pinned roots, will use API Server "{endpoint}"'
    )
    return ca_pem, server


def cmd_join(args: argparse.Namespace, given: set[str]) -> None:
    check_mixing(args, given - {"endpoint"})
    docs = read_config(args.config, strict=False) if args.config else {}
    errors = semantic_errors(docs)
    if errors:
        raise KubeadmError("\n".join(errors))
    join = docs.get("JoinConfiguration", {})
    if join.get("controlPlane"):
        raise KubeadmError(
            "the lab's kubeadm stand-in joins worker nodes only (controlPlane is not simulated)"
        )
    reg = join.get("nodeRegistration") or {}
    bt = (join.get("discovery") or {}).get("bootstrapToken") or {}
    endpoint = bt.get("apiServerEndpoint") or args.endpoint
    token = (
        join.get("discovery", {}).get("tlsBootstrapToken")
        or bt.get("token")
        or args.discovery_token
        or args.token
    )
    if not endpoint or not token:
        raise KubeadmError('discovery: Invalid value: "": bootstrapToken or file must be set')
    hashes = list(bt.get("caCertHashes") or []) + list(args.discovery_token_ca_cert_hash or [])
    unsafe = bool(bt.get("unsafeSkipCAVerification") or args.discovery_token_unsafe_skip_ca_verification)
    if not hashes and not unsafe:
        raise KubeadmError(
            'discovery.bootstrapToken: Invalid value: "": using token-based discovery without '
            "caCertHashes can "
            "be unsafe. Set unsafeSkipCAVerification as true in your kubeadm config file or pass "
            "--discovery-token-unsafe-skip-ca-verification flag to continue"
        )
    node_name = (args.node_name or reg.get("name") or socket.gethostname()).lower()
    cri = args.cri_socket or reg.get("criSocket") or DEFAULT_CRI
    skip = parse_phases(args.skip_phases, JOIN_PHASES) | set(join.get("skipPhases") or [])
    ignore = set(reg.get("ignorePreflightErrors") or []) | {
        x.strip() for x in (args.ignore_preflight_errors or "").split(",") if x.strip()
    }
    ca_path = join.get("caCertPath") or f"{KUBE_DIR}/pki/ca.crt"
    if "preflight" not in skip:
        checks = common_checks(cri)
        checks += [
            file_check(f"{KUBE_DIR}/kubelet.conf"),
            file_check(f"{KUBE_DIR}/bootstrap-kubelet.conf"),
            file_check(ca_path),
        ]
        checks.append(("Port-10250", "Port 10250 is in use" if port_in_use(10250) else None))
        preflight(checks, ignore)
    ca_pem, server = discover(endpoint, token, hashes, unsafe)
    client = Client(server, ca_pem, token=token)
    try:  # kubeadm refuses to take over the name of a live node (bootstrap tokens may get nodes)
        existing = client.get(f"/api/v1/nodes/{node_name}")
    except ApiError:
        existing = None
    if existing and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in existing.get("status", {}).get("conditions", [])
    ):
        raise KubeadmError(
            f'error execution phase kubelet-start: a Node with name "{node_name}" and status "Ready" already '
            "exists in the cluster. You must delete the existing Node or change the name of this new "
            "joining Node"
        )
    if args.dry_run:
        log(f"[dryrun] Would join {server} as {node_name}; nothing was written")
        return
    try:
        kubelet_cm = client.get("/api/v1/namespaces/kube-system/configmaps/kubelet-config")
    except ApiError as err:
        if err.status == 401:
            raise KubeadmError(
                "error execution phase kubelet-start: the bootstrap token was rejected by the "
                f"API server ({err}); "
                "create a new one with: kubeadm token create --print-join-command"
            ) from None
        raise KubeadmError(
            f"error execution phase kubelet-start: cannot read the kubelet-config ConfigMap: {err}"
        ) from None
    log('[preflight] Reading configuration from the "kubeadm-config" ConfigMap in namespace "kube-system"...')
    from .yamlio import load_all as _load

    config = _load(kubelet_cm["data"]["kubelet"])[0]
    write_file(ca_path, ca_pem.decode(), 0o644)
    write_kubelet_files(config, cri, reg.get("kubeletExtraArgs") or [], IMAGE_REPOSITORY)
    # As real kubeadm: a bootstrap kubeconfig with the token; the kubelet trades it for a client
    # certificate (CSR signed by the controller-manager stand-in, csr.py) and writes kubelet.conf.
    write_file(
        f"{KUBE_DIR}/bootstrap-kubelet.conf",
        kubeconfig("kubernetes", server, ca_pem, "tls-bootstrap-token-user", {"token": token}),
    )
    if "kubelet-start" not in skip:
        start_kubelet()
        log("[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap")
        deadline = time.monotonic() + 120
        while True:
            registered = False
            if p(f"{KUBE_DIR}/kubelet.conf").exists():
                try:
                    client.get(f"/api/v1/nodes/{node_name}")
                    registered = True
                except ApiError:
                    registered = False
            if registered:
                break
            if time.monotonic() > deadline:
                raise KubeadmError(
                    "error execution phase kubelet-start: the kubelet did not complete the "
                    "TLS bootstrap and "
                    f"register the node {node_name} within 120s; see: journalctl -u kubelet"
                )
            time.sleep(1)
        p(f"{KUBE_DIR}/bootstrap-kubelet.conf").unlink(missing_ok=True)
        with contextlib.suppress(ApiError):
            node_client = Client.from_kubeconfig(str(p(f"{KUBE_DIR}/kubelet.conf")))
            node_client.merge_patch(
                f"/api/v1/nodes/{node_name}",
                {"metadata": {"annotations": {"kubeadm.alpha.kubernetes.io/cri-socket": cri}}},
            )
    log(
        "\nThis node has joined the cluster:\n* Certificate signing request was sent to "
        "apiserver and a response was received.\n"
        "* The Kubelet was informed of the new secure connection details.\n\n"
        "Run 'kubectl get nodes' on the control-plane to see this node join the cluster."
    )


def cmd_reset(args: argparse.Namespace) -> None:
    docs = read_config(args.config, strict=False) if args.config else {}
    reset = docs.get("ResetConfiguration", {})
    force = args.force or reset.get("force")
    if not force:
        if not sys.stdin.isatty():
            raise KubeadmError("won't proceed; the user didn't answer (Y|n) in order to continue")
        answer = input("[reset] Are you sure you want to proceed? [y/N]: ")
        if answer.strip().lower() not in ("y", "yes"):
            raise KubeadmError("aborted reset operation")
    dry = bool(args.dry_run or reset.get("dryRun"))
    if dry:
        log("[dryrun] Would do the following (nothing is changed):")
    log("[preflight] Running pre-flight checks")
    control_plane = p(f"{KUBE_DIR}/manifests/kube-apiserver.yaml").exists() or p(APISERVER_ENV).exists()
    log("[reset] Stopping the kubelet service")
    if not dry:
        systemctl("stop", "kubelet.service", check=False)
    if control_plane:
        # the static pods' containers would go with the kubelet's cleanup; here: the stand-in's unit
        log(f"[reset] Deleting contents of the etcd data directory: {ETCD_DIR}")
        if not dry:
            systemctl("disable", "--now", APISERVER_UNIT, check=False)
            _empty(p(ETCD_DIR))
    dirs = [f"{KUBE_DIR}/manifests", KUBELET_DIR, reset.get("certificatesDir") or f"{KUBE_DIR}/pki"]
    log(f"[reset] Deleting contents of directories: {dirs}")
    for d in dirs if not dry else []:
        _empty(p(d))
    files = [
        f"{KUBE_DIR}/{n}"
        for n in (
            "admin.conf",
            "super-admin.conf",
            "kubelet.conf",
            "bootstrap-kubelet.conf",
            "controller-manager.conf",
            "scheduler.conf",
        )
    ] + [APISERVER_ENV]
    log(f"[reset] Deleting files: {files[:-1]}")
    for f in files if not dry else []:
        p(f).unlink(missing_ok=True)
    log(
        "\nThe reset process does not clean CNI configuration. To do so, you must remove /etc/cni/net.d\n\n"
        "The reset process does not reset or clean up iptables rules or IPVS tables.\n"
        'If you wish to reset iptables, you must do so manually by using the "iptables" command.\n\n'
        "If your cluster was setup to utilize IPVS, run ipvsadm --clear (or similar)\nto reset "
        "your system's IPVS tables.\n\n"
        "The reset process does not clean your kubeconfig files and you must remove them manually.\n"
        "Please, check the contents of the $HOME/.kube/config file."
    )


def _empty(directory: Path) -> None:
    if not directory.is_dir():
        return
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def cmd_config_validate(args: argparse.Namespace) -> None:
    docs = read_config(args.config, strict=True)
    errors = semantic_errors(docs)
    if errors:
        raise KubeadmError("\n".join(errors))
    print("ok")


def cmd_kubeconfig_user(args: argparse.Namespace) -> None:
    """`kubeadm kubeconfig user`: a kubeconfig for another user, printed on stdout, nothing written. Its
    client certificate is signed by the cluster CA under certificatesDir, CN = --client-name, one O per
    --org, valid for --validity-period; the server is controlPlaneEndpoint or the local API endpoint of
    the --config file, as real kubeadm takes them."""
    if not args.client_name:
        raise KubeadmError('required flag(s) "client-name" not set')
    if args.token:
        raise KubeadmError("the lab's kubeadm stand-in issues client certificates only (--token)")
    if not re.fullmatch(r"(\d+(\.\d*)?(h|m|s|ms|us|ns))+", args.validity_period or ""):
        given = args.validity_period
        raise KubeadmError(f'invalid argument "{given}" for "--validity-period" flag: invalid duration')
    docs = read_config(args.config, strict=False) if args.config else {}
    errors = semantic_errors(docs)
    if errors:
        raise KubeadmError("\n".join(errors))
    s = Settings(args, docs)
    d = p(s.cert_dir)
    if not (d / "ca.key").is_file():
        raise KubeadmError(f"couldn't load the CA to sign the user's certificate: {d / 'ca.key'} missing")
    hours = duration_hours(args.validity_period, 8760)
    with tempfile.TemporaryDirectory() as scratch:
        cert, key = Path(scratch) / "user.crt", Path(scratch) / "user.key"
        orgs = [o for value in args.org or [] for o in value.split(",") if o]  # a strings flag
        leaf = pki.Leaf("user", args.client_name, orgs)
        pki.sign(d / "ca.crt", d / "ca.key", leaf, cert, key, hours, s.algorithm)
        entry = {"client-certificate-data": b64(cert.read_bytes()), "client-key-data": b64(key.read_bytes())}
    ca_pem = (d / "ca.crt").read_bytes()
    print(kubeconfig(s.cluster_name, s.server, ca_pem, args.client_name, entry), end="")


def version_info() -> dict[str, str]:
    major, minor, _ = VERSION[1:].split(".")
    return {
        "major": major,
        "minor": minor,
        "gitVersion": VERSION,
        "gitCommit": "lab-stand-in",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.5",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def cmd_version(args: argparse.Namespace) -> None:
    info = version_info()
    if args.output == "short":
        print(VERSION)
    elif args.output == "json":
        print(json.dumps({"clientVersion": info}, indent=2))
    elif args.output == "yaml":
        print(dump({"clientVersion": info}), end="")
    else:
        fields = ", ".join(f'{k[0].upper() + k[1:]}:"{v}"' for k, v in info.items())
        print(f"kubeadm version: &version.Info{{{fields}}}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubeadm", description="kubeadm (lab stand-in, see docs/lab.md)")
    parser.add_argument("-v", "--v", default=None)
    sub = parser.add_subparsers(dest="command", required=True)

    init = sub.add_parser("init")
    for flag in (
        "config",
        "skip-phases",
        "ignore-preflight-errors",
        "cri-socket",
        "node-name",
        "pod-network-cidr",
        "service-cidr",
        "apiserver-advertise-address",
        "apiserver-bind-port",
        "kubernetes-version",
        "token",
        "token-ttl",
        "certificate-key",
        "patches",
    ):
        init.add_argument(f"--{flag}")
    for flag in ("upload-certs", "dry-run", "skip-token-print", "skip-certificate-key-print"):
        init.add_argument(f"--{flag}", action="store_true")

    join = sub.add_parser("join")
    join.add_argument("endpoint", nargs="?")
    for flag in (
        "config",
        "skip-phases",
        "ignore-preflight-errors",
        "cri-socket",
        "node-name",
        "token",
        "discovery-token",
        "patches",
        "certificate-key",
    ):
        join.add_argument(f"--{flag}")
    join.add_argument("--discovery-token-ca-cert-hash", action="append")
    join.add_argument("--discovery-token-unsafe-skip-ca-verification", action="store_true")
    join.add_argument("--control-plane", action="store_true")
    join.add_argument("--dry-run", action="store_true")

    token = sub.add_parser("token")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser("create")
    create.add_argument("token", nargs="?")
    create.add_argument("--print-join-command", action="store_true")
    create.add_argument("--ttl", default="24h0m0s")
    create.add_argument("--description")
    create.add_argument("--kubeconfig", default=str(p(f"{KUBE_DIR}/admin.conf")))

    reset = sub.add_parser("reset")
    reset.add_argument("-f", "--force", action="store_true")
    reset.add_argument("--config")
    reset.add_argument("--cri-socket")
    reset.add_argument("--ignore-preflight-errors")
    reset.add_argument("--cleanup-tmp-dir", action="store_true")
    reset.add_argument("--dry-run", action="store_true")

    config = sub.add_parser("config")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    validate = config_sub.add_parser("validate")
    validate.add_argument("--config", required=True)

    kubeconfig_cmd = sub.add_parser("kubeconfig")
    kubeconfig_sub = kubeconfig_cmd.add_subparsers(dest="kubeconfig_command", required=True)
    user = kubeconfig_sub.add_parser("user")
    user.add_argument("--client-name")
    user.add_argument("--config")
    user.add_argument("--org", action="append")
    user.add_argument("--token")
    user.add_argument("--validity-period", default="8760h0m0s")
    user.set_defaults(node_name=None, cri_socket=None)

    version = sub.add_parser("version")
    version.add_argument("-o", "--output", choices=("short", "json", "yaml"), default=None)
    return parser


def given_flags(argv: list[str]) -> set[str]:
    return {a[2:].split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    given = given_flags(argv)
    try:
        if args.command == "init":
            cmd_init(args, given)
        elif args.command == "join":
            if args.control_plane:
                raise KubeadmError("the lab's kubeadm stand-in joins worker nodes only (--control-plane)")
            cmd_join(args, given)
        elif args.command == "token":
            cmd_token_create(args)
        elif args.command == "reset":
            cmd_reset(args)
        elif args.command == "config":
            cmd_config_validate(args)
        elif args.command == "kubeconfig":
            cmd_kubeconfig_user(args)
        else:
            cmd_version(args)
    except (KubeadmError, pki.PkiError) as exc:
        print(str(exc), file=sys.stderr)
        print("To see the stack trace of this error execute with --v=5 or higher", file=sys.stderr)
        return 1
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
