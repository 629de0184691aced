"""Node repair and NodePool deletion: forceful commands outside the budgeted loop, like expiration.

Repair (Karpenter v1.1+ NodeRepair): a managed node whose condition has been unhealthy for longer
than its toleration (`PlanOptions.repair_tolerations`: Ready False or Unknown 30 min; the AWS node
monitoring agent's AcceleratedHardwareReady 10 min, StorageReady, NetworkingReady, KernelReady,
ContainerRuntimeReady 30 min) is replaced: no budget, no do-not-disrupt at selection time. Never in a
NodePool where more than `repair_max_unhealthy` (20 %) of the nodes, rounded up as Karpenter's health
controller rounds (like a PDB's maxUnavailable: 1 of 3 or 4, 2 of 8), are unhealthy: then the cluster
is sick (a bad AMI, a network outage), not the node, and replacing nodes would only churn.

NodePool deletion (Karpenter's owner-reference cascade): the nodes of a NodePool that is being
deleted (deletionTimestamp set) are terminated gracefully, forcefully as a command. A node whose
NodePool is simply absent is left alone: a cache that has not seen the pool yet must not look like
a deletion (`karpflow` never decides on an unsynced cache, but a pool deleted before karpflow ever
saw it is indistinguishable from a typo'd label; Karpenter's NodeClaims would cascade those).

None of them plans a node that a command already holds (`karpenter.sh/disrupted`, which the controller
also shows on the nodes of running workflows): it is on its way out, and planning it again would
start a second command the moment the first closed and count its pods' capacity twice.

A MaintenanceWindow that blocks Repair holds an unhealthy node back until it allows
(docs/operator-controls.md). An initialized node annotated `karpenter.sh/do-not-repair: "true"`
(karpflow's own: Karpenter's repair RFC #3192 asks for a repair veto and leaves its shape open;
docs/karpenter-versions.md) is never repaired: the plan says so, and the taint refuses it too
(activities/guards.py).

Repair launches what the node's pods need first, with the same scheduling simulation as
expiration (one for all of a pass's repairs). NodePool deletion does not: its pods must land on the
other pools' nodes, not on a new node of the pool being deleted.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from api.constants import DO_NOT_REPAIR_ANNOTATION, REASON_NODEPOOL_DELETED, REASON_UNHEALTHY
from api.duration import format_duration
from planner.candidates import make_candidate
from planner.forceful_batch import batch_replacements
from planner.model import Command, DisruptionClass, PlanContext
from planner.operator_controls import window_block
from planner.snapshot import Node
from planner.static_drift import static_replica

REPAIR = "repair"
LIVENESS = "liveness"
# A node launched for a NodePool that has not become Ready and initialized within this long never
# will (Karpenter's registration/initialization TTL: 15 minutes); it is terminated.
LIVENESS_TTL = timedelta(minutes=15)
NODEPOOL_DELETION = "nodepool-deletion"


def unhealthy_since(node: Node, tolerations: dict[str, timedelta]) -> tuple[str, datetime | None] | None:
    """The first condition of the node that a toleration covers ("Ready=False") and since when."""
    for condition, (status, since) in sorted(node.conditions.items()):
        key = f"{condition}={status}"
        if key in tolerations:
            return key, since
    return None


def held(ctx: PlanContext, node: Node) -> bool:
    """Already on its way out: chosen earlier in this pass, or held by a command in flight."""
    return node.name in ctx.marked_for_deletion or node.has_disrupted_taint


def unhealthy_allowed(pool_size: int, share: float) -> int:
    """How many unhealthy nodes a pool of `pool_size` may have and still be repaired: the share of
    its nodes, rounded up."""
    return math.ceil(round(share * pool_size, 9))


def _static_replacement(ctx: PlanContext, command: Command) -> Command:
    candidate = command.candidates[0]
    if candidate.nodepool.spec.is_static:
        # A static pool's node is replaced by a node of its template, as Karpenter's static
        # provisioning controller restores the count (planner/static_drift.py `static_replica`).
        replica, _ = static_replica(ctx, candidate.nodepool)
        command.replacements = [replica] if replica is not None else []
    ctx.marked_for_deletion.add(candidate.name)
    return command


def repair_commands(ctx: PlanContext) -> list[Command]:
    tolerations = ctx.options.repair_tolerations
    if not tolerations:
        return []
    by_pool: dict[str, list[tuple[Node, str, datetime | None]]] = {}
    sizes: dict[str, int] = {}
    for node, pool in ctx.snapshot.live_managed_nodes():
        sizes[pool.name] = sizes.get(pool.name, 0) + 1
        found = unhealthy_since(node, tolerations)
        if found is not None:
            by_pool.setdefault(pool.name, []).append((node, *found))
    commands = []
    for pool_name, unhealthy in sorted(by_pool.items()):
        allowed = unhealthy_allowed(sizes[pool_name], ctx.options.repair_max_unhealthy)
        if len(unhealthy) > allowed:
            for node, key, _ in unhealthy:
                ctx.explain(
                    node.name,
                    REPAIR,
                    f"{key}, but {len(unhealthy)} of {sizes[pool_name]} nodes of NodePool {pool_name} are "
                    f"unhealthy (more than {allowed}: {ctx.options.repair_max_unhealthy:.0%} rounded up): "
                    "no repair",
                )
            continue
        for node, key, since in unhealthy:
            toleration = tolerations[key]
            if held(ctx, node) or (since is not None and ctx.now - since < toleration):
                continue
            if node.initialized and node.annotations.get(DO_NOT_REPAIR_ANNOTATION) == "true":
                ctx.explain(node.name, REPAIR, f"{key}, but annotated {DO_NOT_REPAIR_ANNOTATION}: no repair")
                continue
            if (block := window_block(ctx, node, "Repair")) is not None:
                ctx.explain(node.name, REPAIR, f"{key}, but {block.message()}")
                continue
            pool = ctx.snapshot.nodepools[pool_name]
            message = f"{key} since {since:%Y-%m-%dT%H:%M:%SZ}" if since else f"{key} (since unknown)"
            command = Command(
                method=REPAIR,
                reason=REASON_UNHEALTHY,
                candidates=[make_candidate(ctx, node, pool)],
                replacements=[],
                disruption_class=DisruptionClass.FORCEFUL,
                message=f"{message}, longer than its toleration {format_duration(toleration)}",
            )
            commands.append(_static_replacement(ctx, command))
    # The other nodes' pods: one simulation of all the pass's repairs, each command its own new nodes
    # (planner/forceful_batch.py), the expired nodes gone.
    simulated = [c for c in commands if not c.candidates[0].nodepool.spec.is_static]
    needed = batch_replacements(ctx, [c.candidates[0] for c in simulated])
    for command in simulated:
        command.replacements = needed.get(command.nodes[0], [])
    return commands


def nodepool_deletion_commands(ctx: PlanContext) -> list[Command]:
    commands = []
    for name in sorted(ctx.snapshot.nodes):
        node = ctx.snapshot.nodes[name]
        pool = ctx.snapshot.nodepools.get(node.nodepool or "")
        if pool is None or not pool.metadata.deletion_timestamp or node.is_deleting:
            continue
        if held(ctx, node):
            continue
        command = Command(
            method=NODEPOOL_DELETION,
            reason=REASON_NODEPOOL_DELETED,
            candidates=[make_candidate(ctx, node, pool)],
            replacements=[],
            disruption_class=DisruptionClass.FORCEFUL,
            message=f"NodePool {pool.name} is being deleted",
        )
        ctx.marked_for_deletion.add(name)
        commands.append(command)
    return commands


def liveness_commands(ctx: PlanContext) -> list[Command]:
    """Nodes of a NodePool that never became Ready and initialized within LIVENESS_TTL of creation."""
    commands = []
    for node, pool in ctx.snapshot.live_managed_nodes():
        if node.initialized or node.ready or held(ctx, node):
            continue
        created = node.creation_timestamp
        if created is None or ctx.now - created < LIVENESS_TTL:
            continue
        ctx.marked_for_deletion.add(node.name)
        commands.append(
            Command(
                method=LIVENESS,
                reason=REASON_UNHEALTHY,
                candidates=[make_candidate(ctx, node, pool)],
                replacements=[],
                disruption_class=DisruptionClass.FORCEFUL,
                message=f"not Ready and initialized {format_duration(ctx.now - created)} after launch "
                f"(limit {format_duration(LIVENESS_TTL)})",
            )
        )
    return commands
