"""roles/nvidia_driver's package set and pin (issue 16, item 2), against the real shape of the driver.

The real nvidia-driver-535 (and nvidia-headless-no-dkms-535) depend on their parts at exactly their own
version, and apt considers only the candidate (newest allowed) version of an unpinned dependency: with a
newer 535 build in the repository, pinning the seven packages the role named before fails ("Depends:
libnvidia-gl-535 (= 535.183.06-0ubuntu1) but 535.216.03-0ubuntu1 is to be installed"). The role now installs
the headless set and pins every package of the branch by pattern. Proven here with this machine's real
apt-get in simulation against the lab mirror's stand-ins (tests/lab/mirror: real names, real Depends, two
535 builds), with the role's own rendered preferences template; on a lab node by
tests/lab/test_driver_pin_on_lab.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from apt_sim import MIRROR, AptSim, build_mirror_module, build_repo, missing_tools
from role_render import RoleVars

SPEC = yaml.safe_load((MIRROR / "packages.yml").read_text())
LAB_GPU_VARS = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "inventories/lab/group_vars/gpu_nodes.yml").read_text()
)
ROLE_TASKS = Path(__file__).resolve().parents[2] / "roles/nvidia_driver/tasks"
PINNED = "535.183.06"
NEWER = "535.216.03"
KERNEL = "5.15.0-105-generic"

# What roles/nvidia_driver pinned (and installed) before this change: seven names of the branch.
SEVEN = [
    "cuda-drivers-535",
    "nvidia-driver-535",
    "nvidia-utils-535",
    "libnvidia-compute-535",
    "nvidia-compute-utils-535",
    "nvidia-dkms-535",
    "nvidia-kernel-common-535",
]


def role(**overrides: object) -> RoleVars:
    facts = {"__nvidia_driver_secure_boot": False, "ansible_facts": {"kernel": KERNEL}}
    return RoleVars("nvidia_driver", **(facts | overrides))


# --- the package lists (no apt needed) ---------------------------------------------------------


def test_cuda_repo_installs_the_headless_set_at_the_pinned_version() -> None:
    assert role()["__nvidia_driver_package_specs"] == [
        f"nvidia-headless-535={PINNED}-*",
        f"nvidia-utils-535={PINNED}-*",
    ]


def test_ubuntu_installs_the_server_headless_set() -> None:
    assert role(nvidia_driver_source="ubuntu")["__nvidia_driver_package_specs"] == [
        f"nvidia-headless-535-server={PINNED}-*",
        f"nvidia-utils-535-server={PINNED}-*",
    ]


def test_signed_modules_replace_dkms_with_the_running_kernels_modules() -> None:
    specs = role(nvidia_driver_source="ubuntu", nvidia_driver_kernel_modules="signed")[
        "__nvidia_driver_package_specs"
    ]
    assert specs == [
        f"nvidia-headless-no-dkms-535-server={PINNED}-*",
        f"nvidia-utils-535-server={PINNED}-*",
        f"linux-modules-nvidia-535-server-{KERNEL}",
    ]


@pytest.mark.parametrize("source", ["cuda_repo", "ubuntu"])
def test_no_display_package_is_asked_for(source: str) -> None:
    names = role(nvidia_driver_source=source)["__nvidia_driver_packages"]
    assert not [n for n in names if re.match(r"(nvidia-driver|cuda-drivers|xserver-xorg-video-nvidia)-", n)]
    # and what an earlier install left is removed
    removed = role(nvidia_driver_source=source)["__nvidia_driver_display_packages"]
    assert {"cuda-drivers-535", "nvidia-driver-535", "xserver-xorg-video-nvidia-535"} <= set(removed)


BRANCH_NAMES = [
    "nvidia-headless-535", "nvidia-headless-no-dkms-535", "nvidia-utils-535", "nvidia-dkms-535",
    "nvidia-kernel-common-535", "nvidia-kernel-source-535", "nvidia-compute-utils-535",
    "libnvidia-compute-535", "libnvidia-cfg1-535", "libnvidia-gl-535", "libnvidia-common-535",
    "libnvidia-decode-535", "libnvidia-nscq-535", "xserver-xorg-video-nvidia-535", "nvidia-driver-535",
    "cuda-drivers-535", "nvidia-fabricmanager-535", "nvidia-firmware-535-535.183.06",
    "nvidia-headless-535-server", "libnvidia-compute-535-server", "nvidia-firmware-535-server-535.183.06",
    "nvidia-driver-535-server",
]  # fmt: skip
NOT_BRANCH = [
    "nvidia-driver-550", "libnvidia-compute-550", "cuda-drivers", "cuda-drivers-550", "cuda",
    "nvidia-utils-535-open", f"linux-modules-nvidia-535-server-{KERNEL}", "nvidia-container-toolkit",
    "libnvidia-container1", "libnvidia-container-tools", "cuda-toolkit-12-1", "nvidia-firmware-550-550.90.07",
]  # fmt: skip


def test_the_branch_pattern_covers_every_package_of_the_branch_and_nothing_else() -> None:
    pattern = re.compile(role()["__nvidia_driver_branch_package_regex"])
    assert [n for n in BRANCH_NAMES if not pattern.match(n)] == []
    assert [n for n in NOT_BRANCH if pattern.match(n)] == []


def test_the_rendered_pin_is_one_pattern_stanza_at_the_version_and_the_metapackage_trap() -> None:
    stanzas = [s for s in role().render_template("nvidia-driver.pref.j2").split("\n\n") if "Package:" in s]
    fields = [dict(re.findall(r"^(Package|Pin|Pin-Priority): (.*)$", s, re.MULTILINE)) for s in stanzas]
    branch = f"/{role()['__nvidia_driver_branch_package_regex']}/"
    assert fields == [
        {"Package": branch, "Pin": f"version {PINNED}-*", "Pin-Priority": "1001"},
        {
            "Package": "cuda cuda-drivers /^cuda(-runtime)?-[0-9]+-[0-9]+$/",
            "Pin": "version *",
            "Pin-Priority": "-1",
        },
    ]


# --- this machine's apt, in simulation, against the mirror's driver repositories ---------------------


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if missing_tools():
        pytest.skip(f"needs {', '.join(missing_tools())} (Debian's apt and apt-utils: make deps)")
    build_mirror = build_mirror_module()
    root = tmp_path_factory.mktemp("driver-repos")
    packages = build_mirror.driver_repository_packages(SPEC)
    return {
        repo: build_repo(root / repo, [p for p in packages if p.repo == repo])
        for repo in ("cuda", "ubuntu-restricted")
    }


def test_the_mirror_holds_two_builds_of_the_branch_the_older_one_pinned_by_the_inventories() -> None:
    builds = [b["upstream"] for b in SPEC["driver_branches"] if b["branch"] == "535"]
    assert PINNED in builds and NEWER in builds
    assert LAB_GPU_VARS.get("nvidia_driver_version", role()["nvidia_driver_version"]) == PINNED


def test_pinning_the_seven_packages_fails_with_the_exact_version_depends(
    repos: dict[str, Path], tmp_path: Path
) -> None:
    apt = AptSim(tmp_path, repos["cuda"])
    old_pin = (
        f"Package: {' '.join(SEVEN)} nvidia-fabricmanager-535\nPin: version {PINNED}-*\nPin-Priority: 1001\n"
    )
    result = apt.install([f"{name}={PINNED}-*" for name in SEVEN], preferences=old_pin)
    assert not result.ok, result.output
    flat = " ".join(result.output.split())
    assert re.search(
        rf"nvidia-driver-535 : Depends: (lib)?nvidia-[a-z0-9-]+-535 \(= {re.escape(PINNED)}-0ubuntu1\)"
        rf" but {re.escape(NEWER)}-0ubuntu1 is to be installed",
        flat,
    ), result.output


# the second branch (R580, the upgrade path after R535's end of life), in the mirror beside 535
R580 = "580.95.05"
OTHER_BRANCH = {"535": "580", "580": "535"}


@pytest.mark.parametrize(("branch", "version"), [("535", PINNED), ("580", R580)])
@pytest.mark.parametrize(("source", "repo"), [("cuda_repo", "cuda"), ("ubuntu", "ubuntu-restricted")])
def test_the_roles_pin_resolves_one_consistent_headless_set(
    repos: dict[str, Path], tmp_path: Path, source: str, repo: str, branch: str, version: str
) -> None:
    driver = role(nvidia_driver_source=source, nvidia_driver_branch=branch, nvidia_driver_version=version)
    apt = AptSim(tmp_path, repos[repo])
    result = apt.install(
        driver["__nvidia_driver_package_specs"], preferences=driver.render_template("nvidia-driver.pref.j2")
    )
    assert result.ok, result.output
    suffix = "-server" if source == "ubuntu" else ""
    # the whole headless set, dependencies included, every one at the pinned build
    parts = [
        "nvidia-headless", "nvidia-headless-no-dkms", "nvidia-utils", "nvidia-dkms", "nvidia-kernel-common",
        "nvidia-kernel-source", "libnvidia-compute", "nvidia-compute-utils", "libnvidia-cfg1",
    ]  # fmt: skip
    expected = {f"{part}-{branch}{suffix}" for part in parts}
    expected.add(f"nvidia-firmware-{branch}{suffix}-{version}")
    assert expected <= set(result.installed), result.output
    assert {name: v for name, v in result.installed.items() if not v.startswith(f"{version}-")} == {}
    # a headless node: no Xorg driver, no GL, no display metapackage; nothing of the other branch
    assert not [
        n for n in result.installed if re.match(r"(xserver-xorg|libnvidia-gl|nvidia-driver|cuda-drivers)", n)
    ]
    assert not [n for n in result.installed if f"-{OTHER_BRANCH[branch]}" in n]


def test_without_the_pin_apt_takes_the_newer_build(repos: dict[str, Path], tmp_path: Path) -> None:
    """The control: the mirror really offers the newer build, so the pin is what keeps the version."""
    driver = role()
    apt = AptSim(tmp_path, repos["cuda"])
    result = apt.install([name for name in driver["__nvidia_driver_packages"]])
    assert result.ok, result.output
    assert result.installed["nvidia-dkms-535"].startswith(f"{NEWER}-")


def test_the_roles_pin_keeps_the_trap_metapackages_out(repos: dict[str, Path], tmp_path: Path) -> None:
    driver = role()
    apt = AptSim(tmp_path, repos["cuda"])
    result = apt.install(["cuda-drivers"], preferences=driver.render_template("nvidia-driver.pref.j2"))
    assert not result.ok
    assert "cuda-drivers" not in result.installed


# --- the second branch (R580), beside 535 ------------------------------------------------------------------


def test_the_mirror_carries_580_in_the_shape_of_535(repos: dict[str, Path]) -> None:
    """Both branches the role installs: the same packages with the branch swapped, the same Depends (each
    metapackage on its parts at exactly its own version), in NVIDIA's repository and as Ubuntu's -server."""
    packages = build_mirror_module().driver_repository_packages(SPEC)

    def shape(branch: str, upstream: str, repo: str) -> dict[str, list[str]]:
        def generic(text: str) -> str:
            return text.replace(upstream, "V").replace(branch, "NNN")

        return {
            generic(p.name): [generic(d) for d in p.depends]
            for p in packages
            # not the cuda-drivers metapackage: it follows the newest branch, whichever that is
            if p.repo == repo and p.version.startswith(f"{upstream}-") and p.name != "cuda-drivers"
        }

    for repo in ("cuda", "ubuntu-restricted"):
        assert shape("580", R580, repo) == shape("535", PINNED, repo), repo
    headless = next(p for p in packages if p.name == "nvidia-headless-no-dkms-580" and p.repo == "cuda")
    assert f"libnvidia-compute-580 (= {R580}-0ubuntu1)" in headless.depends


def test_a_branch_change_removes_what_is_left_of_the_old_branch_and_nothing_else() -> None:
    """535 -> 580: every package of 535 (its parts, fabric manager, the firmware, the signed modules, the
    display packages) is removed with its holds before 580's are installed (install-driver-packages.yml);
    580's own and other NVIDIA packages stay."""
    installed = [
        "nvidia-headless-535", "libnvidia-cfg1-535", "nvidia-firmware-535-535.183.06",
        "nvidia-fabricmanager-535", f"linux-modules-nvidia-535-server-{KERNEL}", "nvidia-driver-535-server",
        "nvidia-headless-580", "libnvidia-cfg1-580", "nvidia-firmware-580-580.95.05",
        "nvidia-fabricmanager-580", f"linux-modules-nvidia-580-server-{KERNEL}", "nvidia-container-toolkit",
        "libnvidia-container1", "cuda-toolkit-12-1", "nvidia-utils-535-open",
    ]  # fmt: skip
    facts = {"kernel": KERNEL, "packages": {name: [{"version": "1"}] for name in installed}}
    driver = role(nvidia_driver_branch="580", nvidia_driver_version=R580, ansible_facts=facts)
    assert driver["__nvidia_driver_other_branch_packages"] == [
        "libnvidia-cfg1-535",
        f"linux-modules-nvidia-535-server-{KERNEL}",
        "nvidia-driver-535-server",
        "nvidia-fabricmanager-535",
        "nvidia-firmware-535-535.183.06",
        "nvidia-headless-535",
    ]
    # on the branch it runs, nothing is another branch's
    same = {"kernel": KERNEL, "packages": {n: [{"version": "1"}] for n in installed if "580" not in n}}
    assert role(ansible_facts=same)["__nvidia_driver_other_branch_packages"] == []


