"""The lab's dcgm-exporter stand-in (tests/lab/nvidia/dcgm_exporter.py) against the fake NVML.

What it must do as the real exporter does: take the product's container env and the role's counters file,
refuse what the real binary refuses (unknown flags, bad values, a counters file DCGM would not load), serve
Prometheus text at /metrics with the real label set, /health, and read its values through NVML, so that the
fake's faults show in the metrics the product's alerts read.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import FAKE_NVML_DIR, FakeNode
from lab.upstream_manifests import manifest as upstream_manifest
from monitoring_render import ROLE, dcgm_exporter_objects

STANDIN = Path(__file__).resolve().parents[1] / "lab" / "nvidia" / "dcgm_exporter.py"
ROLE_COUNTERS = ROLE / "files" / "dcgm-exporter" / "counters.csv"
# the upstream counter files, byte-exact
# (tests/lab/upstream_manifests.py: ../shared/upstream or their pinned URLs)
UPSTREAM_COUNTERS = upstream_manifest("dcgm-exporter/4.5.3-4.8.2/default-counters.csv")
UPSTREAM_DCP_COUNTERS = upstream_manifest("dcgm-exporter/4.5.3-4.8.2/dcp-metrics-included.csv")


def load_exporter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dcgm_exporter_standin", STANDIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


dx = load_exporter()


@pytest.fixture
def node(make_node: Callable[..., FakeNode]) -> FakeNode:
    return make_node("a100-pcie-40gb-x4")


def product_env() -> dict[str, str]:
    """The env of the container the monitoring role deploys (upstream's manifest, the role's filter)."""
    daemonset = next(o for o in dcgm_exporter_objects() if o["kind"] == "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["NODE_NAME"] = "gpu-node-2"  # the downward API's spec.nodeName
    return env


def config(args: list[str] | None = None, env: dict[str, str] | None = None) -> Any:
    return dx.parse_command_line(args or [], env or {})


def run(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(FAKE_NVML_DIR), **(env or {})}
    return subprocess.run(
        [sys.executable, str(STANDIN), *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )


# --- the command line and environment, as urfave/cli parses them ----------------------------------------


def test_the_products_container_env_is_accepted() -> None:
    env = product_env()
    assert set(env) == {
        "DCGM_EXPORTER_LISTEN",
        "DCGM_EXPORTER_KUBERNETES",
        "DCGM_EXPORTER_COLLECTORS",
        "NODE_NAME",
    }
    options = config(env=env)
    assert options.address == ":9400"
    assert options.kubernetes is True
    assert options.collectors == "/etc/dcgm-exporter/llm-serving/counters.csv"
    assert options.collect_interval == 30000


def test_defaults_are_the_real_ones() -> None:
    options = config()
    assert options.collectors == "/etc/dcgm-exporter/default-counters.csv"
    assert options.address == ":9400"
    assert options.kubernetes is False
    assert options.devices == "f"
    assert options.log_format == "text"


@pytest.mark.parametrize(
    "args",
    [
        ["-f", "/x.csv", "-a", ":9500", "-k", "-c", "5000"],
        ["--collectors", "/x.csv", "--address=:9500", "--kubernetes", "--collect-interval=5000"],
        ["-collectors=/x.csv", "-address", ":9500", "-k=true", "-c", "0x1388"],
    ],
)
def test_flags_in_every_form_go_accepts(args: list[str]) -> None:
    options = config(args, env={"DCGM_EXPORTER_COLLECTORS": "/from-env.csv"})
    assert (options.collectors, options.address, options.kubernetes, options.collect_interval) == (
        "/x.csv",
        ":9500",
        True,
        5000,
    )


def test_the_command_line_wins_over_the_environment() -> None:
    options = config(["--kubernetes=false"], env={"DCGM_EXPORTER_KUBERNETES": "true"})
    assert options.kubernetes is False


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--no-such-flag"], {}, "flag provided but not defined: -no-such-flag"),
        (["-z"], {}, "flag provided but not defined: -z"),
        (["-f"], {}, "flag needs an argument: -f"),
        (["-c", "often"], {}, 'invalid value "often" for flag -c: parse error'),
        (["-k=yes"], {}, 'invalid boolean value "yes" for -k: parse error'),
        (["---f", "x"], {}, "bad flag syntax: ---f"),
        (
            [],
            {"DCGM_EXPORTER_KUBERNETES": "yes"},
            'could not parse "yes" as bool value from environment variable "DCGM_EXPORTER_KUBERNETES" '
            "for flag kubernetes",
        ),
        (
            [],
            {"DCGM_EXPORTER_INTERVAL": "30s"},
            'could not parse "30s" as int value from environment variable "DCGM_EXPORTER_INTERVAL" '
            "for flag collect-interval",
        ),
    ],
)
def test_what_the_real_binary_refuses_is_refused(args: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(dx.UsageError) as error:
        config(args, env)
    assert message in str(error.value)


def test_an_unknown_flag_exits_1_with_the_real_message() -> None:
    result = run(["--collector", "/x.csv"])
    assert result.returncode == 1
    assert "Incorrect Usage: flag provided but not defined: -collector" in result.stderr


def test_help_and_version() -> None:
    assert run(["--help"]).returncode == 0
    version = run(["-v"])
    assert version.returncode == 0
    assert version.stdout.startswith("DCGM Exporter version 4.5.3-4.8.2")


@pytest.mark.parametrize(
    "args",
    [
        ["--use-old-namespace"],
        ["-m", "monitoring:dcgm-metrics"],
        ["-r", "gpu-node-1:5555"],
        ["-r", "localhost:5555"],  # named, even as the default: the real one connects to a host engine
        ["--web-config-file", "/etc/web.yml"],
        ["--hpc-job-mapping-dir", "/run/jobs"],
        ["-d", "i"],
    ],
)
def test_accepted_but_not_simulated_is_refused_by_name(args: list[str]) -> None:
    with pytest.raises(dx.NotSimulated, match="LAB STAND-IN"):
        config(args)


def test_not_simulated_flags_may_be_off() -> None:
    config(["--use-old-namespace=false", "-m", "none"], env={"DCGM_EXPORTER_WEB_CONFIG_FILE": ""})
    with pytest.raises(dx.NotSimulated, match="--configmap-data"):
        config(env={"DCGM_EXPORTER_CONFIGMAP_DATA": "monitoring:dcgm"})


# --- the counters file, as dcgm-exporter reads it ---------------------------------------------------------


@pytest.mark.parametrize("path", [ROLE_COUNTERS, UPSTREAM_COUNTERS, UPSTREAM_DCP_COUNTERS])
def test_the_real_counters_files_load(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} not found (../shared/upstream)")
    counters = dx.load_counters(str(path))
    names = [c.name for c in counters.counters]
    assert "DCGM_FI_DEV_GPU_TEMP" in names
    assert all(not n.startswith("DCGM_FI_PROF_") for n in names)  # no profiling module: skipped
    assert counters.dcp_skipped  # and said so, line by line, as the real exporter does


def test_the_roles_counters_file() -> None:
    counters = dx.load_counters(str(ROLE_COUNTERS))
    by_name = {c.name: c for c in counters.counters}
    assert by_name["DCGM_FI_DEV_DEC_UTIL"].prom_type == "gauge"  # "DCGM_FI_DEV_DEC_UTIL ," is trimmed
    assert by_name["DCGM_FI_DRIVER_VERSION"].prom_type == "label"
    assert (
        by_name["DCGM_FI_DEV_ROW_REMAP_PENDING"].help == "Whether a row remap is pending (needs a GPU reset)."
    )
    assert ("DCGM_FI_PROF_GR_ENGINE_ACTIVE") in [name for _, name in counters.dcp_skipped]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "DCGM_FI_DEV_GPU_TEMPP, gauge, typo\n",
            "could not find DCGM field; err: unknown ExporterCounter field",
        ),
        ("DCGM_FI_DEV_GPU_TEMP, gauges, plural\n", "could not find Prometheus metric type 'gauges'"),
        (
            "DCGM_FI_DEV_GPU_TEMP, gauge, ok\nDCGM_FI_DEV_POWER_USAGE, gauge\n",
            "record on line 2: wrong number of fields",
        ),
        ("DCGM_FI_DEV_GPU_TEMP, gauge\n", "malformed CSV record; err: failed to parse line 0"),
        ("# only comments\n\n", None),
    ],
)
def test_a_counters_file_dcgm_would_refuse(tmp_path: Path, text: str, message: str | None) -> None:
    path = tmp_path / "counters.csv"
    path.write_text(text)
    if message is None:
        assert dx.load_counters(str(path)).counters == []
        return
    with pytest.raises(dx.CountersError) as error:
        dx.load_counters(str(path))
    assert message in str(error.value)


def test_a_missing_counters_file(tmp_path: Path) -> None:
    with pytest.raises(dx.CountersError, match="no such file or directory"):
        dx.load_counters(str(tmp_path / "none.csv"))


# --- the metrics -------------------------------------------------------------------------------------------


@pytest.fixture
def exporter(node: FakeNode) -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def make(
        args: list[str] | None = None, env: dict[str, str] | None = None, csv: Path = ROLE_COUNTERS
    ) -> Any:
        options = config(
            ["-f", str(csv), "-c", "0", *(args or [])], env={"NODE_NAME": "gpu-node-2", **(env or {})}
        )
        made.append(dx.Exporter(options, dx.Log("text", quiet=True)))
        return made[-1]

    yield make
    for exp in made:
        exp.close()


LINE = re.compile(r"^(?P<name>[A-Z_0-9]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def samples(text: str) -> list[tuple[str, list[tuple[str, str]], str]]:
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = LINE.match(line)
        assert m, line
        labels = [tuple(pair.split("=", 1)) for pair in m["labels"].split(",")]
        out.append((m["name"], [(k, v.strip('"')) for k, v in labels], m["value"]))
    return out


def value(text: str, name: str, gpu: int) -> str | None:
    for metric, labels, val in samples(text):
        if metric == name and dict(labels)["gpu"] == str(gpu):
            return val
    return None


def test_the_real_label_set_in_the_real_order(exporter: Callable[..., Any], node: FakeNode) -> None:
    text = exporter().render()
    temps = [s for s in samples(text) if s[0] == "DCGM_FI_DEV_GPU_TEMP"]
    assert len(temps) == 4
    _, labels, val = temps[1]
    gpu = node.gpu(1)
    assert labels == [
        ("gpu", "1"),
        ("UUID", gpu["uuid"]),
        ("pci_bus_id", f"00000000:{gpu['pci']['bus']:02X}:00.0"),
        ("device", "nvidia1"),
        ("modelName", "NVIDIA A100-PCIE-40GB"),
        ("Hostname", "gpu-node-2"),
        ("DCGM_FI_DRIVER_VERSION", "535.183.06"),
    ]
    assert val == str(gpu["temperature"]["gpu"])
    assert "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" in text


def test_values_read_through_nvml(exporter: Callable[..., Any], node: FakeNode) -> None:
    text = exporter().render()
    gpu = node.gpu(0)
    assert value(text, "DCGM_FI_DEV_POWER_USAGE", 0) == f"{gpu['power']['draw_mw'] / 1000:f}"
    assert value(text, "DCGM_FI_DEV_POWER_MGMT_LIMIT", 0) == "250.000000"
    assert value(text, "DCGM_FI_DEV_SLOWDOWN_TEMP", 0) == "89"
    assert value(text, "DCGM_FI_DEV_FB_USED", 0) == "0"
    assert value(text, "DCGM_FI_DEV_FB_FREE", 0) == "40960"
    assert value(text, "DCGM_FI_DEV_FB_RESERVED", 0) == "0"
    assert value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0) == "0"
    assert value(text, "DCGM_FI_DEV_ROW_REMAP_PENDING", 0) == "0"
    assert value(text, "DCGM_FI_DEV_XID_ERRORS", 0) == "0"
    xid = next(s for s in samples(text) if s[0] == "DCGM_FI_DEV_XID_ERRORS")
    assert xid[1][-2:] == [("err_code", "0"), ("err_msg", "No Error")]


def test_faults_show_in_the_metrics(exporter: Callable[..., Any], node: FakeNode) -> None:
    exp = exporter()
    assert node.ctl("ecc", "--gpu", "2", "--uncorrectable", "1") == 0
    assert node.ctl("ecc", "--gpu", "0", "--corrected", "7") == 0
    assert node.ctl("remap", "--gpu", "1", "--pending", "--uncorrectable", "3") == 0
    assert node.ctl("remap", "--gpu", "3", "--failure") == 0
    assert node.ctl("temp", "--gpu", "3", "--celsius", "92") == 0
    assert node.ctl("power", "--gpu", "1", "--limit-w", "180") == 0
    assert node.ctl("process", "--gpu", "0", "--pid", "4242", "--add", "--used-mib", "2048") == 0
    text = exp.render()
    assert value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 2) == "1"
    assert value(text, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0) == "7"
    assert value(text, "DCGM_FI_DEV_ROW_REMAP_PENDING", 1) == "1"
    assert value(text, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1) == "3"
    assert value(text, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 3) == "1"
    assert value(text, "DCGM_FI_DEV_GPU_TEMP", 3) == "92"
    assert value(text, "DCGM_FI_DEV_POWER_MGMT_LIMIT", 1) == "180.000000"
    assert value(text, "DCGM_FI_DEV_FB_USED", 0) == "2048"


def test_a_gpu_fallen_off_the_bus_reports_xid_79_and_nothing_else(
    exporter: Callable[..., Any], node: FakeNode
) -> None:
    exp = exporter()
    assert node.ctl("gpu", "--gpu", "2", "--lost") == 0
    text = exp.render()
    lost = [s for s in samples(text) if dict(s[1])["gpu"] == "2"]
    assert [s[0] for s in lost] == ["DCGM_FI_DEV_XID_ERRORS"]
    assert lost[0][2] == "79"
    assert dict(lost[0][1])["err_msg"] == "GPU has fallen off the bus"
    assert value(text, "DCGM_FI_DEV_GPU_TEMP", 1) is not None  # the others carry on


def test_ecc_off_means_no_ecc_counters(exporter: Callable[..., Any], node: FakeNode) -> None:
    node.edit(lambda s: s["gpus"][0]["ecc"].update(current=0))
    text = exporter().render()
    assert value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0) is None
    assert value(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1) == "0"


def test_hostname_and_model_name_options(exporter: Callable[..., Any], node: FakeNode) -> None:
    text = exporter(["--no-hostname", "--replace-blanks-in-model-name"]).render()
    labels = dict(samples(text)[0][1])
    assert "Hostname" not in labels
    assert labels["modelName"] == "NVIDIA-A100-PCIE-40GB"


def test_devices_option_selects_gpus(exporter: Callable[..., Any], node: FakeNode) -> None:
    text = exporter(["-d", "g:1,3"]).render()
    assert {dict(s[1])["gpu"] for s in samples(text)} == {"1", "3"}
    with pytest.raises(dx.StartupError):
        exporter(["-d", "g:7"])


def test_unmodelled_fields_skipped_with_one_log_line_naming_them(
    node: FakeNode, capsys: pytest.CaptureFixture[str]
) -> None:
    options = config(["-f", str(ROLE_COUNTERS)])
    exp = dx.Exporter(options, dx.Log("text"))
    try:
        text = exp.render()
    finally:
        exp.close()
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "not simulated" in line and "fields=" in line]
    assert len(skipped) == 1, err
    for name in ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS"):
        assert name in skipped[0]
        assert name not in text
    assert "Skipping line" in err and "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in err  # the real DCP message


def test_values_refresh_at_the_collect_interval(exporter: Callable[..., Any], node: FakeNode) -> None:
    clock = [1000.0]
    exp = exporter(["-c", "30000"])
    exp.clock = lambda: clock[0]
    assert value(exp.render(), "DCGM_FI_DEV_GPU_TEMP", 0) != "91"
    assert node.ctl("temp", "--gpu", "0", "--celsius", "91") == 0
    clock[0] += 10
    assert value(exp.render(), "DCGM_FI_DEV_GPU_TEMP", 0) != "91"  # DCGM samples every 30 s
    clock[0] += 25
    assert value(exp.render(), "DCGM_FI_DEV_GPU_TEMP", 0) == "91"


def test_no_driver_no_exporter(node: FakeNode) -> None:
    node.remove_library()
    with pytest.raises(dx.StartupError, match="NVML"):
        dx.Exporter(config(["-f", str(ROLE_COUNTERS)]), dx.Log("text", quiet=True))


# --- the HTTP side ------------------------------------------------------------------------------------------


def test_serves_metrics_health_and_nothing_else(exporter: Callable[..., Any], node: FakeNode) -> None:
    exp = exporter(["-a", "127.0.0.1:0"])
    server = dx.make_server(exp)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
            assert "DCGM_FI_DEV_GPU_TEMP{" in response.read().decode()
        with urllib.request.urlopen(f"{base}/health", timeout=10) as response:
            assert response.status == 200
        with urllib.request.urlopen(f"{base}/", timeout=10) as response:
            assert "GPU Exporter" in response.read().decode()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{base}/metrics/extra", timeout=10)
        assert missing.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_runs_as_the_container_runs_it(node: FakeNode, tmp_path: Path) -> None:
    """The whole program with the product's env (port 0: any free one), until it serves."""
    env = {
        **product_env(),
        "DCGM_EXPORTER_COLLECTORS": str(ROLE_COUNTERS),
        "DCGM_EXPORTER_LISTEN": "127.0.0.1:0",
    }
    full_env = {**os.environ, "PYTHONPATH": str(FAKE_NVML_DIR), **env}
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=full_env,
    )
    try:
        assert proc.stderr is not None
        port = None
        for line in proc.stderr:
            found = re.search(r"address=127\.0\.0\.1:(\d+)", line)
            if found:
                port = int(found[1])
                break
        assert port, "never said where it listens"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert 'Hostname="gpu-node-2"' in response.read().decode()
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
