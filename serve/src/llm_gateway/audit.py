"""The audit trail: one JSON line per request, written off the event loop.

Records go through a bounded queue to a writer thread. If the disk cannot keep up and the
queue fills, records are dropped and counted (llm_gateway_audit_dropped_total) rather than
letting requests wait on the disk. SIGHUP reopens the file, for logrotate.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Literal

import orjson

from .config import ConfigError

log = logging.getLogger("llm_gateway.audit")

_BATCH_INTERVAL_S = 0.05
_REOPEN = object()
_STOP = object()


def prompt_fields(mode: Literal["off", "hashed", "full"], payload: dict[str, Any] | None) -> dict[str, Any]:
    if mode == "off" or payload is None:
        return {}
    prompt = payload.get("messages", payload.get("prompt"))
    if mode == "full":
        return {"prompt": prompt}
    return {"prompt_sha256": hashlib.sha256(orjson.dumps(prompt, option=orjson.OPT_SORT_KEYS)).hexdigest()}


class AuditLog:
    def __init__(self, path: str, queue_size: int, on_drop: Callable[[], None] | None = None) -> None:
        self.path = path
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._on_drop = on_drop
        self.dropped = 0
        self._file: IO[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        try:
            self._open()
        except OSError as exc:  # validated at load; this is the file going away since
            raise ConfigError(f"audit.path: cannot open {path}: {exc.strerror or exc}") from None
        self._thread.start()

    def _open(self) -> None:
        if self.path == "-":
            self._file = sys.stdout.buffer
        else:
            self._file = open(self.path, "ab")  # noqa: SIM115 - lives as long as the writer

    def write(self, record: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            if self._on_drop is not None:
                self._on_drop()
            if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                log.error("audit queue full: %d records dropped so far", self.dropped)

    def reopen(self) -> None:
        try:
            self._queue.put_nowait(_REOPEN)
        except queue.Full:
            log.error("audit queue full: reopen request dropped")

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            # Let records gather: one wake-up and one write per interval, not per request, so this
            # thread rarely competes with the event loop for the GIL.
            time.sleep(_BATCH_INTERVAL_S)
            batch = [item]
            while len(batch) < 4096:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            lines = []
            stop = reopen = False
            for entry in batch:
                if entry is _STOP:
                    stop = True
                elif entry is _REOPEN:
                    reopen = True
                else:
                    lines.append(orjson.dumps(entry) + b"\n")
            try:
                assert self._file is not None
                if lines:
                    self._file.write(b"".join(lines))
                self._file.flush()
                if reopen and self.path != "-":
                    self._file.close()
                    self._open()
            except (OSError, ValueError):
                log.exception("cannot write audit records to %s", self.path)
            if stop:
                return

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush what is queued and stop the writer (blocking: call from a thread)."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        if self._file is not None and self.path != "-":
            self._file.close()


@dataclass(slots=True)
class RequestRecord:
    """What the gateway learns about one request as it goes; becomes its audit line."""

    request_id: str
    kind: str
    app: str | None
    client: str | None
    started: float
    time: float = field(default_factory=time.time)
    user: str | None = None
    model: str | None = None
    upstream: str | None = None
    served_model: str | None = None
    stream: bool = False
    status: int = 0
    outcome: str = "ok"
    error_type: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_estimated: bool = False
    ttft_s: float | None = None
    safety_action: str = "none"
    fallback: str | None = None
    truncated: bool = False
    payload: dict[str, Any] | None = None

    def settle(self, status: int, outcome: str = "ok", error_type: str | None = None) -> None:
        """How the request ended: the one place status, outcome and error type are set together.

        Outcomes: ok, rejected (by the gateway), upstream_rejected (4xx from vLLM), upstream_error,
        timeout, fallback, client_disconnected.
        """
        self.status = status
        self.outcome = outcome
        self.error_type = error_type

    def to_record(self, prompts: Literal["off", "hashed", "full"], latency_s: float) -> dict[str, Any]:
        record: dict[str, Any] = {
            "request_id": self.request_id,
            "time": datetime.datetime.fromtimestamp(self.time, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "endpoint": self.kind,
            "user": self.user,
            "app": self.app,
            "client": self.client,
            "model": self.model,
            "upstream": self.upstream,
            "served_model": self.served_model,
            "stream": self.stream,
            "status": self.status,
            "outcome": self.outcome,
            "error_type": self.error_type,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_ms": round(latency_s * 1000, 3),
            "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1000, 3),
            "safety_action": self.safety_action,
            "fallback": self.fallback,
        }
        if self.usage_estimated:
            record["usage_estimated"] = True
        if self.truncated:
            record["input_truncated"] = True
        record.update(prompt_fields(prompts, self.payload))
        return record
