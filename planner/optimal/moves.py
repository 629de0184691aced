"""From this pass's step to a command the simulation has checked.

The step's new nodes are added to the simulation as if they had already joined (`planned_nodes`:
the instance type's allocatable net of the DaemonSets that would run there, the NodePool's labels
and taints, the zone and capacity type). The simulation then removes the step's nodes *and every
other node the target removes* (their pods stay out of it: they move in a later pass) and places the
step's pods. So a pod is only ever planned onto a node that stays, and moves once. Every rule the
simulation knows is checked, topology spread and pod (anti-)affinity included, against the nodes
that will really be there. Pods the planned nodes cannot take (fragmentation the solver's pooled
view cannot see, or a topology rule) may open ordinary new NodeClaims, launched by the command too.

A command launches only the planned nodes pods landed on, each as its planned type (or one as big for
no more), in its planned zone, never a type one of its nodes already is for no less (Karpenter's
filterOutSameInstanceType). It must be strictly cheaper, worst case, than the nodes it removes, as
every consolidation command: the fleet's cost then falls with every command, so the moves cannot
cycle. When the check fails, half the step is tried, then a quarter.
"""

from __future__ import annotations

from collections.abc import Sequence

from api import constants as k
from api.constants import REASON_UNDERUTILIZED
from planner.model import Candidate, Command, DisruptionClass, PlanContext, Replacement
from planner.optimal.fleet import FleetProblem, LaunchOption
from planner.scheduling.adapter import SnapshotSimulation, launch_capacity_type
from planner.scheduling.inputs import SimNode
from planner.scheduling.state import vec_fits

# Planned nodes sort after real node names, so the simulation fills the room of existing nodes
# first (it tries existing nodes by name) and opens as few planned nodes as it can.
PLANNED_PREFIX = "~planned-"
# Pods the planned nodes cannot take may open at most this many ordinary new NodeClaims.
MAX_OVERFLOW_NODES = 2
HALVINGS = 2
# Instance types an overflow NodeClaim may launch as (the cheapest ones).
OVERFLOW_OPTIONS = 10


