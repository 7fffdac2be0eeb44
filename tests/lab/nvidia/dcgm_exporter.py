#!/usr/bin/python3
"""dcgm-exporter LAB STAND-IN: NVIDIA's GPU metrics exporter for Prometheus, reading the lab's simulated GPUs
through NVML (the fake pynvml) where the real one reads DCGM.

Shipped in the lab under NVIDIA's image name (nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless) with
a copy of the fake pynvml beside it, so upstream's manifest, as the monitoring role changes it, runs
unchanged; the GPUs reach the container through the nvidia runtime stand-in (NVIDIA_VISIBLE_DEVICES=all in
the image, as in NVIDIA's). Standard library only.

As the real exporter:
* the command line and environment as urfave/cli parses them (Go's flag syntax; the flags and their env
  variables of dcgm-exporter's pkg/cmd/app.go; the command line wins over the environment); an unknown flag
  or a bad value is refused with Go's message and exit status 1. Flags whose effect is not simulated are
  refused naming themselves (NotSimulated) unless left at their default;
* the counters file (-f, DCGM_EXPORTER_COLLECTORS) read as dcgm-exporter reads it (Go's encoding/csv with
  `#` comments, three fields, field name, Prometheus type, help); an unknown field name or type is refused;
  profiling (DCGM_FI_PROF_*) fields are skipped line by line, "metric not enabled", as the real exporter does
  where DCGM has no profiling module;
* /metrics in its text format and label set: gpu, UUID, pci_bus_id, device, modelName, Hostname (NODE_NAME),
  the `label` fields (DCGM_FI_DRIVER_VERSION...), and err_code/err_msg on DCGM_FI_DEV_XID_ERRORS; doubles as
  %f, integers as %d; values sampled every collect interval; / and /health as the real server has them.

What the fake NVML models is exported (temperatures, power and its limit, framebuffer memory, ECC counts,
remapped rows, retired pages where supported, driver and NVML versions, serial and VBIOS; Xid 79 for a GPU
fallen off the bus, else 0); the other fields of a counters file (clocks, utilisation, energy, PCIe and NVLink
counters, violations, the exporter's own DCGM_EXP_* counters...) are skipped with one log line naming them.
Not simulated: the Kubernetes pod labels (pod, namespace, container: the kubelet's pod-resources API),
MIG, NVSwitches and CPUs, TLS (web config), a remote nv-hostengine.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TextIO

VERSION = "4.5.3-4.8.2"
APP_NAME = "DCGM Exporter"

# ---------------------------------------------------------------------------------------------------
# Command line: the flags of dcgm-exporter's pkg/cmd/app.go, parsed the way urfave/cli v2 and Go's flag do
# ---------------------------------------------------------------------------------------------------
SIMULATED, IGNORED, REFUSED = "simulated", "ignored", "refused"


@dataclass(frozen=True)
class Flag:
    name: str
    kind: str  # "string", "int", "bool", "strings"
    default: Any
    env: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    # simulated: acted on; ignored: no effect on what is exported here; refused: only unset or off
    handling: str = IGNORED


FLAGS = (
    Flag(
        "collectors",
        "string",
        "/etc/dcgm-exporter/default-counters.csv",
        ("DCGM_EXPORTER_COLLECTORS",),
        ("f",),
        SIMULATED,
    ),
    Flag("config-file", "string", "", ("DCGM_EXPORTER_CONFIG_FILE",), handling=REFUSED),
    Flag("address", "string", ":9400", ("DCGM_EXPORTER_LISTEN",), ("a",), SIMULATED),
    Flag("web-read-timeout", "string", "10s", ("DCGM_EXPORTER_WEB_READ_TIMEOUT",)),
    Flag("web-write-timeout", "string", "10s", ("DCGM_EXPORTER_WEB_WRITE_TIMEOUT",)),
    Flag("collect-interval", "int", 30000, ("DCGM_EXPORTER_INTERVAL",), ("c",), SIMULATED),
    Flag("kubernetes", "bool", False, ("DCGM_EXPORTER_KUBERNETES",), ("k",), SIMULATED),
    Flag("use-old-namespace", "bool", False, ("DCGM_EXPORTER_USE_OLD_NAMESPACE",), ("o",), REFUSED),
    Flag("cpu-devices", "string", "f", ("DCGM_EXPORTER_CPU_DEVICES_STR",), ("p",)),
    Flag("configmap-data", "string", "none", ("DCGM_EXPORTER_CONFIGMAP_DATA",), ("m",), REFUSED),
    Flag(
        "remote-hostengine-info",
        "string",
        "localhost:5555",
        ("DCGM_REMOTE_HOSTENGINE_INFO",),
        ("r",),
        REFUSED,
    ),
    Flag("kubernetes-enable-pod-labels", "bool", False, ("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS",)),
    Flag("kubernetes-enable-pod-uid", "bool", False, ("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID",)),
    Flag("kubernetes-gpu-id-type", "string", "uid", ("DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE",)),
    Flag(
        "kubernetes-pod-label-allowlist-regex",
        "strings",
        (),
        ("DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX",),
    ),
    Flag("devices", "string", "f", ("DCGM_EXPORTER_DEVICES_STR",), ("d",), SIMULATED),
    Flag("no-hostname", "bool", False, ("DCGM_EXPORTER_NO_HOSTNAME",), ("n",), SIMULATED),
    Flag("switch-devices", "string", "f", ("DCGM_EXPORTER_OTHER_DEVICES_STR",), ("s",)),
    Flag("fake-gpus", "bool", False, ("DCGM_EXPORTER_USE_FAKE_GPUS",)),
    Flag("web-config-file", "string", "", ("DCGM_EXPORTER_WEB_CONFIG_FILE",), handling=REFUSED),
    Flag("xid-count-window-size", "int", 300000, ("DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE",), ("x",)),
    Flag(
        "replace-blanks-in-model-name",
        "bool",
        False,
        ("DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME",),
        ("rbmn",),
        SIMULATED,
    ),
    Flag("debug", "bool", False, ("DCGM_EXPORTER_DEBUG",)),
    Flag("clock-events-count-window-size", "int", 300000, ("DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE",)),
    Flag("enable-dcgm-log", "bool", False, ("DCGM_EXPORTER_ENABLE_DCGM_LOG",)),
    Flag("dcgm-log-level", "string", "NONE", ("DCGM_EXPORTER_DCGM_LOG_LEVEL",)),
    Flag("log-format", "string", "text", ("DCGM_EXPORTER_LOG_FORMAT",), handling=SIMULATED),
    Flag(
        "pod-resources-kubelet-socket",
        "string",
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        ("DCGM_POD_RESOURCES_KUBELET_SOCKET",),
    ),
    Flag("hpc-job-mapping-dir", "string", "", ("DCGM_HPC_JOB_MAPPING_DIR",), handling=REFUSED),
    Flag("container-labels", "bool", False, ("DCGM_EXPORTER_CONTAINER_LABELS",), handling=REFUSED),
    Flag("container-runtime-socket", "string", "", ("DCGM_CONTAINER_RUNTIME_SOCKET",)),
    Flag("nvidia-resource-names", "strings", (), ("NVIDIA_RESOURCE_NAMES",)),
    Flag("kubernetes-virtual-gpus", "bool", False, ("KUBERNETES_VIRTUAL_GPUS",)),
    Flag("dump-enabled", "bool", False, ("DCGM_EXPORTER_DUMP_ENABLED",)),
    Flag("dump-directory", "string", "/tmp/dcgm-exporter-debug", ("DCGM_EXPORTER_DUMP_DIRECTORY",)),
    Flag("dump-retention", "int", 24, ("DCGM_EXPORTER_DUMP_RETENTION",)),
    Flag("dump-compression", "bool", True, ("DCGM_EXPORTER_DUMP_COMPRESSION",)),
    Flag("kubernetes-enable-dra", "bool", False, ("KUBERNETES_ENABLE_DRA",)),
    Flag("disable-startup-validate", "bool", False, ("DISABLE_STARTUP_VALIDATE",)),
    Flag("enable-gpu-bind-unbind-watch", "bool", False, ("DCGM_EXPORTER_ENABLE_GPU_BIND_UNBIND_WATCH",)),
    Flag("gpu-bind-unbind-poll-interval", "string", "1s", ("DCGM_EXPORTER_GPU_BIND_UNBIND_POLL_INTERVAL",)),
    Flag("enable-pprof", "bool", False, ("DCGM_EXPORTER_ENABLE_PPROF",), handling=REFUSED),
    Flag("web-systemd-socket", "bool", False, ("DCGM_EXPORTER_SYSTEMD_SOCKET",), handling=REFUSED),
    # urfave/cli's own
    Flag("help", "bool", False, aliases=("h",)),
    Flag("version", "bool", False, aliases=("v",)),
)
FLAG_BY_NAME = {name: flag for flag in FLAGS for name in (flag.name, *flag.aliases)}
OFF = ("", False, "none")
DEVICES = re.compile(r"^(f|g|g:\d+(-\d+)?(,\d+(-\d+)?)*)$")


class UsageError(Exception):
    """What urfave/cli refuses: printed as `Incorrect Usage: ...` where it comes from the command line."""

    def __init__(self, message: str, from_command_line: bool = True) -> None:
        super().__init__(message)
        self.from_command_line = from_command_line


class NotSimulated(Exception):
    """A flag or value the real exporter accepts and this stand-in does not act on."""


class CountersError(Exception):
    """A counters file the real exporter would not load."""


class StartupError(Exception):
    """The exporter cannot start (no NVML, devices that do not exist, the address taken)."""


@dataclass
class Options:
    values: dict[str, Any]
    set_by_user: set[str] = field(default_factory=set)  # on the command line or in the environment
    node_name: str = ""  # NODE_NAME, the Hostname label when set (the manifest sets it to spec.nodeName)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name.replace("_", "-")]
        except KeyError as exc:
            raise AttributeError(name) from exc


_GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def _go_bool(text: str) -> bool:
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise ValueError(f'strconv.ParseBool: parsing "{text}": invalid syntax')


def _go_int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise ValueError(f'strconv.ParseInt: parsing "{text}": invalid syntax') from None


def parse_command_line(args: list[str], environ: dict[str, str]) -> Options:
    values = {flag.name: flag.default for flag in FLAGS}
    from_env: set[str] = set()
    for flag in FLAGS:  # urfave/cli applies the environment first; the command line then overrides it
        for var in flag.env:
            if var not in environ:
                continue
            raw = environ[var]
            source = f'environment variable "{var}"'
            try:
                if flag.kind == "bool":
                    if raw != "":
                        values[flag.name] = _go_bool(raw)
                elif flag.kind == "int":
                    if raw != "":
                        values[flag.name] = _go_int(raw)
                elif flag.kind == "strings":
                    values[flag.name] = tuple(part.strip() for part in raw.split(","))
                else:
                    values[flag.name] = raw
            except ValueError as exc:
                raise UsageError(
                    f'could not parse "{raw}" as {flag.kind} value from {source} for flag {flag.name}: {exc}',
                    from_command_line=False,
                ) from None
            from_env.add(flag.name)
            break
    given: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        if len(arg) < 2 or not arg.startswith("-"):
            break  # the first argument that is not a flag ends the flags
        if arg == "--":
            break
        name = arg[2:] if arg.startswith("--") else arg[1:]
        if not name or name[0] in "-=":
            raise UsageError(f"bad flag syntax: {arg}")
        name, has_value, text = name.partition("=")
        flag = FLAG_BY_NAME.get(name)
        if flag is None:
            raise UsageError(f"flag provided but not defined: -{name}")
        if flag.kind == "bool":
            if has_value:
                try:
                    values[flag.name] = _go_bool(text)
                except ValueError:
                    raise UsageError(f'invalid boolean value "{text}" for -{name}: parse error') from None
            else:
                values[flag.name] = True
        else:
            if not has_value:
                if i + 1 >= len(args):
                    raise UsageError(f"flag needs an argument: -{name}")
                i += 1
                text = args[i]
            if flag.kind == "int":
                try:
                    values[flag.name] = _go_int(text)
                except ValueError:
                    raise UsageError(f'invalid value "{text}" for flag -{name}: parse error') from None
            elif flag.kind == "strings":
                values[flag.name] = tuple(part.strip() for part in text.split(","))
            else:
                values[flag.name] = text
        given.add(flag.name)
        i += 1
    options = Options(values, given | from_env, environ.get("NODE_NAME", ""))
    if options.help or options.version:
        return options
    for flag in FLAGS:
        # a refused flag may be given only as "off" (a remote host engine is used as soon as one is named)
        if flag.handling == REFUSED and flag.name in options.set_by_user and values[flag.name] not in OFF:
            raise NotSimulated(f"LAB STAND-IN: --{flag.name} is not simulated (leave it unset)")
    if not DEVICES.match(str(options.devices)):
        raise NotSimulated(
            f"LAB STAND-IN: --devices {options.devices} is not simulated (f, g or g:<ids>; no MIG instances)"
        )
    if options.log_format not in ("text", "json"):
        raise UsageError(
            f"invalid log-format parameter values: {options.log_format}", from_command_line=False
        )
    return options


def usage() -> str:
    lines = [
        "NAME:\n   dcgm-exporter - Generates GPU metrics in the prometheus format "
        f"({VERSION}, LAB STAND-IN)\n"
    ]
    lines.append("GLOBAL OPTIONS:")
    for flag in FLAGS:
        names = ", ".join(f"--{n}" if len(n) > 1 else f"-{n}" for n in (flag.name, *flag.aliases))
        env = f" [${', $'.join(flag.env)}]" if flag.env else ""
        lines.append(f"   {names} (default: {flag.default!r}){env}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# Logging: log/slog's text and JSON handlers on stderr
# ---------------------------------------------------------------------------------------------------
class Log:
    def __init__(self, log_format: str, quiet: bool = False) -> None:
        self.format = log_format
        self.quiet = quiet
        self.lock = threading.Lock()

    def __call__(self, level: str, msg: str, **attrs: Any) -> None:
        if self.quiet:
            return
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        if self.format == "json":
            line = json.dumps({"time": stamp, "level": level, "msg": msg, **attrs}, separators=(",", ":"))
        else:
            parts = [f"time={stamp}", f"level={level}", f"msg={self._quote(msg)}"]
            parts += [f"{key}={self._quote(str(value))}" for key, value in attrs.items()]
            line = " ".join(parts)
        stream: TextIO = sys.stderr
        with self.lock:
            stream.write(line + "\n")
            stream.flush()

    @staticmethod
    def _quote(text: str) -> str:
        return json.dumps(text) if (not text or re.search(r'[\s"=]', text)) else text


# ---------------------------------------------------------------------------------------------------
# The counters file
# ---------------------------------------------------------------------------------------------------
INT, DOUBLE, STRING = "int", "double", "string"
PROM_TYPES = ("gauge", "counter", "histogram", "summary", "label")
# The exporter's own counters (dcgm-exporter's internal/pkg/counters): computed by the exporter, not DCGM.
EXPORTER_FIELDS = (
    "DCGM_EXP_XID_ERRORS_COUNT",
    "DCGM_EXP_CLOCK_EVENTS_COUNT",
    "DCGM_EXP_GPU_HEALTH_STATUS",
    "DCGM_EXP_P2P_STATUS",
)
# DCGM fields (dcgm_fields.h) the stand-in knows by name but cannot read from the fake NVML.
NOT_MODELLED = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_BRAND",
    "DCGM_FI_DEV_OEM_INFOROM_VER",
    "DCGM_FI_DEV_ECC_INFOROM_VER",
    "DCGM_FI_DEV_POWER_INFOROM_VER",
    "DCGM_FI_DEV_INFOROM_IMAGE_VER",
)
# Profiling (DCP) fields: read by DCGM's profiling module, which the simulated driver does not have.
PROFILING = (
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
)


def _mib(value: int) -> int:
    return value // (1024 * 1024)


def _memory(nvml: Any, handle: Any, part: str) -> int:
    return _mib(getattr(nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2), part))


def _ecc(nvml: Any, handle: Any, kind: int, counter: int) -> int:
    return int(nvml.nvmlDeviceGetTotalEccErrors(handle, kind, counter))


def _retired(nvml: Any, handle: Any, cause: int | None) -> int:
    if cause is None:
        return int(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
    return len(nvml.nvmlDeviceGetRetiredPages(handle, cause))


# name -> (DCGM value type, how NVML gives it); units as DCGM reports them (W, MiB, C)
READERS: dict[str, tuple[str, Any]] = {
    "DCGM_FI_DRIVER_VERSION": (STRING, lambda n, h: n.nvmlSystemGetDriverVersion()),
    "DCGM_FI_NVML_VERSION": (STRING, lambda n, h: n.nvmlSystemGetNVMLVersion()),
    "DCGM_FI_DEV_SERIAL": (STRING, lambda n, h: n.nvmlDeviceGetSerial(h)),
    "DCGM_FI_DEV_VBIOS_VERSION": (STRING, lambda n, h: n.nvmlDeviceGetVbiosVersion(h)),
    "DCGM_FI_DEV_GPU_TEMP": (INT, lambda n, h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
    "DCGM_FI_DEV_SLOWDOWN_TEMP": (
        INT,
        lambda n, h: n.nvmlDeviceGetTemperatureThreshold(h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
    ),
    "DCGM_FI_DEV_SHUTDOWN_TEMP": (
        INT,
        lambda n, h: n.nvmlDeviceGetTemperatureThreshold(h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
    ),
    "DCGM_FI_DEV_POWER_USAGE": (DOUBLE, lambda n, h: n.nvmlDeviceGetPowerUsage(h) / 1000),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": (DOUBLE, lambda n, h: n.nvmlDeviceGetPowerManagementLimit(h) / 1000),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": (DOUBLE, lambda n, h: n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000),
    "DCGM_FI_DEV_FB_TOTAL": (INT, lambda n, h: _memory(n, h, "total")),
    "DCGM_FI_DEV_FB_FREE": (INT, lambda n, h: _memory(n, h, "free")),
    "DCGM_FI_DEV_FB_USED": (INT, lambda n, h: _memory(n, h, "used")),
    "DCGM_FI_DEV_FB_RESERVED": (INT, lambda n, h: _memory(n, h, "reserved")),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": (
        INT,
        lambda n, h: _ecc(n, h, n.NVML_SINGLE_BIT_ECC, n.NVML_VOLATILE_ECC),
    ),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": (
        INT,
        lambda n, h: _ecc(n, h, n.NVML_DOUBLE_BIT_ECC, n.NVML_VOLATILE_ECC),
    ),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": (
        INT,
        lambda n, h: _ecc(n, h, n.NVML_SINGLE_BIT_ECC, n.NVML_AGGREGATE_ECC),
    ),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": (
        INT,
        lambda n, h: _ecc(n, h, n.NVML_DOUBLE_BIT_ECC, n.NVML_AGGREGATE_ECC),
    ),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (INT, lambda n, h: n.nvmlDeviceGetRemappedRows(h)[0]),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (INT, lambda n, h: n.nvmlDeviceGetRemappedRows(h)[1]),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": (INT, lambda n, h: n.nvmlDeviceGetRemappedRows(h)[2]),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": (INT, lambda n, h: n.nvmlDeviceGetRemappedRows(h)[3]),
    "DCGM_FI_DEV_RETIRED_SBE": (
        INT,
        lambda n, h: _retired(n, h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
    ),
    "DCGM_FI_DEV_RETIRED_DBE": (
        INT,
        lambda n, h: _retired(n, h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
    ),
    "DCGM_FI_DEV_RETIRED_PENDING": (INT, lambda n, h: _retired(n, h, None)),
    # the last Xid: the fake models one, 79, as a GPU fallen off the bus (NVML_ERROR_GPU_IS_LOST)
    "DCGM_FI_DEV_XID_ERRORS": (INT, lambda n, h: 0),
}
XID_TEXT = {0: "No Error", 79: "GPU has fallen off the bus"}  # dcgm-exporter's table, the Xids modelled
KNOWN_FIELDS = set(READERS) | set(NOT_MODELLED) | set(PROFILING)


@dataclass(frozen=True)
class Counter:
    name: str
    prom_type: str
    help: str


@dataclass
class CounterSet:
    counters: list[Counter]
    dcp_skipped: list[tuple[int, str]]  # (record index, field) as the real exporter logs them


def _read_csv(path: str) -> list[list[str]]:
    """Go's encoding/csv, Comment '#': comment and empty lines skipped, each record as wide as the first."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except FileNotFoundError:
        raise CountersError(f"open {path}: no such file or directory") from None
    except OSError as exc:
        raise CountersError(f"open {path}: {exc.strerror.lower() if exc.strerror else exc}") from None
    records: list[list[str]] = []
    width = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip("\r") or line.startswith("#"):
            continue
        record = next(csv.reader([line]))
        if width is None:
            width = len(record)
        elif len(record) != width:
            raise CountersError(f"record on line {number}: wrong number of fields")
        records.append(record)
    return records


