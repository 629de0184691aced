"""Static NodePools (Karpenter v1.8 `spec.replicas`): StaticDrift, node counts, `limits.nodes` headroom.

A static pool holds a fixed number of nodes. Karpenter never empties or consolidates it
(planner/candidates.py `consolidation_block`), never launches dynamic capacity into it
(planner/scheduling/adapter.py), and replaces its drifted nodes by StaticDrift
(pkg/controllers/disruption/staticdrift.go), which runs after Emptiness and before Drift:

- per pool, nothing while the Drifted budget allows 0;
- nothing while the pool holds more nodes than its replicas (a scale-down, or a replacement still in
  flight, must finish first);
- at most min(budget, drifted candidates) commands, and no more than `limits.nodes` leaves room for:
  each replacement launches before its node goes, so a pool at its node limit waits (Karpenter's
  NodePoolState.ReserveNodeCount: limit - (active + deleting + pending disruption));
- each command replaces one node by one node of the pool's template (not a simulation: the count is
  the user's), eventual class, reason Drifted; several commands in one pass, as Karpenter does.

Expiration still applies to static pools (Karpenter's nodeclaim/expiration controller has no static
case; its static provisioning controller then restores the count): planner/expiration.py replaces an
expired static node one for one when `limits.nodes` leaves room.

The count is Karpenter's NodeClaims of the pool: every node of the pool (deleting ones too), the
NodeClaims without a node yet, and, because karpflow's own launches are invisible until they
register, one more for each node a command holds (its replacement may be on its way). Counting one
too many only makes StaticDrift wait a pass longer.
"""

from __future__ import annotations

from api.constants import CAPACITY_TYPE_LABEL, REASON_DRIFTED, ZONE_LABEL
from api.nodepool import NodePool
from planner.catalog import InstanceType
from planner.drift import drift_status
from planner.limits import pool_limits
from planner.model import (
    BudgetMap,
    Candidate,
    Command,
    DisruptionClass,
    PlanContext,
    Replacement,
    ValidationResult,
)
from planner.pool_claims import claims_without_node
from planner.scheduling.inputs import NODES_RESOURCE
from planner.scheduling.min_values import MAX_LAUNCH_INSTANCE_TYPES, truncate
from planner.scheduling.requirements import Req, freeze
from planner.scheduling.state import LAUNCH_PRECEDENCE

STATIC_DRIFT = "static-drift"
# Karpenter's AWS provider launches a NodeClaim with its cheapest 60 options (instance.go maxInstanceTypes).
MAX_INSTANCE_TYPES = MAX_LAUNCH_INSTANCE_TYPES


def node_limit(pool: NodePool) -> int | None:
    """The pool's `limits.nodes`; None when it has none (api/nodepool_reader.py read a bad one as 0)."""
    limit = pool_limits(pool).get(NODES_RESOURCE)
    return None if limit is None else max(limit, 0)


def static_node_counts(ctx: PlanContext, pool_name: str) -> tuple[int, int]:
    """Karpenter's NodeClaims of the pool (see the module doc): (active + pending disruption, deleting)."""
    live = deleting = 0
    for node in ctx.snapshot.nodes.values():
        if node.nodepool != pool_name:
            continue
        if node.is_deleting:
            deleting += 1
            continue
        live += 1
        if node.has_disrupted_taint:
            live += 1  # its replacement, which may not have registered yet
    for claim in claims_without_node(ctx.snapshot, pool_name):
        if claim.deletion_timestamp is not None:
            deleting += 1
        else:
            live += 1
    return live, deleting


def static_node_count(ctx: PlanContext, pool_name: str) -> int:
    """Every NodeClaim of the pool, deleting ones too: what `limits.nodes` is counted against."""
    live, deleting = static_node_counts(ctx, pool_name)
    return live + deleting


