"""From the planner's `Snapshot` and `Catalog` to the scheduling simulation, and back to model types.

A `SnapshotSimulation` prepares one `Simulator` per (snapshot, catalog, preference policy) and keeps
it for the last few snapshots planned, so every method of a pass (drift, multi- and single-node consolidation)
and every probe share one prepared cluster. Nodes a pass has already decided to remove
(`ctx.marked_for_deletion`) are removed per probe, with their pods moving in the background, so they
do not force a rebuild. Bound pods are reduced to what they contribute (used room, topology labels,
anti-affinity); only the pods that move are converted in full, once each. Given the caller's
`PassCache` (planner/pass_cache.py), a node whose pods did not change since the last pass keeps its
converted pods and what the simulator derived of them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from api import constants as k
from kube.selectors import Taint, Toleration
from planner.candidates import under_consolidate_after
from planner.capacity_buffers import buffer_pods
from planner.model import Replacement, SchedulingResult
from planner.pass_cache import holds, node_pods
from planner.scheduling.inputs import (
    NOTHING,
    UNSCHEDULABLE_TAINT_KEY,
    BoundPod,
    LabelSelector,
    PodAffinityTerm,
    PodConstraints,
    Resources,
    SimDaemonSet,
    SimInstanceType,
    SimNode,
    SimPod,
    SpreadConstraint,
    nodepool_from_api,
)
from planner.scheduling.min_values import (
    MAX_LAUNCH_INSTANCE_TYPES,
    MIN_VALUES_RELAXED_ANNOTATION,
    STRICT,
    MinValuesPolicy,
    truncate,
)
from planner.scheduling.requirements import IN, Req, Reqs, freeze
from planner.scheduling.results import (
    KARPENTER_PACKING,
    RESPECT,
    NewNodeClaim,
    Packing,
    PreferencePolicy,
    SimulationResult,
)
from planner.scheduling.simulator import Simulator
from planner.scheduling.state import LAUNCH_PRECEDENCE

if TYPE_CHECKING:
    from kube import selectors
    from planner.catalog import Catalog, InstanceType
    from planner.model import Candidate, PlanContext
    from planner.pass_cache import PassCache
    from planner.resources import Resources as KubeResources
    from planner.snapshot import Node, Pod, Snapshot

# A term no node satisfies: Kubernetes reads an empty nodeSelectorTerm as "matches nothing".
_NEVER: Reqs = (
    Req("karpflow.io/no-node-matches-an-empty-term", frozenset(), complement=False, allow_absent=False),
)


class _Converter:
    """Memoised conversions: a 100,000-pod snapshot repeats a few hundred distinct values."""

    def __init__(self) -> None:
        self._resources: dict[tuple[int, int, int, int, tuple[tuple[str, int], ...]], Resources] = {}
        self._labels: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}
        self._reqs: dict[tuple[str, str, frozenset[str]], Req] = {}
        self._tolerations: dict[tuple[str | None, str, str | None, str | None], Toleration] = {}
        self._selectors: dict[int, LabelSelector] = {}

    def resources(self, res: KubeResources) -> Resources:
        # Keyed on the plain fields: hashing the Resources object itself costs several times more.
        key = (
            res.cpu,
            res.memory,
            res.pods,
            res.ephemeral_storage,
            tuple(res.extended.items()) if res.extended else (),
        )
        cached = self._resources.get(key)
        if cached is None:
            pairs = [
                ("cpu", res.cpu),
                ("memory", res.memory),
                ("pods", res.pods),
                ("ephemeral-storage", res.ephemeral_storage),
                *res.extended.items(),
            ]
            cached = tuple(sorted((n, v) for n, v in pairs if v))
            self._resources[key] = cached
        return cached

    def req(self, r: selectors.Requirement) -> Req:
        key = (r.key, r.operator, r.values)
        cached = self._reqs.get(key)
        if cached is None:
            name = k.HOSTNAME_LABEL if r.key == "metadata.name" else r.key
            cached = self._reqs[key] = Req.of(name, r.operator, r.values)
        return cached

    def toleration(self, t: selectors.Toleration) -> Toleration:
        key = (t.key, t.operator, t.value, t.effect)
        cached = self._tolerations.get(key)
        if cached is None:
            cached = self._tolerations[key] = Toleration(t.key, t.operator, t.value, t.effect)
        return cached

    def selector(
        self, s: selectors.LabelSelector | None, own: dict[str, str], match_label_keys: Iterable[str] = ()
    ) -> LabelSelector:
        if s is None:
            return NOTHING
        exprs = list(s.match_expressions)
        for key in match_label_keys:  # matchLabelKeys: the pod's own value joins the selector
            if key in own:
                exprs.append((key, IN, frozenset((own[key],))))
        return LabelSelector(
            tuple(sorted(s.match_labels.items())),
            tuple(sorted(exprs, key=lambda e: (e[0], e[1], sorted(e[2])))),
        )

    def affinity_term(
        self, t: selectors.PodAffinityTerm, namespace: str, own: dict[str, str]
    ) -> PodAffinityTerm:
        if t.namespace_selector is not None:
            namespaces = None  # namespace labels are not in the snapshot: read as "any namespace"
        elif t.namespaces:
            namespaces = frozenset(t.namespaces)
        else:
            namespaces = frozenset((namespace,))
        return PodAffinityTerm(
            self.selector(t.label_selector, own, t.match_label_keys), t.topology_key, namespaces
        )

    def taints(self, taints: Iterable[selectors.Taint]) -> tuple[Taint, ...]:
        return tuple(Taint(t.key, t.value, t.effect) for t in taints)

    def constraints(self, pod: Pod) -> PodConstraints:
        own = pod.labels
        selector_reqs = tuple(Req.equals(key, str(v)) for key, v in sorted(pod.node_selector.items()))
        terms: list[Reqs] = []
        for term in pod.node_affinity:
            terms.append(freeze((*selector_reqs, *(self.req(r) for r in term))) if term else _NEVER)
        if not terms and selector_reqs:
            terms.append(freeze(selector_reqs))
        preferred = tuple((w, freeze(self.req(r) for r in term)) for w, term in pod.affinity_preferred_nodes)
        ns = pod.namespace
        affinity = tuple(self.affinity_term(t, ns, own) for t in pod.pod_affinity if not t.weight)
        anti = tuple(self.affinity_term(t, ns, own) for t in pod.pod_anti_affinity if not t.weight)
        pref_affinity = tuple(
            (t.weight, self.affinity_term(t, ns, own)) for t in pod.pod_affinity if t.weight
        )
        pref_anti = tuple(
            (t.weight, self.affinity_term(t, ns, own)) for t in pod.pod_anti_affinity if t.weight
        )
        spreads = tuple(
            SpreadConstraint(
                s.max_skew,
                s.topology_key,
                s.required,
                self.selector(s.label_selector, own, s.match_label_keys),
                int(s.min_domains) if s.min_domains is not None else None,
            )
            for s in pod.topology_spread
        )
        return PodConstraints(
            namespace=ns,
            labels=tuple(sorted(own.items())),
            requests=self.resources(pod.requests),
            node_terms=tuple(terms),
            preferred_node_terms=preferred,
            tolerations=tuple(self.toleration(t) for t in pod.tolerations),
            host_ports=tuple(sorted(pod.host_ports)),
            affinity=affinity,
            anti_affinity=anti,
            preferred_affinity=pref_affinity,
            preferred_anti_affinity=pref_anti,
            spreads=spreads,
        )

    def bound(self, pod: Pod) -> BoundPod:
        anti: tuple[PodAffinityTerm, ...] = ()
        if pod.pod_anti_affinity:
            anti = tuple(
                self.affinity_term(t, pod.namespace, pod.labels)
                for t in pod.pod_anti_affinity
                if not t.weight
            )
        labels: tuple[tuple[str, str], ...] = ()
        if pod.labels:
            raw = tuple(pod.labels.items())
            known = self._labels.get(raw)
            if known is None:
                known = self._labels[raw] = tuple(sorted(raw))
            labels = known
        return BoundPod(
            node_name=pod.node_name or "",
            namespace=pod.namespace,
            labels=labels,
            requests=self.resources(pod.requests),
            host_ports=pod.host_ports,
            anti_affinity=anti,
            terminating=pod.deletion_timestamp is not None,
        )


def sim_node(node: Node, conv: _Converter) -> SimNode:
    labels = dict(node.labels)
    labels.setdefault(k.HOSTNAME_LABEL, node.name)
    taints = conv.taints(node.taints)
    if node.unschedulable:
        taints = (*taints, Taint(UNSCHEDULABLE_TAINT_KEY, None, "NoSchedule"))
    managed = node.nodepool is not None
    return SimNode(
        name=node.name,
        labels=labels,
        allocatable=node.allocatable.by_name(),
        capacity=node.capacity.by_name(),
        taints=taints,
        # Unmanaged nodes have no karpenter.sh/initialized label: Ready is the best signal.
        initialized=node.initialized if managed else node.ready,
        managed=managed,
        deleting=node.is_deleting,
    )


def sim_instance_type(it: InstanceType) -> SimInstanceType:
    return SimInstanceType(
        name=it.name,
        labels=dict(it.labels),
        capacity=it.capacity_resources.by_name(),
        allocatable=it.allocatable_resources.by_name(),
        offerings=it.offerings,
    )


def pool_instance_types(catalog: Catalog) -> dict[str, list[SimInstanceType]]:
    """The instance types of each NodePool whose NodeOverlays changed some (planner/node_overlay.py);
    each InstanceType is converted once, whichever pools share it."""
    if not catalog.pool_views:
        return {}
    shared: dict[int, SimInstanceType] = {}  # by the identity of the catalog's InstanceType
    out: dict[str, list[SimInstanceType]] = {}
    for pool, view in catalog.pool_views.items():
        converted = []
        for it in view:
            known = shared.get(id(it))
            if known is None:
                known = shared[id(it)] = sim_instance_type(it)
            converted.append(known)
        out[pool] = converted
    return out


# The last snapshot's bound pods, by the identity of their Pod: the snapshot builder (planner/
# snapshot_builder.py) hands the next pass the same Pod objects for every pod that did not change, so
# each is converted once. Only pods without anti-affinity: their terms are compared by identity.
_BOUND: dict[int, tuple[Pod, BoundPod]] = {}


def _bound_pods(snapshot: Snapshot, conv: _Converter) -> list[BoundPod]:
    global _BOUND
    previous, kept = _BOUND, {}
    out = []
    for pod in snapshot.pods:
        if not pod.node_name or pod.is_terminal or pod.node_name not in snapshot.nodes:
            continue
        known = previous.get(id(pod))
        bound = known[1] if known is not None and known[0] is pod else conv.bound(pod)
        if not bound.anti_affinity:
            kept[id(pod)] = (pod, bound)
        out.append(bound)
    _BOUND = kept  # replaced whole: another thread's simulation only loses hits
    return out


def _bound_by_node(snapshot: Snapshot, conv: _Converter, cache: PassCache) -> dict[str, tuple[BoundPod, ...]]:
    """Each node's bound (non-terminal) pods, in the snapshot's order, as `_bound_pods` gives them.
    A node whose pods are the same Pod objects as in the cache's last pass gets the same tuple back,
    so the simulator reuses what it derived of it (`Simulator(node_memo=...)`). Nodes with
    anti-affinity pods are converted each time: their terms are compared by identity."""
    previous = cache.bound
    kept: dict[str, tuple[tuple[Pod, ...], tuple[BoundPod, ...], Sequence[Pod] | None]] = {}
    out: dict[str, tuple[BoundPod, ...]] = {}
    for name, node in snapshot.nodes.items():
        pods = node.pods
        known = previous.get(name)
        if known is not None and holds(node, known[0], known[2]):
            bound = known[1]
            kept[name] = (known[0], bound, node.pods_source)
        else:
            bound = tuple(conv.bound(p) for p in pods if not p.is_terminal)
            if any(b.anti_affinity for b in bound):
                out[name] = bound
                continue
            kept[name] = (tuple(pods), bound, node.pods_source)
        out[name] = bound
    cache.bound = kept  # replaced whole: another thread's simulation only loses hits
    return out


class SnapshotSimulation:
    """The scheduling simulation prepared for one snapshot and catalog."""

    def __init__(
        self,
        snapshot: Snapshot,
        catalog: Catalog,
        preference_policy: PreferencePolicy = RESPECT,
        extra_nodes: Sequence[SimNode] = (),
        cache: PassCache | None = None,
        min_values_policy: MinValuesPolicy = STRICT,
    ) -> None:
        """`extra_nodes`: nodes that are not in the snapshot but should be, e.g. the new nodes a plan
        means to launch, shown as if they had joined (planner/optimal/ verifies its target this way).
        `cache`: per-node work kept from the caller's previous pass (planner/pass_cache.py)."""
        self.snapshot = snapshot
        self.catalog = catalog
        self.deleting = frozenset(n for n, node in snapshot.nodes.items() if node.is_deleting)
        self._conv = _Converter()
        nodes = [sim_node(n, self._conv) for n in snapshot.nodes.values()]
        nodes.extend(self._in_flight(snapshot, catalog))
        nodes.extend(extra_nodes)
        by_node = _bound_by_node(snapshot, self._conv, cache) if cache is not None else None
        bound = _bound_pods(snapshot, self._conv) if by_node is None else ()
        daemonsets = [
            SimDaemonSet(ds.name, ds.namespace, self._conv.constraints(ds.pod)) for ds in snapshot.daemonsets
        ]
        self.simulator = Simulator(
            nodes,
            bound,
            # A pool whose EC2NodeClass is missing or not Ready launches nothing; nor does a static
            # pool: Karpenter's scheduler leaves them out (provisioner.go NewScheduler, IsStatic).
            [
                nodepool_from_api(p)
                for p in snapshot.nodepools.values()
                if snapshot.nodeclass_problem(p) is None and not p.spec.is_static
            ],
            [sim_instance_type(it) for it in catalog],
            daemonsets,
            pool_instance_types=pool_instance_types(catalog),
            preference_policy=preference_policy,
            min_values_policy=min_values_policy,
            bound_by_node=by_node,
            node_memo=cache.sim_nodes if cache is not None else None,
            settling=settling_nodes(snapshot, cache),
        )
        if cache is not None:
            cache.sim_nodes = self.simulator.node_memo_out
        if snapshot.capacity_buffers:
            self.simulator.buffer_keys = frozenset(p.key for p in buffer_pods(snapshot)[0])
        self._sim_pods: dict[int, SimPod] = {}
        self._register_topology(snapshot)
        self._pending: list[Pod] | None = None
        self._leaving: dict[str, list[Pod]] = {}
        self._leaving_key_lists: dict[str, list[str]] = {}
        # Background sets by the nodes leaving, and SimPod lists by the identity of the Pod list they
        # convert: a pass simulates the same background for many candidates, and the simulator keys
        # its prepared background placements by list identity too (Simulator._background_info).
        self._backgrounds: dict[frozenset[str], list[Pod]] = {}
        self._sim_lists: dict[int, tuple[Sequence[Pod], list[SimPod]]] = {}
        self._sim_parts: dict[int, tuple[list[Pod], list[SimPod]]] = {}
        self._interned: dict[PodConstraints, PodConstraints] = {}

    @staticmethod
    def _in_flight(snapshot: Snapshot, catalog: Catalog) -> list[SimNode]:
        """NodeClaims launched but without a Node yet: uninitialized capacity (Karpenter's cluster
        state holds them too), where pods of deleting nodes may land and which counts toward limits."""
        linked = {n.nodeclaim.name for n in snapshot.nodes.values() if n.nodeclaim is not None}
        out = []
        for claim in snapshot.nodeclaims.values():
            if claim.name in linked or claim.name in snapshot.nodes or claim.deletion_timestamp is not None:
                continue
            it = catalog.for_pool(claim.nodepool).get(claim.labels.get(k.INSTANCE_TYPE_LABEL))
            if it is None or claim.nodepool is None:
                continue
            out.append(
                SimNode(
                    name=claim.name,
                    labels={**claim.labels, k.HOSTNAME_LABEL: claim.name},
                    allocatable=it.allocatable_resources.by_name(),
                    capacity=it.capacity_resources.by_name(),
                    initialized=False,
                    managed=True,
                )
            )
        return out

    def _register_topology(self, snapshot: Snapshot) -> None:
        """Create the topology groups of every workload with spread or pod (anti-)affinity rules now,
        so no probe meets a new group (which would invalidate the shared background placement).
        Replicas share a spec: one pod per (namespace, owner, labels) is enough."""
        seen: set[tuple[str, str | None, str | None, tuple[tuple[str, str], ...]]] = set()
        signatures = []
        for pod in snapshot.pods:
            if not (pod.topology_spread or pod.pod_affinity or pod.pod_anti_affinity) or pod.is_terminal:
                continue
            key = (pod.namespace, pod.owner_kind, pod.owner_name, tuple(sorted(pod.labels.items())))
            if key in seen:
                continue
            seen.add(key)
            signatures.append(self._conv.constraints(pod))
        self.simulator.register(signatures)

    # -- pods ---------------------------------------------------------------------------------
    def sim_pod(self, pod: Pod) -> SimPod:
        cached = self._sim_pods.get(id(pod))
        if cached is None:
            constraints = self._conv.constraints(pod)
            constraints = self._interned.setdefault(constraints, constraints)
            cached = SimPod(pod.name, pod.namespace, constraints, pod.node_name)
            self._sim_pods[id(pod)] = cached
        return cached

    def _sim_part(self, pods: list[Pod]) -> list[SimPod]:
        """`pods` (a list this simulation keeps) as SimPods, the same list object each time."""
        known = self._sim_parts.get(id(pods))
        if known is None or known[0] is not pods:
            known = self._sim_parts[id(pods)] = (pods, [self.sim_pod(p) for p in pods])
        return known[1]

    def _sim_list(self, pods: Sequence[Pod]) -> list[SimPod]:
        """`pods` as SimPods; the same list object again gives the same SimPod list (shared: callers
        must not change it)."""
        known = self._sim_lists.get(id(pods))
        if known is not None and known[0] is pods:
            return known[1]
        converted = [self.sim_pod(p) for p in pods]
        self._sim_lists[id(pods)] = (pods, converted)  # holds `pods`, so its id is not reused
        return converted

    def moving_pods(self, nodes: Iterable[Node]) -> list[Pod]:
        """§2.6: reschedulable pods that will actually be evicted (not do-not-disrupt, not under a
        fully blocking PDB: no capacity is bought for pods that will never move)."""
        now = self.snapshot.now
        out = []
        for node in nodes:
            for pod in node.pods:
                if not pod.is_reschedulable or pod.do_not_disrupt_reason(now):
                    continue
                if any(pdb.blocks_all_evictions for pdb in self.snapshot.pdbs_for(pod)):
                    continue
                out.append(pod)
        return out

    def pending_pods(self) -> list[Pod]:
        """Pending pods the provisioner would place (DaemonSet and mirror pods target fixed nodes),
        and the pods of ready CapacityBuffers, which Karpenter's provisioner adds to them
        (planner/capacity_buffers.py)."""
        if self._pending is None:
            self._pending = [p for p in self.snapshot.pending_pods if not p.is_daemonset and not p.is_mirror]
            if self.snapshot.capacity_buffers:
                self._pending.extend(buffer_pods(self.snapshot)[0])
        return self._pending

    def leaving_pods(self, node_names: Iterable[str]) -> list[Pod]:
        """Reschedulable pods of nodes going away anyway (being deleted, or marked by this pass)."""
        out = []
        for name in sorted(node_names):
            out.extend(self._leaving_of(name))
        return out

    def _leaving_of(self, name: str) -> list[Pod]:
        pods = self._leaving.get(name)
        if pods is None:
            node = self.snapshot.nodes.get(name)
            pods = [p for p in node.pods if p.is_reschedulable] if node is not None else []
            self._leaving[name] = pods
        return pods

    def _leaving_keys(self, node_names: Iterable[str]) -> list[str]:
        """The keys of `leaving_pods(node_names)`, in its order. A pass runs a simulation for each
        node it marks, with every node marked before it gone: each node's keys are read once."""
        out: list[str] = []
        for name in sorted(node_names):
            keys = self._leaving_key_lists.get(name)
            if keys is None:
                keys = self._leaving_key_lists[name] = [p.key for p in self._leaving_of(name)]
            out.extend(keys)
        return out

    def pods_of(self, node_names: Sequence[str]) -> list[Pod]:
        """The pods that move when these nodes go."""
        return self.moving_pods([self.snapshot.nodes[n] for n in node_names if n in self.snapshot.nodes])

    def background_pods(self, node_names: Sequence[str] = (), gone: Iterable[str] = ()) -> list[Pod]:
        """Pods that need a place whatever the decision (§2.6): the pending ones, and those of nodes
        already being deleted or in `gone` (removed by an earlier decision of this pass)."""
        leaving = (self.deleting | frozenset(gone)) - frozenset(node_names)
        pods = self._backgrounds.get(leaving)
        if pods is None:
            pods = self._backgrounds[leaving] = [*self.pending_pods(), *self.leaving_pods(leaving)]
            # Its SimPods, built from parts the simulator has seen before (the pending pods, each
            # leaving node's pods), so a pass that marks one more node pays for that node alone.
            parts = [
                self._sim_part(self.pending_pods()),
                *(self._sim_part(self._leaving[n]) for n in sorted(leaving)),
            ]
            self._sim_lists[id(pods)] = (pods, self.simulator.background_of(parts))
        return pods  # shared: callers must not change it

    def default_pods(self, node_names: Sequence[str], gone: Iterable[str] = ()) -> list[Pod]:
        return [*self.pods_of(node_names), *self.background_pods(node_names, gone)]

    # -- running ------------------------------------------------------------------------------
    def run(
        self,
        node_names: Sequence[str],
        pods: Sequence[Pod] | None = None,
        *,
        background: Sequence[Pod] | None = None,
        gone: Iterable[str] = (),
        max_new_claims: int | None = None,
        stop_on_failure: bool = False,
        packing: Packing = KARPENTER_PACKING,
        prefer: Mapping[str, str] | None = None,
        consolidation: bool = False,
        closed: Iterable[str] = (),
        claims_per_node: bool = False,
    ) -> SimulationResult:
        """Simulate removing `node_names` (and the `gone` nodes). Defaults: their moving pods, with
        the pending pods and those of nodes going away anyway in the background (§2.6). `prefer`:
        planned destinations of moved pods (pod key -> node), honoured where the rules allow.
        `consolidation`: Karpenter's consolidation simulation (v1.14), whose moved pods never land on
        a node inside its NodePool's consolidateAfter window (`settling_nodes`).
        `closed`: nodes that keep their pods but take no pod (a batch's later members).
        `claims_per_node`: each removed node's pods get new NodeClaims of their own (`Simulator.simulate`)."""
        gone = frozenset(gone) - frozenset(node_names)
        moving = self.pods_of(node_names) if pods is None else pods
        extra = self.background_pods(node_names, gone) if background is None else background
        return self.simulator.simulate(
            node_names,
            [self.sim_pod(p) for p in moving],
            background=self._sim_list(extra),
            gone=gone,
            from_deleting=self._leaving_keys(gone),
            max_new_claims=max_new_claims,
            stop_on_failure=stop_on_failure,
            packing=packing,
            prefer=prefer,
            avoid_settling=consolidation,
            closed=frozenset(closed),
            claims_per_node=claims_per_node,
        )

    def replacement(
        self,
        claim: NewNodeClaim,
        pods: Sequence[Pod] = (),
        options: Sequence[str] | None = None,
        capacity_type: str | None = None,
    ) -> Replacement:
        """A model Replacement for a new NodeClaim: its launch options in price order, at most the 60
        Karpenter's AWS provider sends to CreateFleet (check `launch_refusal` first under Strict), and
        Karpenter's minValues-relaxed annotation when its NodePool sets minValues."""
        names = list(options) if options is not None else list(claim.instance_types)
        by_key = {p.key: p for p in pods}
        ct = capacity_type or launch_capacity_type(claim.capacity_types)
        types = self.catalog.for_pool(claim.nodepool).types  # the prices its pool sees
        replacement = Replacement(
            nodepool=claim.nodepool,
            instance_types=[types[n] for n in names if n in types][:MAX_LAUNCH_INSTANCE_TYPES],
            capacity_type=ct,
            zones=list(claim.zones),
            pods=[by_key[key] for key in claim.pods if key in by_key],
        )
        if claim.has_min_values:
            replacement.annotations[MIN_VALUES_RELAXED_ANNOTATION] = str(claim.min_values_relaxed).lower()
            replacement.min_values = {
                r.key: r.min_values for r in claim.requirements if r.min_values is not None
            }
        return replacement

    def launch_refusal(self, claim: NewNodeClaim, options: Sequence[str] | None = None) -> str | None:
        """Why this new node cannot launch: under MinValuesPolicy Strict, the 60 cheapest of its
        options (what the launch sends, Karpenter's AWS provider `Truncate`) miss a minValues. None
        when it can."""
        if not claim.has_min_values:
            return None
        names = list(options) if options is not None else list(claim.instance_types)
        _, why = truncate(
            names,
            claim.requirements,
            MAX_LAUNCH_INSTANCE_TYPES,
            self.simulator.min_values_policy,
            self.simulator.values_of,
        )
        return (
            f"NodePool {claim.nodepool} couldn't meet minValues requirements at launch, {why}"
            if why
            else None
        )

    def scheduling_result(self, result: SimulationResult, pods: Sequence[Pod]) -> SchedulingResult:
        """The model's SchedulingResult: background claims (capacity the provisioner launches for
        pending pods and pods of deleting nodes) are not replacements, so they are left out; a new
        node that could not launch (`launch_refusal`) leaves its pods unschedulable."""
        claim_names = {c.name for c in result.new_claims}
        unschedulable = dict(result.unschedulable)
        if result.aborted:
            unschedulable.setdefault("<simulation>", result.aborted)
        new_nodes, owners = [], []
        for claim in result.replacements:
            why = self.launch_refusal(claim)
            if why is None:
                new_nodes.append(self.replacement(claim, pods))
                owners.append(claim.group)
                continue
            for key in claim.pods:
                unschedulable[key] = why
        return SchedulingResult(
            placements={key: node for key, node in result.placements.items() if node not in claim_names},
            new_nodes=new_nodes,
            unschedulable=unschedulable,
            pending=result.pending,
            new_node_owners=owners if any(o is not None for o in owners) else [],
        )


