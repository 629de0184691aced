"""OptimalConsolidation: the Method that plans toward the cheapest fleet (planner/optimal/__init__.py).

It takes the consolidation candidates of NodePools whose strategy is Optimal (annotation
`karpflow.dev/consolidation-strategy: Optimal`, or `PlanOptions.consolidation_strategy` for all),
except pools with consolidationPolicy Balanced: those are always consolidated by Karpenter's
methods, where each move is scored (`uses_optimal`).

Without a plan held on the nodes, it solves the target fleet, lays it out node by node, checks the
whole of it in the simulation, and starts a plan when that saves: its leaving nodes get the plan's
marker and the `karpflow.io/leaving` taint, and its first move is returned. With a plan held
(planner/optimal/held.py), it waits while a move of the plan is in flight, else re-solves the launches
the rest of the plan needs (its removals are fixed), checks the rest again, and returns the next move
within the Underutilized budgets, the PDBs' allowances and the plan's ledger. A plan whose rest no
longer fits or saves, or whose leaving node can no longer move, is dropped; a plan with nothing left
to remove is done. Either way its markers and taints go, and the pass goes on as if there was none.

When no plan saves, or no first move passes, the method returns nothing and Karpenter's multi- and
single-node methods, next in the pass, consolidate the pools their way. While a plan is held they
leave its NodePools to it, so the two never undo each other's moves.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from api.constants import CAPACITY_SPOT, REASON_UNDERUTILIZED
from api.karpflow_overrides import OPTIMAL_STRATEGY, read_overrides
from api.nodepool import NodePool
from planner.budgets import build_budget_map
from planner.candidates import build_candidates, consolidation_block, consolidation_policy_block
from planner.limits import limits_block
from planner.model import (
    CONSOLIDATION_OPTIMAL,
    OPTIMAL_CONSOLIDATION,
    BudgetMap,
    Candidate,
    Command,
    DisruptionClass,
    PlanContext,
    ValidationResult,
)
from planner.optimal.fleet import FleetProblem, build_problem
from planner.optimal.held import (
    LAUNCHED,
    LEAVING,
    PLAN_ANNOTATION,
    HeldPlan,
    PlanMarker,
    marker_changes,
    plan_id,
    read_plans,
)
from planner.optimal.layout import PlanCheck, check_plan, planned_nodes
from planner.optimal.leaving import has_leaving_taint
from planner.optimal.moves import new_node_replacement, step_command
from planner.optimal.solver import (
    Step,
    StepNode,
    TargetFleet,
    churn_per_pod,
    fluid_optimum,
    solve_layout,
    solve_step,
    solve_target,
)
from planner.savings_threshold import below_floor
from planner.scheduling.adapter import SnapshotSimulation, launch_capacity_type, snapshot_simulation

# Shares of the time limit: the target, then its layout; the step (a small program) has the rest.
TARGET_SHARE = 0.4
LAYOUT_SHARE = 0.45
# HiGHS's status when it stopped at its time limit.
TIME_LIMIT = "Time limit reached"
# A plan must save at least this much once done ($/h), on top of the pools' savings floor.
MIN_PLAN_SAVING = 0.001
# When the step's command does not pass its check, the budget is halved and the step solved again.
HALVINGS = 2


class Out(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class LaunchOut(Out):
    nodepool: str
    instance_type: str
    capacity_type: str
    zones: list[str]
    count: int
    price: float = Field(description="hourly price of one")


class PlanOut(Out):
    """The plan held across passes (planner/optimal/held.py)."""

    id: str
    state: str = Field(description="started, continued, waiting (a move in flight), done or dropped")
    since: str
    start_cost: float = Field(description="$/h of the Optimal scope when the plan started")
    target_cost: float = Field(description="$/h the scope should cost once the plan is done")
    ledger: float = Field(description="$/h the plan has added so far (negative: saved); never above 0")
    leaving: list[str] = Field(default_factory=list, description="nodes it still removes")
    launched: list[str] = Field(
        default_factory=list, description="nodes it launched (their room kept for its later moves)"
    )
    why: str = ""


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
    layout_seconds: float = 0.0
    step_seconds: float = 0.0
    step_remove: list[str] = Field(default_factory=list, description="the target's removals started now")
    why_no_step: str = ""
    plan: PlanOut | None = None
    ended: str = Field(default="", description="the plan that ended this pass: its id, done or why dropped")


@functools.lru_cache(maxsize=256)
def _strategy(annotations: tuple[tuple[str, str], ...]) -> str | None:
    return read_overrides(dict(annotations))[0].consolidation_strategy


def uses_optimal(ctx: PlanContext, pool: NodePool) -> bool:
    if pool.spec.disruption.consolidation_policy == "Balanced":
        # A plan's moves are chosen for the fleet they lead to, not one by one, and a step that
        # launches first saves nothing alone: Karpenter's per-move score has no honest meaning here.
        # Balanced pools stay with Karpenter's methods, which score every move (planner/balanced.py).
        return False
    if ctx.options.consolidation_strategy is not None:
        return ctx.options.consolidation_strategy == OPTIMAL_STRATEGY
    own = tuple(sorted((k, v) for k, v in pool.metadata.annotations.items() if k.startswith("karpflow.dev/")))
    return _strategy(own) == OPTIMAL_STRATEGY


def optimal_pools(ctx: PlanContext) -> set[str]:
    return {name for name, pool in ctx.snapshot.nodepools.items() if uses_optimal(ctx, pool)}


def held_plan(ctx: PlanContext) -> tuple[HeldPlan | None, list[str]]:
    """The plan the nodes of Optimal pools hold, and the nodes whose markers must go."""
    return read_plans(ctx.snapshot, optimal_pools(ctx))


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
        hold, stale = held_plan(ctx)
        if not candidates and hold is None:
            ctx.plan_markers = marker_changes(ctx.snapshot, {}, stale)
            return []
        pass_ = _Pass(ctx, candidates, budgets, hold, stale)
        commands = pass_.run()
        self.target, self.step = pass_.target, pass_.step
        return commands

    def validate(self, ctx: PlanContext, command: Command) -> ValidationResult:
        return validate_optimal(ctx, command)


class _Pass:
    """One pass of the method: the held plan carried on, or a new one started."""

    def __init__(
        self,
        ctx: PlanContext,
        candidates: list[Candidate],
        budgets: BudgetMap,
        hold: HeldPlan | None,
        stale: list[str],
    ) -> None:
        self.ctx = ctx
        self.candidates = candidates
        self.budgets = budgets
        self.hold = hold
        self.stale = list(stale)
        self.limit = ctx.options.optimal_time_limit.total_seconds()
        self.target: TargetFleet | None = None
        self.step: Step | None = None
        self.report: TargetFleetOut | None = None

    # -- the pass --------------------------------------------------------------------------------

    def run(self) -> list[Command]:
        ctx, hold = self.ctx, self.hold
        if hold is not None and hold.busy:
            return self._wait(hold)
        prepared = snapshot_simulation(ctx)
        problem = build_problem(ctx, prepared, self.candidates)
        ctx.optimal_churn = churn_per_pod(problem, ctx.options.optimal_churn_share)
        ended = ""
        if hold is not None:
            commands, dropped = self._carry_on(problem, hold)
            if commands is not None:
                return commands
            # Done or dropped: its markers and taints go, and a new plan may start at once.
            ended = f"plan {hold.id} " + (f"dropped: {dropped}" if dropped else "done")
            self.stale.extend(hold.nodes)
            self.hold = None
        commands = self._start(problem, ended)
        if self.report is not None:
            self.report.ended = ended
        return commands

    def _wait(self, hold: HeldPlan) -> list[Command]:
        """A move of the plan is in flight: its new nodes may not have joined yet, so the next move
        waits for it (it would otherwise plan without the room they bring)."""
        ctx = self.ctx
        ctx.optimal_plan = hold
        ctx.leaving = set(hold.leaving)
        ctx.plan_markers = marker_changes(ctx.snapshot, {}, self.stale)
        why = f"optimal: plan {hold.id} waits for its move in flight ({', '.join(sorted(hold.busy))})"
        report = self._plan_report(hold, "waiting", hold.marker.target_cost, why)
        self.report = TargetFleetOut(
            nodes=len(self.candidates),
            pods=sum(len(c.reschedulable_pods) for c in self.candidates),
            current_cost=round(sum(c.price or 0.0 for c in self.candidates), 6),
            target_cost=hold.marker.target_cost,
            fluid_optimum=None,
            keep=[],
            remove=list(hold.leaving),
            launches=[],
            status="held",
            target_seconds=0.0,
            why_no_step=why,
            plan=report,
        )
        ctx.outcomes[OPTIMAL_CONSOLIDATION] = self.report
        for c in self.candidates:
            ctx.explain(c.name, OPTIMAL_CONSOLIDATION, why)
        return []

    def _carry_on(self, problem: FleetProblem, hold: HeldPlan) -> tuple[list[Command] | None, str]:
        """The next move of the held plan, or [] while it waits for budgets; (None, why) when it is done
        (why empty) or must be dropped."""
        ctx = self.ctx
        if not hold.leaving:
            return None, ""
        movable = {r.name for r in problem.movable}
        blocked = [n for n in hold.leaving if n not in movable]
        if blocked:
            return None, f"{blocked[0]} can no longer move ({self._why_not_candidate(blocked[0])})"
        age = ctx.now - hold.marker.since
        if age > ctx.options.optimal_plan_max_age:
            return None, f"not done after {age}, more than optimal_plan_max_age allows"
        ledger = hold.ledger(ctx.snapshot, ctx.catalog)
        self.target = target = solve_target(problem, self.limit * TARGET_SHARE, hold.leaving)
        self.report = self._report(problem, target)
        # The new nodes it planned first: the kube-scheduler, not the plan, placed the pods of its
        # earlier moves, and a fresh solve would buy small nodes around them where the planned large
        # ones still hold the rest (small ones fragment further with every move).
        check, why = None, ""
        planned = _options(problem, hold.still_to_launch(ctx.snapshot))
        if planned is not None:
            began = time.perf_counter()
            layout = solve_layout(problem, hold.leaving, planned, self.limit * LAYOUT_SHARE / 2)
            self.report.layout_seconds = round(time.perf_counter() - began, 3)
            check, why = check_plan(ctx, problem, hold.leaving, layout, planned)
            if check is not None and len(check.new) > sum(planned.values()):
                check = None  # the planned nodes no longer hold the rest
        if check is None:
            if not target.found:
                # Out of time (a loaded machine), not out of options: the plan waits for the next pass.
                why = f"no launches found in time ({target.status})"
                self._keep(hold.marker, set(hold.leaving), "waiting", why, ledger)
                return [], why
            layout = solve_layout(
                problem, hold.leaving, target.launches, self.limit * LAYOUT_SHARE / 2, target
            )
            self.report.layout_seconds = round(
                self.report.layout_seconds + (layout.seconds if layout else 0), 3
            )
            check, why = check_plan(ctx, problem, hold.leaving, layout, target.launches)
        if check is None:
            return None, why
        leaving = set(hold.leaving)
        rest = sum(n.worst_price for n in check.new)
        rest -= sum(r.price for r in problem.movable if r.name in leaving)
        if ledger + rest > -MIN_PLAN_SAVING:
            return None, f"the rest no longer saves (so far ${ledger:+.4f}/h, the rest ${rest:+.4f}/h)"
        self.report.target_cost = round(check.end_cost, 6)
        return self._move(problem, check, hold.marker, ledger, "continued")

    def _start(self, problem: FleetProblem, ended: str) -> list[Command]:
        """A new plan, when its whole checked layout saves and its first move passes."""
        ctx = self.ctx
        churn = ctx.optimal_churn or 0.0
        self.target = target = solve_target(problem, self.limit * TARGET_SHARE, churn=churn)
        self.report = report = self._report(problem, target)
        ctx.outcomes[OPTIMAL_CONSOLIDATION] = report
        prefix = f"optimal: {ended}; " if ended else "optimal: "
        if not target.improved:
            return self._nothing(
                f"{prefix}no cheaper fleet found (today ${target.cost:.4f}/h; solver: {target.status}); "
                "left to Karpenter's methods",
                self.candidates,
            )
        guide = target
        began = time.perf_counter()
        if not target.exact:
            # Pooled room overstates fragmented nodes: the launches again, with room node by node.
            fixed = solve_target(problem, self.limit * LAYOUT_SHARE / 2, target.remove)
            guide = fixed if fixed.found else target
        launches = guide.launches
        layout = solve_layout(problem, target.remove, launches, self.limit * LAYOUT_SHARE / 2, guide)
        report.layout_seconds = round(time.perf_counter() - began, 3)
        check, why = check_plan(ctx, problem, target.remove, layout, launches)
        if check is None:
            return self._nothing(f"{prefix}{why}", self.candidates)
        saving = problem.current_cost - check.end_cost
        report.target_cost = round(check.end_cost, 6)
        if saving < MIN_PLAN_SAVING:
            return self._nothing(
                f"{prefix}the target, placed pod by pod, saves ${saving:.4f}/h only; "
                "left to Karpenter's methods",
                self.candidates,
            )
        floor = below_floor(_whole(problem, check, ctx, target.remove))
        if floor is not None:
            return self._nothing(f"{prefix}the plan as a whole: {floor}", self.candidates)
        leaving_cost = sum(r.price for r in problem.movable if r.name in set(target.remove))
        launch_keys = []
        for node in check.new:
            if node.option is not None:
                launch_keys.append(f"{node.pool}/{node.option.instance_type}/{node.option.capacity_type}")
            elif node.claim is not None:
                ct = launch_capacity_type(node.claim.capacity_types)
                launch_keys.append(f"{node.pool}/{node.claim.instance_types[0]}/{ct}")
        marker = PlanMarker(
            id=plan_id(ctx.now, target.remove),
            role=LEAVING,
            since=ctx.now,
            start_cost=round(problem.current_cost, 6),
            leaving_cost=round(leaving_cost, 6),
            target_cost=round(check.end_cost, 6),
            launches=sorted(launch_keys),
        )
        pools = {
            r.candidate.pool_name for r in problem.movable if r.candidate and r.name in set(target.remove)
        }
        self.hold = HeldPlan(marker, leaving=list(target.remove), pools=pools)
        # The first move saves on its own: a plan that got lost before its markers were written
        # (a failed pass) has then still only made the cluster cheaper.
        commands, why = self._move(problem, check, marker, 0.0, "started", margin=MIN_PLAN_SAVING)
        if not commands:
            self.hold = None
            return self._nothing(f"{prefix}no first move: {why}", self.candidates)
        return commands

    def _move(
        self,
        problem: FleetProblem,
        check: PlanCheck,
        marker: PlanMarker,
        ledger: float,
        state: str,
        margin: float = 0.0,
    ) -> tuple[list[Command] | None, str]:
        """This pass's move of the plan. ([command], "") or ([], why) when it waits for budgets, or
        (None, why) when the plan cannot go on."""
        ctx, hold = self.ctx, self.hold
        assert hold is not None and self.report is not None
        by_name = {c.name: c for c in self.candidates}
        leaving = [n for n in hold.leaving if n in by_name]
        pdb_pods, pdb_allowed = _pdb_exposure(ctx, [by_name[n] for n in leaving])
        nodes = [
            StepNode(
                name=n,
                price=by_name[n].price or 0.0,
                pool=by_name[n].pool_name,
                spot=by_name[n].capacity_type == CAPACITY_SPOT,
                needs=check.needs(n),
                pdb_pods=pdb_pods.get(n, {}),
            )
            for n in leaving
        ]
        pools = {n.pool for n in nodes}
        available = {pool: self.budgets.available(pool) for pool in pools}
        prices = [n.worst_price for n in check.new]
        command, why = None, ""
        for _ in range(HALVINGS + 1):
            if not any(available.values()):
                why = why or self.budgets.exhausted_message(sorted(pools)[0])
                break
            step = solve_step(
                nodes,
                prices,
                available,
                pdb_allowed,
                ledger + margin,
                ctx.options.spot_to_spot,
                self.limit * (1 - TARGET_SHARE - LAYOUT_SHARE),
            )
            self.step = step
            self.report.step_seconds = round(self.report.step_seconds + step.seconds, 3)
            if not step.remove:
                why = f"no move of the plan fits the budgets, PDBs and its ledger now (solver: {step.status})"
                if step.status == TIME_LIMIT and state != "started":
                    # Out of time, not out of moves: the plan waits for the next pass.
                    self._keep(marker, set(hold.leaving), "waiting", why, ledger)
                    return [], why
                break
            remove = [by_name[n] for n in by_name if n in set(step.remove)]  # disruption-cost order
            later = set(hold.leaving) - set(step.remove)
            annotations = {PLAN_ANNOTATION: marker.with_role(LAUNCHED).as_value()}
            command, why = step_command(
                ctx, problem, check, OPTIMAL_CONSOLIDATION, remove, step.launches, later, annotations
            )
            if command is not None and ledger + margin - command.savings_per_hour > 1e-6:
                # Its launches came out dearer than planned (an overflow claim's options).
                why = f"the move would cost ${-command.savings_per_hour:.4f}/h more than the plan saved"
                command = None
            if command is not None and (beyond := limits_refusal(ctx, command)) is not None:
                # The launches the plan counts on no longer fit: drop it (a new plan, solved within
                # today's limits, may start in the same pass), rather than creep on with smaller moves.
                return None, beyond
            if command is not None:
                break
            available = {pool: n // 2 for pool, n in available.items()}
        if command is None:
            spent = not any(self.budgets.available(p) for p in pools)
            if spent and state != "started":
                # Budgets are spent (a window, other disruptions): the plan waits, its room kept.
                self._keep(marker, set(hold.leaving), "waiting", why, ledger)
                return [], why
            return None, why
        for c in command.candidates:
            self.budgets.take(c.pool_name)
        self.report.step_remove = command.nodes
        later = set(hold.leaving) - set(command.nodes)
        self._keep(marker, set(hold.leaving), state, "", ledger - command.savings_per_hour)
        ctx.leaving = later
        for c in self.candidates:
            if c.name in later:
                ctx.explain(
                    c.name, OPTIMAL_CONSOLIDATION, f"optimal: leaves in a later move of plan {marker.id}"
                )
            elif c.name not in set(hold.leaving):
                ctx.explain(c.name, OPTIMAL_CONSOLIDATION, f"optimal: plan {marker.id} keeps it")
        return [command], ""

    # -- state of the plan for the controller ------------------------------------------------------

    def _keep(self, marker: PlanMarker, leaving: set[str], state: str, why: str, ledger: float) -> None:
        """The plan stays held: markers on its leaving and launched nodes, taints on its leaving ones."""
        ctx, hold = self.ctx, self.hold
        assert hold is not None and self.report is not None
        wanted = {n: marker.with_role(LEAVING) for n in leaving}
        wanted.update({n: marker.with_role(LAUNCHED) for n in hold.launched})
        ctx.plan_markers = marker_changes(ctx.snapshot, wanted, self.stale)
        ctx.optimal_plan = hold
        ctx.leaving = set(leaving)
        self.report.plan = self._plan_report(hold, state, marker.target_cost, why, ledger)
        self.report.why_no_step = f"optimal: {why}" if why else ""
        ctx.outcomes[OPTIMAL_CONSOLIDATION] = self.report

    def _nothing(self, why: str, candidates: Sequence[Candidate]) -> list[Command]:
        """No plan: markers and leaving taints go; Karpenter's methods have the pools."""
        ctx = self.ctx
        ctx.optimal_plan = None
        ctx.leaving = set()
        ctx.plan_markers = marker_changes(ctx.snapshot, {}, self.stale)
        if self.report is not None:
            self.report.why_no_step = why
            ctx.outcomes[OPTIMAL_CONSOLIDATION] = self.report
        for c in candidates:
            ctx.explain(c.name, OPTIMAL_CONSOLIDATION, why)
        return []

    def _why_not_candidate(self, name: str) -> str:
        node = self.ctx.snapshot.nodes.get(name)
        if node is None:
            return "it is gone"
        for method, text in self.ctx.explanations.get(name, []):
            if method == OPTIMAL_CONSOLIDATION:
                return text
        return "it is not a consolidation candidate now"

    def _plan_report(
        self, hold: HeldPlan, state: str, target_cost: float, why: str, ledger: float | None = None
    ) -> PlanOut:
        if ledger is None:
            ledger = hold.ledger(self.ctx.snapshot, self.ctx.catalog)
        return PlanOut(
            id=hold.id,
            state=state,
            since=hold.marker.since.isoformat(),
            start_cost=hold.marker.start_cost,
            target_cost=target_cost,
            ledger=round(ledger, 6),
            leaving=sorted(hold.leaving),
            launched=sorted(hold.launched),
            why=why,
        )

    def _report(self, problem: FleetProblem, target: TargetFleet) -> TargetFleetOut:
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


