"""module_utils.venv_respawn: "import X, else re-run under VENV/bin/python3", for any venv and module."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils import venv_respawn
from ansible.module_utils.common import respawn

MISSING = "llm_platform_no_such_module"


class Respawned(Exception):
    pass


class Failed(Exception):
    pass


class FakeModule:
    def fail_json(self, msg: str, **kwargs: Any) -> None:
        raise Failed(msg, kwargs)


@pytest.fixture
def respawn_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    calls: dict[str, Any] = {"runnable": None, "respawn": None, "interpreter": None}

    def runnable(interpreter: str) -> bool:
        calls["runnable"] = interpreter
        return interpreter == calls["interpreter"]

    def respawn_module(interpreter: str) -> None:
        calls["respawn"] = interpreter
        raise Respawned(interpreter)

    monkeypatch.setattr(respawn, "has_respawned", lambda: False)
    monkeypatch.setattr(venv_respawn, "runnable", runnable)
    monkeypatch.setattr(respawn, "respawn_module", respawn_module)
    return calls


def test_importable_module_is_returned_without_respawn(respawn_calls: dict[str, Any]) -> None:
    assert venv_respawn.import_or_respawn(FakeModule(), "json", "/opt/tools", "never") is sys.modules["json"]
    assert respawn_calls["runnable"] is None


def test_respawns_under_the_named_venv(respawn_calls: dict[str, Any]) -> None:
    respawn_calls["interpreter"] = "/opt/model-tools/bin/python3"
    with pytest.raises(Respawned):
        venv_respawn.import_or_respawn(FakeModule(), MISSING, "/opt/model-tools", "never")
    assert respawn_calls["runnable"] == "/opt/model-tools/bin/python3"
    assert respawn_calls["respawn"] == "/opt/model-tools/bin/python3"


def test_fails_with_the_callers_message_when_the_venv_lacks_it(respawn_calls: dict[str, Any]) -> None:
    with pytest.raises(Failed) as info:
        venv_respawn.import_or_respawn(FakeModule(), MISSING, "/opt/model-tools", "install the tools")
    assert info.value.args[0] == "install the tools"
    assert "ModuleNotFoundError" in info.value.args[1]["exception"]
    assert respawn_calls["respawn"] is None


def test_never_respawns_twice(respawn_calls: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(respawn, "has_respawned", lambda: True)
    respawn_calls["interpreter"] = "/opt/model-tools/bin/python3"
    with pytest.raises(Failed):
        venv_respawn.import_or_respawn(FakeModule(), MISSING, "/opt/model-tools", "x")
    assert respawn_calls["runnable"] is None


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    python = tmp_path / "venv" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return tmp_path / "venv"


def test_script_reexecs_under_the_venv(venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str]]] = []

    def execv(path: str, args: list[str]) -> None:
        calls.append((path, args))
        raise Respawned(path)

    monkeypatch.setattr(venv_respawn.os, "execv", execv)
    with pytest.raises(Respawned):
        venv_respawn.import_or_reexec(MISSING, str(venv), ["/usr/local/sbin/tool", "/etc/tool.json"])
    python = str(venv / "bin" / "python3")
    assert calls == [(python, [python, "/usr/local/sbin/tool", "/etc/tool.json"])]


def test_script_gets_none_without_the_venv_or_inside_it(venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(venv_respawn.os, "execv", lambda *_: pytest.fail("must not exec"))
    assert venv_respawn.import_or_reexec(MISSING, str(venv.parent / "absent"), ["x"]) is None
    monkeypatch.setattr(venv_respawn.sys, "prefix", str(venv))
    assert venv_respawn.import_or_reexec(MISSING, str(venv), ["x"]) is None
    assert venv_respawn.import_or_reexec("json", str(venv), ["x"]) is sys.modules["json"]


def test_several_modules_respawn_for_the_first_missing(respawn_calls: dict[str, Any]) -> None:
    respawn_calls["interpreter"] = "/opt/model-tools/bin/python3"
    with pytest.raises(Respawned):
        venv_respawn.import_all_or_respawn(FakeModule(), ["json", MISSING, "csv"], "/opt/model-tools", "x")
    assert respawn_calls["runnable"] == "/opt/model-tools/bin/python3"
    found = venv_respawn.import_all_or_respawn(FakeModule(), ["json", "csv"], "/opt/model-tools", "x")
    assert found == {"json": sys.modules["json"], "csv": sys.modules["csv"]}


def test_message_names_the_missing_module_and_the_interpreter(respawn_calls: dict[str, Any]) -> None:
    with pytest.raises(Failed) as info:
        venv_respawn.import_all_or_respawn(
            FakeModule(), ["json", MISSING], "/opt/t", "{name} not in {python}"
        )
    assert info.value.args[0] == f"{MISSING} not in {sys.executable}"
