"""Expiration: nodes older than their expireAfter are deleted, forcefully (§7.1, Karpenter v1).

No budget, no do-not-disrupt or PDB check at selection time, no replacement launched first, no
validation: capacity for the pods comes back through normal provisioning while the node drains (the
drain still honours PDBs and do-not-disrupt until the terminationGracePeriod). expireAfter defaults
to 720h; `Never` disables it. One command per node (method `expiration`, reason `Expired`).
Expiration runs before the other methods of a pass; its nodes then count as disrupting in budgets.
"""

from __future__ import annotations

from datetime import datetime

from api.constants import REASON_EXPIRED
from api.duration import format_duration
from planner.candidates import make_candidate, node_created, node_expire_after
from planner.model import EXPIRATION, Command, DisruptionClass, PlanContext


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
    for node, pool in ctx.snapshot.live_managed_nodes():
        when = expired_at(ctx, node.name)
        if when is None or ctx.now < when:
            continue
        expire_after = node_expire_after(node, pool)
        candidate = make_candidate(ctx, node, pool)
        commands.append(
            Command(
                method=EXPIRATION,
                reason=REASON_EXPIRED,
                candidates=[candidate],
                replacements=[],
                disruption_class=DisruptionClass.FORCEFUL,
                message=f"expired at {when:%Y-%m-%dT%H:%M:%SZ} (expireAfter {format_duration(expire_after)})",
            )
        )
    return commands
