"""`Simulator`: a prepared cluster and its probe loop. How placement works, and where it differs
from Karpenter's scheduler, is told in planner/scheduling/__init__.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain

from kube.selectors import Taint, first_untolerated
from planner.scheduling.existing_nodes import ExistingNodes
from planner.scheduling.inputs import (
    CORE_RESOURCES,
    NODES_RESOURCE,
    BoundPod,
    HostPort,
    PodAffinityTerm,
    PodConstraints,
    Resources,
    SimDaemonSet,
    SimInstanceType,
    SimNode,
    SimNodePool,
    SimPod,
)
from planner.scheduling.min_values import (
    BEST_EFFORT,
    MAX_SCHEDULING_INSTANCE_TYPES,
    STRICT,
    MinValuesPolicy,
    describe_shortfall,
)
from planner.scheduling.new_nodes import NewNodes
from planner.scheduling.nodepools import NodePoolTypes
from planner.scheduling.requirements import Reqs
from planner.scheduling.results import (
    COST_PACKING,
    IGNORE,
    KARPENTER_PACKING,
    RESPECT,
    Packing,
    PreferencePolicy,
    SimulationAborted,
    SimulationResult,
)
from planner.scheduling.state import (
    BASE_WELL_KNOWN,
    HOSTNAME,
    Effective,
    LabelSet,
    PreparedNode,
    PreparedPool,
    Probe,
    ProbeBase,
    TypeEntry,
    Vec,
    vec_add,
    vec_sub,
)
from planner.scheduling.topology import Topology

# One node's bound pods as the simulator counts them (Simulator._node_load): used room, host ports,
# ((namespace, labels), count) and (anti-affinity term, count) pairs.
_NodeLoad = tuple[
    Vec,
    tuple[HostPort, ...],
    tuple[tuple[LabelSet, int], ...],
    tuple[tuple[PodAffinityTerm, int], ...],
]
# `_vec`'s cache miss (the cache holds None for requests that name a resource nothing offers).
_NOT_CACHED: Vec = (-1,)
# What a simulator derived of one node (its `node_memo_out`): the node's bound pods (the sequence
# object, compared by identity), the resource names of the vectors, and the load.
NodeMemo = tuple[Sequence[BoundPod], tuple[str, ...], _NodeLoad]


class Simulator(Topology, NodePoolTypes, ExistingNodes, NewNodes):
    """A prepared cluster that answers "where would these pods go without these nodes?"."""

    def __init__(
        self,
        nodes: Sequence[SimNode],
        bound: Iterable[BoundPod],
        nodepools: Sequence[SimNodePool],
        instance_types: Sequence[SimInstanceType],
        daemonsets: Sequence[SimDaemonSet] = (),
        *,
        pool_instance_types: Mapping[str, Sequence[SimInstanceType]] | None = None,
        preference_policy: PreferencePolicy = RESPECT,
        min_values_policy: MinValuesPolicy = STRICT,
        bound_by_node: Mapping[str, Sequence[BoundPod]] | None = None,
        node_memo: Mapping[str, NodeMemo] | None = None,
        settling: Collection[str] = (),
    ) -> None:
        """`bound_by_node`: the bound pods already grouped by node name (then `bound` is not read).
        `node_memo`: what an earlier simulator derived per node (its `node_memo_out`), reused for a
        node whose bound pods are the very same sequence object (planner/pass_cache.py).
        `settling`: nodes inside their NodePool's consolidateAfter window, which a consolidation's
        moved pods avoid (`simulate(avoid_settling=True)`). `pool_instance_types`: a NodePool's own
        instance types, where NodeOverlays changed their prices or capacity (planner/node_overlay.py);
        the others launch `instance_types`."""
        if preference_policy not in (RESPECT, IGNORE):
            raise ValueError(f"preference_policy {preference_policy!r}: expected Respect or Ignore")
        self.preference_policy = preference_policy
        # Keys of CapacityBuffer pods among the background (pending) pods (planner/capacity_buffers.py).
        self.buffer_keys: frozenset[str] = frozenset()
        if min_values_policy not in (STRICT, BEST_EFFORT):
            raise ValueError(f"min_values_policy {min_values_policy!r}: expected Strict or BestEffort")
        self.min_values_policy = min_values_policy
        # Memo tables: keyed by values (signatures, requirement sets), valid for the simulator's life.
        self._eff_cache = {}
        self._levels_cache = {}
        self._fitlists = {}
        self._merge_cache = {}
        self._typeset_cache = {}
        self._tolerates_pool = {}
        self._domains_cache = {}
        self._compat_cache = {}
        self._bases: dict[tuple[frozenset[str], tuple[str, ...], frozenset[str]], ProbeBase] = {}
        self._backgrounds: dict[int, _Background] = {}
        self._parts: dict[int, _Background] = {}
        self._fair_cache = {}
        pods_by_node: Mapping[str, Sequence[BoundPod]]
        if bound_by_node is None:
            grouped: dict[str, list[BoundPod]] = {}
            for pod in bound:
                grouped.setdefault(pod.node_name, []).append(pod)
            pods_by_node = grouped
        else:
            pods_by_node = bound_by_node

        names = set(CORE_RESOURCES)
        for n in nodes:
            names.update(n.allocatable)
        pool_types = pool_instance_types or {}
        for it in (*instance_types, *(t for types in pool_types.values() for t in types)):
            names.update(it.allocatable)
        # `limits.nodes` (Karpenter v1.11) counts a node as one "nodes" of capacity (state/statenode.go
        # Capacity); the resource exists only when some pool limits it.
        if any(NODES_RESOURCE in p.limits for p in nodepools):
            names.add(NODES_RESOURCE)
        self._res_names = list(CORE_RESOURCES) + sorted(names - set(CORE_RESOURCES))
        self._res_index = {n: i for i, n in enumerate(self._res_names)}
        self._zero = (0,) * len(self._res_names)
        self._vec_cache: dict[Resources, Vec | None] = {}

        self.well_known = set(BASE_WELL_KNOWN)
        for it in instance_types:
            self.well_known.update(it.labels)

        # Existing nodes: every node not being deleted, initialized ones first, then by name.
        self.deleting_nodes = frozenset(n.name for n in nodes if n.deleting)
        live = sorted((n for n in nodes if not n.deleting), key=lambda n: (not n.initialized, n.name))
        self._ref_keys: set[str] = {HOSTNAME}
        self._class_ids: dict[tuple[tuple[str | None, ...], tuple[Taint, ...]], int] = {}
        self._static_ok = {}
        self.nodes = []
        self.node_index = {}
        res_key = tuple(self._res_names)
        self.node_memo_out: dict[str, NodeMemo] = {}
        loads: list[_NodeLoad] = []
        for idx, n in enumerate(live):
            alloc = self._vec_dict(n.allocatable)
            pods = pods_by_node.get(n.name, ())
            known = node_memo.get(n.name) if node_memo is not None else None
            if known is not None and known[0] is pods and known[1] == res_key:
                load: _NodeLoad = known[2]
            else:
                load = self._node_load(pods)
            if node_memo is not None:
                self.node_memo_out[n.name] = (pods, res_key, load)
            loads.append(load)
            used, ports = load[0], load[1]
            self.nodes.append(
                PreparedNode(
                    idx,
                    n.name,
                    n.labels,
                    n.taints,
                    alloc,
                    vec_sub(alloc, used),
                    ports,
                    n.initialized,
                    0,
                    n.nodepool,
                )
            )
            self.node_index[n.name] = idx
        self._node_capacity = {n.name: self._capacity_vec(n.capacity or n.allocatable) for n in live}
        self._settling = frozenset(self.node_index[n] for n in settling if n in self.node_index)
        self._reclassify()

        # Bound pods by (namespace, labels): topology groups count over these, not over 100k pods.
        self._labelsets = {}
        self._inv_terms = {}
        labelsets = self._labelsets
        for prepared, load in zip(self.nodes, loads, strict=True):
            idx = prepared.idx
            for key, count in load[2]:
                per_node = labelsets.get(key)
                if per_node is None:
                    per_node = labelsets[key] = {}
                per_node[idx] = per_node.get(idx, 0) + count
            for term, count in load[3]:
                self._inv_terms.setdefault(term, Counter())[idx] += count
        self._inv_base = {}
        self._inv_version = 0
        self._inv_cache = {}
        self._inv_by_label = {}
        self._inv_scan = []
        for term in self._inv_terms:
            self._index_inverse(term)
        self._groups = []
        self._group_ids = {}
        self._selecting_cache = {}
        # Indexes so that thousands of workloads with topology rules stay cheap: label sets by label,
        # groups by their first matchLabels pair (groups without matchLabels are always checked).
        self._labelset_index = {}
        for ns_labels in self._labelsets:
            for pair in ns_labels[1]:
                self._labelset_index.setdefault(pair, []).append(ns_labels)
        self._groups_by_label = {}
        self._groups_scan = []
        self._universes = {}

        self.instance_types = {it.name: it for it in instance_types}
        self._pool_types = {name: {it.name: it for it in types} for name, types in pool_types.items()}
        self._pools = []
        for pool in sorted(nodepools, key=lambda p: (-p.weight, p.name)):
            self._pools.append(
                self._prepare_pool(pool, pool_types.get(pool.name, instance_types), daemonsets)
            )
        self._pool_by_name = {p.pool.name: p for p in self._pools}
        self._pool_nodes_capacity = {}
        for prepared in self.nodes:
            if prepared.nodepool is not None and prepared.nodepool in self._pool_by_name:
                cap = self._node_capacity[prepared.name]
                self._pool_nodes_capacity[prepared.nodepool] = vec_add(
                    self._pool_nodes_capacity.get(prepared.nodepool, self._zero), cap
                )

    def pool_instance_type(self, pool: str, name: str) -> SimInstanceType:
        """The instance type as `pool` launches it: its NodeOverlays' prices and capacity applied
        (planner/node_overlay.py), else the catalog's."""
        own = self._pool_types.get(pool)
        return own[name] if own is not None and name in own else self.instance_types[name]

    def _node_load(self, pods: Sequence[BoundPod]) -> _NodeLoad:
        """What a node's bound pods take: used room, host ports, and for topology (terminating pods
        do not count) their (namespace, labels) and anti-affinity terms with counts, in the order
        they first appear."""
        ports: list[HostPort] = []
        # Replicas share requests: sum per distinct request, then scale.
        per_request: dict[Resources, int] = {}
        labelsets: dict[LabelSet, int] = {}
        terms: dict[PodAffinityTerm, int] = {}
        for p in pods:
            per_request[p.requests] = per_request.get(p.requests, 0) + 1
            if p.host_ports:
                ports.extend(p.host_ports)
            if p.terminating:
                continue
            key = (p.namespace, p.labels)
            labelsets[key] = labelsets.get(key, 0) + 1
            for term in p.anti_affinity:
                terms[term] = terms.get(term, 0) + 1
        used_list = [0] * len(self._zero)
        for requests, count in per_request.items():
            for i, value in enumerate(self._vec(requests) or self._zero):
                if value:
                    used_list[i] += value * count
        return tuple(used_list), tuple(ports), tuple(labelsets.items()), tuple(terms.items())

    def _vec(self, resources: Resources) -> Vec | None:
        cached = self._vec_cache.get(resources, _NOT_CACHED)
        if cached is not _NOT_CACHED:
            return cached
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

    def _capacity_vec(self, resources: dict[str, int]) -> Vec:
        """A node's or an instance type's capacity, counting itself as one node when `nodes` is limited."""
        vec = self._vec_dict(resources)
        i = self._res_index.get(NODES_RESOURCE)
        if i is None:
            return vec
        return (*vec[:i], 1, *vec[i + 1 :])

    def describe_vec(self, vec: Vec) -> dict[str, int]:
        return {n: v for n, v in zip(self._res_names, vec, strict=True) if v}

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
        prefer: Mapping[str, str] | None = None,
        avoid_settling: bool = False,
        closed: Collection[str] = (),
        claims_per_node: bool = False,
    ) -> SimulationResult:
        """Place `pods` on the cluster without the `remove` and `gone` nodes, opening new NodeClaims
        as needed.

        `avoid_settling` (a consolidation's simulation, Karpenter v1.14 `IsConsolidationSimulation`):
        `pods` never land on an existing node inside its NodePool's consolidateAfter window (the
        `settling` nodes), unless the pod is pending or its node is being deleted; new NodeClaims are
        not held back. Background pods are never held back either (Karpenter's scheduler.go
        `addToExistingNode`).
        `closed` nodes keep their pods but take none (background pods included): nodes the caller
        will remove later in the same decision, e.g. the rest of a pass's batch of drift commands
        (planner/drift_batch.py), so no pod is planned onto a node that is about to go too.

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
        - "cost" (for callers that may launch several nodes, planner.scheduling.packing): every pod
          first tries the existing nodes; the rest fill one new node at a time, each sized for the
          instance type that hosts its pods at the lowest price per share. Pods it cannot pack fall
          back to the "karpenter" way.

        `claims_per_node` keeps the new NodeClaims of each removed node apart: a moved pod joins only
        claims opened for pods of its own node (`NewNodeClaim.group`, the node's name), as if each
        node were simulated on its own after the others, while room on existing nodes is shared, so
        never counted twice. A batch of forceful commands (planner/forceful_batch.py) simulates all its
        nodes at once this way and hands each command the new nodes of its own pods ("karpenter"
        packing only).

        `prefer` (pod key -> existing node name) is a caller's plan of where moved pods go (planner/
        optimal/ packs a whole fleet at once): such a pod lands on that node when every rule allows it
        there, and is placed the usual way when not. The rules are never bent for a plan.
        """
        if claims_per_node and packing == COST_PACKING:
            raise ValueError("claims_per_node needs the karpenter packing")
        known = self._background_info(background)
        deleting_keys = (
            set(from_deleting)
            | known.deleting
            | {p.key for p in pods if p.node_name is not None and p.node_name in self.deleting_nodes}
        )
        # Topology groups must exist before anything is placed, or pods placed earlier would not be
        # counted in them (Karpenter builds every group up front too). A new group makes the cached
        # background placements stale.
        if self.register({p.constraints for p in pods}) | self._register_background(known):
            self._bases.clear()
        gone_set = frozenset(gone)
        base = self._base(gone_set, known, deleting_keys, frozenset(closed) - gone_set)
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
            # CapacityBuffer pods the removed nodes held move with the moved pods: a replacement must
            # hold them too (Karpenter's consolidation schedules them among its pending pods).
            buffers = [p for p in displaced.values() if p.key in self.buffer_keys] if self.buffer_keys else []
            probe.background = True
            for pod in sorted(displaced.values(), key=self._pod_order):
                if not buffers or pod.key not in self.buffer_keys:
                    self._place(probe, pod, result, deleting_keys, None, stop_on_failure)
            probe.background = False
            if avoid_settling:
                probe.settling = self._settling
            ordered = sorted([*pods, *buffers], key=self._pod_order)
            if packing == COST_PACKING:
                ordered = self._place_cost(
                    probe, ordered, result, deleting_keys, max_new_claims, stop_on_failure
                )
            # A displaced CapacityBuffer pod belongs to the node the background had placed it on.
            owner = base.placements if claims_per_node else None
            for pod in ordered:
                if owner is not None:
                    probe.group = pod.node_name if pod.node_name is not None else owner.get(pod.key)
                self._place(
                    probe,
                    pod,
                    result,
                    deleting_keys,
                    max_new_claims,
                    stop_on_failure,
                    prefer.get(pod.key) if prefer else None,
                )
        except SimulationAborted as stop:
            result.aborted = str(stop)
        result.new_claims = [self._finalize(c) for c in probe.claims]
        self._refuse_short_claims(result)
        return result

    def _refuse_short_claims(self, result: SimulationResult) -> None:
        """Karpenter's Results.TruncateInstanceTypes: under Strict a new NodeClaim whose 600 cheapest
        options miss a minValues is dropped and its pods fail ("NodePool couldn't meet minValues")."""
        kept = []
        for claim in result.new_claims:
            why = (
                self.truncation_refusal(claim, MAX_SCHEDULING_INSTANCE_TYPES)
                if claim.has_min_values
                else None
            )
            if why is None:
                kept.append(claim)
                continue
            for key in claim.pods:
                result.placements.pop(key, None)
                result.unschedulable[key] = (
                    f"NodePool {claim.nodepool} couldn't meet minValues requirements, {why}"
                )
        result.new_claims = kept

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

    def background_of(self, parts: Sequence[Sequence[SimPod]]) -> list[SimPod]:
        """The background pods made of `parts`, lists the caller keeps and hands again (a pass's
        pending pods, each leaving node's pods). What simulations derive from the result is combined
        from what each part gave once (C-level joins), instead of walking every pod again each time
        a pass marks one more node gone."""
        infos = [self._part_info(part) for part in parts]
        pods = list(chain.from_iterable(parts))
        known = _Background(
            pods=pods,
            keys=tuple(chain.from_iterable(i.keys for i in infos)),
            key_set=frozenset().union(*(i.key_set for i in infos)),
            pending=frozenset().union(*(i.pending for i in infos)),
            deleting=frozenset().union(*(i.deleting for i in infos)),
            signatures=frozenset().union(*(i.signatures for i in infos)),
        )
        self._remember_background(known)
        return pods

    def _part_info(self, part: Sequence[SimPod]) -> _Background:
        known = self._parts.get(id(part))
        if known is None or known.pods is not part:
            known = self._parts[id(part)] = self._describe(part)  # holds the part: its id is not reused
        return known

    def _describe(self, background: Sequence[SimPod]) -> _Background:
        keys = tuple(p.key for p in background)
        return _Background(
            pods=background,
            keys=keys,
            key_set=frozenset(keys),
            pending=frozenset(p.key for p in background if p.pending),
            deleting=frozenset(p.key for p in background if p.node_name in self.deleting_nodes),
            signatures=frozenset(p.constraints for p in background),
        )

    def _register_background(self, known: _Background) -> bool:
        """`register` for a background's signatures, skipped (in C) when all were seen before."""
        if self._levels_cache.keys() >= known.signatures:
            return False
        return self.register(known.signatures)

    def _remember_background(self, known: _Background) -> None:
        if len(self._backgrounds) >= 64:
            self._backgrounds.pop(next(iter(self._backgrounds)))
        self._backgrounds[id(known.pods)] = known  # holds the list, so its id is not reused

    def _background_info(self, background: Sequence[SimPod]) -> _Background:
        """What every simulation derives from its background pods, once per background list (the
        adapter hands the same list object to every probe of a pass that shares it)."""
        known = self._backgrounds.get(id(background))
        if known is None or known.pods is not background:
            known = self._describe(background)
            self._remember_background(known)
        return known

    def _base(
        self, gone: frozenset[str], known: _Background, deleting_keys: set[str], closed: frozenset[str]
    ) -> ProbeBase:
        background, keys, key_set = known.pods, known.keys, known.key_set
        cached = self._bases.get((gone, keys, closed))
        if cached is not None:
            return cached
        # Within a pass the gone nodes and the background only grow (each method marks more nodes):
        # start from the largest base this one contains and place only what is new. Closed nodes
        # only grow too (a drift batch closes its later members, which go or stay closed): a parent
        # may close fewer, never one this base leaves open (room only shrinks within a probe).
        found = max(
            (
                (c, b)
                for (g, k, c), b in self._bases.items()
                if g <= gone
                and c - gone <= closed
                and (b.keys is key_set or (len(b.keys) <= len(key_set) and b.keys <= key_set))
            ),
            key=lambda cb: (len(cb[1].probe.removed_names), len(cb[1].keys), len(cb[0])),
            default=None,
        )
        if found is None:
            probe = Probe({self.node_index[n] for n in gone if n in self.node_index}, gone)
            self._limits_start(probe)
            self._close(probe, closed)
            result = SimulationResult()
            todo = list(background)
        else:
            parent_closed, parent = found
            probe, displaced = self._fork(parent, gone)
            self._close(probe, closed - parent_closed)
            result = SimulationResult(
                placements={k: v for k, v in parent.placements.items() if k not in displaced},
                unschedulable=dict(parent.unschedulable),
            )
            added = () if parent.keys is key_set else (p for p in background if p.key not in parent.keys)
            todo = [*displaced.values(), *added]
        probe.background = True
        for pod in sorted(todo, key=self._pod_order):
            self._place(probe, pod, result, deleting_keys, None, False)
        probe.background = False
        base = ProbeBase(probe, result.placements, result.unschedulable, known.pending, key_set)
        if len(self._bases) >= 8:
            self._bases.pop(next(iter(self._bases)))
        self._bases[(gone, keys, closed)] = base
        return base

    def _close(self, probe: Probe, closed: frozenset[str]) -> None:
        """No room left on the `closed` nodes for this probe and its forks (their pods stay)."""
        full = (-1,) * len(self._zero)
        for name in closed:
            idx = self.node_index.get(name)
            if idx is not None:
                probe.free[idx] = full

    def _fork(self, base: ProbeBase, remove: frozenset[str]) -> tuple[Probe, dict[str, SimPod]]:
        """A probe starting from `base` with the `remove` nodes gone too; returns the background pods
        those nodes held (they must be placed again)."""
        b = base.probe
        extra = {self.node_index[n] for n in remove if n in self.node_index} - b.removed
        probe = Probe(b.removed | extra, b.removed_names | remove)
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
                probe.limits[node.nodepool] = vec_add(
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
            owners: Mapping[int, int] = self._inv_terms.get(term, {})
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

    def _pod_order(self, pod: SimPod) -> tuple[int, int, str, str]:
        v = self._vec(pod.constraints.requests) or self._zero
        return (-v[0], -v[1], pod.namespace, pod.name)

    def _place(
        self,
        probe: Probe,
        pod: SimPod,
        result: SimulationResult,
        deleting_keys: set[str],
        max_new_claims: int | None,
        stop_on_failure: bool,
        preferred: str | None = None,
    ) -> None:
        sig = pod.constraints
        levels = self._levels(sig) if self.preference_policy == RESPECT else 0
        avoid = self._avoided(probe, pod, deleting_keys)
        for level in range(levels + 1):
            eff = self._eff(sig, level)
            if eff.vec is None:
                break
            dest = self._try_node(probe, eff, preferred, avoid) if preferred is not None else None
            if dest is None:
                dest = self._try_existing(probe, eff, avoid)
            if dest is None and avoid and pod.key not in result.held_off:
                self._note_held_off(probe, eff, pod, result)
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
        self._fail(result, pod, self._explain(probe, pod, avoid), stop_on_failure)

    def _note_held_off(self, probe: Probe, eff: Effective, pod: SimPod, result: SimulationResult) -> None:
        """Record the settling node that would have taken the pod, so a plan can say why it did not."""
        idx = self._try_existing(probe, eff)
        if idx is not None:
            result.held_off[pod.key] = self.nodes[idx].name

    @staticmethod
    def _avoided(probe: Probe, pod: SimPod, deleting_keys: set[str]) -> frozenset[int]:
        """The settling nodes this pod may not land on: none for a pending pod or one whose node is
        being deleted (Karpenter exempts both), none outside a consolidation's simulation."""
        if not probe.settling or pod.pending or pod.key in deleting_keys:
            return frozenset()
        return probe.settling

    def _commit_existing(
        self,
        probe: Probe,
        eff: Effective,
        node: PreparedNode,
        pod: SimPod,
        result: SimulationResult,
        deleting_keys: set[str],
        stop_on_failure: bool,
    ) -> None:
        self._commit_node(probe, eff, node, pod)
        result.placements[pod.key] = node.name
        if not node.initialized and pod.key not in deleting_keys:
            self._fail(result, pod, f"would schedule to uninitialized node {node.name}", stop_on_failure)

    def _fail(self, result: SimulationResult, pod: SimPod, why: str, stop: bool) -> None:
        result.unschedulable[pod.key] = why
        if stop and not pod.pending:
            raise SimulationAborted(f"pod {pod.key} cannot be placed: {why}")

    def _explain(self, probe: Probe, pod: SimPod, avoid: frozenset[int] = frozenset()) -> str:
        """Why a pod found no place. Cheap: it runs once per failed probe, thousands of times per plan."""
        sig = pod.constraints
        eff = self._eff(sig, self._levels(sig) if self.preference_policy == RESPECT else 0)
        if eff.vec is None:
            unknown = sorted(n for n, _ in sig.requests if n not in self._res_index)
            return f"requests {', '.join(unknown)}, which no node or instance type offers"
        want = ", ".join(f"{n}={v}" for n, v in self.describe_vec(eff.vec).items())
        parts = [f"no existing node has room for {want} within its selectors, taints, ports and topology"]
        if avoid and (settled := self._try_existing(probe, eff)) is not None:
            name = self.nodes[settled].name
            parts[0] = (
                f"only node {name} has room for {want}, and it is inside its NodePool's consolidateAfter "
                "window (a consolidation moves no pod onto it)"
            )
        for pool in self._pools:
            name = pool.pool.name
            if not self._pool_tolerated(pool, eff.tolerations):
                taint = first_untolerated(eff.tolerations, pool.taints)
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
            shortfalls = [self._shortfall(self._typeset(pool, m, excluded), eff.vec, m) for m in merged]
            if all(short is None for short in shortfalls):
                parts.append(f"NodePool {name}: no instance type has room for {want}")
                continue
            short_of = next(((m, short) for m, short in zip(merged, shortfalls, strict=True) if short), None)
            if short_of is not None and all(short != {} for short in shortfalls):
                # MinValuesPolicy Strict: the types that fit span too few values (Karpenter's
                # InstanceTypeFilterError with its minValuesIncompatibleErr).
                parts.append(f"NodePool {name}: {describe_shortfall(*short_of)} (MinValuesPolicy Strict)")
                continue
            parts.append(f"NodePool {name}: topology or host-port rules cannot be met on a new node")
        if not self._pools:
            parts.append("no NodePool to launch from")
        return "; ".join(parts)

    # -- for planners that reason about the whole fleet at once (planner/optimal/) ---------------------

    @property
    def resource_names(self) -> list[str]:
        """The order of the entries of every resource vector (`Vec`)."""
        return self._res_names

    def vector(self, resources: Resources) -> Vec | None:
        """Requests as a vector (None when they name a resource no node or instance type offers)."""
        return self._vec(resources)

    def required_view(self, sig: PodConstraints) -> Effective:
        """The signature with every preference relaxed: what any placement of the pod must honour."""
        return self._eff(sig, self._levels(sig) if self.preference_policy == RESPECT else 0)

    def node_admits(self, eff: Effective, node: PreparedNode) -> bool:
        """Taints and node selectors/affinity: whether the pod may ever land on this existing node."""
        return self._static_ok_node(eff, node)

    def pool_requirements(self, pool: PreparedPool, eff: Effective) -> list[Reqs]:
        """The requirement sets a new node of `pool` may have to hold this pod (empty: it may not)."""
        if not self._pool_tolerated(pool, eff.tolerations):
            return []
        return [m for t in eff.terms if (m := self._merge(pool.base, pool.base_keys, t)) is not None]

    def types_under(self, pool: PreparedPool, reqs: Reqs) -> list[TypeEntry]:
        """Instance types `pool` may launch under `reqs` (limits ignored), cheapest first."""
        return self._typeset(pool, reqs, frozenset()).entries


@dataclass(frozen=True, slots=True)
class _Background:
    """A background pod list and what simulations read of it (Simulator._background_info)."""

    pods: Sequence[SimPod]
    keys: tuple[str, ...]
    key_set: frozenset[str]
    pending: frozenset[str]
    deleting: frozenset[str]  # pods whose node is being deleted (they may land on uninitialized nodes)
    signatures: frozenset[PodConstraints]
