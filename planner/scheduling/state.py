"""The simulator's data: resource vectors, the prepared nodes, NodePools and instance types, the
pod signatures at a relaxation level, topology groups, and a probe's scratch state; and
`SimulatorState`, what the rooms of `Simulator` share."""

from __future__ import annotations

from abc import abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from api import constants as k
from kube.selectors import Taint, Toleration
from planner.scheduling.inputs import (
    HostPort,
    LabelSelector,
    PodAffinityTerm,
    PodConstraints,
    Resources,
    SimInstanceType,
    SimNodePool,
    SimPod,
)
from planner.scheduling.min_values import MinValuesPolicy
from planner.scheduling.requirements import Reqs
from planner.scheduling.results import PreferencePolicy, SimulationResult

ZONE = k.ZONE_LABEL
CAPACITY_TYPE = k.CAPACITY_TYPE_LABEL
HOSTNAME = k.HOSTNAME_LABEL
# Karpenter tries capacity types in this order when it launches; the "worst launch price" of an
# instance type is the most expensive offering of the first capacity type that is allowed.
LAUNCH_PRECEDENCE = (k.CAPACITY_RESERVED, k.CAPACITY_SPOT, k.CAPACITY_ON_DEMAND)


# Labels every node or instance type defines. A pod may require them of a NodePool that does not
# mention them (the instance types answer); any other label must be defined by the pool.
BASE_WELL_KNOWN = frozenset(
    {
        ZONE,
        k.REGION_LABEL,
        k.INSTANCE_TYPE_LABEL,
        "beta.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        k.ARCH_LABEL,
        "beta.kubernetes.io/arch",
        k.OS_LABEL,
        "beta.kubernetes.io/os",
        CAPACITY_TYPE,
        k.NODEPOOL_LABEL,
        HOSTNAME,
        "node.kubernetes.io/windows-build",
    }
)


# Deprecated label names that still mean the GA ones when matched against an instance type.
TYPE_LABEL_ALIASES = {
    "beta.kubernetes.io/instance-type": k.INSTANCE_TYPE_LABEL,
    "beta.kubernetes.io/arch": k.ARCH_LABEL,
    "beta.kubernetes.io/os": k.OS_LABEL,
    "failure-domain.beta.kubernetes.io/zone": ZONE,
}


# Labels a new node gets from where it runs, not from its instance type: never a reason to rule out a type.
NOT_FROM_TYPE = frozenset(
    {k.NODEPOOL_LABEL, HOSTNAME, k.REGION_LABEL, "failure-domain.beta.kubernetes.io/region"}
)

SPREAD, AFFINITY, ANTI = 0, 1, 2
Vec = tuple[int, ...]
# Pods with these (namespace, sorted labels): topology groups count label sets, not pods.
LabelSet = tuple[str, tuple[tuple[str, str], ...]]
# What decides static compatibility with a node class (ORed requirement terms, tolerations), and
# with it the room and host ports a node must have (Effective.static_key, Effective.fitkey).
StaticKey = tuple[tuple[Reqs, ...], tuple[Toleration, ...]]
FitKey = tuple[StaticKey, Vec | None, tuple[HostPort, ...]]
# A topology group's identity (kind, key, namespaces, selector, max skew, min domains, node filter):
# TopologyGroup's fields in order.
GroupKey = tuple[int, str, frozenset[str] | None, LabelSelector, int, int | None, tuple[Reqs, ...]]


@dataclass(slots=True)
class PreparedNode:
    idx: int
    name: str
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    alloc: Vec
    free: Vec  # baseline: allocatable minus the requests of its bound pods
    ports: tuple[HostPort, ...]
    initialized: bool
    klass: int  # node class: equal labels (on keys pods care about) and taints
    nodepool: str | None


@dataclass(slots=True)
class TypeEntry:
    name: str
    alloc: Vec  # allocatable minus the pool's DaemonSet overhead for this type
    capacity: Vec
    price: float
    worst_price: float
    labels: dict[str, str]
    zones: frozenset[str]
    capacity_types: frozenset[str]


