"""Interruption, decided on a snapshot: what a reclaimed spot node's pods need, and whether a pool's
budgets allow a proactive rebalance replacement. Pure: the interruption poller (cluster/interruption.py)
builds the snapshot from the worker's informer cache and turns the answers into workflow inputs.

Spot replacements (Karpenter leaves these pods to its provisioner): the scheduling simulation places
the displaced pods, honouring their zone and node constraints (node selectors, affinity, topology
spread, the pool's requirements), on the cluster's other nodes first and on new NodeClaims for the
rest, with the interrupted offering marked unavailable in the catalog the caller passes, so a new
node is never planned where EC2 is reclaiming capacity. Each new node keeps the launch options the
simulation allows, cheapest first, minus the interrupted offering; a spot node falls back to
on-demand where its NodePool allows it. A static NodePool's node (`spec.replicas`) is replaced by one
node of its template instead, as Karpenter's static provisioning controller restores the count
(`static_replacement`).

Rebalance gate (`rebalance_block`): what a pass applies to a voluntary candidate, with the
window action Rebalance: MaintenanceWindows and the controller's pauses (the caller puts them in the
snapshot as windows, as a pass does), NodeDisruptionBudgets, and the pool's budgets for Drifted
(the same budget map as the planner's methods, planner/budgets.py, concurrency and rate: the caller
fills `Snapshot.recent_disruptions`), so "is this node disrupting" has one answer for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.constants import (
    CAPACITY_ON_DEMAND,
    CAPACITY_RESERVED,
    CAPACITY_SPOT,
    CAPACITY_TYPE_LABEL,
    REASON_DRIFTED,
)
from api.nodepool import NodePool
from planner.budgets import build_budget_map
from planner.candidates import make_candidate
from planner.catalog import Catalog
from planner.model import PlanContext, PlanOptions, Replacement, Simulate
from planner.operator_controls import ndb_ledger, window_block
from planner.plan import default_simulate
from planner.snapshot import Snapshot
from planner.static_drift import static_replica

# The MaintenanceWindow action of a proactive replacement (api/maintenance_window.py WINDOW_ACTIONS).
REBALANCE_ACTION = "Rebalance"

Offering = tuple[str, str, str]  # (instance type, zone, capacity type)


@dataclass(frozen=True)
class SpotReplacement:
    """A new node for displaced pods: its NodePool and the offerings to try, in order."""

    nodepool: str
    offerings: list[Offering]
    pods: int


def allowed_capacity_types(pool: NodePool) -> set[str]:
    """The capacity types the NodePool's requirements allow (Karpenter defaults to on-demand)."""
    allowed = {CAPACITY_SPOT, CAPACITY_ON_DEMAND}
    constrained = False
    for requirement in pool.spec.template.spec.requirements:
        if requirement.key != CAPACITY_TYPE_LABEL:
            continue
        constrained = True
        if requirement.operator == "In":
            allowed &= set(requirement.values)
        elif requirement.operator == "NotIn":
            allowed -= set(requirement.values)
        elif requirement.operator == "DoesNotExist":
            allowed = set()
    return allowed if constrained else {CAPACITY_ON_DEMAND}


def _offerings(
    replacement: Replacement, catalog: Catalog, capacity_type: str, reclaimed: Offering | None
) -> list[Offering]:
    out = []
    for kind in replacement.instance_types:
        for zone in replacement.zones or sorted({o.zone for o in kind.offerings}):
            offering = (kind.name, zone, capacity_type)
            known = catalog.get(kind.name)
            available = (
                known is not None and (o := known.offering(zone, capacity_type)) is not None and o.available
            )
            if offering != reclaimed and available:
                out.append(offering)
    return out


def spot_replacements(
    snapshot: Snapshot,
    catalog: Catalog,
    node_name: str,
    reclaimed: Offering | None = None,
    options: PlanOptions | None = None,
    simulate: Simulate | None = None,
) -> list[SpotReplacement]:
    """The new nodes the pods of `node_name` need once it is gone (none when they fit elsewhere).
    `catalog` should already mark `reclaimed` unavailable; it is also left out of the launch order."""
    node = snapshot.nodes.get(node_name)
    pool = snapshot.nodepools.get(node.nodepool or "") if node is not None else None
    simulate = simulate if simulate is not None else default_simulate()
    if node is None or pool is None or simulate is None:
        return []
    ctx = PlanContext(snapshot=snapshot, catalog=catalog, options=options or PlanOptions(), simulate=simulate)
    candidate = make_candidate(ctx, node, pool)
    if pool.spec.is_static:
        return static_replacement(ctx, pool, len(candidate.reschedulable_pods), reclaimed)
    if candidate.is_empty:
        return []
    out = []
    for replacement in simulate(ctx, [candidate]).new_nodes:
        if replacement.capacity_type == CAPACITY_RESERVED:
            # Reservations are counted by the controller's passes (planner/reservations.py), not
            # here: the interrupted node's pods go to on-demand capacity.
            replacement.capacity_type = CAPACITY_ON_DEMAND
        if (found := _spot_replacement(ctx, replacement, reclaimed, len(replacement.pods))) is not None:
            out.append(found)
    return out


