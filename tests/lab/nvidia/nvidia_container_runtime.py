#!/usr/bin/python3
"""nvidia-container-runtime LAB STAND-IN: what NVIDIA's runtime does to a container's OCI spec, for the
lab's simulated GPUs, then the real runc.

Installed by the lab mirror's nvidia-container-toolkit package as /usr/bin/nvidia-container-runtime, where
containerd's `nvidia` runtime handler (nvidia-ctk's drop-in: runc's options with BinaryName) runs it with
runc's command line. It runs on the node's python3 (3.10 on Ubuntu 22.04), standard library only, plus the
lab's fake pynvml (/usr/local/lib/fake-nvml) standing in for the driver's NVML, as the real runtime's
nvidia-container-cli enumerates GPUs through NVML.

As the real runtime (mode "auto", its default config):
* only `create` is changed (the bundle from --bundle/-b or the working directory, as runc finds it); every
  other command, and a create that asks for no GPU, execs runc with the same argv;
* NVIDIA_VISIBLE_DEVICES: unset or empty or `void` = no GPU (unset in a legacy CUDA image, CUDA_VERSION
  without NVIDIA_REQUIRE_CUDA, = `all`); `none` = the driver without GPUs; `all`; or a comma list of NVML
  indexes, GPU UUIDs (or UUID prefixes) and PCI bus ids, each resolved against NVML's enumeration as
  nvidia-container-cli does; precedence void > none > all. Only fully qualified CDI names (or cdi.k8s.io/
  annotations) select CDI mode;
* an unknown device, a missing or mismatched driver, a GPU fallen off the bus and an unmet
  NVIDIA_REQUIRE_* are refused with nvidia-container-cli's messages (legacy mode) before runc runs; the error
  goes to stderr and to runc's --log file, where containerd reads a runtime's error.

What "the driver" is in the lab, added to the spec as read-only bind mounts: the fake NVML's state directory
and its libnvidia-ml.so.1 (NVIDIA_DRIVER_CAPABILITIES with `utility`, the default); then /dev/nvidiactl,
/dev/nvidia-uvm(-tools) and the selected GPUs' /dev/nvidia<minor>, each only where it exists on the node (the
fake makes /dev/nvidiaN files only for processes it holds). Not simulated: CDI specs (every CDI device is
unresolvable, as on a node without `nvidia-ctk cdi generate`), the volume-mounts device list, MIG,
libraries other than NVML, and the visible GPUs' filtering of NVML inside the container (it sees the node's
state file, so every GPU).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Any

FAKE_NVML_DIR = "/usr/local/lib/fake-nvml"  # where the lab installs the fake pynvml on the nodes
DEV_ROOT = "/dev"
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
RUNC_ENV = "NVIDIA_CONTAINER_RUNTIME_RUNC"
RUNC_CANDIDATES = ("runc", "crun")  # the real config's nvidia-container-runtime.runtimes
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"  # modes.cdi.annotation-prefixes
CDI_DEFAULT_KIND = "nvidia.com/gpu"  # modes.cdi.default-kind
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # modes.cdi.spec-dirs
DEFAULT_CAPABILITIES = {"utility", "compute"}
CDI_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*=[A-Za-z0-9][A-Za-z0-9_.:-]*$")
PCI_BUS_ID = re.compile(r"^([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.0")
CONDITION = re.compile(r"^(cuda|driver|arch|brand)(>=|<=|!=|=|<|>)(\S+)$")
# libnvidia-container's names for the NVML brands the fake reports (nvmlBrandType_t)
BRANDS = {0: "unknown", 2: "tesla", 14: "nvidia"}
# nvidia-container-cli prints NVML's own error strings (nvmlErrorString), in lower case
NVML_ERRORS = {9: "driver not loaded", 15: "gpu is lost", 18: "driver/library version mismatch"}
READ_ONLY = ["rbind", "rprivate", "nosuid", "nodev", "ro"]
DEVICE_NODE = ["bind", "rprivate", "nosuid", "noexec"]


class Refused(Exception):
    """The runtime's refusal: printed, logged for containerd, exit status 1, runc never runs."""


