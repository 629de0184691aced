"""From this pass's step to a command the simulation has checked.

The step (planner/optimal/solver.py) picks leaving nodes to remove now and the new nodes of the
checked plan (planner/optimal/layout.py) their pods go to. The command is checked again on its own:
the step's new nodes are added to the simulation, the step's nodes *and every other leaving node* are
taken out (their pods move in later moves), and the step's pods are placed, each preferring the node
the plan gave it, with no other new node allowed. A pod is thus only ever planned onto a node that
stays, and moves once.

A planned new node launches as its planned type, or a type of its NodePool at least as big in every
resource for no more in its zone and capacity type (never a smaller one: the room left is for the
pods of later moves); an overflow claim as its cheapest few options. A move need not save on its own:
the plan's ledger, checked by the step, keeps the plan as a whole from ever costing more than it has
saved (planner/optimal/held.py), and the whole plan must clear the pools' savings floor.
"""

from __future__ import annotations

from collections.abc import Sequence

from api.constants import REASON_UNDERUTILIZED
from planner.model import Candidate, Command, DisruptionClass, PlanContext, Replacement
from planner.optimal.fleet import FleetProblem, LaunchOption
from planner.optimal.layout import NewNode, PlanCheck, planned_nodes
from planner.scheduling.adapter import SnapshotSimulation, launch_capacity_type
from planner.scheduling.inputs import SimInstanceType
from planner.scheduling.state import vec_fits
from planner.snapshot import Pod


def new_node_replacement(
    problem: FleetProblem, check: PlanCheck, node: NewNode, pods: list[Pod]
) -> Replacement:
    if node.option is not None:
        assert node.zone is not None
        return _planned_replacement(problem, node.option, node.zone, pods)
    claim = node.claim
    assert claim is not None
    return check.virtual.replacement(
        claim, pods, list(claim.instance_types), capacity_type=launch_capacity_type(claim.capacity_types)
    )


def step_command(
    ctx: PlanContext,
    problem: FleetProblem,
    check: PlanCheck,
    method: str,
    remove: Sequence[Candidate],
    launches: Sequence[int],
    leaving_later: set[str],
    annotations: dict[str, str],
) -> tuple[Command | None, str]:
    """The checked command for removing `remove` now, launching the plan's new nodes `launches`."""
    names = [c.name for c in remove]
    step_pods = [p for n in names for p in check.moving.get(n, ())]
    new = [check.new[i] for i in launches]
    sim_nodes: list[tuple[str, LaunchOption | tuple[str, str, str], str]] = []
    for node in new:
        if node.option is not None:
            assert node.zone is not None
            sim_nodes.append((node.name, node.option, node.zone))
        else:
            claim = node.claim
            assert claim is not None
            ct = launch_capacity_type(claim.capacity_types)
            sim_nodes.append((node.name, (claim.nodepool, claim.instance_types[0], ct), claim.zones[0]))
    virtual = SnapshotSimulation(
        ctx.snapshot,
        ctx.catalog,
        ctx.options.preference_policy,
        min_values_policy=ctx.options.min_values_policy,
        extra_nodes=planned_nodes(ctx, problem.prepared, sim_nodes),
    )
    prefer = {p.key: check.destination[p.key] for p in step_pods if p.key in check.destination}
    result = virtual.run(
        sorted({*names, *leaving_later}),
        step_pods,
        gone=ctx.marked_for_deletion,
        max_new_claims=0,
        stop_on_failure=True,
        prefer=prefer,
    )
    if not result.all_non_pending_scheduled:
        return None, f"the simulation cannot place the move's pods: {result.non_pending_errors()}"
    by_key = {p.key: p for p in step_pods}
    on_new: dict[str, list[Pod]] = {}
    placements: dict[str, str] = {}
    new_names = {n.name for n in new}
    for pod in step_pods:
        target = result.placements.get(pod.key)
        if target is None:
            continue
        if target in new_names:
            on_new.setdefault(target, []).append(by_key[pod.key])
        else:
            placements[pod.key] = target
    replacements = []
    for node in new:
        if node.name in on_new:
            replacement = new_node_replacement(problem, check, node, on_new[node.name])
            replacement.annotations = dict(annotations)
            replacements.append(replacement)
    command = Command(method, REASON_UNDERUTILIZED, list(remove), replacements, DisruptionClass.GRACEFUL)
    command.placements = placements
    command.message = describe(command, len(leaving_later))
    return command, ""


def _planned_replacement(
    problem: FleetProblem, option: LaunchOption, zone: str, pods: list[Pod]
) -> Replacement:
    """The launch for one planned node: its planned type, or a type of its pool at least as big
    everywhere for no more in its zone and capacity type (cheapest first). Not a smaller one: the
    room left is for the pods of later moves."""
    sim = problem.prepared.simulator
    pool = next(p for p in sim.pools if p.pool.name == option.pool)
    planned = sim.pool_instance_type(option.pool, option.instance_type)
    planned_alloc = next(e.alloc for e in sim.pool_types(pool) if e.name == option.instance_type)
    ceiling = _price(planned, zone, option.capacity_type)
    fitting = []
    for entry in sim.pool_types(pool):
        kind = sim.pool_instance_type(option.pool, entry.name)
        price = _price(kind, zone, option.capacity_type)
        if price is None or ceiling is None or price > ceiling or not vec_fits(planned_alloc, entry.alloc):
            continue
        fitting.append((price, entry.name))
    names = [n for _, n in sorted(fitting)] or [option.instance_type]
    catalog = problem.prepared.catalog.for_pool(option.pool)
    types = [t for n in names if (t := catalog.get(n)) is not None]
    return Replacement(option.pool, types, option.capacity_type, [zone], pods)


def _price(kind: SimInstanceType, zone: str, capacity_type: str) -> float | None:
    for offering in kind.offerings:
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
        target = "pods fit on nodes that stay"
    tail = f"; {later} more node(s) leave in later moves" if later else ""
    return (
        f"{command.decision}: {len(command.candidates)} node(s) -> {target} "
        f"(saves ${command.savings_per_hour:.4f}/h now{tail})"
    )


__all__ = ["describe", "new_node_replacement", "step_command"]