def _options(problem: FleetProblem, keys: Counter[str]) -> dict[int, int] | None:
    """Planned new nodes ("pool/type/capacity type" counts) as launch option counts; None when one is
    no longer an option (the catalog or the NodePool changed) or none is left."""
    if not keys:
        return None
    index: dict[str, int] = {}
    for o, option in enumerate(problem.options):
        index.setdefault(f"{option.pool}/{option.instance_type}/{option.capacity_type}", o)
    out: dict[int, int] = {}
    for key, count in keys.items():
        at = index.get(key)
        if at is None:
            return None
        out[at] = out.get(at, 0) + count
    return out


def _whole(problem: FleetProblem, check: PlanCheck, ctx: PlanContext, removals: Sequence[str]) -> Command:
    """The whole plan as one command, to judge it against the savings floor."""
    by_name = {r.name: r.candidate for r in problem.movable}
    candidates = [c for n in removals if (c := by_name.get(n)) is not None]
    replacements = [new_node_replacement(problem, check, n, n.pods) for n in check.new]
    return Command(OPTIMAL_CONSOLIDATION, REASON_UNDERUTILIZED, candidates, replacements)


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


def limits_refusal(ctx: PlanContext, command: Command) -> str | None:
    """Why the limits check every method's commands pass (planner/limits.py) would refuse this move:
    checked here too, so a held plan whose move it refuses is dropped with that reason (its markers
    and leaving taints go, its pools go back to Karpenter's methods) rather than held, moveless, until
    it is too old. A pool's limits may shrink, or other launches fill them, after the plan started."""
    why = limits_block(ctx, command)
    return f"the limits check refuses its move: {why}" if why is not None else None


