"""Kubernetes Events, the way client-go's recorder and Karpenter's write them: one module every path uses.

    recorder = EventRecorder(kube)
    await recorder.record(events.evicted(pod, "Underutilized"))

- **core/v1 Events**, what `kubectl describe` and `kubectl get events` read: namespaced objects get
  their Event in their namespace, cluster-scoped ones (Node, NodePool) in `default`, with an
  `involvedObject` that names the object's kind, name and UID (describe matches on all three).
- **Deduplicated** like Karpenter's recorder: a repeat of the same event (same object, reason and
  message, or the event's own dedupe values) inside its reason's window (api/event_reasons.py) is
  dropped; after the window it adds one to the `count` of the Event already written (a PATCH, as
  client-go's correlator does), so a node blocked for an hour shows one line with a count.
- **Rate-limited per object** like client-go's spam filter: a token bucket of 25 with one token
  back every 5 minutes, so one noisy object cannot flood the API server.
- **Best effort**: an Event is a courtesy to the operator, never a reason to fail or retry the
  step that records it; failures are logged and counted (`karpflow_events_total{outcome}`).

What was written is remembered per event key, as client-go's correlator does in an LRU of 4,096;
but a controller pass over 5,000 nodes holds more nodes back than that, and an LRU that evicts the
start of a pass before its end turns every aggregation of the next pass into a new Event. So the
memory is sized to what a pass records (`reserve`, called for each pass's batch: room for the batch
and the default beside it) and entries untouched for longer than an Event lives on the server
(`EVENT_TTL_SECONDS`, kube-apiserver's `--event-ttl`) are dropped: their Event is gone anyway.

The state (what was written, the buckets) lives in the process, as client-go's does: two workers
each write their own Event for the same thing, which is what two Karpenter replicas would do too.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from api.activity_io import NodeRef
from api.event_reasons import CATALOG, EventType, Reason, awaiting_approval_message
from kube.client import Json, KubeApi, KubeError
from runtime import metrics

log = logging.getLogger(__name__)

COMPONENT = "karpflow"
CLUSTER_SCOPED_NAMESPACE = "default"  # where client-go records Events of cluster-scoped objects
SPAM_BURST = 25
SPAM_REFILL_SECONDS = 300.0
CACHE_SIZE = 4096  # client-go's correlator LRU; the least the recorder remembers (see `reserve`)
EVENT_TTL_SECONDS = 3600.0  # kube-apiserver's default --event-ttl: an older Event is gone
REQUEST_TIMEOUT = 5.0  # an Event must not hold up the activity that records it

Outcome = Literal["created", "aggregated", "deduplicated", "rate_limited", "failed"]


@dataclass(frozen=True)
class ObjectRef:
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"

    @classmethod
    def of(cls, obj: Json, kind: str | None = None, api_version: str | None = None) -> ObjectRef:
        meta = obj.get("metadata") or {}
        return cls(
            kind=kind or obj.get("kind") or "",
            name=meta.get("name") or "",
            namespace=meta.get("namespace") or "",
            uid=meta.get("uid") or "",
            api_version=api_version or obj.get("apiVersion") or "v1",
        )

    @property
    def key(self) -> str:
        return self.uid or f"{self.kind}/{self.namespace}/{self.name}"

    @property
    def event_namespace(self) -> str:
        return self.namespace or CLUSTER_SCOPED_NAMESPACE


@dataclass(frozen=True)
class Event:
    on: ObjectRef
    reason: Reason
    message: str
    # What makes two events "the same" for deduplication; default: the message.
    dedupe_values: tuple[str, ...] = ()
    type: EventType | None = None  # default: the catalog's
    dedupe: timedelta | None = None  # default: the catalog's window for the reason

    @property
    def event_type(self) -> EventType:
        return self.type or CATALOG[self.reason].type

    @property
    def key(self) -> tuple[str, ...]:
        return (self.on.key, self.event_type, str(self.reason), *(self.dedupe_values or (self.message,)))


# -- the events karpflow records, one builder per reason ---------------------------------------------


def _node(node: Json | ObjectRef) -> ObjectRef:
    return node if isinstance(node, ObjectRef) else ObjectRef.of(node, "Node", "v1")


def _pod(pod: Json | ObjectRef) -> ObjectRef:
    return pod if isinstance(pod, ObjectRef) else ObjectRef.of(pod, "Pod", "v1")


def _nodepool(nodepool: Json | ObjectRef) -> ObjectRef:
    if isinstance(nodepool, ObjectRef):
        return nodepool
    return ObjectRef.of(nodepool, "NodePool", "karpenter.sh/v1")


def disruption_blocked(node: Json | ObjectRef, why: str) -> Event:
    return Event(_node(node), Reason.DISRUPTION_BLOCKED, f"Cannot disrupt Node: {why}")


def nodepool_budget_blocked(nodepool: Json | ObjectRef, reason: str) -> Event:
    return Event(
        _nodepool(nodepool),
        Reason.DISRUPTION_BLOCKED,
        f"No allowed disruptions for disruption reason {reason} due to blocking budget",
    )


def unconsolidatable(node: Json | ObjectRef, why: str) -> Event:
    return Event(_node(node), Reason.UNCONSOLIDATABLE, why)


def disruption_launching(node: Json | ObjectRef, reason: str, replacement: str) -> Event:
    return Event(_node(node), Reason.DISRUPTION_LAUNCHING, f"Launching {replacement} to replace it: {reason}")


def disruption_waiting_readiness(node: Json | ObjectRef, replacement: str) -> Event:
    return Event(
        _node(node),
        Reason.DISRUPTION_WAITING_READINESS,
        f"Waiting for replacement {replacement} to be ready to continue disruption",
    )


def disruption_terminating(node: Json | ObjectRef, reason: str) -> Event:
    return Event(_node(node), Reason.DISRUPTION_TERMINATING, f"Disrupting Node: {reason}")


def evicted(pod: Json | ObjectRef, reason: str) -> Event:
    return Event(_pod(pod), Reason.EVICTED, f"Evicted pod: {reason}")


def disrupted(pod: Json | ObjectRef, node: str, grace_seconds: int) -> Event:
    return Event(
        _pod(pod),
        Reason.DISRUPTED,
        f"Deleting pod with {grace_seconds}s grace: node {node} reaches its termination deadline",
    )


def failed_draining(node: Json | ObjectRef, waiting: int, blocked_by: str = "") -> Event:
    detail = f" ({blocked_by})" if blocked_by else ""
    ref = _node(node)
    # One Event per node, however the number moves: the count says how long it has lasted.
    return Event(
        ref,
        Reason.FAILED_DRAINING,
        f"Failed to drain node, {waiting} pods are waiting to be evicted{detail}",
        dedupe_values=("draining",),
    )


def termination_grace_period_expiring(node: Json | ObjectRef, deadline: datetime) -> Event:
    return Event(
        _node(node),
        Reason.TERMINATION_GRACE_PERIOD_EXPIRING,
        f"All pods will be deleted by {deadline.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}",
    )


def failed_termination(node: Json | ObjectRef, step: str, error: str) -> Event:
    return Event(_node(node), Reason.FAILED_TERMINATION, f"{step} failed: {error}"[:1000])


# Karpenter's recorder default (pkg/events/recorder.go), which its node-level Blocked Events use; the
# catalog's minute for DisruptionBlocked is its NodePool budget Events' (NodePoolBlocked).
HELD_BACK_NODE_DEDUPE = timedelta(minutes=2)


def held_back(node: Json | ObjectRef, reason: Reason, message: str) -> Event:
    """A node the controller's pass left alone, under the reason its kind calls for
    (planner/why_not.py: DisruptionBlocked, Unconsolidatable, DisruptionWaitingWindow, ...).

    One Event per node and reason whatever the words, as Karpenter dedupes its Blocked and
    Unconsolidatable Events on the node's UID alone: a reason whose numbers move every pass ("budget
    used up (5 allowed: 4 already disrupting, 1 by this plan's commands)") is counted on the Event
    already written, with the latest words, instead of a new Event each pass."""
    window = HELD_BACK_NODE_DEDUPE if reason == Reason.DISRUPTION_BLOCKED else None
    return Event(_node(node), reason, message[:1000], dedupe_values=("held back",), dedupe=window)


def node_repair_blocked(obj: Json | ObjectRef, why: str) -> Event:
    ref = obj if isinstance(obj, ObjectRef) else ObjectRef.of(obj)
    return Event(ref, Reason.NODE_REPAIR_BLOCKED, why)


# Interruption kinds (api/interruption_events.py) to Karpenter's reason for each.
INTERRUPTION_REASONS: dict[str, tuple[Reason, str]] = {
    "SpotInterruption": (Reason.SPOT_INTERRUPTED, "Spot interruption warning was triggered"),
    "CapacityReservationInterruption": (
        Reason.CAPACITY_RESERVATION_INSTANCE_INTERRUPTED,
        "Capacity Reservation interruption warning was triggered",
    ),
    # Karpenter records no interruption Event for an expiring capacity block (it deletes the NodeClaim
    # from its expiration controller): the same Event as a reclaimed reservation, the nearest meaning.
    "CapacityBlockExpiration": (
        Reason.CAPACITY_RESERVATION_INSTANCE_INTERRUPTED,
        "Capacity Block expiration warning: EC2 begins terminating its instances in 10 minutes",
    ),
    "RebalanceRecommendation": (
        Reason.SPOT_REBALANCE_RECOMMENDATION,
        "Spot rebalance recommendation was triggered",
    ),
    "StateChange:stopping": (Reason.INSTANCE_STOPPING, "Instance is stopping"),
    "StateChange:terminating": (Reason.INSTANCE_TERMINATING, "Instance is terminating"),
    "ScheduledChange": (Reason.INSTANCE_UNHEALTHY, "An AWS Health scheduled change affects the instance"),
}


def interruption(node: Json | ObjectRef, kind: str, detail: str = "") -> Event | None:
    """The Event for an interruption message of `kind` (state changes as `StateChange:stopping` or
    `StateChange:terminating`); None for a kind Karpenter records nothing for."""
    found = INTERRUPTION_REASONS.get(kind)
    if found is None:
        return None
    reason, message = found
    return Event(_node(node), reason, f"{message}{': ' + detail if detail else ''}")


def disruption_rolled_back(node: Json | ObjectRef, command: str, why: str) -> Event:
    return Event(
        _node(node), Reason.DISRUPTION_ROLLED_BACK, f"Disruption {command} rolled back: {why}"[:1000]
    )


def disruption_awaiting_approval(obj: Json | ObjectRef, command: str) -> Event:
    ref = obj if isinstance(obj, ObjectRef) else ObjectRef.of(obj)
    return Event(ref, Reason.DISRUPTION_AWAITING_APPROVAL, awaiting_approval_message(command))


def disruption_waiting_window(node: Json | ObjectRef, window: str, action: str, until: str = "") -> Event:
    later = f" until {until}" if until else ""
    return Event(
        _node(node),
        Reason.DISRUPTION_WAITING_WINDOW,
        f"MaintenanceWindow {window} does not allow {action} now; waiting{later}",
    )


def disruption_waiting_ndb(node: Json | ObjectRef, budget: str, unavailable: int, allowed: int) -> Event:
    return Event(
        _node(node),
        Reason.DISRUPTION_WAITING_NODE_DISRUPTION_BUDGET,
        f"NodeDisruptionBudget {budget} allows {allowed} unavailable node(s), {unavailable} already are",
    )


def invalid_nodepool_settings(nodepool: Json | ObjectRef, problems: list[str]) -> Event:
    """A NodePool whose karpflow settings do not read as written (its voluntary disruption fails closed).
    Named one by one, so `kubectl describe nodepool` says which annotation or field to fix."""
    return Event(
        _nodepool(nodepool),
        Reason.INVALID_NODEPOOL_SETTINGS,
        "Voluntary disruption is blocked until fixed: " + "; ".join(problems),
    )


def invalid_control(obj: Json | ObjectRef, problems: str) -> Event:
    """A MaintenanceWindow or NodeDisruptionBudget that does not read as written (it fails closed)."""
    ref = obj if isinstance(obj, ObjectRef) else ObjectRef.of(obj, api_version="karpflow.dev/v1alpha1")
    reason = (
        Reason.INVALID_MAINTENANCE_WINDOW
        if ref.kind == "MaintenanceWindow"
        else Reason.INVALID_NODE_DISRUPTION_BUDGET
    )
    closed = "always active" if ref.kind == "MaintenanceWindow" else "allows nothing"
    return Event(ref, reason, f"Invalid {ref.kind}, it fails closed ({closed}): {problems}"[:1000])


def instance_garbage_collected(
    obj: Json | ObjectRef, instance: str, command: str, why: str, done: str
) -> Event:
    """On the instance's NodePool, and on its Node when it had one (activities/garbage_collection.py):
    `done` says what the collector did ("terminated it and deleted its Node ip-...")."""
    ref = obj if isinstance(obj, ObjectRef) else ObjectRef.of(obj)
    return Event(
        ref,
        Reason.INSTANCE_GARBAGE_COLLECTED,
        f"Instance {instance} of closed command {command}, {why}: {done}"[:1000],
    )


# -- the recorder --------------------------------------------------------------------------------------


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class _Written:
    name: str
    namespace: str
    count: int
    at: float  # monotonic time of the last write
    first: str = ""


@dataclass
class EventRecorder:
    kube: KubeApi
    component: str = COMPONENT
    host: str = field(default_factory=socket.gethostname)
    burst: int = SPAM_BURST
    refill_seconds: float = SPAM_REFILL_SECONDS
    cache_size: int = CACHE_SIZE
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    dedupe_override: timedelta | None = None  # tests: one window for every reason
    _written: OrderedDict[tuple[str, ...], _Written] = field(default_factory=OrderedDict)
    _buckets: OrderedDict[str, _Bucket] = field(default_factory=OrderedDict)
    _locks: dict[tuple[str, ...], asyncio.Lock] = field(default_factory=dict)

    def reserve(self, entries: int) -> None:
        """Room for `entries` more events than the default (a pass's batch): no entry of one pass is
        forgotten before the pass after it counts it again."""
        self.cache_size = max(self.cache_size, entries + CACHE_SIZE)

    def _forget_old(self, now: float) -> None:
        """Drop the least recently written entries beyond the size, and those older than an Event
        lives (kept in write order: the oldest first)."""
        while self._written and (
            len(self._written) > self.cache_size
            or now - next(iter(self._written.values())).at > EVENT_TTL_SECONDS
        ):
            self._written.popitem(last=False)

    async def record(self, event: Event) -> Outcome:
        """Write (or count) the event; never raises."""
        # One write at a time per event: two activities recording the same thing count it, not race.
        lock = self._locks.setdefault(event.key, asyncio.Lock())
        try:
            async with lock:
                outcome = await self._record(event)
        except Exception as err:  # best effort, whatever went wrong
            log.info("event %s on %s %s not recorded: %r", event.reason, event.on.kind, event.on.name, err)
            outcome = "failed"
        if len(self._locks) > self.cache_size:
            for key in [k for k, v in self._locks.items() if not v.locked()]:
                del self._locks[key]
        metrics.EVENTS.labels(reason=str(event.reason), outcome=outcome).inc()
        return outcome

    async def _record(self, event: Event) -> Outcome:
        now = self.clock()
        written = self._written.get(event.key)
        window = next(
            w for w in (self.dedupe_override, event.dedupe, CATALOG[event.reason].dedupe) if w is not None
        )
        if written is not None and now - written.at < window.total_seconds():
            return "deduplicated"
        if not self._take_token(event.on.key, now):
            return "rate_limited"
        stamp = self.wall_clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        if written is not None:
            try:
                await self.kube.request(
                    "PATCH",
                    f"/api/v1/namespaces/{written.namespace}/events/{written.name}",
                    body={"count": written.count + 1, "lastTimestamp": stamp, "message": event.message},
                    content_type="application/merge-patch+json",
                    request_timeout=REQUEST_TIMEOUT,
                )
                written.count += 1
                written.at = now
                self._written.move_to_end(event.key)
                return "aggregated"
            except KubeError as err:
                if err.status != 404:  # gone (Events expire after an hour): write a new one
                    raise
        name = f"{event.on.name}.{time.time_ns():x}"
        body = self._body(event, name, stamp)
        await self.kube.request(
            "POST",
            f"/api/v1/namespaces/{event.on.event_namespace}/events",
            body=body,
            request_timeout=REQUEST_TIMEOUT,
        )
        self._written[event.key] = _Written(name, event.on.event_namespace, 1, now, stamp)
        self._written.move_to_end(event.key)
        self._forget_old(now)
        return "created"

    def _take_token(self, key: str, now: float) -> bool:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) / self.refill_seconds)
        bucket.at = now
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.cache_size:
            self._buckets.popitem(last=False)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def _body(self, event: Event, name: str, stamp: str) -> Json:
        involved: Json = {"kind": event.on.kind, "name": event.on.name, "apiVersion": event.on.api_version}
        if event.on.namespace:
            involved["namespace"] = event.on.namespace
        if event.on.uid:
            involved["uid"] = event.on.uid
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": event.on.event_namespace},
            "involvedObject": involved,
            "reason": str(event.reason),
            "message": event.message,
            "type": event.event_type,
            "source": {"component": self.component, "host": self.host},
            "reportingComponent": self.component,
            "reportingInstance": self.host,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }


@dataclass
class EventBatches:
    """The Events of a controller pass, written in the background so that a pass over thousands of
    nodes never waits on the API server: at most `concurrency` writes at a time, and while one
    pass's batch is still being written the next pass's is skipped (its Events come again with the
    pass after, and the recorder would only count them anyway)."""

    recorder: EventRecorder
    concurrency: int = 8
    _running: asyncio.Task[None] | None = None

    def submit(self, batch: list[Event]) -> bool:
        """Start writing `batch`; False when the previous one is still being written."""
        if self._running is not None and not self._running.done():
            return False
        if not batch:
            return True
        self.recorder.reserve(len(batch))
        self._running = asyncio.create_task(self._write(batch), name="pass-events")
        return True

    async def _write(self, batch: list[Event]) -> None:
        slots = asyncio.Semaphore(self.concurrency)

        async def one(event: Event) -> None:
            async with slots:
                await self.recorder.record(event)  # never raises

        await asyncio.gather(*(one(event) for event in batch))

    async def wait(self) -> None:
        """Until the batch being written is written (tests, shutdown)."""
        if self._running is not None:
            await self._running


_recorders: weakref.WeakKeyDictionary[KubeApi, EventRecorder] = weakref.WeakKeyDictionary()


def recorder_for(kube: KubeApi) -> EventRecorder:
    """The process's recorder for this API connection: every activity, the interruption poller and
    the controller share its deduplication and rate limits without passing it around."""
    recorder = _recorders.get(kube)
    if recorder is None:
        recorder = _recorders[kube] = EventRecorder(kube)
    return recorder


# -- an activity's Events ------------------------------------------------------------------------------


def refs(nodes: Iterable[NodeRef]) -> list[ObjectRef]:
    """The candidate nodes an activity names, as Event subjects pinned to their UID (when known): an
    Event must land on the node the command holds, not on a later one that reuses the name."""
    return [ObjectRef("Node", n.node, uid=n.uid or "") for n in nodes]


async def record_all(recorder: EventRecorder, batch: Iterable[Event]) -> None:
    """Record the Events of one step at once. Best effort: an Event that fails to record is logged,
    never a failure of the step that records it (the recorder already swallows what the API
    refuses; this also holds for anything that escapes it)."""
    batch = list(batch)
    outcomes = await asyncio.gather(*(recorder.record(event) for event in batch), return_exceptions=True)
    for event, outcome in zip(batch, outcomes, strict=True):
        if isinstance(outcome, Exception):
            log.warning(
                "event %s on %s %s not recorded: %r", event.reason, event.on.kind, event.on.name, outcome
            )
        elif isinstance(outcome, BaseException):  # a cancellation is not a failure to swallow
            raise outcome
