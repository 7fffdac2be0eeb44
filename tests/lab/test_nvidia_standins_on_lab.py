"""The lab's two NVIDIA stand-ins (tests/lab/nvidia) under the real kubelet, containerd and runc.

    flock /tmp/lab.lock .venv/bin/pytest -m lab tests/lab/test_nvidia_standins_on_lab.py -v

nvidia-container-runtime: a pod in RuntimeClass nvidia that asks for one nvidia.com/gpu gets the fake driver
(the NVML state and library) and sees NVML through it; one that names a GPU the node does not have never
starts, and its status carries nvidia-container-cli's message. dcgm-exporter: on every GPU node its pod serves
the node's simulated GPUs with the real label set, and a fault injected with fake-nvml reaches its metrics
within the collect interval. Runs after the serving stage (the exporter, the device plugin); the probe pods
run the exporter's image, which has python3 and the fake pynvml.
"""

from __future__ import annotations

import json
import time
import tomllib
from typing import Any

import pytest
import yaml
from labrun import NODES, ROOT, on_node, pinned_image, playbook, running_nodes

pytestmark = pytest.mark.lab

DEFAULTS = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
PLUGIN = yaml.safe_load((ROOT / "roles/nvidia_device_plugin/defaults/main.yml").read_text())
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
NAMESPACE = DEFAULTS["monitoring_namespace"]
IMAGE = f"nvcr.io/nvidia/k8s/dcgm-exporter:{DEFAULTS['monitoring_dcgm_exporter_version']}-distroless"


# The probe runs in the dcgm-exporter stand-in image with the image's own NVML binding (tests/lab/images.py
# puts it beside the exporter, as an application carries its binding); the runtime gives it the driver: the
# fake NVML's state and library, which is what nvmlInit and the driver version read.
PROBE = (
    "import sys; sys.path.insert(0, '/usr/local/lib/dcgm-exporter'); "
    "import json, os, pynvml; pynvml.nvmlInit(); "
    "print(json.dumps({'visible': os.environ.get('NVIDIA_VISIBLE_DEVICES'), "
    "'state': os.path.exists('/var/lib/fake-nvml/state.json'), "
    "'count': pynvml.nvmlDeviceGetCount(), 'driver': pynvml.nvmlSystemGetDriverVersion()}))"
)
METRICS = (
    "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9400/metrics').read().decode())"
)


def kubectl(args: str, stdin: str | None = None, timeout: int = 180) -> Any:
    command = f"{KUBECTL} {args}" if stdin is None else f"{KUBECTL} {args} <<'EOF'\n{stdin}\nEOF"
    return on_node("gpu-node-1", command, timeout=timeout)


def kubectl_json(args: str) -> dict[str, Any]:
    result = kubectl(f"{args} -o json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def probe_pod(name: str, env: dict[str, str], gpus: int) -> str:
    limits = {"nvidia.com/gpu": gpus} if gpus else {}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "runtimeClassName": PLUGIN["nvidia_device_plugin_runtime_class"],
            "nodeSelector": PLUGIN["nvidia_device_plugin_node_label"],
            "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "probe",
                    "image": pinned_image(IMAGE),
                    "command": ["python3", "-c", PROBE],
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                    "resources": {"limits": limits},
                }
            ],
        },
    }
    return json.dumps(pod)


@pytest.fixture(scope="module")
def converged() -> None:
    if "gpu-node-1" not in running_nodes():
        pytest.skip("the lab is not running (make lab-up)")
    if on_node("gpu-node-1", "test -s /etc/kubernetes/admin.conf").returncode != 0:
        pytest.fail("no cluster on gpu-node-1: converge the Kubernetes stage first (make lab)")
    if kubectl(f"-n {NAMESPACE} get daemonset dcgm-exporter").returncode != 0:
        run = playbook("playbooks/serving.yml", timeout=900)
        assert run.rc == 0, f"serving.yml failed (rc {run.rc}):\n{run.tail()}"


@pytest.fixture
def pods() -> Any:
    made: list[str] = []
    yield made
    for name in made:
        kubectl(f"-n default delete pod {name} --ignore-not-found --wait=false")


