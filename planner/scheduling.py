"""The scheduling simulation: where would these pods go if these nodes were removed?

Pure and built for repeated probing. A `Simulator` is prepared once per snapshot (existing nodes
with the free room left by their bound pods, NodePools, the instance catalog, DaemonSets); each
`simulate(remove=..., pods=...)` then only moves the given pods. Existing bound pods never move:
they are static used capacity, so a probe costs about the number of pods moved, not the cluster size.

Placement follows Karpenter's scheduler (behaviour notes §2.6):
- pods go in order of CPU then memory, largest first; each tries existing nodes (initialized ones
  first, then by name), then the new NodeClaims already opened (fewest pods first), then opens a new
  NodeClaim from the NodePools (highest weight first);
- resources against allocatable (minus DaemonSet overhead on new nodes), nodeSelector / required
  node affinity / NodePool requirements, taints (startup taints ignored on new nodes, PreferNoSchedule
  never blocks), host ports, required pod (anti-)affinity and topology spread over any key, NodePool
  limits;
- a new NodeClaim keeps the instance types that still fit everything put on it, in price order;
- preferences (preferred node/pod (anti-)affinity, ScheduleAnyway spreads) are required first and
  relaxed one at a time under `Respect`, or dropped under `Ignore`;
- a pod that lands on an uninitialized node fails (unless it comes from a node already deleting).

Deliberate differences from Karpenter, each for a reason:
- Pods that move whatever is decided (pending pods, pods of nodes being deleted or already removed
  by this pass) are placed first, as "background"; the NodeClaims they open are capacity the
  provisioner launches anyway (Karpenter sees them as in-flight nodes), so they neither count as
  replacements nor take moved pods. Their placement is computed once per pass and shared by every
  probe; only those sitting on a probe's removed nodes are placed again.
- Required node-affinity terms are ORed on existing nodes (as the kube-scheduler does) and tried in
  order for new nodes; a relaxed preference is retried at once rather than after the queue.
- DaemonSet overhead is computed per NodePool and instance type, not per NodePool only.

Speed comes from signatures: pods of one workload share a `PodConstraints`, so compatibility with a
node class, the list of nodes with baseline room for a request, requirement merges and instance-type
lists are computed once per signature and reused across probes. Within a probe, a node that is too
full for a request stays too full (room only shrinks), so the scan for that request resumes where it
stopped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from api import constants as k
from planner.scheduling_inputs import (
    CORE_RESOURCES,
    BoundPod,
    PodAffinityTerm,
    PodConstraints,
    Resources,
    SimDaemonSet,
    SimInstanceType,
    SimNode,
    SimNodePool,
    SimPod,
    Taint,
    Toleration,
    ports_conflict,
    tolerates_all,
)
from planner.scheduling_requirements import EMPTY_REQS, Req, Reqs, freeze, labels_match

if TYPE_CHECKING:
    from planner.model import Candidate, PlanContext, SchedulingResult
    from planner.snapshot import Pod

PreferencePolicy = Literal["Respect", "Ignore"]
RESPECT: PreferencePolicy = "Respect"
IGNORE: PreferencePolicy = "Ignore"
# How moved pods that no existing node takes are packed onto new NodeClaims (see Simulator.simulate).
Packing = Literal["karpenter", "cost"]
KARPENTER_PACKING: Packing = "karpenter"
COST_PACKING: Packing = "cost"

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
_TYPE_LABEL_ALIASES = {
    "beta.kubernetes.io/instance-type": k.INSTANCE_TYPE_LABEL,
    "beta.kubernetes.io/arch": k.ARCH_LABEL,
    "beta.kubernetes.io/os": k.OS_LABEL,
    "failure-domain.beta.kubernetes.io/zone": ZONE,
}
# Labels a new node gets from where it runs, not from its instance type: never a reason to rule out a type.
_NOT_FROM_TYPE = frozenset(
    {k.NODEPOOL_LABEL, HOSTNAME, k.REGION_LABEL, "failure-domain.beta.kubernetes.io/region"}
)

SPREAD, AFFINITY, ANTI = 0, 1, 2
Vec = tuple[int, ...]


# ------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ClaimOption:
    """One instance type a new NodeClaim may launch as."""

    instance_type: str
    price: float  # cheapest available offering allowed by the claim's requirements
    worst_price: float  # worst-case launch price (most expensive offering of the launch capacity type)


@dataclass(slots=True)
class NewNodeClaim:
    name: str
    nodepool: str
    options: tuple[ClaimOption, ...]  # price order, cheapest first
    requirements: Reqs
    capacity_types: tuple[str, ...]
    zones: tuple[str, ...]
    pods: list[str]
    requests: dict[str, int]
    # Opened for background pods (pending, or from nodes already going away): capacity the
    # provisioner launches anyway, not a replacement the caller decides on.
    background: bool = False

    @property
    def instance_types(self) -> tuple[str, ...]:
        return tuple(o.instance_type for o in self.options)

    @property
    def cheapest_price(self) -> float:
        return self.options[0].price if self.options else float("inf")

    @property
    def worst_price(self) -> float:
        return max((o.worst_price for o in self.options), default=float("inf"))


@dataclass(slots=True)
class SimulationResult:
    placements: dict[str, str] = field(default_factory=dict)  # pod key -> node name or claim name
    new_claims: list[NewNodeClaim] = field(default_factory=list)
    unschedulable: dict[str, str] = field(default_factory=dict)  # pod key -> why
    pending: frozenset[str] = frozenset()  # keys of the pods that were pending (their failure is tolerated)
    aborted: str | None = None  # set when the simulation stopped early; the result is then incomplete

    @property
    def replacements(self) -> list[NewNodeClaim]:
        """The new NodeClaims the moved pods need (background claims left out)."""
        return [c for c in self.new_claims if not c.background]

    @property
    def all_non_pending_scheduled(self) -> bool:
        return self.aborted is None and all(key in self.pending for key in self.unschedulable)

    def non_pending_errors(self) -> str:
        if self.aborted:
            return self.aborted
        errors = [
            f"{key}: {why}" for key, why in sorted(self.unschedulable.items()) if key not in self.pending
        ]
        return "; ".join(errors)


class SimulationAborted(Exception):
    pass


# ------------------------------------------------------------------------------------------
# Prepared pieces
# ------------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Node:
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
class _TypeEntry:
    name: str
    alloc: Vec  # allocatable minus the pool's DaemonSet overhead for this type
    capacity: Vec
    price: float
    worst_price: float
    labels: dict[str, str]
    zones: frozenset[str]
    capacity_types: frozenset[str]


@dataclass(slots=True)
class _TypeSet:
    entries: list[_TypeEntry]
    frontier: list[Vec]  # Pareto-maximal allocatable vectors: "does anything still fit" in a few checks


@dataclass(slots=True)
class _Pool:
    pool: SimNodePool
    base: Reqs  # requirements + template labels + nodepool label
    base_keys: frozenset[str]
    taints: tuple[Taint, ...]
    types: list[SimInstanceType]
    overhead: dict[str, Vec]  # DaemonSet overhead per instance type
    limits: Vec | None


@dataclass(slots=True)
class _Eff:
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
class _Group:
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
class _Claim:
    name: str
    pool: _Pool
    reqs: Reqs
    used: Vec
    excluded: frozenset[str]  # instance types the pool's limits ruled out when the claim opened
    background: bool = False
    pods: list[str] = field(default_factory=list)
    ports: list[tuple[int, str, str]] = field(default_factory=list)


class _FitList:
    """Nodes (in placement order) with static compatibility and baseline room for one fit key."""

    __slots__ = ("items", "scan")

    def __init__(self) -> None:
        self.items: list[int] = []
        self.scan = 0


class _Probe:
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
        self.claims: list[_Claim] = []
        self.delta: dict[int, dict[str, int]] = {}
        self.inv_delta: dict[PodAffinityTerm, dict[str, int]] = {}
        self.limits: dict[str, Vec] = {}
        self.excluded: dict[str, tuple[Vec, frozenset[str]]] = {}
        self.background = False  # placing background pods (their claims do not count)
        self.refused: set[tuple[str, int]] = set()  # (claim, pod signature) that cannot join
        self.on_node: dict[int, list[tuple[SimPod, _Eff]]] = {}  # background pods placed per node


@dataclass(slots=True)
class _Base:
    """The cluster after the background pods are placed (nodes in `gone` removed): every probe with
    the same background forks from it instead of placing those pods again."""

    probe: _Probe
    placements: dict[str, str]
    unschedulable: dict[str, str]
    pending: frozenset[str]
    keys: frozenset[str]  # the background pods placed


def _fits(v: Vec, f: Vec) -> bool:
    # An explicit loop: all() with a generator costs twice as much on this hot path.
    for a, b in zip(v, f, strict=False):  # noqa: SIM110
        if a > b:
            return False
    return True


def _share(v: Vec, alloc: Vec) -> float:
    """The largest fraction of any resource of `alloc` that `v` takes (inf when `alloc` lacks one)."""
    share = 0.0
    for x, a in zip(v, alloc, strict=True):
        if x:
            if a <= 0:
                return float("inf")
            share = max(share, x / a)
    return share


def _add(a: Vec, b: Vec) -> Vec:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def _sub(a: Vec, b: Vec) -> Vec:
    return tuple(x - y for x, y in zip(a, b, strict=True))


def _pareto(vectors: Iterable[Vec]) -> list[Vec]:
    out: list[Vec] = []
    for v in sorted(set(vectors), reverse=True):
        if not any(_fits(v, w) for w in out):
            out.append(v)
    return out


# ------------------------------------------------------------------------------------------
# The simulator
# ------------------------------------------------------------------------------------------
class Simulator:
    """A prepared cluster that answers "where would these pods go without these nodes?"."""

    def __init__(
        self,
        nodes: Sequence[SimNode],
        bound: Iterable[BoundPod],
        nodepools: Sequence[SimNodePool],
        instance_types: Sequence[SimInstanceType],
        daemonsets: Sequence[SimDaemonSet] = (),
        *,
        preference_policy: PreferencePolicy = RESPECT,
    ) -> None:
        if preference_policy not in (RESPECT, IGNORE):
            raise ValueError(f"preference_policy {preference_policy!r}: expected Respect or Ignore")
        self.preference_policy = preference_policy
        # Memo tables: keyed by values (signatures, requirement sets), valid for the simulator's life.
        self._eff_cache: dict[tuple[PodConstraints, int], _Eff] = {}
        self._levels_cache: dict[PodConstraints, int] = {}
        self._fitlists: dict[tuple, _FitList] = {}
        self._merge_cache: dict[tuple, Reqs | None] = {}
        self._typeset_cache: dict[tuple, _TypeSet] = {}
        self._tolerates_pool: dict[tuple, bool] = {}
        self._domains_cache: dict[tuple, frozenset[str]] = {}
        self._compat_cache: dict[tuple[str, Reqs], bool] = {}
        self._bases: dict[tuple, _Base] = {}
        self._fair_cache: dict[Vec, float] = {}
        pods_by_node: dict[str, list[BoundPod]] = {}
        for pod in bound:
            pods_by_node.setdefault(pod.node_name, []).append(pod)

        names = set(CORE_RESOURCES)
        for n in nodes:
            names.update(n.allocatable)
        for it in instance_types:
            names.update(it.allocatable)
        self._res_names = list(CORE_RESOURCES) + sorted(names - set(CORE_RESOURCES))
        self._res_index = {n: i for i, n in enumerate(self._res_names)}
        self._zero: Vec = (0,) * len(self._res_names)
        self._vec_cache: dict[Resources, Vec | None] = {}

        self.well_known = set(BASE_WELL_KNOWN)
        for it in instance_types:
            self.well_known.update(it.labels)

        # Existing nodes: every node not being deleted, initialized ones first, then by name.
        self.deleting_nodes = frozenset(n.name for n in nodes if n.deleting)
        live = sorted((n for n in nodes if not n.deleting), key=lambda n: (not n.initialized, n.name))
        self._ref_keys: set[str] = {HOSTNAME}
        self._class_ids: dict[tuple, int] = {}
        self._static_ok: dict[tuple, dict[int, bool]] = {}
        self.nodes: list[_Node] = []
        self.node_index: dict[str, int] = {}
        for idx, n in enumerate(live):
            alloc = self._vec_dict(n.allocatable)
            ports: list[tuple[int, str, str]] = []
            # Replicas share requests: sum per distinct request, then scale.
            per_request: dict[Resources, int] = {}
            for p in pods_by_node.get(n.name, ()):
                per_request[p.requests] = per_request.get(p.requests, 0) + 1
                if p.host_ports:
                    ports.extend(p.host_ports)
            used_list = [0] * len(self._zero)
            for requests, count in per_request.items():
                for i, value in enumerate(self._vec(requests) or self._zero):
                    if value:
                        used_list[i] += value * count
            used = tuple(used_list)
            self.nodes.append(
                _Node(
                    idx,
                    n.name,
                    n.labels,
                    n.taints,
                    alloc,
                    _sub(alloc, used),
                    tuple(ports),
                    n.initialized,
                    0,
                    n.nodepool,
                )
            )
            self.node_index[n.name] = idx
        self._node_capacity = {n.name: self._vec_dict(n.capacity or n.allocatable) for n in live}
        self._reclassify()

        # Bound pods by (namespace, labels): topology groups count over these, not over 100k pods.
        self._labelsets: dict[tuple, dict[int, int]] = {}
        self._inv_terms: dict[PodAffinityTerm, Counter[int]] = {}
        labelsets = self._labelsets
        for n in self.nodes:
            idx = n.idx
            for p in pods_by_node.get(n.name, ()):
                if p.terminating:
                    continue  # terminating pods do not count for topology
                key = (p.namespace, p.labels)
                per_node = labelsets.get(key)
                if per_node is None:
                    per_node = labelsets[key] = {}
                per_node[idx] = per_node.get(idx, 0) + 1
                for term in p.anti_affinity:
                    self._inv_terms.setdefault(term, Counter())[idx] += 1
        self._inv_base: dict[PodAffinityTerm, dict[str, int]] = {}
        self._inv_version = 0
        self._inv_cache: dict[tuple, tuple[int, list[PodAffinityTerm]]] = {}
        self._inv_by_label: dict[tuple[str, str], list[PodAffinityTerm]] = {}
        self._inv_scan: list[PodAffinityTerm] = []
        for term in self._inv_terms:
            self._index_inverse(term)
        self._groups: list[_Group] = []
        self._group_ids: dict[tuple, int] = {}
        self._selecting_cache: dict[tuple, tuple[int, list[_Group]]] = {}
        # Indexes so that thousands of workloads with topology rules stay cheap: label sets by label,
        # groups by their first matchLabels pair (groups without matchLabels are always checked).
        self._labelset_index: dict[tuple[str, str], list[tuple]] = {}
        for ns_labels in self._labelsets:
            for pair in ns_labels[1]:
                self._labelset_index.setdefault(pair, []).append(ns_labels)
        self._groups_by_label: dict[tuple[str, str], list[int]] = {}
        self._groups_scan: list[int] = []
        self._universes: dict[tuple, frozenset[str]] = {}

        self.instance_types = {it.name: it for it in instance_types}
        self._pools: list[_Pool] = []
        for pool in sorted(nodepools, key=lambda p: (-p.weight, p.name)):
            self._pools.append(self._prepare_pool(pool, instance_types, daemonsets))
        self._pool_by_name = {p.pool.name: p for p in self._pools}
        self._pool_nodes_capacity: dict[str, Vec] = {}
        for n in self.nodes:
            if n.nodepool in self._pool_by_name:
                cap = self._node_capacity[n.name]
                self._pool_nodes_capacity[n.nodepool] = _add(
                    self._pool_nodes_capacity.get(n.nodepool, self._zero), cap
                )

    # -- vectors ---------------------------------------------------------------------------
    def _vec(self, resources: Resources) -> Vec | None:
        cached = self._vec_cache.get(resources, False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        out = list(self._zero)
        vec: Vec | None
        for name, value in resources:
            i = self._res_index.get(name)
            if i is None:
                vec = None
                break
            out[i] += value
        else:
            vec = tuple(out)
        self._vec_cache[resources] = vec
        return vec

    def _vec_dict(self, resources: dict[str, int]) -> Vec:
        out = list(self._zero)
        for name, value in resources.items():
            i = self._res_index.get(name)
            if i is not None:
                out[i] = value
        return tuple(out)

    def describe_vec(self, vec: Vec) -> dict[str, int]:
        return {n: v for n, v in zip(self._res_names, vec, strict=True) if v}

    # -- node classes ------------------------------------------------------------------------
    def _reclassify(self) -> None:
        """Group nodes whose labels (on the keys some pod looks at) and taints are equal."""
        keys = sorted(self._ref_keys)
        self._class_ids.clear()
        for n in self.nodes:
            key = (tuple(n.labels.get(x) for x in keys), n.taints)
            n.klass = self._class_ids.setdefault(key, len(self._class_ids))
        # Finer classes do not change any answer, so the fit lists stay valid; only the per-class
        # compatibility memo is keyed by class id.
        self._static_ok = {}

    def _note_keys(self, terms: Iterable[Reqs]) -> None:
        new = {r.key for term in terms for r in term} - self._ref_keys
        if new:
            self._ref_keys |= new
            self._reclassify()

    # -- NodePools ---------------------------------------------------------------------------
    def _prepare_pool(
        self, pool: SimNodePool, instance_types: Sequence[SimInstanceType], daemonsets: Sequence[SimDaemonSet]
    ) -> _Pool:
        base = freeze(
            (
                *pool.requirements,
                *(Req.equals(key, v) for key, v in pool.labels.items()),
                Req.equals(k.NODEPOOL_LABEL, pool.name),
            )
        )
        prepared = _Pool(pool, base, frozenset(r.key for r in base), pool.taints, [], {}, None)
        if pool.limits:
            prepared.limits = tuple(
                pool.limits.get(n, 1 << 62) if n in pool.limits else 1 << 62 for n in self._res_names
            )
        for it in instance_types:
            if self._type_compatible(it, base):
                prepared.types.append(it)
        # DaemonSet overhead: the daemons that would run on a node of this pool and type.
        for it in prepared.types:
            labels = {**it.labels, **pool.labels, k.NODEPOOL_LABEL: pool.name}
            total = self._zero
            for ds in daemonsets:
                c = ds.constraints
                if tolerates_all(c.tolerations, pool.taints) is not None:
                    continue
                if c.node_terms and not any(self._ds_term_ok(t, labels, base) for t in c.node_terms):
                    continue
                total = _add(total, self._vec(c.requests) or self._zero)
            prepared.overhead[it.name] = total
        return prepared

    @staticmethod
    def _ds_term_ok(term: Reqs, labels: dict[str, str], base: Reqs) -> bool:
        base_by_key = {r.key: r for r in base}
        for r in term:
            if r.key in labels:
                if not r.matches(labels[r.key]):
                    return False
            elif r.key in base_by_key:
                if not base_by_key[r.key].overlaps(r):
                    return False
            elif not r.allow_absent and r.key not in (ZONE, CAPACITY_TYPE):
                return False
        return True

    def _type_compatible(self, it: SimInstanceType, reqs: Reqs) -> bool:
        """Labels allow the type and some available offering has an allowed zone and capacity type."""
        key = (it.name, reqs)
        cached = self._compat_cache.get(key)
        if cached is not None:
            return cached
        labels = it.labels
        ok = True
        zone_req = ct_req = None
        for r in reqs:
            key_name = _TYPE_LABEL_ALIASES.get(r.key, r.key)
            if key_name == ZONE:
                zone_req = r if zone_req is None else zone_req.intersect(r)
                continue
            if key_name == CAPACITY_TYPE:
                ct_req = r
                continue
            if key_name in _NOT_FROM_TYPE:
                continue
            if key_name == k.INSTANCE_TYPE_LABEL:
                if not r.has(it.name):
                    ok = False
                    break
                continue
            value = labels.get(key_name)
            if value is not None:
                if not r.has(value):
                    ok = False
                    break
            elif r.key in self.well_known and not r.allow_absent:
                ok = False
                break
        if ok:
            ok = any(
                o.available
                and (zone_req is None or zone_req.has(o.zone))
                and (ct_req is None or ct_req.has(o.capacity_type))
                for o in it.offerings
            )
        self._compat_cache[key] = ok
        return ok

    def _typeset(self, pool: _Pool, reqs: Reqs, excluded: frozenset[str]) -> _TypeSet:
        key = (pool.pool.name, reqs, excluded)
        cached = self._typeset_cache.get(key)
        if cached is not None:
            return cached
        by_key = {r.key: r for r in reqs}
        zone_req, ct_req = by_key.get(ZONE), by_key.get(CAPACITY_TYPE)
        entries: list[_TypeEntry] = []
        for it in pool.types:
            if it.name in excluded or not self._type_compatible(it, reqs):
                continue
            offers = [
                o
                for o in it.offerings
                if o.available
                and (zone_req is None or zone_req.has(o.zone))
                and (ct_req is None or ct_req.has(o.capacity_type))
            ]
            worst = float("inf")
            for ct in LAUNCH_PRECEDENCE:
                prices = [o.price for o in offers if o.capacity_type == ct]
                if prices:
                    worst = max(prices)
                    break
            else:
                other = [o.price for o in offers]
                worst = max(other) if other else worst
            alloc = _sub(self._vec_dict(it.allocatable), pool.overhead.get(it.name, self._zero))
            if any(v < 0 for v in alloc):
                continue
            entries.append(
                _TypeEntry(
                    it.name,
                    alloc,
                    self._vec_dict(it.capacity or it.allocatable),
                    min(o.price for o in offers),
                    worst,
                    it.labels,
                    frozenset(o.zone for o in offers),
                    frozenset(o.capacity_type for o in offers),
                )
            )
        entries.sort(key=lambda e: (e.price, e.name))
        result = _TypeSet(entries, _pareto(e.alloc for e in entries))
        self._typeset_cache[key] = result
        return result

    def _pool_tolerated(self, pool: _Pool, tolerations: tuple[Toleration, ...]) -> bool:
        key = (pool.pool.name, tolerations)
        ok = self._tolerates_pool.get(key)
        if ok is None:
            ok = tolerates_all(tolerations, pool.taints) is None
            self._tolerates_pool[key] = ok
        return ok

    def _merge(self, claim_reqs: Reqs, base_keys: frozenset[str], term: Reqs) -> Reqs | None:
        """Karpenter's Compatible + Add: the narrowed requirements, or None if they do not overlap."""
        key = (claim_reqs, term)
        if key in self._merge_cache:
            return self._merge_cache[key]
        by_key = {r.key: r for r in claim_reqs}
        merged: Reqs | None = None
        ok = True
        for r in term:
            if r.key == HOSTNAME:
                continue  # checked against the claim's own hostname
            existing = by_key.get(r.key)
            if existing is None:
                if r.key not in self.well_known and r.key not in base_keys and not r.allow_absent:
                    ok = False  # a custom label the NodePool does not define
                    break
                by_key[r.key] = r
            elif existing.overlaps(r):
                by_key[r.key] = existing.intersect(r)
            else:
                ok = False
                break
        if ok:
            merged = tuple(by_key[x] for x in sorted(by_key))
        self._merge_cache[key] = merged
        return merged

    def _pool_domains(self, pool: _Pool, reqs: Reqs, key: str, excluded: frozenset[str]) -> frozenset[str]:
        """The values `key` can take on a node launched from `pool` under `reqs`."""
        ck = (pool.pool.name, reqs, key, excluded)
        cached = self._domains_cache.get(ck)
        if cached is not None:
            return cached
        entries = self._typeset(pool, reqs, excluded).entries
        req = next((r for r in reqs if r.key == key), None)
        if key == ZONE:
            values = frozenset().union(*(e.zones for e in entries)) if entries else frozenset()
        elif key == CAPACITY_TYPE:
            values = frozenset().union(*(e.capacity_types for e in entries)) if entries else frozenset()
        elif key == k.INSTANCE_TYPE_LABEL:
            values = frozenset(e.name for e in entries)
        elif key in pool.pool.labels:
            values = frozenset((pool.pool.labels[key],))
        elif any(key in e.labels for e in entries):
            values = frozenset(e.labels[key] for e in entries if key in e.labels)
        elif req is not None and not req.complement:
            values = req.values
        else:
            values = frozenset()
        if req is not None:
            values = frozenset(v for v in values if req.has(v))
        self._domains_cache[ck] = values
        return values

    # -- pod signatures ----------------------------------------------------------------------
    def _levels(self, sig: PodConstraints) -> int:
        """How many relaxations a signature has (0 when preferences are ignored or absent)."""
        n = self._levels_cache.get(sig)
        if n is None:
            n = (
                len(sig.preferred_affinity)
                + len(sig.preferred_anti_affinity)
                + len(sig.preferred_node_terms)
                + sum(1 for s in sig.spreads if not s.hard)
            )
            self._levels_cache[sig] = n
        return n

    def _eff(self, sig: PodConstraints, level: int) -> _Eff:
        cached = self._eff_cache.get((sig, level))
        if cached is not None:
            return cached
        if self.preference_policy == IGNORE:
            level = self._levels(sig)
        left = level
        by_weight = lambda items: sorted(items, key=lambda wt: -wt[0])  # noqa: E731  heaviest first, stable

        def drop(items: Sequence) -> list:
            nonlocal left
            n = min(left, len(items))
            left -= n
            return list(items[n:])

        pref_aff = [t for _, t in drop(by_weight(sig.preferred_affinity))]
        pref_anti = [t for _, t in drop(by_weight(sig.preferred_anti_affinity))]
        pref_node = [t for _, t in drop(by_weight(sig.preferred_node_terms))]
        soft = [s for s in sig.spreads if not s.hard]
        soft = drop(soft)
        spreads = [s for s in sig.spreads if s.hard] + soft

        required = sig.node_terms or (EMPTY_REQS,)
        terms = tuple(freeze((*t, *pref_node[0])) for t in required) if pref_node else required
        self._note_keys(terms)
        groups: list[int] = []
        for s in spreads:
            groups.append(
                self._group(
                    SPREAD,
                    s.topology_key,
                    frozenset((sig.namespace,)),
                    s.selector,
                    s.max_skew,
                    s.min_domains,
                    required,
                    sig,
                )
            )
        for term in [*sig.affinity, *pref_aff]:
            groups.append(
                self._group(AFFINITY, term.topology_key, term.namespaces, term.selector, 0, None, (), sig)
            )
        for term in [*sig.anti_affinity, *pref_anti]:
            groups.append(
                self._group(ANTI, term.topology_key, term.namespaces, term.selector, 0, None, (), sig)
            )
        vec = self._vec(sig.requests)
        static_key = (terms, sig.tolerations)
        hostname_reqs = tuple(tuple(r for r in t if r.key == HOSTNAME) for t in terms)
        eff = _Eff(
            sig=sig,
            vec=vec,
            terms=terms,
            filter_terms=required,
            tolerations=sig.tolerations,
            ports=sig.host_ports,
            groups=tuple(dict.fromkeys(groups)),
            owned_anti=sig.anti_affinity,
            fitkey=(static_key, vec, sig.host_ports),
            static_key=static_key,
            labelset=(sig.namespace, sig.labels),
            hostname_reqs=hostname_reqs,
            monotone=all(self._groups[g].kind == ANTI for g in groups),
        )
        self._eff_cache[(sig, level)] = eff
        return eff

    # -- topology groups ----------------------------------------------------------------------
    def _group(
        self,
        kind: int,
        key: str,
        namespaces: frozenset[str] | None,
        selector: object,
        max_skew: int,
        min_domains: int | None,
        filter_terms: tuple[Reqs, ...],
        owner: PodConstraints,
    ) -> int:
        gkey = (
            kind,
            key,
            namespaces,
            selector,
            max_skew,
            min_domains,
            filter_terms if kind == SPREAD else (),
        )
        gid = self._group_ids.get(gkey)
        if gid is not None:
            return gid
        gid = len(self._groups)
        probe = _Group(gid, *gkey, {}, {}, frozenset())  # the key's fields are _Group's, in order

        unfiltered = kind != SPREAD or EMPTY_REQS in filter_terms  # no node affinity: every node counts

        def node_passes(n: _Node) -> bool:
            return unfiltered or any(labels_match(t, n.labels) for t in filter_terms)

        for ns, labels in self._labelsets_for(selector):
            if probe.selects(ns, dict(labels)):
                for idx, count in self._labelsets[(ns, labels)].items():
                    if node_passes(self.nodes[idx]):
                        probe.per_node[idx] = probe.per_node.get(idx, 0) + count
        for idx, count in probe.per_node.items():
            domain = self.nodes[idx].labels.get(key)
            if domain is not None:
                probe.baseline[domain] = probe.baseline.get(domain, 0) + count
        if kind == SPREAD and key != HOSTNAME:
            probe.universe = self._universe(key, filter_terms, owner.tolerations, node_passes)
        self._groups.append(probe)
        self._group_ids[gkey] = gid
        match_labels = getattr(selector, "match_labels", ())
        if getattr(selector, "nothing", False):
            pass  # selects no pod: never counts anything
        elif match_labels:
            self._groups_by_label.setdefault(match_labels[0], []).append(gid)
        else:
            self._groups_scan.append(gid)
        return gid

    def _universe(
        self,
        key: str,
        filter_terms: tuple[Reqs, ...],
        tolerations: tuple,
        node_passes: Callable[[_Node], bool],
    ) -> frozenset[str]:
        """The domains a spread may use: those of existing nodes its pods may run on, and those new
        nodes from the pools they tolerate could get. Shared by every group with the same inputs."""
        ck = (key, filter_terms, tolerations)
        cached = self._universes.get(ck)
        if cached is not None:
            return cached
        universe = {n.labels[key] for n in self.nodes if key in n.labels and node_passes(n)}
        for pool in self._pools:
            if not self._pool_tolerated(pool, tolerations):
                continue
            for term in filter_terms:
                merged = self._merge(pool.base, pool.base_keys, term)
                if merged is not None:
                    universe |= self._pool_domains(pool, merged, key, frozenset())
        result = self._universes[ck] = frozenset(universe)
        return result

    def _labelsets_for(self, selector: object) -> Iterable[tuple]:
        """Bound-pod label sets a selector may match: through the label index when it has matchLabels."""
        if getattr(selector, "nothing", False):
            return ()
        match_labels = getattr(selector, "match_labels", ())
        if not match_labels:
            return list(self._labelsets)
        lists = [self._labelset_index.get(pair, ()) for pair in match_labels]
        return min(lists, key=len)

    def _selecting(self, labelset: tuple) -> list[_Group]:
        """Groups whose selector selects pods with these (namespace, labels)."""
        cached = self._selecting_cache.get(labelset)
        if cached is not None and cached[0] == len(self._groups):
            return cached[1]
        ns, labels = labelset
        lm = dict(labels)
        gids = set(self._groups_scan)
        for pair in labels:
            gids.update(self._groups_by_label.get(pair, ()))
        out = [self._groups[g] for g in sorted(gids) if self._groups[g].selects(ns, lm)]
        self._selecting_cache[labelset] = (len(self._groups), out)
        return out

    def _index_inverse(self, term: PodAffinityTerm) -> None:
        selector = term.selector
        if selector.nothing:
            return
        if selector.match_labels:
            self._inv_by_label.setdefault(selector.match_labels[0], []).append(term)
        else:
            self._inv_scan.append(term)

    def _inverse_terms(self, labelset: tuple) -> list[PodAffinityTerm]:
        """Required anti-affinity terms of placed pods that select pods with these (namespace, labels)."""
        cached = self._inv_cache.get(labelset)
        if cached is not None and cached[0] == self._inv_version:
            return cached[1]
        ns, labels = labelset
        lm = dict(labels)
        candidates = list(self._inv_scan)
        for pair in labels:
            candidates.extend(self._inv_by_label.get(pair, ()))
        out = [t for t in dict.fromkeys(candidates) if t.selects(ns, lm)]
        self._inv_cache[labelset] = (self._inv_version, out)
        return out

    def _count(self, probe: _Probe, g: _Group, domain: str) -> int:
        delta = probe.delta.get(g.gid)
        if delta is None:
            delta = self._start_delta(probe, g)
        return g.baseline.get(domain, 0) + delta.get(domain, 0)

    def _start_delta(self, probe: _Probe, g: _Group) -> dict[str, int]:
        delta: dict[str, int] = {}
        for idx in probe.removed:
            c = g.per_node.get(idx)
            if c:
                d = self.nodes[idx].labels.get(g.key)
                if d is not None:
                    delta[d] = delta.get(d, 0) - c
        probe.delta[g.gid] = delta
        return delta

    def _inv_delta(self, probe: _Probe, term: PodAffinityTerm) -> dict[str, int]:
        delta = probe.inv_delta.get(term)
        if delta is None:
            delta = {}
            owners = self._inv_terms.get(term, {})
            for idx in probe.removed:
                c = owners.get(idx)
                if c:
                    d = self.nodes[idx].labels.get(term.topology_key)
                    if d is not None:
                        delta[d] = delta.get(d, 0) - c
            probe.inv_delta[term] = delta
        return delta

    def _inv_count(self, probe: _Probe, term: PodAffinityTerm, domain: str) -> int:
        """Pods in `domain` whose required anti-affinity `term` forbids company it selects."""
        base = self._inv_base.get(term)
        if base is None:
            base = {}
            for idx, c in self._inv_terms.get(term, {}).items():
                d = self.nodes[idx].labels.get(term.topology_key)
                if d is not None:
                    base[d] = base.get(d, 0) + c
            self._inv_base[term] = base
        return base.get(domain, 0) + self._inv_delta(probe, term).get(domain, 0)

    def _min_count(self, probe: _Probe, g: _Group) -> int:
        if g.key == HOSTNAME:
            return 0  # a new node is always an empty hostname domain
        if g.min_domains is not None and len(g.universe) < g.min_domains:
            return 0
        return min((self._count(probe, g, d) for d in g.universe), default=0)

    def _domain_ok(self, probe: _Probe, eff: _Eff, g: _Group, domain: str, lm: dict[str, str]) -> bool:
        if g.kind == SPREAD:
            count = self._count(probe, g, domain) + (1 if g.selects(eff.sig.namespace, lm) else 0)
            return count - self._min_count(probe, g) <= g.max_skew
        if g.kind == ANTI:
            return self._count(probe, g, domain) == 0
        # Affinity: a domain with a matching pod, or anywhere if nothing matches yet and the pod
        # matches itself (the first replica of a self-affine workload).
        if self._count(probe, g, domain) > 0:
            return True
        return g.selects(eff.sig.namespace, lm) and self._total(probe, g) == 0

    def _total(self, probe: _Probe, g: _Group) -> int:
        delta = probe.delta.get(g.gid)
        if delta is None:
            delta = self._start_delta(probe, g)
        return sum(g.baseline.values()) + sum(delta.values())

    def _topology_ok_node(self, probe: _Probe, eff: _Eff, node: _Node) -> bool:
        if eff.groups:
            lm = eff.sig.label_map
            for gid in eff.groups:
                g = self._groups[gid]
                domain = node.labels.get(g.key)
                if domain is None:
                    if g.kind == ANTI:
                        continue  # no domain: nothing shares it
                    return False
                if not self._domain_ok(probe, eff, g, domain, lm):
                    return False
        if self._inv_terms:
            for term in self._inverse_terms(eff.labelset):
                domain = node.labels.get(term.topology_key)
                if domain is not None and self._inv_count(probe, term, domain) > 0:
                    return False
        return True

    # -- the probe -----------------------------------------------------------------------------
    def simulate(
        self,
        remove: Collection[str],
        pods: Sequence[SimPod],
        *,
        background: Sequence[SimPod] = (),
        gone: Collection[str] = (),
        from_deleting: Collection[str] = (),
        max_new_claims: int | None = None,
        stop_on_failure: bool = False,
        packing: Packing = KARPENTER_PACKING,
    ) -> SimulationResult:
        """Place `pods` on the cluster without the `remove` and `gone` nodes, opening new NodeClaims
        as needed.

        `background` pods (pending pods, pods of nodes being deleted or `gone`) are placed first: they
        take room before the moved pods, and the NodeClaims they open stand for capacity the
        provisioner launches anyway, so they are marked `background`, do not count against
        `max_new_claims`, and do not take moved pods (like Karpenter's in-flight, uninitialized nodes).
        The background placement is computed once per (`gone`, `background`) and reused by every
        probe; only background pods sitting on a probe's `remove` nodes are placed again.

        `max_new_claims` and `stop_on_failure` let a caller that will reject the answer anyway
        (consolidation needs 0 or 1 new node and every non-pending pod placed) stop early; the
        result then has `aborted` set. Pods whose current node is being deleted, or named in
        `from_deleting` (ns/name), may land on uninitialized nodes.

        `packing` decides how `pods` that no existing node takes fill new NodeClaims:
        - "karpenter": pod by pod, largest first, each joins the open claim with the fewest pods that
          can take it or opens one, and a claim grows until no instance type holds more;
        - "cost" (for callers that may launch several nodes, planner.scheduling_packing): every pod
          first tries the existing nodes; the rest fill one new node at a time, each sized for the
          instance type that hosts its pods at the lowest price per share. Pods it cannot pack fall
          back to the "karpenter" way.
        """
        deleting_keys = set(from_deleting) | {
            p.key
            for p in (*pods, *background)
            if p.node_name is not None and p.node_name in self.deleting_nodes
        }
        # Topology groups must exist before anything is placed, or pods placed earlier would not be
        # counted in them (Karpenter builds every group up front too). A new group makes the cached
        # background placements stale.
        if self.register({p.constraints for p in (*pods, *background)}):
            self._bases.clear()
        base = self._base(frozenset(gone), background, deleting_keys)
        probe, displaced = self._fork(base, frozenset(remove))
        result = SimulationResult(
            placements={k: v for k, v in base.placements.items() if k not in displaced},
            unschedulable=dict(base.unschedulable),
            pending=base.pending | frozenset(p.key for p in pods if p.pending),
        )
        try:
            if stop_on_failure:
                for key, why in sorted(result.unschedulable.items()):
                    if key not in result.pending:
                        raise SimulationAborted(f"pod {key} cannot be placed: {why}")
            probe.background = True
            for pod in sorted(displaced.values(), key=self._pod_order):
                self._place(probe, pod, result, deleting_keys, None, stop_on_failure)
            probe.background = False
            ordered = sorted(pods, key=self._pod_order)
            if packing == COST_PACKING:
                ordered = self._place_cost(
                    probe, ordered, result, deleting_keys, max_new_claims, stop_on_failure
                )
            for pod in ordered:
                self._place(probe, pod, result, deleting_keys, max_new_claims, stop_on_failure)
        except SimulationAborted as stop:
            result.aborted = str(stop)
        result.new_claims = [self._finalize(c) for c in probe.claims]
        return result

    def register(self, signatures: Iterable[PodConstraints]) -> bool:
        """Prepare pod signatures (every relaxation level) and their topology groups. Returns whether a
        new topology group appeared. Cheap for signatures seen before."""
        before = len(self._groups)
        for sig in signatures:
            if sig in self._levels_cache:
                continue
            levels = self._levels(sig) if self.preference_policy == RESPECT else 0
            for level in range(levels + 1):
                self._eff(sig, level)
        return len(self._groups) != before

    def _base(self, gone: frozenset[str], background: Sequence[SimPod], deleting_keys: set[str]) -> _Base:
        keys = tuple(p.key for p in background)
        cached = self._bases.get((gone, keys))
        if cached is not None:
            return cached
        # Within a pass the gone nodes and the background only grow (each method marks more nodes):
        # start from the largest base this one contains and place only what is new.
        key_set = frozenset(keys)
        parent = max(
            (b for (g, k), b in self._bases.items() if g <= gone and b.keys <= key_set),
            key=lambda b: (len(b.probe.removed_names), len(b.keys)),
            default=None,
        )
        if parent is None:
            probe = _Probe({self.node_index[n] for n in gone if n in self.node_index}, gone)
            self._limits_start(probe)
            result = SimulationResult()
            todo = list(background)
        else:
            probe, displaced = self._fork(parent, gone)
            result = SimulationResult(
                placements={k: v for k, v in parent.placements.items() if k not in displaced},
                unschedulable=dict(parent.unschedulable),
            )
            todo = [*displaced.values(), *(p for p in background if p.key not in parent.keys)]
        probe.background = True
        for pod in sorted(todo, key=self._pod_order):
            self._place(probe, pod, result, deleting_keys, None, False)
        probe.background = False
        pending = frozenset(p.key for p in background if p.pending)
        base = _Base(probe, result.placements, result.unschedulable, pending, key_set)
        if len(self._bases) >= 8:
            self._bases.pop(next(iter(self._bases)))
        self._bases[(gone, keys)] = base
        return base

    def _fork(self, base: _Base, remove: frozenset[str]) -> tuple[_Probe, dict[str, SimPod]]:
        """A probe starting from `base` with the `remove` nodes gone too; returns the background pods
        those nodes held (they must be placed again)."""
        b = base.probe
        extra = {self.node_index[n] for n in remove if n in self.node_index} - b.removed
        probe = _Probe(b.removed | extra, b.removed_names | remove)
        probe.free = dict(b.free)
        probe.ports = {i: list(v) for i, v in b.ports.items()}
        probe.ptr = dict(b.ptr)
        probe.claims = [replace(c, pods=list(c.pods), ports=list(c.ports)) for c in b.claims]
        probe.refused = set(b.refused)
        probe.on_node = {i: list(v) for i, v in b.on_node.items() if i not in extra}
        probe.limits = dict(b.limits)
        for idx in extra:
            node = self.nodes[idx]
            if node.nodepool in probe.limits:
                probe.limits[node.nodepool] = _add(
                    probe.limits[node.nodepool], self._node_capacity[node.name]
                )
        for gid, counts in b.delta.items():
            counts = dict(counts)
            g = self._groups[gid]
            for idx in extra:
                c = g.per_node.get(idx)
                d = self.nodes[idx].labels.get(g.key)
                if c and d is not None:
                    counts[d] = counts.get(d, 0) - c
            probe.delta[gid] = counts
        for term, counts in b.inv_delta.items():
            counts = dict(counts)
            owners = self._inv_terms.get(term, {})
            for idx in extra:
                c = owners.get(idx)
                d = self.nodes[idx].labels.get(term.topology_key)
                if c and d is not None:
                    counts[d] = counts.get(d, 0) - c
            probe.inv_delta[term] = counts
        displaced: dict[str, SimPod] = {}
        for idx in sorted(extra):
            node = self.nodes[idx]
            for pod, eff in b.on_node.get(idx, ()):
                self._record(probe, eff, self._node_domains(node), self._node_filter(node), -1)
                displaced[pod.key] = pod
        return probe, displaced

    def reprice(self, claim: NewNodeClaim, extra: Iterable[Req] = ()) -> tuple[ClaimOption, ...]:
        """The claim's options under extra requirements (e.g. capacity type pinned to spot), re-priced."""
        pool = self._pool_by_name[claim.nodepool]
        reqs = claim.requirements
        for req in extra:
            merged = self._merge(reqs, pool.base_keys, (req,))
            if merged is None:
                return ()
            reqs = merged
        used = self._vec_dict(claim.requests)
        allowed = set(claim.instance_types)
        return tuple(
            ClaimOption(e.name, e.price, e.worst_price)
            for e in self._typeset(pool, reqs, frozenset()).entries
            if e.name in allowed and _fits(used, e.alloc)
        )

    def min_values_met(self, claim: NewNodeClaim, options: Sequence[str]) -> str | None:
        """None when `options` still satisfy the claim's minValues; otherwise what is missing."""
        for req in claim.requirements:
            if not req.min_values:
                continue
            if req.key == k.INSTANCE_TYPE_LABEL:
                distinct = set(options)
            else:
                distinct = {self.instance_types[o].labels.get(req.key) for o in options} - {None}
            if len(distinct) < req.min_values:
                return f"minValues {req.min_values} for {req.key} needs more options, {len(distinct)} left"
        return None

    def _pod_order(self, pod: SimPod) -> tuple:
        v = self._vec(pod.constraints.requests) or self._zero
        return (-v[0], -v[1], pod.namespace, pod.name)

    def _place(
        self,
        probe: _Probe,
        pod: SimPod,
        result: SimulationResult,
        deleting_keys: set[str],
        max_new_claims: int | None,
        stop_on_failure: bool,
    ) -> None:
        sig = pod.constraints
        levels = self._levels(sig) if self.preference_policy == RESPECT else 0
        for level in range(levels + 1):
            eff = self._eff(sig, level)
            if eff.vec is None:
                break
            dest = self._try_existing(probe, eff)
            if dest is not None:
                self._commit_existing(
                    probe, eff, self.nodes[dest], pod, result, deleting_keys, stop_on_failure
                )
                return
            claim = self._try_claims(probe, eff, pod.key)
            if claim is not None:
                result.placements[pod.key] = claim.name
                return
            claim = self._open_claim(probe, eff, pod.key, max_new_claims)
            if claim is not None:
                result.placements[pod.key] = claim.name
                return
        self._fail(result, pod, self._explain(probe, pod), stop_on_failure)

    def _commit_existing(
        self,
        probe: _Probe,
        eff: _Eff,
        node: _Node,
        pod: SimPod,
        result: SimulationResult,
        deleting_keys: set[str],
        stop_on_failure: bool,
    ) -> None:
        self._commit_node(probe, eff, node, pod)
        result.placements[pod.key] = node.name
        if not node.initialized and pod.key not in deleting_keys:
            self._fail(result, pod, f"would schedule to uninitialized node {node.name}", stop_on_failure)

    def _place_cost(
        self,
        probe: _Probe,
        pods: list[SimPod],
        result: SimulationResult,
        deleting_keys: set[str],
        max_new_claims: int | None,
        stop_on_failure: bool,
    ) -> list[SimPod]:
        """The "cost" packing: existing nodes first (strict constraints), then new nodes one at a time
        (planner.scheduling_packing). Returns the pods left for the usual pod-by-pod placement."""
        from planner.scheduling_packing import pack_new_nodes

        rest: list[SimPod] = []
        leftover: list[tuple[SimPod, _Eff]] = []
        for pod in pods:
            eff = self._eff(pod.constraints, 0)
            if eff.vec is None:
                rest.append(pod)
                continue
            dest = self._try_existing(probe, eff)
            if dest is not None:
                self._commit_existing(
                    probe, eff, self.nodes[dest], pod, result, deleting_keys, stop_on_failure
                )
            else:
                leftover.append((pod, eff))
        rest.extend(pack_new_nodes(self, probe, leftover, result, max_new_claims))
        return sorted(rest, key=self._pod_order)

    # -- what planner.scheduling_packing uses ---------------------------------------------------
    @property
    def pools(self) -> list[_Pool]:
        """NodePools in the order new claims try them (highest weight first)."""
        return self._pools

    def pool_tolerates(self, pool: _Pool, eff: _Eff) -> bool:
        return self._pool_tolerated(pool, eff.tolerations)

    def pool_types(self, pool: _Pool, probe: _Probe | None = None) -> list[_TypeEntry]:
        """Instance types a new node of the pool may be (within the limits left in `probe`), cheapest
        first, each priced at its cheapest offering the pool allows, allocatable net of DaemonSets."""
        excluded = self._excluded(probe, pool) if probe is not None else frozenset()
        return self._typeset(pool, pool.base, excluded).entries

    def fair_price(self, vec: Vec) -> float:
        """What a pod with these requests costs on the instance type that suits it best: price x the
        largest share of any resource it takes there (inf when no type of any pool holds it)."""
        cached = self._fair_cache.get(vec)
        if cached is None:
            cached = min(
                (
                    e.price * _share(vec, e.alloc)
                    for pool in self._pools
                    for e in self._typeset(pool, pool.base, frozenset()).entries
                    if _fits(vec, e.alloc)
                ),
                default=float("inf"),
            )
            self._fair_cache[vec] = cached
        return cached

    def open_claim(
        self, probe: _Probe, eff: _Eff, pod_key: str, max_new_claims: int | None, pool: _Pool
    ) -> _Claim | None:
        """Open a new claim in `pool` holding this pod (None when the pod may not go there)."""
        return self._open_claim(probe, eff, pod_key, max_new_claims, [pool])

    def join_claim(self, probe: _Probe, claim: _Claim, eff: _Eff, pod_key: str) -> bool:
        """Add the pod to `claim` if the claim rules allow it."""
        reqs = self._claim_try(
            probe, eff, claim.pool, claim.reqs, claim.used, claim.name, claim.ports, claim.excluded
        )
        if reqs is None:
            return False
        self._claim_commit(probe, claim, eff, reqs, pod_key)
        return True

    def _fail(self, result: SimulationResult, pod: SimPod, why: str, stop: bool) -> None:
        result.unschedulable[pod.key] = why
        if stop and not pod.pending:
            raise SimulationAborted(f"pod {pod.key} cannot be placed: {why}")

    # -- existing nodes ------------------------------------------------------------------------
    def _static_ok_node(self, eff: _Eff, node: _Node) -> bool:
        table = self._static_ok.get(eff.static_key)
        if table is None:
            table = self._static_ok[eff.static_key] = {}
        ok = table.get(node.klass)
        if ok is None:
            ok = tolerates_all(eff.tolerations, node.taints) is None and any(
                labels_match(t, node.labels) for t in eff.terms
            )
            table[node.klass] = ok
        return ok

    def _extend(self, fl: _FitList, eff: _Eff) -> bool:
        nodes = self.nodes
        vec = eff.vec
        ports = eff.ports
        while fl.scan < len(nodes):
            node = nodes[fl.scan]
            fl.scan += 1
            if not _fits(vec, node.free) or not self._static_ok_node(eff, node):
                continue
            if ports and any(ports_conflict(a, b) for a in ports for b in node.ports):
                continue
            fl.items.append(node.idx)
            return True
        return False

    def _try_existing(self, probe: _Probe, eff: _Eff) -> int | None:
        fl = self._fitlists.get(eff.fitkey)
        if fl is None:
            fl = self._fitlists[eff.fitkey] = _FitList()
        vec = eff.vec
        pos = i = probe.ptr.get(eff.fitkey, 0)
        removed, free, pports = probe.removed, probe.free, probe.ports
        items = fl.items
        found = None
        while True:
            if i >= len(items) and not self._extend(fl, eff):
                break
            idx = items[i]
            if idx in removed:
                if i == pos:
                    pos += 1
                i += 1
                continue
            room = free.get(idx)
            if room is not None and not _fits(vec, room):
                if i == pos:
                    pos += 1  # room only shrinks within a probe: never look here again
                i += 1
                continue
            if (
                eff.ports
                and idx in pports
                and any(ports_conflict(a, b) for a in eff.ports for b in pports[idx])
            ):
                if i == pos:
                    pos += 1
                i += 1
                continue
            if self._topology_ok_node(probe, eff, self.nodes[idx]):
                found = idx
                break
            i += 1
        probe.ptr[eff.fitkey] = pos
        return found

    def _commit_node(self, probe: _Probe, eff: _Eff, node: _Node, pod: SimPod) -> None:
        probe.free[node.idx] = _sub(probe.free.get(node.idx, node.free), eff.vec)
        if eff.ports:
            probe.ports.setdefault(node.idx, []).extend(eff.ports)
        if probe.background:
            probe.on_node.setdefault(node.idx, []).append((pod, eff))
        self._record(probe, eff, self._node_domains(node), self._node_filter(node))

    @staticmethod
    def _node_domains(node: _Node) -> Callable[[str], frozenset[str]]:
        return lambda key: frozenset((node.labels[key],)) if key in node.labels else frozenset()

    @staticmethod
    def _node_filter(node: _Node) -> Callable[[_Group], bool]:
        return lambda g: (
            not g.filter_terms
            or EMPTY_REQS in g.filter_terms
            or any(labels_match(t, node.labels) for t in g.filter_terms)
        )

    def _record(
        self,
        probe: _Probe,
        eff: _Eff,
        domains_for: Callable[[str], frozenset[str]],
        filter_ok: Callable[[_Group], bool],
        sign: int = 1,
    ) -> None:
        """Count a placed pod (sign -1: uncount it) in every topology group that selects it."""
        for g in self._selecting(eff.labelset):
            domains = domains_for(g.key)
            if not domains or not filter_ok(g):
                continue
            if g.kind != ANTI and len(domains) != 1:
                continue  # spread and affinity count a pod only once its domain is known
            delta = probe.delta.get(g.gid)
            if delta is None:
                delta = self._start_delta(probe, g)
            for d in domains:
                delta[d] = delta.get(d, 0) + sign
        for term in eff.owned_anti:
            if term not in self._inv_terms:
                self._inv_terms[term] = Counter()
                self._index_inverse(term)
                self._inv_version += 1
            delta = self._inv_delta(probe, term)
            for d in domains_for(term.topology_key):
                delta[d] = delta.get(d, 0) + sign

    # -- new NodeClaims -------------------------------------------------------------------------
    def _limits_start(self, probe: _Probe) -> None:
        """What each limited pool may still launch: limits minus the capacity of its remaining nodes."""
        for pool in self._pools:
            if pool.limits is None:
                continue
            used = self._pool_nodes_capacity.get(pool.pool.name, self._zero)
            for idx in probe.removed:
                node = self.nodes[idx]
                if node.nodepool == pool.pool.name:
                    used = _sub(used, self._node_capacity[node.name])
            probe.limits[pool.pool.name] = _sub(pool.limits, used)

    def _excluded(self, probe: _Probe, pool: _Pool) -> frozenset[str]:
        """Instance types the pool's remaining limits rule out (empty for pools without limits)."""
        remaining = probe.limits.get(pool.pool.name)
        if remaining is None:
            return frozenset()
        cached = probe.excluded.get(pool.pool.name)
        if cached is not None and cached[0] == remaining:
            return cached[1]
        excluded = frozenset(
            it.name
            for it in pool.types
            if not _fits(self._vec_dict(it.capacity or it.allocatable), remaining)
        )
        probe.excluded[pool.pool.name] = (remaining, excluded)
        return excluded

    def _viable(self, ts: _TypeSet, used: Vec, reqs: Reqs) -> bool:
        if not any(_fits(used, f) for f in ts.frontier):
            return False
        mins = [r for r in reqs if r.min_values]
        if mins:
            fitting = [e for e in ts.entries if _fits(used, e.alloc)]
            for r in mins:
                if r.key == k.INSTANCE_TYPE_LABEL:
                    distinct = {e.name for e in fitting}
                else:
                    distinct = {e.labels.get(r.key) for e in fitting} - {None}
                if len(distinct) < (r.min_values or 0):
                    return False
        return True

    def _claim_try(
        self,
        probe: _Probe,
        eff: _Eff,
        pool: _Pool,
        reqs: Reqs,
        used: Vec,
        hostname: str,
        ports: list,
        excluded: frozenset[str],
    ) -> Reqs | None:
        """The requirements a claim would have with this pod on it, or None if the pod cannot join."""
        if not self._pool_tolerated(pool, eff.tolerations):
            return None
        if eff.ports and any(ports_conflict(a, b) for a in eff.ports for b in ports):
            return None
        new_used = _add(used, eff.vec)
        for term, host_reqs in zip(eff.terms, eff.hostname_reqs, strict=True):
            if host_reqs and not all(r.matches(hostname) for r in host_reqs):
                continue
            merged = self._merge(reqs, pool.base_keys, term)
            if merged is None:
                continue
            merged = self._claim_topology(probe, eff, pool, merged, hostname, excluded)
            if merged is None:
                continue
            if self._viable(self._typeset(pool, merged, excluded), new_used, merged):
                return merged
        return None

    def _claim_topology(
        self, probe: _Probe, eff: _Eff, pool: _Pool, reqs: Reqs, hostname: str, excluded: frozenset[str]
    ) -> Reqs | None:
        """Narrow a claim's domains so the pod's topology rules hold (None when they cannot)."""
        if eff.groups:
            lm = eff.sig.label_map
            for gid in eff.groups:
                g = self._groups[gid]
                if g.key == HOSTNAME:
                    if not self._domain_ok(probe, eff, g, hostname, lm):
                        return None
                    continue
                options = sorted(self._pool_domains(pool, reqs, g.key, excluded))
                allowed = [d for d in options if self._domain_ok(probe, eff, g, d, lm)]
                if not allowed:
                    return None
                if g.kind == SPREAD and len(allowed) > 1:
                    # Like Karpenter, commit a spread pod to the least-populated allowed domain.
                    allowed = [min(allowed, key=lambda d: (self._count(probe, g, d), d))]
                elif g.kind == AFFINITY and len(allowed) > 1:
                    allowed = allowed[:1]
                if len(allowed) < len(options):
                    merged = self._merge(reqs, pool.base_keys, (Req.of(g.key, "In", allowed),))
                    if merged is None:
                        return None
                    reqs = merged
        if self._inv_terms:
            for term in self._inverse_terms(eff.labelset):
                if term.topology_key == HOSTNAME:
                    if self._inv_count(probe, term, hostname) > 0:
                        return None
                    continue
                options = sorted(self._pool_domains(pool, reqs, term.topology_key, excluded))
                allowed = [d for d in options if self._inv_count(probe, term, d) == 0]
                if not allowed:
                    return None
                if len(allowed) < len(options):
                    merged = self._merge(reqs, pool.base_keys, (Req.of(term.topology_key, "In", allowed),))
                    if merged is None:
                        return None
                    reqs = merged
        return reqs

    def _claim_commit(self, probe: _Probe, claim: _Claim, eff: _Eff, reqs: Reqs, pod_key: str) -> None:
        claim.reqs = reqs
        claim.used = _add(claim.used, eff.vec)
        claim.pods.append(pod_key)
        claim.ports.extend(eff.ports)

        def domains(key: str) -> frozenset[str]:
            if key == HOSTNAME:
                return frozenset((claim.name,))
            return self._pool_domains(claim.pool, claim.reqs, key, claim.excluded)

        def filter_ok(g: _Group) -> bool:
            return not g.filter_terms or any(
                self._merge(claim.reqs, claim.pool.base_keys, t) is not None for t in g.filter_terms
            )

        self._record(probe, eff, domains, filter_ok)

    def _try_claims(self, probe: _Probe, eff: _Eff, pod_key: str) -> _Claim | None:
        # Like Karpenter: the claims with the fewest pods first. Moved pods never join background
        # claims (in flight, not initialized).
        refused = probe.refused
        for claim in sorted(probe.claims, key=lambda c: len(c.pods)):
            if claim.background != probe.background or (claim.name, id(eff)) in refused:
                continue
            reqs = self._claim_try(
                probe, eff, claim.pool, claim.reqs, claim.used, claim.name, claim.ports, claim.excluded
            )
            if reqs is not None:
                self._claim_commit(probe, claim, eff, reqs, pod_key)
                return claim
            if eff.monotone:
                refused.add((claim.name, id(eff)))
        return None

    def _open_claim(
        self,
        probe: _Probe,
        eff: _Eff,
        pod_key: str,
        max_new_claims: int | None,
        pools: Sequence[_Pool] | None = None,
    ) -> _Claim | None:
        name = f"new-nodeclaim-{len(probe.claims)}"
        for pool in self._pools if pools is None else pools:
            excluded = self._excluded(probe, pool)
            reqs = self._claim_try(probe, eff, pool, pool.base, self._zero, name, [], excluded)
            if reqs is None:
                continue
            if max_new_claims is not None and sum(not c.background for c in probe.claims) >= max_new_claims:
                raise SimulationAborted(f"pod {pod_key} would need more than {max_new_claims} new node(s)")
            claim = _Claim(name, pool, pool.base, self._zero, excluded, probe.background)
            probe.claims.append(claim)
            self._claim_commit(probe, claim, eff, reqs, pod_key)
            # Karpenter reserves the largest option against the pool's limits when it opens a claim.
            remaining = probe.limits.get(pool.pool.name)
            if remaining is not None:
                ts = self._typeset(pool, claim.reqs, excluded)
                fitting = [e.capacity for e in ts.entries if _fits(claim.used, e.alloc)]
                if fitting:
                    biggest = tuple(max(col) for col in zip(*fitting, strict=True))
                    probe.limits[pool.pool.name] = _sub(remaining, biggest)
            return claim
        return None

    def _finalize(self, claim: _Claim) -> NewNodeClaim:
        ts = self._typeset(claim.pool, claim.reqs, claim.excluded)
        entries = [e for e in ts.entries if _fits(claim.used, e.alloc)]
        return NewNodeClaim(
            name=claim.name,
            nodepool=claim.pool.pool.name,
            options=tuple(ClaimOption(e.name, e.price, e.worst_price) for e in entries),
            requirements=claim.reqs,
            capacity_types=tuple(sorted(frozenset().union(*(e.capacity_types for e in entries)))),
            zones=tuple(sorted(frozenset().union(*(e.zones for e in entries)))),
            pods=list(claim.pods),
            requests=self.describe_vec(claim.used),
            background=claim.background,
        )

    # -- explanations ---------------------------------------------------------------------------
    def _explain(self, probe: _Probe, pod: SimPod) -> str:
        """Why a pod found no place. Cheap: it runs once per failed probe, thousands of times per plan."""
        sig = pod.constraints
        eff = self._eff(sig, self._levels(sig) if self.preference_policy == RESPECT else 0)
        if eff.vec is None:
            unknown = sorted(n for n, _ in sig.requests if n not in self._res_index)
            return f"requests {', '.join(unknown)}, which no node or instance type offers"
        want = ", ".join(f"{n}={v}" for n, v in self.describe_vec(eff.vec).items())
        parts = [f"no existing node has room for {want} within its selectors, taints, ports and topology"]
        for pool in self._pools:
            name = pool.pool.name
            if not self._pool_tolerated(pool, eff.tolerations):
                taint = tolerates_all(eff.tolerations, pool.taints)
                parts.append(f"NodePool {name}: does not tolerate taint {taint}")
                continue
            merged = [m for t in eff.terms if (m := self._merge(pool.base, pool.base_keys, t)) is not None]
            if not merged:
                parts.append(f"NodePool {name}: requirements do not overlap the pod's node selector/affinity")
                continue
            excluded = self._excluded(probe, pool)
            if not any(self._typeset(pool, m, excluded).entries for m in merged):
                within = " within limits" if excluded else ""
                parts.append(f"NodePool {name}: no instance type offered{within}")
                continue
            if not any(self._viable(self._typeset(pool, m, excluded), eff.vec, m) for m in merged):
                parts.append(f"NodePool {name}: no instance type has room for {want}")
                continue
            parts.append(f"NodePool {name}: topology or host-port rules cannot be met on a new node")
        if not self._pools:
            parts.append("no NodePool to launch from")
        return "; ".join(parts)


def simulate(
    ctx: PlanContext, candidates: Sequence[Candidate], pods: Sequence[Pod] | None = None
) -> SchedulingResult:
    """planner.model's `Simulate`: remove `candidates` (and `ctx.marked_for_deletion`) from the
    snapshot's cluster and place `pods` (default: the §2.6 set). The prepared cluster is cached per
    snapshot, so repeated calls only pay for the pods that move."""
    from planner.scheduling_adapter import simulate_for

    return simulate_for(ctx, candidates, pods)


__all__ = [
    "IGNORE",
    "RESPECT",
    "ClaimOption",
    "NewNodeClaim",
    "PreferencePolicy",
    "SimulationAborted",
    "SimulationResult",
    "Simulator",
    "simulate",
]
