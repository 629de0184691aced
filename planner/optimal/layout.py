"""The rest of a plan, checked by the simulation: every pod of every leaving node placed at once.

The solver's layout says, per group of pods, how many go to each staying node and to each new node
(planner/optimal/solver.py). Here it becomes concrete: the new nodes are added to the simulation as if
they had joined (`planned_nodes`: the instance type's allocatable net of the DaemonSets that would run
there, the NodePool's labels and taints, a zone, a capacity type), every leaving node is taken out, and
every pod they hold is placed, each preferring the node the layout gave it. The simulation places a
pod there only when every rule it knows allows it (resources, selectors, taints, topology spread, pod
(anti-)affinity, ports), and the usual way otherwise, opening at most MAX_OVERFLOW_NODES ordinary
new NodeClaims for pods nothing else takes. So each pod has one destination that stays: it moves
once, and the room a launched node keeps for later moves is the room those moves' pods were given.

`PlanCheck` is the answer: the new nodes with their pods, each pod's destination, and what the scope
costs once every move is done (new nodes at their worst-case price).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from api import constants as k
from planner.model import PlanContext
from planner.optimal.fleet import FleetProblem, LaunchOption
from planner.optimal.solver import Layout
from planner.scheduling.adapter import SnapshotSimulation
from planner.scheduling.inputs import SimNode
from planner.scheduling.results import NewNodeClaim
from planner.snapshot import Pod

# Planned nodes sort after real node names, so pods without a planned destination fill the room of
# existing nodes first (the simulation tries existing nodes by name).
PLANNED_PREFIX = "~planned-"
# Pods the planned nodes cannot take may open at most this many ordinary new NodeClaims.
MAX_OVERFLOW_NODES = 2
# Instance types an overflow NodeClaim may launch as (the cheapest ones, within 25 % of the cheapest).
OVERFLOW_OPTIONS = 10


@dataclass
class NewNode:
    """A node the plan launches: a planned one (its layout's type, in a zone) or an overflow claim."""

    name: str  # its name in the simulation: a planned node or a claim
    pool: str
    option: LaunchOption | None  # planned nodes
    zone: str | None  # planned nodes
    claim: NewNodeClaim | None  # overflow claims
    pods: list[Pod]
    worst_price: float


@dataclass
class PlanCheck:
    removals: list[str]
    new: list[NewNode]
    destination: dict[str, str]  # pod key -> staying node or new node name
    moving: dict[str, list[Pod]]  # leaving node -> its pods that move
    end_cost: float  # $/h of the movable scope once every move is done
    virtual: SnapshotSimulation

    def needs(self, node: str) -> set[int]:
        """The new nodes (indices in `new`) the pods of a leaving node go to."""
        names = {n.name: i for i, n in enumerate(self.new)}
        return {names[d] for p in self.moving.get(node, ()) if (d := self.destination.get(p.key)) in names}


def planned_name(index: int) -> str:
    return f"{PLANNED_PREFIX}{index:03d}"


def planned_nodes(
    ctx: PlanContext,
    prepared: SnapshotSimulation,
    launches: Sequence[tuple[str, LaunchOption | tuple[str, str, str], str]],
) -> list[SimNode]:
    """New nodes as simulation nodes: (name, launch option or (pool, type, capacity type), zone)."""
    sim = prepared.simulator
    pools = {p.pool.name: p for p in sim.pools}
    out = []
    for name, option, zone in launches:
        if isinstance(option, LaunchOption):
            pool_name, type_name, capacity_type = option.pool, option.instance_type, option.capacity_type
        else:
            pool_name, type_name, capacity_type = option
        pool = pools[pool_name]
        kind = sim.pool_instance_type(pool_name, type_name)
        overhead = pool.overhead.get(kind.name, (0,) * len(sim.resource_names))
        allocatable = {
            res: max(kind.allocatable.get(res, 0) - overhead[i], 0)
            for i, res in enumerate(sim.resource_names)
        }
        labels = {
            **kind.labels,
            **pool.pool.labels,
            k.NODEPOOL_LABEL: pool_name,
            k.INSTANCE_TYPE_LABEL: kind.name,
            k.ZONE_LABEL: zone,
            k.CAPACITY_TYPE_LABEL: capacity_type,
            k.REGION_LABEL: ctx.catalog.region,
            k.HOSTNAME_LABEL: name,
        }
        out.append(
            SimNode(
                name=name,
                labels=labels,
                allocatable=allocatable,
                capacity=dict(kind.capacity),
                taints=pool.pool.taints,
                initialized=True,
                managed=True,
            )
        )
    return out


def check_plan(
    ctx: PlanContext,
    problem: FleetProblem,
    removals: Sequence[str],
    layout: Layout | None,
    launches: dict[int, int],
) -> tuple[PlanCheck | None, str]:
    """Place every pod of `removals` on what stays plus the new nodes (the layout's, or without one
    the target's `launches`), each where the layout puts it when the rules allow. None and why when
    some pod has no place."""
    gone = set(removals)
    if layout is not None:
        news = [(o, counts) for o, counts in layout.new]
    else:
        news = [(o, {}) for o in sorted(launches) for _ in range(launches[o])]
    placed: list[tuple[str, LaunchOption, str]] = []
    turns: dict[int, int] = {}
    for index, (o, _) in enumerate(news):
        option = problem.options[o]
        turn = turns[o] = turns.get(o, -1) + 1
        # Nodes of one option take its equal-price zones in turn: a zone spread is not defeated.
        placed.append((planned_name(index), option, option.zones[turn % len(option.zones)]))
    virtual = SnapshotSimulation(
        ctx.snapshot,
        ctx.catalog,
        ctx.options.preference_policy,
        min_values_policy=ctx.options.min_values_policy,
        extra_nodes=planned_nodes(ctx, problem.prepared, placed),
    )
    moving = {name: virtual.pods_of([name]) for name in removals}
    prefer = _preferences(problem, removals, layout, [name for name, _, _ in placed]) if layout else {}
    pods = [p for name in removals for p in moving[name]]
    result = virtual.run(
        sorted(gone),
        pods,
        gone=ctx.marked_for_deletion,
        max_new_claims=MAX_OVERFLOW_NODES,
        stop_on_failure=True,
        prefer=prefer,
    )
    if not result.all_non_pending_scheduled:
        why = result.non_pending_errors()
        return None, f"the simulation cannot place the pods on the planned fleet: {why}"
    by_key = {p.key: p for p in pods}
    on: dict[str, list[Pod]] = {}
    for key, node in result.placements.items():
        if key in by_key:
            on.setdefault(node, []).append(by_key[key])
    new: list[NewNode] = []
    for name, option, zone in placed:
        if name in on:
            new.append(NewNode(name, option.pool, option, zone, None, on[name], option.price))
    destination = {key: node for key, node in result.placements.items() if key in by_key}
    for index, claim in enumerate(result.replacements):
        cheapest = claim.options[0].worst_price
        claim.options = tuple(o for o in claim.options if o.worst_price <= cheapest * 1.25)[:OVERFLOW_OPTIONS]
        # Named like planned nodes, so that a later check tries existing nodes first for other pods.
        name = f"{PLANNED_PREFIX}claim-{index}"
        pods = on.get(claim.name, [])
        destination.update((p.key, name) for p in pods)
        new.append(NewNode(name, claim.nodepool, None, None, claim, pods, claim.worst_price))
    kept = sum(r.price for r in problem.movable if r.name not in gone)
    end = kept + sum(n.worst_price for n in new)
    return PlanCheck(list(removals), new, destination, moving, end, virtual), ""


def _preferences(
    problem: FleetProblem, removals: Sequence[str], layout: Layout, planned: list[str]
) -> dict[str, str]:
    """Pod key -> the node the layout gives it. Pods of a group are alike in requests and placement
    rules, so they are dealt to the group's destinations in a fixed order."""
    out: dict[str, str] = {}
    for g in problem.groups:
        pods = [p for name in removals for p in sorted(g.per_node.get(name, ()), key=lambda p: p.key)]
        if not pods:
            continue
        slots = [name for name, counts in sorted(layout.rooms.items()) for _ in range(counts.get(g.index, 0))]
        for index, (_, counts) in enumerate(layout.new):
            slots.extend([planned[index]] * counts.get(g.index, 0))
        for pod, node in zip(pods, slots, strict=False):
            out[pod.key] = node
    return out


__all__ = ["MAX_OVERFLOW_NODES", "PLANNED_PREFIX", "NewNode", "PlanCheck", "check_plan", "planned_nodes"]
