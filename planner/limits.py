"""NodePool `spec.limits` (cpu, memory, ..., and `nodes`, Karpenter v1.11) bound every replacement.

Karpenter computes the room as its scheduler does for a disruption's simulation
(pkg/controllers/disruption/helpers.go `SimulateScheduling`: the candidates are left out of the state
nodes, so their own capacity is freed first; nodes already deleting are not counted either), then
pkg/controllers/provisioning/scheduling/scheduler.go: `remainingResources` starts at the pool's
limits, `updateRemainingResources` subtracts each remaining node's capacity (with `nodes: 1`,
state/statenode.go `Capacity`), a new NodeClaim needs `nodes` left and only instance types within
what is left (`filterByRemainingResources`), and reserves the largest of its options (`subtractMax`).

The default methods get this from the scheduling simulation (planner/scheduling/new_nodes.py,
`nodes` counted since v1.11). This module is the same rule applied to a command after it is made,
in one place for every method, so the Optimal strategy (planner/optimal/, whose planned nodes are
added to the simulation outside its limits) is bound too, and replacements of earlier commands of
the pass take their room (`ctx.memo`). karpflow deliberately counts a new node as one `nodes` within
a pass too (Karpenter's instance types carry no `nodes` capacity, so within one scheduling pass only
an exhausted limit stops it; its launch then fails the limit check at creation, provisioner.go).

StaticDrift is not checked here: Karpenter's StaticDrift reserves `limits.nodes` on its own
(planner/static_drift.py), with the leaving node still counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from api.nodepool import NodePool
from planner.model import Candidate, Command, PlanContext, Replacement
from planner.pool_claims import claims_without_node
from planner.scheduling.inputs import NODES_RESOURCE, InputError, resources_from

_RESERVED = "limits.reserved"


def pool_limits(pool: NodePool) -> dict[str, int]:
    """The pool's limits in the simulation's units (cpu in millicores); an unreadable one is 0."""
    out: dict[str, int] = {}
    for name, value in pool.spec.limits.items():
        try:
            out.update(resources_from({name: value}, f"NodePool {pool.name} spec.limits"))
        except InputError:
            out[name] = 0  # api/nodepool_reader.py reported it; nothing launches into the pool
    return out


def _replacement_capacity(replacement: Replacement) -> dict[str, int]:
    """The largest capacity among the replacement's options, per resource (Karpenter's subtractMax)."""
    out: dict[str, int] = {NODES_RESOURCE: 1}
    for it in replacement.instance_types:
        for name, value in it.capacity_resources.by_name().items():
            out[name] = max(out.get(name, 0), value)
    return out


def _used(ctx: PlanContext, pool_name: str, leaving: Iterable[str]) -> dict[str, int]:
    """Capacity of the pool's nodes that stay (not deleting, not leaving in this pass or command) and
    of its NodeClaims that have no node yet, with one `nodes` each."""
    gone = set(leaving) | ctx.marked_for_deletion
    used: dict[str, int] = {}

    def add(resources: dict[str, int]) -> None:
        for name, value in resources.items():
            used[name] = used.get(name, 0) + value
        used[NODES_RESOURCE] = used.get(NODES_RESOURCE, 0) + 1

    for node in ctx.snapshot.nodes.values():
        if node.nodepool != pool_name or node.is_deleting or node.name in gone:
            continue
        add(node.capacity.by_name())
    for claim in claims_without_node(ctx.snapshot, pool_name):
        if claim.deletion_timestamp is not None:
            continue
        it = ctx.catalog.for_pool(pool_name).get(claim.labels.get("node.kubernetes.io/instance-type"))
        add(it.capacity_resources.by_name() if it is not None else {})
    return used


def limits_block(ctx: PlanContext, command: Command) -> str | None:
    """Why the command's replacements do not fit their pools' limits (None: they do)."""
    reserved: dict[str, dict[str, int]] = ctx.memo.get(_RESERVED, {})
    by_pool: dict[str, list[Replacement]] = {}
    for replacement in command.replacements:
        by_pool.setdefault(replacement.nodepool, []).append(replacement)
    for pool_name, replacements in sorted(by_pool.items()):
        pool = ctx.snapshot.nodepools.get(pool_name)
        limits = pool_limits(pool) if pool is not None else {}
        if not limits:
            continue
        used = _used(ctx, pool_name, command.nodes)
        for name, value in reserved.get(pool_name, {}).items():
            used[name] = used.get(name, 0) + value
        for replacement in replacements:
            for name, value in _replacement_capacity(replacement).items():
                used[name] = used.get(name, 0) + value
        for name, limit in sorted(limits.items()):
            if used.get(name, 0) > limit:
                return (
                    f"its {len(replacements)} replacement(s) would exceed nodepool {pool_name}'s "
                    f"spec.limits.{name} ({_show(name, used.get(name, 0))} of {_show(name, limit)}, "
                    "the leaving nodes' own capacity freed first)"
                )
    return None


def reserve(ctx: PlanContext, command: Command) -> None:
    """Count the command's replacements against their pools' limits for the rest of the pass."""
    reserved: dict[str, dict[str, int]] = ctx.memo.setdefault(_RESERVED, {})
    for replacement in command.replacements:
        pool = reserved.setdefault(replacement.nodepool, {})
        for name, value in _replacement_capacity(replacement).items():
            pool[name] = pool.get(name, 0) + value


def within_limits(ctx: PlanContext, method: str, commands: list[Command]) -> list[Command]:
    """The commands whose replacements fit their pools' limits, each reserving its room; the others
    are explained on their nodes and dropped."""
    kept = []
    for command in commands:
        why = limits_block(ctx, command)
        if why is not None:
            for node in command.nodes:
                ctx.explain(node, method, why)
            continue
        reserve(ctx, command)
        kept.append(command)
    return kept


def _show(name: str, value: int) -> str:
    if name == "cpu":
        return f"{value / 1000:g}"
    if name in ("memory", "ephemeral-storage"):
        return f"{value / 2**30:.1f}Gi"
    return str(value)


# --- The Optimal strategy's target (planner/optimal/solver.py `solve_target`) -----------------------


@dataclass(frozen=True)
class PoolLimit:
    """One row of the target program: for `pool` and `resource`, the kept movable nodes' capacity plus
    the new nodes' stays within `bound` (the limit minus the capacity of the pool's nodes outside the
    movable scope). `launches_only`: the pool is over its limit already, so no new node may go there
    (keeping every node must stay a feasible answer)."""

    pool: str
    resource: str
    bound: float
    nodes: dict[str, float]  # movable node -> its capacity in `resource`
    options: dict[int, float]  # launch option index -> its instance type's capacity in `resource`
    launches_only: bool = False


def pool_limit_rows(
    ctx: PlanContext, movable: Sequence[Candidate], options: Sequence[tuple[str, str]]
) -> list[PoolLimit]:
    """The limit rows for a target over `movable` nodes and launch `options` ((pool, instance type)
    by index), one per limited pool and resource."""
    pools = {pool for pool, _ in options} | {c.pool_name for c in movable}
    movable_names = [c.name for c in movable]
    rows = []
    for pool_name in sorted(pools):
        pool = ctx.snapshot.nodepools.get(pool_name)
        limits = pool_limits(pool) if pool is not None else {}
        if not limits:
            continue
        fixed = _used(ctx, pool_name, movable_names)
        node_caps = {
            c.name: {**c.node.capacity.by_name(), NODES_RESOURCE: 1}
            for c in movable
            if c.pool_name == pool_name
        }
        option_caps: dict[int, dict[str, int]] = {}
        for o, (option_pool, type_name) in enumerate(options):
            it = ctx.catalog.for_pool(option_pool).get(type_name)
            if option_pool == pool_name and it is not None:
                option_caps[o] = {**it.capacity_resources.by_name(), NODES_RESOURCE: 1}
        for name, limit in sorted(limits.items()):
            nodes = {n: float(cap.get(name, 0)) for n, cap in node_caps.items()}
            bound = float(limit - fixed.get(name, 0))
            rows.append(
                PoolLimit(
                    pool_name,
                    name,
                    bound,
                    nodes,
                    {o: float(cap.get(name, 0)) for o, cap in option_caps.items()},
                    launches_only=bound < sum(nodes.values()),
                )
            )
    return rows