def entry_values(entry: TypeEntry, key: str) -> Iterable[str]:
    """The values an instance type of a pool has for `key` (minValues counts them): its name, the
    zones or capacity types its allowed offerings span, or its label."""
    if key == k.INSTANCE_TYPE_LABEL:
        return (entry.name,)
    if key == ZONE:
        return entry.zones
    if key == CAPACITY_TYPE:
        return entry.capacity_types
    value = entry.labels.get(key)
    return () if value is None else (value,)


@dataclass(slots=True)
class TypeSet:
    entries: list[TypeEntry]
    frontier: list[Vec]  # Pareto-maximal allocatable vectors: "does anything still fit" in a few checks


@dataclass(slots=True)
class PreparedPool:
    pool: SimNodePool
    base: Reqs  # requirements + template labels + nodepool label
    base_keys: frozenset[str]
    taints: tuple[Taint, ...]
    types: list[SimInstanceType]
    overhead: dict[str, Vec]  # DaemonSet overhead per instance type
    limits: Vec | None


@dataclass(slots=True)
class Effective:
    """A pod signature at one relaxation level: what placement actually checks."""

    sig: PodConstraints
    vec: Vec | None  # None: asks for a resource nothing offers
    terms: tuple[Reqs, ...]  # ORed node requirement sets (at least one, maybe empty)
    filter_terms: tuple[Reqs, ...]  # required terms only: the topology spread node filter
    tolerations: tuple[Toleration, ...]
    ports: tuple[HostPort, ...]
    groups: tuple[int, ...]  # topology groups this pod must satisfy
    owned_anti: tuple[PodAffinityTerm, ...]  # required anti-affinity terms (others must respect them)
    fitkey: FitKey
    static_key: StaticKey
    labelset: LabelSet
    hostname_reqs: tuple[Reqs, ...]  # per term: requirements on the hostname label
    # Only rules that get stricter as pods are added (resources, ports, anti-affinity): a claim that
    # refused this signature once in a probe refuses it for the rest of the probe.
    monotone: bool = True


@dataclass(slots=True)
class TopologyGroup:
    gid: int
    kind: int
    key: str
    namespaces: frozenset[str] | None
    selector: LabelSelector
    max_skew: int
    min_domains: int | None
    filter_terms: tuple[Reqs, ...]
    per_node: dict[int, int]  # matching bound pods per node index
    baseline: dict[str, int]  # matching bound pods per domain
    universe: frozenset[str]  # eligible domains (spread on a non-hostname key)

    def selects(self, namespace: str, labels: dict[str, str]) -> bool:
        return (self.namespaces is None or namespace in self.namespaces) and self.selector.matches(labels)


@dataclass(slots=True)
class OpenClaim:
    name: str
    pool: PreparedPool
    reqs: Reqs
    used: Vec
    excluded: frozenset[str]  # instance types the pool's limits ruled out when the claim opened
    background: bool = False
    pods: list[str] = field(default_factory=list)
    ports: list[HostPort] = field(default_factory=list)
    # Whose pods it holds when the simulation keeps each removed node's new nodes apart (the node's
    # name; `Simulator.simulate(claims_per_node=True)`): only pods of that node join it.
    group: str | None = None


class FitList:
    """Nodes (in placement order) with static compatibility and baseline room for one fit key."""

    __slots__ = ("items", "scan")

    def __init__(self) -> None:
        self.items: list[int] = []
        self.scan = 0


class Probe:
    __slots__ = (
        "background",
        "claims",
        "delta",
        "excluded",
        "free",
        "group",
        "inv_delta",
        "limits",
        "on_node",
        "ports",
        "ptr",
        "refused",
        "removed",
        "removed_names",
        "settling",
    )

    def __init__(self, removed: set[int], removed_names: frozenset[str]) -> None:
        self.removed = removed
        self.removed_names = removed_names
        self.free: dict[int, Vec] = {}
        self.ports: dict[int, list[HostPort]] = {}
        self.ptr: dict[FitKey, int] = {}
        self.claims: list[OpenClaim] = []
        self.delta: dict[int, dict[str, int]] = {}
        self.inv_delta: dict[PodAffinityTerm, dict[str, int]] = {}
        self.limits: dict[str, Vec] = {}
        self.excluded: dict[str, tuple[Vec, frozenset[str]]] = {}
        self.background = False  # placing background pods (their claims do not count)
        self.group: str | None = None  # whose pod is being placed (OpenClaim.group), when kept apart
        self.refused: set[tuple[str, int]] = set()  # (claim, pod signature) that cannot join
        self.on_node: dict[int, list[tuple[SimPod, Effective]]] = {}  # background pods placed per node
        # Existing nodes the moved pods may not land on: a consolidation's settling nodes, set once the
        # background is placed (pending pods and pods of deleting nodes may still go there).
        self.settling: frozenset[int] = frozenset()


