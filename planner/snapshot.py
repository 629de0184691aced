"""The planner's typed, fast view of cluster state.

A `Snapshot` is built from the objects `kubectl get nodes,pods,pdb,ds,nodepools,ec2nodeclasses -A
-o yaml` prints (a `List`, multi-document YAML, or JSON; several files may be combined), or from the
same dicts fetched through the API by an activity (`Snapshot.from_objects`).

What EC2NodeClass drift needs of a node's instance (its AMI, subnet and security groups) is not on
any Node: Karpenter reads it from EC2. A snapshot takes it as EC2 prints it: the output of `aws ec2
describe-instances` (a document with `Reservations`) in a file beside the objects, or the instances
the controller's planning activity described (`from_objects(..., instances=...)`); each node is
linked to its instance by the id in its providerID (`Node.instance`).

Inside the planner, objects are slim `__slots__` classes holding only what the rules need, parsed
once: a 100,000-pod snapshot must load in seconds, which full pydantic pod models cannot do.
NodePools and EC2NodeClasses (few, and user-written) are validated with the pydantic models of
`api.nodepool`. karpflow's MaintenanceWindows and NodeDisruptionBudgets are read by
planner/maintenance_windows.py and planner/node_disruption_budgets.py: a broken one is kept, failing
closed, and reported. Objects of other kinds are ignored; malformed objects (a wrong type anywhere, such as
labels given as a list, or a List item that is not an object) are reported in `Snapshot.problems`
with their kind and name, and with their file when several files are combined, and skipped.

Conventions every rule relies on:
- `Pod.requests` is the scheduler's effective request: max(sum(containers) + sidecars,
  max(init containers)) + overhead, and it includes `pods=1`, so summing requests against a node's
  allocatable needs no special case for the pod count.
- Times are timezone-aware UTC datetimes.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from api.capacity_buffer import (
    CAPACITY_BUFFER_KIND,
    POD_TEMPLATE_KIND,
    CapacityBuffer,
    PodTemplate,
    read_capacity_buffer,
    read_pod_template,
)
from api.constants import (
    CAPACITY_TYPE_LABEL,
    EC2NODECLASS_LABEL,
    INITIALIZED_LABEL,
    INSTANCE_TYPE_LABEL,
    NODEPOOL_LABEL,
    REGION_LABEL,
    ZONE_LABEL,
)
from api.duration import NEVER, DurationError, karpenter_duration
from api.node_overlay import OVERLAY_KIND, ReadOverlay, read_node_overlay
from api.nodepool import EC2NodeClass, NodePool
from api.nodepool import pydantic_message as _pydantic_message
from api.nodepool_reader import read_nodepool
from api.quantity import QuantityError
from kube.disruption import disruption_taint
from kube.eviction_cost import deletion_cost as pod_deletion_cost
from kube.eviction_cost import eviction_cost as pod_eviction_cost
from kube.pods import (
    controller_owner,
    do_not_disrupt_problem,
    do_not_disrupt_reason,
    is_mirror,
    node_do_not_consolidate,
    node_do_not_disrupt_reason,
)
from kube.selectors import (
    LabelSelector,
    PodAffinityTerm,
    Requirement,
    Taint,
    Toleration,
    TopologySpreadConstraint,
    parse_node_selector_terms,
)
from kube.times import parse_time
from planner import legacy
from planner.maintenance_windows import Window, read_window
from planner.node_disruption_budgets import Ndb, read_ndb
from planner.rate_budgets import RecentDisruption
from planner.resources import ZERO, Resources

_json_loads: Callable[[bytes], Any]
try:  # orjson is several times faster on a 300 MB pod list; plain json is the fallback.
    import orjson

    _json_loads = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _json_loads = json.loads

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_EMPTY: dict[str, str] = {}
_NO_FIELDS: Mapping[str, Any] = {}  # an absent object of an API dict (metadata, spec, ...)
_ONE_POD = Resources(pods=1)


class SnapshotError(ValueError):
    """The snapshot input cannot be used at all (missing file, unparseable document)."""


def _latest(*times: datetime | None) -> datetime | None:
    present = [t for t in times if t is not None]
    return max(present) if present else None


def string_map(value: Any, field: str) -> dict[str, str]:
    """Labels, annotations or a nodeSelector: a map of strings. Anything else is a malformed object
    (ValueError), caught here so it is reported instead of crashing a rule that reads it later.
    Scalar values of hand-written YAML (`true`, `1`) become the text the API server would hold."""
    if not value:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise ValueError(f"{field}: expected a map of strings, got {type(value).__name__}")
    for key, item in value.items():
        if not (isinstance(key, str) and isinstance(item, str)):
            return {str(k): _scalar_text(v, f"{field}[{k}]") for k, v in value.items()}
    return value if isinstance(value, dict) else dict(value)


def string_field(value: Any, field: str, default: str = "") -> str:
    """A name-like string field (name, namespace, nodeName, providerID); `default` when absent.
    Anything but a string makes the object malformed: these fields key dicts and sort lists."""
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise ValueError(f"{field}: expected a string, got {type(value).__name__}")
    return value


def _scalar_text(value: Any, field: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ValueError(f"{field}: expected a string, got {type(value).__name__}")


# --- Pods -----------------------------------------------------------------------------------------


class Pod:
    """What the planner needs of a pod."""

    __slots__ = (
        "_eviction_cost",
        "_key",
        "_last_event_time",
        "_reschedulable",
        "affinity_preferred_nodes",
        "annotations",
        "creation_timestamp",
        "deletion_grace_period_seconds",
        "deletion_timestamp",
        "finished_at",
        "host_ports",
        "labels",
        "name",
        "namespace",
        "node_affinity",
        "node_name",
        "node_selector",
        "owner_kind",
        "owner_name",
        "phase",
        "pod_affinity",
        "pod_anti_affinity",
        "priority",
        "priority_class_name",
        "pvc_names",
        "ready",
        "requests",
        "scheduled_time",
        "selector_key",
        "start_time",
        "termination_grace_period_seconds",
        "tolerations",
        "topology_spread",
        "uid",
    )

    namespace: str
    name: str
    uid: str
    node_name: str | None
    phase: str
    labels: dict[str, str]
    annotations: dict[str, str]
    owner_kind: str | None
    owner_name: str | None
    priority: int
    priority_class_name: str | None
    requests: Resources
    tolerations: tuple[Toleration, ...]
    node_selector: dict[str, str]
    # Required node affinity: OR of terms, each an AND of requirements. Empty = no constraint.
    node_affinity: tuple[tuple[Requirement, ...], ...]
    # Preferred node affinity: (weight, requirements) pairs.
    affinity_preferred_nodes: tuple[tuple[int, tuple[Requirement, ...]], ...]
    # Pod (anti-)affinity terms, required ones have weight 0, preferred ones their weight.
    pod_affinity: tuple[PodAffinityTerm, ...]
    pod_anti_affinity: tuple[PodAffinityTerm, ...]
    topology_spread: tuple[TopologySpreadConstraint, ...]
    host_ports: tuple[tuple[int, str, str], ...]  # (port, protocol, hostIP)
    pvc_names: tuple[str, ...]
    creation_timestamp: datetime | None
    # Kubernetes sets deletionTimestamp to the delete request time + the grace period, which it
    # records as metadata.deletionGracePeriodSeconds (None when absent).
    deletion_timestamp: datetime | None
    deletion_grace_period_seconds: int | None
    start_time: datetime | None
    scheduled_time: datetime | None
    finished_at: datetime | None
    ready: bool
    termination_grace_period_seconds: int
    # (namespace, sorted labels): what label selectors see of the pod, and what PDB matching caches on.
    selector_key: tuple[str, tuple[tuple[str, str], ...]]
    _key: str  # set at parsing; `key` sets it for a Pod built another way

    @property
    def key(self) -> str:
        # Set once at parsing (a pass reads it for every pod of every simulation); name and namespace
        # never change after (a changed pod is a new Pod). Pods built another way compute it here.
        try:
            return self._key
        except AttributeError:
            self._key = key = f"{self.namespace}/{self.name}"
            return key

    def __repr__(self) -> str:
        return f"Pod({self.key} on {self.node_name})"

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def is_terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def is_terminating(self) -> bool:
        return self.deletion_timestamp is not None

    @property
    def is_active(self) -> bool:
        return not self.is_terminal and self.deletion_timestamp is None

    @property
    def is_pending(self) -> bool:
        """Not yet bound to a node and not finished: the provisioner's concern."""
        return not self.node_name and not self.is_terminal and self.deletion_timestamp is None

    @property
    def is_daemonset(self) -> bool:
        return self.owner_kind == "DaemonSet"

    @property
    def is_mirror(self) -> bool:
        return is_mirror(self.annotations, self.owner_kind)

    @property
    def is_statefulset(self) -> bool:
        return self.owner_kind == "StatefulSet"

    @property
    def is_reschedulable(self) -> bool:
        """Counts toward a node's workload (Karpenter §1.3): active, or terminating but owned by a
        StatefulSet (its replacement cannot start until it is gone); never DaemonSet or mirror pods."""
        return self._reschedulable

    def _derive(self) -> None:
        """What every pass reads of every pod, worked out once at parse (a pod is never changed
        afterwards: a changed pod is a new Pod)."""
        self._reschedulable = not (self.is_daemonset or self.is_mirror or self.is_terminal) and (
            self.deletion_timestamp is None or self.is_statefulset
        )
        self._last_event_time = _latest(
            self.scheduled_time, self.start_time, self.terminating_since, self.finished_at
        )
        self._eviction_cost = pod_eviction_cost(self.annotations, self.priority)

    def tolerates(self, taint: Taint) -> bool:
        return any(t.tolerates(taint) for t in self.tolerations)

    # -- disruption controls -----------------------------------------------------------------------
    def do_not_disrupt_reason(self, now: datetime) -> str | None:
        """The annotation that protects this pod right now (kube.pods); terminal or terminating pods
        are never protected."""
        if not self.is_active:
            return None
        return do_not_disrupt_reason(self.annotations, self.start_time or self.creation_timestamp, now)

    @property
    def deletion_cost(self) -> int:
        return pod_deletion_cost(self.annotations)

    @property
    def eviction_cost(self) -> float:
        """Karpenter's per-pod cost: 1 + deletion-cost/2^27 + priority/2^25, clamped to [-10, 10]."""
        return self._eviction_cost

    @property
    def terminating_since(self) -> datetime | None:
        """When the pod was asked to terminate: deletionTimestamp minus the grace period it was
        given (metadata.deletionGracePeriodSeconds, else spec.terminationGracePeriodSeconds), since
        the API server puts deletionTimestamp at the end of the grace period, not at the request."""
        if self.deletion_timestamp is None:
            return None
        grace = self.deletion_grace_period_seconds
        if grace is None:
            grace = self.termination_grace_period_seconds
        return self.deletion_timestamp - timedelta(seconds=max(grace, 0))

    @property
    def last_event_time(self) -> datetime | None:
        """Latest pod event that resets the node's consolidateAfter clock: bound/started,
        started terminating, or finished (Karpenter's pod-events controller)."""
        return self._last_event_time


