"""A circuit breaker per upstream, fed by request errors, timeouts and the active /health probe.

closed --(failures_to_open consecutive failures)--> open --(open_s)--> half_open
half_open --(trial request or probe succeeds)--> closed;  half_open --(failure)--> open

Overload answers (429/503 from vLLM's queue) are neither success nor failure: the upstream is
healthy, just full.

`reached` is set by the first success (an answered request or a healthy probe) and stays set: a
breaker starts closed, so closed alone does not say the upstream can be reached at all. /ready counts
an upstream only once it has been reached.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import IntEnum
from typing import Any


class BreakerState(IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    def __init__(
        self, failures_to_open: int, open_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures_to_open = failures_to_open
        self.open_s = open_s
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial_in_flight = False
        self.times_opened = 0
        self.last_failure: str | None = None
        self.reached = False

    def reconfigure(self, failures_to_open: int, open_s: float) -> None:
        self.failures_to_open = failures_to_open
        self.open_s = open_s

    def peek_state(self) -> BreakerState:
        """The state as `state` would report it, without moving the machine (safe from any thread)."""
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.open_s:
            return BreakerState.HALF_OPEN
        return self._state

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.open_s:
            self._state = BreakerState.HALF_OPEN
            self._trial_in_flight = False
        return self._state

    def usable(self) -> bool:
        """Whether a request may be sent now, without claiming the half-open trial."""
        state = self.state
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and not self._trial_in_flight)

    def acquire(self) -> bool:
        """Claim permission to send one request; in half-open only one trial at a time."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._trial_in_flight:
            self._trial_in_flight = True
            return True
        return False

    def record_success(self) -> None:
        self.reached = True
        self._failures = 0
        self._trial_in_flight = False
        self._state = BreakerState.CLOSED

    def record_neutral(self) -> None:
        """The request ended without telling us about the upstream's health (overload, client gone)."""
        self._trial_in_flight = False

    def record_failure(self, reason: str) -> None:
        self.last_failure = reason
        self._trial_in_flight = False
        state = self.state
        if state is BreakerState.HALF_OPEN:
            self._open()
            return
        if state is BreakerState.OPEN:
            return
        self._failures += 1
        if self._failures >= self.failures_to_open:
            self._open()

    def record_probe(self, ok: bool, reason: str | None = None) -> None:
        state = self.state
        if ok:
            self.reached = True
            # a healthy probe closes a half-open breaker, but does not excuse request failures
            if state is BreakerState.HALF_OPEN:
                self.record_success()
        else:
            self.record_failure(reason or "health probe failed")

    def _open(self) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = self._clock()
        self._failures = 0
        self.times_opened += 1

    def snapshot(self) -> dict[str, Any]:
        state = self.peek_state()
        snap: dict[str, Any] = {
            "state": state.name.lower(),
            "consecutive_failures": self._failures,
            "times_opened": self.times_opened,
            "last_failure": self.last_failure,
            "reached": self.reached,
        }
        if state is BreakerState.OPEN:
            snap["reopens_in_s"] = round(max(self.open_s - (self._clock() - self._opened_at), 0.0), 3)
        return snap