@dataclass(slots=True)
class ProbeBase:
    """The cluster after the background pods are placed (nodes in `gone` removed): every probe with
    the same background forks from it instead of placing those pods again."""

    probe: Probe
    placements: dict[str, str]
    unschedulable: dict[str, str]
    pending: frozenset[str]
    keys: frozenset[str]  # the background pods placed


def vec_fits(v: Vec, f: Vec) -> bool:
    # An explicit loop: all() with a generator costs twice as much on this hot path.
    for a, b in zip(v, f, strict=False):  # noqa: SIM110
        if a > b:
            return False
    return True


def vec_share(v: Vec, alloc: Vec) -> float:
    """The largest fraction of any resource of `alloc` that `v` takes (inf when `alloc` lacks one)."""
    share = 0.0
    for x, a in zip(v, alloc, strict=True):
        if x:
            if a <= 0:
                return float("inf")
            share = max(share, x / a)
    return share


def vec_add(a: Vec, b: Vec) -> Vec:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def vec_sub(a: Vec, b: Vec) -> Vec:
    return tuple(x - y for x, y in zip(a, b, strict=True))


def pareto_front(vectors: Iterable[Vec]) -> list[Vec]:
    out: list[Vec] = []
    for v in sorted(set(vectors), reverse=True):
        if not any(vec_fits(v, w) for w in out):
            out.append(v)
    return out


