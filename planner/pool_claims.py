"""A NodePool's NodeClaims that have no Node yet (launched, not registered): Karpenter counts them
with the pool's nodes, for `limits` (planner/limits.py) and for a static pool's count
(planner/static_drift.py). The snapshot links a NodeClaim to its Node by node name or providerID."""

from __future__ import annotations

from planner.snapshot import NodeClaim, Snapshot


def claims_without_node(snapshot: Snapshot, pool_name: str) -> list[NodeClaim]:
    linked = {node.nodeclaim.name for node in snapshot.nodes.values() if node.nodeclaim is not None}
    return [
        claim
        for claim in snapshot.nodeclaims.values()
        if claim.nodepool == pool_name and claim.name not in linked and claim.name not in snapshot.nodes
    ]