def test_the_runtime_is_the_stand_in_containerd_runs(converged: None) -> None:
    for node in NODES:  # the GPU nodes (running_nodes() lists the mirror too)
        binary = on_node(node, "head -c 2000 /usr/bin/nvidia-container-runtime")
        assert "nvidia-container-runtime LAB STAND-IN" in binary.stdout, (node, binary.stderr)
        dump = tomllib.loads(on_node(node, "containerd config dump").stdout)
        cri = dump["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]  # containerd 2's
        assert cri["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime", (node, cri)


def test_a_gpu_pod_gets_the_driver_and_its_gpu(converged: None, pods: list[str]) -> None:
    pods.append("nvidia-standin-probe")
    created = kubectl("apply -f -", stdin=probe_pod("nvidia-standin-probe", {}, gpus=1))
    assert created.returncode == 0, created.stderr
    done = kubectl(
        "-n default wait --for=jsonpath='{.status.phase}'=Succeeded pod/nvidia-standin-probe --timeout=180s",
        timeout=240,
    )
    assert done.returncode == 0, kubectl("-n default describe pod nvidia-standin-probe").stdout
    seen = json.loads(kubectl("-n default logs nvidia-standin-probe").stdout)
    node = kubectl_json("-n default get pod nvidia-standin-probe")["spec"]["nodeName"]
    state = json.loads(on_node(node, "fake-nvml show --json").stdout)
    uuids = {g["uuid"] for g in state["gpus"]}
    # the device plugin's Allocate named one GPU of that node (its UUID); the runtime gave the fake driver
    assert seen["visible"] in uuids, seen
    assert seen["state"] is True
    assert seen["driver"] == state["kernel_module_version"]


def test_a_gpu_the_node_lacks_is_refused_by_the_runtime(converged: None, pods: list[str]) -> None:
    pods.append("nvidia-standin-bad-device")
    pod = probe_pod("nvidia-standin-bad-device", {"NVIDIA_VISIBLE_DEVICES": "7"}, gpus=0)
    created = kubectl("apply -f -", stdin=pod)
    assert created.returncode == 0, created.stderr
    deadline = time.monotonic() + 120
    message = ""
    while time.monotonic() < deadline:
        status = kubectl_json("-n default get pod nvidia-standin-bad-device")["status"]
        for container in status.get("containerStatuses") or []:
            state = container.get("state", {})
            message = json.dumps(state)
        if "device error: 7: unknown device" in message:
            break
        time.sleep(3)
    assert "nvidia-container-cli: device error: 7: unknown device" in message, message
    events = kubectl("-n default get events --field-selector involvedObject.name=nvidia-standin-bad-device")
    assert "unknown device" in events.stdout


def exporter_metrics() -> dict[str, str]:
    pods = kubectl_json(f"-n {NAMESPACE} get pods -l app.kubernetes.io/name=dcgm-exporter")["items"]
    assert pods, "no dcgm-exporter pod"
    metrics = {}
    for pod in pods:
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        got = kubectl(f'-n {NAMESPACE} exec {name} -- python3 -c "{METRICS}"')
        assert got.returncode == 0, (name, got.stderr)
        metrics[node] = got.stdout
    return metrics


def test_dcgm_exporter_serves_each_nodes_simulated_gpus(converged: None) -> None:
    for node, text in exporter_metrics().items():
        state = json.loads(on_node(node, "fake-nvml show --json").stdout)
        temps = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
        assert len(temps) == len(state["gpus"]), (node, temps)
        for gpu, line in zip(state["gpus"], temps, strict=True):
            assert f'UUID="{gpu["uuid"]}"' in line
            assert f'Hostname="{node}"' in line
            assert f'DCGM_FI_DRIVER_VERSION="{state["kernel_module_version"]}"' in line
            assert line.endswith(f" {gpu['temperature']['gpu']}")


def test_a_fault_reaches_the_exporter_within_its_collect_interval(converged: None) -> None:
    node = "gpu-node-2"
    saved = on_node(node, "fake-nvml show --json").stdout
    assert saved.strip().startswith("{")
    expected = f" {json.loads(saved)['gpus'][0]['ecc']['volatile']['corrected'] + 3}"
    # corrected errors under the health threshold: the GPU health agent does not cordon for them
    assert on_node(node, "fake-nvml ecc --gpu 0 --corrected 3").returncode == 0
    try:
        deadline = time.monotonic() + 45  # 30 s collect interval (the manifest keeps the default)
        line = ""
        while time.monotonic() < deadline:
            text = exporter_metrics()[node]
            line = next(
                (x for x in text.splitlines() if x.startswith('DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="0"')), ""
            )
            if line.endswith(expected):
                break
            time.sleep(5)
        assert line.endswith(expected), line
    finally:
        restored = on_node(node, f"fake-nvml load - <<'EOF'\n{saved}\nEOF")
        assert restored.returncode == 0, restored.stderr
