"""Fault injection and the request log, configurable from Python and over HTTP (`/sim/...`).

A `FaultRule` matches requests by verb and resource (and optionally namespace / name) and then
does one or more of: add latency, fail with a status code (500, 429, 409, 503, 504...) at some
rate, hang like a timed-out request (then 504), or cut a watch stream after some events or
seconds. `times` bounds how often it fires. `rewatch_only` narrows a rule to watches that resume from
a resourceVersion (what an informer sends after a cut stream): with status 410 such a watch is
answered as kube-apiserver's watch cache answers a version it no longer keeps, a 200 whose one event
is an ERROR carrying the 410 Status, so the client must list again. `error_rate` is the chance a
rule fires on a matching request. Verbs are Kubernetes verbs: get, list, watch, create, update,
patch, delete, deletecollection; resources are plurals, with subresources as "pods/eviction",
"nodes/status". "*" matches anything.

    faults.add(FaultRule(verb="create", resource="pods/eviction", status=429, error_rate=0.5))
    faults.add(FaultRule(verb="watch", resource="nodes", watch_disconnect_after_events=3, times=1))
    faults.clear()

The request log keeps the last `capacity` requests (method, path, verb, resource, namespace,
name, status code, duration) and answers queries by verb, resource, name, status and time.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class FaultRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: int | None = None
    verb: str = "*"
    resource: str = "*"  # "pods", "pods/eviction", "nodes/status", "*"
    namespace: str | None = None
    name: str | None = None
    # The chance that the rule fires on a matching request (its status, latency, hang or cut).
    error_rate: float = Field(default=1.0, ge=0.0, le=1.0)
    status: int | None = None  # HTTP code to fail with; None = no error, only latency/disconnects
    message: str | None = None
    latency_ms: float = Field(default=0.0, ge=0.0)
    timeout_seconds: float | None = Field(default=None, ge=0.0)  # hang this long, then 504
    watch_disconnect_after_events: int | None = Field(default=None, ge=0)
    watch_disconnect_after_seconds: float | None = Field(default=None, ge=0.0)
    rewatch_only: bool = False  # only watches that resume from a resourceVersion (not "0")
    times: int | None = Field(default=None, ge=0)  # fire at most this many times (None: always)
    fired: int = 0

    def matches(
        self, verb: str, resource: str, namespace: str | None, name: str | None, rewatch: bool = False
    ) -> bool:
        if self.verb not in ("*", verb):
            return False
        if self.rewatch_only and not rewatch:
            return False
        if self.resource != "*" and self.resource != resource:
            # "pods" is the pods themselves; "pods/*" matches every subresource of pods.
            base, _, sub = resource.partition("/")
            if not (sub and self.resource == f"{base}/*"):
                return False
        if self.namespace is not None and self.namespace != namespace:
            return False
        return self.name is None or self.name == name


@dataclass(slots=True)
class FaultDecision:
    """What the matching rules do to one request (made per request: a plain dataclass)."""

    latency_s: float = 0.0
    status: int | None = None
    message: str | None = None
    hang_s: float | None = None
    disconnect_after_events: int | None = None
    disconnect_after_seconds: float | None = None


class Faults:
    """The active fault rules. Thread-safe."""

    def __init__(self, seed: int | None = None) -> None:
        self._rules: list[FaultRule] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._random = random.Random(seed)

    def add(self, rule: FaultRule | dict[str, Any]) -> FaultRule:
        rule = rule if isinstance(rule, FaultRule) else FaultRule.model_validate(rule)
        with self._lock:
            rule = rule.model_copy(update={"id": next(self._ids), "fired": 0})
            self._rules.append(rule)
            return rule

    def remove(self, rule_id: int) -> bool:
        with self._lock:
            before = len(self._rules)
            self._rules = [r for r in self._rules if r.id != rule_id]
            return len(self._rules) != before

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def rules(self) -> list[FaultRule]:
        with self._lock:
            return [r.model_copy() for r in self._rules]

    def decide(
        self, verb: str, resource: str, namespace: str | None, name: str | None, rewatch: bool = False
    ) -> FaultDecision:
        """What to do to this request: the combined effect of every matching rule. `rewatch`: a watch
        that resumes from a resourceVersion."""
        out = FaultDecision()
        if not self._rules:  # the common case: no faults configured, no lock, no loop
            return out
        with self._lock:
            for rule in self._rules:
                if rule.times is not None and rule.fired >= rule.times:
                    continue
                if not rule.matches(verb, resource, namespace, name, rewatch):
                    continue
                fires = rule.error_rate >= 1.0 or self._random.random() < rule.error_rate
                if not fires:
                    continue
                rule.fired += 1
                out.latency_s += rule.latency_ms / 1000.0
                if rule.timeout_seconds is not None:
                    out.hang_s = rule.timeout_seconds
                if rule.status is not None and out.status is None:
                    out.status, out.message = rule.status, rule.message
                if rule.watch_disconnect_after_events is not None:
                    out.disconnect_after_events = rule.watch_disconnect_after_events
                if rule.watch_disconnect_after_seconds is not None:
                    out.disconnect_after_seconds = rule.watch_disconnect_after_seconds
        return out


@dataclass(slots=True)
class RequestRecord:
    """One served request. A plain dataclass: one is made per request, so it must be cheap."""

    seq: int
    time: float  # unix seconds
    method: str
    path: str
    query: str
    verb: str | None
    resource: str | None  # "pods", "pods/eviction"
    namespace: str | None
    name: str | None
    status: int
    duration_ms: float
    user_agent: str | None = None
    fault: bool = False
    user: str | None = None  # who the secure emulator authenticated (None: not secure, or no token)


class RequestLog:
    """The last `capacity` requests, queryable. Thread-safe."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=capacity)
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def record(self, **fields: Any) -> RequestRecord:
        with self._lock:
            rec = RequestRecord(next(self._seq), time.time(), **fields)
            self._records.append(rec)
            return rec

    def query(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
        status: int | None = None,
        since_seq: int | None = None,
        limit: int | None = None,
    ) -> list[RequestRecord]:
        with self._lock:
            records = list(self._records)
        out = [
            r
            for r in records
            if (verb is None or r.verb == verb)
            and (resource is None or r.resource == resource)
            and (namespace is None or r.namespace == namespace)
            and (name is None or r.name == name)
            and (status is None or r.status == status)
            and (since_seq is None or r.seq > since_seq)
        ]
        return out[-limit:] if limit else out

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
