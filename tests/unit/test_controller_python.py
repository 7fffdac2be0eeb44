"""The controller's Python: ansible-core 2.19 needs at least 3.11 there, and an Ubuntu 22.04 jump host's
python3 is 3.10. `make venv` says so, and how to pick another interpreter, instead of failing in pip."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON_3_10 = Path("/root/.pyenv/versions/3.10.13/bin/python3.10")


@pytest.mark.skipif(not PYTHON_3_10.exists(), reason="no Python 3.10 on this machine")
def test_make_venv_refuses_python_3_10_saying_what_to_do(tmp_path: Path) -> None:
    result = subprocess.run(
        ["make", "-s", "venv", f"PYTHON={PYTHON_3_10}", f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "needs Python >= 3.11 on the controller" in result.stderr
    assert "make venv PYTHON=python3.11" in result.stderr
    assert not (tmp_path / "venv").exists()