def load_counters(path: str) -> CounterSet:
    counters: list[Counter] = []
    dcp_skipped: list[tuple[int, str]] = []
    for index, raw in enumerate(_read_csv(path)):
        record = [part.strip(" ") for part in raw]
        if len(record) != 3:
            raise CountersError(
                f"malformed CSV record; err: failed to parse line {index} (`[{' '.join(record)}]`), "
                "expected 3 fields"
            )
        name, prom_type, help_text = record
        if name in EXPORTER_FIELDS:
            counters.append(Counter(name, prom_type, help_text))
            continue
        if name not in KNOWN_FIELDS:
            raise CountersError(f"could not find DCGM field; err: unknown ExporterCounter field '{name}'")
        if name in PROFILING:
            dcp_skipped.append((index, name))
            continue
        if prom_type not in PROM_TYPES:
            raise CountersError(f"could not find Prometheus metric type '{prom_type}'")
        counters.append(Counter(name, prom_type, help_text))
    return CounterSet(counters, dcp_skipped)


# ---------------------------------------------------------------------------------------------------
# The exporter
# ---------------------------------------------------------------------------------------------------
def _pynvml() -> Any:
    import pynvml  # the fake, shipped beside this file in the image

    return pynvml


def _device_ids(spec: str, count: int) -> list[int]:
    if spec in ("f", "g"):
        return list(range(count))
    wanted: list[int] = []
    for part in spec.split(":", 1)[1].split(","):
        first, _, last = part.partition("-")
        wanted += range(int(first), int(last or first) + 1)
    missing = [i for i in wanted if i >= count]
    if missing:
        raise StartupError(f"invalid --devices {spec}: GPU {missing[0]} does not exist (GPUs 0-{count - 1})")
    return sorted(set(wanted))


