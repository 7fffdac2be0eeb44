"""Lab faults for the kubelet stand-in: ``kube-standin-fault`` on a node.

From the host: ``scripts/lab-fault NODE kube ...``.

The kubelet stand-in reads the faults file (/run/kube-standin/faults.json) on every loop (2 s):

  not-ready                  the kubelet reports Ready=False (KubeletNotReady: CNI not initialised)
  stop-heartbeat             the kubelet stops posting node status and renewing its Lease (a hung kubelet;
                             the Node turns Unknown only if the API server's node lifecycle controller runs)
  device-plugin-unregistered the device plugin Pods running now lose their registration: nvidia.com/gpu
                             allocatable 0 while they keep running Ready; a new plugin Pod (delete the
                             old one, its DaemonSet makes another) registers again
  crashloop --pod NAME | --selector K=V [--namespace NS]
                             matching Pods crash-loop (CrashLoopBackOff, restartCount grows, not Ready)
  clear [FAULT]              remove one fault (not-ready, stop-heartbeat, device-plugin-unregistered,
                             crashloop) or all of them
  show                       print the faults in force
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

from .kubelet import FAULTS_FILE, read_faults

FLAGS = {
    "not-ready": "not_ready",
    "stop-heartbeat": "stop_heartbeat",
    "device-plugin-unregistered": "device_plugin_unregistered",
}


def write(faults: dict[str, Any]) -> None:
    directory = os.path.dirname(FAULTS_FILE)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".faults-", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(faults, f, indent=2, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, FAULTS_FILE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kube-standin-fault", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in FLAGS:
        sub.add_parser(name)
    crash = sub.add_parser("crashloop")
    target = crash.add_mutually_exclusive_group(required=True)
    target.add_argument("--pod")
    target.add_argument("--selector")
    crash.add_argument("--namespace")
    clear = sub.add_parser("clear")
    clear.add_argument("fault", nargs="?", choices=[*FLAGS, "crashloop"])
    sub.add_parser("show")
    args = parser.parse_args(argv)
    faults = read_faults()
    if args.command in FLAGS:
        faults[FLAGS[args.command]] = True
    elif args.command == "crashloop":
        rule = {
            k: v
            for k, v in (("pod", args.pod), ("selector", args.selector), ("namespace", args.namespace))
            if v
        }
        faults.setdefault("crashloop", [])
        if rule not in faults["crashloop"]:
            faults["crashloop"].append(rule)
    elif args.command == "clear":
        if args.fault is None:
            faults = {}
        else:
            faults.pop(FLAGS.get(args.fault, args.fault), None)
    if args.command != "show":
        write(faults)
    print(json.dumps(faults, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