def settling_nodes(snapshot: Snapshot, cache: PassCache | None = None) -> list[str]:
    """The nodes inside their NodePool's consolidateAfter window now (planner/candidates.py
    `under_consolidate_after`): a consolidation moves no pod onto them."""
    # Only pools with a window (consolidateAfter neither 0, Karpenter's default, nor Never) cost a look.
    windowed = {
        name: pool
        for name, pool in snapshot.nodepools.items()
        if (after := pool.spec.disruption.consolidate_after_delta) is not None and after.total_seconds() > 0
    }
    out: list[str] = []
    if not windowed:
        return out
    for name, node in snapshot.nodes.items():
        pool = windowed.get(node.nodepool or "")
        if pool is not None and under_consolidate_after(node, pool, snapshot.now, node_pods(cache, node)):
            out.append(name)
    return out


def launch_capacity_type(capacity_types: Iterable[str]) -> str:
    """The capacity type a launch allowing these would use (reserved, then spot, then on-demand)."""
    allowed = set(capacity_types)
    for ct in LAUNCH_PRECEDENCE:
        if ct in allowed:
            return ct
    return next(iter(sorted(allowed)), k.CAPACITY_ON_DEMAND)


# The prepared simulations of the last few snapshots, by identity (a pass and a validation may run
# at once, each on its own). Not a WeakKeyDictionary: a simulation holds its snapshot, so an entry
# there kept its key alive and every snapshot ever planned stayed in memory (35 MB a pass at 5,000
# nodes). Bounded instead: an older snapshot's simulation is prepared again if it is ever asked for.
RECENT_SNAPSHOTS = 3
# Per snapshot: its simulations by (id of the catalog, preference policy, MinValuesPolicy).
_SimulationKey = tuple[int, PreferencePolicy, MinValuesPolicy]
_CACHE: OrderedDict[int, tuple[Snapshot, dict[_SimulationKey, SnapshotSimulation]]] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _simulations_of(snapshot: Snapshot) -> dict[_SimulationKey, SnapshotSimulation]:
    with _CACHE_LOCK:
        entry = _CACHE.get(id(snapshot))
        if entry is None or entry[0] is not snapshot:
            entry = _CACHE[id(snapshot)] = (snapshot, {})
            while len(_CACHE) > RECENT_SNAPSHOTS:
                _CACHE.popitem(last=False)
        else:
            _CACHE.move_to_end(id(snapshot))
        return entry[1]


