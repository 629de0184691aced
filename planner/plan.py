"""One planning pass: `plan(snapshot, catalog, options) -> Plan`.

The order of a pass (behaviour notes §1.1, §1.2, §7.1):
1. Expiration (forceful, outside the budgeted loop): every node past its expireAfter gets a command;
   those nodes then count as disrupting and are not candidates for anything else.
2. Candidates are built once (filters, pod blocks, disruption cost, Consolidatable time).
3. Methods in order: emptiness, static drift (static NodePools, planner/static_drift.py), drift,
   multi-node consolidation, single-node consolidation. Each gets
   the candidates its class allows and `should_disrupt` accepts, in disruption-cost order, and a fresh
   budget map for its reason. The first method that returns commands ends the pass, unless
   `options.all_methods` (then every method runs, and nodes chosen by one are in flight for the next).
4. Every managed node not in a command is reported with the reason it was left alone.

The result is a pydantic `Plan` (what `karpflow plan --output json` prints and what an activity
returns to the controller workflow). The rich `Command` objects stay available as `plan.commands_`.
Budgets are reported twice: `budgetsAtStart` (allowed when the pass starts, before any command,
expiration included) and `budgets` (still allowed after all of this plan's commands: what the next
pass could start), with the node counts behind them in `budgetNodes`. A command's `savingsPerHour` is
the guaranteed saving (replacements at their worst-case price, as the decision is made);
`savingsPerHourBest` assumes each replacement launches as its cheapest option.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from pydantic.alias_generators import to_camel

from api.constants import EXPIRATION_DEFERRED_ANNOTATION
from api.rollout_io import DriftRollout
from api.rollout_policy import ROLLOUT_POLICY_ANNOTATION
from kube.times import rfc3339
from planner.budgets import budget_problems, budget_report, build_budget_map, pool_counts
from planner.candidates import build_candidates, make_candidate, sort_by_disruption_cost
from planner.catalog import Catalog
from planner.drift import (
    VOLUNTARY_DISRUPTION_ANNOTATION,
    Drift,
    drifted_by_pool,
    voluntary_disruption_markers,
)
from planner.emptiness import Emptiness
from planner.expiration import expiration_commands
from planner.health_breaker import with_health_breaker
from planner.limits import reserve as reserve_limits
from planner.limits import within_limits
from planner.model import (
    DRIFT,
    EMPTINESS,
    EXPIRATION,
    MULTI_NODE_CONSOLIDATION,
    OPTIMAL_CONSOLIDATION,
    SINGLE_NODE_CONSOLIDATION,
    Blocked,
    Candidate,
    Command,
    DisruptionClass,
    Method,
    PlanContext,
    PlanOptions,
    Replacement,
    Simulate,
    ValidationResult,
)
from planner.node_disruption_budgets import NdbLedger
from planner.node_overlay import overlays_behind
from planner.operator_controls import admit, ndb_ledger, voluntary_block
from planner.optimal.held import LAUNCHED, PLAN_ANNOTATION, marker_changes, read_marker
from planner.optimal.leaving import TaintChange, leaving_taint_changes
from planner.optimal.method import OptimalConsolidation, TargetFleetOut, held_plan, optimal_pools
from planner.pass_cache import PassCache
from planner.repair import (
    LIVENESS,
    NODEPOOL_DELETION,
    REPAIR,
    liveness_commands,
    nodepool_deletion_commands,
    repair_commands,
)
from planner.reservations import restore_reserved, take_reservations, within_reservations
from planner.rollout_holds import drift_rollouts, pool_policy
from planner.savings_threshold import floor_problems
from planner.scheduling.min_values import MIN_VALUES_RELAXED_ANNOTATION
from planner.snapshot import Snapshot
from planner.static_drift import STATIC_DRIFT, StaticDrift


class _Out(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class ReplacementOut(_Out):
    nodepool: str
    instance_types: list[str]
    capacity_type: str
    zones: list[str]
    price: float | None = Field(
        description="hourly price of the cheapest option (what the launch should cost)"
    )
    worst_case_price: float | None = Field(
        default=None, description="hourly price of the most expensive option (what the launch could cost)"
    )
    pods: int = 0
    reservation_ids: list[str] = Field(
        default_factory=list,
        description="a reserved replacement: the capacity reservations it may launch into",
    )
    pod_keys: list[str] = Field(
        default_factory=list,
        description="Optimal moves: the pods planned onto this new node (the validation places them there)",
    )
    min_values_relaxed: bool = Field(
        default=False,
        description="MinValuesPolicy BestEffort lowered a minValues of its NodePool for this new node",
    )


class CommandOut(_Out):
    id: str
    method: str
    reason: str
    decision: str
    nodes: list[str]
    nodepools: list[str]
    replacements: list[ReplacementOut]
    savings_per_hour: float = Field(
        description="guaranteed hourly saving: the removed nodes' price minus every replacement's "
        "worst-case price (the price consolidation decides on); 0 for expiration"
    )
    savings_per_hour_best: float = Field(
        default=0.0,
        description="hourly saving if every replacement launches as its cheapest option "
        "(equal to savingsPerHour for a delete)",
    )
    disruption_class: str
    pods: int = Field(description="reschedulable pods that move")
    message: str = ""
    scores: list[str] = Field(
        default_factory=list,
        description="consolidationPolicy Balanced: each Balanced source pool's score of the move "
        'and the threshold it met ("default: score 1.67 >= 0.5"); empty for other policies',
    )
    placements: dict[str, str] = Field(
        default_factory=dict,
        description="Optimal moves: pod -> the node that stays it is planned onto (the validation "
        "places it there when the rules still allow)",
    )


class Explanation(_Out):
    method: str
    reason: str


class BlockedOut(_Out):
    node: str
    nodepool: str | None
    reason: str
    details: list[Explanation] = Field(default_factory=list)


class BudgetNodesOut(_Out):
    nodes: int = Field(description="nodes the pool's budgets count (initialized, not terminating)")
    disrupting: int = Field(description="of those, already disrupting when the pass starts")
    this_plan: int = Field(description="of those, disrupted by this plan's commands (expiration included)")


class PlanSummary(_Out):
    nodes: int
    managed: int
    candidates: int
    methods: list[str]
    ended_by: str | None = None


class AnnotationChange(_Out):
    """A marker the pass wants on a node (value) or gone from it (None), e.g. the seed-era
    `karpenter.sh/voluntary-disruption: drifted`. The controller applies these through an activity,
    only to the node with `uid` (the one the pass saw: a node that reuses the name is left alone)."""

    node: str
    key: str
    value: str | None = None
    uid: str = Field(default="", description="the node's metadata.uid when the pass planned it")


@dataclass(frozen=True)
class MethodEvaluation:
    """How long one method of the pass took and how many candidates it could consider (Karpenter's
    decision_evaluation_duration_seconds and eligible_nodes)."""

    method: str
    reason: str
    consolidation_type: str
    seconds: float
    eligible: int


def _pinned(snapshot: Snapshot, changes: list[AnnotationChange]) -> list[AnnotationChange]:
    """Each change with the UID of the node the pass saw under its name (a node name is not an
    identity: apply_annotations writes only to that node)."""
    for change in changes:
        node = snapshot.nodes.get(change.node)
        if node is not None and not change.uid:
            change.uid = node.uid
    return changes


def deferred_expiration_markers(ctx: PlanContext) -> list[AnnotationChange]:
    """`karpflow.io/expiration-deferred` on the expired nodes a window held back, once (the time the
    first pass deferred it): from then on their expiration is paced (planner/expiration.py)."""
    return [
        AnnotationChange(node=name, key=EXPIRATION_DEFERRED_ANNOTATION, value=rfc3339(ctx.now))
        for name in sorted(ctx.deferred_expirations)
        if not ctx.snapshot.nodes[name].annotations.get(EXPIRATION_DEFERRED_ANNOTATION)
    ]


class Plan(_Out):
    at: str
    region: str
    catalog: str
    commands: list[CommandOut]
    blocked: list[BlockedOut]
    budgets: dict[str, dict[str, int]] = Field(
        description="pool -> reason -> disruptions still allowed after this plan's commands: what the "
        "next pass could start"
    )
    budgets_at_start: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="pool -> reason -> disruptions allowed when the pass starts, before any of its commands",
    )
    budget_nodes: dict[str, BudgetNodesOut] = Field(
        default_factory=dict, description="pool -> the node counts behind both budget maps"
    )
    problems: list[str] = Field(default_factory=list)
    node_overlays: list[str] = Field(
        default_factory=list, description="what each NodeOverlay changed (the NodeOverlay gate on)"
    )
    annotations: list[AnnotationChange] = Field(
        default_factory=list, description="node annotations to set (value) or remove (null)"
    )
    taints: list[TaintChange] = Field(
        default_factory=list,
        description="karpflow.io/leaving taints to add or remove: nodes the Optimal target removes later",
    )
    target_fleet: TargetFleetOut | None = Field(
        default=None, description="the Optimal strategy's target fleet, when its method ran"
    )
    breaker: str = Field(
        default="", description="why the cluster-health breaker holds voluntary disruption (empty: closed)"
    )
    rollouts: list[DriftRollout] = Field(
        default_factory=list,
        description="drift rollouts to start: pools with a rollout policy whose drift waits for waves",
    )
    summary: PlanSummary
    _commands: list[Command] = PrivateAttr(default_factory=list)
    _evaluations: list[MethodEvaluation] = PrivateAttr(default_factory=list)

    @property
    def commands_(self) -> list[Command]:
        """The Command objects behind `commands` (same order), for in-process callers."""
        return self._commands

    @property
    def evaluations(self) -> list[MethodEvaluation]:
        """The methods this pass ran, in order, with their time and eligible candidates."""
        return self._evaluations

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)


def name_overlays(ctx: PlanContext, command: Command) -> None:
    """Add to the command's message the NodeOverlays that priced its nodes or its replacements'
    cheapest options (planner/node_overlay.py)."""
    offerings = [
        (c.pool_name, c.node.instance_type or "", c.zone or "", c.capacity_type or "")
        for c in command.candidates
    ]
    for r in command.replacements:
        for it in r.instance_types[:1]:
            offerings.extend(
                (r.nodepool, it.name, o.zone, o.capacity_type)
                for o in it.compatible_offerings([r.capacity_type], r.zones or None)
            )
    names = overlays_behind(ctx.node_overlays, offerings)
    if names:
        command.message += f" (prices from NodeOverlay {', '.join(names)})"


# --- Methods --------------------------------------------------------------------------------------


def default_methods() -> list[Method]:
    """Emptiness, StaticDrift (static NodePools), drift, Optimal consolidation (NodePools that opt in),
    then the consolidation methods of planner/consolidation.py when present (for every pool, Optimal
    ones when it found nothing)."""
    methods: list[Method] = [Emptiness(), StaticDrift(), Drift(), OptimalConsolidation()]
    module = _optional_module("planner.consolidation")
    if module is not None:
        for name in ("MultiNodeConsolidation", "SingleNodeConsolidation"):
            cls = getattr(module, name, None)
            if cls is not None:
                methods.append(cls())
    return methods


def default_simulate() -> Simulate | None:
    module = _optional_module("planner.scheduling.adapter")
    return getattr(module, "simulate", None) if module is not None else None


def _optional_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name:  # a broken import inside the module must surface
            raise
        return None


# --- The pass -------------------------------------------------------------------------------------


def plan(
    snapshot: Snapshot,
    catalog: Catalog,
    options: PlanOptions | None = None,
    *,
    methods: Sequence[Method] | None = None,
    simulate: Simulate | None = None,
    cache: PassCache | None = None,
) -> Plan:
    """What one disruption pass would do at `snapshot.now`, and why every other managed node stays.
    `cache`: per-node work kept from the caller's previous pass (planner/pass_cache.py); the plan is
    the same with or without it."""
    options = options or PlanOptions()
    snapshot, health = with_health_breaker(snapshot, options)
    ctx = PlanContext(
        snapshot=snapshot,
        catalog=catalog,
        options=options,
        simulate=simulate if simulate is not None else default_simulate(),
        cache=cache,
    )
    methods = list(methods) if methods is not None else default_methods()
    if not options.drift:
        methods = [m for m in methods if m.name not in (DRIFT, STATIC_DRIFT)]

    budgets_at_start = budget_report(ctx)
    # Forceful methods first, outside the budgets; their nodes then count as disrupting.
    commands = (
        expiration_commands(ctx)
        + nodepool_deletion_commands(ctx)
        + liveness_commands(ctx)
        + repair_commands(ctx)
    )
    for command in commands:
        ctx.marked_for_deletion.update(command.nodes)
        reserve_limits(ctx, command)  # forceful: they go, and their replacements take the pools' room
        take_reservations(ctx, command)  # and the reservations' instances

    candidates, blocked = build_candidates(ctx)
    # The Optimal plan held on the nodes (planner/optimal/held.py): Karpenter's methods leave it alone.
    ctx.optimal_plan, stale_markers = held_plan(ctx)
    ended_by = None
    # NodeDisruptionBudgets (planner/operator_controls.py): forceful commands counted, then spent by
    # the voluntary commands each method's admitted commands take.
    ledger = ndb_ledger(ctx) if snapshot.node_disruption_budgets else None
    evaluations = []
    for method in methods:
        began = ctx.clock()
        eligible = [c for c in candidates if _eligible(ctx, method, c, ledger)]
        budget_map = build_budget_map(ctx, method.reason)
        produced = method.compute(ctx, sort_by_disruption_cost(eligible), budget_map)
        produced = _worth_the_churn(ctx, method, produced)
        # Every replacement within its NodePool's spec.limits (planner/limits.py), the Optimal
        # strategy's too; StaticDrift reserves limits.nodes itself, as Karpenter's does.
        if method.name == STATIC_DRIFT:
            for command in produced:
                reserve_limits(ctx, command)
        else:
            produced = within_limits(ctx, method.name, produced)
        # No two replacements of the pass into a reservation's last instance (planner/reservations.py).
        produced = within_reservations(ctx, method.name, produced)
        produced = admit(ctx, method.name, produced, ledger)
        evaluations.append(
            MethodEvaluation(
                method.name,
                method.reason,
                getattr(method, "consolidation_type", ""),
                max(ctx.clock() - began, 0.0),
                len(eligible),
            )
        )
        commands.extend(produced)
        for command in produced:
            ctx.marked_for_deletion.update(command.nodes)
            name_overlays(ctx, command)
        if produced and not options.all_methods:
            ended_by = method.name
            break

    total, in_flight, planned = pool_counts(ctx)
    problems = list(snapshot.problems) + _nodeclass_problems(snapshot) + floor_problems(snapshot)
    if ctx.node_overlays is not None:
        problems.extend(ctx.node_overlays.problems)
    for pool, errors in budget_problems(ctx).items():
        problems.extend(f"NodePool {pool}: {e} (the pool's budgets fail closed)" for e in errors)
    policy_pools = {
        name
        for name, pool in snapshot.nodepools.items()
        if ROLLOUT_POLICY_ANNOTATION in pool.metadata.annotations
    }
    for name in sorted(policy_pools):
        error = pool_policy(ctx, snapshot.nodepools[name])[1]
        if error:
            problems.append(f"NodePool {name}: {error} (its drift is held until it is fixed)")
    rollouts = (
        drift_rollouts(ctx, drifted_by_pool(ctx, policy_pools)) if policy_pools and options.drift else []
    )
    result = Plan(
        at=rfc3339(snapshot.now),
        region=catalog.region,
        catalog=catalog.source,
        commands=[command_out(c) for c in commands],
        blocked=_blocked_out(ctx, candidates, blocked, methods, ended_by),
        budgets=budget_report(ctx),
        budgets_at_start=budgets_at_start,
        budget_nodes={
            pool: BudgetNodesOut(nodes=total[pool], disrupting=in_flight[pool], this_plan=planned[pool])
            for pool in sorted(total)
        },
        problems=problems,
        node_overlays=ctx.node_overlays.notes if ctx.node_overlays is not None else [],
        annotations=_pinned(
            snapshot,
            [
                AnnotationChange(node=node, key=VOLUNTARY_DISRUPTION_ANNOTATION, value=value)
                for node, value in voluntary_disruption_markers(ctx)
            ]
            + [
                AnnotationChange(node=node, key=PLAN_ANNOTATION, value=value)
                for node, value in (
                    ctx.plan_markers
                    if ctx.plan_markers is not None
                    else marker_changes(snapshot, {}, stale_markers)
                )
            ]
            + deferred_expiration_markers(ctx),
        ),
        taints=leaving_taint_changes(
            snapshot, ctx.leaving, {n for c in commands for n in c.nodes}, optimal_pools(ctx)
        ),
        target_fleet=ctx.outcomes.get(OptimalConsolidation.name),
        breaker=health.describe(),
        rollouts=rollouts,
        summary=PlanSummary(
            nodes=len(snapshot.nodes),
            managed=len(candidates)
            + len(blocked)
            + sum(
                len(c.candidates)
                for c in commands
                if c.method in (EXPIRATION, REPAIR, NODEPOOL_DELETION, LIVENESS)
            ),
            candidates=len(candidates),
            methods=[EXPIRATION, NODEPOOL_DELETION, LIVENESS, REPAIR, *(m.name for m in methods)],
            ended_by=ended_by,
        ),
    )
    result._commands = commands
    result._evaluations = evaluations
    if cache is not None:
        cache.end_pass()
    return result


def _nodeclass_problems(snapshot: Snapshot) -> list[str]:
    """Pools that cannot launch, so the user learns why even when they have no nodes to block."""
    out = []
    for name, pool in sorted(snapshot.nodepools.items()):
        why = snapshot.nodeclass_problem(pool)
        if why is not None:
            out.append(f"NodePool {name}: {why}; its nodes are left alone and it launches no replacements")
    return out


def _eligible(ctx: PlanContext, method: Method, candidate: Candidate, ledger: NdbLedger | None) -> bool:
    if candidate.name in ctx.marked_for_deletion:
        return False
    held = _held_by_optimal_plan(ctx, method, candidate)
    if held is not None:
        ctx.explain(candidate.name, method.name, held)
        return False
    # Graceful methods never take a node with blocking pods; the eventual class (drift) may when a
    # terminationGracePeriod bounds the drain.
    eventual = method.disruption_class == DisruptionClass.EVENTUAL and candidate.termination_grace_period
    if candidate.pod_block is not None and not eventual:
        return False
    if not method.should_disrupt(ctx, candidate):
        return False
    why = voluntary_block(ctx, candidate.node, method.reason, ledger)
    if why is None:
        why = ctx.options.backed_off.get(f"{candidate.pool_name}/{method.reason}")
    if why is not None:
        ctx.explain(candidate.name, method.name, why)
        return False
    return True


def _held_by_optimal_plan(ctx: PlanContext, method: Method, candidate: Candidate) -> str | None:
    """Why Karpenter's consolidation leaves this node to a held Optimal plan (planner/optimal/held.py):
    multi- and single-node consolidation leave the plan's NodePools alone (the plan is their
    consolidation until it ends: the two would otherwise undo each other's moves), and emptiness the
    nodes the plan launched (their room is kept for its later moves). None: not held."""
    hold = ctx.optimal_plan
    if hold is None or method.name == OPTIMAL_CONSOLIDATION:
        return None
    karpenters = (MULTI_NODE_CONSOLIDATION, SINGLE_NODE_CONSOLIDATION)
    if method.name in karpenters and candidate.pool_name in hold.pools:
        return f"nodepool {candidate.pool_name} is being consolidated by Optimal plan {hold.id}"
    if method.name == EMPTINESS:
        marker = read_marker(candidate.node)
        if marker is not None and marker.id == hold.id and marker.role == LAUNCHED:
            return f"launched by Optimal plan {hold.id}: its room is kept for the plan's later moves"
    return None


def _worth_the_churn(ctx: PlanContext, method: Method, produced: list[Command]) -> list[Command]:
    """Karpenter's consolidation, as the fallback of Optimal NodePools, must save what the Optimal
    target charges for the pods it moves (planner/optimal/solver.py `churn_per_pod`): the target
    found today's fleet best at that price, and a move for less would undo its judgement."""
    churn = ctx.optimal_churn
    if not churn or method.name not in (MULTI_NODE_CONSOLIDATION, SINGLE_NODE_CONSOLIDATION):
        return produced
    optimal = optimal_pools(ctx)
    kept = []
    for command in produced:
        pods = sum(len(c.reschedulable_pods) for c in command.candidates if c.pool_name in optimal)
        if pods and command.savings_per_hour < churn * pods:
            why = (
                f"optimal: the move saves ${command.savings_per_hour:.4f}/h, less than its {pods} pods' "
                f"churn (${churn:.4f}/h each) in an Optimal NodePool"
            )
            for node in command.nodes:
                ctx.explain(node, method.name, why)
            continue
        kept.append(command)
    return kept


