"""One scheduling pass's evaluation of a group of identical pending pods (a ReplicaSet's replicas
share one): kube-scheduler's default profile, filters then scores, for the group's next pod.

A real scheduler runs every plugin for every pod over every node. Here what a group's pods share is
worked out once per pass: the node-local filters that do not depend on other pods (NodeUnschedulable,
TaintToleration, NodeAffinity), the raw TaintToleration and NodeAffinity scores, and the starting
counts of spread and inter-pod affinity. What a bind changes is then caught up from the pass's change
log (sim/controllers/scheduling/cache.py) node by node: room, ports, LeastAllocated and
BalancedAllocation of the nodes that changed, and the counts of the topology domains they are in.
Each pod then takes a few array operations over the candidate nodes: the filters' masks, the
normalized scores (which depend on which nodes are feasible, so they are recomputed), the weighted
sum, the first best node. The result is the placement kube-scheduler's formulas give, pod by pod.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from planner.resources import ZERO
from sim.controllers.predicates import (
    REASON_PORTS,
    HostPort,
    insufficient_resources,
    ports_conflict,
    preferred_node_affinity_score,
    resources_fit,
)
from sim.controllers.scheduling import scores
from sim.controllers.scheduling.cache import PodInfo
from sim.controllers.scheduling.context import PassContext
from sim.controllers.scheduling.interpod import InterPodFilter, InterPodScore, incoming
from sim.controllers.scheduling.spread import SpreadFilter, SpreadScore
from sim.controllers.scheduling.terms import (
    DO_NOT_SCHEDULE,
    SCHEDULE_ANYWAY,
    PodTerms,
    TermError,
    default_selector,
    spread_constraints,
    system_default_constraints,
    unroll_namespace_selectors,
)

Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]
_NO_PORTS: Counter[HostPort] = Counter()
NO_NODES = "no nodes available to schedule pods"  # pkg/scheduler/schedule_one.go ErrNoNodesAvailable


class Group:
    def __init__(self, ctx: PassContext, info: PodInfo, pod: Mapping[str, Any]) -> None:
        self.ctx = ctx
        nodes, cache = ctx.nodes, ctx.cache
        spec: Mapping[str, Any] = pod.get("spec") or {}
        meta: Mapping[str, Any] = pod.get("metadata") or {}
        self.namespace, self.labels = info.namespace, info.labels
        self.requests, self.ports = info.requests, info.ports
        self.nonzero = info.nonzero
        self.best_effort = self.requests.cpu == 0 and self.requests.memory == 0
        self.error: str | None = None
        self.allowed, self.static_reasons = ctx.static(spec)
        nodes.sync()
        self.fit = self.allowed & self._fit_all()
        self.local = self._local_all()
        for i in nodes.excluded:
            self.fit[i] = False
        self.taint_raw = ctx.taint_counts(spec)
        self.affinity_raw = self._preferred_node_affinity(spec)
        self.spread_filter: SpreadFilter | None = None
        self.spread_score: SpreadScore | None = None
        self.inter_pod_filter: InterPodFilter | None = None
        self.inter_pod_score: InterPodScore | None = None
        self.terms = PodTerms()
        try:
            self._build_constraints(spec, meta, info)
        except TermError as err:
            self.error = f"parsing pod: {err}"
        self.cursor = len(cache.changes or ())
        self.excluded_seen = len(nodes.excluded)
        # Where the group stood when a pod last fitted nowhere: until something changes, the next
        # one fits nowhere either, for the same reasons.
        self._stuck: tuple[int, int] | None = None
        self._diagnosis: tuple[tuple[int, int], str] | None = None

    # --- building -----------------------------------------------------------------------------------

    def _fit_all(self) -> Bools:
        n, req = self.ctx.nodes, self.requests
        ok: Bools = n.used_pods + 1 <= n.alloc_pods
        if req.cpu > 0:
            ok &= req.cpu <= n.alloc_cpu - n.used_cpu
        if req.memory > 0:
            ok &= req.memory <= n.alloc_mem - n.used_mem
        if req.ephemeral_storage > 0:
            ok &= req.ephemeral_storage <= n.alloc_storage - n.used_storage
        if req.extended or self.ports:
            for i in np.flatnonzero(ok & self.allowed):
                ok[i] = self._fits(int(i))
        return ok

    def _fits(self, i: int) -> bool:
        name = self.ctx.nodes.names[i]
        if not resources_fit(
            self.requests, self.ctx.cache.used.get(name, ZERO), self.ctx.nodes.allocatable[i]
        ):
            return False
        return not (self.ports and ports_conflict(self.ports, self.ctx.cache.ports.get(name, _NO_PORTS)))

    def _local_all(self) -> Ints:
        n, (cpu, memory) = self.ctx.nodes, self.nonzero
        local = scores.least_allocated_many(
            n.alloc_cpu, n.alloc_mem, n.nonzero_cpu + cpu, n.nonzero_mem + memory
        )
        if not self.best_effort:
            local = local + scores.balanced_allocation_many(
                n.alloc_cpu, n.alloc_mem, n.used_cpu + self.requests.cpu, n.used_mem + self.requests.memory
            )
        return local

    def _local(self, i: int) -> int:
        n, name = self.ctx.nodes, self.ctx.nodes.names[i]
        cpu, memory = self.ctx.cache.used_nonzero.get(name, (0, 0))
        alloc_cpu, alloc_mem = int(n.alloc_cpu[i]), int(n.alloc_mem[i])
        local = scores.least_allocated(alloc_cpu, alloc_mem, cpu + self.nonzero[0], memory + self.nonzero[1])
        if not self.best_effort:
            used = self.ctx.cache.used.get(name, ZERO)
            local += scores.balanced_allocation(
                alloc_cpu, alloc_mem, used.cpu + self.requests.cpu, used.memory + self.requests.memory
            )
        return local

    def _preferred_node_affinity(self, spec: Mapping[str, Any]) -> Ints | None:
        node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
        if not node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"):
            return None
        return np.array(
            [preferred_node_affinity_score(spec, obj) for obj in self.ctx.nodes.objects], dtype=np.int64
        )

    def _build_constraints(self, spec: Mapping[str, Any], meta: Mapping[str, Any], info: PodInfo) -> None:
        ctx, ns, labels = self.ctx, self.namespace, self.labels
        hard = spread_constraints(spec, labels, DO_NOT_SCHEDULE)
        if hard:
            self.spread_filter = SpreadFilter(ctx, ns, labels, spec, hard)
        if spec.get("topologySpreadConstraints"):
            soft = spread_constraints(spec, labels, SCHEDULE_ANYWAY)
            if soft:
                self.spread_score = SpreadScore(ctx, ns, spec, soft, require_all_keys=True)
        else:
            selector = default_selector(ns, labels, meta, ctx.lookups.services(ns), ctx.lookups.controller)
            if selector is not None:
                defaults = system_default_constraints(selector)
                self.spread_score = SpreadScore(ctx, ns, spec, defaults, require_all_keys=False)
        if info.terms is not None:
            self.terms = unroll_namespace_selectors(info.terms, ctx.lookups.namespaces)
        self._build_inter_pod()

    def _build_inter_pod(self) -> None:
        ctx = self.ctx
        pod = incoming(self.namespace, self.labels, self.terms, ctx.lookups.namespace_labels(self.namespace))
        if self.inter_pod_filter is None and (
            self.terms.required_affinity or self.terms.required_anti or ctx.cache.required_anti_pods
        ):
            self.inter_pod_filter = InterPodFilter(ctx.nodes, ctx.cache, pod)
        if self.inter_pod_score is None and (self.terms.preferred or ctx.cache.with_affinity):
            self.inter_pod_score = InterPodScore(ctx.nodes, ctx.cache, pod)

    # --- the pass's changes ---------------------------------------------------------------------------

    def _catch_up(self) -> None:
        nodes, changes = self.ctx.nodes, self.ctx.cache.changes or []
        if self.cursor == len(changes) and self.excluded_seen == len(nodes.excluded):
            return
        dirty: set[int] = set()
        new_terms = False
        for change in changes[self.cursor :]:
            i = nodes.index.get(change.node)
            if i is None:
                continue
            dirty.add(i)
            if self.spread_filter is not None:
                self.spread_filter.apply(change, i)
            if self.spread_score is not None:
                self.spread_score.apply(change, i)
            if self.inter_pod_filter is not None:
                self.inter_pod_filter.apply(change)
            if self.inter_pod_score is not None:
                self.inter_pod_score.apply(change)
            new_terms = new_terms or change.pod.terms is not None
        self.cursor = len(changes)
        if new_terms:
            self._build_inter_pod()  # a pod with terms now counts: built from the cache as it is
        dirty.update(nodes.excluded)
        self.excluded_seen = len(nodes.excluded)
        for i in dirty:
            if i in nodes.excluded or not self.allowed[i]:
                self.fit[i] = False
            else:
                self.fit[i] = self._fits(i)
            self.local[i] = self._local(i)

    # --- one pod -----------------------------------------------------------------------------------------

    def feasible(self) -> Bools:
        feasible = self.fit
        if self.spread_filter is not None:
            feasible = feasible & self.spread_filter.mask()
        if self.inter_pod_filter is not None:
            mask = self.inter_pod_filter.mask()
            if mask is not None:
                feasible = feasible & mask
        return feasible

    def choose(self) -> int | None:
        """The node index the group's next pod goes to, None when no node passes every filter."""
        self._catch_up()
        if self.error is not None or self._stuck == (self.cursor, self.excluded_seen):
            return None
        candidates = np.flatnonzero(self.feasible())
        if candidates.size == 0:
            self._stuck = (self.cursor, self.excluded_seen)
            return None
        total = self.local[candidates] * scores.WEIGHT_FIT
        if self.taint_raw is not None:
            total += scores.WEIGHT_TAINT_TOLERATION * scores.taint_toleration_normalized(
                self.taint_raw[candidates]
            )
        if self.affinity_raw is not None:
            total += scores.WEIGHT_NODE_AFFINITY * scores.node_affinity_normalized(
                self.affinity_raw[candidates]
            )
        if self.spread_score is not None:
            total += scores.WEIGHT_SPREAD * self.spread_score.scores(candidates)
        if self.inter_pod_score is not None:
            inter_pod = self.inter_pod_score.scores(candidates)
            if inter_pod is not None:
                total += scores.WEIGHT_INTER_POD * inter_pod
        return int(candidates[int(np.argmax(total))])

    def diagnose(self) -> str:
        """kube-scheduler's FitError message: each node's first failing filter's reasons, counted."""
        nodes, cache = self.ctx.nodes, self.ctx.cache
        if not len(nodes):
            return NO_NODES
        if self.error is not None:
            return f"0/{len(nodes)} nodes are available: {self.error}."
        self._catch_up()
        if self._diagnosis is not None and self._diagnosis[0] == (self.cursor, self.excluded_seen):
            return self._diagnosis[1]
        spread = self.spread_filter.reasons() if self.spread_filter is not None else None
        inter_pod = self.inter_pod_filter.reasons() if self.inter_pod_filter is not None else None
        counted: Counter[str] = Counter()
        for i, name in enumerate(nodes.names):
            static = self.static_reasons[i]
            if static is not None:
                counted[static] += 1
                continue
            if self.ports and ports_conflict(self.ports, cache.ports.get(name, _NO_PORTS)):
                counted[REASON_PORTS] += 1
                continue
            short = insufficient_resources(self.requests, cache.used.get(name, ZERO), nodes.allocatable[i])
            if short:
                counted.update(short)
                continue
            for reasons in (spread, inter_pod):
                reason = reasons[i] if reasons is not None else None
                if reason is not None:
                    counted[reason] += 1
                    break
        parts = sorted(f"{count} {reason}" for reason, count in counted.items())
        message = f"0/{len(nodes)} nodes are available:"
        message = f"{message} {', '.join(parts)}." if parts else message
        self._diagnosis = ((self.cursor, self.excluded_seen), message)
        return message
