"""Which existing nodes host CapacityBuffer pods (planner/capacity_buffers.py), and the emptiness
rule on them: Karpenter's Emptiness skips a node with buffer pods (disruption/emptiness.go
`ShouldDisrupt`, "Node ... has buffer pods"). Karpenter remembers where its last provisioning pass
placed them; karpflow places them the same way, once per pass: a simulation that moves nothing, the
buffer pods among the pending pods."""

from __future__ import annotations

from planner.capacity_buffers import buffer_pods
from planner.model import PlanContext
from planner.scheduling.adapter import snapshot_simulation

_HOSTS = "buffer_hosts"


def buffer_hosts(ctx: PlanContext) -> tuple[dict[str, int], list[str]]:
    """Existing nodes hosting buffer pods (name -> count) where the provisioner would place them
    now, and the buffers that fail closed. Computed once per pass; nothing when there is no buffer."""
    cached: tuple[dict[str, int], list[str]] | None = ctx.memo.get(_HOSTS)
    if cached is not None:
        return dict(cached[0]), list(cached[1])
    hosts: dict[str, int] = {}
    pods, unresolved = buffer_pods(ctx.snapshot)
    if pods:
        prepared = snapshot_simulation(ctx)
        result = prepared.run([], [], gone=ctx.marked_for_deletion)
        claims = {c.name for c in result.new_claims}
        for pod in pods:
            target = result.placements.get(pod.key)
            if target is not None and target not in claims:
                hosts[target] = hosts.get(target, 0) + 1
    ctx.memo[_HOSTS] = (hosts, unresolved)
    return dict(hosts), list(unresolved)


def buffer_block(ctx: PlanContext, node: str) -> str | None:
    """Why an empty node is not emptied for CapacityBuffers (None: nothing of theirs keeps it)."""
    if not ctx.snapshot.capacity_buffers:
        return None
    hosts, unresolved = buffer_hosts(ctx)
    if node in hosts:
        return f"node {node} has buffer pods ({hosts[node]} of a CapacityBuffer)"
    if unresolved:
        return f"a CapacityBuffer's pods could be on it (failing closed): {'; '.join(unresolved)}"
    return None