def validate_optimal(ctx: PlanContext, command: Command) -> ValidationResult:
    """The command on the fresh snapshot: every node still a candidate of an Optimal pool, within the
    budget, its pods still placed by the simulation on the nodes that stay plus its new nodes (each as
    its first instance type and zone; each pod preferring where it was planned), with nodes tainted
    karpflow.io/leaving out, and the plan's ledger still <= 0 after it."""
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
    for index, r in enumerate(command.replacements):
        if not r.instance_types or not r.zones:
            return ValidationResult(False, None, "scheduling: a replacement has no instance type or zone")
        name = f"~planned-{index:03d}"
        launches.append((name, (r.nodepool, r.instance_types[0].name, r.capacity_type), r.zones[0]))
    virtual = SnapshotSimulation(
        ctx.snapshot,
        ctx.catalog,
        ctx.options.preference_policy,
        min_values_policy=ctx.options.min_values_policy,
        extra_nodes=planned_nodes(ctx, prepared, launches),
    )
    names = [c.name for c in kept]
    later = {n for n, node in ctx.snapshot.nodes.items() if has_leaving_taint(node.taints)} - set(names)
    # Each pod prefers where the move planned it, as when it was planned.
    prefer = dict(command.placements)
    for (name, _, _), r in zip(launches, command.replacements, strict=True):
        prefer.update((p.key, name) for p in r.pods)
    result = virtual.run(
        sorted({*names, *later}),
        virtual.pods_of(names),
        gone=ctx.marked_for_deletion,
        max_new_claims=0,
        stop_on_failure=True,
        prefer=prefer,
    )
    if not result.all_non_pending_scheduled:
        return ValidationResult(False, None, f"scheduling: {result.non_pending_errors()}")
    rebuilt = Command(
        command.method, command.reason, kept, command.replacements, command.disruption_class, command.message
    )
    rebuilt.placements = command.placements
    hold, _ = held_plan(ctx)
    ledger = hold.ledger(ctx.snapshot, ctx.catalog) if hold is not None else 0.0
    if ledger - rebuilt.savings_per_hour > 1e-6:
        return ValidationResult(
            False,
            None,
            f"ledger: the move would leave the plan ${ledger - rebuilt.savings_per_hour:.4f}/h dearer "
            "than it found the cluster",
        )
    return ValidationResult(True, rebuilt)


__all__ = [
    "OptimalConsolidation",
    "PlanOut",
    "TargetFleetOut",
    "held_plan",
    "optimal_pools",
    "uses_optimal",
    "validate_optimal",
]
