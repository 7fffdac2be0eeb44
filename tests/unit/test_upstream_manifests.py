"""tests/lab/upstream_manifests.py (issue 16, item 13): a clone without ../shared still gets the upstream
manifests, from their pinned URLs and checked against their pinned sha256, or stops naming both ways.

The URLs are served by a local http.server on 127.0.0.1 (nothing leaves this machine); "no network" is a
URL on a closed local port.
"""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from lab.upstream_manifests import MANIFESTS, UpstreamError, manifest, pinned

ROOT = Path(__file__).resolve().parents[2]
PATH = "demo/v1.0.0/demo.yaml"
BYTES = b"kind: Demo\n"
SHA256 = hashlib.sha256(BYTES).hexdigest()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """http://127.0.0.1:PORT/ serving tmp_path/www."""
    www = tmp_path / "www"
    (www / "demo").mkdir(parents=True)
    (www / "demo" / "demo.yaml").write_bytes(BYTES)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(*args, directory=str(www), **kwargs)

        def log_message(self, *args):  # type: ignore[no-untyped-def]
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/demo/demo.yaml"


def test_the_local_copy_is_used(tmp_path: Path) -> None:
    local = tmp_path / "shared-upstream"
    (local / PATH).parent.mkdir(parents=True)
    (local / PATH).write_bytes(BYTES)
    entries = {PATH: {"url": closed_port_url(), "sha256": SHA256}}
    assert manifest(PATH, local=local, cache=tmp_path / "cache", entries=entries) == local / PATH
    assert not (tmp_path / "cache").exists()


def test_a_missing_copy_is_downloaded_checked_and_cached(tmp_path: Path, server: str) -> None:
    entries = {PATH: {"url": server + "demo/demo.yaml", "sha256": SHA256}}
    got = manifest(PATH, local=tmp_path / "none", cache=tmp_path / "cache", entries=entries)
    assert got == tmp_path / "cache" / PATH and got.read_bytes() == BYTES
    # the next call uses the cache: no server needed
    entries[PATH]["url"] = closed_port_url()
    assert (
        manifest(PATH, local=tmp_path / "none", cache=tmp_path / "cache", entries=entries).read_bytes()
        == BYTES
    )


def test_a_download_with_the_wrong_sha256_is_refused_naming_the_file_and_both_hashes(
    tmp_path: Path, server: str
) -> None:
    wrong = "0" * 64
    entries = {PATH: {"url": server + "demo/demo.yaml", "sha256": wrong}}
    with pytest.raises(UpstreamError) as refused:
        manifest(PATH, local=tmp_path / "none", cache=tmp_path / "cache", entries=entries)
    assert PATH in str(refused.value) and SHA256 in str(refused.value) and wrong in str(refused.value)
    assert not (tmp_path / "cache" / PATH).exists()


def test_no_copy_and_no_network_names_the_missing_path_and_the_url(tmp_path: Path) -> None:
    url = closed_port_url()
    entries = {PATH: {"url": url, "sha256": SHA256}}
    with pytest.raises(UpstreamError) as failed:
        manifest(PATH, local=tmp_path / "none", cache=tmp_path / "cache", entries=entries)
    message = str(failed.value)
    assert str(tmp_path / "none" / PATH) in message and url in message and "failed" in message


def test_a_role_pinned_manifest_takes_its_url_and_sha256_from_the_roles_defaults() -> None:
    defaults = yaml.safe_load((ROOT / "roles/calico/defaults/main.yml").read_text())
    url, sha256 = pinned("calico/v3.32.1/calico.yaml")
    assert sha256 == defaults["calico_manifest_sha256"]
    assert url == defaults["calico_manifest_url"].replace("{{ calico_version }}", defaults["calico_version"])
    assert f"/{defaults['calico_version']}/" in url


def test_every_pinned_manifest_has_an_https_url_and_a_sha256() -> None:
    for path in MANIFESTS:
        url, sha256 = pinned(path)
        assert url.startswith("https://") and len(sha256) == 64, path