def test_check_mode_reports_a_branch_change_instead_of_simulating_its_install() -> None:
    """gpu.yml --check with a new branch on a node of the old one: the removal of the old branch is only
    simulated, so apt's simulated install would still find the old packages held and refuse the new set
    (test below); the role reports the install instead (install-driver-packages.yml). A real run, and
    --check on a node of the branch it runs, still let apt install or simulate it."""
    installed = ["nvidia-headless-535", "libnvidia-compute-535", "nvidia-utils-535"]
    facts = {"kernel": KERNEL, "packages": {name: [{"version": "1"}] for name in installed}}
    to_580 = {"nvidia_driver_branch": "580", "nvidia_driver_version": R580, "ansible_facts": facts}
    assert role(ansible_check_mode=True, **to_580)["__nvidia_driver_install_pending"] is True
    assert role(ansible_check_mode=False, **to_580)["__nvidia_driver_install_pending"] is False
    assert role(ansible_check_mode=True, ansible_facts=facts)["__nvidia_driver_install_pending"] is False
    # a node on 580 already, with a leftover of 535: the real run only removes it, apt can simulate the rest
    on_580 = ["nvidia-headless-580", "nvidia-utils-580", f"linux-modules-nvidia-535-server-{KERNEL}"]
    leftover = {"kernel": KERNEL, "packages": {name: [{"version": "1"}] for name in on_580}}
    assert (
        role(ansible_check_mode=True, **{**to_580, "ansible_facts": leftover})[
            "__nvidia_driver_install_pending"
        ]
        is False
    )
    tasks = yaml.safe_load((ROLE_TASKS / "install-driver-packages.yml").read_text())
    by_name = {task["name"]: task for task in tasks}
    assert by_name["Install the packages of driver {{ nvidia_driver_version }}"]["when"] == (
        "not __nvidia_driver_packages_in_place and not __nvidia_driver_install_pending"
    )
    assert by_name["Report that check mode would install driver {{ nvidia_driver_version }}"]["when"] == (
        "__nvidia_driver_install_pending"
    )


