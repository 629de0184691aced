"""OptimalConsolidation: the Method that plans toward the cheapest fleet (planner/optimal/__init__.py).

It takes the consolidation candidates of NodePools whose strategy is Optimal (annotation
`karpflow.dev/consolidation-strategy: Optimal`, or `PlanOptions.consolidation_strategy` for all),
solves for the target fleet, solves this pass's step within the Underutilized budgets and PDB
allowances, checks it in the simulation and returns it as one ordinary command. When the solver finds
no cheaper fleet, or no step that passes, it returns nothing and Karpenter's multi- and single-node
methods, next in the pass, consolidate the same nodes their way.
"""

from __future__ import annotations

import functools

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from api.constants import REASON_UNDERUTILIZED
from api.karpflow_overrides import OPTIMAL_STRATEGY, read_overrides
from api.nodepool import NodePool
from planner.budgets import build_budget_map
from planner.candidates import build_candidates, consolidation_block, consolidation_policy_block
from planner.model import (
    CONSOLIDATION_OPTIMAL,
    OPTIMAL_CONSOLIDATION,
    BudgetMap,
    Candidate,
    Command,
    DisruptionClass,
    PlanContext,
    Replacement,
    ValidationResult,
)
from planner.optimal.fleet import FleetProblem, LaunchOption, build_problem
from planner.optimal.leaving import has_leaving_taint
from planner.optimal.moves import planned_nodes, step_command
from planner.optimal.solver import Step, TargetFleet, fluid_optimum, solve_step, solve_target
from planner.savings_threshold import below_floor, explain_skipped
from planner.scheduling.adapter import SnapshotSimulation, snapshot_simulation

# Share of the time limit the target gets; the step (a smaller program) has the rest.
TARGET_SHARE = 0.75