_REQUEST_CACHE: dict[tuple[tuple[tuple[str, Any], ...], tuple[tuple[str, Any], ...]], Resources] = {}


def _container_request(container: Mapping[str, Any]) -> Resources:
    resources = container.get("resources")
    if not resources:
        return ZERO
    requests = resources.get("requests") or _EMPTY
    limits = resources.get("limits") or _EMPTY
    # Replicas repeat the same few request/limit pairs: parse each distinct pair once.
    key = (tuple(requests.items()), tuple(limits.items()))
    cached = _REQUEST_CACHE.get(key)
    if cached is None:
        if limits:
            # The API server defaults a missing request to the limit; kubectl output already shows
            # it, but hand-written or generated snapshots may not.
            missing = {k: v for k, v in limits.items() if k not in requests}
            if missing:
                requests = {**requests, **missing}
        cached = Resources.from_kube(requests)
        if len(_REQUEST_CACHE) < 100_000:
            _REQUEST_CACHE[key] = cached
    return cached


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """Effective scheduling request of a pod spec, including `pods=1`.

    Kubernetes rule: containers run together, init containers one at a time; restartable init
    containers (sidecars) keep running, so they add to everything started after them.
    """
    total = ZERO
    for container in spec.get("containers") or ():
        total = total + _container_request(container)
    init_containers = spec.get("initContainers")
    if init_containers:
        sidecars = ZERO
        peak = ZERO
        for container in init_containers:
            request = _container_request(container)
            if container.get("restartPolicy") == "Always":
                sidecars = sidecars + request
                peak = peak.max(sidecars)
            else:
                peak = peak.max(sidecars + request)
        total = (total + sidecars).max(peak)
    overhead = spec.get("overhead")
    if overhead:
        total = total + Resources.from_kube(overhead)
    return total + _ONE_POD


_TOLERATION_CACHE: dict[tuple[tuple[tuple[str, Any], ...], ...], tuple[Toleration, ...]] = {}


def _tolerations(raw: list[Mapping[str, Any]]) -> tuple[Toleration, ...]:
    """Parsed tolerations, shared between pods with identical lists (most pods have the same two)."""
    try:
        key = tuple([tuple(t.items()) for t in raw])
    except (AttributeError, TypeError):
        key = None
    cached = _TOLERATION_CACHE.get(key) if key is not None else None
    if cached is None:
        cached = tuple(Toleration.from_dict(t, f"tolerations[{i}]") for i, t in enumerate(raw))
        if key is not None and len(_TOLERATION_CACHE) < 10_000:
            _TOLERATION_CACHE[key] = cached
    return cached


def _parse_affinity(pod: Pod, affinity: Mapping[str, Any] | None) -> None:
    pod.node_affinity = ()
    pod.affinity_preferred_nodes = ()
    pod.pod_affinity = ()
    pod.pod_anti_affinity = ()
    if not affinity:
        return
    node = affinity.get("nodeAffinity")
    if node:
        required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
        if required:
            pod.node_affinity = parse_node_selector_terms(
                required.get("nodeSelectorTerms") or [], "affinity.nodeAffinity.required.nodeSelectorTerms"
            )
        preferred = []
        for index, item in enumerate(node.get("preferredDuringSchedulingIgnoredDuringExecution") or ()):
            terms = parse_node_selector_terms(
                [item.get("preference") or {}], f"affinity.nodeAffinity.preferred[{index}]"
            )
            preferred.append((int(item.get("weight", 1)), terms[0]))
        pod.affinity_preferred_nodes = tuple(preferred)
    for kind, attr in (("podAffinity", "pod_affinity"), ("podAntiAffinity", "pod_anti_affinity")):
        section = affinity.get(kind)
        if not section:
            continue
        pod_terms = [
            PodAffinityTerm.from_dict(t, f"affinity.{kind}.required[{i}]")
            for i, t in enumerate(section.get("requiredDuringSchedulingIgnoredDuringExecution") or ())
        ]
        for i, item in enumerate(section.get("preferredDuringSchedulingIgnoredDuringExecution") or ()):
            pod_terms.append(
                PodAffinityTerm.from_dict(
                    item.get("podAffinityTerm") or {},
                    f"affinity.{kind}.preferred[{i}]",
                    weight=int(item.get("weight", 1)),
                )
            )
        setattr(pod, attr, tuple(pod_terms))


