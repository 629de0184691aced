"""New NodeClaims: joining an open claim or opening one from a NodePool (requirements, instance
types that still fit, NodePool limits, topology), their final options and prices, and the cost-aware
packing entry point (planner/scheduling/packing.py).

A part of `Simulator` (planner/scheduling/simulator.py): the state and the other rooms' methods it
reads are declared in `SimulatorState` (state.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from api import constants as k
from planner.scheduling.inputs import HostPort, SimPod, ports_conflict
from planner.scheduling.min_values import (
    BEST_EFFORT,
    MAX_SCHEDULING_INSTANCE_TYPES,
    describe_shortfall,
    has_min_values,
    min_values_shortfall,
    truncate,
    was_relaxed,
)
from planner.scheduling.min_values import relax as relax_min_values
from planner.scheduling.packing import pack_new_nodes
from planner.scheduling.requirements import Req, Reqs
from planner.scheduling.results import ClaimOption, NewNodeClaim, SimulationAborted, SimulationResult
from planner.scheduling.state import (
    AFFINITY,
    CAPACITY_TYPE,
    HOSTNAME,
    SPREAD,
    ZONE,
    Effective,
    OpenClaim,
    PreparedPool,
    Probe,
    SimulatorState,
    TopologyGroup,
    TypeEntry,
    TypeSet,
    Vec,
    entry_values,
    vec_add,
    vec_fits,
    vec_share,
    vec_sub,
)


class NewNodes(SimulatorState):
    """Placement of a pod on a new NodeClaim."""

    def _place_cost(
        self,
        probe: Probe,
        pods: list[SimPod],
        result: SimulationResult,
        deleting_keys: set[str],
        max_new_claims: int | None,
        stop_on_failure: bool,
    ) -> list[SimPod]:
        """The "cost" packing: existing nodes first (strict constraints), then new nodes one at a time
        (planner.scheduling.packing). Returns the pods left for the usual pod-by-pod placement."""
        rest: list[SimPod] = []
        leftover: list[tuple[SimPod, Effective]] = []
        for pod in pods:
            eff = self._eff(pod.constraints, 0)
            if eff.vec is None:
                rest.append(pod)
                continue
            # A consolidation's settling nodes, as Simulator._avoided says.
            avoid = frozenset() if pod.pending or pod.key in deleting_keys else probe.settling
            dest = self._try_existing(probe, eff, avoid)
            if dest is not None:
                self._commit_existing(
                    probe, eff, self.nodes[dest], pod, result, deleting_keys, stop_on_failure
                )
            else:
                leftover.append((pod, eff))
        rest.extend(pack_new_nodes(self, probe, leftover, result, max_new_claims))
        return sorted(rest, key=self._pod_order)

    @property
    def pools(self) -> list[PreparedPool]:
        """NodePools in the order new claims try them (highest weight first)."""
        return self._pools

    def pool_tolerates(self, pool: PreparedPool, eff: Effective) -> bool:
        return self._pool_tolerated(pool, eff.tolerations)

    def pool_types(self, pool: PreparedPool, probe: Probe | None = None) -> list[TypeEntry]:
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
                    e.price * vec_share(vec, e.alloc)
                    for pool in self._pools
                    for e in self._typeset(pool, pool.base, frozenset()).entries
                    if vec_fits(vec, e.alloc)
                ),
                default=float("inf"),
            )
            self._fair_cache[vec] = cached
        return cached

    def open_claim(
        self, probe: Probe, eff: Effective, pod_key: str, max_new_claims: int | None, pool: PreparedPool
    ) -> OpenClaim | None:
        """Open a new claim in `pool` holding this pod (None when the pod may not go there)."""
        return self._open_claim(probe, eff, pod_key, max_new_claims, [pool])

    def join_claim(self, probe: Probe, claim: OpenClaim, eff: Effective, pod_key: str) -> bool:
        """Add the pod to `claim` if the claim rules allow it."""
        reqs = self._claim_try(
            probe, eff, claim.pool, claim.reqs, claim.used, claim.name, claim.ports, claim.excluded
        )
        if reqs is None:
            return False
        self._claim_commit(probe, claim, eff, reqs, pod_key)
        return True

    def _limits_start(self, probe: Probe) -> None:
        """What each limited pool may still launch: limits minus the capacity of its remaining nodes."""
        for pool in self._pools:
            if pool.limits is None:
                continue
            used = self._pool_nodes_capacity.get(pool.pool.name, self._zero)
            for idx in probe.removed:
                node = self.nodes[idx]
                if node.nodepool == pool.pool.name:
                    used = vec_sub(used, self._node_capacity[node.name])
            probe.limits[pool.pool.name] = vec_sub(pool.limits, used)

    def _excluded(self, probe: Probe, pool: PreparedPool) -> frozenset[str]:
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
            if not vec_fits(self._capacity_vec(it.capacity or it.allocatable), remaining)
        )
        probe.excluded[pool.pool.name] = (remaining, excluded)
        return excluded

    def _shortfall(self, ts: TypeSet, used: Vec, reqs: Reqs) -> dict[str, int] | None:
        """None when no instance type holds `used`; else the minValues keys the fitting types fall
        short on and the count they reach (empty: every minValues met)."""
        if not any(vec_fits(used, f) for f in ts.frontier):
            return None
        if not has_min_values(reqs):
            return {}
        fitting = {e.name: e for e in ts.entries if vec_fits(used, e.alloc)}
        _, short = min_values_shortfall(
            reqs, list(fitting), lambda name, key: entry_values(fitting[name], key)
        )
        return short

    def _claim_try(
        self,
        probe: Probe,
        eff: Effective,
        pool: PreparedPool,
        reqs: Reqs,
        used: Vec,
        hostname: str,
        ports: list[HostPort],
        excluded: frozenset[str],
        relax: bool = False,
    ) -> Reqs | None:
        """The requirements a claim would have with this pod on it, or None if the pod cannot join.
        `relax` (a new claim under MinValuesPolicy BestEffort): minValues the fitting types fall short
        of are lowered to what they reach instead of refusing the pod (planner/scheduling/min_values.py)."""
        if not self._pool_tolerated(pool, eff.tolerations):
            return None
        if eff.ports and any(ports_conflict(a, b) for a in eff.ports for b in ports):
            return None
        vec = eff.vec
        assert vec is not None  # only a pod whose requests something offers is placed (_place)
        new_used = vec_add(used, vec)
        for term, host_reqs in zip(eff.terms, eff.hostname_reqs, strict=True):
            if host_reqs and not all(r.matches(hostname) for r in host_reqs):
                continue
            merged = self._merge(reqs, pool.base_keys, term)
            if merged is None:
                continue
            merged = self._claim_topology(probe, eff, pool, merged, hostname, excluded)
            if merged is None:
                continue
            short = self._shortfall(self._typeset(pool, merged, excluded), new_used, merged)
            if short == {}:
                return merged
            if short and relax:
                return relax_min_values(merged, short)
        return None

    def _claim_topology(
        self,
        probe: Probe,
        eff: Effective,
        pool: PreparedPool,
        reqs: Reqs,
        hostname: str,
        excluded: frozenset[str],
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

    def _claim_commit(self, probe: Probe, claim: OpenClaim, eff: Effective, reqs: Reqs, pod_key: str) -> None:
        claim.reqs = reqs
        vec = eff.vec
        assert vec is not None  # only a pod whose requests something offers is placed (_place)
        claim.used = vec_add(claim.used, vec)
        claim.pods.append(pod_key)
        claim.ports.extend(eff.ports)

        def domains(key: str) -> frozenset[str]:
            if key == HOSTNAME:
                return frozenset((claim.name,))
            return self._pool_domains(claim.pool, claim.reqs, key, claim.excluded)

        def filter_ok(g: TopologyGroup) -> bool:
            return not g.filter_terms or any(
                self._merge(claim.reqs, claim.pool.base_keys, t) is not None for t in g.filter_terms
            )

        self._record(probe, eff, domains, filter_ok)

    def _try_claims(self, probe: Probe, eff: Effective, pod_key: str) -> OpenClaim | None:
        # Like Karpenter: the claims with the fewest pods first. Moved pods never join background
        # claims (in flight, not initialized), nor another group's (kept apart per removed node).
        refused, group = probe.refused, probe.group
        for claim in sorted(probe.claims, key=lambda c: len(c.pods)):
            if claim.background != probe.background or claim.group != group:
                continue
            if (claim.name, id(eff)) in refused:
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
        probe: Probe,
        eff: Effective,
        pod_key: str,
        max_new_claims: int | None,
        pools: Sequence[PreparedPool] | None = None,
    ) -> OpenClaim | None:
        name = f"new-nodeclaim-{len(probe.claims)}"
        for pool in self._pools if pools is None else pools:
            excluded = self._excluded(probe, pool)
            reqs = self._claim_try(
                probe,
                eff,
                pool,
                pool.base,
                self._zero,
                name,
                [],
                excluded,
                self.min_values_policy == BEST_EFFORT,
            )
            if reqs is None:
                continue
            if max_new_claims is not None and sum(not c.background for c in probe.claims) >= max_new_claims:
                raise SimulationAborted(f"pod {pod_key} would need more than {max_new_claims} new node(s)")
            claim = OpenClaim(
                name, pool, pool.base, self._zero, excluded, probe.background, group=probe.group
            )
            probe.claims.append(claim)
            self._claim_commit(probe, claim, eff, reqs, pod_key)
            # Karpenter reserves the largest option against the pool's limits when it opens a claim.
            remaining = probe.limits.get(pool.pool.name)
            if remaining is not None:
                ts = self._typeset(pool, claim.reqs, excluded)
                fitting = [e.capacity for e in ts.entries if vec_fits(claim.used, e.alloc)]
                if fitting:
                    biggest = tuple(max(col) for col in zip(*fitting, strict=True))
                    probe.limits[pool.pool.name] = vec_sub(remaining, biggest)
            return claim
        return None

    def _finalize(self, claim: OpenClaim) -> NewNodeClaim:
        ts = self._typeset(claim.pool, claim.reqs, claim.excluded)
        # Karpenter keeps at most 600 options per NodeClaim (Results.TruncateInstanceTypes; the check
        # under Strict is `truncation_refusal`).
        entries = [e for e in ts.entries if vec_fits(claim.used, e.alloc)][:MAX_SCHEDULING_INSTANCE_TYPES]
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
            min_values_relaxed=was_relaxed(claim.pool.base, claim.reqs),
            has_min_values=has_min_values(claim.reqs),
            group=claim.group,
        )

    def truncation_refusal(self, claim: NewNodeClaim, max_items: int) -> str | None:
        """Why the claim's `max_items` cheapest options cannot launch under Strict (their minValues
        are not met), None when they can or under BestEffort (Karpenter's Truncate)."""
        _, why = truncate(
            claim.instance_types, claim.requirements, max_items, self.min_values_policy, self.values_of
        )
        return why

    def values_of(self, name: str, key: str) -> Iterable[str]:
        """The values instance type `name` has for `key`: its name, its available offerings' zones or
        capacity types, or its label (Karpenter's instance type requirements)."""
        it = self.instance_types[name]
        if key == k.INSTANCE_TYPE_LABEL:
            return (name,)
        if key == ZONE:
            return {o.zone for o in it.offerings if o.available}
        if key == CAPACITY_TYPE:
            return {o.capacity_type for o in it.offerings if o.available}
        value = it.labels.get(key)
        return () if value is None else (value,)

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
            if e.name in allowed and vec_fits(used, e.alloc)
        )

    def min_values_met(self, claim: NewNodeClaim, options: Sequence[str]) -> str | None:
        """None when `options` still satisfy the claim's minValues (as the simulation left them,
        lowered under BestEffort); otherwise what is missing (Karpenter's
        RemoveInstanceTypeOptionsByPriceAndMinValues)."""
        _, short = min_values_shortfall(claim.requirements, options, self.values_of)
        return describe_shortfall(claim.requirements, short) if short else None