class Out(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class LaunchOut(Out):
    nodepool: str
    instance_type: str
    capacity_type: str
    zones: list[str]
    count: int
    price: float = Field(description="hourly price of one")


class TargetFleetOut(Out):
    """What `karpflow plan --strategy optimal` shows about the target of the Optimal NodePools."""

    nodes: int = Field(description="consolidation candidates of Optimal NodePools (the movable scope)")
    pods: int = Field(description="pods on them that may move")
    current_cost: float = Field(description="$/h the movable nodes cost now")
    target_cost: float = Field(description="$/h of the target: the nodes kept plus the new nodes")
    fluid_optimum: float | None = Field(description="$/h of the cheapest fractional fleet for their pods")
    keep: list[str]
    remove: list[str]
    launches: list[LaunchOut]
    status: str = Field(description="the solver's status for the target")
    target_seconds: float
    step_seconds: float = 0.0
    step_remove: list[str] = Field(default_factory=list, description="the target's removals started now")
    why_no_step: str = ""


@functools.lru_cache(maxsize=256)
def _strategy(annotations: tuple[tuple[str, str], ...]) -> str | None:
    return read_overrides(dict(annotations))[0].consolidation_strategy


def uses_optimal(ctx: PlanContext, pool: NodePool) -> bool:
    if ctx.options.consolidation_strategy is not None:
        return ctx.options.consolidation_strategy == OPTIMAL_STRATEGY
    own = tuple(sorted((k, v) for k, v in pool.metadata.annotations.items() if k.startswith("karpflow.dev/")))
    return _strategy(own) == OPTIMAL_STRATEGY


def optimal_pools(ctx: PlanContext) -> set[str]:
    return {name for name, pool in ctx.snapshot.nodepools.items() if uses_optimal(ctx, pool)}


class OptimalConsolidation:
    name = OPTIMAL_CONSOLIDATION
    reason = REASON_UNDERUTILIZED
    disruption_class = DisruptionClass.GRACEFUL
    consolidation_type = CONSOLIDATION_OPTIMAL

    def __init__(self) -> None:
        self.target: TargetFleet | None = None
        self.step: Step | None = None

    def should_disrupt(self, ctx: PlanContext, candidate: Candidate) -> bool:
        if not uses_optimal(ctx, candidate.nodepool):
            return False  # Karpenter's methods, next in the pass, handle it
        block = consolidation_block(ctx, candidate) or consolidation_policy_block(candidate)
        if block is not None:
            ctx.explain(candidate.name, self.name, block)
            return False
        return True

    def compute(self, ctx: PlanContext, candidates: list[Candidate], budgets: BudgetMap) -> list[Command]:
        self.target = self.step = None
        if not candidates:
            return []
        ctx.leaving = set()
        prepared = snapshot_simulation(ctx)
        problem = build_problem(ctx, prepared, candidates)
        limit = ctx.options.optimal_time_limit.total_seconds()
        self.target = target = solve_target(problem, limit * TARGET_SHARE)
        report = self._report(problem, target)
        ctx.outcomes[self.name] = report
        if not target.improved:
            why = (
                f"optimal: no cheaper fleet found (today ${target.cost:.4f}/h; solver: {target.status}); "
                "left to Karpenter's methods"
            )
            report.why_no_step = why
            for c in candidates:
                ctx.explain(c.name, self.name, why)
            return []
        ordered = {c.name: c for c in candidates}
        pdb_pods, pdb_allowed = _pdb_exposure(ctx, candidates)
        remaining = limit - target.seconds
        self.step = step = solve_step(
            problem,
            target,
            {pool: budgets.available(pool) for pool in {c.pool_name for c in candidates}},
            pdb_pods,
            pdb_allowed,
            ctx.options.spot_to_spot,
            max(remaining, limit * (1 - TARGET_SHARE)),
        )
        report.step_seconds = round(step.seconds, 3)
        leaving = set(target.remove)
        command, why = None, ""
        if step.remove:
            remove = [ordered[n] for n in ordered if n in set(step.remove)]  # disruption-cost order
            command, why = step_command(
                ctx, problem, self.name, remove, step.launches, leaving - set(step.remove)
            )
        else:
            why = _no_step_reason(budgets, candidates, leaving, step)
        if command is not None and (floor := below_floor(command)) is not None:
            explain_skipped(ctx, self.name, command, floor)
            command, why = None, floor
        if command is None:
            report.why_no_step = f"optimal: {why}"
            for c in candidates:
                if c.name in leaving:
                    ctx.explain(c.name, self.name, report.why_no_step)
            return []
        for c in command.candidates:
            budgets.take(c.pool_name)
        report.step_remove = command.nodes
        ctx.leaving = leaving - set(command.nodes)
        for c in candidates:
            if c.name in ctx.leaving:
                ctx.explain(
                    c.name, self.name, "optimal: leaves in a later move (tainted karpflow.io/leaving)"
                )
            elif c.name not in leaving:
                ctx.explain(c.name, self.name, "optimal: the target fleet keeps it")
        return [command]

    @staticmethod
    def _report(problem: FleetProblem, target: TargetFleet) -> TargetFleetOut:
        launches = [
            LaunchOut(
                nodepool=o.pool,
                instance_type=o.instance_type,
                capacity_type=o.capacity_type,
                zones=list(o.zones),
                count=n,
                price=o.price,
            )
            for o, n in ((problem.options[i], n) for i, n in sorted(target.launches.items()))
        ]
        return TargetFleetOut(
            nodes=len(problem.movable),
            pods=sum(g.count for g in problem.groups),
            current_cost=round(problem.current_cost, 6),
            target_cost=round(target.cost, 6),
            fluid_optimum=round(f, 6) if (f := fluid_optimum(problem)) is not None else None,
            keep=sorted(target.keep),
            remove=list(target.remove),
            launches=launches,
            status=target.status,
            target_seconds=round(target.seconds, 3),
        )

    def validate(self, ctx: PlanContext, command: Command) -> ValidationResult:
        return validate_optimal(ctx, command)


def _no_step_reason(budgets: BudgetMap, candidates: list[Candidate], leaving: set[str], step: Step) -> str:
    pools = sorted({c.pool_name for c in candidates if c.name in leaving})
    spent = [p for p in pools if budgets.available(p) <= 0]
    if spent:
        return budgets.exhausted_message(spent[0])
    if not step.remove:
        return f"no removal of the target can start now (solver: {step.status})"
    return f"the best step now would not save (${step.saving:.4f}/h)"


def _pdb_exposure(
    ctx: PlanContext, candidates: list[Candidate]
) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Per node, the pods of each PDB it would evict; per PDB, the evictions it allows now."""
    per_node: dict[str, dict[str, int]] = {}
    allowed: dict[str, int] = {}
    if not ctx.snapshot.pdbs:
        return per_node, allowed
    for c in candidates:
        counts: dict[str, int] = {}
        for pod in c.reschedulable_pods:
            for pdb in ctx.snapshot.pdbs_for(pod):
                counts[pdb.key] = counts.get(pdb.key, 0) + 1
                allowed[pdb.key] = pdb.disruptions_allowed
        if counts:
            per_node[c.name] = counts
    return per_node, allowed


def validate_optimal(ctx: PlanContext, command: Command) -> ValidationResult:
    """The command on the fresh snapshot: every node still a candidate of an Optimal pool, within the
    budget, and its pods still placed by the simulation on the nodes that stay plus its planned new
    nodes (each as its first instance type and zone), with nodes tainted karpflow.io/leaving out, and
    still strictly cheaper and above the savings floor."""
    candidates, blocked = build_candidates(ctx)
    fresh = {c.name: c for c in candidates}
    why_blocked = {b.node: b.reason for b in blocked}
    kept: list[Candidate] = []
    for name in command.nodes:
        candidate = fresh.get(name)
        if candidate is None:
            reason = why_blocked.get(name, "it is gone or no longer managed")
            return ValidationResult(False, None, f"churn: {name} is no longer a candidate ({reason})")
        block = (
            candidate.pod_block
            or consolidation_block(ctx, candidate)
            or consolidation_policy_block(candidate)
        )
        if block is None and not uses_optimal(ctx, candidate.nodepool):
            block = f"nodepool {candidate.pool_name} no longer uses the Optimal strategy"
        if block is not None:
            return ValidationResult(False, None, f"churn: {name}: {block}")
        kept.append(candidate)
    budgets = build_budget_map(ctx, REASON_UNDERUTILIZED)
    for candidate in kept:
        if not budgets.take(candidate.pool_name):
            return ValidationResult(False, None, f"budget: {budgets.exhausted_message(candidate.pool_name)}")
    prepared = snapshot_simulation(ctx)
    launches = []
    for r in command.replacements:
        if not r.instance_types or not r.zones:
            return ValidationResult(False, None, "scheduling: a replacement has no instance type or zone")
        launches.append(_as_option(r))
    virtual = SnapshotSimulation(
        ctx.snapshot,
        ctx.catalog,
        ctx.options.preference_policy,
        extra_nodes=planned_nodes(ctx, prepared, launches),
    )
    names = [c.name for c in kept]
    later = {n for n, node in ctx.snapshot.nodes.items() if has_leaving_taint(node.taints)} - set(names)
    result = virtual.run(
        sorted({*names, *later}),
        virtual.pods_of(names),
        gone=ctx.marked_for_deletion,
        max_new_claims=0,
        stop_on_failure=True,
    )
    if not result.all_non_pending_scheduled:
        return ValidationResult(False, None, f"scheduling: {result.non_pending_errors()}")
    rebuilt = Command(
        command.method, command.reason, kept, command.replacements, command.disruption_class, command.message
    )
    rebuilt.placements = command.placements
    floor = below_floor(rebuilt)
    if floor is not None:
        return ValidationResult(False, None, floor)
    return ValidationResult(True, rebuilt)


def _as_option(r: Replacement) -> tuple[LaunchOption, str]:
    """A planned replacement as the launch option `planned_nodes` adds: its first type and zone."""
    option = LaunchOption(
        r.nodepool, r.instance_types[0].name, r.capacity_type, (r.zones[0],), 0.0, (), frozenset()
    )
    return option, r.zones[0]


__all__ = ["OptimalConsolidation", "TargetFleetOut", "optimal_pools", "uses_optimal", "validate_optimal"]