def _blocked_out(
    ctx: PlanContext,
    candidates: list[Candidate],
    blocked: list[Blocked],
    methods: Sequence[Method],
    ended_by: str | None,
) -> list[BlockedOut]:
    out = [BlockedOut(node=b.node, nodepool=b.nodepool, reason=b.reason) for b in blocked]
    names = {m.name for m in methods}
    for candidate in candidates:
        if candidate.name in ctx.marked_for_deletion:
            continue
        details = [Explanation(method=m, reason=r) for m, r in ctx.explanations.get(candidate.name, [])]
        if candidate.pod_block is not None:
            reason = candidate.pod_block
        elif details:
            # A drifted node (a rollout's too) is waiting for drift: what holds drift back (a budget,
            # a rate, a window) says more than another method's "not empty" or "consolidation off".
            drifted = (
                [d for d in details if d.method in (DRIFT, STATIC_DRIFT)]
                if candidate.drift is not None
                else []
            )
            reason = (drifted or details)[0].reason
        elif ended_by is not None:
            # A method that would take it later is held off by a window or a budget: that lasts, so it
            # is named before "not chosen", which passes with the next pass (docs/operator-controls.md).
            lasting = _lasting_block(ctx, candidate, methods, ended_by)
            reason = lasting or f"not chosen this pass: {ended_by} produced commands, which ends the pass"
        elif names <= {EMPTINESS, DRIFT}:
            reason = "not empty and not drifted (no consolidation method available)"
        else:
            reason = "not empty, not drifted, and consolidation found nothing cheaper"
        out.append(
            BlockedOut(node=candidate.name, nodepool=candidate.pool_name, reason=reason, details=details)
        )
    return sorted(out, key=lambda b: b.node)