def node_headroom(ctx: PlanContext, pool: NodePool, reserved: int = 0) -> int | None:
    """How many more nodes `limits.nodes` lets the pool launch now (None: no node limit)."""
    limit = node_limit(pool)
    if limit is None:
        return None
    return max(limit - static_node_count(ctx, pool.name) - reserved, 0)


def template_replacement(ctx: PlanContext, pool: NodePool) -> tuple[Replacement | None, str]:
    """One node of the pool's template (Karpenter's NewNodeClaimTemplate): every catalog type and
    offering its requirements and labels allow, cheapest first, at most the 60 the launch sends.
    (None, why): the template allows none, or under MinValuesPolicy Strict the 60 miss a minValues
    (Karpenter's AWS provider fails such a launch: a static NodeClaim carries the pool's minValues)."""
    none_offered = "the pool's template allows no instance type offered now"
    if ctx.snapshot.nodeclass_problem(pool) is not None:
        return None, none_offered
    template = pool.spec.template
    reqs = [Req.of(r.key, r.operator, r.values, r.min_values) for r in template.spec.requirements]
    reqs += [Req.equals(key, value) for key, value in template.metadata.labels.items()]
    by_key: dict[str, Req] = {}
    for req in reqs:
        by_key[req.key] = by_key[req.key].intersect(req) if req.key in by_key else req
    zone_req = by_key.pop(ZONE_LABEL, None)
    ct_req = by_key.pop(CAPACITY_TYPE_LABEL, None)
    types: list[tuple[float, str, InstanceType]] = []
    zones: set[str] = set()
    capacity_types: set[str] = set()
    for it in ctx.catalog.for_pool(pool.name):
        labels = it.labels
        if any(key in labels and not req.matches(labels[key]) for key, req in by_key.items()):
            continue
        offers = [
            o
            for o in it.offerings
            if o.available
            and (zone_req is None or zone_req.has(o.zone))
            and (ct_req is None or ct_req.has(o.capacity_type))
        ]
        if not offers:
            continue
        types.append((min(o.price for o in offers), it.name, it))
        zones.update(o.zone for o in offers)
        capacity_types.update(o.capacity_type for o in offers)
    if not types:
        return None, none_offered
    capacity_type = next(ct for ct in (*LAUNCH_PRECEDENCE, *sorted(capacity_types)) if ct in capacity_types)
    ordered = [it for _, _, it in sorted(types, key=lambda t: (t[0], t[1]))]
    by_name = {it.name: it for it in ordered}
    min_reqs = freeze(r for r in reqs if r.min_values is not None)

    def values_of(name: str, key: str) -> list[str]:
        it = by_name[name]
        if key == ZONE_LABEL:
            return [o.zone for o in it.offerings if o.available]
        if key == CAPACITY_TYPE_LABEL:
            return [o.capacity_type for o in it.offerings if o.available]
        value = it.labels.get(key)
        return [] if value is None else [value]

    names, why = truncate(
        [it.name for it in ordered], min_reqs, MAX_INSTANCE_TYPES, ctx.options.min_values_policy, values_of
    )
    if why is not None:
        return None, f"NodePool {pool.name} couldn't meet minValues requirements at launch, {why}"
    return Replacement(
        nodepool=pool.name,
        instance_types=[by_name[n] for n in names],
        capacity_type=capacity_type,
        zones=sorted(zones),
        min_values={r.key: r.min_values for r in min_reqs if r.min_values is not None},
    ), ""


def static_replica(ctx: PlanContext, pool: NodePool) -> tuple[Replacement | None, str]:
    """The node that restores a static pool's count when one of its nodes is deleted (expiration), as
    Karpenter's static provisioning controller launches it: only while the pool would be below its
    replicas, within `limits.nodes` (the leaving node still counts until it is gone). Several in one
    pass reserve their room (`ctx.memo`). (None, why) when none launches."""
    reserved: dict[str, int] = ctx.memo.setdefault(_RESERVED, {})
    live, _ = static_node_counts(ctx, pool.name)
    taken = reserved.get(pool.name, 0)
    if live - 1 + taken >= (pool.spec.replicas or 0):
        return None, f"the pool keeps its {pool.spec.replicas} replicas without a new node"
    headroom = node_headroom(ctx, pool, taken)
    if headroom == 0:
        return None, f"limits.nodes {node_limit(pool)} leaves no room for its replica until it is gone"
    replica, why = template_replacement(ctx, pool)
    if replica is None:
        return None, why
    reserved[pool.name] = taken + 1
    return replica, ""


