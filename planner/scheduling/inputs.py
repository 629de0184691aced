"""The compact, hashable inputs of the scheduling simulation.

The simulation never looks at raw Kubernetes dicts while it runs: a pod becomes a `SimPod` whose
`PodConstraints` holds everything that decides *where* it may go (requests, node requirements,
tolerations, host ports, pod (anti-)affinity, topology spread). Pods of one Deployment share an
equal `PodConstraints`; the simulation keys its caches on it, which is what makes 100,000-pod
clusters affordable.

Pods already bound to nodes that stay put only need a `BoundPod`: their requests (used room), labels
(topology counts) and required anti-affinity (which constrains newcomers). `planner.scheduling.adapter`
builds all of these from a `planner.snapshot.Snapshot` and a `planner.catalog.Catalog`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from api import constants as k
from api.nodepool import NodePool
from api.quantity import QuantityError, millicores, to_int
from kube.selectors import Taint, Toleration, selector_matches
from planner.catalog import Offering
from planner.scheduling.requirements import Req, Reqs, freeze

CPU, MEMORY, PODS, EPHEMERAL = "cpu", "memory", "pods", "ephemeral-storage"
CORE_RESOURCES = (CPU, MEMORY, PODS, EPHEMERAL)
# Karpenter's resources.Node (pkg/utils/resources/resources.go): `limits.nodes` caps a pool's node count.
NODES_RESOURCE = "nodes"
UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"

# Resources as sorted (name, amount) pairs: cpu in millicores, the rest in whole units.
Resources = tuple[tuple[str, int], ...]


class InputError(ValueError):
    """A Kubernetes object the simulation cannot read; the message names the object and field."""


def resources_from(mapping: Mapping[str, Any] | None, where: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, value in (mapping or {}).items():
        try:
            out[name] = millicores(value) if name == CPU else to_int(value)
        except QuantityError as err:
            raise InputError(f"{where}: resource {name}: {err}") from err
    return out


# --------------------------------------------------------------------------------------------
# Taints, tolerations, selectors
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A metav1.LabelSelector; `nothing` marks a null selector, which selects no pod."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[tuple[str, str, frozenset[str]], ...] = ()
    nothing: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        return not self.nothing and selector_matches(self.match_labels, self.match_expressions, labels)


NOTHING = LabelSelector(nothing=True)


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    selector: LabelSelector
    topology_key: str
    namespaces: frozenset[str] | None  # None: every namespace

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return (self.namespaces is None or namespace in self.namespaces) and self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    max_skew: int
    topology_key: str
    hard: bool  # whenUnsatisfiable DoNotSchedule
    selector: LabelSelector
    min_domains: int | None = None


# --------------------------------------------------------------------------------------------
# Pods
# --------------------------------------------------------------------------------------------
HostPort = tuple[int, str, str]  # (port, protocol, hostIP)


def ports_conflict(a: HostPort, b: HostPort) -> bool:
    return a[0] == b[0] and a[1] == b[1] and (a[2] == b[2] or "0.0.0.0" in (a[2], b[2]))


@dataclass(frozen=True)
class PodConstraints:
    """Everything that decides where a pod may run. Equal for the replicas of one workload."""

    namespace: str
    labels: tuple[tuple[str, str], ...]
    requests: Resources
    # Required node affinity ORed terms, each already ANDed with the nodeSelector. () = anywhere.
    node_terms: tuple[Reqs, ...] = ()
    preferred_node_terms: tuple[tuple[int, Reqs], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    affinity: tuple[PodAffinityTerm, ...] = ()
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_affinity: tuple[tuple[int, PodAffinityTerm], ...] = ()
    preferred_anti_affinity: tuple[tuple[int, PodAffinityTerm], ...] = ()
    spreads: tuple[SpreadConstraint, ...] = ()
    _hash: int = field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "_hash",
            hash(
                (
                    self.namespace,
                    self.labels,
                    self.requests,
                    self.node_terms,
                    self.preferred_node_terms,
                    self.tolerations,
                    self.host_ports,
                    self.affinity,
                    self.anti_affinity,
                    self.preferred_affinity,
                    self.preferred_anti_affinity,
                    self.spreads,
                )
            ),
        )

    def __hash__(self) -> int:
        return self._hash

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)


@dataclass(slots=True)
class SimPod:
    """A pod to place."""

    name: str
    namespace: str
    constraints: PodConstraints
    node_name: str | None = None  # where it runs now; None for a pending pod
    # ns/name, computed once: every simulation of a pass reads it for each pod it places.
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.key = f"{self.namespace}/{self.name}"

    @property
    def pending(self) -> bool:
        return self.node_name is None


@dataclass(slots=True)
class BoundPod:
    """A pod bound to an existing node (terminal pods are left out by the caller)."""

    node_name: str
    namespace: str
    labels: tuple[tuple[str, str], ...]
    requests: Resources
    host_ports: tuple[HostPort, ...] = ()
    anti_affinity: tuple[PodAffinityTerm, ...] = ()
    terminating: bool = False  # still holds its room, but no longer counts for topology


# --------------------------------------------------------------------------------------------
# Nodes, pools, instance types, DaemonSets
# --------------------------------------------------------------------------------------------
@dataclass(slots=True)
class SimNode:
    name: str
    labels: dict[str, str]
    allocatable: dict[str, int]
    capacity: dict[str, int] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    initialized: bool = True
    # Karpenter-managed (has a NodePool label): an uninitialized managed node must not receive
    # moved pods (its capacity may never become ready).
    managed: bool = True
    deleting: bool = False

    @property
    def nodepool(self) -> str | None:
        return self.labels.get(k.NODEPOOL_LABEL)


@dataclass(slots=True)
class SimInstanceType:
    name: str
    labels: dict[str, str]  # well-known labels: arch, os, instance-family, -size, -cpu, -memory...
    capacity: dict[str, int]
    allocatable: dict[str, int]  # after kube-reserved, system-reserved and eviction threshold
    offerings: tuple[Offering, ...]


@dataclass(slots=True)
class SimNodePool:
    name: str
    requirements: Reqs = ()
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    startup_taints: tuple[Taint, ...] = ()
    limits: dict[str, int] = field(default_factory=dict)
    weight: int = 0
    # Its EC2NodeClass: a reserved offering is launched only by the classes that select it.
    nodeclass: str | None = None


@dataclass(slots=True)
class SimDaemonSet:
    name: str
    namespace: str
    constraints: PodConstraints


# --------------------------------------------------------------------------------------------
# NodePools
# --------------------------------------------------------------------------------------------
def nodepool_from_api(pool: NodePool) -> SimNodePool:
    """The scheduling view of a NodePool: template requirements, labels, taints, limits, weight."""
    spec = pool.spec.template.spec
    reqs = []
    for i, r in enumerate(spec.requirements):
        try:
            reqs.append(Req.of(r.key, r.operator, r.values, r.min_values))
        except ValueError as err:
            raise InputError(f"NodePool {pool.name}: spec.template.spec.requirements[{i}]: {err}") from err
    return SimNodePool(
        name=pool.name,
        requirements=freeze(reqs),
        labels=dict(pool.spec.template.metadata.labels),
        taints=tuple(Taint(t.key, t.value, t.effect) for t in spec.taints),
        startup_taints=tuple(Taint(t.key, t.value, t.effect) for t in spec.startup_taints),
        limits=resources_from(pool.spec.limits, f"NodePool {pool.name} spec.limits"),
        weight=pool.spec.weight or 0,
        nodeclass=spec.node_class_ref.name if spec.node_class_ref is not None else None,
    )
