"""containerd_registry_mirror_errors: what is wrong with containerd_registry_mirrors, one message per problem.

The one home of the rules for a mirror entry: tasks/validate.yml fails when the list is not empty, before any
change; tests/unit/test_containerd_registry_mirrors.py drives it directly. Each message names the entry (its
index and registry) and the field. The shapes follow containerd's hosts.toml (docs/hosts.md): the registry is
the host[:port] of image names, which is also the directory containerd looks up; an endpoint is a URL whose
path, if any, containerd appends /v2 to unless override_path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

NAME = "containerd_registry_mirrors"
KEYS = ("registry", "endpoints", "ca", "override_path")
LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
HOST = re.compile(rf"^{LABEL}(?:\.{LABEL})*(?::(?P<port>[0-9]+))?$")
# Names Docker Hub images never carry: references normalise them to docker.io.
DOCKER_HUB_ALIASES = ("index.docker.io", "registry-1.docker.io")
PEM_BLOCK = re.compile(r"-----BEGIN CERTIFICATE-----\s*[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")
# Characters that would need escaping in hosts.toml, or that no URL of a registry carries.
UNSAFE_URL = re.compile(r'[\s"\'\\]')


def _registry_errors(where: str, registry: Any) -> list[str]:
    if not isinstance(registry, str) or not registry:
        return [f"{where}: registry is required, the registry's host[:port] (like quay.io); got {registry!r}"]
    if registry in DOCKER_HUB_ALIASES:
        return [
            f"{where}: registry {registry!r}: Docker Hub images are named docker.io/...; "
            "use registry docker.io"
        ]
    if registry != registry.lower() and HOST.match(registry.lower()):
        return [
            f"{where}: registry {registry!r} must be written in lower case, as image names write it "
            "(containerd looks up its directory by that name)"
        ]
    match = HOST.match(registry)
    if not match:
        return [
            f"{where}: registry must be the registry's host[:port] as image names spell it (like quay.io or "
            f"registry.example.internal:5000), without scheme or path; got {registry!r}"
        ]
    port = match.group("port")
    if port is not None and not 1 <= int(port) <= 65535:
        return [f"{where}: registry {registry!r}: port must be 1-65535"]
    return []


def _endpoint_error(where: str, index: int, endpoint: Any, override_path: bool) -> str | None:
    field = f"{where}: endpoints[{index}]"
    shape = "an https:// URL of the mirror (like https://mirror.example.internal:5000)"
    if not isinstance(endpoint, str) or not endpoint:
        return f"{field} must be {shape}; got {endpoint!r}"
    if UNSAFE_URL.search(endpoint):
        return f"{field} must be {shape} without spaces, quotes or backslashes; got {endpoint!r}"
    try:
        url = urlsplit(endpoint)
        port = url.port
    except ValueError as error:
        return f"{field} must be {shape}; got {endpoint!r} ({error})"
    if url.scheme != "https" or not url.hostname:
        return (
            f"{field} must be {shape}: plain http and skip_verify are not offered, give the CA as ca; "
            f"got {endpoint!r}"
        )
    if url.username is not None or url.password is not None:
        return f"{field}: credentials do not belong in the URL; got a URL with user information"
    if url.query or url.fragment or endpoint.endswith(("?", "#")):
        return f"{field} must be {shape} without query or fragment; got {endpoint!r}"
    if port == 0:
        return f"{field}: port must be 1-65535; got {endpoint!r}"
    if override_path and url.path.strip("/") == "":
        return (
            f"{field}: override_path makes the URL's path the registry API's root, so each endpoint needs "
            f"that path (like https://harbor.example/v2/dockerhub-proxy); {endpoint!r} has no path"
        )
    return None


def _ca_error(where: str, ca: Any) -> str | None:
    if not isinstance(ca, str):
        return f"{where}: ca must be PEM text; got a {type(ca).__name__}"
    if "PRIVATE KEY" in ca:
        return (
            f"{where}: ca holds a private key: give only the CA's certificate(s), the key stays with the CA"
        )
    text = ca.strip()
    blocks = PEM_BLOCK.findall(text)
    if not blocks or PEM_BLOCK.sub("", text).strip():
        return (
            f"{where}: ca must be the PEM text of the CA certificate(s) that signed the endpoints' "
            "certificates (-----BEGIN CERTIFICATE----- ... -----END CERTIFICATE-----), not a path; "
            "to read a file on the controller: "
            "ca: \"{{ lookup('file', inventory_dir ~ '/files/site-ca.crt') }}\""
        )
    return None


def _entry_errors(where: str, entry: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    unknown = sorted(set(entry) - set(KEYS), key=str)
    if unknown:
        found.append(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))}; an entry has {', '.join(KEYS)}"
        )
    found += _registry_errors(where, entry.get("registry"))
    override_path = entry.get("override_path", False)
    if not isinstance(override_path, bool):
        found.append(f"{where}: override_path must be true or false; got {override_path!r}")
        override_path = False
    endpoints = entry.get("endpoints")
    if endpoints is None:
        found.append(f"{where}: endpoints is required, a list of https:// URLs of the mirror, tried in order")
    elif isinstance(endpoints, (str, bytes, Mapping)) or not isinstance(endpoints, (list, tuple)):
        found.append(f"{where}: endpoints must be a list of https:// URLs; got {endpoints!r}")
    elif not endpoints:
        found.append(f"{where}: endpoints must list at least one https:// URL of the mirror")
    else:
        for index, endpoint in enumerate(endpoints):
            error = _endpoint_error(where, index, endpoint, override_path)
            if error:
                found.append(error)
            elif endpoint in endpoints[:index]:
                found.append(f"{where}: endpoints[{index}] {endpoint!r} is listed twice")
    if "ca" in entry:
        error = _ca_error(where, entry["ca"])
        if error:
            found.append(error)
    return found


def registry_mirror_errors(mirrors: Any, name: str = NAME) -> list[str]:
    """Every problem of the list, each naming `name[index] (registry)` and the field; [] when it is good."""
    if isinstance(mirrors, (str, bytes, Mapping)) or not isinstance(mirrors, (list, tuple)):
        return [
            f"{name} must be a list of entries {{registry, endpoints, ca, override_path}}; got {mirrors!r}"
        ]
    found: list[str] = []
    first: dict[str, int] = {}
    for index, entry in enumerate(mirrors):
        if not isinstance(entry, Mapping):
            found.append(f"{name}[{index}] must be a mapping with {', '.join(KEYS)}; got {entry!r}")
            continue
        registry = entry.get("registry")
        where = f"{name}[{index}]" + (f" ({registry})" if isinstance(registry, str) and registry else "")
        found += _entry_errors(where, entry)
        if isinstance(registry, str) and registry:
            if registry in first:
                found.append(
                    f"{where}: registry {registry} is also {name}[{first[registry]}]; one entry per registry"
                    " (list every mirror of it in that entry's endpoints)"
                )
            else:
                first[registry] = index
    return found


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"containerd_registry_mirror_errors": registry_mirror_errors}