def static_replacement(
    ctx: PlanContext, pool: NodePool, pods: int, reclaimed: Offering | None
) -> list[SpotReplacement]:
    """A static pool's interrupted node: one node of the pool's template, as Karpenter's static
    provisioning controller launches once the interrupted NodeClaim is deleting (pkg/controllers/
    static/provisioning/controller.go: while the pool is below its replicas, within `limits.nodes`),
    whether or not its pods need the room; never dynamic capacity, which a static pool does not take
    (planner/static_drift.py `static_replica`). None when the pool keeps its replicas without it or
    its node limit leaves no room while the interrupted node still counts."""
    replica, _ = static_replica(ctx, pool)
    if replica is None:
        return []
    found = _spot_replacement(ctx, replica, reclaimed, pods)
    return [found] if found is not None else []


def _spot_replacement(
    ctx: PlanContext, replacement: Replacement, reclaimed: Offering | None, pods: int
) -> SpotReplacement | None:
    """The replacement's offerings, the reclaimed one left out; a spot node falls back to on-demand
    where its NodePool allows it. None when nothing is offered."""
    catalog = ctx.catalog
    offerings = _offerings(replacement, catalog, replacement.capacity_type, reclaimed)
    target = ctx.snapshot.nodepools.get(replacement.nodepool)
    if (
        replacement.capacity_type == CAPACITY_SPOT
        and target
        and CAPACITY_ON_DEMAND in allowed_capacity_types(target)
    ):
        offerings += _offerings(replacement, catalog, CAPACITY_ON_DEMAND, reclaimed)
    return SpotReplacement(replacement.nodepool, offerings, pods) if offerings else None


def rebalance_budget(snapshot: Snapshot, node_name: str, reason: str = REASON_DRIFTED) -> tuple[bool, str]:
    """Whether the node's NodePool may start one more disruption for `reason` now, and why not. The
    planner's budget map: the same node counts, the same "disrupting" rule, budgets that fail to
    parse allow nothing."""
    node = snapshot.nodes.get(node_name)
    pool = node.nodepool if node is not None else None
    if pool is None or pool not in snapshot.nodepools:
        return False, f"node {node_name} has no NodePool in the snapshot"
    budget = build_budget_map(PlanContext(snapshot=snapshot, catalog=Catalog(region="", types={})), reason)
    if errors := budget.errors.get(pool):
        return False, f"NodePool {pool}: budgets unreadable ({'; '.join(errors)})"
    remaining = budget.remaining.get(pool, 0)
    if remaining <= 0:
        if pool in budget.rate_limited:
            return False, budget.rate_limited[pool](0)
        return False, (
            f"NodePool {pool} allows no more {reason} disruptions now "
            f"({budget.disrupting.get(pool, 0)} of {budget.total.get(pool, 0)} disrupting)"
        )
    return True, ""


def rebalance_block(snapshot: Snapshot, node_name: str, reason: str = REASON_DRIFTED) -> str | None:
    """Why the operator's controls forbid a proactive replacement of the node now (None: they allow
    it): a window or pause that blocks Rebalance on it, a NodeDisruptionBudget without room, or the
    pool's budgets for `reason` (concurrency and rate)."""
    node = snapshot.nodes.get(node_name)
    if node is None:
        return f"node {node_name} is not in the snapshot"
    ctx = PlanContext(snapshot=snapshot, catalog=Catalog(region="", types={}))
    if (block := window_block(ctx, node, REBALANCE_ACTION)) is not None:
        return block.message()
    if snapshot.node_disruption_budgets and (status := ndb_ledger(ctx).blocking([node_name])) is not None:
        return status.message()
    allowed, why = rebalance_budget(snapshot, node_name, reason)
    return None if allowed else why