_RESERVED = "static_drift.reserved"


class StaticDrift:
    """Replace a static NodePool's drifted nodes one for one, within budgets and `limits.nodes`."""

    name = STATIC_DRIFT
    reason = REASON_DRIFTED
    disruption_class = DisruptionClass.EVENTUAL
    consolidation_type = ""

    def should_disrupt(self, ctx: PlanContext, candidate: Candidate) -> bool:
        if not candidate.nodepool.spec.is_static:
            return False
        candidate.drift = drift_status(ctx, candidate.node, candidate.nodepool)
        return candidate.drift is not None

    def compute(self, ctx: PlanContext, candidates: list[Candidate], budgets: BudgetMap) -> list[Command]:
        by_pool: dict[str, list[Candidate]] = {}
        for candidate in sorted(candidates, key=_drift_order):
            by_pool.setdefault(candidate.pool_name, []).append(candidate)
        commands: list[Command] = []
        for pool_name in sorted(by_pool):
            pool_candidates = by_pool[pool_name]
            pool = pool_candidates[0].nodepool
            label = "static NodePool: drifted"
            replicas = pool.spec.replicas or 0
            live, deleting = static_node_counts(ctx, pool_name)
            count = live + deleting
            why: str | None = None
            allowed = min(budgets.available(pool_name), len(pool_candidates))
            headroom = node_headroom(ctx, pool)
            if budgets.available(pool_name) <= 0:
                why = budgets.exhausted_message(pool_name)
            elif live > replicas:
                why = f"the pool has {live} node(s), over its {replicas} replicas: waits until it is back"
            elif headroom is not None and headroom < allowed:
                allowed = headroom
                if headroom == 0:
                    why = (
                        f"limits.nodes {node_limit(pool)} leaves no room for a replacement "
                        f"({count} node(s)); it launches before its node goes"
                    )
            replacement = None
            if why is None:
                replacement, refusal = template_replacement(ctx, pool)
                why = refusal if replacement is None else None
            for index, candidate in enumerate(pool_candidates):
                if why is not None or index >= allowed:
                    reason = why or f"only {allowed} of its drifted nodes are replaced per pass now; waits"
                    ctx.explain(candidate.name, self.name, f"{label}; {reason}")
                    continue
                assert replacement is not None
                budgets.take(pool_name)
                drift = candidate.drift
                detail = f" ({drift.reason}: {drift.detail})" if drift is not None else ""
                commands.append(
                    Command(
                        method=self.name,
                        reason=self.reason,
                        candidates=[candidate],
                        replacements=[_copy(replacement)],
                        disruption_class=self.disruption_class,
                        message=f"{label}{detail}; replaced one for one ({replicas} replicas)",
                    )
                )
        return commands

    def validate(self, ctx: PlanContext, command: Command) -> ValidationResult:
        # Drift runs without the 15 s validation in Karpenter (§1.7), StaticDrift too.
        return ValidationResult(True, command)


def _copy(replacement: Replacement) -> Replacement:
    return Replacement(
        nodepool=replacement.nodepool,
        instance_types=list(replacement.instance_types),
        capacity_type=replacement.capacity_type,
        zones=list(replacement.zones),
        min_values=dict(replacement.min_values),
    )


def _drift_order(candidate: Candidate) -> tuple[bool, float, str]:
    since = candidate.drift.since if candidate.drift else None
    return (not candidate.is_empty, since.timestamp() if since else float("inf"), candidate.name)
