"""Does CoreDNS's PodDisruptionBudget keep cluster DNS answering through a drain? A measurement on the lab's
real cluster (docs/benchmarks.md), not part of make test: it drains a node twice.

    flock /tmp/lab.lock .venv/bin/python tests/lab/measure_coredns_drain.py [--uncached]

kubeadm deploys CoreDNS with two replicas and a preferred anti-affinity only, and on a fresh lab both often
land on one worker. Each round puts both replicas on one worker (the others cordoned while the Deployment
restarts), then drains that worker as an upgrade does (`kubectl drain`, which honours PodDisruptionBudgets)
while a gateway pod on another node resolves the model's Service name every 0.2 s (getaddrinfo, through the
pod's resolv.conf: kube-dns's ClusterIP) and a client sends chat completions (tests/lab/traffic.py). First
without the budget (deleted), then with it (put back as the role applied it). Afterwards everything is put
back: the budget there, every node schedulable. With --uncached, the CoreDNS image is first removed from the
nodes the replacements will start on, as after an upgrade to a new CoreDNS.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import yaml  # noqa: E402
from labrun import ADMIN_KUBECTL, NODES, ROOT, env, kube_json, on_node, wait_for  # noqa: E402
from traffic import MODEL, Traffic  # noqa: E402

CONTROL_PLANE = NODES[0]
SERVING = yaml.safe_load((ROOT / "roles/vllm_serving/defaults/main.yml").read_text())[
    "vllm_serving_namespace"
]
NAME = f"{MODEL['name']}.{SERVING}.svc"  # what the gateway resolves for each new upstream connection
PROBE_S = 0.2
SETTLE_S = 30  # resolving on after the drain: the new replicas' first seconds
PROBE = f"""
import socket, sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    began = time.monotonic()
    try:
        socket.getaddrinfo({NAME!r}, 8000)
        ok = 1
    except OSError as error:
        ok = 0
    print(f"{{time.time():.1f}} {{ok}} {{time.monotonic() - began:.2f}}", flush=True)
    time.sleep({PROBE_S})
"""


def kubectl(args: str, timeout: int = 300) -> str:
    done = on_node(CONTROL_PLANE, f"{ADMIN_KUBECTL} {args}", timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"kubectl {args}: {done.stdout}{done.stderr}")
    return done.stdout


def coredns_nodes() -> list[str]:
    pods = kube_json("-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-dns")["items"]
    return sorted(p["spec"].get("nodeName", "-") for p in pods if not p["metadata"].get("deletionTimestamp"))


def both_on(worker: str) -> None:
    """Both CoreDNS replicas on WORKER: the other nodes cordoned while the Deployment restarts."""
    others = [n for n in NODES if n != worker]
    for node in others:
        kubectl(f"cordon {node}")
    try:
        kubectl("-n kube-system rollout restart deployment coredns")
        kubectl("-n kube-system rollout status deployment coredns --timeout=300s", timeout=320)
    finally:
        for node in others:
            kubectl(f"uncordon {node}")
    wait_for(f"both CoreDNS replicas on {worker}", lambda: coredns_nodes() == [worker, worker], 120)


def probe_pod(avoid: str) -> str:
    pods = kube_json("-n", SERVING, "get", "pods", "-l", "app.kubernetes.io/name=llm-gateway")["items"]
    ready = [
        p["metadata"]["name"]
        for p in pods
        if p["spec"].get("nodeName") != avoid and p["status"].get("phase") == "Running"
    ]
    if not ready:
        raise SystemExit(f"no running gateway pod off {avoid}")
    return ready[0]


def forget_coredns_image(worker: str) -> None:
    """The CoreDNS image removed from every node but WORKER, so a replacement has to pull it first, as after
    `kubeadm upgrade apply` brought a new CoreDNS that only the nodes running it have pulled."""
    deployment = kube_json("-n", "kube-system", "get", "deployment", "coredns")
    image = deployment["spec"]["template"]["spec"]["containers"][0]
    for node in NODES:
        if node != worker:
            on_node(node, f"crictl rmi {shlex.quote(image['image'])}")


def drain_round(worker: str, budget: bool, uncached: bool) -> dict[str, Any]:
    both_on(worker)
    if uncached:
        forget_coredns_image(worker)
    pod = probe_pod(worker)
    seconds = 600
    probe = subprocess.Popen(
        [
            "podman", "exec", CONTROL_PLANE, "sh", "-c",
            f"{ADMIN_KUBECTL} -n {SERVING} exec {pod} -- python3 -c {shlex.quote(PROBE)} {seconds}",
        ],
        stdout=subprocess.PIPE, text=True, env=env(),
    )  # fmt: skip
    lines: list[str] = []
    out = probe.stdout
    assert out is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(out.readline, "")), daemon=True)
    reader.start()
    time.sleep(5)
    began = time.monotonic()
    with Traffic(f"coredns-drain-{'with' if budget else 'without'}-budget") as traffic:
        kubectl(f"drain {worker} --ignore-daemonsets --delete-emptydir-data --timeout=600s", timeout=620)
        drained = time.monotonic() - began
        time.sleep(SETTLE_S)
    probe.terminate()
    probe.wait(10)
    reader.join(5)
    kubectl(f"uncordon {worker}")
    results = [line.split() for line in lines if line.count(" ") == 2]
    failed = [r for r in results if r[1] == "0"]
    return {
        "budget": budget,
        "image_cached_elsewhere": not uncached,
        "worker": worker,
        "drain_s": round(drained),
        "resolutions": len(results),
        "failed": len(failed),
        "failed_span_s": round(float(failed[-1][0]) - float(failed[0][0]), 1) if failed else 0,
        "slowest_s": max((float(r[2]) for r in results), default=0),
        "chat_sent": traffic.sent,
        "chat_failed": len(traffic.failures),
        "chat_failures": traffic.failures[:10],
        "coredns_after": coredns_nodes(),
    }


def main() -> int:
    uncached = "--uncached" in sys.argv[1:]
    worker = NODES[2]
    saved = kube_json("-n", "kube-system", "get", "poddisruptionbudget", "coredns")
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        saved["metadata"].pop(key, None)
    saved.pop("status", None)
    results = []
    try:
        kubectl("-n kube-system delete poddisruptionbudget coredns")
        results.append(drain_round(worker, budget=False, uncached=uncached))
        print(json.dumps(results[-1]), flush=True)
    finally:
        put_back(saved)
    try:
        results.append(drain_round(worker, budget=True, uncached=uncached))
        print(json.dumps(results[-1]), flush=True)
    finally:
        put_back(saved)
    return 0


def put_back(budget: dict[str, Any]) -> None:
    """The budget as the role applied it, every node schedulable."""
    have = on_node(CONTROL_PLANE, f"{ADMIN_KUBECTL} -n kube-system get poddisruptionbudget coredns")
    if have.returncode != 0:
        made = on_node(CONTROL_PLANE, f"{ADMIN_KUBECTL} create -f - <<'EOF'\n{json.dumps(budget)}\nEOF")
        if made.returncode != 0:
            raise SystemExit(f"the CoreDNS budget could not be put back: {made.stderr}")
    for node in NODES:
        on_node(CONTROL_PLANE, f"{ADMIN_KUBECTL} uncordon {node}")


if __name__ == "__main__":
    raise SystemExit(main())
