"""The invariant checker: what must never happen to the simulated cluster, whatever karpflow does.

The checker is a recorder. The simulator feeds it every change of the object store (pods, nodes,
PDBs, workloads), every admitted eviction and every pod deletion made through the API, and
periodic listings of the cluster's EC2 instances. From these it keeps a mirror of the cluster and
reports violations as they happen (`check()` returns all of them; `GET /sim/invariants` is the
same report as JSON).

Definitions (bounds are *simulated* seconds, turned into wall time by the stack's TimeScale, with
a floor of `min_wall` so a zero scale does not flag transients; pods-lost has its own floor,
`lost_min_wall`, because rescheduling a pod is the simulator's own real-time work, which a loaded
machine slows whatever the scale; orphan-node has `orphan_min_wall`, because a Node outlives its
instance while the termination of a worker killed between the two steps moves to another worker:
Temporal's sticky-queue and workflow-task timeouts (10 s each), the new worker's start and, for a
worker killed while `terminate_instance` waits for EC2, that activity's heartbeat timeout
(workflows/options.py INSTANCE_TERMINATE_HEARTBEAT, 60 s) are real time too):

pdb-violation
    A *voluntary disruption* of a healthy pod after which a PodDisruptionBudget selecting it has
    fewer healthy pods than it requires: `healthy - 1 < desiredHealthy`, evaluated on the state
    just before the disruption. Healthy = Ready condition True and not terminating (as the
    disruption controller counts). desiredHealthy follows Kubernetes: minAvailable (percentages
    round up) or expected - maxUnavailable, where expected is the replicas of the pods'
    controllers (a ReplicaSet owned by a Deployment counts the Deployment's replicas).
    Voluntary disruptions are: an eviction admitted by the API; a pod DELETE made through the API;
    a pod that vanishes because its node is gone (deleted, terminating, or its instance is not
    running; the pod GC marks such a pod Failed before it deletes it, and that mark is judged as
    the loss) — unless it is a *forced termination*. Deletions by the simulator's own controllers
    on a healthy node (a ReplicaSet scaling down) are not disruptions.

do-not-disrupt
    A pod protected by `karpenter.sh/do-not-disrupt` (value "true", or a Go duration counted from
    the pod's start; the legacy `karpenter.sh/do-not-evict: "true"` too) is evicted, or is deleted
    through the API while its node is being disrupted (carries the disrupted taint or is being
    deleted), or vanishes with its node — outside a forced termination.

involuntary loss
    PDBs and do-not-disrupt protect against voluntary disruptions only: a pod lost with its node
    because EC2 took the instance (`instance_lost(id)`: a spot reclaim, an instance that vanished
    without notice, both injected by the chaos harness) is not judged. Evictions and API deletions
    of its pods still are.

forced termination
    The pod's node, or the NodeClaim with the node's providerID, carries
    `karpenter.sh/nodeclaim-termination-timestamp` and the disruption happens at or after that
    deadline (the earlier of the two) minus the pod's terminationGracePeriodSeconds (default 30): the
    moment Karpenter itself stops respecting PDBs and do-not-disrupt and deletes the pod.

pods-lost
    A ReplicaSet or StatefulSet has fewer live pods on existing nodes (bound, not terminating, not
    finished) than `spec.replicas` for longer than `bounds.replacement`. A workload is judged only
    after it has once had all its replicas scheduled, so a scenario seeded with Pending pods is not
    a loss. DaemonSets are not judged: their desired count follows the nodes.

leaked-instance
    A pending or running EC2 instance tagged `kubernetes.io/cluster/<cluster>: owned` that no Node
    references (providerID `aws:///<zone>/<instance-id>`) for longer than `bounds.registration`
    after the checker first saw it, or `bounds.node_gone` after the last Node referencing it went.

orphan-node
    A Node whose providerID names an instance that is not pending or running (terminated, or absent
    from EC2) for longer than `bounds.orphan_node`.

disruption taint
    `karpenter.sh/disrupted`, or karpflow's own `karpflow.dev/disrupted` (beside Karpenter): either
    says a disruption is in flight, in every rule below.

stale-disrupted-taint
    A Node that carries a disruption taint, is not being deleted, and has no
    disruption in flight. Where "in flight" comes from is pluggable: `check(in_flight=nodes)`, or a
    source installed with `set_in_flight_source` (the workflows can list open disruptions). With a
    source, a taint without an in-flight disruption may last `bounds.disrupted_taint`. Without
    either, the checker cannot tell a live disruption's taint from a stale one, so `check()` does
    not judge it: the report lists the tainted nodes under `unjudged` ("unknown without an in-flight
    list") and records nothing. `check(end_of_window=True)` is the caller saying the window is
    closed and nothing is in flight (a test's last line, `sim.testing.assert_no_violations`): then
    every such taint must be gone unless its node is being deleted.

maintenance-window
    A disruption starts on a node while a MaintenanceWindow that matches the node blocks the
    disruption's action, and has blocked it for at least `bounds.window_grace` (a decision taken just
    before a window opened is not a violation). A disruption starts when a disruption taint
    (`karpenter.sh/disrupted`, or `karpflow.dev/disrupted` beside Karpenter) appears on the node; its
    reason is the holder's `karpflow.io/disruption-reason` annotation, else read from the command that
    holds it
    (`karpflow.io/disruption-command: disruption/<cluster>/<pools>/<reason>/<id>@<run>`, or
    `interruption/...`; `interruption/<cluster>/<instance>/rebalance` is the Rebalance action):
    Empty → Emptiness, Underutilized → Consolidation, Drifted → Drift, Expired → Expiration, Unhealthy
    on an initialized node → Repair. Interruption and `kubectl delete node` (Manual) are never blocked.
    A window is active while a cron
    hit of one of its schedules (UTC) lies within its duration, always without schedules, and always
    (for every action when it names an unknown one, every node when its selector cannot be read)
    when it cannot be read: windows fail closed.

node-disruption-budget
    A disruption a budget governs starts on a node a NodeDisruptionBudget selects, the node was
    available just before, and, counting it, more of the budget's selected nodes are unavailable than
    it allows. Governed: the voluntary reasons (Empty, Underutilized, Drifted, the rebalance
    replacement), repair (Unhealthy: karpflow's, as Karpenter RFC #3192 asks), `kubectl delete node`
    (Manual: the termination's holder annotation says so), and an expiration a window deferred (the
    node carries `karpflow.io/expiration-deferred`). Unavailable: Ready not True, the disrupted taint,
    or an instance that is not pending or running. Allowed: maxUnavailable, or the selected count
    minus minAvailable (percentages of the selected nodes, rounded up); a budget with both, neither,
    or a percent over 100 allows nothing. A null or empty selector selects no node. Forceful
    disruptions (expiration as Karpenter v1 does it, interruption, NodePool deletion) count but are
    never violations. A taint no holder names on a node being deleted counts, and when it exceeds a
    budget the report lists it under `unjudged`: its reason cannot be read from the cluster.

garbage-collected
    The simulated Karpenter (sim/controllers/karpenter/) terminated an instance of the cluster because
    it is tagged for a NodePool and no NodeClaim names it (karpflow launched it beside Karpenter).

taint-stripped
    The simulated Karpenter removed `karpenter.sh/disrupted` from a node while a karpflow command held
    it (its `karpflow.io/disruption-command` annotation), because the node has a NodeClaim and is not
    in Karpenter's own queue.

Every violation is reported once per episode (a workload that stays short of pods is one
violation, not one per tick).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import croniter
from pydantic import BaseModel, Field

from api import constants as k
from api.duration import parse_duration
from sim.apiserver.selectors import selector_from_label_selector
from sim.timescale import TimeScale
from workflows.options import INSTANCE_TERMINATE_HEARTBEAT

Invariant = Literal[
    "pdb-violation",
    "do-not-disrupt",
    "pods-lost",
    "leaked-instance",
    "orphan-node",
    "stale-disrupted-taint",
    "maintenance-window",
    "node-disruption-budget",
    "garbage-collected",
    "taint-stripped",
]
Obj = dict[str, Any]


class InvariantBounds(BaseModel):
    """How long (simulated seconds) a transient state may last before it is a violation."""

    replacement: float = 300.0
    registration: float = 900.0  # Karpenter's registration TTL (15 min)
    node_gone: float = 60.0
    orphan_node: float = 120.0
    disrupted_taint: float = 60.0
    min_wall: float = 0.2
    lost_min_wall: float = 10.0
    # One recovery of a killed worker's instance-terminate wait, plus the task timeouts (see above).
    orphan_min_wall: float = INSTANCE_TERMINATE_HEARTBEAT.total_seconds() + 30.0
    # A window must have blocked for this long before a start it blocks is a violation, with its own
    # wall-clock floor: a command validated just before the window opened taints a moment later.
    window_grace: float = 30.0
    window_min_wall: float = 5.0


class Violation(BaseModel):
    invariant: Invariant
    subject: str  # "pod default/web-1", "instance i-0abc", "node ip-10-0-1-7", "replicaset default/web-5d8"
    message: str
    at: datetime
    details: dict[str, Any] = Field(default_factory=dict)


class InvariantReport(BaseModel):
    ok: bool
    violations: list[Violation]
    checked_at: datetime
    observed: dict[str, int]  # what the checker has seen, so an empty report is visibly not a blind one
    # Invariant -> subjects this check could not judge ("node n1": a disrupted taint, and no
    # in-flight list to tell whether a disruption owns it). Not violations; `ok` ignores them.
    unjudged: dict[str, list[str]] = Field(default_factory=dict)

    def summary(self) -> str:
        lines = [f"{v.invariant}: {v.subject}: {v.message}" for v in self.violations]
        if self.ok:
            lines = [f"no violations ({', '.join(f'{v} {n}' for n, v in self.observed.items())})"]
        lines += [
            f"{invariant}: not judged, unknown without an in-flight list: {', '.join(subjects)}"
            for invariant, subjects in self.unjudged.items()
        ]
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Pure helpers over Kubernetes objects


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def pod_key(pod: Obj) -> str:
    return f"{_meta(pod).get('namespace', 'default')}/{_meta(pod).get('name', '')}"


def is_terminating(obj: Obj) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def is_finished(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def collected_with_its_node(before: Obj | None, pod: Obj) -> bool:
    """The pod GC just marked the pod Failed because its node no longer exists (its
    `DisruptionTarget` condition, reason DeletionByPodGC): the pod is lost with its node now, though
    it is deleted a moment later, finished."""

    def collected(p: Obj) -> bool:
        return any(
            c.get("type") == "DisruptionTarget" and c.get("reason") == "DeletionByPodGC"
            for c in (p.get("status") or {}).get("conditions") or ()
        )

    return before is not None and not is_finished(before) and is_finished(pod) and collected(pod)


def is_healthy(pod: Obj) -> bool:
    """As the disruption controller counts: not terminating and Ready."""
    if is_terminating(pod) or is_finished(pod):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def controller_ref(obj: Obj) -> Obj | None:
    for ref in _meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def instance_id_of(node: Obj) -> str | None:
    """`aws:///us-west-2a/i-0abc` → `i-0abc`; None for nodes not backed by EC2."""
    provider_id = (node.get("spec") or {}).get("providerID") or ""
    if not provider_id.startswith("aws://"):
        return None
    last = provider_id.rstrip("/").rsplit("/", 1)[-1]
    return last if last.startswith("i-") else None


def has_disrupted_taint(node: Obj) -> bool:
    """Karpenter's disruption taint, or karpflow's own beside Karpenter."""
    return any(t.get("key") in k.DISRUPTION_TAINT_KEYS for t in (node.get("spec") or {}).get("taints") or [])


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def is_protected(pod: Obj, now: datetime) -> bool:
    """Whether `karpenter.sh/do-not-disrupt` (or the legacy do-not-evict) protects the pod now."""
    annotations = _meta(pod).get("annotations") or {}
    if annotations.get(k.LEGACY_DO_NOT_EVICT_ANNOTATION) == "true":
        return True
    value = annotations.get(k.DO_NOT_DISRUPT_ANNOTATION)
    if value is None:
        return False
    if value == "true":
        return True
    try:
        duration = parse_duration(value)
    except ValueError:
        return False  # Karpenter ignores a value that is neither "true" nor a duration
    started = _parse_time((pod.get("status") or {}).get("startTime")) or _parse_time(
        _meta(pod).get("creationTimestamp")
    )
    return started is None or now < started + duration


def forced_termination(
    pod: Obj, node: Obj | None, now: datetime, claim_deadline: datetime | None = None
) -> bool:
    """At or past the node's termination deadline (its own annotation, or its NodeClaim's, which is
    where Karpenter's drain reads it) minus the pod's own grace period."""
    if node is None:
        return False
    deadlines = [
        d
        for d in (
            _parse_time((_meta(node).get("annotations") or {}).get(k.TERMINATION_TIMESTAMP_ANNOTATION)),
            claim_deadline,
        )
        if d is not None
    ]
    if not deadlines:
        return False
    deadline = min(deadlines)
    grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    grace = 30 if grace is None else int(grace)
    return now >= deadline - timedelta(seconds=grace)


def scaled_value(value: int | str, total: int, *, round_up: bool = True) -> int:
    """An IntOrString against a total: 3 → 3, "50%" of 5 → 3 (rounded up, as PDBs do)."""
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.endswith("%"):
        fraction = int(text[:-1]) * total / 100
        return math.ceil(fraction) if round_up else math.floor(fraction)
    return int(text)


def desired_healthy(pdb: Obj, expected: int) -> int:
    spec = pdb.get("spec") or {}
    if spec.get("maxUnavailable") is not None:
        return max(0, expected - scaled_value(spec["maxUnavailable"], expected))
    if spec.get("minAvailable") is not None:
        return scaled_value(spec["minAvailable"], expected)
    return 0


HOLDER_ANNOTATION = "karpflow.io/disruption-command"
HOLDER_REASON_ANNOTATION = "karpflow.io/disruption-reason"
EXPIRATION_DEFERRED_ANNOTATION = "karpflow.io/expiration-deferred"
WINDOW_ACTIONS = ("Expiration", "Drift", "Emptiness", "Consolidation", "Rebalance", "Repair")
VOLUNTARY = ("Empty", "Underutilized", "Drifted")
# Reasons a NodeDisruptionBudget governs (besides a deferred expiration): judged when they exceed it.
GOVERNED = (*VOLUNTARY, "Rebalance", "Unhealthy", "Manual")
_ACTION_OF = {
    "Empty": "Emptiness",
    "Underutilized": "Consolidation",
    "Drifted": "Drift",
    "Expired": "Expiration",
    "Rebalance": "Rebalance",
}


def disruption_reason(node: Obj) -> str | None:
    """The reason of what holds the node: the holder's reason annotation, else read from the holder's
    workflow id (None: no holder, or one that names no reason). The interruption handler's rebalance
    replacement runs with reason Drifted but is its own action: "Rebalance"."""
    annotations = _meta(node).get("annotations") or {}
    holder = annotations.get(HOLDER_ANNOTATION) or ""
    workflow_id = holder.split("@", 1)[0]
    parts = workflow_id.split("/")
    if parts[0] == "interruption" and parts[-1] == "rebalance":
        return "Rebalance"
    if annotations.get(HOLDER_REASON_ANNOTATION) and holder:
        return str(annotations[HOLDER_REASON_ANNOTATION])
    if workflow_id.startswith("interruption/"):
        return "Interrupted"
    # disruption/<cluster>/<pools>/<reason>/<id> (or without the cluster)
    if len(parts) >= 4 and parts[0] == "disruption":
        return parts[-2]
    return None


def governed(reason: str | None, node: Obj) -> bool:
    """Whether a NodeDisruptionBudget must hold this disruption back (not only count it)."""
    if reason in GOVERNED:
        return True
    deferred = (_meta(node).get("annotations") or {}).get(EXPIRATION_DEFERRED_ANNOTATION)
    return reason == "Expired" and bool(deferred)


def window_action(reason: str, node: Obj) -> str | None:
    if reason == "Unhealthy":  # repair; a node that never initialized is the liveness check's
        initialized = (_meta(node).get("labels") or {}).get(k.INITIALIZED_LABEL) == "true"
        return "Repair" if initialized else None
    return _ACTION_OF.get(reason)


def node_ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _requirement_matches(req: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = req.get("key"), req.get("operator")
    values = [str(v) for v in req.get("values") or []]
    value = labels.get(str(key))
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        try:
            number, bound = int(value or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return number > bound if op == "Gt" else number < bound
    raise ValueError(f"operator {op!r}")


def window_blocks(window: Obj, action: str, labels: Mapping[str, str], now: datetime) -> datetime | None:
    """Since when `window` has blocked `action` on a node with `labels` at `now` (its last cron hit;
    the epoch for an unscheduled or unreadable window), or None when it does not block it."""
    spec = window.get("spec") if isinstance(window.get("spec"), dict) else {}
    always = datetime(1970, 1, 1, tzinfo=UTC)
    actions = spec.get("actions")
    readable = isinstance(actions, list) and bool(actions) and all(a in WINDOW_ACTIONS for a in actions)
    if readable and action not in actions:
        return None
    selector = spec.get("selector") or []
    try:
        if not all(_requirement_matches(r, labels) for r in selector):
            return None
    except (ValueError, AttributeError, TypeError):
        pass  # unreadable selector: every node
    schedules = spec.get("schedules") or []
    if not readable or not schedules:
        return always
    since = None
    for schedule in schedules:
        try:
            cron = str(schedule["cron"])
            cron = {"@midnight": "0 0 * * *", "@annually": "0 0 1 1 *"}.get(cron, cron)
            duration = parse_duration(schedule["duration"])
            start = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
            hit = croniter.croniter(cron, start).get_prev(datetime)
        except (KeyError, TypeError, ValueError, croniter.CroniterError):
            return always  # a schedule that cannot be read: the window fails closed
        if duration.total_seconds() <= 0:
            return always
        if now < hit + duration and (since is None or hit < since):
            since = hit
    return since


def ndb_allowed(ndb: Obj, selected: int) -> int:
    """Unavailable nodes the budget allows among `selected` (0 for a budget that cannot be read)."""
    spec = ndb.get("spec") or {}
    low, high = spec.get("minAvailable"), spec.get("maxUnavailable")
    if (low is None) == (high is None):
        return 0
    try:
        value = scaled_value(high if high is not None else low, selected)
    except ValueError:
        return 0
    text = str(high if high is not None else low)
    if value < 0 or (text.endswith("%") and int(text[:-1]) > 100):
        return 0
    return value if high is not None else max(selected - value, 0)


def ndb_selects(ndb: Obj, labels: Mapping[str, str]) -> bool:
    raw = (ndb.get("spec") or {}).get("selector")
    if not raw:
        return False  # null or empty: no node
    try:
        return selector_from_label_selector(raw).matches(labels)
    except (ValueError, AttributeError, TypeError):
        return True  # unreadable: fails closed for every node


# ----------------------------------------------------------------------------------------------
# The recorder


class InvariantChecker:
    """Thread-safe: events arrive in the simulator's loop, `check()` may come from any thread."""

    def __init__(
        self,
        cluster_name: str,
        *,
        scale: TimeScale | None = None,
        bounds: InvariantBounds | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.cluster_name = cluster_name
        self.scale = scale or TimeScale(1.0)
        self.bounds = bounds or InvariantBounds()
        self._clock = clock
        self._wall = wall
        self._lock = threading.RLock()
        self._in_flight_source: Callable[[], Iterable[str] | None] | None = None
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.pods: dict[str, Obj] = {}  # uid -> pod
            self.nodes: dict[str, Obj] = {}  # name -> node
            self.gone_nodes: dict[str, Obj] = {}  # last state of deleted nodes, for pods that outlive them
            self.pdbs: dict[str, Obj] = {}  # ns/name -> pdb
            self.workloads: dict[str, Obj] = {}  # uid -> ReplicaSet / StatefulSet / Deployment
            self.windows: dict[str, Obj] = {}  # name -> MaintenanceWindow
            self.ndbs: dict[str, Obj] = {}  # name -> NodeDisruptionBudget
            self.claim_deadlines: dict[str, str] = {}  # providerID -> its NodeClaim's deadline annotation
            self._window_seen: dict[str, datetime] = {}  # window name -> when its spec was last set
            self._unattributed: list[str] = []  # terminations past a budget whose reason is unknown
            self.instances: dict[str, Obj] = {}  # instance id -> last EC2 description
            self.instances_polled = False
            self.violations: list[Violation] = []
            self._disrupted_uids: set[str] = set()  # pods whose disruption was already judged
            self._since: dict[tuple[str, str], float] = {}  # open episodes: (invariant, subject) -> start
            self._reported: set[tuple[str, str]] = set()  # episodes already reported
            self._first_seen: dict[str, float] = {}  # instance id -> when first seen
            self._node_left: dict[str, float] = {}  # instance id -> when its last Node went
            self._satisfied: set[str] = set()  # workloads that once had all replicas scheduled
            self._loss_started: dict[str, float] = {}  # workload uid -> when it first lost a pod
            self.counts = {"evictions": 0, "api-deletions": 0, "events": 0, "instance-polls": 0}
            self._announced: dict[str, tuple[str, str, int]] = {}  # pod key -> token of a request in flight
            self._seq = 0
            self.lost_instances: set[str] = set()  # taken by EC2, not by a disruption (`instance_lost`)

    # -- inputs --------------------------------------------------------------------------------

    def observe(self, event_type: str, obj: Obj) -> None:
        """A store change event: ADDED / MODIFIED / DELETED of any object."""
        kind = obj.get("kind")
        with self._lock:
            self.counts["events"] += 1
            if kind == "Pod":
                self._observe_pod(event_type, obj)
            elif kind == "Node":
                name = _meta(obj).get("name", "")
                if event_type == "DELETED":
                    self.gone_nodes[name] = self.nodes.pop(name, obj)
                    if (instance := instance_id_of(obj)) is not None:
                        self._node_left[instance] = self._clock()
                else:
                    before = self.nodes.get(name)
                    self.nodes[name] = obj
                    self.gone_nodes.pop(name, None)
                    if before is not None and has_disrupted_taint(obj) and not has_disrupted_taint(before):
                        self._judge_start(obj, before)
            elif kind == "PodDisruptionBudget":
                key = f"{_meta(obj).get('namespace', 'default')}/{_meta(obj).get('name', '')}"
                if event_type == "DELETED":
                    self.pdbs.pop(key, None)
                else:
                    self.pdbs[key] = obj
            elif kind == "MaintenanceWindow":
                name = _meta(obj).get("name", "")
                if event_type == "DELETED":
                    self.windows.pop(name, None)
                    self._window_seen.pop(name, None)
                else:
                    if (self.windows.get(name) or {}).get("spec") != obj.get("spec"):
                        self._window_seen[name] = self._wall()
                    self.windows[name] = obj
            elif kind == "NodeDisruptionBudget":
                name = _meta(obj).get("name", "")
                if event_type == "DELETED":
                    self.ndbs.pop(name, None)
                else:
                    self.ndbs[name] = obj
            elif kind == "NodeClaim":
                provider_id = str((obj.get("status") or {}).get("providerID") or "")
                deadline = (_meta(obj).get("annotations") or {}).get(k.TERMINATION_TIMESTAMP_ANNOTATION)
                if provider_id and deadline and event_type != "DELETED":
                    self.claim_deadlines[provider_id] = deadline
            elif kind in ("ReplicaSet", "StatefulSet", "Deployment"):
                uid = _meta(obj).get("uid", "")
                if event_type == "DELETED":
                    self.workloads.pop(uid, None)
                else:
                    self.workloads[uid] = obj

    def announce(self, namespace: str, name: str, cause: str) -> tuple[str, str, int]:
        """An API request about to evict ("eviction") or delete ("delete") a pod; `withdraw` after.

        The HTTP layer calls this around the request, so the store's change event that the request
        causes is judged with its cause and on the state just before it.
        """
        with self._lock:
            self._seq += 1
            token = (f"{namespace}/{name}", cause, self._seq)
            self._announced[token[0]] = token
            return token

    def withdraw(self, token: tuple[str, str, int]) -> None:
        with self._lock:
            if self._announced.get(token[0]) == token:
                del self._announced[token[0]]

    def pod_evicted(self, pod: Obj) -> None:
        """An eviction the API admitted, reported before the pod's own change event."""
        with self._lock:
            self.counts["evictions"] += 1
            self._judge_disruption(self.pods.get(_meta(pod).get("uid", ""), pod), "eviction")

    def pod_deleted(self, pod: Obj) -> None:
        """A pod DELETE made through the API (not by the simulator's controllers)."""
        with self._lock:
            self.counts["api-deletions"] += 1
            self._judge_disruption(self.pods.get(_meta(pod).get("uid", ""), pod), "delete")

    def observe_instances(self, instances: Iterable[Mapping[str, Any]]) -> None:
        """A listing of EC2 instances (DescribeInstances shape); keeps the cluster's own."""
        tag = k.cluster_tag(self.cluster_name)
        now = self._clock()
        with self._lock:
            self.counts["instance-polls"] += 1
            self.instances_polled = True
            current = {}
            for instance in instances:
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags") or []}
                if tags.get(tag) != k.CLUSTER_TAG_VALUE:
                    continue
                instance_id = instance["InstanceId"]
                current[instance_id] = dict(instance)
                self._first_seen.setdefault(instance_id, now)
            self.instances = current

    def instance_lost(self, instance_id: str) -> None:
        """EC2 took this instance (a spot reclaim, a failure): the pods lost with its node were not
        disrupted by anyone, so no PDB or do-not-disrupt rule judges their loss."""
        with self._lock:
            self.lost_instances.add(instance_id)

    def set_in_flight_source(self, source: Callable[[], Iterable[str] | None] | None) -> None:
        """Names of nodes with a disruption in flight (e.g. from open Temporal workflows)."""
        self._in_flight_source = source

    # -- judging -------------------------------------------------------------------------------

    def _observe_pod(self, event_type: str, pod: Obj) -> None:
        uid = _meta(pod).get("uid", "")
        before = self.pods.get(uid)
        leaving = event_type == "DELETED" or is_terminating(pod) or collected_with_its_node(before, pod)
        announced = self._announced.get(pod_key(pod)) if leaving else None
        if leaving and before is not None and uid not in self._disrupted_uids and announced is not None:
            cause = announced[1]
            self.counts["evictions" if cause == "eviction" else "api-deletions"] += 1
            self._judge_disruption(before, cause)
        elif leaving and before is not None and uid not in self._disrupted_uids:
            # Neither an eviction nor an API delete was reported: the simulator removed it.
            node_name = (before.get("spec") or {}).get("nodeName")
            if node_name and self._node_gone(node_name):
                self._judge_disruption(before, "node-gone")
            else:
                self._disrupted_uids.add(uid)
        if leaving and before is not None and (owner := controller_ref(before)) is not None:
            self._loss_started.setdefault(owner.get("uid", ""), self._clock())
        if event_type == "DELETED":
            self.pods.pop(uid, None)
            self._disrupted_uids.discard(uid)
        else:
            self.pods[uid] = pod

    def _node_gone(self, name: str) -> bool:
        node = self.nodes.get(name)
        if node is None or is_terminating(node):
            return True
        instance = instance_id_of(node)
        if instance is None or instance not in self.instances:
            return False  # unknown (not polled yet): absence is judged by the orphan-node rule
        state = (self.instances[instance].get("State") or {}).get("Name")
        return state not in ("pending", "running")

    def _node_of(self, pod: Obj) -> Obj | None:
        name = (pod.get("spec") or {}).get("nodeName")
        if not name:
            return None
        return self.nodes.get(name) or self.gone_nodes.get(name)

    def _judge_disruption(self, pod: Obj, cause: str) -> None:
        uid = _meta(pod).get("uid", "")
        if uid in self._disrupted_uids:
            return
        self._disrupted_uids.add(uid)
        if is_terminating(pod) or is_finished(pod):
            return
        now = self._wall()
        node = self._node_of(pod)
        claim_deadline = _parse_time(
            self.claim_deadlines.get(str(((node or {}).get("spec") or {}).get("providerID")))
        )
        if forced_termination(pod, node, now, claim_deadline):
            return
        if cause == "node-gone" and node is not None and instance_id_of(node) in self.lost_instances:
            self.counts["involuntary-losses"] = self.counts.get("involuntary-losses", 0) + 1
            return
        node_name = (pod.get("spec") or {}).get("nodeName") or ""
        how = {"eviction": "evicted", "delete": "deleted through the API", "node-gone": "lost with its node"}[
            cause
        ]
        if is_protected(pod, now):
            node_disrupting = node is None or is_terminating(node) or has_disrupted_taint(node)
            if cause != "delete" or node_disrupting:
                self._record(
                    "do-not-disrupt",
                    f"pod {pod_key(pod)}",
                    f"pod with {k.DO_NOT_DISRUPT_ANNOTATION} {how} on node {node_name or '?'} "
                    f"before its termination deadline",
                    {"cause": cause, "node": node_name},
                )
        if not is_healthy(pod):
            return
        for pdb_key, pdb in self.pdbs.items():
            namespace = pdb_key.split("/", 1)[0]
            if namespace != _meta(pod).get("namespace", "default"):
                continue
            try:
                selector = selector_from_label_selector((pdb.get("spec") or {}).get("selector"))
            except ValueError:
                continue
            if not selector.matches(_meta(pod).get("labels")):
                continue
            matched = [
                p
                for p in self.pods.values()
                if _meta(p).get("namespace", "default") == namespace
                and selector.matches(_meta(p).get("labels"))
            ]
            healthy = sum(1 for p in matched if is_healthy(p))
            if not any(_meta(p).get("uid") == uid for p in matched):
                healthy += 1  # the pod itself, reported before the mirror saw it
            desired = desired_healthy(pdb, self._expected_count(matched or [pod]))
            if healthy - 1 < desired:
                self._record(
                    "pdb-violation",
                    f"pod {pod_key(pod)}",
                    f"{how} (node {node_name or '?'}) while PodDisruptionBudget {pdb_key} allowed no "
                    f"disruption ({healthy} healthy, {desired} required)",
                    {"cause": cause, "pdb": pdb_key, "healthy": healthy, "desiredHealthy": desired},
                )

    def _judge_start(self, node: Obj, before: Obj) -> None:
        """A disruption starts on `node` (its disrupted taint just appeared): windows and budgets."""
        reason = disruption_reason(node)
        name = _meta(node).get("name", "")
        holder = (_meta(node).get("annotations") or {}).get(HOLDER_ANNOTATION)
        labels = _meta(node).get("labels") or {}
        now = self._wall()
        action = window_action(reason, node) if reason is not None else None
        if action is not None:
            grace = timedelta(
                seconds=max(self.scale.seconds(self.bounds.window_grace), self.bounds.window_min_wall)
            )
            for window_name, window in sorted(self.windows.items()):
                since = window_blocks(window, action, labels, now)
                if since is None:
                    continue
                since = max(since, self._window_seen.get(window_name, since))
                if now - since >= grace:
                    self._record(
                        "maintenance-window",
                        f"node {name}",
                        f"{action} started ({holder}) while MaintenanceWindow {window_name} blocked it "
                        f"(since {since:%Y-%m-%dT%H:%M:%SZ})",
                        {"window": window_name, "action": action, "holder": holder},
                    )
        for ndb_name, ndb in sorted(self.ndbs.items()):
            if not ndb_selects(ndb, labels):
                continue
            selected = [n for n in self.nodes.values() if ndb_selects(ndb, _meta(n).get("labels") or {})]
            down = sorted(_meta(n).get("name", "") for n in selected if self._unavailable(n))
            allowed = ndb_allowed(ndb, len(selected))
            if len(down) <= allowed:
                continue
            message = (
                f"started while NodeDisruptionBudget {ndb_name} allowed {allowed} unavailable of "
                f"{len(selected)} and {len(down)} are ({', '.join(down)})"
            )
            if governed(reason, node):
                if not self._unavailable(before):  # a node already down took nothing more away
                    self._record(
                        "node-disruption-budget",
                        f"node {name}",
                        f"{reason} disruption ({holder}) {message}",
                        {"ndb": ndb_name, "allowed": allowed, "unavailable": down},
                    )
            elif reason is None and is_terminating(node):
                self._unattributed.append(f"node {name}: a termination without a holder {message}")

    def _unavailable(self, node: Obj) -> bool:
        if not node_ready(node) or has_disrupted_taint(node):
            return True
        instance = instance_id_of(node)
        if instance is None or instance not in self.instances:
            return False
        return (self.instances[instance].get("State") or {}).get("Name") not in ("pending", "running")

    def _expected_count(self, pods: list[Obj]) -> int:
        """Replicas of the pods' controllers (the Deployment for a Deployment's ReplicaSet)."""
        total = 0
        seen: set[str] = set()
        by_uid = self.workloads
        for pod in pods:
            ref = controller_ref(pod)
            if ref is None or ref.get("uid") not in by_uid:
                total += 1
                continue
            owner = by_uid[ref["uid"]]
            parent = controller_ref(owner)
            if parent is not None and parent.get("uid") in by_uid:
                owner = by_uid[parent["uid"]]
            owner_uid = _meta(owner).get("uid", "")
            if owner_uid in seen:
                continue
            seen.add(owner_uid)
            total += int((owner.get("spec") or {}).get("replicas", 1))
        return total

    def record(self, invariant: str, subject: str, message: str, details: dict[str, Any]) -> None:
        """A violation seen outside the store and EC2 listings (the simulated Karpenter's)."""
        with self._lock:
            self._record(invariant, subject, message, details)  # type: ignore[arg-type]

    def _record(self, invariant: Invariant, subject: str, message: str, details: dict[str, Any]) -> None:
        self.violations.append(
            Violation(invariant=invariant, subject=subject, message=message, at=self._wall(), details=details)
        )

    def _bound(self, simulated: float, floor: float | None = None) -> float:
        return max(self.scale.seconds(simulated), self.bounds.min_wall if floor is None else floor)

    def _episode(
        self,
        invariant: Invariant,
        subject: str,
        active: bool,
        bound: float,
        message: str,
        started: float | None = None,
        floor: float | None = None,
    ) -> None:
        """Open/close an episode (it began at `started`, default now); report it once past its bound."""
        key = (invariant, subject)
        if not active:
            self._since.pop(key, None)
            self._reported.discard(key)
            return
        since = self._since.setdefault(key, self._clock() if started is None else started)
        if key not in self._reported and self._clock() - since >= self._bound(bound, floor):
            self._reported.add(key)
            self._record(invariant, subject, message, {})

    def tick(self, in_flight: Iterable[str] | None = None) -> None:
        """Evaluate the state-based invariants now; the stack calls this periodically."""
        with self._lock:
            self._tick_workloads()
            if self.instances_polled:
                self._tick_instances()
            in_flight = self._resolve_in_flight(in_flight)
            if in_flight is not None:
                self._tick_taints(set(in_flight))

    def _resolve_in_flight(self, in_flight: Iterable[str] | None) -> Iterable[str] | None:
        if in_flight is not None:
            return in_flight
        if self._in_flight_source is not None:
            return self._in_flight_source()
        return None

    def _tick_workloads(self) -> None:
        live_nodes = {name for name, node in self.nodes.items()}
        scheduled: dict[str, int] = {}
        for pod in self.pods.values():
            ref = controller_ref(pod)
            if ref is None or is_terminating(pod) or is_finished(pod):
                continue
            if (pod.get("spec") or {}).get("nodeName") in live_nodes:
                scheduled[ref.get("uid", "")] = scheduled.get(ref.get("uid", ""), 0) + 1
        for uid, workload in self.workloads.items():
            if workload.get("kind") not in ("ReplicaSet", "StatefulSet"):
                continue
            want = int((workload.get("spec") or {}).get("replicas", 1))
            have = scheduled.get(uid, 0)
            if have >= want:
                self._satisfied.add(uid)
                self._loss_started.pop(uid, None)
            subject = f"{workload['kind'].lower()} {_meta(workload).get('namespace', 'default')}/" + _meta(
                workload
            ).get("name", "")
            self._episode(
                "pods-lost",
                subject,
                uid in self._satisfied and have < want,
                self.bounds.replacement,
                f"{have} of {want} replicas scheduled for longer than "
                f"{self.bounds.replacement:.0f}s (simulated)",
                started=self._loss_started.get(uid),
                floor=max(self.bounds.min_wall, self.bounds.lost_min_wall),
            )

    def _tick_instances(self) -> None:
        referenced = {}
        for node in self.nodes.values():
            if (instance := instance_id_of(node)) is not None:
                referenced[instance] = node
        for instance_id, instance in self.instances.items():
            state = (instance.get("State") or {}).get("Name")
            alive = state in ("pending", "running")
            unreferenced = alive and instance_id not in referenced
            had_node = instance_id in self._node_left
            bound = self.bounds.node_gone if had_node else self.bounds.registration
            # The clock starts when the Node went, or when the instance was first seen.
            started = self._node_left[instance_id] if had_node else self._first_seen[instance_id]
            self._episode(
                "leaked-instance",
                f"instance {instance_id}",
                unreferenced,
                bound,
                f"{state} instance {instance.get('InstanceType', '')} owned by cluster {self.cluster_name} "
                f"has had no Node for longer than {bound:.0f}s (simulated)"
                + (" after its Node was deleted" if had_node else " since launch"),
                started=started,
            )
        for name, node in self.nodes.items():
            instance_id = instance_id_of(node)
            if instance_id is None:
                continue
            state = ((self.instances.get(instance_id) or {}).get("State") or {}).get("Name")
            self._episode(
                "orphan-node",
                f"node {name}",
                state not in ("pending", "running"),
                self.bounds.orphan_node,
                f"instance {instance_id} is {state or 'absent'} but the Node has stayed for longer than "
                f"{self.bounds.orphan_node:.0f}s (simulated)",
                floor=max(self.bounds.min_wall, self.bounds.orphan_min_wall),
            )

    def _tick_taints(self, in_flight: set[str]) -> None:
        for name, node in self.nodes.items():
            self._episode(
                "stale-disrupted-taint",
                f"node {name}",
                has_disrupted_taint(node) and not is_terminating(node) and name not in in_flight,
                self.bounds.disrupted_taint,
                f"{k.DISRUPTED_TAINT_KEY} taint left for longer than {self.bounds.disrupted_taint:.0f}s "
                f"(simulated) with no disruption in flight",
            )

    def _lingering_taints(self) -> list[str]:
        """Nodes with the disrupted taint that are not being deleted."""
        return [
            name
            for name, node in self.nodes.items()
            if has_disrupted_taint(node) and not is_terminating(node)
        ]

    def _unreported_taints(self) -> list[str]:
        reported = {subject for invariant, subject in self._reported if invariant == "stale-disrupted-taint"}
        return [name for name in self._lingering_taints() if f"node {name}" not in reported]

    def _end_of_window_taints(self) -> None:
        """The caller closed the window with nothing in flight: every disrupted taint must be gone."""
        for name in self._lingering_taints():
            key = ("stale-disrupted-taint", f"node {name}")
            if key not in self._reported:
                self._reported.add(key)
                self._record(
                    "stale-disrupted-taint",
                    f"node {name}",
                    f"{k.DISRUPTED_TAINT_KEY} taint still present at the end of the check window and the "
                    f"node is not being deleted",
                    {},
                )

    # -- output --------------------------------------------------------------------------------

    def check(
        self, in_flight: Iterable[str] | None = None, *, end_of_window: bool = False
    ) -> InvariantReport:
        """Evaluate now and return every violation recorded since the last reset.

        With no in-flight list (argument or source) disrupted taints are reported as unjudged,
        unless `end_of_window`: the caller knows nothing is in flight any more (see the module doc).
        """
        unjudged: dict[str, list[str]] = {}
        with self._lock:
            in_flight = self._resolve_in_flight(in_flight)
            self.tick(in_flight)
            if in_flight is None and end_of_window:
                self._end_of_window_taints()
            elif in_flight is None and (tainted := self._unreported_taints()):
                unjudged["stale-disrupted-taint"] = [f"node {name}" for name in tainted]
            if self._unattributed:
                unjudged["node-disruption-budget"] = list(self._unattributed)
            observed = {
                **self.counts,
                "pods": len(self.pods),
                "nodes": len(self.nodes),
                "pdbs": len(self.pdbs),
                "maintenance-windows": len(self.windows),
                "node-disruption-budgets": len(self.ndbs),
                "instances": len(self.instances),
            }
            violations = list(self.violations)
        return InvariantReport(
            ok=not violations,
            violations=violations,
            checked_at=self._wall(),
            observed=observed,
            unjudged=unjudged,
        )


async def nodes_in_flight(client: Any, query: str = "ExecutionStatus = 'Running'") -> set[str]:
    """Nodes named (search attribute `KarpflowNodes`) by the open karpflow workflows of `client`'s
    namespace: the in-flight source for the disrupted-taint rule, e.g.

        report = stack.check_invariants(in_flight=await nodes_in_flight(temporal_client))

    `client` is a `temporalio.client.Client`; narrow `query` to a task queue when tests share one.
    """
    from api.search_attributes import NODES

    nodes: set[str] = set()
    async for execution in client.list_workflows(query):
        nodes.update(execution.typed_search_attributes.get(NODES) or [])
    return nodes