# --- runc's command line ----------------------------------------------------------------------------------
def _is_bundle_flag(arg: str) -> bool:
    return arg.startswith("-") and arg.lstrip("-") in ("b", "bundle")


def has_create_subcommand(args: list[str]) -> bool:
    previous_was_bundle = False
    for arg in args:
        if not previous_was_bundle and _is_bundle_flag(arg):
            previous_was_bundle = True
            continue
        if not previous_was_bundle and arg == "create":
            return True
        previous_was_bundle = False
    return False


def bundle_dir(args: list[str]) -> str:
    bundle = ""
    i = 0
    while i < len(args):
        name, sep, value = args[i].partition("=")
        if _is_bundle_flag(name):
            if sep:
                bundle = value
            elif i + 1 < len(args):
                bundle = args[i + 1]
                i += 1
            else:
                raise Refused("error getting bundle dir from args: bundle option requires an argument")
        i += 1
    return bundle or os.getcwd()


def _log_target(args: list[str]) -> tuple[str, str]:
    """runc's --log file and --log-format, where the real runtime also writes its errors."""
    found = {"log": "", "log-format": "text"}
    i = 0
    while i < len(args):
        name, sep, value = args[i].partition("=")
        key = name.lstrip("-")
        if name.startswith("-") and key in found:
            if sep:
                found[key] = value
            elif i + 1 < len(args):
                found[key] = args[i + 1]
                i += 1
        i += 1
    return found["log"], found["log-format"]


def log_error(args: list[str], message: str) -> None:
    print(f"nvidia-container-runtime: {message}", file=sys.stderr)
    path, log_format = _log_target(args)
    if not path or path == os.devnull:
        return
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if log_format == "json":
        line = json.dumps({"level": "error", "msg": message, "time": now}, separators=(",", ":"))
    else:
        line = f'time="{now}" level=error msg={json.dumps(message)}'
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a", encoding="utf-8") as log:
            log.write(line + "\n")