def parse_pod(raw: Mapping[str, Any], owner_kind_hint: str | None = None) -> Pod:
    """A Pod from its API dict (also used for DaemonSet pod templates). Raises ValueError/KeyError."""
    meta = raw.get("metadata") or _NO_FIELDS
    spec = raw.get("spec") or _NO_FIELDS
    status = raw.get("status") or _NO_FIELDS
    pod = Pod()
    pod.namespace = string_field(meta.get("namespace"), "metadata.namespace", "default")
    pod.name = string_field(meta.get("name"), "metadata.name")
    pod._key = f"{pod.namespace}/{pod.name}"
    pod.uid = string_field(meta.get("uid"), "metadata.uid")
    pod.node_name = string_field(spec.get("nodeName"), "spec.nodeName") or None
    pod.phase = status.get("phase") or "Pending"
    pod.labels = string_map(meta.get("labels"), "metadata.labels")
    pod.selector_key = (pod.namespace, tuple(sorted(pod.labels.items())) if pod.labels else ())
    pod.annotations = string_map(meta.get("annotations"), "metadata.annotations")
    pod.owner_kind, pod.owner_name = controller_owner(meta.get("ownerReferences"))
    if pod.owner_kind is None:
        pod.owner_kind = owner_kind_hint
    pod.priority = int(spec.get("priority") or 0)
    pod.priority_class_name = spec.get("priorityClassName")
    pod.requests = pod_requests(spec)
    tolerations = spec.get("tolerations")
    pod.tolerations = _tolerations(tolerations) if tolerations else ()
    pod.node_selector = string_map(spec.get("nodeSelector"), "spec.nodeSelector")
    _parse_affinity(pod, spec.get("affinity"))
    spread = spec.get("topologySpreadConstraints")
    pod.topology_spread = (
        tuple(
            TopologySpreadConstraint.from_dict(c, f"topologySpreadConstraints[{i}]")
            for i, c in enumerate(spread)
        )
        if spread
        else ()
    )
    ports = []
    for container in spec.get("containers") or ():
        for port in container.get("ports") or ():
            host_port = port.get("hostPort")
            if host_port:
                ports.append((int(host_port), port.get("protocol") or "TCP", port.get("hostIP") or "0.0.0.0"))
    pod.host_ports = tuple(ports)
    volumes = spec.get("volumes")
    pod.pvc_names = (
        tuple(v["persistentVolumeClaim"]["claimName"] for v in volumes if v.get("persistentVolumeClaim"))
        if volumes
        else ()
    )
    pod.termination_grace_period_seconds = int(spec.get("terminationGracePeriodSeconds", 30))
    pod.creation_timestamp = parse_time(meta.get("creationTimestamp"))
    pod.deletion_timestamp = parse_time(meta.get("deletionTimestamp"))
    grace = meta.get("deletionGracePeriodSeconds")
    pod.deletion_grace_period_seconds = int(grace) if grace is not None else None
    pod.start_time = parse_time(status.get("startTime"))
    pod.scheduled_time = None
    pod.ready = False
    for condition in status.get("conditions") or ():
        kind = condition.get("type")
        if kind == "Ready":
            pod.ready = condition.get("status") == "True"
        elif kind == "PodScheduled" and condition.get("status") == "True":
            pod.scheduled_time = parse_time(condition.get("lastTransitionTime"))
    finished = None
    for container_status in status.get("containerStatuses") or ():
        terminated = (container_status.get("state") or _NO_FIELDS).get("terminated")
        if terminated:
            finished = _latest(finished, parse_time(terminated.get("finishedAt")))
    pod.finished_at = finished
    pod._derive()
    return pod


# --- Nodes ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InstanceFacts:
    """What EC2 says of a node's instance (DescribeInstances): what EC2NodeClass drift compares."""

    instance_id: str
    image_id: str | None
    subnet_id: str | None
    security_group_ids: frozenset[str]


def parse_instance(raw: Mapping[str, Any]) -> InstanceFacts:
    """One instance of a DescribeInstances response."""
    instance_id = string_field(raw.get("InstanceId"), "InstanceId")
    if not instance_id:
        raise ValueError("InstanceId is required")
    groups = raw.get("SecurityGroups") or ()
    if not isinstance(groups, list | tuple):
        raise ValueError("SecurityGroups must be a list")
    return InstanceFacts(
        instance_id=instance_id,
        image_id=string_field(raw.get("ImageId"), "ImageId") or None,
        subnet_id=string_field(raw.get("SubnetId"), "SubnetId") or None,
        security_group_ids=frozenset(
            string_field(g.get("GroupId"), "SecurityGroups[].GroupId")
            for g in groups
            if isinstance(g, Mapping)
        ),
    )


def instance_id_of(provider_id: str | None) -> str | None:
    """The EC2 instance id at the end of an `aws:///<zone>/<id>` providerID."""
    tail = (provider_id or "").rsplit("/", 1)[-1]
    return tail if tail.startswith("i-") else None


class Node:
    __slots__ = (
        "allocatable",
        "annotations",
        "capacity",
        "conditions",
        "creation_timestamp",
        "deletion_timestamp",
        "finalizers",
        "instance",
        "labels",
        "name",
        "nodeclaim",
        "pods",
        "pods_source",
        "provider_id",
        "ready",
        "ready_since",
        "taints",
        "uid",
        "unschedulable",
    )

    name: str
    uid: str
    labels: dict[str, str]
    annotations: dict[str, str]
    taints: tuple[Taint, ...]
    provider_id: str | None
    creation_timestamp: datetime | None
    deletion_timestamp: datetime | None
    ready: bool
    ready_since: datetime | None  # lastTransitionTime of the Ready condition while Ready
    conditions: dict[str, tuple[str, datetime | None]]  # type -> (status, lastTransitionTime)
    unschedulable: bool
    capacity: Resources
    allocatable: Resources
    finalizers: tuple[str, ...]
    pods: list[Pod]  # every pod bound to the node, any phase
    # The snapshot builder's list `pods` was copied from, or None: the builder replaces a node's list
    # when one of its pods changes and never changes one in place, so the same object in two
    # snapshots means the same Pod objects in the same order (planner/pass_cache.py).
    pods_source: Sequence[Pod] | None
    nodeclaim: NodeClaim | None
    instance: InstanceFacts | None  # what EC2 says of its instance, when the snapshot was told

    def __repr__(self) -> str:
        return f"Node({self.name})"

    def copy(self) -> Node:
        """A shallow copy: a snapshot links pods, its NodeClaim and its instance to its own copy, so
        one parsed node can serve many snapshots (snapshot_builder.py)."""
        node = Node.__new__(Node)
        for slot in Node.__slots__:
            setattr(node, slot, getattr(self, slot))
        return node

    @property
    def nodepool(self) -> str | None:
        return legacy.node_pool_name(self.labels, NODEPOOL_LABEL)

    @property
    def instance_type(self) -> str | None:
        return self.labels.get(INSTANCE_TYPE_LABEL) or self.labels.get("beta.kubernetes.io/instance-type")

    @property
    def zone(self) -> str | None:
        return self.labels.get(ZONE_LABEL) or self.labels.get("failure-domain.beta.kubernetes.io/zone")

    @property
    def region(self) -> str | None:
        return self.labels.get(REGION_LABEL) or self.labels.get("failure-domain.beta.kubernetes.io/region")

    @property
    def capacity_type(self) -> str | None:
        return self.labels.get(CAPACITY_TYPE_LABEL)

    @property
    def nodeclass(self) -> str | None:
        return self.labels.get(EC2NODECLASS_LABEL)

    @property
    def initialized(self) -> bool:
        return self.labels.get(INITIALIZED_LABEL) == "true"

    @property
    def is_deleting(self) -> bool:
        if self.deletion_timestamp is not None:
            return True
        claim = self.nodeclaim
        return claim is not None and (claim.deletion_timestamp is not None or claim.instance_terminating)

    @property
    def disruption_taint(self) -> str | None:
        """The taint saying a disruption is in flight: v1's `karpenter.sh/disrupted`, karpflow's own
        `karpflow.dev/disrupted` (beside Karpenter), or v1beta1's `karpenter.sh/disruption=disrupting`
        left by an older controller. None when untainted."""
        return disruption_taint((taint.key, taint.value) for taint in self.taints)

    @property
    def has_disrupted_taint(self) -> bool:
        return self.disruption_taint is not None

    @property
    def do_not_disrupt(self) -> bool:
        return node_do_not_disrupt_reason(self.annotations) is not None

    @property
    def do_not_consolidate(self) -> bool:
        return node_do_not_consolidate(self.annotations)

    def annotation(self, key: str) -> str | None:
        """Node annotation, falling back to the NodeClaim's (Karpenter keeps hashes on the NodeClaim)."""
        value = self.annotations.get(key)
        if value is None and self.nodeclaim is not None:
            value = self.nodeclaim.annotations.get(key)
        return value


