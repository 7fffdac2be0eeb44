"""GPU health agent: a small service on every GPU node (role gpu_health_agent).

Every ``poll_interval`` seconds (sooner when NVML reports an Xid or a double-bit ECC event, where the
driver supports events) it reads the GPUs through NVML and the Xids the driver wrote to the kernel log since
the last reading, judges them with the rules of ``gpu_health`` (module_utils/gpu_node_health.py: one
implementation; the Xid table is module_utils/gpu_xid.py), serves the verdicts and actions as Prometheus
metrics, and acts on the node's action:

* an action that takes the node out of service (drain_p2p, reset_gpu, drain_and_reset, reboot_node, repair):
  it cordons the node (spec.unschedulable) within the circuit breaker, annotates it (reason codes, GPUs,
  time, the action and the playbook that carries it out), writes the reason to its journal (the node's log)
  and posts a Node Event;
* a notice (restart_app: the application that hit a contained error restarts; reset_at_drain_window: a
  pending row remap waits for the next reset): the notice annotation and a Node Event, once per new finding
  (the last one is kept in its state directory, so a restart does not repeat it); the node stays in service;
* none (an application's own Xid): metrics only.

It never uncordons, resets or reboots: a human runs playbooks/remediate/uncordon.yml, gpu-reset.yml or
node-reboot.yml. Its token may get, list and patch nodes, read and update its Lease and create Events in
namespace default, nothing else.

The circuit breaker (module_utils/gpu_breaker.py) is shared by all agents and ecc-cordon.yml through one
coordination.k8s.io Lease: an agent takes the Lease (optimistic concurrency on resourceVersion), lists the
GPU nodes, applies the rule, cordons or holds back, and gives the Lease back; so three agents seeing faults
at once decide one after the other, and the second sees the first's cordon. Held back: it logs, exposes
``gpu_health_agent_breaker_held_back 1`` naming itself, and names itself (with why) in the Lease's
held-back annotation until it is cordoned or healthy again.

It talks to the API with its ServiceAccount token (a file) and the cluster CA over plain
``http.client``; stdlib + pynvml only, so it runs in the nvidia-ml-py venv of role nvidia_driver. The role
installs this file and the module_utils it imports into one directory that is put on PYTHONPATH as the
namespace package ``ansible.module_utils`` (the way gpu_tuning's boot script finds them), and the unit runs
``python3 -m ansible.module_utils.gpu_health_agent --config FILE``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import logging
import os
import signal
import ssl
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType
from typing import Any

from ansible.module_utils.gpu_breaker import (
    CORDON_ANNOTATION,
    DEFAULT_MAX_CORDONED_PERCENT,
    HISTORY_ANNOTATION,
    NOTICE_ANNOTATION,
    cordon_record,
    history_with,
    lease_live_holder,
    lease_released,
    lease_taken,
    plan,
)
from ansible.module_utils.gpu_health_rules import DEGRADED, HEALTHY, UNHEALTHY
from ansible.module_utils.gpu_kernel_log import (
    DEFAULT_KERNEL_LOG,
    KernelLog,
    load_cleared,
    read_boot_scoped,
    uncleared,
    write_boot_scoped,
)
from ansible.module_utils.gpu_node_health import assess_node
from ansible.module_utils.gpu_xid import ACTIONS, NONE, XidEvent, cordons, notifies

LOG = logging.getLogger("gpu-health-agent")
AGENT = "gpu-health-agent"
VERDICTS = (HEALTHY, DEGRADED, UNHEALTHY)
# NVML event types (nvmlEventType*): the ones that mean a GPU may have just failed
NVML_EVENT_DOUBLE_BIT_ECC = 0x2
NVML_EVENT_XID_CRITICAL = 0x8
NVML_ERROR_TIMEOUT = 10
# Node Events: namespace (a cluster-scoped object's events live in default) and reason per action
EVENTS_NAMESPACE = "default"
EVENT_REASONS = {
    "restart_app": "GPUApplicationRestart",
    "reset_at_drain_window": "GPUResetAtNextDrain",
    "drain_p2p": "GPUDrainPeerToPeer",
    "reset_gpu": "GPUResetNeeded",
    "drain_and_reset": "GPUDrainAndReset",
    "reboot_node": "GPUNodeRebootNeeded",
    "repair": "GPURepairNeeded",
}
XIDS_KEPT = 2000  # Xids read since the agent started (those a reset has not cleared), at most


# --------------------------------------------------------------------------------------------- config


@dataclass
class Config:
    node_name: str
    api_server: str
    ca_file: str
    token_file: str
    lease_namespace: str
    lease_name: str
    gpu_node_selector: str = ""
    max_cordoned_percent: int = DEFAULT_MAX_CORDONED_PERCENT
    poll_interval: float = 5.0
    expected_gpu_count: int | None = None
    corrected_errors_threshold: int | None = None
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 9445
    lease_duration: int = 15
    dry_run: bool = False
    # where the Xids are read (module_utils/gpu_kernel_log.py) and where the last notice is kept
    kernel_log: str = DEFAULT_KERNEL_LOG
    state_dir: str = "/var/lib/gpu-health-agent"

    @classmethod
    def load(cls, path: str) -> Config:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}")
        missing = [
            n
            for n in ("node_name", "api_server", "ca_file", "token_file", "lease_namespace", "lease_name")
            if not raw.get(n)
        ]
        if missing:
            raise ValueError(f"{path}: missing setting(s) {', '.join(missing)}")
        return cls(**raw)


# ------------------------------------------------------------------------------------------ NVML side


def assess(
    nvml: ModuleType,
    expected_gpu_count: int | None,
    threshold: int | None,
    xids: list[XidEvent] | None = None,
    now_usec: int | None = None,
    kernel_log_error: str | None = None,
) -> dict[str, Any]:
    """The node's verdict and action exactly as the gpu_health module computes them (gpu_node_health)."""
    return assess_node(nvml, expected_gpu_count, threshold, xids or [], now_usec, kernel_log_error)


