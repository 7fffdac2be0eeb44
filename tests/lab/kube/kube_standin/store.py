"""Object storage: one resourceVersion counter, watch event log, state persisted atomically to a JSON file."""

from __future__ import annotations

import collections
import copy
import json
import os
import tempfile
import threading
import time
from typing import Any

Key = tuple[str, str, str, str]  # group, plural, namespace ("" for cluster-scoped), name


class Event:
    __slots__ = ("group", "namespace", "obj", "plural", "rv", "type")

    def __init__(
        self, rv: int, type_: str, group: str, plural: str, namespace: str, obj: dict[str, Any]
    ) -> None:
        self.rv, self.type, self.group, self.plural, self.namespace, self.obj = (
            rv,
            type_,
            group,
            plural,
            namespace,
            obj,
        )


class Store:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.objects: dict[Key, dict[str, Any]] = {}
        self.rv = 1
        self.extra: dict[str, Any] = {}  # server-private state (signing key, SSA field sets)
        self.events: collections.deque[Event] = collections.deque(maxlen=5000)
        self._dirty = False
        self._stop = threading.Event()
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            self.rv = int(data.get("resourceVersion", 1))
            self.extra = data.get("extra", {})
            for item in data.get("objects", []):
                key = (item["group"], item["plural"], item["namespace"], item["name"])
                self.objects[key] = item["object"]
        self.first_rv = self.rv
        self._flusher = threading.Thread(target=self._flush_loop, name="state-flusher", daemon=True)
        self._flusher.start()

    # ------------------------------------------------------------ reads
    def get(self, group: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self.objects.get((group, plural, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def select(self, group: str, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            out = [
                copy.deepcopy(o)
                for (g, p, ns, _), o in self.objects.items()
                if g == group and p == plural and (namespace is None or ns == namespace)
            ]
        out.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return out

    def keys(self, group: str, plural: str) -> list[Key]:
        with self.lock:
            return [k for k in self.objects if k[0] == group and k[1] == plural]

    # ------------------------------------------------------------ writes
    def next_rv(self) -> str:
        with self.lock:
            self.rv += 1
            return str(self.rv)

    def save(self, group: str, plural: str, obj: dict[str, Any], event_type: str) -> dict[str, Any]:
        """Store obj with a fresh resourceVersion and emit a watch event; returns a copy."""
        with self.lock:
            meta = obj["metadata"]
            meta["resourceVersion"] = self.next_rv()
            key = (group, plural, meta.get("namespace", ""), meta["name"])
            if event_type == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = copy.deepcopy(obj)
            self.events.append(Event(self.rv, event_type, group, plural, key[2], copy.deepcopy(obj)))
            self._dirty = True
            self.changed.notify_all()
            return copy.deepcopy(obj)

    def mark_dirty(self) -> None:
        with self.lock:
            self._dirty = True

    def events_since(self, rv: int) -> list[Event] | None:
        """Events after rv, or None when rv is older than the log keeps (410 Gone)."""
        with self.lock:
            if self.events and rv < self.events[0].rv - 1:
                return None
            if not self.events and rv < self.first_rv:
                return None
            return [e for e in self.events if e.rv > rv]

    # ------------------------------------------------------------ persistence
    def flush(self) -> None:
        if not self.path:
            return
        with self.lock:
            if not self._dirty:
                return
            data = {
                "resourceVersion": self.rv,
                "extra": self.extra,
                "objects": [
                    {"group": k[0], "plural": k[1], "namespace": k[2], "name": k[3], "object": o}
                    for k, o in self.objects.items()
                ],
            }
            self._dirty = False
            text = json.dumps(data, separators=(",", ":"))
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".state-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    def _flush_loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.flush()
            except OSError as exc:  # keep serving; the next round retries
                print(f"kube-standin: cannot write state file {self.path}: {exc}", flush=True)

    def close(self) -> None:
        self._stop.set()
        self.flush()


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
