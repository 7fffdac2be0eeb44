"""The circuit breaker for cordoning GPU nodes: one rule, used by the GPU health agent
(module_utils/gpu_health_agent.py) and by playbooks/remediate/ecc-cordon.yml and uncordon.yml (through
the module library/gpu_cordon_plan.py).

Why a breaker: the article's cron script cordoned on any ECC count, so one bad reading on every node (a
driver bug, a fleet-wide corrected-error burst) would have emptied the cluster. A broken GPU node taken out
of service is good; the whole fleet taken out by automation is an outage. So automation never cordons
more than ``max_cordoned_percent`` of the GPU nodes (rounded down; 34 = one node of three) and never the
last schedulable one. Nodes it holds back are named, so a human decides.

Pure functions, stdlib only (the agent runs on nodes without Ansible).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_CORDONED_PERCENT = 34


@dataclass
class BreakerPlan:
    """What automation may do: ``cordon`` the nodes listed, leave ``held_back`` alone (named, with why)."""

    limit: int
    cordoned_before: list[str]
    cordon: list[str] = field(default_factory=list)
    already_cordoned: list[str] = field(default_factory=list)
    held_back: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "limit": self.limit,
            "cordoned_before": self.cordoned_before,
            "cordon": self.cordon,
            "already_cordoned": self.already_cordoned,
            "held_back": self.held_back,
        }


def cordon_limit(gpu_node_count: int, max_cordoned_percent: int = DEFAULT_MAX_CORDONED_PERCENT) -> int:
    """How many GPU nodes may be cordoned at once: the share rounded down, and always one node fewer than
    all of them (the last schedulable node stays)."""
    if not 0 <= max_cordoned_percent <= 100:
        raise ValueError(f"max_cordoned_percent must be 0..100, got {max_cordoned_percent}")
    return max(0, min(gpu_node_count * max_cordoned_percent // 100, gpu_node_count - 1))


def plan(
    unschedulable: Mapping[str, bool],
    unhealthy: Iterable[str],
    max_cordoned_percent: int = DEFAULT_MAX_CORDONED_PERCENT,
) -> BreakerPlan:
    """Which of the ``unhealthy`` nodes automation may cordon now.

    ``unschedulable``: every GPU node's name -> whether it is cordoned now (spec.unschedulable), whoever
    cordoned it. Unhealthy nodes are taken in name order, so two runs over the same state agree.
    """
    names = sorted(unschedulable)
    cordoned = [n for n in names if unschedulable[n]]
    result = BreakerPlan(limit=cordon_limit(len(names), max_cordoned_percent), cordoned_before=cordoned)
    count = len(cordoned)
    for node in sorted(set(unhealthy)):
        if node not in unschedulable:
            result.held_back[node] = "not a known GPU node of the cluster"
        elif unschedulable[node]:
            result.already_cordoned.append(node)
        elif count + 1 > result.limit:
            schedulable = len(names) - count
            why = (
                f"circuit breaker: {count} of {len(names)} GPU nodes cordoned already, "
                f"at most {result.limit} may be ({max_cordoned_percent}% of the GPU nodes, "
                "never the last schedulable one)"
            )
            if schedulable <= 1:
                why += "; it is the last schedulable GPU node"
            result.held_back[node] = why
        else:
            result.cordon.append(node)
            count += 1
    return result


def rolling_plan(
    unschedulable: Mapping[str, bool],
    todo: Iterable[str],
    max_cordoned_percent: int = DEFAULT_MAX_CORDONED_PERCENT,
    own_out: Iterable[str] = (),
) -> dict[str, Any]:
    """Planned work that takes GPU nodes out one at a time (playbooks/upgrade-driver.yml,
    upgrade-kubernetes.yml, upgrade-containerd.yml): which of the ``todo`` nodes may be cordoned for it,
    within the same limit as an unhealthy node (cordon_limit).

    ``unschedulable``: every GPU node's name -> whether it is cordoned now by someone else (the caller leaves
    out its own cordon, which it lifts before the next node). ``own_out``: the nodes cordoned now by the
    caller's own cordon (a run of it that stopped). A node cordoned already, by anyone, adds no node out of
    service: it may be worked on (and the caller's own is lifted once it is done). Any other is allowed when
    the nodes cordoned by others plus this one stay within the limit; each todo node is judged alone, as the
    work takes one at a time.
    """
    names = sorted(unschedulable)
    limit = cordon_limit(len(names), max_cordoned_percent)
    out = [n for n in names if unschedulable[n]]
    out_already = set(own_out)
    allowed: list[str] = []
    held_back: dict[str, str] = {}
    for node in todo:
        if node not in unschedulable:
            held_back[node] = "not a known GPU node of the cluster"
        elif unschedulable[node] or node in out_already or len(out) + 1 <= limit:
            allowed.append(node)
        else:
            held_back[node] = (
                f"circuit breaker: {len(out)} of {len(names)} GPU nodes cordoned already"
                f"{' (' + ', '.join(out) + ')' if out else ''}, at most {limit} may be "
                f"({max_cordoned_percent}% of the GPU nodes, never the last schedulable one)"
            )
    return {"limit": limit, "cordoned_before": out, "allowed": allowed, "held_back": held_back}


# ------------------------------------------------------------------------ what a cordon leaves on a node
# The one home of the annotation keys: the agent writes them, ecc-cordon.yml and uncordon.yml read and
# write them (module gpu_cordon_plan returns them).
CORDON_ANNOTATION = "gpu-health.llm-platform.io/cordon"
HISTORY_ANNOTATION = "gpu-health.llm-platform.io/history"
# A GPU fault that keeps the node in service (restart the application, reset at the next drain window): what
# the agent saw, JSON like the cordon annotation's; the agent removes it once the GPU needs nothing.
NOTICE_ANNOTATION = "gpu-health.llm-platform.io/notice"
HISTORY_LENGTH = 20
# On the breaker Lease: JSON {node: {why, time, by}} of the unhealthy nodes the breaker holds back now
# (the agents and ecc-cordon.yml write it while they hold the Lease; a node's entry goes once it is
# cordoned or healthy again).
HELD_BACK_ANNOTATION = "gpu-health.llm-platform.io/held-back"


# ---------------------------------------------------------------------- the breaker Lease (one lock)
# Every agent and ecc-cordon.yml take the same coordination.k8s.io Lease around "count the cordoned GPU
# nodes, cordon one more": whoever holds it decides alone. The Lease is taken with the resourceVersion read
# (a concurrent taker gets HTTP 409) and given back by clearing holderIdentity; a holder that died loses it
# after its leaseDurationSeconds.


def micro_time(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def lease_live_holder(lease: Mapping[str, Any], me: str, now: dt.datetime) -> str | None:
    """Another holder whose hold has not expired (the caller must wait), or None (free, expired or mine)."""
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    renewed = parse_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds") or 15
    if holder and holder != me and renewed and renewed + dt.timedelta(seconds=duration) > now:
        return str(holder)
    return None


def lease_taken(lease: Mapping[str, Any], me: str, duration: int, now: dt.datetime) -> dict[str, Any]:
    """The Lease body to PUT (its resourceVersion kept: a concurrent taker makes it fail) to hold it."""
    body = json.loads(json.dumps(lease))
    body.setdefault("spec", {}).update(
        holderIdentity=me,
        leaseDurationSeconds=duration,
        acquireTime=micro_time(now),
        renewTime=micro_time(now),
    )
    return body


def lease_released(
    lease: Mapping[str, Any], held_back: Mapping[str, str | None], by: str, now: dt.datetime
) -> dict[str, Any]:
    """The Lease body to PUT to give it back, with the held-back annotation updated: ``held_back`` maps a
    node to why the breaker holds it back now, or to None to drop it (cordoned, or healthy again)."""
    body = json.loads(json.dumps(lease))
    body["spec"]["holderIdentity"] = None
    body["spec"].pop("acquireTime", None)
    annotations = body.setdefault("metadata", {}).get("annotations") or {}
    try:
        current = json.loads(annotations.get(HELD_BACK_ANNOTATION) or "{}")
        if not isinstance(current, dict):
            current = {}
    except ValueError:
        current = {}
    for node, why in held_back.items():
        if why is None:
            current.pop(node, None)
        else:
            current[node] = {"why": why, "by": by, "time": micro_time(now)}
    annotations[HELD_BACK_ANNOTATION] = json.dumps(current, sort_keys=True)
    body["metadata"]["annotations"] = annotations
    return body


def cordon_record(by: str, health: Mapping[str, Any], time: str) -> dict[str, Any]:
    """The cordon annotation's content: who, when, the reason codes, the GPUs (index and UUID), the action
    gpu_health names for the node and the playbook that carries it out (module_utils/gpu_xid.py)."""
    bad = [g for g in health.get("gpus", []) if g.get("verdict") == "unhealthy"]
    reasons = sorted({r for g in bad for r in g.get("reasons", [])} | set(health.get("reasons", [])))
    gpus = [{"index": g.get("index"), "uuid": g.get("uuid")} for g in bad]
    where = ", ".join(f"GPU {g['index']}" for g in gpus) or "node"
    record = {
        "by": by,
        "time": time,
        "reasons": reasons,
        "gpus": gpus,
        "message": f"{where}: {', '.join(reasons)}",
    }
    # "gpu_action": the history's entries have an "action" of their own (cordon, uncordon)
    if health.get("action"):
        record.update(gpu_action=health["action"], playbook=health.get("playbook", ""))
    return record


def history_with(current: str | None, action: str, record: Mapping[str, Any]) -> str:
    """The history annotation (JSON list, newest last, at most HISTORY_LENGTH entries) with one more entry."""
    try:
        history = json.loads(current) if current else []
        if not isinstance(history, list):
            history = []
    except ValueError:
        history = []
    history.append({"action": action, **record})
    return json.dumps(history[-HISTORY_LENGTH:], sort_keys=True)


# ---------------------------------------------------------------------- what the remediation playbooks do


def unhealthy_record(health: Mapping[str, Any]) -> bool:
    return health.get("verdict") == "unhealthy"


def cordon_patches(
    nodes: Iterable[Mapping[str, Any]],
    health: Mapping[str, Mapping[str, Any]],
    by: str,
    time: str,
    max_cordoned_percent: int = DEFAULT_MAX_CORDONED_PERCENT,
) -> dict[str, Any]:
    """ecc-cordon.yml's decision over the whole inventory: ``nodes`` are the GPU Node objects, ``health``
    each host's gpu_health result. Returns the breaker plan, the merge patches (cordon + annotations) for
    the nodes to cordon, those already cordoned for the same reasons (nothing to do) and those cordoned for
    other reasons (reported, left alone)."""
    by_name = {n["metadata"]["name"]: n for n in nodes}
    unschedulable = {name: bool((n.get("spec") or {}).get("unschedulable")) for name, n in by_name.items()}
    unhealthy = [host for host, result in health.items() if unhealthy_record(result)]
    decision = plan(unschedulable, unhealthy, max_cordoned_percent)
    patches: dict[str, Any] = {}
    records: dict[str, Any] = {}
    for name in decision.cordon:
        record = cordon_record(by, health[name], time)
        annotations = by_name[name]["metadata"].get("annotations") or {}
        records[name] = record
        patches[name] = {
            "metadata": {
                "annotations": {
                    CORDON_ANNOTATION: json.dumps(record, sort_keys=True),
                    HISTORY_ANNOTATION: history_with(annotations.get(HISTORY_ANNOTATION), "cordon", record),
                }
            },
            "spec": {"unschedulable": True},
        }
    same, other = [], {}
    for name in decision.already_cordoned:
        current = _record_of(by_name[name])
        wanted = cordon_record(by, health[name], time)["reasons"]
        if current is not None and current.get("reasons") == wanted:
            same.append(name)
        else:
            other[name] = current["message"] if current else "cordoned without a GPU health annotation"
    return {
        **decision.as_dict(),
        "unhealthy": sorted(unhealthy),
        "patches": patches,
        "records": records,
        "already_same_reason": same,
        "already_other_reason": other,
    }


def _record_of(node: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = (node.get("metadata", {}).get("annotations") or {}).get(CORDON_ANNOTATION)
    try:
        record = json.loads(raw) if raw else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def uncordon_patch(
    node: Mapping[str, Any], health: Mapping[str, Any], by: str, time: str, force: bool
) -> tuple[dict[str, Any] | None, str]:
    """uncordon.yml's decision for one node: (merge patch or None, why). Refused while gpu_health says the
    node is unhealthy, unless ``force``, which the history records with the verdict at that moment."""
    verdict = health.get("verdict", "unknown")
    if verdict == "unhealthy" and not force:
        return (
            None,
            f"refused: gpu_health says {health.get('msg') or verdict} now; fix the GPU or pass force=true",
        )
    if not (node.get("spec") or {}).get("unschedulable") and _record_of(node) is None:
        return None, "nothing to do: not cordoned and no GPU health annotation"
    annotations = node.get("metadata", {}).get("annotations") or {}
    entry = {
        "by": by,
        "time": time,
        "verdict": verdict,
        "forced": bool(force and verdict == "unhealthy"),
        "cordon": _record_of(node),
    }
    action = "force-uncordon" if entry["forced"] else "uncordon"
    patch = {
        "metadata": {
            "annotations": {
                CORDON_ANNOTATION: None,
                HISTORY_ANNOTATION: history_with(annotations.get(HISTORY_ANNOTATION), action, entry),
            }
        },
        "spec": {"unschedulable": None},
    }
    return patch, f"{action}: gpu_health says {verdict}"


def maintenance_patch(
    nodes: Iterable[Mapping[str, Any]],
    name: str,
    health: Mapping[str, Any],
    gpus: Iterable[int],
    what: str,
    by: str,
    time: str,
) -> tuple[dict[str, Any] | None, str]:
    """A playbook's own work on a node (a GPU reset, a reboot): the merge patch that cordons it with the
    record (the GPUs it works on, their reasons, gpu_health's action) and a history entry ``what``, or None
    with why (the node is cordoned already: only the history entry; the last schedulable GPU node: refused).
    """
    by_name = {n["metadata"]["name"]: n for n in nodes}
    node = by_name[name]
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    wanted = set(gpus)
    chosen = [g for g in health.get("gpus", []) if g.get("index") in wanted]
    reasons = sorted({r for g in chosen for r in g.get("reasons", [])} | set(health.get("reasons", [])))
    where = ", ".join(f"GPU {g['index']}" for g in chosen) or "node"
    record = {
        "by": by,
        "time": time,
        "reasons": reasons,
        "gpus": [{"index": g.get("index"), "uuid": g.get("uuid")} for g in chosen],
        "message": f"{where}: {what} ({', '.join(reasons) or 'no GPU health reason'})",
        "gpu_action": health.get("action", ""),
        "playbook": by,
    }
    history = history_with(annotations.get(HISTORY_ANNOTATION), what, record)
    if (node.get("spec") or {}).get("unschedulable"):
        return {
            "metadata": {"annotations": {HISTORY_ANNOTATION: history}}
        }, f"{name} is cordoned already: {what}"
    others = [
        n for n, item in by_name.items() if n != name and not (item.get("spec") or {}).get("unschedulable")
    ]
    if not others:
        return None, f"refused: {name} is the last schedulable GPU node; {what} it when another one is back"
    patch = {
        "metadata": {
            "annotations": {
                CORDON_ANNOTATION: json.dumps(record, sort_keys=True),
                HISTORY_ANNOTATION: history,
            }
        },
        "spec": {"unschedulable": True},
    }
    return patch, f"cordon {name} for the {what}: {record['message']}"
