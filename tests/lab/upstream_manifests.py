"""The byte-exact upstream manifests the lab serves and the tests read: where each comes from, in one place.

    from upstream_manifests import manifest, UpstreamError
    path = manifest("calico/v3.32.1/calico.yaml")     # a local file with exactly the pinned bytes

Each manifest has a pinned URL and sha256 (MANIFESTS below; for the ones a role downloads, the role's own
defaults are that home, read from there). The bytes come from, in order:
  1. the local copy beside the checkout, ../shared/upstream/<path> (the project's vendored copies);
  2. the download cache, <lab state dir>/cache/upstream/<path> (.lab/, per machine: labstate.py);
  3. the pinned URL, downloaded once into that cache.
Every source is checked against the sha256: a wrong one is refused naming the file and both hashes. Where no
source works, UpstreamError names the missing local copy, the URL and the download's error. The manifests
themselves stay out of the repository.
"""

from __future__ import annotations

import hashlib
import re
import urllib.request
from pathlib import Path

import yaml

try:
    import labstate  # beside this file: where the lab's state lives
except ModuleNotFoundError:  # imported as lab.upstream_manifests (the unit tests, tests/ on sys.path)
    from lab import labstate

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO.parent / "shared" / "upstream"  # the checkout's ../shared/upstream
CACHE = labstate.STATE / "cache" / "upstream"  # the lab state directory (tests/lab/labstate.py)
DOWNLOAD_TIMEOUT_S = 60

# path -> pinned URL and sha256, or the role whose defaults pin them (their variables' names)
MANIFESTS: dict[str, dict[str, str]] = {
    "calico/v3.32.1/calico.yaml": {
        "role": "calico", "url": "calico_manifest_url", "sha256": "calico_manifest_sha256",
    },
    "k8s-device-plugin/v0.20.0/nvidia-device-plugin.yml": {
        "role": "nvidia_device_plugin",
        "url": "nvidia_device_plugin_manifest_url", "sha256": "nvidia_device_plugin_manifest_sha256",
    },
    "dcgm-exporter/4.5.3-4.8.2/dcgm-exporter.yaml": {
        "role": "monitoring",
        "url": "monitoring_dcgm_exporter_manifest_url", "sha256": "monitoring_dcgm_exporter_manifest_sha256",
    },
    "calico/v3.32.1/operator-crds.yaml": {
        "url": "https://raw.githubusercontent.com/projectcalico/calico/v3.32.1/manifests/operator-crds.yaml",
        "sha256": "192f8b2d934ef24b62e86b7e1a6e1762d1c8af26a916f78057bc13fa5ed60f71",
    },
    "calico/v3.32.1/tigera-operator.yaml": {
        "url": "https://raw.githubusercontent.com/projectcalico/calico/v3.32.1/manifests/tigera-operator.yaml",
        "sha256": "f18e073794207d372606bc3ea6f8fd73972f86d6828f4ba666dfe0d4aa8ab07f",
    },
    "calico/v3.32.1/custom-resources.yaml": {
        "url": "https://raw.githubusercontent.com/projectcalico/calico/v3.32.1/manifests/custom-resources.yaml",
        "sha256": "4fb598a7fce1ad1f8bbfb9004f5efcdb835082e92e06323cb7b8ce60260ed891",
    },
    "dcgm-exporter/4.5.3-4.8.2/default-counters.csv": {
        "url": "https://raw.githubusercontent.com/NVIDIA/dcgm-exporter/4.5.3-4.8.2/etc/default-counters.csv",
        "sha256": "13d8c92cffa649f17c4c0938bb16707daf27260e845c77eacf89dbb68a46eaf9",
    },
    "dcgm-exporter/4.5.3-4.8.2/dcp-metrics-included.csv": {
        "url": "https://raw.githubusercontent.com/NVIDIA/dcgm-exporter/4.5.3-4.8.2/etc/dcp-metrics-included.csv",
        "sha256": "85bfa5d5d0875d083d68788be427560f7bbe87093f608cba6ab04a3d4aaf5820",
    },
    "production-stack/vllm-stack-0.1.12/gpu-deployment.yaml": {
        "url": (
            "https://raw.githubusercontent.com/vllm-project/production-stack/vllm-stack-0.1.12/"
            "src/gateway_inference_extension/configs/vllm/gpu-deployment.yaml"
        ),
        "sha256": "119fe8d14eadd1494435144ad8b21988c481e457e9b2e37ccca05512976f31f2",
    },
}  # fmt: skip


class UpstreamError(RuntimeError):
    pass


def _role_default(role: str, name: str) -> str:
    """A role default, with the {{ other_default }} references of the same file put in."""
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())
    value = str(defaults[name])
    for _ in range(5):
        value = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: str(defaults[m[1]]), value)
    return value.strip()


def pinned(path: str, entries: dict[str, dict[str, str]] | None = None) -> tuple[str, str]:
    """(URL, sha256) pinned for the manifest at `path` (relative to the upstream tree)."""
    entry = (entries or MANIFESTS).get(path)
    if entry is None:
        raise UpstreamError(
            f"{path}: not an upstream manifest this project pins (tests/lab/upstream_manifests.py)"
        )
    if "role" in entry:
        return _role_default(entry["role"], entry["url"]), _role_default(entry["role"], entry["sha256"])
    return entry["url"], entry["sha256"]


def _checked(data: bytes, what: str, sha256: str) -> bytes:
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise UpstreamError(f"{what}: sha256 {got}, but the pinned sha256 is {sha256}: refused")
    return data


def manifest(
    path: str,
    *,
    local: Path = LOCAL,
    cache: Path = CACHE,
    entries: dict[str, dict[str, str]] | None = None,
) -> Path:
    """A file holding exactly the pinned bytes of the upstream manifest `path` (see the module's doc)."""
    url, sha256 = pinned(path, entries)
    copy = local / path
    if copy.is_file():
        _checked(copy.read_bytes(), str(copy), sha256)
        return copy
    cached = cache / path
    if cached.is_file():
        try:
            _checked(cached.read_bytes(), str(cached), sha256)
            return cached
        except UpstreamError:
            cached.unlink()  # a damaged download: fetch it again
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
    except OSError as error:
        raise UpstreamError(
            f"{path}: no local copy at {copy}, and the download from {url} failed: {error}"
            " (put the project's shared/ beside the checkout, or give this machine access to that URL)"
        ) from error
    _checked(data, f"{path} downloaded from {url}", sha256)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(cached.name + ".partial")
    partial.write_bytes(data)
    partial.replace(cached)
    return cached
