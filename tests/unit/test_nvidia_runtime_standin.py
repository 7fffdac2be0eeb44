"""The lab's nvidia-container-runtime stand-in (tests/lab/nvidia/nvidia_container_runtime.py).

It runs on the nodes' python3 (3.10), between containerd-shim-runc-v2 and runc. These tests drive it with a
fake bundle, the fake NVML of conftest's ``make_node`` and a fake runc that records how it was called: the
real program is run as a subprocess for what crosses the exec (argv, bundle, exit status, the runc log), and
its functions in-process where a test needs /dev nodes (DEV_ROOT points at a temporary directory).
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import FAKE_NVML_DIR, FakeNode

STANDIN = Path(__file__).resolve().parents[1] / "lab" / "nvidia" / "nvidia_container_runtime.py"


def load_runtime() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nvidia_container_runtime", STANDIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rt = load_runtime()

RUNC_ARGS = [
    "--root",
    "/run/containerd/runc/k8s.io",
    "--log",
    "LOG",
    "--log-format",
    "json",
    "--systemd-cgroup",
    "create",
    "--bundle",
    "BUNDLE",
    "--pid-file",
    "BUNDLE/init.pid",
    "c0ffee",
]


class Bundle:
    def __init__(self, directory: Path, env: list[str], annotations: dict[str, str] | None = None) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / "config.json"
        spec: dict[str, Any] = {
            "ociVersion": "1.2.0",
            "process": {"args": ["/pause"], "env": ["PATH=/usr/bin:/bin", *env], "cwd": "/"},
            "root": {"path": "rootfs"},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        }
        if annotations:
            spec["annotations"] = annotations
        self.config.write_text(json.dumps(spec, indent=2))
        self.config.chmod(0o600)
        self.original = self.config.read_bytes()

    def spec(self) -> dict[str, Any]:
        return json.loads(self.config.read_text())

    def added_mounts(self) -> list[dict[str, Any]]:
        return [m for m in self.spec()["mounts"] if m["destination"] != "/proc"]

    def destinations(self) -> list[str]:
        return [m["destination"] for m in self.added_mounts()]


@pytest.fixture
def node(make_node: Callable[..., FakeNode]) -> FakeNode:
    return make_node("a100-pcie-40gb-x4")


@pytest.fixture
def dev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A /dev of the node: the control devices and the GPU nodes the fake makes for held processes."""
    root = tmp_path / "dev"
    root.mkdir()
    monkeypatch.setattr(rt, "DEV_ROOT", str(root))
    return root


@pytest.fixture
def fake_runc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], dict[str, Any] | None]:
    """A runc that records its argv, its cwd and the bundle's config.json as it found it."""
    record = tmp_path / "runc-record.json"
    script = tmp_path / "fake-runc"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "args = sys.argv[1:]\n"
        "bundle = args[args.index('--bundle') + 1] if '--bundle' in args else os.getcwd()\n"
        "config = os.path.join(bundle, 'config.json')\n"
        "spec = json.load(open(config)) if os.path.exists(config) else None\n"
        f"json.dump({{'argv': sys.argv, 'spec': spec}}, open({str(record)!r}, 'w'))\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("NVIDIA_CONTAINER_RUNTIME_RUNC", str(script))

    def recorded() -> dict[str, Any] | None:
        return json.loads(record.read_text()) if record.exists() else None

    return recorded