# the options of the role's apt tasks (ansible.builtin.apt with allow_downgrade, allow_change_held_packages
# and install_recommends false; purge for the removal), as the apt module passes them to apt-get
APT_MODULE_OPTIONS = (
    "-y", "--allow-downgrades", "--allow-change-held-packages", "-o", "APT::Install-Recommends=no",
)  # fmt: skip


@pytest.mark.parametrize(("was", "to"), [(("535", PINNED), ("580", R580)), (("580", R580), ("535", PINNED))])
def test_a_branch_change_removes_the_held_old_branch_then_installs_the_new_one(
    repos: dict[str, Path], tmp_path: Path, was: tuple[str, str], to: tuple[str, str]
) -> None:
    """A node the role converged on one branch (its headless set installed and held), moved to the other
    with the role's pin (playbooks/upgrade-driver.yml, and its way back). An install of the new set alone is
    refused, --allow-change-held-packages or not: apt's resolver removes no held package by itself, nor one a
    newer build of its branch could upgrade (535.216.03 beside the pinned 535.183.06). So
    install-driver-packages.yml removes every installed package of the old branch first, held as they are
    (the list the role renders from the node's packages), and then the new set installs whole."""
    old = role(nvidia_driver_branch=was[0], nvidia_driver_version=was[1])
    apt = AptSim(tmp_path, repos["cuda"])
    first = apt.install(
        old["__nvidia_driver_package_specs"], preferences=old.render_template("nvidia-driver.pref.j2")
    )
    assert first.ok, first.output
    stand_ins = {(p.name, p.version): p for p in build_mirror_module().driver_repository_packages(SPEC)}
    apt.installed_as([stand_ins[item] for item in first.installed.items()], held=first.installed)

    facts = {"kernel": KERNEL, "packages": {name: [{"version": v}] for name, v in first.installed.items()}}
    new = role(nvidia_driver_branch=to[0], nvidia_driver_version=to[1], ansible_facts=facts)
    specs, pin = new["__nvidia_driver_package_specs"], new.render_template("nvidia-driver.pref.j2")
    refused = apt.install(specs, preferences=pin, options=APT_MODULE_OPTIONS)
    assert not refused.ok and "held packages" in refused.output, refused.output

    removal = new["__nvidia_driver_other_branch_packages"]
    assert removal == sorted(first.installed)  # every package of the old branch, nothing else
    removed = apt.remove(removal, options=(*APT_MODULE_OPTIONS, "--purge"))
    assert removed.ok and removed.removed == removal, removed.output
    apt.installed_as([])  # what the removal leaves of the driver: nothing
    moved = apt.install(specs, preferences=pin, options=APT_MODULE_OPTIONS)
    assert moved.ok, moved.output
    assert {f"nvidia-headless-{to[0]}", f"nvidia-utils-{to[0]}", f"libnvidia-compute-{to[0]}"} <= set(
        moved.installed
    )
    assert {name: v for name, v in moved.installed.items() if not v.startswith(f"{to[1]}-")} == {}
    # and the role does it in that order
    tasks = yaml.safe_load((ROLE_TASKS / "install-driver-packages.yml").read_text())
    names = [task["name"] for task in tasks]
    removal_task = names.index("Remove the packages of another driver branch")
    assert tasks[removal_task]["ansible.builtin.apt"]["name"] == "{{ __nvidia_driver_other_branch_packages }}"
    assert removal_task < names.index("Install the packages of driver {{ nvidia_driver_version }}")