def _lasting_block(
    ctx: PlanContext, candidate: Candidate, methods: Sequence[Method], ended_by: str
) -> str | None:
    """What an operator's control (a MaintenanceWindow or pause, a NodeDisruptionBudget) holds this
    candidate back from, for the methods the pass did not reach: the first that would take it."""
    if not (ctx.snapshot.maintenance_windows or ctx.snapshot.node_disruption_budgets):
        return None
    names = [m.name for m in methods]
    later = methods[names.index(ended_by) + 1 :] if ended_by in names else []
    for method in later:
        if candidate.pod_block is not None or not method.should_disrupt(ctx, candidate):
            continue
        why = voluntary_block(ctx, candidate.node, method.reason)
        if why is not None:
            return why
    return None


def command_out(command: Command) -> CommandOut:
    # An Optimal move's pods are placed where its plan put them (validation included): they travel
    # with it. Other methods' validation places pods its own way.
    planned = command.method == OPTIMAL_CONSOLIDATION
    return CommandOut(
        id=command.id,
        method=command.method,
        reason=command.reason,
        decision=command.decision,
        nodes=command.nodes,
        nodepools=command.nodepools,
        replacements=[
            ReplacementOut(
                nodepool=r.nodepool,
                instance_types=r.instance_type_names,
                capacity_type=r.capacity_type,
                zones=list(r.zones),
                price=r.price,
                worst_case_price=r.worst_case_price,
                pods=len(r.pods),
                reservation_ids=r.reservation_ids,
                pod_keys=[p.key for p in r.pods] if planned else [],
                min_values_relaxed=r.annotations.get(MIN_VALUES_RELAXED_ANNOTATION) == "true",
            )
            for r in command.replacements
        ],
        savings_per_hour=command.savings_per_hour,
        savings_per_hour_best=command.savings_per_hour_best,
        disruption_class=str(command.disruption_class),
        pods=sum(len(c.reschedulable_pods) for c in command.candidates),
        message=command.message,
        scores=list(command.scores),
        placements=dict(command.placements) if planned else {},
    )


