"""containerd_registry_mirrors (role containerd): air-gapped sites pull registry.k8s.io, quay.io, nvcr.io and
docker.io images through their own mirrors (issue 17).

- hosts.toml rendered by the role's template, parsed with tomllib as containerd parses it (containerd's
  docs/hosts.md, core/remotes/docker/config/hosts.go): `server` = the upstream (docker.io's is
  registry-1.docker.io), one `[host."https://..."]` per endpoint in the given order, capabilities pull and
  resolve, `ca` the absolute path of the ca.crt beside it, never `skip_verify`;
- config.toml: the CRI images plugin's registry `config_path` is the directory the role writes;
- every rule of an entry (the role's filter, validate.yml's one home) refused naming the entry and field;
- the task file run by ansible-playbook on a scratch directory: files written, a second run changed=0, check
  mode and --diff honest, an entry taken out of the list removes its directory and only directories the role
  marked as its own; the files read by one find, so a converged node gets no call per registry, and drift (a
  line appended, a mode changed, a marker removed) found by --check --diff and put back, only it (issue 19).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from role_render import ROOT, RoleVars

CERTS_D = "/etc/containerd/certs.d"
MARKER = ".managed-by-ansible-role-containerd"


@pytest.fixture(scope="module")
def ca_pem(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real self-signed CA certificate (its key thrown away), as a site would paste its CA."""
    where = tmp_path_factory.mktemp("ca")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(where / "ca.key"), "-out", str(where / "ca.crt"), "-days", "2",
         "-subj", "/CN=unit test mirror CA"],
        check=True, capture_output=True,
    )  # fmt: skip
    return (where / "ca.crt").read_text()


def containerd(**overrides: Any) -> RoleVars:
    kubernetes = yaml.safe_load((ROOT / "roles/kubernetes/defaults/main.yml").read_text())
    kubernetes |= yaml.safe_load((ROOT / "roles/kubernetes/vars/main.yml").read_text())
    return RoleVars("containerd", **kubernetes, **overrides)


def hosts_toml(entry: dict[str, Any]) -> dict[str, Any]:
    return tomllib.loads(containerd(item=entry).render_template("hosts.toml.j2"))