def run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The stand-in as containerd-shim-runc-v2 runs it (the node's python3 here is this interpreter)."""
    env = {**os.environ, "PYTHONPATH": str(FAKE_NVML_DIR)}
    return subprocess.run(
        [sys.executable, str(STANDIN), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )


def create_args(bundle: Path, log: Path) -> list[str]:
    return [str(log) if a == "LOG" else a.replace("BUNDLE", str(bundle)) for a in RUNC_ARGS]


# --- what is passed through --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--root", "/run/containerd/runc/k8s.io", "state", "c0ffee"],
        ["start", "c0ffee"],
        ["--root", "/r", "kill", "c0ffee", "9"],
        ["delete", "--force", "c0ffee"],
        ["--version"],
        # "create" as the value of --bundle is not the create command (the real runtime checks this too)
        ["run", "--bundle", "create", "c0ffee"],
    ],
)
def test_other_commands_exec_runc_with_the_same_argv(
    args: list[str], fake_runc: Callable[[], dict[str, Any] | None], node: FakeNode
) -> None:
    result = run(args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    recorded = fake_runc()
    assert recorded is not None
    assert recorded["argv"][1:] == args


def test_create_without_gpus_leaves_the_spec_alone(
    tmp_path: Path, fake_runc: Callable[[], dict[str, Any] | None], node: FakeNode
) -> None:
    bundle = Bundle(tmp_path / "bundle", env=[])
    result = run(create_args(bundle.dir, tmp_path / "log.json"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert bundle.config.read_bytes() == bundle.original
    recorded = fake_runc()
    assert recorded is not None
    assert recorded["argv"][1:] == create_args(bundle.dir, tmp_path / "log.json")


@pytest.mark.parametrize("value", ["", "void", "0,void", " , "])
def test_void_or_empty_visible_devices_is_no_gpu(
    value: str, tmp_path: Path, fake_runc: Callable[[], dict[str, Any] | None], node: FakeNode
) -> None:
    bundle = Bundle(tmp_path / "bundle", env=[f"NVIDIA_VISIBLE_DEVICES={value}"])
    result = run(create_args(bundle.dir, tmp_path / "log.json"))
    assert result.returncode == 0, result.stderr
    assert bundle.config.read_bytes() == bundle.original


def test_create_with_gpus_rewrites_the_spec_before_runc_reads_it(
    tmp_path: Path, fake_runc: Callable[[], dict[str, Any] | None], node: FakeNode
) -> None:
    bundle = Bundle(tmp_path / "bundle", env=["NVIDIA_VISIBLE_DEVICES=all"])
    result = run(create_args(bundle.dir, tmp_path / "log.json"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    recorded = fake_runc()
    assert recorded is not None
    mounts = {m["destination"]: m for m in recorded["spec"]["mounts"]}
    state = mounts["/var/lib/fake-nvml"]
    assert state["source"] == str(node.state_path.parent)
    assert state["type"] == "bind"
    assert "ro" in state["options"]
    library = mounts["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]
    assert library["source"] == str(node.library_path)
    assert "ro" in library["options"]
    # written back atomically: same mode, no temporary file left beside it
    assert stat.S_IMODE(bundle.config.stat().st_mode) == 0o600
    assert sorted(p.name for p in bundle.dir.iterdir()) == ["config.json"]


@pytest.mark.parametrize(
    "bundle_args",
    [
        lambda d: ["create", "--bundle", str(d), "c0ffee"],
        lambda d: ["create", f"--bundle={d}", "c0ffee"],
        lambda d: ["create", "-b", str(d), "c0ffee"],
        lambda d: ["create", "-bundle", str(d), "c0ffee"],
        lambda d: ["create", "c0ffee"],  # runc's default: the bundle is the working directory
    ],
)
def test_bundle_found_as_runc_finds_it(
    bundle_args: Callable[[Path], list[str]],
    tmp_path: Path,
    fake_runc: Callable[[], dict[str, Any] | None],
    node: FakeNode,
) -> None:
    bundle = Bundle(tmp_path / "bundle", env=["NVIDIA_VISIBLE_DEVICES=0"])
    result = run(bundle_args(bundle.dir), cwd=bundle.dir)
    assert result.returncode == 0, result.stderr
    assert "/var/lib/fake-nvml" in bundle.destinations()


def test_bundle_flag_without_a_value_is_refused(fake_runc: Callable[[], dict[str, Any] | None]) -> None:
    result = run(["create", "c0ffee", "--bundle"])
    assert result.returncode == 1
    assert "bundle option requires an argument" in result.stderr
    assert fake_runc() is None


# --- which GPUs -----------------------------------------------------------------------------------------


def modify(bundle: Bundle) -> None:
    rt.modify_spec(str(bundle.config))


def gpu_nodes(dev: Path, *minors: int) -> None:
    for name in ("nvidiactl", "nvidia-uvm", *(f"nvidia{m}" for m in minors)):
        (dev / name).touch()


def test_all_mounts_every_gpu_node_that_exists(tmp_path: Path, dev: Path, node: FakeNode) -> None:
    gpu_nodes(dev, 0, 2)  # the fake makes /dev/nvidiaN only for GPUs held by a process
    bundle = Bundle(tmp_path / "b", env=["NVIDIA_VISIBLE_DEVICES=all"])
    modify(bundle)
    assert bundle.destinations() == [
        "/var/lib/fake-nvml",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia0",
        "/dev/nvidia2",
    ]
    devices = {m["destination"]: m for m in bundle.added_mounts()}
    assert devices["/dev/nvidia2"]["source"] == str(dev / "nvidia2")
    assert devices["/dev/nvidia2"]["type"] == "bind"
    assert "ro" not in devices["/dev/nvidia2"]["options"]


def selected(tmp_path: Path, dev: Path, value: str) -> list[str]:
    bundle = Bundle(
        tmp_path / value.replace("/", "_").replace(",", "_"), env=[f"NVIDIA_VISIBLE_DEVICES={value}"]
    )
    modify(bundle)
    return [d for d in bundle.destinations() if d.startswith("/dev/nvidia") and d[11:].isdigit()]


def test_devices_by_index_uuid_uuid_prefix_and_pci_bus_id(tmp_path: Path, dev: Path, node: FakeNode) -> None:
    gpu_nodes(dev, 0, 1, 2, 3)
    uuid1, uuid3 = node.gpu(1)["uuid"], node.gpu(3)["uuid"]
    bus2 = f"00000000:{node.gpu(2)['pci']['bus']:02x}:00.0"
    assert selected(tmp_path, dev, "0,2") == ["/dev/nvidia0", "/dev/nvidia2"]
    assert selected(tmp_path, dev, f"{uuid3},{uuid1}") == ["/dev/nvidia1", "/dev/nvidia3"]
    assert selected(tmp_path, dev, uuid1[:12].lower()) == ["/dev/nvidia1"]
    assert selected(tmp_path, dev, bus2.upper()) == ["/dev/nvidia2"]
    assert selected(tmp_path, dev, " 1 , 1") == ["/dev/nvidia1"]
    assert selected(tmp_path, dev, "0,ALL") == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidia2",
        "/dev/nvidia3",
    ]


def test_none_gives_the_driver_and_no_gpu(tmp_path: Path, dev: Path, node: FakeNode) -> None:
    gpu_nodes(dev, 0, 1)
    bundle = Bundle(tmp_path / "b", env=["NVIDIA_VISIBLE_DEVICES=none"])
    modify(bundle)
    assert bundle.destinations() == [
        "/var/lib/fake-nvml",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
    ]


def test_void_wins_over_none_over_all(tmp_path: Path, dev: Path, node: FakeNode) -> None:
    gpu_nodes(dev, 0)
    assert selected(tmp_path, dev, "all,none") == []
    bundle = Bundle(tmp_path / "v", env=["NVIDIA_VISIBLE_DEVICES=all,none,void"])
    modify(bundle)
    assert bundle.config.read_bytes() == bundle.original


def test_index_is_nvml_enumeration_after_a_gpu_left_the_bus(
    tmp_path: Path, dev: Path, node: FakeNode
) -> None:
    gpu_nodes(dev, 0, 1, 2, 3)
    assert node.ctl("gpu", "--gpu", "1", "--remove") == 0
    assert selected(tmp_path, dev, "1") == ["/dev/nvidia2"]  # index 1 is now the GPU of minor number 2
    with pytest.raises(rt.Refused, match=r"^nvidia-container-cli: device error: 3: unknown device$"):
        selected(tmp_path, dev, "3")


def test_unset_in_a_legacy_cuda_image_means_all(tmp_path: Path, dev: Path, node: FakeNode) -> None:
    gpu_nodes(dev, 0, 1, 2, 3)
    legacy = Bundle(tmp_path / "legacy", env=["CUDA_VERSION=12.1.1"])
    modify(legacy)
    assert "/dev/nvidia3" in legacy.destinations()
    current = Bundle(tmp_path / "current", env=["CUDA_VERSION=12.1.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.1"])
    modify(current)
    assert current.config.read_bytes() == current.original


def test_driver_capabilities_decide_on_nvml(tmp_path: Path, dev: Path, node: FakeNode) -> None:
    gpu_nodes(dev, 0)
    compute = Bundle(tmp_path / "c", env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute"])
    modify(compute)
    assert compute.destinations() == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"]
    everything = Bundle(tmp_path / "a", env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"])
    modify(everything)
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in everything.destinations()


def test_a_second_create_adds_nothing(tmp_path: Path, dev: Path, node: FakeNode) -> None:
    gpu_nodes(dev, 0)
    bundle = Bundle(tmp_path / "b", env=["NVIDIA_VISIBLE_DEVICES=0"])
    modify(bundle)
    once = bundle.config.read_bytes()
    modify(bundle)
    assert bundle.config.read_bytes() == once


# --- what is refused, as the real runtime refuses it ------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("4", "nvidia-container-cli: device error: 4: unknown device"),
        ("0,7", "nvidia-container-cli: device error: 7: unknown device"),
        ("GPU-00000000", "nvidia-container-cli: device error: GPU-00000000: unknown device"),
        ("gpu0", "nvidia-container-cli: device error: gpu0: unknown device"),
        ("-1", "nvidia-container-cli: device error: -1: unknown device"),
        ("nvidia.com/gpu=0", "unresolvable CDI devices nvidia.com/gpu=0"),
        ("0,nvidia.com/gpu=1", "nvidia-container-cli: device error: nvidia.com/gpu=1: unknown device"),
    ],
)
def test_unknown_devices_are_refused(
    value: str,
    message: str,
    tmp_path: Path,
    fake_runc: Callable[[], dict[str, Any] | None],
    node: FakeNode,
) -> None:
    bundle = Bundle(tmp_path / "bundle", env=[f"NVIDIA_VISIBLE_DEVICES={value}"])
    log = tmp_path / "log.json"
    result = run(create_args(bundle.dir, log))
    assert result.returncode == 1
    assert message in result.stderr
    assert fake_runc() is None  # runc never ran
    assert bundle.config.read_bytes() == bundle.original
    # containerd reads the runtime's error from runc's --log file (JSON, as logrus writes it)
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["level"] == "error"
    assert message in entry["msg"]
    assert "time" in entry


def test_cdi_annotations_need_qualified_names(tmp_path: Path, dev: Path, node: FakeNode) -> None:
    bundle = Bundle(tmp_path / "b", env=[], annotations={"cdi.k8s.io/nvidia": "0"})
    with pytest.raises(rt.Refused, match=r"invalid device name \"0\" in annotation \"cdi.k8s.io/nvidia\""):
        modify(bundle)
    qualified = Bundle(tmp_path / "q", env=[], annotations={"cdi.k8s.io/nvidia": "nvidia.com/gpu=all"})
    with pytest.raises(rt.Refused, match=r"unresolvable CDI devices nvidia\.com/gpu=all"):
        modify(qualified)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (
            "no-library",
            "nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: ",
        ),
        ("no-driver", "nvidia-container-cli: initialization error: nvml error: driver not loaded"),
        (
            "mismatch",
            "nvidia-container-cli: initialization error: nvml error: driver/library version mismatch",
        ),
        ("lost", "nvidia-container-cli: detection error: nvml error: gpu is lost"),
    ],
)
def test_a_broken_driver_refuses_every_gpu_container(
    fault: str, message: str, tmp_path: Path, dev: Path, node: FakeNode
) -> None:
    if fault == "no-library":
        node.remove_library()
    elif fault == "no-driver":
        node.state_path.unlink()
    elif fault == "mismatch":
        assert node.ctl("kernel-version", "535.104.05") == 0
    else:
        assert node.ctl("gpu", "--gpu", "3", "--lost") == 0
    bundle = Bundle(tmp_path / "b", env=["NVIDIA_VISIBLE_DEVICES=0"])
    with pytest.raises(rt.Refused) as refused:
        modify(bundle)
    assert str(refused.value).startswith(message)
    assert bundle.config.read_bytes() == bundle.original


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.1"], None),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.2 brand=tesla,driver>=470,driver<471"], None),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.4"], "cuda>=12.4"),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=nvidia,driver>=535,driver<536"], None),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471"], "cuda>=12.4"),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.4", "NVIDIA_DISABLE_REQUIRE=true"], None),
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.1", "NVIDIA_REQUIRE_ARCH=arch>=9.0"], "arch>=9.0"),
        (["NVIDIA_REQUIRE_JETPACK=csv-mounts=all"], None),
        (["CUDA_VERSION=12.4.1"], "cuda>=12.4"),  # a legacy image requires its own CUDA
    ],
)
def test_image_requirements_against_the_driver(
    env: list[str], refused: str | None, tmp_path: Path, dev: Path, node: FakeNode
) -> None:
    bundle = Bundle(tmp_path / "b", env=["NVIDIA_VISIBLE_DEVICES=0", *env])
    if refused is None:
        modify(bundle)
        assert "/var/lib/fake-nvml" in bundle.destinations()
        return
    with pytest.raises(rt.Refused) as error:
        modify(bundle)
    assert str(error.value).startswith(
        f"nvidia-container-cli: requirement error: unsatisfied condition: {refused}"
    )
    if refused.startswith("cuda"):
        assert str(error.value).endswith(
            "please update your driver to a newer version, or use an earlier cuda container"
        )


def test_no_runc_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVIDIA_CONTAINER_RUNTIME_RUNC", str(tmp_path / "no-such-runc"))
    result = run(["state", "c0ffee"])
    assert result.returncode == 1
    assert "no-such-runc" in result.stderr
