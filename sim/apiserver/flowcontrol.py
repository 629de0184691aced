"""API Priority and Fairness, simplified: one client may not take more than its share of the server.

kube-apiserver classifies every request by FlowSchema into a priority level, queues it fairly among
the flows (mostly: users) of that level, and rejects it with 429 when its queue is full or it waited
too long (staging/src/k8s.io/apiserver/pkg/server/filters/priority-and-fairness.go, `Handle` and
`tooManyRequests`; the queues are pkg/util/flowcontrol/fairqueuing/queueset). What the emulator
keeps of it:

- **Seats.** A request occupies seats as the work estimator says (pkg/util/flowcontrol/request/
  list_work_estimator.go): a LIST, or a watch that asks for its initial events, one seat per 100
  stored objects of its kind, at least 1 and at most 10 (the default `MaximumSeatsLimit`); a watch
  without initial events and every other request, 1.
- **A share per user.** The server has `seats_per_second`; every user may spend `user_share` of it
  (a token bucket refilled at that rate, holding one second of it). The emulator answers its
  requests in microseconds, so kube-apiserver's limit on seats held *at once* would never bind here:
  the simplification is a limit on seats spent per second, per user, with no queue: a request over
  the share is rejected at once rather than after waiting in a queue.
- **Exempt:** `system:masters` (kube-apiserver's `exempt` FlowSchema), the non-resource paths
  (discovery, health; its `probes` schema), and the emulator's own `/sim/...` controls.
- **The answer** is kube-apiserver's: 429, `Retry-After`, a plain-text body ("Too many requests,
  please try again later."). `Retry-After` follows pkg/util/flowcontrol/dropped_requests_tracker.go:
  it starts at 1 s, doubles (up to 32 s) when at least three times its value were rejected in the
  last `retry_after` seconds, and comes down by one second when fewer than its value were.

Off unless configured (`ApiServer(flow_control=FlowControlConfig(...))`, `python -m sim.apiserver
--flow-control-seats N`, `PUT /sim/flowcontrol`): the rest of the suite never sees a 429 it did not
inject.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

OBJECTS_PER_SEAT = 100
MAX_SEATS = 10
MAX_RETRY_AFTER = 32
EXEMPT_GROUPS = frozenset({"system:masters"})
TOO_MANY_REQUESTS = "Too many requests, please try again later.\n"


class FlowControlConfig(BaseModel):
    """The server's capacity and each user's share of it."""

    model_config = ConfigDict(extra="forbid")

    seats_per_second: float = Field(gt=0, description="what the server serves a second, in seats")
    user_share: float = Field(default=0.5, gt=0, le=1, description="the most one user may take of it")


def seats(verb: str, stored: int, send_initial_events: bool = False) -> int:
    """What one request costs, as kube-apiserver's list work estimator counts it."""
    if verb == "list" or (verb == "watch" and send_initial_events):
        return max(1, min(MAX_SEATS, math.ceil(stored / OBJECTS_PER_SEAT)))
    return 1


class RetryAfter:
    """The `Retry-After` kube-apiserver gives a rejected request: grows with the rejections."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.value = 1
        self._raised_at = 0
        self._current = 0  # the second being counted
        self._current_count = 0
        self._history: list[tuple[int, int]] = []  # (unix second, rejections)

    def rejected(self) -> int:
        """Record one rejection; the Retry-After (seconds) to answer it with."""
        now = int(self.clock())
        if now == self._current:
            self._current_count += 1
            return self.value
        if self._current_count:
            self._history.append((self._current, self._current_count))
        self._history = [(second, n) for second, n in self._history if now - second <= MAX_RETRY_AFTER]
        self._current, self._current_count = now, 1
        recent = sum(n for second, n in self._history if now - second <= self.value)
        if now - self._raised_at >= self.value and recent >= 3 * self.value:
            self.value = min(MAX_RETRY_AFTER, self.value * 2)
            self._raised_at = now
        elif recent < self.value and self.value > 1:
            self.value -= 1
        return self.value


class FlowControl:
    """Per-user token buckets of seats. Thread-safe."""

    def __init__(
        self, config: FlowControlConfig | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # user -> (seats left, when)
        self._retry_after = RetryAfter()
        self.config = config

    @property
    def config(self) -> FlowControlConfig | None:
        return self._config

    @config.setter
    def config(self, config: FlowControlConfig | None) -> None:
        with self._lock:
            self._config = config
            self._buckets.clear()

    def admit(self, user: str, groups: frozenset[str] | tuple[str, ...], cost: int) -> int | None:
        """None when the request may run; else the Retry-After (seconds) of its 429."""
        config = self._config
        if config is None or EXEMPT_GROUPS.intersection(groups):
            return None
        rate = config.seats_per_second * config.user_share
        burst = max(rate, float(MAX_SEATS))  # one second of the share, and room for one costly LIST
        now = self.clock()
        with self._lock:
            left, when = self._buckets.get(user, (burst, now))
            left = min(burst, left + (now - when) * rate)
            if left >= cost:
                self._buckets[user] = (left - cost, now)
                return None
            self._buckets[user] = (left, now)
            return self._retry_after.rejected()