def parse_node(raw: Mapping[str, Any]) -> Node:
    meta = raw.get("metadata") or _NO_FIELDS
    spec = raw.get("spec") or _NO_FIELDS
    status = raw.get("status") or _NO_FIELDS
    node = Node()
    node.name = string_field(meta.get("name"), "metadata.name")
    if not node.name:
        raise ValueError("metadata.name is required")
    node.uid = string_field(meta.get("uid"), "metadata.uid")
    node.labels = string_map(meta.get("labels"), "metadata.labels")
    node.annotations = string_map(meta.get("annotations"), "metadata.annotations")
    node.taints = tuple(
        Taint.from_dict(t, f"spec.taints[{i}]") for i, t in enumerate(spec.get("taints") or ())
    )
    node.provider_id = string_field(spec.get("providerID"), "spec.providerID") or None
    node.unschedulable = bool(spec.get("unschedulable"))
    node.creation_timestamp = parse_time(meta.get("creationTimestamp"))
    node.deletion_timestamp = parse_time(meta.get("deletionTimestamp"))
    node.finalizers = tuple(meta.get("finalizers") or ())
    node.ready = False
    node.ready_since = None
    node.conditions = {}
    for condition in status.get("conditions") or ():
        if isinstance(condition, Mapping) and isinstance(condition.get("type"), str):
            node.conditions[condition["type"]] = (
                str(condition.get("status") or "Unknown"),
                parse_time(condition.get("lastTransitionTime")),
            )
        if condition.get("type") == "Ready":
            node.ready = condition.get("status") == "True"
            if node.ready:
                node.ready_since = parse_time(condition.get("lastTransitionTime"))
    try:
        node.capacity = Resources.from_kube(status.get("capacity"))
        node.allocatable = Resources.from_kube(status.get("allocatable") or status.get("capacity"))
    except QuantityError as err:
        raise ValueError(f"status.capacity/allocatable: {err}") from None
    node.pods = []
    node.pods_source = None
    node.nodeclaim = None
    node.instance = None
    return node


# --- NodeClaims -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Condition:
    status: str
    reason: str | None
    last_transition: datetime | None
    message: str | None = None


class NodeClaim:
    __slots__ = (
        "annotations",
        "conditions",
        "creation_timestamp",
        "deletion_timestamp",
        "expire_after",
        "image_id",
        "labels",
        "last_pod_event_time",
        "name",
        "node_name",
        "problems",
        "provider_id",
        "termination_grace_period",
    )

    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    node_name: str | None
    provider_id: str | None
    image_id: str | None
    creation_timestamp: datetime | None
    deletion_timestamp: datetime | None
    conditions: dict[str, Condition]
    # Valid durations ("Never" allowed); None when the spec does not say. An invalid one reads as
    # "Never" (never expires; no drain deadline) and is in `problems`.
    expire_after: str | None
    termination_grace_period: str | None
    last_pod_event_time: datetime | None
    problems: list[str]

    @property
    def nodepool(self) -> str | None:
        return self.labels.get(NODEPOOL_LABEL)

    def condition_true(self, kind: str) -> bool:
        condition = self.conditions.get(kind)
        return condition is not None and condition.status == "True"

    @property
    def instance_terminating(self) -> bool:
        return self.condition_true("InstanceTerminating")


def _claim_duration(claim: NodeClaim, spec: Mapping[str, Any], field: str, never_ok: bool) -> str | None:
    value = spec.get(field)
    if value is None:
        return None
    try:
        karpenter_duration(value, never_ok=never_ok)
    except DurationError as err:
        read_as = "the node never expires" if field == "expireAfter" else "no drain deadline"
        claim.problems.append(f"spec.{field}: {err} (read as {read_as})")
        return NEVER
    assert isinstance(value, str)  # karpenter_duration refuses anything else
    return value


def parse_nodeclaim(raw: Mapping[str, Any]) -> NodeClaim:
    meta = raw.get("metadata") or _NO_FIELDS
    spec = raw.get("spec") or _NO_FIELDS
    status = raw.get("status") or _NO_FIELDS
    claim = NodeClaim()
    claim.name = string_field(meta.get("name"), "metadata.name")
    if not claim.name:
        raise ValueError("metadata.name is required")
    claim.labels = string_map(meta.get("labels"), "metadata.labels")
    claim.annotations = string_map(meta.get("annotations"), "metadata.annotations")
    claim.node_name = string_field(status.get("nodeName"), "status.nodeName") or None
    claim.provider_id = string_field(status.get("providerID"), "status.providerID") or None
    claim.image_id = string_field(status.get("imageID"), "status.imageID") or None
    claim.creation_timestamp = parse_time(meta.get("creationTimestamp"))
    claim.deletion_timestamp = parse_time(meta.get("deletionTimestamp"))
    claim.conditions = {
        c["type"]: Condition(
            str(c.get("status", "Unknown")),
            c.get("reason"),
            parse_time(c.get("lastTransitionTime")),
            c.get("message"),
        )
        for c in status.get("conditions") or ()
        if c.get("type")
    }
    claim.problems = []
    claim.expire_after = _claim_duration(claim, spec, "expireAfter", never_ok=True)
    claim.termination_grace_period = _claim_duration(claim, spec, "terminationGracePeriod", never_ok=False)
    claim.last_pod_event_time = parse_time(status.get("lastPodEventTime"))
    return claim


# --- PodDisruptionBudgets -------------------------------------------------------------------------


class PDB:
    __slots__ = (
        "current_healthy",
        "desired_healthy",
        "disruptions_allowed",
        "expected_pods",
        "max_unavailable",
        "min_available",
        "name",
        "namespace",
        "selector",
        "status_allowed",
        "unhealthy_pod_eviction_policy",
    )

    namespace: str
    name: str
    selector: LabelSelector | None  # None: a null selector matches no pod
    min_available: int | str | None
    max_unavailable: int | str | None
    unhealthy_pod_eviction_policy: str
    status_allowed: int | None  # status.disruptionsAllowed as printed, None when absent
    # Filled by the snapshot (status when present, else computed from the pods):
    disruptions_allowed: int
    current_healthy: int
    desired_healthy: int
    expected_pods: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def __repr__(self) -> str:
        return f"PDB({self.key}, allowed={self.disruptions_allowed})"

    def copy(self) -> PDB:
        """A shallow copy: a snapshot settles disruptionsAllowed on its own copy."""
        pdb = PDB.__new__(PDB)
        for slot in PDB.__slots__:
            setattr(pdb, slot, getattr(self, slot))
        return pdb

    def selects(self, pod: Pod) -> bool:
        return (
            pod.namespace == self.namespace
            and self.selector is not None
            and self.selector.matches(pod.labels)
        )

    @property
    def blocks_all_evictions(self) -> bool:
        """maxUnavailable 0 / "0%" or minAvailable "100%": no pod it covers may ever be evicted, so
        the scheduling simulation buys no capacity for them (§2.6)."""
        return self.max_unavailable in (0, "0", "0%") or self.min_available == "100%"

    def compute_allowed(self, matching: Sequence[Pod]) -> None:
        """Kubernetes' disruption controller arithmetic, used when the snapshot has no status.

        expected = matching non-terminal pods (the controller uses the owners' scale; pods are the
        best offline approximation); healthy = those that are Ready and not terminating. Percentages
        round up, as the disruption controller does.
        """
        pods = [p for p in matching if not p.is_terminal]
        expected = len(pods)
        healthy = sum(1 for p in pods if p.ready and p.deletion_timestamp is None)
        if self.max_unavailable is not None:
            desired = max(0, expected - _scaled(self.max_unavailable, expected))
        elif self.min_available is not None:
            desired = _scaled(self.min_available, expected)
        else:
            desired = 0  # neither field set: the disruption controller requires no healthy pods
        self.expected_pods = expected
        self.current_healthy = healthy
        self.desired_healthy = desired
        if self.status_allowed is None:
            self.disruptions_allowed = max(0, healthy - desired)


