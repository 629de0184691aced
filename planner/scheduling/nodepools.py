"""What a NodePool can launch: its prepared requirements and taints, the instance types that
still fit a set of requirements, and the domains (zones, ...) they span.

A part of `Simulator` (planner/scheduling/simulator.py): the state and the other rooms' methods it
reads are declared in `SimulatorState` (state.py)."""

from __future__ import annotations

from collections.abc import Sequence

from api import constants as k
from kube.selectors import Toleration, first_untolerated
from planner.scheduling.inputs import SimDaemonSet, SimInstanceType, SimNodePool
from planner.scheduling.requirements import Req, Reqs, freeze
from planner.scheduling.state import (
    CAPACITY_TYPE,
    HOSTNAME,
    LAUNCH_PRECEDENCE,
    NOT_FROM_TYPE,
    TYPE_LABEL_ALIASES,
    ZONE,
    PreparedPool,
    SimulatorState,
    TypeEntry,
    TypeSet,
    pareto_front,
    vec_add,
    vec_sub,
)


class NodePoolTypes(SimulatorState):
    """What a NodePool can launch under a set of requirements."""

    def _prepare_pool(
        self, pool: SimNodePool, instance_types: Sequence[SimInstanceType], daemonsets: Sequence[SimDaemonSet]
    ) -> PreparedPool:
        base = freeze(
            (
                *pool.requirements,
                *(Req.equals(key, v) for key, v in pool.labels.items()),
                Req.equals(k.NODEPOOL_LABEL, pool.name),
            )
        )
        prepared = PreparedPool(pool, base, frozenset(r.key for r in base), pool.taints, [], {}, None)
        if pool.limits:
            prepared.limits = tuple(
                pool.limits.get(n, 1 << 62) if n in pool.limits else 1 << 62 for n in self._res_names
            )
        for it in instance_types:
            it = _serving(it, pool.nodeclass)
            if self._type_compatible(it, base):
                prepared.types.append(it)
        # DaemonSet overhead: the daemons that would run on a node of this pool and type.
        for it in prepared.types:
            labels = {**it.labels, **pool.labels, k.NODEPOOL_LABEL: pool.name}
            total = self._zero
            for ds in daemonsets:
                c = ds.constraints
                if first_untolerated(c.tolerations, pool.taints) is not None:
                    continue
                if c.node_terms and not any(self._ds_term_ok(t, labels, base) for t in c.node_terms):
                    continue
                total = vec_add(total, self._vec(c.requests) or self._zero)
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
            key_name = TYPE_LABEL_ALIASES.get(r.key, r.key)
            if key_name == ZONE:
                zone_req = r if zone_req is None else zone_req.intersect(r)
                continue
            if key_name == CAPACITY_TYPE:
                ct_req = r
                continue
            if key_name in NOT_FROM_TYPE:
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

    def _typeset(self, pool: PreparedPool, reqs: Reqs, excluded: frozenset[str]) -> TypeSet:
        key = (pool.pool.name, reqs, excluded)
        cached = self._typeset_cache.get(key)
        if cached is not None:
            return cached
        by_key = {r.key: r for r in reqs}
        zone_req, ct_req = by_key.get(ZONE), by_key.get(CAPACITY_TYPE)
        entries: list[TypeEntry] = []
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
            alloc = vec_sub(self._vec_dict(it.allocatable), pool.overhead.get(it.name, self._zero))
            if any(v < 0 for v in alloc):
                continue
            entries.append(
                TypeEntry(
                    it.name,
                    alloc,
                    self._capacity_vec(it.capacity or it.allocatable),
                    min(o.price for o in offers),
                    worst,
                    it.labels,
                    frozenset(o.zone for o in offers),
                    frozenset(o.capacity_type for o in offers),
                )
            )
        entries.sort(key=lambda e: (e.price, e.name))
        result = TypeSet(entries, pareto_front(e.alloc for e in entries))
        self._typeset_cache[key] = result
        return result

    def _pool_tolerated(self, pool: PreparedPool, tolerations: tuple[Toleration, ...]) -> bool:
        key = (pool.pool.name, tolerations)
        ok = self._tolerates_pool.get(key)
        if ok is None:
            ok = first_untolerated(tolerations, pool.taints) is None
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

    def _pool_domains(
        self, pool: PreparedPool, reqs: Reqs, key: str, excluded: frozenset[str]
    ) -> frozenset[str]:
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


def _serving(it: SimInstanceType, nodeclass: str | None) -> SimInstanceType:
    """The type as a pool of this EC2NodeClass sees it: without the reserved offerings of
    reservations its class does not select (Karpenter resolves offerings per NodeClass)."""
    if all(o.reservation is None or o.reservation.serves(nodeclass) for o in it.offerings):
        return it
    offerings = tuple(o for o in it.offerings if o.reservation is None or o.reservation.serves(nodeclass))
    return SimInstanceType(it.name, it.labels, it.capacity, it.allocatable, offerings)