class XidWatch:
    """The Xids of the kernel log, read incrementally; those a GPU reset cleared are dropped. ``now_usec()``
    is the log's own clock now (the last record's time plus the time since it was read), against which a
    burst still waiting for its containment Xid is measured."""

    def __init__(self, path: str) -> None:
        self.log = KernelLog(path) if path else None
        self.events: list[XidEvent] = []
        self.error: str | None = None
        self.read_total = 0
        self._last_usec: int | None = None
        self._read_at = 0.0

    def read(self) -> list[XidEvent]:
        if self.log is None:
            return []
        try:
            new = self.log.read_new()
            self.error = None
        except OSError as exc:
            self.error = f"{self.log.path}: {exc.strerror or exc}"
            return []
        if self.log.restarted:  # a new boot's log (the lab's reboot): the Xids read before are gone
            self.events, self.log.restarted = [], False
        self.read_total += len(new)
        for event in new:
            LOG.warning("kernel log: %s (%s, action %s)", event.text, event.rule.mnemonic, event.rule.action)
            if event.usec is not None:
                self._last_usec, self._read_at = event.usec, time.monotonic()
        self.events = uncleared([*self.events, *new][-XIDS_KEPT:], load_cleared())
        return new

    def now_usec(self) -> int | None:
        if self._last_usec is None:
            return None
        return self._last_usec + int((time.monotonic() - self._read_at) * 1_000_000)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