def _scaled(value: int | str, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def _int_or_percent(value: Any, field: str) -> int | str | None:
    if value is None:
        return None
    if isinstance(value, int) and value >= 0:
        return value
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    if text.endswith("%") and text[:-1].isdigit():
        return text
    raise ValueError(f"{field}: {value!r} is not a non-negative integer or percentage")


def parse_pdb(raw: Mapping[str, Any]) -> PDB:
    meta = raw.get("metadata") or _NO_FIELDS
    spec = raw.get("spec") or _NO_FIELDS
    status = raw.get("status") or _NO_FIELDS
    pdb = PDB()
    pdb.namespace = string_field(meta.get("namespace"), "metadata.namespace", "default")
    pdb.name = string_field(meta.get("name"), "metadata.name")
    selector = spec.get("selector")
    pdb.selector = LabelSelector.from_dict(selector, "spec.selector") if selector is not None else None
    pdb.min_available = _int_or_percent(spec.get("minAvailable"), "spec.minAvailable")
    pdb.max_unavailable = _int_or_percent(spec.get("maxUnavailable"), "spec.maxUnavailable")
    if pdb.min_available is not None and pdb.max_unavailable is not None:
        raise ValueError("spec.minAvailable and spec.maxUnavailable are mutually exclusive")
    pdb.unhealthy_pod_eviction_policy = spec.get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
    allowed = status.get("disruptionsAllowed") if status else None
    pdb.status_allowed = int(allowed) if allowed is not None else None
    pdb.disruptions_allowed = pdb.status_allowed if pdb.status_allowed is not None else 0
    pdb.current_healthy = int(status.get("currentHealthy", 0)) if status else 0
    pdb.desired_healthy = int(status.get("desiredHealthy", 0)) if status else 0
    pdb.expected_pods = int(status.get("expectedPods", 0)) if status else 0
    return pdb


# --- DaemonSets -----------------------------------------------------------------------------------


@dataclass(slots=True)
class DaemonSet:
    namespace: str
    name: str
    pod: Pod  # the pod template: requests, tolerations, node selector and affinity

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_daemonset(raw: Mapping[str, Any]) -> DaemonSet:
    meta = raw.get("metadata") or _NO_FIELDS
    template = (raw.get("spec") or _NO_FIELDS).get("template") or _NO_FIELDS
    namespace = string_field(meta.get("namespace"), "metadata.namespace", "default")
    name = string_field(meta.get("name"), "metadata.name")
    pod = parse_pod(
        {
            "metadata": {**(template.get("metadata") or {}), "namespace": namespace, "name": name},
            "spec": template.get("spec") or {},
        },
        owner_kind_hint="DaemonSet",
    )
    pod.owner_name = name
    return DaemonSet(namespace, name, pod)


# --- NodePools ------------------------------------------------------------------------------------


def parse_nodepool(raw: Mapping[str, Any]) -> tuple[NodePool, list[str]]:
    """A NodePool (v1, v1beta1 or a v1alpha5 Provisioner) and the invalid settings found in it.

    An invalid budget is dropped, an invalid duration reads as the value that disrupts nothing
    (`api.nodepool.read_nodepool`); either is reported and the pool fails closed (no disruption for
    any budgeted reason) until it is fixed, like Karpenter.
    """
    problems: list[str] = []
    if raw.get("kind") == legacy.PROVISIONER_KIND:
        raw, problems = legacy.provisioner_to_nodepool(raw)
    elif legacy.is_legacy_nodepool(raw):
        raw = legacy.upgrade_v1beta1_nodepool(raw)
    pool, more = read_nodepool(raw)
    return pool, problems + more


def parse_nodeclass(raw: Mapping[str, Any]) -> tuple[EC2NodeClass, str | None]:
    """An EC2NodeClass and why it is not Ready (None when Ready, or when its status does not say)."""
    nodeclass = EC2NodeClass.model_validate(raw)
    for condition in (raw.get("status") or _NO_FIELDS).get("conditions") or ():
        if condition.get("type") == "Ready" and condition.get("status") != "True":
            status = condition.get("status") or "Unknown"
            return nodeclass, str(condition.get("message") or condition.get("reason") or f"Ready={status}")
    return nodeclass, None


# --- The snapshot ---------------------------------------------------------------------------------

_NODE_KINDS = {"Node"}
_POD_KINDS = {"Pod"}
_PDB_KINDS = {"PodDisruptionBudget"}
_DS_KINDS = {"DaemonSet"}
_NODEPOOL_KINDS = {"NodePool", legacy.PROVISIONER_KIND}
_NODECLASS_KINDS = {"EC2NodeClass"}
_NODECLAIM_KINDS = {"NodeClaim"}
_WINDOW_KINDS = {"MaintenanceWindow"}
_NDB_KINDS = {"NodeDisruptionBudget"}
_OVERLAY_KINDS = {OVERLAY_KIND}


@dataclass(eq=False)
class Snapshot:
    """Cluster state at `now`. Build with `load_snapshot(paths)` or `Snapshot.from_objects(dicts)`.

    Compared and hashed by identity (caches may key on a snapshot)."""

    now: datetime
    nodes: dict[str, Node] = field(default_factory=dict)
    pods: list[Pod] = field(default_factory=list)
    pdbs: list[PDB] = field(default_factory=list)
    nodepools: dict[str, NodePool] = field(default_factory=dict)
    nodeclasses: dict[str, EC2NodeClass] = field(default_factory=dict)
    daemonsets: list[DaemonSet] = field(default_factory=list)
    nodeclaims: dict[str, NodeClaim] = field(default_factory=dict)
    instances: dict[str, InstanceFacts] = field(default_factory=dict)  # EC2 instance id -> facts
    # "Kind namespace/name: what is wrong" for every object that was skipped or partly ignored.
    problems: list[str] = field(default_factory=list)
    # NodePool name -> invalid budgets (the pool fails closed).
    budget_errors: dict[str, list[str]] = field(default_factory=dict)
    # EC2NodeClass name -> why it is not Ready (its Ready condition's message).
    nodeclass_not_ready: dict[str, str] = field(default_factory=dict)
    # karpflow's operator controls (karpflow.dev/v1alpha1), by name; broken ones fail closed.
    maintenance_windows: dict[str, Window] = field(default_factory=dict)
    node_disruption_budgets: dict[str, Ndb] = field(default_factory=dict)
    # CapacityBuffers (autoscaling.x-k8s.io) and PodTemplates, by namespace/name: the buffers' pods,
    # which keep a node from counting as empty (planner/capacity_buffers.py).
    capacity_buffers: dict[str, CapacityBuffer] = field(default_factory=dict)
    pod_templates: dict[str, PodTemplate] = field(default_factory=dict)
    # Karpenter's NodeOverlays (karpenter.sh/v1alpha1), by name, each with what stops it applying;
    # planner/node_overlay.py applies them to the catalog when the NodeOverlay gate is on.
    node_overlays: dict[str, ReadOverlay] = field(default_factory=dict)
    # Disruptions started recently, for rate budgets (empty when the caller does not know them).
    recent_disruptions: list[RecentDisruption] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    _pdb_cache: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[PDB, ...]] = field(
        default_factory=dict, repr=False
    )  # by Pod.selector_key
    _pdb_index: dict[tuple[str, tuple[str, str] | None], tuple[tuple[int, PDB], ...]] | None = field(
        default=None, repr=False
    )

    def __post_init__(self) -> None:
        # Every rule compares with UTC times, and budget schedules are evaluated in now's offset.
        self.now = parse_time(self.now) or self.now

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_objects(
        cls,
        objects: Iterable[Mapping[str, Any]],
        now: datetime | None = None,
        source: str = "<objects>",
        instances: Iterable[Mapping[str, Any]] = (),
    ) -> Snapshot:
        """Build from API dicts (each with `kind`) and EC2 instances as DescribeInstances gives them.
        Unknown kinds are ignored, bad objects reported."""
        snapshot = cls(now=now or datetime.now(UTC))
        snapshot.sources.append(source)
        snapshot._add_objects(objects, source)
        snapshot._add_objects(instances, source)
        snapshot._index()
        return snapshot

    def _add_objects(self, objects: Iterable[object], source: str) -> None:
        """Parse objects into the snapshot (`objects` may be a stream: nothing is kept of it)."""
        for obj in objects:
            if not isinstance(obj, Mapping):
                what = obj if isinstance(obj, NotAnObject) else f"not an object: {_preview(obj)}"
                self.problems.append(f"{what} (skipped)")
                continue
            kind = obj.get("kind")
            if kind is None and "InstanceId" in obj:  # an EC2 instance (DescribeInstances), no kind
                self._add(obj, "EC2 instance", parse_instance, self._put_instance)
                continue
            if not isinstance(kind, str):
                if kind is not None:
                    self.problems.append(f"object {_object_name(obj)}: kind {_preview(kind)} is not a string")
                continue
            if kind in _POD_KINDS:
                self._add(obj, kind, parse_pod, self._put_pod)
            elif kind in _NODE_KINDS:
                self._add(obj, kind, parse_node, self._put_node)
            elif kind in _PDB_KINDS:
                self._add(obj, kind, parse_pdb, self.pdbs.append)
            elif kind in _DS_KINDS:
                self._add(obj, kind, parse_daemonset, self.daemonsets.append)
            elif kind in _NODEPOOL_KINDS:
                if (warning := legacy.migration_warning(obj)) is not None:
                    self.problems.append(warning)
                self._add(obj, kind, parse_nodepool, self._put_nodepool)
            elif kind == legacy.AWS_NODE_TEMPLATE_KIND:
                self.problems.append(legacy.migration_warning(obj) or "")
            elif kind in _NODECLASS_KINDS:
                self._add(obj, kind, parse_nodeclass, self._put_nodeclass)
            elif kind in _NODECLAIM_KINDS:
                self._add(obj, kind, parse_nodeclaim, self._put_nodeclaim)
            elif kind in _WINDOW_KINDS:
                self._put_window(read_window(obj))
            elif kind in _NDB_KINDS:
                self._put_ndb(read_ndb(obj))
            elif kind == CAPACITY_BUFFER_KIND:
                self._add(obj, kind, read_capacity_buffer, self._put_buffer)
            elif kind == POD_TEMPLATE_KIND:
                self._add(obj, kind, read_pod_template, self._put_pod_template)
            elif kind in _OVERLAY_KINDS:
                overlay = read_node_overlay(obj)
                self.node_overlays[overlay.name] = overlay
            # Everything else (Deployments, ReplicaSets, Services, ...) is not needed.

    def _add(self, obj: Mapping[str, Any], kind: str, parse: Any, put: Any) -> None:
        try:
            put(parse(obj))
        except ValidationError as err:
            self.problems.append(f"{kind} {_object_name(obj)}: {_pydantic_message(err)}")
        except (ValueError, KeyError, TypeError, AttributeError, QuantityError) as err:
            detail = f"missing field {err}" if isinstance(err, KeyError) else str(err)
            self.problems.append(f"{kind} {_object_name(obj)}: {detail}")
        except Exception as err:  # any other failure on one object must not stop the whole load
            self.problems.append(f"{kind} {_object_name(obj)}: {type(err).__name__}: {err}")

    def _put_node(self, node: Node) -> None:
        if node.name in self.nodes:
            self.problems.append(f"Node {node.name}: listed twice, the last copy wins")
        self.nodes[node.name] = node

    def _put_nodepool(self, parsed: tuple[NodePool, list[str]]) -> None:
        pool, budget_errors = parsed
        self.nodepools[pool.name] = pool
        if budget_errors:
            self.budget_errors[pool.name] = budget_errors
            self.problems.extend(
                f"NodePool {pool.name}: {e} (the pool's budgets fail closed)" for e in budget_errors
            )

    def _put_nodeclass(self, parsed: tuple[EC2NodeClass, str | None]) -> None:
        nodeclass, not_ready = parsed
        self.nodeclasses[nodeclass.name] = nodeclass
        if not_ready is not None:
            self.nodeclass_not_ready[nodeclass.name] = not_ready
        else:
            self.nodeclass_not_ready.pop(nodeclass.name, None)

    def _put_nodeclaim(self, claim: NodeClaim) -> None:
        self.nodeclaims[claim.name] = claim
        self.problems.extend(f"NodeClaim {claim.name}: {p}" for p in claim.problems)

    def _put_pod(self, pod: Pod) -> None:
        self.pods.append(pod)
        if (problem := do_not_disrupt_problem(pod.annotations)) is not None:
            self.problems.append(f"Pod {pod.key}: {problem}")

    def _put_buffer(self, buffer: CapacityBuffer) -> None:
        if buffer.problem is not None:
            self.problems.append(f"CapacityBuffer {buffer.key}: {buffer.problem}")
        self.capacity_buffers[buffer.key] = buffer

    def _put_pod_template(self, template: PodTemplate) -> None:
        self.pod_templates[template.key] = template

    def _put_window(self, window: Window) -> None:
        self.maintenance_windows[window.name] = window
        self.problems.extend(
            f"MaintenanceWindow {window.name}: {p} (it fails closed: blocks "
            f"{', '.join(sorted(window.actions))} for "
            f"{'every node' if window.selector is None else 'the nodes it selects'})"
            for p in window.problems
        )

    def _put_ndb(self, ndb: Ndb) -> None:
        self.node_disruption_budgets[ndb.name] = ndb
        where = "every node" if ndb.selects_every_node else "the nodes it selects"
        self.problems.extend(
            f"NodeDisruptionBudget {ndb.name}: {p} (it fails closed: allows nothing for {where})"
            for p in ndb.problems
        )

    def _put_instance(self, instance: InstanceFacts) -> None:
        self.instances[instance.instance_id] = instance

    def _merge(self, part: Snapshot) -> None:
        """Add what `_add_objects` put in `part` (one object's worth), as if it had been added here:
        a snapshot assembled from parts equals one built from their objects in the same order. Nodes
        and PDBs are copied, since `_index` links and settles them per snapshot."""
        for node in part.nodes.values():
            self._put_node(node.copy())
        self.pods.extend(part.pods)
        self.pdbs.extend(pdb.copy() for pdb in part.pdbs)
        self.daemonsets.extend(part.daemonsets)
        self.nodepools.update(part.nodepools)
        self.budget_errors.update(part.budget_errors)
        for name, nodeclass in part.nodeclasses.items():
            self._put_nodeclass((nodeclass, part.nodeclass_not_ready.get(name)))
        self.nodeclaims.update(part.nodeclaims)
        self.maintenance_windows.update(part.maintenance_windows)
        self.node_disruption_budgets.update(part.node_disruption_budgets)
        self.capacity_buffers.update(part.capacity_buffers)
        self.pod_templates.update(part.pod_templates)
        self.node_overlays.update(part.node_overlays)
        self.instances.update(part.instances)
        self.problems.extend(part.problems)

    def _index(self, linked: Mapping[str, Sequence[Pod]] | None = None) -> None:
        """Link pods and NodeClaims to nodes, and settle PDB disruptionsAllowed. `linked`: the pods
        bound to each node name, in `self.pods`' order, when the caller keeps them (the snapshot
        builder): then each node gets a copy of its list instead of a walk over every pod."""
        orphans = 0
        if linked is None:
            for node in self.nodes.values():
                node.pods = []
                node.pods_source = None
            for pod in self.pods:
                if pod.node_name:
                    bound_to = self.nodes.get(pod.node_name)
                    if bound_to is not None:
                        bound_to.pods.append(pod)
                    else:
                        orphans += 1
        else:
            for name, node in self.nodes.items():
                source = linked.get(name, ())
                node.pods = list(source)
                node.pods_source = source
            orphans = sum(len(pods) for name, pods in linked.items() if name not in self.nodes)
        if orphans:
            self.problems.append(f"{orphans} pod(s) are bound to nodes that are not in the snapshot")
        by_provider = {n.provider_id: n for n in self.nodes.values() if n.provider_id}
        for claim in self.nodeclaims.values():
            claimed = self.nodes.get(claim.node_name or "") or by_provider.get(claim.provider_id or "")
            if claimed is not None:
                claimed.nodeclaim = claim
        for node in self.nodes.values():
            node.instance = self.instances.get(instance_id_of(node.provider_id) or "")
        self._pdb_cache.clear()
        self._pdb_index = None
        if self.pdbs:
            # PDBs select by (namespace, labels): match once per distinct selector key (replicas
            # share it), then count the pods of each (the count does not depend on their order).
            by_selector: dict[tuple[str, tuple[tuple[str, str], ...]], list[Pod]] = {}
            for pod in self.pods:
                group = by_selector.get(pod.selector_key)
                if group is None:
                    by_selector[pod.selector_key] = [pod]
                else:
                    group.append(pod)
            matching: dict[str, list[Pod]] = defaultdict(list)
            for group in by_selector.values():
                for pdb in self.pdbs_for(group[0]):
                    matching[pdb.key].extend(group)
            for pdb in self.pdbs:
                pdb.compute_allowed(matching.get(pdb.key, ()))

    # -- queries -----------------------------------------------------------------------------------
    def pdbs_for(self, pod: Pod) -> tuple[PDB, ...]:
        """PDBs whose selector matches the pod. Replicas share labels, so results are cached by
        (namespace, labels) and a 100,000-pod cluster does a few thousand selector evaluations."""
        if not self.pdbs:
            return ()
        labels = pod.labels
        key = pod.selector_key
        cached = self._pdb_cache.get(key)
        if cached is None:
            if self._pdb_index is None:
                self._pdb_index = self._index_pdbs()
            # Only PDBs whose first matchLabels pair the pod carries can select it, plus those
            # without matchLabels; then the full selector decides (in the PDBs' own order).
            candidates: dict[int, PDB] = dict(self._pdb_index.get((pod.namespace, None), ()))
            for pair in (labels or {}).items():
                candidates.update(self._pdb_index.get((pod.namespace, pair), ()))
            cached = tuple(candidates[i] for i in sorted(candidates) if candidates[i].selects(pod))
            self._pdb_cache[key] = cached
        return cached

    def _index_pdbs(self) -> dict[tuple[str, tuple[str, str] | None], tuple[tuple[int, PDB], ...]]:
        """PDBs (with their position, to keep their order) by (namespace, one of their matchLabels
        pairs), or (namespace, None) when they have none: with hundreds of PDBs in a namespace, a
        pod is checked against a handful, not all."""
        index: dict[tuple[str, tuple[str, str] | None], list[tuple[int, PDB]]] = defaultdict(list)
        for position, pdb in enumerate(self.pdbs):
            labels = pdb.selector.match_labels if pdb.selector is not None else {}
            pair = min(labels.items()) if labels else None
            index[(pdb.namespace, pair)].append((position, pdb))
        return {k: tuple(v) for k, v in index.items()}

    @property
    def pending_pods(self) -> list[Pod]:
        return [p for p in self.pods if p.is_pending]

    def live_managed_nodes(self) -> Iterator[tuple[Node, NodePool]]:
        """Nodes of an existing NodePool that are not being deleted, with their pool, in name order."""
        for name in sorted(self.nodes):
            node = self.nodes[name]
            pool = self.nodepools.get(node.nodepool or "")
            if pool is not None and not node.is_deleting:
                yield node, pool

    def nodeclass_problem(self, pool: NodePool) -> str | None:
        """Why the pool cannot launch: its EC2NodeClass is missing or not Ready (None: it can). Its
        nodes are then left alone and it launches no replacements, as Karpenter finds no instance
        types for it. Judged only when the snapshot holds EC2NodeClasses at all: many omit them."""
        ref = pool.spec.template.spec.node_class_ref
        if ref is None or ref.kind != "EC2NodeClass" or not self.nodeclasses:
            return None
        if ref.name not in self.nodeclasses:
            return f"EC2NodeClass {ref.name} not found"
        why = self.nodeclass_not_ready.get(ref.name)
        return f"EC2NodeClass {ref.name} is not Ready: {why}" if why is not None else None

    def region(self) -> str | None:
        """The region named by the nodes' topology labels (the most common one)."""
        counts: dict[str, int] = defaultdict(int)
        for node in self.nodes.values():
            region = node.region
            if not region and node.zone and node.zone[-1].isalpha():
                region = node.zone[:-1]
            if region:
                counts[region] += 1
        return max(sorted(counts), key=lambda r: counts[r]) if counts else None

    def at(self, now: datetime) -> Snapshot:
        """The same objects seen at another time (cheap: objects are shared, not copied)."""
        clone = Snapshot(
            now=now,
            nodes=self.nodes,
            pods=self.pods,
            pdbs=self.pdbs,
            nodepools=self.nodepools,
            nodeclasses=self.nodeclasses,
            daemonsets=self.daemonsets,
            nodeclaims=self.nodeclaims,
            instances=self.instances,
            problems=self.problems,
            budget_errors=self.budget_errors,
            nodeclass_not_ready=self.nodeclass_not_ready,
            maintenance_windows=self.maintenance_windows,
            node_disruption_budgets=self.node_disruption_budgets,
            capacity_buffers=self.capacity_buffers,
            pod_templates=self.pod_templates,
            node_overlays=self.node_overlays,
            recent_disruptions=self.recent_disruptions,
            sources=self.sources,
        )
        clone._pdb_cache = self._pdb_cache
        clone._pdb_index = self._pdb_index
        return clone

    def age(self, when: datetime | None) -> timedelta:
        return self.now - when if when is not None else timedelta(0)