def test_the_role_installs_only_the_branches_of_its_table() -> None:
    branches = role()["__nvidia_driver_branches"]
    assert sorted(branches) == ["535", "580"]
    assert branches["535"]["end_of_life"] == "2026-06" and branches["580"]["end_of_life"] == ""
    # the serving stage knows the CUDA each of them runs (the image check of upgrade-driver.yml reads it)
    serving = RoleVars("vllm_serving")["vllm_serving_driver_max_cuda"]
    assert {"535": "12.2", "580": "13.0"}.items() <= serving.items()


def test_package_wants_name_every_package_task_of_the_role() -> None:
    """__nvidia_driver_package_wants, what packages_in_place reads before the role's package tasks (skipped
    when all are met): the prerequisites and the kernel's headers installed, nouveau's Xorg driver purged, the
    metapackages and display packages absent, the driver's packages at the pinned version and held, every
    installed package of the branch too, and no package of another branch: the same branch pattern as the
    removal task, another branch's packages matched and this branch's not."""
    facts = {"kernel": KERNEL, "packages": {}}
    wants = {w["name"]: w for w in role(ansible_facts=facts)["__nvidia_driver_package_wants"]}
    assert wants[f"linux-headers-{KERNEL}"] == {"name": f"linux-headers-{KERNEL}"}
    assert wants["xserver-xorg-video-nouveau"]["state"] == "purged"
    metapackages = ("cuda", "cuda-drivers", "cuda-drivers-535", "nvidia-driver-535",
                    "xserver-xorg-video-nvidia-535")  # fmt: skip
    for name in metapackages:
        assert wants[name]["state"] == "absent", name
    for name in role(ansible_facts=facts)["__nvidia_driver_branch_packages"]:
        assert wants[name] == {"name": name, "version": f"{PINNED}-*", "held": True}, name
    regexes = {name: w for name, w in wants.items() if w.get("regex")}
    (branch,) = [w for w in regexes.values() if w.get("held")]
    assert branch == {"name": branch["name"], "regex": True, "version": f"{PINNED}-*", "held": True}
    other = [re.compile(name) for name, w in regexes.items() if w.get("state") == "absent"]
    assert len(other) == 2

    def another_branch(package: str) -> bool:
        return any(pattern.fullmatch(package) for pattern in other)

    others = ("nvidia-headless-580", "libnvidia-compute-550-server", "nvidia-firmware-580-580.95.05",
              "cuda-drivers-580", f"linux-modules-nvidia-580-server-{KERNEL}")  # fmt: skip
    for package in others:
        assert another_branch(package), package
        assert not re.fullmatch(branch["name"], package), package
    ours = ("nvidia-headless-535", "libnvidia-compute-535-server", "nvidia-firmware-535-535.183.06",
            "cuda-drivers-535", f"linux-modules-nvidia-535-server-{KERNEL}",
            "nvidia-container-toolkit")  # fmt: skip
    for package in ours:
        assert not another_branch(package), package
