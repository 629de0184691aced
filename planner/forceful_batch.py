"""The replacements of a pass's forceful commands (expiration, repair), from one simulation.

Each expired or unhealthy node is its own command, and the command launches what its pods need
before the drain. Simulating the nodes one at a time, each with the ones before it gone, made a pass
pay a simulation per node, and each of them more than the last (the earlier nodes' pods are placed
again as background): at 20,000 nodes, 400 expired nodes were 60 % of a pass (issue 34).

Here all the nodes of the batch are removed together and their pods placed in one simulation, with
each node's new NodeClaims kept apart (`ctx.claims_per_node`: a pod joins only a claim opened for its
own node's pods), so every command still launches the nodes its own pods need, and no other
command's. Room on existing nodes is shared by the one simulation, so it is never promised twice:
pods that fit there only one at a time get it one at a time, and the others get new nodes. Unlike the
node-by-node way, no pod is planned onto another node of the batch (it goes too), and the pods of
all the batch's nodes take existing room in the simulation's order (largest first), not node by node.

Where the answer cannot be split by node (a simulation that does not keep claims apart, such as a
test's fake, put several nodes' pods on one new node), those nodes fall back to one simulation each,
in order: the batch's other nodes gone, except the fallback nodes not simulated yet, which are closed
(they keep their pods and take none), as planner/drift_batch.py does.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.model import Candidate, PlanContext, Replacement, SchedulingResult


def batch_replacements(ctx: PlanContext, candidates: Sequence[Candidate]) -> dict[str, list[Replacement]]:
    """Node name -> the new nodes its pods need, for `candidates` removed together (the nodes this
    pass already marked gone as well). Empty candidates need none and are not simulated."""
    movers = [c for c in candidates if not c.is_empty]
    if not movers or ctx.simulate is None:
        return {}
    ctx.claims_per_node = True
    try:
        result = ctx.simulate(ctx, movers)
    finally:
        ctx.claims_per_node = False
    if len(movers) == 1:
        return {movers[0].name: list(result.new_nodes)}
    owned, unsplit = _split(result, {c.name for c in movers})
    out: dict[str, list[Replacement]] = {c.name: owned.get(c.name, []) for c in movers}
    fallback = [c for c in movers if c.name in unsplit]
    if fallback:
        out.update(_one_by_one(ctx, fallback, {c.name for c in movers}))
    return out


def _split(result: SchedulingResult, names: set[str]) -> tuple[dict[str, list[Replacement]], set[str]]:
    """Each node's own new nodes, and the nodes whose pods share a new node with another's (all of
    them when a new node holds no node's pods: nothing says whose it is)."""
    owned: dict[str, list[Replacement]] = {}
    unsplit: set[str] = set()
    owners = result.new_node_owners
    for i, replacement in enumerate(result.new_nodes):
        sources = {p.node_name for p in replacement.pods if p.node_name in names}
        owner = owners[i] if len(owners) == len(result.new_nodes) else None
        if owner is not None and owner in names and sources <= {owner}:
            owned.setdefault(owner, []).append(replacement)
        elif len(sources) == 1:
            owned.setdefault(sources.pop(), []).append(replacement)
        else:
            unsplit |= sources or names
    return owned, unsplit


def _one_by_one(
    ctx: PlanContext, members: Sequence[Candidate], batch: set[str]
) -> dict[str, list[Replacement]]:
    """The node-by-node way for `members`, in order (see the module's docstring)."""
    assert ctx.simulate is not None
    marked, closed = set(ctx.marked_for_deletion), ctx.closed_nodes
    waiting = [c.name for c in members]
    out: dict[str, list[Replacement]] = {}
    try:
        for i, candidate in enumerate(members):
            later = frozenset(waiting[i + 1 :])
            ctx.marked_for_deletion.clear()
            ctx.marked_for_deletion.update((marked | batch) - later - {candidate.name})
            ctx.closed_nodes = closed | later
            out[candidate.name] = ctx.simulate(ctx, [candidate]).new_nodes
    finally:
        ctx.marked_for_deletion.clear()
        ctx.marked_for_deletion.update(marked)
        ctx.closed_nodes = closed
    return out