@dataclass(frozen=True, slots=True)
class NotAnObject:
    """An item of a List that is not an object (a string, a number): reported and skipped."""

    list_kind: str
    index: int
    value: Any

    def __str__(self) -> str:
        return f"{self.list_kind} items[{self.index}]: not an object: {_preview(self.value)}"


# What a snapshot file lists: objects, and the note of each item that is not one.
Listed = Mapping[str, Any] | NotAnObject


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _object_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return str(obj["InstanceId"]) if "InstanceId" in obj else "<no metadata>"
    name = meta.get("name") or "<no name>"
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else str(name)


# --- Files ----------------------------------------------------------------------------------------


def _items_of(document: Any) -> Iterable[Listed]:
    """Objects of a document: a `List` / `*List` (items inherit the list's kind), or one object."""
    if document is None:
        return []
    if isinstance(document, list):
        return [item for doc in document for item in _items_of(doc)]
    if not isinstance(document, Mapping):
        raise SnapshotError("expected Kubernetes objects (a List or objects with kind)")
    if "Reservations" in document and "kind" not in document:
        return _instances_of(document)
    kind = document.get("kind")
    if "items" in document and (kind is None or str(kind).endswith("List")):
        items = document.get("items") or []
        if not isinstance(items, list):
            raise SnapshotError(f"{kind or 'List'}: items must be a list, got {type(items).__name__}")
        return [
            _with_list_kind(item, kind)
            if isinstance(item, Mapping)
            else NotAnObject(str(kind or "List"), i, item)
            for i, item in enumerate(items)
        ]
    return [document]