class SimulatorState:
    """What the rooms of `Simulator` (topology.py, nodepools.py, existing_nodes.py, new_nodes.py and
    simulator.py itself) share: the prepared state, declared once here and set by
    `Simulator.__init__`, and the methods one room calls in another. Each room inherits this class,
    so its reads are checked against these declarations; at run time the state is plain instance
    attributes and the methods are the rooms' own (the declarations exist for the type checker only,
    and it refuses a `Simulator` that lacks one of them)."""

    preference_policy: PreferencePolicy
    min_values_policy: MinValuesPolicy
    # The prepared cluster.
    nodes: list[PreparedNode]  # existing nodes not being deleted, in placement order
    node_index: dict[str, int]
    _node_capacity: dict[str, Vec]
    instance_types: dict[str, SimInstanceType]
    well_known: set[str]  # labels every node or instance type defines
    _pools: list[PreparedPool]  # highest weight first
    _pool_by_name: dict[str, PreparedPool]
    _pool_nodes_capacity: dict[str, Vec]  # capacity of each pool's existing nodes (its limits)
    # Existing nodes inside their NodePool's consolidateAfter window: a consolidation moves no pod
    # onto them (Karpenter v1.14, scheduler.go `addToExistingNode`; Probe.settling).
    _settling: frozenset[int]
    _res_names: list[str]  # the resource of each entry of a Vec
    _zero: Vec
    # Bound pods for topology: counts of each label set per node, required anti-affinity terms.
    _labelsets: dict[LabelSet, dict[int, int]]
    _labelset_index: dict[tuple[str, str], list[LabelSet]]
    _inv_terms: dict[PodAffinityTerm, Counter[int]]
    _inv_base: dict[PodAffinityTerm, dict[str, int]]
    _inv_version: int  # bumped when a placed pod brings a new anti-affinity term
    _inv_cache: dict[LabelSet, tuple[int, list[PodAffinityTerm]]]
    _inv_by_label: dict[tuple[str, str], list[PodAffinityTerm]]
    _inv_scan: list[PodAffinityTerm]
    # Topology groups, and which of them select a label set.
    _groups: list[TopologyGroup]
    _group_ids: dict[GroupKey, int]
    _selecting_cache: dict[LabelSet, tuple[int, list[TopologyGroup]]]
    _groups_by_label: dict[tuple[str, str], list[int]]
    _groups_scan: list[int]
    _universes: dict[tuple[str, tuple[Reqs, ...], tuple[Toleration, ...]], frozenset[str]]
    # Memo tables keyed by values, valid for the simulator's life.
    _eff_cache: dict[tuple[PodConstraints, int], Effective]
    _levels_cache: dict[PodConstraints, int]
    _fitlists: dict[FitKey, FitList]
    _static_ok: dict[StaticKey, dict[int, bool]]  # per node class
    _merge_cache: dict[tuple[Reqs, Reqs], Reqs | None]
    _typeset_cache: dict[tuple[str, Reqs, frozenset[str]], TypeSet]
    _tolerates_pool: dict[tuple[str, tuple[Toleration, ...]], bool]
    _domains_cache: dict[tuple[str, Reqs, str, frozenset[str]], frozenset[str]]
    _compat_cache: dict[tuple[str, Reqs], bool]
    _fair_cache: dict[Vec, float]

    if TYPE_CHECKING:
        # simulator.py
        @abstractmethod
        def _vec(self, resources: Resources) -> Vec | None: ...

        @abstractmethod
        def _vec_dict(self, resources: dict[str, int]) -> Vec: ...

        @abstractmethod
        def _capacity_vec(self, resources: dict[str, int]) -> Vec: ...

        @abstractmethod
        def describe_vec(self, vec: Vec) -> dict[str, int]: ...

        @abstractmethod
        def _note_keys(self, terms: Iterable[Reqs]) -> None: ...

        @abstractmethod
        def _pod_order(self, pod: SimPod) -> tuple[int, int, str, str]: ...

        @abstractmethod
        def _commit_existing(
            self,
            probe: Probe,
            eff: Effective,
            node: PreparedNode,
            pod: SimPod,
            result: SimulationResult,
            deleting_keys: set[str],
            stop_on_failure: bool,
        ) -> None: ...

        # topology.py
        @abstractmethod
        def _eff(self, sig: PodConstraints, level: int) -> Effective: ...

        @abstractmethod
        def _count(self, probe: Probe, g: TopologyGroup, domain: str) -> int: ...

        @abstractmethod
        def _domain_ok(
            self, probe: Probe, eff: Effective, g: TopologyGroup, domain: str, lm: dict[str, str]
        ) -> bool: ...

        @abstractmethod
        def _inverse_terms(self, labelset: LabelSet) -> list[PodAffinityTerm]: ...

        @abstractmethod
        def _inv_count(self, probe: Probe, term: PodAffinityTerm, domain: str) -> int: ...

        @abstractmethod
        def _topology_ok_node(self, probe: Probe, eff: Effective, node: PreparedNode) -> bool: ...

        @abstractmethod
        def _record(
            self,
            probe: Probe,
            eff: Effective,
            domains_for: Callable[[str], frozenset[str]],
            filter_ok: Callable[[TopologyGroup], bool],
            sign: int = 1,
        ) -> None: ...

        @staticmethod
        @abstractmethod
        def _node_domains(node: PreparedNode) -> Callable[[str], frozenset[str]]: ...

        @staticmethod
        @abstractmethod
        def _node_filter(node: PreparedNode) -> Callable[[TopologyGroup], bool]: ...

        # nodepools.py
        @abstractmethod
        def _typeset(self, pool: PreparedPool, reqs: Reqs, excluded: frozenset[str]) -> TypeSet: ...

        @abstractmethod
        def _pool_tolerated(self, pool: PreparedPool, tolerations: tuple[Toleration, ...]) -> bool: ...

        @abstractmethod
        def _merge(self, claim_reqs: Reqs, base_keys: frozenset[str], term: Reqs) -> Reqs | None: ...

        @abstractmethod
        def _pool_domains(
            self, pool: PreparedPool, reqs: Reqs, key: str, excluded: frozenset[str]
        ) -> frozenset[str]: ...

        # existing_nodes.py
        @abstractmethod
        def _try_existing(
            self, probe: Probe, eff: Effective, avoid: frozenset[int] = frozenset()
        ) -> int | None: ...
