"""Expiration: nodes older than their expireAfter are deleted, forcefully (§7.1, Karpenter v1).

No budget, no do-not-disrupt or PDB check at selection time, no validation. Karpenter leaves the
pods' capacity to its provisioner, so pods that fit nowhere else wait Pending while the node drains;
karpflow has no provisioner and does better: the scheduling simulation (the same as drift's) finds
the new nodes the pods need (one simulation for all of a pass's expired nodes, each command getting
the new nodes of its own pods: planner/forceful_batch.py), and the command launches them before the
drain (a forceful
DisruptionWorkflow terminates the node at its deadline even if they never come up). The drain still
honours PDBs and do-not-disrupt until the terminationGracePeriod. expireAfter defaults
to 720h; `Never` disables it. One command per node (method `expiration`, reason `Expired`).
Expiration runs before the other methods of a pass; its nodes then count as disrupting in budgets.
A MaintenanceWindow that blocks Expiration on an expired node holds it back (karpflow's soft
expiration, docs/operator-controls.md): it stays a candidate for the other methods, and the pass
marks it `karpflow.io/expiration-deferred`. Once the window allows, the nodes so marked do not all go
at once: they are paced by the NodePool's budgets that name no reason (reason Expired) and by the
NodeDisruptionBudgets selecting them, like a voluntary method (the lead's decision for issue 19). An
expired node no window ever deferred stays forceful, as in Karpenter v1.
A static NodePool's nodes expire too (Karpenter's expiration has no static case); the replacement is
one node of the pool's template, as its static provisioning controller would launch, within
`limits.nodes` (planner/static_drift.py `static_replica`).
"""

from __future__ import annotations

from datetime import datetime

from api.constants import EXPIRATION_DEFERRED_ANNOTATION, REASON_EXPIRED
from api.duration import format_duration
from api.nodepool import NodePool
from kube.times import rfc3339
from planner.budgets import BudgetError, allowed_disruptions, pool_counts
from planner.candidates import make_candidate, node_created, node_expire_after
from planner.forceful_batch import batch_replacements
from planner.model import EXPIRATION, Command, DisruptionClass, PlanContext
from planner.operator_controls import ndb_ledger, window_block
from planner.snapshot import Node
from planner.static_drift import static_replica


def expired_at(ctx: PlanContext, node_name: str) -> datetime | None:
    """When the node expires (or expired); None if it never does or is not managed."""
    node = ctx.snapshot.nodes[node_name]
    pool = ctx.snapshot.nodepools.get(node.nodepool or "")
    if pool is None and node.nodeclaim is None:
        return None
    expire_after = node_expire_after(node, pool)
    created = node_created(node)
    if expire_after is None or created is None:
        return None
    return created + expire_after


def expiration_commands(ctx: PlanContext) -> list[Command]:
    commands = []
    simulated: list[Command] = []  # their pods' new nodes come from one simulation of them all
    for node, pool in ctx.snapshot.live_managed_nodes():
        if node.has_disrupted_taint:  # a command in flight holds it already (planner/repair.py `held`)
            continue
        when = expired_at(ctx, node.name)
        if when is None or ctx.now < when:
            continue
        if (block := window_block(ctx, node, "Expiration")) is not None:
            # Soft expiration: the node stays a candidate and goes in the first pass the window allows.
            ctx.explain(node.name, EXPIRATION, f"expired at {rfc3339(when)}, but {block.message()}")
            ctx.deferred_expirations.add(node.name)
            continue
        if node.annotations.get(EXPIRATION_DEFERRED_ANNOTATION) and (why := _paced(ctx, node, pool)):
            ctx.explain(node.name, EXPIRATION, f"expired at {rfc3339(when)}, deferred by a window: {why}")
            continue
        expire_after = node_expire_after(node, pool)
        candidate = make_candidate(ctx, node, pool)
        message = f"expired at {when:%Y-%m-%dT%H:%M:%SZ} (expireAfter {format_duration(expire_after)})"
        replacements = []
        if pool.spec.is_static:
            # Karpenter's static provisioning controller restores the count (planner/static_drift.py).
            replica, why = static_replica(ctx, pool)
            replacements = [replica] if replica is not None else []
            message += "; its replica is launched first" if replica is not None else f"; {why}"
        ctx.marked_for_deletion.add(node.name)
        command = Command(
            method=EXPIRATION,
            reason=REASON_EXPIRED,
            candidates=[candidate],
            replacements=replacements,
            disruption_class=DisruptionClass.FORCEFUL,
            message=message,
        )
        commands.append(command)
        if not pool.spec.is_static:
            simulated.append(command)
    # All the pass's expired nodes go together: their pods' new nodes, each command its own
    # (planner/forceful_batch.py).
    needed = batch_replacements(ctx, [c.candidates[0] for c in simulated])
    for command in simulated:
        command.replacements = needed.get(command.nodes[0], [])
        if command.replacements:
            command.message += f"; {len(command.replacements)} replacement(s) for its pods are launched first"
    return commands


def _paced(ctx: PlanContext, node: Node, pool: NodePool) -> str | None:
    """Why an expiration a window deferred must wait now: its NodePool's budgets for Expired (those
    naming no reason) or a NodeDisruptionBudget selecting it has no room. None: it may go."""
    name = node.nodepool or ""
    total, in_flight, planned = pool_counts(ctx)
    errors = ctx.snapshot.budget_errors.get(name)
    try:
        allowed = (
            0 if errors else min(allowed_disruptions(pool, total[name], ctx.now, REASON_EXPIRED), total[name])
        )
    except BudgetError as err:
        errors, allowed = [str(err)], 0
    disrupting = in_flight[name] + planned[name]
    if errors or disrupting >= allowed:
        because = f"its budgets fail closed ({'; '.join(errors)})" if errors else f"{disrupting} disrupting"
        return f"nodepool {name} budget for {REASON_EXPIRED} allows {allowed} ({because})"
    if ctx.snapshot.node_disruption_budgets:
        status = ndb_ledger(ctx).blocking([node.name])
        if status is not None:
            return status.message()
    return None