def _instances_of(document: Mapping[str, Any]) -> list[Listed]:
    """The instances of a DescribeInstances response (`aws ec2 describe-instances --output json`)."""
    reservations = document.get("Reservations")
    if not isinstance(reservations, list):
        raise SnapshotError("Reservations must be a list (of DescribeInstances reservations)")
    instances: list[Listed] = []
    for reservation in reservations:
        listed = reservation.get("Instances") if isinstance(reservation, Mapping) else None
        if not isinstance(listed, list):
            raise SnapshotError("each reservation must have a list of Instances")
        instances.extend(i if isinstance(i, Mapping) else NotAnObject("Reservations", 0, i) for i in listed)
    return instances


# A List may say when it was captured; plans of such a file default to that time, so a saved
# snapshot gives the same plan tomorrow (the simulator's scenarios carry it).
CAPTURED_AT_ANNOTATION = "karpflow.io/captured-at"


_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, index: int) -> int:
    found = _WHITESPACE.match(text, index)  # `*`: it always matches, maybe nothing
    return found.end() if found is not None else index


def _stream_json_object(text: str) -> Iterator[tuple[str, Any]]:
    """Decode a top-level JSON object one value at a time: yields ("item", obj) for each element of
    its "items" array and (key, value) for every other key. A 100,000-pod List is then never held
    decoded in full: each item can be turned into a slim object and dropped. Raises ValueError."""
    try:
        index = _skip(text, 0)
        if text[index] != "{":
            raise ValueError("expected a JSON object")
        index = _skip(text, index + 1)
        if text[index] == "}":
            return
        while True:
            key, index = _DECODER.raw_decode(text, index)
            index = _skip(text, index)
            if text[index] != ":":
                raise ValueError(f"expected ':' at offset {index}")
            index = _skip(text, index + 1)
            if key == "items" and text[index] == "[":
                index = _skip(text, index + 1)
                if text[index] == "]":
                    index += 1
                else:
                    while True:
                        item, index = _DECODER.raw_decode(text, index)
                        yield "item", item
                        index = _skip(text, index)
                        char, index = text[index], index + 1
                        if char == "]":
                            break
                        if char != ",":
                            raise ValueError(f"expected ',' or ']' at offset {index - 1}")
                        index = _skip(text, index)
            else:
                value, index = _DECODER.raw_decode(text, index)
                yield key, value
            index = _skip(text, index)
            char, index = text[index], index + 1
            if char == "}":
                break
            if char != ",":
                raise ValueError(f"expected ',' or '}}' at offset {index - 1}")
            index = _skip(text, index)
        if _skip(text, index) != len(text):
            raise ValueError(f"extra data at offset {index}")
    except IndexError:
        raise ValueError("unexpected end of JSON") from None