class NvmlEvents:
    """Xid and double-bit ECC events, where the driver (and the bindings) support them.

    ``wait(seconds)`` returns early when such an event arrives; without event support it just sleeps.
    """

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.event_set: Any = None
        self.supported = False
        self.initialised = False

    def open(self) -> None:
        nvml = self.nvml
        needed = ("nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2", "nvmlEventSetFree")
        if not all(hasattr(nvml, name) for name in needed):
            LOG.info("NVML events: not in these bindings; polling only")
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            LOG.warning("NVML events: NVML does not start (%s); polling only", exc)
            return
        self.initialised = True
        try:
            self.event_set = nvml.nvmlEventSetCreate()
            registered = 0
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                try:
                    wanted = NVML_EVENT_XID_CRITICAL | NVML_EVENT_DOUBLE_BIT_ECC
                    if hasattr(nvml, "nvmlDeviceGetSupportedEventTypes"):
                        wanted &= nvml.nvmlDeviceGetSupportedEventTypes(handle)
                    if not wanted:
                        LOG.info("NVML events: GPU %d supports neither Xid nor double-bit ECC events", index)
                        continue
                    nvml.nvmlDeviceRegisterEvents(handle, wanted, self.event_set)
                    registered += 1
                except nvml.NVMLError as exc:
                    LOG.info("NVML events: GPU %d: %s", index, exc)
            self.supported = registered > 0
            LOG.info("NVML events: Xid/double-bit ECC events on %d GPU(s)", registered)
        except nvml.NVMLError as exc:
            LOG.info("NVML events unavailable (%s); polling only", exc)
        if not self.supported:
            self.close()

    def wait(self, seconds: float, stop: threading.Event) -> str | None:
        """Sleep up to ``seconds``; return a description of the event that cut it short, if any."""
        if not self.supported:
            stop.wait(seconds)
            return None
        try:
            data = self.nvml.nvmlEventSetWait_v2(self.event_set, int(seconds * 1000))
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) != NVML_ERROR_TIMEOUT:
                LOG.warning("NVML event wait failed (%s): polling only from now on", exc)
                self.close()
            return None
        return f"NVML event type {getattr(data, 'eventType', '?')} data {getattr(data, 'eventData', '?')}"

    def close(self) -> None:
        if self.event_set is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlEventSetFree(self.event_set)
            self.event_set = None
        if self.initialised:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()
            self.initialised = False
        self.supported = False


# ------------------------------------------------------------------------------------------- API side


class ApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:300]}")
        self.status = status


