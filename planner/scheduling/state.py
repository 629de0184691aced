"""The simulator's data: resource vectors, the prepared nodes, NodePools and instance types, the
pod signatures at a relaxation level, topology groups, and a probe's scratch state."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from api import constants as k
from kube.selectors import Taint, Toleration
from planner.scheduling.inputs import (
    PodAffinityTerm,
    PodConstraints,
    SimInstanceType,
    SimNodePool,
    SimPod,
)
from planner.scheduling.requirements import Reqs

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


@dataclass(slots=True)
class PreparedNode:
    idx: int
    name: str
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    alloc: Vec
    free: Vec  # baseline: allocatable minus the requests of its bound pods
    ports: tuple[tuple[int, str, str], ...]
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
    ports: tuple[tuple[int, str, str], ...]
    groups: tuple[int, ...]  # topology groups this pod must satisfy
    owned_anti: tuple[PodAffinityTerm, ...]  # required anti-affinity terms (others must respect them)
    fitkey: tuple
    static_key: tuple
    labelset: tuple[str, tuple[tuple[str, str], ...]]
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
    selector: object
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
    ports: list[tuple[int, str, str]] = field(default_factory=list)


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
        "inv_delta",
        "limits",
        "on_node",
        "ports",
        "ptr",
        "refused",
        "removed",
        "removed_names",
    )

    def __init__(self, removed: set[int], removed_names: frozenset[str]) -> None:
        self.removed = removed
        self.removed_names = removed_names
        self.free: dict[int, Vec] = {}
        self.ports: dict[int, list[tuple[int, str, str]]] = {}
        self.ptr: dict[tuple, int] = {}
        self.claims: list[OpenClaim] = []
        self.delta: dict[int, dict[str, int]] = {}
        self.inv_delta: dict[PodAffinityTerm, dict[str, int]] = {}
        self.limits: dict[str, Vec] = {}
        self.excluded: dict[str, tuple[Vec, frozenset[str]]] = {}
        self.background = False  # placing background pods (their claims do not count)
        self.refused: set[tuple[str, int]] = set()  # (claim, pod signature) that cannot join
        self.on_node: dict[int, list[tuple[SimPod, Effective]]] = {}  # background pods placed per node


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