# --- Validation of a planned command against a fresh snapshot -------------------------------------


class ValidationOut(_Out):
    valid: bool
    reason: str = ""
    command: CommandOut | None = None
    _command: Command | None = PrivateAttr(default=None)

    @property
    def command_(self) -> Command | None:
        """The Command behind `command` (its candidates, their NodePools), for in-process callers:
        everything said of a narrowed command (its pools, approval, savings) comes from it."""
        return self._command


def command_from_out(ctx: PlanContext, out: CommandOut) -> Command | None:
    """Rebuild a Command from its serialized form on (possibly fresh) cluster state. None when a node
    or its NodePool is gone."""
    candidates = []
    for name in out.nodes:
        node = ctx.snapshot.nodes.get(name)
        pool = ctx.snapshot.nodepools.get(node.nodepool or "") if node is not None else None
        if node is None or pool is None:
            return None
        candidates.append(make_candidate(ctx, node, pool))
    pods = {p.key: p for c in candidates for p in c.reschedulable_pods}
    replacements = [
        Replacement(
            nodepool=r.nodepool,
            instance_types=[t for n in r.instance_types if (t := ctx.catalog.get(n)) is not None],
            capacity_type=r.capacity_type,
            zones=list(r.zones),
            pods=[pods[key] for key in r.pod_keys if key in pods],
        )
        for r in out.replacements
    ]
    for replacement, r in zip(replacements, out.replacements, strict=True):
        restore_reserved(ctx.catalog, replacement, r.reservation_ids)
    command = Command(
        out.method, out.reason, candidates, replacements, DisruptionClass(out.disruption_class), out.message
    )
    command.placements = dict(out.placements)
    return command