def planned_nodes(
    ctx: PlanContext, prepared: SnapshotSimulation, launches: Sequence[tuple[LaunchOption, str]]
) -> list[SimNode]:
    """The new nodes of a plan as simulation nodes (instance type, zone per node)."""
    sim = prepared.simulator
    pools = {p.pool.name: p for p in sim.pools}
    out = []
    for index, (option, zone) in enumerate(launches):
        pool = pools[option.pool]
        kind = sim.instance_types[option.instance_type]
        overhead = pool.overhead.get(kind.name, (0,) * len(sim.resource_names))
        allocatable = {
            name: max(kind.allocatable.get(name, 0) - overhead[i], 0)
            for i, name in enumerate(sim.resource_names)
        }
        name = f"{PLANNED_PREFIX}{index:03d}"
        labels = {
            **kind.labels,
            **pool.pool.labels,
            k.NODEPOOL_LABEL: option.pool,
            k.INSTANCE_TYPE_LABEL: kind.name,
            k.ZONE_LABEL: zone,
            k.CAPACITY_TYPE_LABEL: option.capacity_type,
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


def spread_zones(launches: dict[int, int], options: Sequence[LaunchOption]) -> list[tuple[LaunchOption, str]]:
    """One (option, zone) per new node, biggest first; nodes of an option take its equal-price zones in
    turn, so a zone spread is not defeated by putting every new node in the first zone."""
    out: list[tuple[LaunchOption, str]] = []
    for o in sorted(launches, key=lambda o: (tuple(-v for v in options[o].alloc), options[o].label)):
        option = options[o]
        out.extend((option, option.zones[i % len(option.zones)]) for i in range(launches[o]))
    return out


def step_command(
    ctx: PlanContext,
    problem: FleetProblem,
    method: str,
    remove: Sequence[Candidate],
    launches: dict[int, int],
    leaving_later: set[str],
) -> tuple[Command | None, str]:
    """The checked command for removing `remove` now with `launches`, or why there is none. Tries
    smaller prefixes of `remove` when the whole does not pass."""
    why = ""
    size = len(remove)
    for _ in range(HALVINGS + 1):
        if size == 0:
            break
        command, why = _try(
            ctx,
            problem,
            method,
            list(remove[:size]),
            launches,
            leaving_later | {c.name for c in remove[size:]},
        )
        if command is not None:
            return command, ""
        size //= 2
    return None, why


def _try(
    ctx: PlanContext,
    problem: FleetProblem,
    method: str,
    remove: list[Candidate],
    launches: dict[int, int],
    leaving_later: set[str],
) -> tuple[Command | None, str]:
    prepared = problem.prepared
    plan = spread_zones(launches, problem.options)
    virtual = SnapshotSimulation(
        ctx.snapshot,
        ctx.catalog,
        ctx.options.preference_policy,
        extra_nodes=planned_nodes(ctx, prepared, plan),
    )
    names = [c.name for c in remove]
    moving = virtual.pods_of(names)
    result = virtual.run(
        sorted({*names, *leaving_later}),
        moving,
        gone=ctx.marked_for_deletion,
        max_new_claims=MAX_OVERFLOW_NODES,
        stop_on_failure=True,
    )
    if not result.all_non_pending_scheduled:
        return (
            None,
            f"the simulation cannot place the pods on the planned fleet: {result.non_pending_errors()}",
        )
    by_key = {p.key: p for p in moving}
    on_planned: dict[str, list[str]] = {}
    placements: dict[str, str] = {}
    for pod in moving:
        target = result.placements.get(pod.key)
        if target is None:
            continue
        if target.startswith(PLANNED_PREFIX):
            on_planned.setdefault(target, []).append(pod.key)
        elif not any(c.name == target for c in result.new_claims):
            placements[pod.key] = target
    replacements = []
    for index, (option, zone) in enumerate(plan):
        keys = on_planned.get(f"{PLANNED_PREFIX}{index:03d}")
        if keys:
            pods = [by_key[key] for key in keys]
            replacements.append(_planned_replacement(problem, option, zone, pods))
    for claim in result.replacements:
        # The cheapest few options only: a claim may list every larger type, and the command's
        # guaranteed saving counts the dearest option it lists.
        options = [
            o.instance_type for o in claim.options if o.worst_price <= claim.options[0].worst_price * 1.25
        ]
        ct = launch_capacity_type(claim.capacity_types)
        replacements.append(virtual.replacement(claim, moving, options[:OVERFLOW_OPTIONS], capacity_type=ct))
    same = _relaunches_removed_type(remove, replacements)
    if same:
        return (
            None,
            f"the move would launch {same} again, as one of its nodes already is: keeping it is better",
        )
    command = Command(method, REASON_UNDERUTILIZED, remove, replacements, DisruptionClass.GRACEFUL)
    command.placements = placements
    if command.savings_per_hour <= 0:
        # Every move saves now, worst case, as every consolidation command: the fleet's cost falls
        # with each command, so moves (theirs and Karpenter's methods') can never cycle.
        return None, (
            f"the move is not cheaper: its nodes cost ${command.source_price:.4f}/h, its new nodes "
            f"up to ${command.replacement_worst_case_price:.4f}/h"
        )
    command.message = describe(command, len(leaving_later))
    return command, ""


def _relaunches_removed_type(remove: Sequence[Candidate], replacements: list[Replacement]) -> str | None:
    """Karpenter's filterOutSameInstanceType, for moves: a new node whose options include a type one
    of the removed nodes is, for no less than that node costs, is better not launched (keep the node).
    Options of a new node are trimmed to those cheaper; returns the type when none is left."""
    current: dict[str, float] = {}
    for c in remove:
        if c.instance_type_name and c.price is not None:
            current[c.instance_type_name] = min(current.get(c.instance_type_name, float("inf")), c.price)
    for r in replacements:
        ceiling = min((current[t.name] for t in r.instance_types if t.name in current), default=None)
        if ceiling is None:
            continue
        kept = [
            t
            for t in r.instance_types
            if (p := t.worst_case_price([r.capacity_type], r.zones)) is not None and p < ceiling
        ]
        if not kept:
            return r.instance_types[0].name
        r.instance_types = kept
    return None


def _planned_replacement(problem: FleetProblem, option: LaunchOption, zone: str, pods: list) -> Replacement:
    """The launch for one planned node: its planned type, or a type of its pool at least as big
    everywhere for no more in its zone and capacity type (cheapest first). Not a smaller one: the
    room left is for the pods of later moves."""
    sim = problem.prepared.simulator
    pool = next(p for p in sim.pools if p.pool.name == option.pool)
    planned = sim.instance_types[option.instance_type]
    planned_alloc = next(e.alloc for e in sim.pool_types(pool) if e.name == option.instance_type)
    ceiling = _price(planned, zone, option.capacity_type)
    fitting = []
    for entry in sim.pool_types(pool):
        kind = sim.instance_types[entry.name]
        price = _price(kind, zone, option.capacity_type)
        if price is None or ceiling is None or price > ceiling or not vec_fits(planned_alloc, entry.alloc):
            continue
        fitting.append((price, entry.name))
    names = [n for _, n in sorted(fitting)] or [option.instance_type]
    types = [t for n in names if (t := problem.prepared.catalog.get(n)) is not None]
    return Replacement(option.pool, types, option.capacity_type, [zone], pods)


def _price(kind: object, zone: str, capacity_type: str) -> float | None:
    for offering in kind.offerings:  # type: ignore[attr-defined]
        if offering.available and offering.zone == zone and offering.capacity_type == capacity_type:
            return offering.price
    return None


def describe(command: Command, later: int) -> str:
    if command.replacements:
        shapes = ", ".join(
            f"{r.capacity_type} {r.instance_type_names[0]} in {','.join(r.zones)}"
            for r in command.replacements
        )
        target = f"{len(command.replacements)} new node(s) ({shapes})"
    else:
        target = "pods fit on nodes the target keeps"
    tail = f"; {later} more node(s) leave in later moves" if later else ""
    return (
        f"{command.decision}: {len(command.candidates)} node(s) -> {target} "
        f"(saves ${command.savings_per_hour:.4f}/h{tail})"
    )


__all__ = ["MAX_OVERFLOW_NODES", "PLANNED_PREFIX", "planned_nodes", "spread_zones", "step_command"]
