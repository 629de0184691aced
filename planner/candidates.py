"""Which nodes may be disrupted at all, in what order, and when they become consolidatable.

Rules (behaviour notes §1.3, §1.4, §1.6):
- A managed node (labelled `karpenter.sh/nodepool` with an existing NodePool) becomes a `Candidate`
  unless a filter blocks it: disruption already in flight (the `karpenter.sh/disrupted` taint), not
  initialized, being deleted, annotated `karpenter.sh/do-not-disrupt`, or its pool's EC2NodeClass
  missing or not Ready (when the snapshot holds EC2NodeClasses). Blocked nodes get a readable
  reason; unmanaged nodes are not reported.
- Pod-level blocks (an active do-not-disrupt pod, a PDB that allows no disruption, a pod under two
  PDBs) are recorded on the candidate as `pod_block`: graceful methods skip such candidates, the
  eventual class (drift on a node with a terminationGracePeriod) does not.
- Consolidation methods additionally need `consolidation_block(ctx, c) is None`; a static NodePool's
  node (`spec.replicas`, Karpenter v1.8) never passes it.
- Ordering: ascending disruption cost = sum of pod eviction costs x lifetime remaining, name as the
  tie-break so plans are deterministic (drift, expiration and the other non-consolidation methods);
  emptiness, multi- and single-node consolidation re-order by savings ratio (price / disruption
  cost, highest first: planner/balanced.py `sort_by_savings_ratio`, Karpenter's sortCandidates), and
  single-node consolidation interleaves NodePools.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from api.constants import (
    CAPACITY_RESERVATION_ID_LABEL,
    CAPACITY_RESERVED,
    LEGACY_DO_NOT_CONSOLIDATE_ANNOTATION,
)
from api.duration import format_duration, parse_optional_duration
from api.karpflow_overrides import overrides_of
from api.nodepool import NodePool
from api.nodepool_reader import pool_expire_after, pool_termination_grace_period
from planner.model import Blocked, Candidate, PlanContext
from planner.pass_cache import NodePods, node_pods
from planner.reservations import node_reserved_price
from planner.snapshot import Node, Snapshot

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STATIC_NEVER_CONSOLIDATED = "static NodePool: never consolidated"


# --- Per-node facts -------------------------------------------------------------------------------


def node_expire_after(node: Node, pool: NodePool | None) -> timedelta | None:
    """expireAfter of the node: its NodeClaim's copy when there is one, else the NodePool template's
    (a node carries the value it was launched with; without NodeClaims the pool's is the best guess).
    None means Never. A karpflow.dev/expire-after on the pool wins over both (api/karpflow_overrides.py).
    Every value was validated when read (an invalid one reads as Never, and is a problem)."""
    if pool is not None and overrides_of(pool).expire_after is not None:
        return pool_expire_after(pool)
    claim = node.nodeclaim
    if claim is not None and claim.expire_after is not None:
        return parse_optional_duration(claim.expire_after)
    return pool.spec.template.spec.expire_after_delta if pool is not None else None


def node_termination_grace_period(node: Node, pool: NodePool | None) -> timedelta | None:
    """As `node_expire_after`, for terminationGracePeriod; None means no drain deadline."""
    if pool is not None and overrides_of(pool).termination_grace_period is not None:
        return pool_termination_grace_period(pool)
    claim = node.nodeclaim
    if claim is not None and claim.termination_grace_period is not None:
        return parse_optional_duration(claim.termination_grace_period)
    return pool.spec.template.spec.termination_grace_period_delta if pool is not None else None


def node_created(node: Node) -> datetime | None:
    claim = node.nodeclaim
    if claim is not None and claim.creation_timestamp is not None:
        return claim.creation_timestamp
    return node.creation_timestamp


def lifetime_remaining(node: Node, pool: NodePool | None, now: datetime) -> float:
    """(expireAfter - age) / expireAfter clamped to [0, 1]; 1.0 when the node never expires."""
    expire_after = node_expire_after(node, pool)
    created = node_created(node)
    if expire_after is None or created is None or expire_after.total_seconds() <= 0:
        return 1.0
    age = (now - created).total_seconds()
    return min(1.0, max(0.0, (expire_after.total_seconds() - age) / expire_after.total_seconds()))


def last_pod_event(node: Node, pods: NodePods | None = None) -> datetime | None:
    """Start of the consolidateAfter clock: the latest of the node becoming Ready, the NodeClaim's
    lastPodEventTime, and any non-DaemonSet pod being bound/started, starting to terminate or finishing.
    `pods`: the node's pod aggregates when the caller has them (planner/pass_cache.py)."""
    latest = node.ready_since
    claim = node.nodeclaim
    if claim is not None and claim.last_pod_event_time is not None:
        latest = claim.last_pod_event_time if latest is None else max(latest, claim.last_pod_event_time)
    event = (pods or NodePods(node.pods)).last_event
    if event is not None and (latest is None or event > latest):
        latest = event
    return latest


def consolidatable_at(node: Node, pool: NodePool, last_event: datetime | None) -> datetime | None:
    """When the node becomes Consolidatable; None when the pool's consolidateAfter is Never.
    A node with no time information at all is consolidatable at once."""
    after = pool.spec.disruption.consolidate_after_delta
    if after is None:
        return None
    start = last_event or node_created(node)
    return start + after if start is not None else _EPOCH


def under_consolidate_after(node: Node, pool: NodePool, now: datetime, pods: NodePods | None = None) -> bool:
    """Still inside its NodePool's consolidateAfter window: consolidation moves no pod onto it
    (Karpenter v1.14 pkg/utils/disruption/disruption.go `IsUnderConsolidateAfter`, read by
    provisioning/scheduling/scheduler.go for consolidation simulations). Never for consolidateAfter
    Never or 0, nor for a node not initialized yet; the window runs from the last pod event, else
    from when the node became Ready (`last_pod_event`, the clock of the node's own Consolidatable)."""
    after = pool.spec.disruption.consolidate_after_delta
    if after is None or after <= timedelta(0) or not node.initialized:
        return False
    at = consolidatable_at(node, pool, last_pod_event(node, pods))
    return at is not None and now < at


def pod_block(snapshot: Snapshot, node: Node, pods: NodePods | None = None) -> str | None:
    """The first pod-level reason graceful disruption must leave the node alone (§1.3 step 8).
    `pods`: the node's pod aggregates when the caller has them (planner/pass_cache.py)."""
    now = snapshot.now
    pods = pods or NodePods(node.pods)
    for pod in pods.guarded:  # only pods with a do-not-disrupt annotation can have a reason
        annotation = pod.do_not_disrupt_reason(now)
        if annotation is not None:
            return f"pod {pod.key} has {annotation}"
    if not snapshot.pdbs:
        return None
    # Only pods that would really be evicted matter (NodePods.evictable).
    for pod in pods.evictable:
        pdbs = snapshot.pdbs_for(pod)
        if not pdbs:
            continue
        if len(pdbs) > 1:
            names = ", ".join(sorted(p.key for p in pdbs))
            return f"pod {pod.key} is covered by more than one PDB ({names}); evictions would be refused"
        pdb = pdbs[0]
        if pdb.disruptions_allowed <= 0:
            if pdb.unhealthy_pod_eviction_policy == "AlwaysAllow" and not pod.ready:
                continue
            return f"pdb {pdb.key} prevents pod evictions"
    return None


# --- Building candidates --------------------------------------------------------------------------


def node_block(node: Node, pool: NodePool | None) -> str | None:
    """Node-level filters (§1.3 steps 1-7). None: the node may become a candidate."""
    if node.is_deleting:
        return "node is being deleted"
    if node.has_disrupted_taint:
        return f"disruption already in progress ({node.disruption_taint} taint)"
    if pool is None:
        return f"nodepool {node.nodepool} not found"
    if not node.initialized:
        return "node is not initialized (karpenter.sh/initialized is not true)"
    if node.do_not_disrupt:
        return "node has karpenter.sh/do-not-disrupt"
    return None


def node_price(ctx: PlanContext, node: Node) -> float | None:
    """The node's offering price in the catalog its NodePool sees (None: unknown type, zone or
    capacity type)."""
    instance_type = (
        ctx.catalog.for_pool(node.nodepool).get(node.instance_type) if node.instance_type else None
    )
    if instance_type is None or not node.zone or not node.capacity_type:
        return None
    if node.capacity_type == CAPACITY_RESERVED:
        return node_reserved_price(instance_type, node.zone, node.labels.get(CAPACITY_RESERVATION_ID_LABEL))
    return instance_type.price(node.zone, node.capacity_type)


def make_candidate(ctx: PlanContext, node: Node, pool: NodePool) -> Candidate:
    """A Candidate for `node` whatever the filters say (expiration needs one for blocked nodes too)."""
    snapshot = ctx.snapshot
    instance_type = ctx.catalog.for_pool(pool.name).get(node.instance_type)
    capacity_type, zone = node.capacity_type, node.zone
    price = node_price(ctx, node)
    pods = node_pods(ctx.cache, node)
    last_event = last_pod_event(node, pods)
    return Candidate(
        node=node,
        nodepool=pool,
        instance_type=instance_type,
        capacity_type=capacity_type,
        zone=zone,
        price=price,
        reschedulable_pods=list(pods.reschedulable),
        # Karpenter's DisruptionCost: the eviction costs of the (non-terminal) pods x lifetime left.
        disruption_cost=pods.eviction_cost * lifetime_remaining(node, pool, snapshot.now),
        last_pod_event=last_event,
        consolidatable_at=consolidatable_at(node, pool, last_event),
        pod_block=pod_block(snapshot, node, pods),
        nodeclaim=node.nodeclaim,
        termination_grace_period=node_termination_grace_period(node, pool),
        expire_after=node_expire_after(node, pool),
    )


def build_candidates(ctx: PlanContext) -> tuple[list[Candidate], list[Blocked]]:
    """Every managed node as a Candidate or a Blocked entry, in node-name order.

    Nodes in `ctx.marked_for_deletion` (already in a command of this pass) are neither.
    """
    snapshot = ctx.snapshot
    candidates: list[Candidate] = []
    blocked: list[Blocked] = []
    for name in sorted(snapshot.nodes):
        node = snapshot.nodes[name]
        pool_name = node.nodepool
        if not pool_name or name in ctx.marked_for_deletion:
            continue
        pool = snapshot.nodepools.get(pool_name)
        reason = node_block(node, pool) or (snapshot.nodeclass_problem(pool) if pool is not None else None)
        if reason is not None or pool is None:
            blocked.append(Blocked(name, reason or "", pool_name))
            continue
        candidates.append(make_candidate(ctx, node, pool))
    return candidates, blocked


def consolidation_policy_block(candidate: Candidate) -> str | None:
    """Multi- and single-node consolidation only: the NodePool must allow consolidating used nodes
    (WhenEmptyOrUnderutilized, or Balanced, whose moves are then scored: planner/balanced.py)."""
    policy = candidate.nodepool.spec.disruption.consolidation_policy
    if policy not in ("WhenEmptyOrUnderutilized", "Balanced"):
        pool = candidate.pool_name
        return f"nodepool {pool} has consolidationPolicy {policy}: only empty nodes are consolidated"
    return None


def consolidation_block(ctx: PlanContext, candidate: Candidate) -> str | None:
    """The consolidation-only filter (emptiness, multi- and single-node; §1.3). None: may consolidate."""
    node, pool = candidate.node, candidate.nodepool
    disruption = pool.spec.disruption
    if pool.spec.is_static:
        # Karpenter's Emptiness and consolidation ShouldDisrupt (pkg/controllers/disruption/emptiness.go,
        # consolidation.go): a static pool's node count is the user's, its drift is StaticDrift's.
        return STATIC_NEVER_CONSOLIDATED
    if disruption.consolidate_after_delta is None:
        return f"consolidation is disabled for nodepool {pool.name} (consolidateAfter: Never)"
    if ctx.node_overlays is not None and not candidate.is_empty:
        # A NodeOverlay that may reach the pool is not applied: moving pods is decided on prices.
        held = ctx.node_overlays.held.get(pool.name)
        if held is not None:
            return held
    if node.do_not_consolidate:
        return f"node has {LEGACY_DO_NOT_CONSOLIDATE_ANNOTATION}"
    if candidate.instance_type is None:
        return f"instance type {node.instance_type or '(no label)'} is not in the catalog; cannot price it"
    if not candidate.capacity_type or not candidate.zone:
        return "node lacks the capacity-type or zone label needed for pricing"
    if candidate.price is None:
        offering = f"{candidate.capacity_type} {node.instance_type} in {candidate.zone}"
        return f"the catalog has no offering for {offering}; cannot price it"
    if disruption.consolidation_policy == "WhenEmpty" and not candidate.empty_by_eviction_cost:
        return f"nodepool {pool.name} has consolidationPolicy WhenEmpty and the node is not empty"
    if not candidate.consolidatable(ctx.now):
        assert candidate.consolidatable_at is not None
        after = format_duration(disruption.consolidate_after_delta)
        return (
            f"not consolidatable until {candidate.consolidatable_at:%Y-%m-%dT%H:%M:%SZ} "
            f"(consolidateAfter {after} after the last pod event)"
        )
    return None


# --- Ordering -------------------------------------------------------------------------------------


def sort_by_disruption_cost(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Cheapest to disrupt first (Karpenter v1.x documented order); node name breaks ties."""
    return sorted(candidates, key=lambda c: (c.disruption_cost, c.name))


def round_robin_by_nodepool(
    candidates: Sequence[Candidate], first_pools: Sequence[str] = ()
) -> list[Candidate]:
    """Interleave candidates across NodePools, keeping each pool's own order (single-node, §1.4).

    Pools in `first_pools` (those a timed-out pass never reached) come first, in that order; the
    others follow in order of their first candidate.
    """
    by_pool: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        by_pool.setdefault(candidate.pool_name, []).append(candidate)
    order = [p for p in first_pools if p in by_pool] + [p for p in by_pool if p not in first_pools]
    out: list[Candidate] = []
    index = 0
    while len(out) < len(candidates):
        for pool in order:
            items = by_pool[pool]
            if index < len(items):
                out.append(items[index])
        index += 1
    return out