@dataclass
class Gpu:
    index: int
    uuid: str
    bus_id: str
    model: str
    handle: Any


class Exporter:
    """The GPUs found at start (as DCGM's device watch list), their values sampled every collect interval."""

    def __init__(self, options: Options, log: Log) -> None:
        self.options = options
        self.log = log
        self.clock = time.monotonic
        self.lock = threading.Lock()
        self.sampled_at: float | None = None
        self.sample: list[tuple[Gpu, dict[str, Any]]] = []
        counters = load_counters(options.collectors)
        log("INFO", f"Falling back to metric file '{options.collectors}'")
        for index, name in counters.dcp_skipped:
            log("WARN", f"Skipping line {index} ('{name}'): metric not enabled")
        self.counters = [c for c in counters.counters if c.name in READERS]
        skipped = [c.name for c in counters.counters if c.name not in READERS]
        if skipped:
            log(
                "WARN",
                "LAB STAND-IN: fields the simulated NVML cannot give are not simulated and not exported",
                fields=",".join(skipped),
            )
        if options.kubernetes:
            log(
                "WARN",
                "LAB STAND-IN: Kubernetes mode: the pod, namespace and container labels (the kubelet's "
                "pod-resources API) are not simulated",
            )
        self.nvml = _pynvml()
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            raise StartupError(f"Failed to initialize NVML: {exc}") from exc
        self.hostname = "" if options.no_hostname else (options.node_name or socket.gethostname())
        self.gpus = self._discover()

    def _discover(self) -> list[Gpu]:
        nvml = self.nvml
        gpus = []
        for index in _device_ids(self.options.devices, nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                model = nvml.nvmlDeviceGetName(handle)
                if self.options.replace_blanks_in_model_name:
                    model = "-".join(model.split())
                gpu = Gpu(
                    index,
                    nvml.nvmlDeviceGetUUID(handle),
                    nvml.nvmlDeviceGetPciInfo(handle).busId,
                    model,
                    handle,
                )
            except nvml.NVMLError as exc:
                self.log("WARN", "GPU not watched: NVML cannot read it", gpu=index, error=str(exc))
                continue
            gpus.append(gpu)
        self.log("INFO", "DCGM successfully initialized!", gpus=len(gpus))
        return gpus

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()

    def _read(self, gpu: Gpu) -> dict[str, Any]:
        nvml = self.nvml
        try:
            nvml.nvmlDeviceGetUUID(gpu.handle)
        except nvml.NVMLError_GpuIsLost:
            return self._lost()
        values: dict[str, Any] = {}
        for counter in self.counters:
            kind, reader = READERS[counter.name]
            try:
                values[counter.name] = (kind, reader(nvml, gpu.handle))
            except nvml.NVMLError_GpuIsLost:
                return self._lost()
            except nvml.NVMLError:
                continue  # blank in DCGM (not supported, no data): the real exporter skips the value
        return values

    def _lost(self) -> dict[str, Any]:
        """A GPU fallen off the bus: its last Xid (79) and the system's labels; DCGM has no other value."""
        values: dict[str, Any] = {}
        for counter in self.counters:
            if counter.name == "DCGM_FI_DEV_XID_ERRORS":
                values[counter.name] = (INT, 79)
            elif counter.name in ("DCGM_FI_DRIVER_VERSION", "DCGM_FI_NVML_VERSION"):
                with contextlib.suppress(self.nvml.NVMLError):
                    values[counter.name] = (STRING, READERS[counter.name][1](self.nvml, None))
        return values

    def _sampled(self) -> list[tuple[Gpu, dict[str, Any]]]:
        interval = self.options.collect_interval / 1000
        with self.lock:
            now = self.clock()
            if self.sampled_at is None or now - self.sampled_at >= interval:
                self.sample = [(gpu, self._read(gpu)) for gpu in self.gpus]
                self.sampled_at = now
            return self.sample

    def render(self) -> str:
        sample = self._sampled()
        out = []
        for counter in self.counters:
            if counter.prom_type == "label":
                continue
            lines = []
            for gpu, values in sample:
                if counter.name not in values:
                    continue
                kind, val = values[counter.name]
                text = f"{val:f}" if kind == DOUBLE else str(int(val)) if kind == INT else str(val)
                labels = [
                    f'gpu="{gpu.index}"',
                    f'UUID="{gpu.uuid}"',
                    f'pci_bus_id="{gpu.bus_id}"',
                    f'device="nvidia{gpu.index}"',
                    f'modelName="{gpu.model}"',
                ]
                if self.hostname:
                    labels.append(f'Hostname="{self.hostname}"')
                label_fields = sorted(
                    (c.name, values[c.name][1])
                    for c in self.counters
                    if c.prom_type == "label" and c.name in values
                )
                labels += [f'{name}="{v}"' for name, v in label_fields]
                if counter.name == "DCGM_FI_DEV_XID_ERRORS":
                    labels += [
                        f'err_code="{int(val)}"',
                        f'err_msg="{XID_TEXT.get(int(val), "Unknown Error")}"',
                    ]
                lines.append(f"{counter.name}{{{','.join(labels)}}} {text}")
            if lines:
                out.append(
                    f"# HELP {counter.name} {counter.help}\n# TYPE {counter.name} {counter.prom_type}\n"
                )
                out.append("".join(line + "\n" for line in lines))
        return "".join(out)


# ---------------------------------------------------------------------------------------------------
# HTTP: the routes of dcgm-exporter's metrics server
# ---------------------------------------------------------------------------------------------------
LANDING = (
    "<html>\n\t\t\t<head><title>GPU Exporter</title></head>\n\t\t\t<body>\n\t\t\t<h1>GPU Exporter</h1>\n"
    '\t\t\t<p><a href="./metrics">Metrics</a></p>\n\t\t\t</body>\n\t\t\t</html>'
)


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise StartupError(f"listen tcp {address}: address {address}: missing port in address")
    return host.strip("[]") or "0.0.0.0", int(port)


def make_server(exporter: Exporter) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        server_version = "dcgm-exporter-lab-standin"

        def _send(self, status: int, body: str, content_type: str = "text/plain; charset=utf-8") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    self._send(200, exporter.render())
                except Exception as exc:
                    exporter.log("ERROR", "Failed to gather metrics from collectors", error=str(exc))
                    self._send(500, "internal server error\n")
            elif path == "/health":
                self._send(200, "KO")  # what dcgm-exporter's Health handler writes, with 200
            elif path == "/":
                self._send(200, LANDING, "text/html; charset=utf-8")
            else:
                self._send(404, "404 page not found\n")

        do_HEAD = do_GET
        do_POST = do_GET

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the real exporter does not log requests

    host, port = _split_address(exporter.options.address)
    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise StartupError(f"listen tcp {exporter.options.address}: bind: {exc.strerror}") from exc
    server.daemon_threads = True
    return server


def main(argv: list[str]) -> int:
    try:
        options = parse_command_line(argv[1:], dict(os.environ))
    except UsageError as exc:
        if exc.from_command_line:
            print(f"Incorrect Usage: {exc}\n", file=sys.stderr)
            print(usage(), file=sys.stderr)
        Log("text")("ERROR", str(exc))
        return 1
    except NotSimulated as exc:
        Log("text")("ERROR", str(exc))
        return 1
    if options.help:
        print(usage())
        return 0
    if options.version:
        print(f"{APP_NAME} version {VERSION} (LAB STAND-IN)")
        return 0
    log = Log(options.log_format)
    log("INFO", "Starting dcgm-exporter", Version=VERSION)
    try:
        exporter = Exporter(options, log)
        server = make_server(exporter)
    except (CountersError, StartupError) as exc:
        log("ERROR", str(exc))
        return 1
    stop = threading.Event()

    def shutdown(signum: int, _frame: Any) -> None:
        log("INFO", "Received signal", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    log("INFO", "Listening on", address=f"{host}:{port}")
    stop.wait()
    log("INFO", "Shutting down gracefully...")
    server.shutdown()
    server.server_close()
    exporter.close()
    log("INFO", "Shutdown complete")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