class KubeApi:
    """The few REST calls the agent makes, with its ServiceAccount token (re-read on every call, so a
    rotated token file is picked up)."""

    def __init__(self, server: str, ca_file: str, token_file: str, timeout: float = 10) -> None:
        url = urllib.parse.urlsplit(server)
        if url.scheme != "https" or not url.hostname:
            raise ValueError(f"api_server must be an https:// URL, got {server!r}")
        self.host = url.hostname
        self.port = url.port or 443
        self.context = ssl.create_default_context(cafile=ca_file)
        self.token_file = token_file
        self.timeout = timeout

    def _token(self) -> str:
        with open(self.token_file, encoding="utf-8") as f:
            return f.read().strip()

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        headers = {"Accept": "application/json", "Authorization": f"Bearer {self._token()}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=self.timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read().decode("utf-8", "replace")
        finally:
            conn.close()
        if response.status >= 300:
            raise ApiError(response.status, method, path, raw)
        return json.loads(raw) if raw else None


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def rfc3339(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class BreakerLease:
    """Mutual exclusion among the agents over one Lease; taken and given back around each decision."""

    def __init__(self, api: KubeApi, namespace: str, name: str, holder: str, duration: int) -> None:
        self.api = api
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.holder = holder
        self.duration = duration
        self.lease: dict[str, Any] | None = None

    def acquire(self) -> bool:
        lease = self.api.request("GET", self.path)
        moment = now_utc()
        holder = lease_live_holder(lease, self.holder, moment)
        if holder:
            LOG.info("breaker Lease held by %s: deciding on the next poll", holder)
            return False
        try:
            taken = lease_taken(lease, self.holder, self.duration, moment)
            self.lease = self.api.request("PUT", self.path, taken)
        except ApiError as exc:
            if exc.status == 409:  # another agent took it between our GET and PUT
                LOG.info("breaker Lease taken by another agent: deciding on the next poll")
                return False
            raise
        return True

    def release(self, held_back: dict[str, str | None] | None = None) -> None:
        """Give the Lease back; ``held_back``: this node's entry in the held-back annotation (why, or None
        to drop it)."""
        if self.lease is None:
            return
        lease, self.lease = self.lease, None
        try:
            self.api.request("PUT", self.path, lease_released(lease, held_back or {}, AGENT, now_utc()))
        except ApiError as exc:  # it expires after leaseDurationSeconds anyway
            LOG.warning("could not give the breaker Lease back (%s); it expires in %ss", exc, self.duration)


# ---------------------------------------------------------------------------------------------- agent


@dataclass
class State:
    health: dict[str, Any] = field(default_factory=lambda: {"verdict": HEALTHY, "reasons": [], "gpus": []})
    polls: int = 0
    poll_errors: int = 0
    api_errors: int = 0
    last_poll: float = 0.0
    cordoned: bool = False
    cordoned_at: float = 0.0
    held_back: str = ""
    notices: int = 0
    xids_seen: dict[int, int] = field(default_factory=dict)


class Agent:
    def __init__(self, config: Config, nvml: ModuleType, api: KubeApi) -> None:
        self.config = config
        self.nvml = nvml
        self.api = api
        self.state = State()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.lease = BreakerLease(
            api, config.lease_namespace, config.lease_name, config.node_name, config.lease_duration
        )
        self.xids = XidWatch(config.kernel_log)
        self.notice_file = os.path.join(config.state_dir, "notice.json")
        # ecc_before_xid(): GPUs (bus ids) with uncorrectable errors at the last decision, and those whose
        # Xids were read since it
        self.ecc_seen: set[str] = set()
        self.xids_undecided: set[str] = set()

    # one poll: read, judge, act
    def poll(self) -> None:
        new = self.xids.read()
        self.xids_undecided.update(e.pci_bus_id for e in new)
        health = assess(
            self.nvml,
            self.config.expected_gpu_count,
            self.config.corrected_errors_threshold,
            self.xids.events,
            self.xids.now_usec(),
            self.xids.error,
        )
        with self.lock:
            self.state.health = health
            self.state.polls += 1
            self.state.last_poll = time.time()
            for event in new:
                self.state.xids_seen[event.xid] = self.state.xids_seen.get(event.xid, 0) + 1
        if not health.get("settled", True):
            LOG.info("an Xid burst may still get its containment Xid (94/95): deciding on the next poll")
            return
        waiting = self.ecc_before_xid(health)
        if waiting:
            LOG.info("%s: uncorrectable ECC error(s) and no Xid yet: deciding on the next poll", waiting)
            return
        try:
            if not cordons(health.get("action", NONE)) and health["verdict"] != UNHEALTHY:
                if self.state.held_back:
                    self.forget_held_back(health)
                self.notice(health)
                return
            self.act_on_unhealthy(health)
        except (ApiError, OSError, ValueError) as exc:
            with self.lock:
                self.state.api_errors += 1
            LOG.error("API: %s", exc)

    def ecc_before_xid(self, health: dict[str, Any]) -> str:
        """The GPUs whose uncorrectable errors are new since the last decision while none of their Xids were
        read since it ("" when none: the agent decides now). The driver counts an error before it logs its
        Xids (48, 63, 94/95), so a poll in between sees an error with no containment Xid, which alone means
        uncontained (a reset and a cordon). Such a GPU waits one poll (the Xid's NVML event wakes the agent
        at once); if its Xid has not come by then, the error is judged without it, as before. With no
        kernel log there is no Xid to wait for."""
        with_ecc = {
            g["pci_bus_id"]: g["index"]
            for g in health["gpus"]
            if g["pci_bus_id"] and "ecc_uncorrectable_volatile" in g["reasons"]
        }
        first_seen, self.ecc_seen = set(with_ecc) - self.ecc_seen, set(with_ecc)
        waiting = sorted(first_seen - self.xids_undecided)
        if self.xids.log is None or self.xids.error is not None or not waiting:
            self.xids_undecided.clear()
            return ""
        return ", ".join(f"GPU {with_ecc[bus]}" for bus in waiting)

    # ------------------------------------------------------------------ notices: the node stays in service
    def notice(self, health: dict[str, Any]) -> None:
        """A restart_app / reset_at_drain_window finding: the notice annotation and a Node Event, once per
        new finding; the annotation goes once the GPUs need nothing any more."""
        action = health.get("action", NONE)
        key = notice_key(health) if notifies(action) else ""
        last = read_boot_scoped(self.notice_file).get("key", "")
        if key == last:
            return
        me = self.config.node_name
        if self.config.dry_run:
            LOG.warning("dry run: would post a notice for %s (%s)", me, summary(health))
            return
        node = self.api.request("GET", self.node_path(me))
        if key:
            record = cordon_record(AGENT, health, rfc3339(now_utc()))
            record["gpus"] = [
                {"index": g["index"], "uuid": g["uuid"], "action": g["action"], "reasons": g["reasons"]}
                for g in health["gpus"]
                if notifies(g.get("action", NONE))
            ]
            record["message"] = "; ".join(
                m for g in health["gpus"] if notifies(g.get("action", NONE)) for m in g["messages"]
            )
            annotations: dict[str, str | None] = {NOTICE_ANNOTATION: json.dumps(record, sort_keys=True)}
            self.post_event(node, action, record["message"])
            LOG.warning("notice for %s (%s): %s", me, action, record["message"])
            with self.lock:
                self.state.notices += 1
        else:
            annotations = {NOTICE_ANNOTATION: None}
            LOG.info("node %s needs no GPU action any more: notice removed", me)
        if key or NOTICE_ANNOTATION in (node["metadata"].get("annotations") or {}):
            patch = {"metadata": {"annotations": annotations}}
            self.api.request("PATCH", self.node_path(me), patch, "application/merge-patch+json")
        write_boot_scoped(self.notice_file, {"key": key})

    def post_event(self, node: dict[str, Any], action: str, message: str) -> None:
        moment = rfc3339(now_utc())
        name = node["metadata"]["name"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.gpu-health-", "namespace": EVENTS_NAMESPACE},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": name,
                "uid": node["metadata"].get("uid", ""),
            },
            "reason": EVENT_REASONS.get(action, "GPUHealth"),
            "type": "Warning",
            "message": f"{action}: {message}"[:1000],
            "source": {"component": AGENT, "host": name},
            "firstTimestamp": moment,
            "lastTimestamp": moment,
            "count": 1,
            "reportingComponent": AGENT,
            "reportingInstance": name,
        }
        self.api.request("POST", f"/api/v1/namespaces/{EVENTS_NAMESPACE}/events", event)

    def forget_held_back(self, health: dict[str, Any]) -> None:
        """Healthy again after the breaker held it back: drop its name from the Lease."""
        if not self.lease.acquire():
            return  # on the next poll
        try:
            LOG.info("node no longer unhealthy (%s): not held back any more", health["verdict"])
            with self.lock:
                self.state.held_back = ""
        finally:
            self.lease.release({self.config.node_name: None})

    def node_path(self, name: str) -> str:
        return f"/api/v1/nodes/{urllib.parse.quote(name)}"

    def act_on_unhealthy(self, health: dict[str, Any]) -> None:
        me = self.config.node_name
        node = self.api.request("GET", self.node_path(me))
        if node.get("spec", {}).get("unschedulable"):
            if not self.state.cordoned:
                LOG.info("node %s unhealthy and already cordoned: nothing to do", me)
            with self.lock:
                self.state.cordoned = True
                self.state.held_back = ""
            return
        if self.config.dry_run:
            LOG.warning("dry run: would cordon %s (%s)", me, summary(health))
            return
        if not self.lease.acquire():
            return
        held: dict[str, str | None] = {me: None}
        try:
            selector = urllib.parse.urlencode({"labelSelector": self.config.gpu_node_selector})
            nodes = self.api.request("GET", f"/api/v1/nodes?{selector}")["items"]
            unschedulable = {
                n["metadata"]["name"]: bool(n.get("spec", {}).get("unschedulable")) for n in nodes
            }
            decision = plan(unschedulable, [me], self.config.max_cordoned_percent)
            if me in decision.cordon:
                self.cordon(node, health)
            elif me in decision.already_cordoned:
                with self.lock:
                    self.state.cordoned = True
            else:
                held[me] = decision.held_back[me]
                self.hold_back(decision.held_back[me], health)
        finally:
            self.lease.release(held)

    def cordon(self, node: dict[str, Any], health: dict[str, Any]) -> None:
        me = self.config.node_name
        moment = now_utc()
        record = cordon_record(AGENT, health, rfc3339(moment))
        annotations = node["metadata"].get("annotations") or {}
        patch = {
            "metadata": {
                "annotations": {
                    CORDON_ANNOTATION: json.dumps(record, sort_keys=True),
                    HISTORY_ANNOTATION: history_with(annotations.get(HISTORY_ANNOTATION), "cordon", record),
                },
                "resourceVersion": node["metadata"]["resourceVersion"],
            },
            "spec": {"unschedulable": True},
        }
        self.api.request("PATCH", self.node_path(me), patch, "application/merge-patch+json")
        with self.lock:
            self.state.cordoned = True
            self.state.cordoned_at = time.time()
            self.state.held_back = ""
        action = record.get("gpu_action", "")
        LOG.warning(
            "cordoned %s: %s; action %s: %s", me, record["message"], action, record.get("playbook", "")
        )
        try:
            self.post_event(node, action, f"cordoned: {record['message']}; run {record.get('playbook', '')}")
        except ApiError as exc:  # the cordon and its annotation are what count
            LOG.warning("could not post the Node event (%s)", exc)

    def hold_back(self, why: str, health: dict[str, Any]) -> None:
        me = self.config.node_name
        if self.state.held_back != why:
            LOG.error("NOT cordoning %s although it is unhealthy (%s): %s", me, summary(health), why)
        with self.lock:
            self.state.held_back = why

    def run(self) -> None:
        events = NvmlEvents(self.nvml)
        events.open()
        try:
            while not self.stop.is_set():
                try:
                    self.poll()
                except Exception:  # one bad poll must not kill the watchdog
                    with self.lock:
                        self.state.poll_errors += 1
                    LOG.exception("poll failed")
                woke = events.wait(self.config.poll_interval, self.stop)
                if woke:
                    LOG.warning("%s: checking the GPUs now", woke)
        finally:
            events.close()
            self.xids.close()

    # metrics
    def metrics(self) -> str:
        with self.lock:
            s = self.state
            health = s.health
            lines = [
                "# HELP gpu_health_agent_node_verdict The node's verdict (1 for the current one).",
                "# TYPE gpu_health_agent_node_verdict gauge",
            ]
            lines += [
                f'gpu_health_agent_node_verdict{{node="{self.config.node_name}",verdict="{v}"}} '
                f"{int(health['verdict'] == v)}"
                for v in VERDICTS
            ]
            lines += [
                "# HELP gpu_health_agent_gpu_verdict Each GPU's verdict (1 for the current one).",
                "# TYPE gpu_health_agent_gpu_verdict gauge",
            ]
            for gpu in health["gpus"]:
                for v in VERDICTS:
                    lines.append(
                        f'gpu_health_agent_gpu_verdict{{gpu="{gpu["index"]}",uuid="{gpu["uuid"] or ""}",'
                        f'verdict="{v}"}} {int(gpu["verdict"] == v)}'
                    )
            lines += [
                "# HELP gpu_health_agent_gpu_reason A reason code found on a GPU (gpu_health's table).",
                "# TYPE gpu_health_agent_gpu_reason gauge",
            ]
            for gpu in health["gpus"]:
                for reason in gpu["reasons"]:
                    lines.append(f'gpu_health_agent_gpu_reason{{gpu="{gpu["index"]}",reason="{reason}"}} 1')
            for reason in health["reasons"]:
                lines.append(f'gpu_health_agent_gpu_reason{{gpu="node",reason="{reason}"}} 1')
            lines += [
                "# HELP gpu_health_agent_node_action The node's action (1 for the current one).",
                "# TYPE gpu_health_agent_node_action gauge",
            ]
            lines += [
                f'gpu_health_agent_node_action{{node="{self.config.node_name}",action="{a}"}} '
                f"{int(health.get('action', NONE) == a)}"
                for a in ACTIONS
            ]
            lines += [
                "# HELP gpu_health_agent_xids_total Xids read from the kernel log, by Xid.",
                "# TYPE gpu_health_agent_xids_total counter",
            ]
            lines += [f'gpu_health_agent_xids_total{{xid="{x}"}} {n}' for x, n in sorted(s.xids_seen.items())]
            lines += [
                "# HELP gpu_health_agent_kernel_log_readable 0 when the kernel log (Xids) cannot be read.",
                "# TYPE gpu_health_agent_kernel_log_readable gauge",
                f"gpu_health_agent_kernel_log_readable {int(self.xids.error is None)}",
                "# TYPE gpu_health_agent_notices_total counter",
                f"gpu_health_agent_notices_total {s.notices}",
            ]
            held = _escape(s.held_back)
            lines += [
                "# HELP gpu_health_agent_cordoned Whether the node is cordoned (seen or done by the agent).",
                "# TYPE gpu_health_agent_cordoned gauge",
                f'gpu_health_agent_cordoned{{node="{self.config.node_name}"}} {int(s.cordoned)}',
                "# HELP gpu_health_agent_breaker_held_back 1 when the node is unhealthy but the circuit "
                "breaker kept the agent from cordoning it.",
                "# TYPE gpu_health_agent_breaker_held_back gauge",
                f'gpu_health_agent_breaker_held_back{{node="{self.config.node_name}",why="{held}"}} '
                f"{int(bool(s.held_back))}",
                "# TYPE gpu_health_agent_polls_total counter",
                f"gpu_health_agent_polls_total {s.polls}",
                "# TYPE gpu_health_agent_poll_errors_total counter",
                f"gpu_health_agent_poll_errors_total {s.poll_errors}",
                "# TYPE gpu_health_agent_api_errors_total counter",
                f"gpu_health_agent_api_errors_total {s.api_errors}",
                "# TYPE gpu_health_agent_last_poll_timestamp_seconds gauge",
                f"gpu_health_agent_last_poll_timestamp_seconds {s.last_poll:.3f}",
            ]
        return "\n".join(lines) + "\n"


def notice_key(health: dict[str, Any]) -> str:
    """What a notice is about: the action and each GPU's reasons and Xids; a new Xid that asks for something
    makes a new notice."""
    gpus = [
        [
            g["index"],
            g.get("action"),
            g["reasons"],
            [x.get("seq") for x in g.get("xids", []) if x.get("action") != NONE],  # not an app's Xid
        ]
        for g in health["gpus"]
        if notifies(g.get("action", NONE))
    ]
    return json.dumps([health.get("action"), gpus], sort_keys=True)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def summary(health: dict[str, Any]) -> str:
    parts = list(health["reasons"])
    parts += [f"GPU {g['index']} {','.join(g['reasons'])}" for g in health["gpus"] if g["reasons"]]
    return health["verdict"] + (": " + "; ".join(parts) if parts else "")


def serve_metrics(agent: Agent) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = agent.metrics().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((agent.config.metrics_address, agent.config.metrics_port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=AGENT, description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the JSON settings file the role writes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        config = Config.load(args.config)
        api = KubeApi(config.api_server, config.ca_file, config.token_file)
    except (OSError, ValueError, TypeError) as exc:
        LOG.error("bad settings: %s", exc)
        return 2
    try:
        import pynvml
    except ImportError:
        LOG.error("pynvml (nvidia-ml-py) cannot be imported by %s", sys.executable)
        return 2
    agent = Agent(config, pynvml, api)
    server = serve_metrics(agent)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    LOG.info(
        "watching %s's GPUs every %ss; metrics on :%d",
        config.node_name,
        config.poll_interval,
        config.metrics_port,
    )
    try:
        agent.run()
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