def snapshot_simulation(ctx: PlanContext) -> SnapshotSimulation:
    """The prepared simulation for this context's snapshot (built once, then reused)."""
    key = (id(ctx.catalog), ctx.options.preference_policy, ctx.options.min_values_policy)
    per_snapshot = _simulations_of(ctx.snapshot)
    prepared = per_snapshot.get(key)
    if prepared is None or prepared.catalog is not ctx.catalog:
        prepared = SnapshotSimulation(
            ctx.snapshot,
            ctx.catalog,
            ctx.options.preference_policy,
            cache=ctx.cache,
            min_values_policy=ctx.options.min_values_policy,
        )
        per_snapshot[key] = prepared
    return prepared


def simulate(
    ctx: PlanContext, candidates: Sequence[Candidate], pods: Sequence[Pod] | None = None
) -> SchedulingResult:
    """planner.model's `Simulate`: remove `candidates` (and `ctx.marked_for_deletion`) from the
    snapshot's cluster and place `pods` (default: the §2.6 set). The prepared cluster is cached per
    snapshot, so repeated calls only pay for the pods that move. `ctx.closed_nodes` keep their pods
    and take none; under `ctx.claims_per_node` each candidate's pods get new nodes of their own."""
    prepared = snapshot_simulation(ctx)
    names = [c.name for c in candidates]
    gone = ctx.marked_for_deletion
    if pods is None:
        moving, background = prepared.pods_of(names), prepared.background_pods(names, gone)
    else:
        moving, background = list(pods), []
    result = prepared.run(
        names,
        moving,
        background=background,
        gone=gone,
        closed=ctx.closed_nodes,
        claims_per_node=ctx.claims_per_node,
    )
    return prepared.scheduling_result(result, [*moving, *background])