def validate_command(
    snapshot: Snapshot,
    catalog: Catalog,
    command: CommandOut,
    options: PlanOptions | None = None,
    *,
    methods: Sequence[Method] | None = None,
    simulate: Simulate | None = None,
    marked: Iterable[str] = (),
    cache: PassCache | None = None,
) -> ValidationOut:
    """Re-check a planned command on a fresh snapshot (the controller calls this after its 15 s timer).
    `marked`: nodes of commands validated before this one in the same batch, which will start with
    it: they count against budgets, rates and NodeDisruptionBudgets as this pass's own. `cache`: as
    for `plan` (the verdict is the same without it)."""
    options = options or PlanOptions()
    snapshot, _ = with_health_breaker(snapshot, options)
    ctx = PlanContext(
        snapshot=snapshot,
        catalog=catalog,
        options=options,
        simulate=simulate if simulate is not None else default_simulate(),
        cache=cache,
    )
    ctx.marked_for_deletion.update(n for n in marked if n not in command.nodes)
    rebuilt = command_from_out(ctx, command)
    if rebuilt is None:
        return ValidationOut(valid=False, reason="a node of the command or its nodepool is gone")
    by_name = {m.name: m for m in (methods if methods is not None else default_methods())}
    method = by_name.get(command.method)
    if method is not None:
        # The operator's controls may have changed since the plan: a window opened, a budget filled.
        ledger = ndb_ledger(ctx)
        for candidate in rebuilt.candidates:
            why = voluntary_block(ctx, candidate.node, command.reason, ledger)
            if why is not None:
                return ValidationOut(valid=False, reason=f"{candidate.name}: {why}")
        if (status := ledger.blocking(rebuilt.nodes)) is not None:
            return ValidationOut(valid=False, reason=status.message())
    if method is None:
        if command.method in (EXPIRATION, REPAIR, NODEPOOL_DELETION, LIVENESS):
            return ValidationOut(valid=True, command=command)
        return ValidationOut(valid=False, reason=f"unknown method {command.method!r}")
    result: ValidationResult = method.validate(ctx, rebuilt)
    out = ValidationOut(
        valid=result.valid,
        reason=result.reason,
        command=command_out(result.command) if result.command is not None else None,
    )
    out._command = result.command
    return out


__all__ = [
    "AnnotationChange",
    "BlockedOut",
    "BudgetNodesOut",
    "CommandOut",
    "MethodEvaluation",
    "Plan",
    "ReplacementOut",
    "TaintChange",
    "ValidationOut",
    "command_out",
    "default_methods",
    "plan",
    "validate_command",
]