def find_runc() -> str:
    override = os.environ.get(RUNC_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise Refused(f"error constructing low-level runtime: {RUNC_ENV}={override} is not an executable")
        return override
    for name in RUNC_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    raise Refused(
        "error constructing low-level runtime: no runtime binary found from candidate list: "
        f"[{' '.join(RUNC_CANDIDATES)}]"
    )


# --- what the container asks for ----------------------------------------------------------------------
def _environment(spec: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in (spec.get("process") or {}).get("env") or []:
        name, sep, value = str(entry).partition("=")
        if sep:
            env[name] = value
    return env


def _is_legacy_image(env: dict[str, str]) -> bool:
    return bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")


def visible_devices(env: dict[str, str]) -> list[str]:
    """["void"], ["none"], ["all"] or the requested device names."""
    if "NVIDIA_VISIBLE_DEVICES" not in env and _is_legacy_image(env):
        return ["all"]
    devices = [d.strip() for d in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not devices or "void" in devices:
        return ["void"]
    if "none" in devices:
        return ["none"]
    if "all" in devices:
        return ["all"]
    return devices


def _cdi_annotation_devices(spec: dict[str, Any]) -> list[str]:
    devices: list[str] = []
    for key, value in sorted((spec.get("annotations") or {}).items()):
        if not key.startswith(CDI_ANNOTATION_PREFIX):
            continue
        for device in str(value).split(","):
            if not CDI_NAME.match(device):
                raise Refused(
                    "failed to get required devices from OCI specification: failed to parse container "
                    f'annotations: invalid device name "{device}" in annotation "{key}"'
                )
            if device not in devices:
                devices.append(device)
    return devices


def _refuse_cdi(devices: list[str]) -> None:
    specs = [d for d in CDI_SPEC_DIRS if os.path.isdir(d) and os.listdir(d)]
    if specs:
        raise Refused(
            f"LAB STAND-IN: CDI specs ({', '.join(specs)}) are not simulated; use NVIDIA_VISIBLE_DEVICES"
        )
    raise Refused(
        "could not apply required modification to OCI specification: error modifying OCI spec: "
        f"failed to inject CDI devices: unresolvable CDI devices {', '.join(devices)}"
    )


# --- the driver: NVML, as nvidia-container-cli sees it ----------------------------------------------------
def _pynvml() -> Any:
    if FAKE_NVML_DIR not in sys.path:
        sys.path.append(FAKE_NVML_DIR)
    try:
        import pynvml
    except ImportError as exc:
        raise Refused(
            "nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: "
            "cannot open shared object file: no such file or directory"
        ) from exc
    return pynvml


def _nvml_error(stage: str, error: Exception) -> Refused:
    text = NVML_ERRORS.get(getattr(error, "value", -1), str(error).lower())
    return Refused(f"nvidia-container-cli: {stage} error: nvml error: {text}")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


class Driver:
    """NVML's view of the node: every GPU's index, UUID, PCI bus id, minor number, brand and arch."""

    def __init__(self) -> None:
        nvml = self.nvml = _pynvml()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as exc:
            raise Refused(
                "nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: "
                "cannot open shared object file: no such file or directory"
            ) from exc
        except nvml.NVMLError as exc:
            raise _nvml_error("initialization", exc) from exc
        try:
            self.driver_version = nvml.nvmlSystemGetDriverVersion()
            cuda = nvml.nvmlSystemGetCudaDriverVersion()
            self.cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
            self.gpus = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
                self.gpus.append(
                    {
                        "index": index,
                        "uuid": nvml.nvmlDeviceGetUUID(handle),
                        "bus_id": nvml.nvmlDeviceGetPciInfo(handle).busId.lower(),
                        "minor": nvml.nvmlDeviceGetMinorNumber(handle),
                        "brand": BRANDS.get(nvml.nvmlDeviceGetBrand(handle), "unknown"),
                        "arch": f"{major}.{minor}",
                    }
                )
        except nvml.NVMLError as exc:
            raise _nvml_error("detection", exc) from exc
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()

    def select(self, devices: list[str]) -> list[dict[str, Any]]:
        """nvidia-container-cli's device selection: every name must match a GPU NVML enumerates."""
        chosen: dict[int, dict[str, Any]] = {}
        for name in devices:
            if name.lower() == "all":
                chosen = {gpu["index"]: gpu for gpu in self.gpus}
                break
            match = None
            bus = PCI_BUS_ID.match(name)
            if name[:4].upper() == "GPU-" and len(name) > 4:
                match = next((g for g in self.gpus if g["uuid"].upper().startswith(name.upper())), None)
            elif bus:
                wanted = f"{int(bus[1], 16):08x}:{int(bus[2], 16):02x}:{int(bus[3], 16):02x}.0"
                match = next((g for g in self.gpus if g["bus_id"] == wanted), None)
            elif name.isdigit() and name.isascii() and int(name) < len(self.gpus):
                match = self.gpus[int(name)]
            if match is None:
                raise Refused(f"nvidia-container-cli: device error: {name}: unknown device")
            chosen[match["index"]] = match
        return [chosen[index] for index in sorted(chosen)]

    def check_requirements(self, env: dict[str, str], gpus: list[dict[str, Any]]) -> None:
        """NVIDIA_REQUIRE_*: each variable must hold; in one, space = or, comma = and."""
        disable = env.get("NVIDIA_DISABLE_REQUIRE", "").strip().lower()
        if disable in ("1", "t", "true"):
            return
        expressions = [
            value
            for name, value in sorted(env.items())
            if name.startswith("NVIDIA_REQUIRE_") and not name.startswith("NVIDIA_REQUIRE_JETPACK")
        ]
        if _is_legacy_image(env):
            expressions.append(f"cuda>={'.'.join(str(p) for p in _version(env['CUDA_VERSION'])[:2])}")
        for expression in expressions:
            alternatives = [alt.split(",") for alt in expression.split()]
            failed = [next((c for c in alt if not self._holds(c, gpus)), None) for alt in alternatives]
            if alternatives and all(failed):
                condition = str(failed[0])
                hint = (
                    ", please update your driver to a newer version, or use an earlier cuda container"
                    if condition.startswith("cuda")
                    else ""
                )
                raise Refused(
                    f"nvidia-container-cli: requirement error: unsatisfied condition: {condition}{hint}"
                )

    def _holds(self, condition: str, gpus: list[dict[str, Any]]) -> bool:
        parsed = CONDITION.match(condition)
        if parsed is None:
            raise Refused(f"nvidia-container-cli: requirement error: invalid expression: {condition}")
        name, op, wanted = parsed.groups()
        if name in ("cuda", "driver"):
            return _compare(
                _version(self.cuda_version if name == "cuda" else self.driver_version), op, wanted
            )
        if name == "arch":
            return all(_compare(_version(gpu["arch"]), op, wanted) for gpu in gpus)
        if op not in ("=", "!="):
            raise Refused(f"nvidia-container-cli: requirement error: invalid expression: {condition}")
        return all((gpu["brand"] == wanted.lower()) == (op == "=") for gpu in gpus)


def _compare(have: tuple[int, ...], op: str, wanted: str) -> bool:
    want = _version(wanted)
    width = max(len(have), len(want))
    a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    return {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


# --- the spec ----------------------------------------------------------------------------------------------
def _bind(source: str, destination: str, options: list[str]) -> dict[str, Any]:
    return {"destination": destination, "type": "bind", "source": source, "options": list(options)}


def driver_mounts(env: dict[str, str], gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    nvml = _pynvml()
    capabilities = {c.strip() for c in env.get("NVIDIA_DRIVER_CAPABILITIES", "").split(",") if c.strip()}
    capabilities = capabilities or DEFAULT_CAPABILITIES
    mounts = []
    if "utility" in capabilities or "all" in capabilities:
        # NVML is the utility capability's library; in the lab the "kernel driver" behind it is the state file
        state_dir = os.path.dirname(os.path.abspath(nvml._state_path()))
        mounts.append(_bind(state_dir, os.path.dirname(nvml._DEFAULT_STATE), READ_ONLY))
        mounts.append(_bind(nvml._library_path(), nvml._DEFAULT_LIBRARY, READ_ONLY))
    nodes = [*CONTROL_DEVICES, *(f"nvidia{gpu['minor']}" for gpu in gpus)]
    for name in nodes:
        path = os.path.join(DEV_ROOT, name)
        if os.path.exists(path):
            mounts.append(_bind(path, f"/dev/{name}", DEVICE_NODE))
    return mounts


def _write_atomically(path: str, spec: dict[str, Any]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    mode = os.stat(path).st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=".config.json.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(spec, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def modify_spec(config_path: str) -> None:
    """Add the driver and the requested GPUs to the bundle's config.json; refuse what the real one refuses."""
    try:
        with open(config_path, encoding="utf-8") as f:
            spec = json.load(f)
    except (OSError, ValueError) as exc:
        raise Refused(f"error loading OCI specification: failed to load OCI spec: {exc}") from exc
    env = _environment(spec)
    cdi_devices = _cdi_annotation_devices(spec)
    devices = visible_devices(env)
    if cdi_devices:
        _refuse_cdi(cdi_devices)
    if devices != ["void"] and all(CDI_NAME.match(d) for d in devices):
        _refuse_cdi(devices)
    if devices == ["void"]:
        return
    driver = Driver()
    gpus = [] if devices == ["none"] else driver.select(devices)
    driver.check_requirements(env, gpus)
    mounts = spec.setdefault("mounts", [])
    present = {m.get("destination") for m in mounts}
    added = [m for m in driver_mounts(env, gpus) if m["destination"] not in present]
    if added:
        mounts.extend(added)
        _write_atomically(config_path, spec)


def main(argv: list[str]) -> int:
    args = argv[1:]
    try:
        if has_create_subcommand(args):
            modify_spec(os.path.join(bundle_dir(args), "config.json"))
        runc = find_runc()
    except Refused as exc:
        log_error(args, str(exc))
        return 1
    os.execv(runc, [runc, *args])
    return 1  # not reached: execv replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv))