class _Document:
    """One snapshot file: its objects (streamed for a JSON List) and its capture time, known once
    the objects have been read (a List's metadata may follow its items)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.captured: datetime | None = None
        try:
            self._data: bytes | None = self.path.read_bytes()
        except OSError as err:
            raise SnapshotError(f"{self.path}: cannot read snapshot ({err.strerror or err})") from None

    def objects(self) -> Iterator[Listed]:
        data, self._data = self._data, None
        assert data is not None, "objects() can be read once"
        head = data.lstrip()[:1]
        try:
            if head == b"{":
                text = data.decode("utf-8")
                del data  # keep one copy of a large file in memory, not two
                yield from self._stream(text)
                return
            documents = (
                [_json_loads(data)] if head == b"[" else list(yaml.load_all(data, Loader=_YAML_LOADER))
            )
        except (ValueError, yaml.YAMLError) as err:
            raise SnapshotError(f"{self.path}: not valid YAML/JSON: {err}") from None
        del data
        for document in documents:
            if isinstance(document, Mapping):
                self._note_metadata(document.get("metadata"))
        try:
            items = [item for doc in documents for item in _items_of(doc)]
        except SnapshotError as err:
            raise SnapshotError(f"{self.path}: {err}") from None
        yield from items

    def _stream(self, text: str) -> Iterator[Listed]:
        fields: dict[str, Any] = {}
        waiting: list[Any] = []  # items without kind, until the list's kind is known
        index = -1
        for key, value in _stream_json_object(text):
            if key != "item":
                fields[key] = value
                continue
            index += 1
            if not isinstance(value, Mapping):
                yield NotAnObject(str(fields.get("kind") or "List"), index, value)
                continue
            if "kind" not in value:
                kind = fields.get("kind")
                if kind is None:
                    waiting.append(value)
                    continue
                value = _with_list_kind(value, kind)
            yield value
        self._note_metadata(fields.get("metadata"))
        if index < 0 and "items" not in fields:
            if "Reservations" in fields and "kind" not in fields:
                try:
                    yield from _instances_of(fields)
                except SnapshotError as err:
                    raise SnapshotError(f"{self.path}: {err}") from None
                return
            if "kind" not in fields:
                raise SnapshotError(f"{self.path}: expected Kubernetes objects (a List or objects with kind)")
            yield fields  # a single object
            return
        for value in waiting:
            yield _with_list_kind(value, fields.get("kind"))

    def _note_metadata(self, metadata: Any) -> None:
        if not isinstance(metadata, Mapping):
            return
        annotations = metadata.get("annotations")
        if not isinstance(annotations, Mapping):
            return  # none, or malformed: the object's own parse reports that
        value = annotations.get(CAPTURED_AT_ANNOTATION)
        try:
            self.captured = _latest(self.captured, parse_time(value))
        except ValueError:
            raise SnapshotError(
                f"{self.path}: annotation {CAPTURED_AT_ANNOTATION}={value!r} is not RFC 3339"
            ) from None


def _with_list_kind(item: Mapping[str, Any], list_kind: Any) -> Mapping[str, Any]:
    kind = str(list_kind or "")
    if "kind" not in item and kind.endswith("List") and kind != "List":
        return {**item, "kind": kind[: -len("List")]}
    return item


def read_document(path: str | Path) -> tuple[list[Listed], datetime | None]:
    """Kubernetes objects from a YAML (single or multi-document) or JSON file (with a NotAnObject
    for each item of a List that is not an object), and the capture time named by a List's
    `karpflow.io/captured-at` annotation (None when absent)."""
    document = _Document(path)
    try:
        objects = list(document.objects())
    except ValueError as err:
        raise SnapshotError(f"{document.path}: not valid YAML/JSON: {err}") from None
    return objects, document.captured


def read_objects(path: str | Path) -> list[Listed]:
    """Kubernetes objects from a YAML (single or multi-document) or JSON file (`read_document`)."""
    return read_document(path)[0]


def load_snapshot(paths: str | Path | Sequence[str | Path], now: datetime | None = None) -> Snapshot:
    """Load one or more snapshot files into one Snapshot (later files add to earlier ones).

    `now` defaults to the files' capture time (`karpflow.io/captured-at`) when they carry one, else to
    the current time."""
    if isinstance(paths, str | Path):
        paths = [paths]
    snapshot = Snapshot(now=now or datetime.now(UTC))
    captured = None
    for path in paths:
        document = _Document(path)
        snapshot.sources.append(str(path))
        first_problem = len(snapshot.problems)
        try:
            snapshot._add_objects(document.objects(), str(path))
        except SnapshotError:
            raise
        except ValueError as err:  # a JSON syntax error found while streaming
            raise SnapshotError(f"{document.path}: not valid YAML/JSON: {err}") from None
        if len(paths) > 1:  # say which file a problem is in once several are combined
            new = snapshot.problems[first_problem:]
            snapshot.problems[first_problem:] = [f"{path}: {problem}" for problem in new]
        captured = _latest(captured, document.captured)
    if now is None and captured is not None:
        snapshot.now = captured
    snapshot._index()
    return snapshot
