"""plugins/callback/worker_prefork.py: a worker forked after the callback loads freezes the heap it inherits,
and inherits the plugins every worker loads, already loaded.

The fork checks run in a fresh interpreter each, because os.register_at_fork cannot be undone in this one.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugins" / "callback" / "worker_prefork.py"

# Prints, for a child forked as multiprocessing forks Ansible's WorkerProcess: its freeze count, the parent's
# freeze count, and what registering again returned. LOAD: 0 (plugin not loaded), 1 or 2 (instantiated twice).
_FORK_PROBE = textwrap.dedent(
    """
    import gc, importlib.util, multiprocessing, sys

    load = int(sys.argv[2])
    registered = []
    if load:
        spec = importlib.util.spec_from_file_location("worker_prefork", sys.argv[1])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for _ in range(load):
            module.CallbackModule()
        registered = [module.freeze_inherited_heap_after_fork() for _ in range(2)]
    held = [[i] for i in range(20000)]  # objects the parent holds when it forks

    def child(queue):
        queue.put(gc.get_freeze_count())

    ctx = multiprocessing.get_context("fork")
    queue = ctx.SimpleQueue()
    worker = ctx.Process(target=child, args=(queue,))
    worker.start()
    worker.join()
    print(queue.get(), gc.get_freeze_count(), registered)
    """
)

# Loads the plugins as the callback does before a task's workers fork, then prints which module files the
# loaders hold, and what load_worker_plugins reported missing. ARGV: plugin path, then filter names.
_LOAD_PROBE = textwrap.dedent(
    """
    import importlib.util, json, sys

    spec = importlib.util.spec_from_file_location("worker_prefork", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from ansible.plugins import loader

    loader.init_plugin_loader()  # as ansible-playbook does first (the collections' finder)
    missing = module.load_worker_plugins(sys.argv[2:])
    held = {
        kind: sorted(path.rpartition("/")[2] for path in getattr(loader, kind + "_loader")._module_cache)
        for kind in ("connection", "become", "shell", "lookup", "filter", "test")
    }
    print(json.dumps({"missing": missing, "held": held}))
    """
)


# The callback as ansible-playbook loads it (ansible.cfg's callback_plugins, its options set), its task and
# handler hooks called: prints the warnings it gave and which filter files the loader then holds.
_HOOK_PROBE = textwrap.dedent(
    """
    import json
    from ansible.plugins import loader

    loader.init_plugin_loader()
    callback = loader.callback_loader.get("worker_prefork")
    callback.set_options()
    warnings = []
    callback._display.warning = warnings.append
    callback.v2_playbook_on_task_start(None, is_conditional=False)
    callback.v2_playbook_on_handler_task_start(None)
    held = sorted(path.rpartition("/")[2] for path in loader.filter_loader._module_cache)
    print(json.dumps({"warnings": warnings, "filters": held}))
    """
)


def _fork_probe(load: int) -> tuple[int, int, str]:
    probe = [sys.executable, "-c", _FORK_PROBE, str(PLUGIN), str(load)]
    out = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.split(maxsplit=2)
    return int(out[0]), int(out[1]), out[2].strip()


def _load_probe(*filters: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_PROBE, str(PLUGIN), *filters],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_worker_forked_after_the_callback_loads_freezes_what_it_inherits() -> None:
    child_frozen, parent_frozen, registered = _fork_probe(load=1)
    assert child_frozen > 20000, "the worker's collector would still walk the controller's heap"
    assert parent_frozen == 0, "the controller's own process must not be frozen"
    assert registered == "[False, False]", "the hook is registered once per process"


def test_without_the_callback_a_worker_freezes_nothing() -> None:
    assert _fork_probe(load=0) == (0, 0, "[]")


def test_loading_it_twice_registers_the_hook_once() -> None:
    child_frozen, _, registered = _fork_probe(load=2)
    assert child_frozen > 20000
    assert registered == "[False, False]"


def test_the_controller_holds_the_plugins_every_worker_loads() -> None:
    found = _load_probe("community.general.dict_kv")
    assert found["missing"] == []
    held = found["held"]
    assert "ssh.py" in held["connection"] and "local.py" in held["connection"]
    assert held["become"] == ["sudo.py"]  # ansible.cfg's become_method
    assert "sh.py" in held["shell"]
    assert "template.py" in held["lookup"]
    # the builtin filters and tests, the project's legacy filters, and the collection's filter files
    assert {"core.py", "mathstuff.py", "kubernetes_values.py", "local_accounts.py"} <= set(held["filter"])
    assert "dict_kv.py" in held["filter"] and "from_csv.py" in held["filter"]
    assert {"core.py", "files.py"} <= set(held["test"])


def test_its_task_and_handler_hooks_load_them_and_warn_once_for_what_they_cannot() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _HOOK_PROBE],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_CALLBACK_WORKER_PREFORK_FILTERS": "community.general.dict_kv,no_such.collection.at_all",
        },
    )  # fmt: skip
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["warnings"] == [
        "worker_prefork: could not load filter no_such.collection.at_all; each worker loads it itself"
    ]
    assert {"core.py", "local_accounts.py", "dict_kv.py"} <= set(found["filters"])


def test_no_role_or_playbook_brings_its_own_connection_shell_or_become_plugin() -> None:
    # worker_prefork loads the ssh, local, sh and sudo plugins by their short names before the first task; a
    # same-named plugin in a directory an include_role adds later would then resolve to the builtin already
    # imported (sys.modules), not to its own file. None exists: one that appears must make the callback
    # load those by their resolved paths first.
    found = [
        str(path.relative_to(ROOT))
        for kind in ("connection_plugins", "shell_plugins", "become_plugins")
        for top in ("roles", "playbooks")
        for path in (ROOT / top).rglob(kind)
    ]
    found += [key for key in ("connection_plugins", "become_plugins") if key in _config()["defaults"]]
    assert found == []


def test_a_filter_it_cannot_load_is_named_not_raised() -> None:
    assert _load_probe("community.general.no_such_filter", "no_such.collection.at_all")["missing"] == [
        "filter community.general.no_such_filter",
        "filter no_such.collection.at_all",
    ]


def _config() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "ansible.cfg")
    return config


def test_the_project_enables_it() -> None:
    defaults = _config()["defaults"]
    assert (ROOT / defaults["callback_plugins"] / "worker_prefork.py").resolve() == PLUGIN
    assert "worker_prefork" in [name.strip() for name in defaults["callbacks_enabled"].split(",")]


# a collection filter applied in a role's or playbook's Jinja: `| ns.coll.name` or map('ns.coll.name', ...)
_NAME = r"[a-z_][a-z0-9_]*"
_COLLECTION_FILTER = re.compile(rf"(?:\||\bmap\(|\bselect\()\s*['\"]?({_NAME}\.{_NAME}\.{_NAME})")


@pytest.mark.parametrize("kind", ["roles", "playbooks"])
def test_every_collection_filter_the_project_uses_is_listed(kind: str) -> None:
    listed = {name.strip() for name in _config()["callback_worker_prefork"]["filters"].split(",")}
    used = {
        name
        for path in (ROOT / kind).rglob("*")
        if path.suffix in (".yml", ".j2") and path.is_file()
        for name in _COLLECTION_FILTER.findall(path.read_text())
        if not name.startswith("ansible.builtin.") and not name.startswith("item.")
    }
    assert used <= listed, f"add to ansible.cfg's [callback_worker_prefork] filters: {sorted(used - listed)}"
    if kind == "roles":
        assert "community.general.dict_kv" in used, "the scan no longer finds the filter it was written for"
