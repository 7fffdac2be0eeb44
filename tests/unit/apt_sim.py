"""This machine's real apt-get, in simulation (-s), against flat repositories of the lab mirror's stand-ins.

    repo = build_repo(tmp_path / "repo", driver_repository_packages(spec))
    apt = AptSim(tmp_path / "apt", repo)
    result = apt.install(["nvidia-headless-535=535.183.06-*"], preferences=rendered_pin)
    result.ok, result.output, result.installed   # {"nvidia-dkms-535": "535.183.06-0ubuntu1", ...}

Everything apt reads or writes is private (sources, preferences, lists, an empty dpkg status, caches, no
lock), so nothing is installed or changed on this machine and no root is needed. The repositories are
`file:` sources marked [trusted=yes]: no network, no key. Needs apt-get, dpkg-deb and apt-ftparchive
(Debian's apt and apt-utils; `make deps` installs them); the tests skip where they are missing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIRROR = ROOT / "tests" / "lab" / "mirror"
TOOLS = ("apt-get", "dpkg-deb", "apt-ftparchive")
# "Inst nvidia-dkms-535 (535.183.06-0ubuntu1 llm-lab [amd64])"
INST = re.compile(r"^Inst (?P<name>\S+) (?:\[\S+\] )?\((?P<version>\S+)")
# "Remv nvidia-dkms-535 [535.183.06-0ubuntu1]", "Purg ..." with --purge
REMV = re.compile(r"^(?:Remv|Purg) (?P<name>\S+)")


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def build_mirror_module():  # type: ignore[no-untyped-def]
    """tests/lab/mirror/build_mirror.py, imported (it is a script beside its helpers, not a package)."""
    if str(MIRROR) not in sys.path:
        sys.path.insert(0, str(MIRROR))
    import build_mirror

    return build_mirror


def build_repo(repo_dir: Path, packages: list) -> Path:  # type: ignore[type-arg]
    build_mirror_module().build_flat_repo(packages, repo_dir)
    return repo_dir


@dataclass
class Result:
    returncode: int
    output: str
    installed: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class AptSim:
    def __init__(self, root: Path, *repos: Path, installed: dict[str, str] | None = None) -> None:
        """installed: packages the simulated node has already (name -> version), e.g. the distribution's
        python3 a stand-in depends on; written as installed in the private dpkg status."""
        self.root = root
        for sub in (
            "etc/preferences.d",
            "etc/sources.list.d",
            "state/lists/partial",
            "cache/archives/partial",
        ):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "state" / "status").write_text(
            "".join(
                f"Package: {name}\nStatus: install ok installed\nVersion: {version}\nArchitecture: amd64\n"
                "Maintainer: none\nDescription: installed before the test\n\n"
                for name, version in (installed or {}).items()
            )
        )
        (root / "etc" / "sources.list").write_text(
            "".join(f"deb [trusted=yes] file:{repo} ./\n" for repo in repos)
        )
        self.options = [
            "-o", f"Dir::Etc::sourcelist={root / 'etc' / 'sources.list'}",
            "-o", f"Dir::Etc::sourceparts={root / 'etc' / 'sources.list.d'}",
            "-o", f"Dir::Etc::preferences={root / 'etc' / 'preferences'}",
            "-o", f"Dir::Etc::preferencesparts={root / 'etc' / 'preferences.d'}",
            "-o", f"Dir::State={root / 'state'}",
            "-o", f"Dir::State::status={root / 'state' / 'status'}",
            "-o", f"Dir::Cache={root / 'cache'}",
            "-o", "Debug::NoLocking=1",
            "-o", "APT::Architecture=amd64",
            "-o", "APT::Install-Recommends=false",
        ]  # fmt: skip
        update = self._run("update")
        assert update.returncode == 0, update.stdout + update.stderr

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["apt-get", *self.options, *args], capture_output=True, text=True, check=False, timeout=120
        )

    def installed_as(self, packages: list, held: Iterable[str] = ()) -> None:  # type: ignore[type-arg]
        """The simulated node's dpkg status from now on: these stand-ins (build_mirror.Package) installed,
        with the Depends, Provides, Conflicts and Replaces their .debs carry, those named in `held` on hold
        (what `apt-mark hold` and the role's dpkg_selections write)."""
        control_file = build_mirror_module().control_file
        held = set(held)
        (self.root / "state" / "status").write_text(
            "".join(
                control_file(pkg) + f"Status: {'hold' if pkg.name in held else 'install'} ok installed\n\n"
                for pkg in packages
            )
        )

    def install(self, specs: list[str], preferences: str = "", options: Iterable[str] = ()) -> Result:
        """`apt-get -s [options] install specs` with `preferences` as the only file in preferences.d."""
        (self.root / "etc" / "preferences.d" / "test.pref").write_text(preferences)
        proc = self._run("-s", "-q", *options, "install", *specs)
        output = proc.stdout + proc.stderr
        installed = {m["name"]: m["version"] for m in map(INST.match, proc.stdout.splitlines()) if m}
        return Result(proc.returncode, output, installed, self._removed(proc.stdout))

    def remove(self, names: list[str], options: Iterable[str] = ()) -> Result:
        """`apt-get -s [options] remove names`."""
        proc = self._run("-s", "-q", *options, "remove", *names)
        return Result(proc.returncode, proc.stdout + proc.stderr, {}, self._removed(proc.stdout))

    @staticmethod
    def _removed(stdout: str) -> list[str]:
        return sorted(m["name"] for m in map(REMV.match, stdout.splitlines()) if m)