def filters() -> ModuleType:
    path = ROOT / "roles/containerd/filter_plugins/containerd_registry.py"
    spec = importlib.util.spec_from_file_location("containerd_registry", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def errors(mirrors: Any) -> list[str]:
    return filters().registry_mirror_errors(mirrors)


# --- hosts.toml -----------------------------------------------------------------------------------------


def test_the_certs_directory_has_one_home() -> None:
    assert containerd()["__containerd_registry_config_dir"] == CERTS_D
    assert containerd()["__containerd_registry_marker"] == MARKER


def test_hosts_toml_tries_the_endpoints_in_order_then_the_registry(ca_pem: str) -> None:
    entry = {"registry": "quay.io", "endpoints": ["https://mirror-a.example:5000", "https://mirror-b.example"],
             "ca": ca_pem}  # fmt: skip
    parsed = hosts_toml(entry)
    assert parsed["server"] == "https://quay.io"
    assert list(parsed["host"]) == ["https://mirror-a.example:5000", "https://mirror-b.example"]
    for host in parsed["host"].values():
        assert host == {"capabilities": ["pull", "resolve"], "ca": f"{CERTS_D}/quay.io/ca.crt"}


def test_docker_io_falls_back_to_registry_1() -> None:
    # containerd's own default for docker.io (hosts.go): docker.io itself serves no registry API
    parsed = hosts_toml({"registry": "docker.io", "endpoints": ["https://mirror.example"]})
    assert parsed["server"] == "https://registry-1.docker.io"


def test_without_ca_the_system_roots_verify_the_mirror() -> None:
    parsed = hosts_toml({"registry": "registry.k8s.io", "endpoints": ["https://mirror.example"]})
    assert parsed["host"]["https://mirror.example"] == {"capabilities": ["pull", "resolve"]}


def test_a_site_registry_with_a_port_keeps_it_in_server_and_ca_path(ca_pem: str) -> None:
    entry = {
        "registry": "registry.example.internal:5000",
        "endpoints": ["https://10.0.0.5:5000"],
        "ca": ca_pem,
    }
    parsed = hosts_toml(entry)
    assert parsed["server"] == "https://registry.example.internal:5000"
    assert parsed["host"]["https://10.0.0.5:5000"]["ca"] == f"{CERTS_D}/registry.example.internal:5000/ca.crt"


def test_override_path_for_a_mirror_behind_a_path() -> None:
    entry = {
        "registry": "docker.io",
        "endpoints": ["https://harbor.example/v2/dockerhub"],
        "override_path": True,
    }
    host = hosts_toml(entry)["host"]["https://harbor.example/v2/dockerhub"]
    assert host["override_path"] is True


def test_skip_verify_is_never_written(ca_pem: str) -> None:
    entry = {"registry": "nvcr.io", "endpoints": ["https://m.example"], "ca": ca_pem, "override_path": False}
    text = containerd(item=entry).render_template("hosts.toml.j2")
    assert "skip_verify" not in text
    assert "override_path" not in tomllib.loads(text)["host"]["https://m.example"]


# --- config.toml ----------------------------------------------------------------------------------------


def config_toml(**overrides: Any) -> dict[str, Any]:
    return tomllib.loads(containerd(**overrides).render_template("config.toml.j2"))


def test_config_toml_points_the_cri_images_plugin_at_the_hosts_directory() -> None:
    images = config_toml()["plugins"]["io.containerd.cri.v1.images"]
    assert images["registry"] == {"config_path": CERTS_D}
    # the 1.x registry.mirrors/configs are not offered
    assert set(images["registry"]) == {"config_path"}


# --- validation -----------------------------------------------------------------------------------------


def test_good_entries_pass(ca_pem: str) -> None:
    mirrors = [
        {"registry": "registry.k8s.io", "endpoints": ["https://mirror.example:5000"], "ca": ca_pem},
        {"registry": "quay.io", "endpoints": ["https://mirror.example:5000", "https://backup.example"]},
        {"registry": "docker.io", "endpoints": ["https://harbor.example/v2/hub"], "override_path": True},
        {"registry": "10.0.0.5:5000", "endpoints": ["https://10.0.0.5:5000"], "ca": ca_pem + ca_pem},
    ]
    assert errors(mirrors) == []
    assert errors([]) == []


M = "https://m.example"


def quay(**fields: Any) -> list[dict[str, Any]]:
    """A list of one quay.io entry with one endpoint, the given fields changed."""
    return [{"registry": "quay.io", "endpoints": [M], **fields}]


BAD: list[tuple[str, Any, list[str]]] = [
    ("not a list", {"registry": "quay.io"}, ["containerd_registry_mirrors must be a list"]),
    ("not a mapping", ["quay.io"], ["containerd_registry_mirrors[0]", "mapping"]),
    ("unknown key", [{"registry": "quay.io", "endpoint": [M]}],
     ["containerd_registry_mirrors[0] (quay.io)", "endpoint", "registry, endpoints, ca, override_path"]),
    ("no registry", [{"endpoints": [M]}], ["containerd_registry_mirrors[0]", "registry"]),
    ("scheme in registry", quay(registry="https://quay.io"),
     ["containerd_registry_mirrors[0]", "registry", "host[:port]", "https://quay.io"]),
    ("path in registry", quay(registry="quay.io/calico"), ["registry", "quay.io/calico"]),
    ("upper case", quay(registry="Quay.io"), ["registry", "lower case"]),
    ("bad port", quay(registry="r.example:99999"), ["registry", "port"]),
    ("docker hub alias", quay(registry="index.docker.io"), ["index.docker.io", "docker.io"]),
    ("duplicate registry", quay(endpoints=["https://a.example"]) + quay(endpoints=["https://b.example"]),
     ["containerd_registry_mirrors[1] (quay.io)", "also containerd_registry_mirrors[0]"]),
    ("no endpoints", [{"registry": "quay.io"}], ["containerd_registry_mirrors[0] (quay.io)", "endpoints"]),
    ("empty endpoints", quay(endpoints=[]), ["(quay.io)", "endpoints", "at least one"]),
    ("endpoints a string", quay(endpoints=M), ["endpoints", "list"]),
    ("http endpoint", quay(endpoints=["http://m.example:5000"]),
     ["(quay.io)", "endpoints[0]", "https://", "http://m.example:5000"]),
    ("endpoint without scheme", quay(endpoints=["m.example:5000"]), ["endpoints[0]"]),
    ("endpoint with a query", quay(endpoints=["https://m.example/?ns=x"]), ["endpoints[0]"]),
    ("endpoint with credentials", quay(endpoints=["https://u:p@m.example"]), ["endpoints[0]"]),
    ("endpoint with a quote", quay(endpoints=['https://m.example/"x']), ["endpoints[0]"]),
    ("duplicate endpoint", quay(endpoints=[M, M]), ["endpoints[1]", "twice"]),
    ("ca a path", quay(ca="/etc/ssl/site-ca.pem"), ["(quay.io)", "ca", "PEM", "lookup('file'"]),
    ("ca truncated", quay(ca="-----BEGIN CERTIFICATE-----\nMIIB\n"), ["(quay.io)", "ca", "PEM"]),
    ("override_path not a bool", quay(endpoints=["https://m.example/v2/q"], override_path="yes"),
     ["override_path", "true or false"]),
    ("override_path without a path", quay(override_path=True),
     ["override_path", "https://m.example", "path"]),
]  # fmt: skip


@pytest.mark.parametrize(("mirrors", "says"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_entries_are_refused_naming_entry_and_field(mirrors: Any, says: list[str]) -> None:
    found = errors(mirrors)
    assert found, "accepted"
    text = "\n".join(found)
    for part in says:
        assert part in text, text


def test_a_private_key_given_as_ca_is_refused_without_echoing_it(ca_pem: str) -> None:
    key = "-----BEGIN PRIVATE KEY-----\nSECRETSECRET\n-----END PRIVATE KEY-----\n"
    found = errors([{"registry": "quay.io", "endpoints": ["https://m.example"], "ca": ca_pem + key}])
    assert found
    assert "private key" in found[0]
    assert "SECRETSECRET" not in "\n".join(found)


# --- the task files, run by ansible-playbook ------------------------------------------------------------


def playbook(tmp_path: Path, tasks: list[dict[str, Any]], variables: dict[str, Any], *args: str) -> Any:
    play = [{"hosts": "localhost", "gather_facts": False, "vars": variables, "tasks": tasks}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "extra.json").write_text(json.dumps(variables))
    return subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={ROOT / '.venv/bin/python'}", "-e", f"@{tmp_path / 'extra.json'}",
         *args, str(tmp_path / "play.yml")],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=300,
        env={"ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_CALLBACK_RESULT_FORMAT": "yaml"},
    )  # fmt: skip


def changed(run: Any) -> int:
    recap = run.stdout.split("PLAY RECAP")[-1]
    return int(recap.split("changed=")[1].split()[0])


def test_validate_refuses_a_bad_entry_before_any_change(tmp_path: Path) -> None:
    tasks = [{"ansible.builtin.include_role": {"name": "containerd", "tasks_from": "validate"}}]
    bad = [
        {"registry": "quay.io", "endpoints": ["http://mirror.example:5000"]},
        {"registry": "nvcr.io", "endpoints": ["https://mirror.example:5000"], "ca": "files/site-ca.crt"},
    ]
    run = playbook(tmp_path, tasks, {"containerd_registry_mirrors": bad})
    assert run.returncode != 0
    out = " ".join(run.stdout.split())
    assert "containerd_registry_mirrors[0] (quay.io): endpoints[0]" in out, run.stdout[-3000:]
    # the hint in the message is text, not a template Ansible would run
    assert "containerd_registry_mirrors[1] (nvcr.io): ca" in out
    assert "lookup('file', inventory_dir ~ '/files/site-ca.crt')" in out


def test_the_hosts_files_converge_idempotent_honest_in_check_mode(tmp_path: Path, ca_pem: str) -> None:
    certs = tmp_path / "certs.d"
    tasks = [
        {"ansible.builtin.include_role": {"name": "containerd", "tasks_from": "configure-registry-mirrors"}}
    ]
    mirrors = [
        {"registry": "registry.k8s.io", "endpoints": ["https://mirror.example:5000"], "ca": ca_pem},
        {"registry": "quay.io", "endpoints": ["https://mirror.example:5000"], "ca": ca_pem},
    ]
    base = {"__containerd_registry_config_dir": str(certs)}

    # --check on a node that has nothing yet: reports the changes, writes nothing, fails nowhere
    run = playbook(tmp_path, tasks, base | {"containerd_registry_mirrors": mirrors}, "--check", "--diff")
    assert run.returncode == 0, run.stdout[-3000:]
    assert changed(run) > 0
    assert not certs.exists()

    run = playbook(tmp_path, tasks, base | {"containerd_registry_mirrors": mirrors})
    assert run.returncode == 0, run.stdout[-3000:]
    for registry in ("registry.k8s.io", "quay.io"):
        parsed = tomllib.loads((certs / registry / "hosts.toml").read_text())
        assert parsed["host"]["https://mirror.example:5000"]["ca"] == f"{certs}/{registry}/ca.crt"
        assert (certs / registry / "ca.crt").read_text().strip() == ca_pem.strip()
        assert (certs / registry / MARKER).is_file()

    again = playbook(tmp_path, tasks, base | {"containerd_registry_mirrors": mirrors})
    assert again.returncode == 0
    assert changed(again) == 0, again.stdout[-3000:]
    checked = playbook(tmp_path, tasks, base | {"containerd_registry_mirrors": mirrors}, "--check", "--diff")
    assert changed(checked) == 0, checked.stdout[-3000:]

    # a site's own directory (no marker) is left alone; an entry taken out is removed; a CA taken out goes
    (certs / "site.example").mkdir()
    (certs / "site.example" / "hosts.toml").write_text('server = "https://site.example"\n')
    fewer = [{"registry": "registry.k8s.io", "endpoints": ["https://mirror.example:5000"]}]
    preview = playbook(tmp_path, tasks, base | {"containerd_registry_mirrors": fewer}, "--check", "--diff")
    assert preview.returncode == 0
    assert (certs / "quay.io" / "hosts.toml").exists(), "check mode removed a directory"
    assert str(certs / "quay.io") in preview.stdout
    run = playbook(tmp_path, tasks, base | {"containerd_registry_mirrors": fewer})
    assert run.returncode == 0, run.stdout[-3000:]
    assert not (certs / "quay.io").exists()
    assert not (certs / "registry.k8s.io" / "ca.crt").exists()
    assert (
        "ca"
        not in tomllib.loads((certs / "registry.k8s.io" / "hosts.toml").read_text())["host"][
            "https://mirror.example:5000"
        ]
    )
    assert sorted(p.name for p in certs.iterdir()) == ["registry.k8s.io", "site.example"]


def items(run: Any, status: str = "changed") -> set[tuple[str, str]]:
    """(task, item) of every loop item of a default-callback run reported with this status (ok, changed)."""
    found, task = set(), ""
    for line in run.stdout.splitlines():
        if line.startswith("TASK ["):
            task = line.removeprefix("TASK [").split("]")[0].split(" : ", 1)[-1]
        elif line.startswith(f"{status}: [localhost] => (item="):
            found.add((task, line.split("(item=", 1)[1].rsplit(")", 1)[0]))
    return found


def test_drift_in_the_hosts_files_is_found_and_only_it_is_put_back(tmp_path: Path, ca_pem: str) -> None:
    """The tasks skip what the node already has (one find reads it all): what differs must still be found."""
    certs = tmp_path / "certs.d"
    tasks = [
        {"ansible.builtin.include_role": {"name": "containerd", "tasks_from": "configure-registry-mirrors"}}
    ]
    mirrors = [
        {"registry": registry, "endpoints": ["https://mirror.example:5000"], "ca": ca_pem}
        for registry in ("registry.k8s.io", "quay.io", "nvcr.io")
    ]
    variables = {"__containerd_registry_config_dir": str(certs), "containerd_registry_mirrors": mirrors}
    run = playbook(tmp_path, tasks, variables)
    assert run.returncode == 0, run.stdout[-3000:]
    converged = {p: (p.read_bytes() if p.is_file() else b"", p.stat().st_mode) for p in certs.rglob("*")}

    (certs / "quay.io" / "hosts.toml").write_text(
        (certs / "quay.io" / "hosts.toml").read_text() + "junk = 1\n"
    )
    (certs / "registry.k8s.io" / "ca.crt").chmod(0o600)
    (certs / "nvcr.io" / MARKER).unlink()
    (certs / "nvcr.io").chmod(0o700)
    expected = {
        ("Write each registry's hosts.toml", "quay.io"),
        ("Write the CA of each registry's mirrors", "registry.k8s.io"),
        ("Mark the registry directories as the role's", "nvcr.io"),
        ("Create a directory per mirrored registry", "nvcr.io"),
    }

    preview = playbook(tmp_path, tasks, variables, "--check", "--diff")
    assert preview.returncode == 0, preview.stdout[-3000:]
    assert items(preview) == expected, preview.stdout[-3000:]
    assert "-junk = 1" in preview.stdout, "the diff does not show the line to be removed"
    assert not (certs / "nvcr.io" / MARKER).exists(), "check mode wrote a file"

    run = playbook(tmp_path, tasks, variables)
    assert run.returncode == 0, run.stdout[-3000:]
    assert items(run) == expected, run.stdout[-3000:]
    assert {
        p: (p.read_bytes() if p.is_file() else b"", p.stat().st_mode) for p in certs.rglob("*")
    } == converged

    again = playbook(tmp_path, tasks, variables)
    assert changed(again) == 0, again.stdout[-3000:]
    # a converged node: no file, copy or template call per registry, only the directory and the find
    registries = {registry for _, registry in expected}
    assert not {item for item in items(again, "ok") if item[1] in registries}, again.stdout[-3000:]


def test_the_roles_read_finds_the_hosts_files_for_the_tasks(tmp_path: Path, ca_pem: str) -> None:
    """In the role's run, tasks/main.yml's files_in_place call finds the registry directories and files (its
    find `registry`, __containerd_registry_find): configure-registry-mirrors.yml reads them from it, with no
    read of its own, and still finds drift."""
    certs = tmp_path / "certs.d"
    include = {
        "ansible.builtin.include_role": {"name": "containerd", "tasks_from": "configure-registry-mirrors"}
    }
    mirrors = [{"registry": "quay.io", "endpoints": ["https://mirror.example:5000"], "ca": ca_pem}]
    variables = {"__containerd_registry_config_dir": str(certs), "containerd_registry_mirrors": mirrors}
    run = playbook(tmp_path, [include], variables)
    assert run.returncode == 0, run.stdout[-3000:]

    role = containerd(**variables)
    assert role["__containerd_finds"][0] == role["__containerd_registry_find"]
    read = {
        "name": "Read as tasks/main.yml reads",
        # plain JSON values (the templar's strings are tagged), as the task would pass them
        "files_in_place": {"find": [json.loads(json.dumps(role["__containerd_registry_find"]))]},
        "register": "__containerd_files_state",
    }
    again = playbook(tmp_path, [read, include], variables)
    assert again.returncode == 0 and changed(again) == 0, again.stdout[-3000:]
    own_read = again.stdout.split("TASK [containerd : Read the registry directories")[1].split("TASK [")[0]
    assert "skipping: [localhost]" in own_read, own_read

    (certs / "quay.io" / "hosts.toml").write_text(
        (certs / "quay.io" / "hosts.toml").read_text() + "junk = 1\n"
    )
    fixed = playbook(tmp_path, [read, include], variables)
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    assert items(fixed) == {("Write each registry's hosts.toml", "quay.io")}, fixed.stdout[-3000:]
    assert "junk" not in (certs / "quay.io" / "hosts.toml").read_text()


def verify(**registered: Any) -> RoleVars:
    converged = {
        "__containerd_files_state": {"differ": [], "found": {"config": {"files": [{"mtime": 1.0}]}}},
        "__containerd_packages_found": {"in_place": True},
        "__containerd_config_reread": {"skipped": True},
    }
    return containerd(**(converged | registered))


def test_verify_takes_the_config_files_from_the_roles_read_only_where_nothing_wrote_one_since() -> None:
    """verify-containerd.yml holds the *.toml files' mtimes against the daemon's start: the role's read has
    them (its find `config`) unless the install, config.toml's template or nvidia-ctk may have written one
    since."""
    assert verify()["__containerd_config_read_current"] is True
    assert verify(__containerd_nvidia_ctk={"skipped": True})["__containerd_config_read_current"] is True
    assert verify(__containerd_nvidia_ctk={"changed": True})["__containerd_config_read_current"] is False
    assert (
        verify(__containerd_packages_found={"in_place": False})["__containerd_config_read_current"] is False
    )
    differs = {"differ": ["/etc/containerd/config.toml"], "found": {"config": {"files": []}}}
    assert verify(__containerd_files_state=differs)["__containerd_config_read_current"] is False
    # entered alone (tasks_from, playbooks/tasks/upgrade-containerd-node.yml): no read of the role's
    alone = RoleVars("containerd", __containerd_packages_found={"in_place": True})
    assert alone["__containerd_config_read_current"] is False
    assert containerd()["__containerd_config_find"] == {
        "name": "config",
        "paths": ["/etc/containerd", "/etc/containerd/conf.d"],
        "patterns": ["*.toml"],
    }
