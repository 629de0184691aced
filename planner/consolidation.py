"""Multi-node and single-node consolidation (behaviour notes §2.2 to §2.5).

Both methods ask one question of the scheduling simulation: if these nodes went away, where would
their pods go? (`compute_consolidation`, Karpenter's computeConsolidation):
- every pod fits on the remaining nodes → **delete**;
- the pods need exactly one new node → **replace**, but only with instance types whose worst-case
  launch price is strictly below what the nodes cost now (a replacement allowed to be spot or
  on-demand is priced as spot and then pinned to spot, so a launch can never silently cost more);
- anything else (a pod that fits nowhere, two or more new nodes, nothing cheaper) → no command.
All-spot candidates may only be deleted unless `spot_to_spot` is on; then the replacement is spot,
and a single node needs at least 15 cheaper types and launches with the 15 cheapest (§2.5).

- Multi-node binary-searches the longest prefix of the cost-ordered candidates (at most 100 + 1)
  that consolidates, and for replacements drops options that are not cheaper than a candidate of
  the same type (`filter_out_same_instance_type`).
- Single-node walks candidates round-robin across NodePools and returns the first valid command.
- Both spend the Underutilized budget per candidate, stop at their timeout (1 min / 3 min by default,
  measured with `ctx.clock`) and return the best found so far. Validation before execution (§1.7) is
  in `planner.consolidation_validation`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from api.constants import CAPACITY_ON_DEMAND, CAPACITY_SPOT, CAPACITY_TYPE_LABEL, REASON_UNDERUTILIZED
from planner.candidates import consolidation_block, round_robin_by_nodepool
from planner.model import (
    CONSOLIDATION_MULTI,
    CONSOLIDATION_SINGLE,
    MULTI_NODE_CONSOLIDATION,
    SINGLE_NODE_CONSOLIDATION,
    BudgetMap,
    Candidate,
    Command,
    DisruptionClass,
    PlanContext,
    ValidationResult,
)
from planner.scheduling import ClaimOption, NewNodeClaim, SimulationResult
from planner.scheduling_adapter import SnapshotSimulation, launch_capacity_type, snapshot_simulation
from planner.scheduling_requirements import Req

# Single-node spot-to-spot needs this many strictly cheaper types and launches with the cheapest this
# many, so the new node is always among them and the next pass cannot "race to the bottom" (§2.5).
MIN_SPOT_TO_SPOT_OPTIONS = 15


@dataclass
class Proposal:
    """What removing some candidates would take: a command, or why there is none."""

    candidates: list[Candidate]
    command: Command | None = None
    why: str = ""
    options: list[ClaimOption] = field(default_factory=list)  # the replacement's options, cheapest first
    simulation: SimulationResult | None = None


def consolidation_policy_block(candidate: Candidate) -> str | None:
    policy = candidate.nodepool.spec.disruption.consolidation_policy
    if policy != "WhenEmptyOrUnderutilized":
        pool = candidate.pool_name
        return f"nodepool {pool} has consolidationPolicy {policy}: only empty nodes are consolidated"
    return None


def source_price(candidates: Sequence[Candidate]) -> float:
    """What the candidates cost per hour now (each node's own zone and capacity-type offering)."""
    return sum(c.price or 0.0 for c in candidates)


def compute_consolidation(
    ctx: PlanContext,
    candidates: Sequence[Candidate],
    *,
    method: str,
    prepared: SnapshotSimulation | None = None,
) -> Proposal:
    """Karpenter's computeConsolidation for one candidate set (see the module docstring)."""
    prepared = prepared or snapshot_simulation(ctx)
    candidates = list(candidates)
    proposal = Proposal(candidates)
    result = prepared.run(
        [c.name for c in candidates], gone=ctx.marked_for_deletion, max_new_claims=1, stop_on_failure=True
    )
    proposal.simulation = result
    if not result.all_non_pending_scheduled:
        if result.aborted and "new node" in result.aborted:
            proposal.why = "can't remove without creating more than one new node"
        else:
            proposal.why = f"pods cannot be rescheduled: {result.non_pending_errors()}"
        return proposal
    replacements = result.replacements
    if not replacements:
        proposal.command = _command(method, candidates, [], prepared, None, "")
        return proposal

    claim = replacements[0]
    price = source_price(candidates)
    if all(c.capacity_type == CAPACITY_SPOT for c in candidates) and CAPACITY_SPOT in claim.capacity_types:
        return _spot_to_spot(ctx, proposal, claim, price, method, prepared)

    pin_spot = CAPACITY_SPOT in claim.capacity_types and CAPACITY_ON_DEMAND in claim.capacity_types
    # Priced as it would launch: spot when spot is allowed. Pinning to spot afterwards keeps an
    # unavailable spot launch from falling back to a more expensive on-demand node.
    options = prepared.simulator.reprice(claim, [_SPOT]) if pin_spot else claim.options
    cheaper = [o for o in options if o.worst_price < price]
    missing = prepared.simulator.min_values_met(claim, [o.instance_type for o in cheaper])
    if missing:
        proposal.why = f"Filtering by price: {missing}"
        return proposal
    if not cheaper:
        proposal.why = f"Can't replace with a cheaper node (current ${price:.4f}/h)"
        return proposal
    capacity_type = CAPACITY_SPOT if pin_spot else launch_capacity_type(claim.capacity_types)
    proposal.options = cheaper
    proposal.command = _command(method, candidates, cheaper, prepared, claim, capacity_type)
    return proposal


_SPOT = Req.equals(CAPACITY_TYPE_LABEL, CAPACITY_SPOT)


def _spot_to_spot(
    ctx: PlanContext,
    proposal: Proposal,
    claim: NewNodeClaim,
    price: float,
    method: str,
    prepared: SnapshotSimulation,
) -> Proposal:
    if not ctx.options.spot_to_spot:
        proposal.why = "SpotToSpotConsolidation is disabled, can't replace a spot node with a spot node"
        return proposal
    options = prepared.simulator.reprice(claim, [_SPOT])
    cheaper = [o for o in options if o.worst_price < price]
    missing = prepared.simulator.min_values_met(claim, [o.instance_type for o in cheaper])
    if missing:
        proposal.why = f"Filtering by price: {missing}"
        return proposal
    if not cheaper:
        proposal.why = f"Can't replace with a cheaper node (current ${price:.4f}/h)"
        return proposal
    if len(proposal.candidates) == 1:
        if len(cheaper) < MIN_SPOT_TO_SPOT_OPTIONS:
            proposal.why = (
                f"SpotToSpotConsolidation requires {MIN_SPOT_TO_SPOT_OPTIONS} cheaper instance type options "
                f"than the current candidate to consolidate, got {len(cheaper)}"
            )
            return proposal
        keep = MIN_SPOT_TO_SPOT_OPTIONS
        names = [o.instance_type for o in cheaper]
        # minValues may need more than 15 to stay satisfied: keep the shortest prefix that does.
        while keep < len(cheaper) and prepared.simulator.min_values_met(claim, names[:keep]):
            keep += 1
        cheaper = cheaper[:keep]
    proposal.options = cheaper
    proposal.command = _command(method, proposal.candidates, cheaper, prepared, claim, CAPACITY_SPOT)
    return proposal


def _command(
    method: str,
    candidates: list[Candidate],
    options: Sequence[ClaimOption],
    prepared: SnapshotSimulation,
    claim: NewNodeClaim | None,
    capacity_type: str,
) -> Command:
    replacements = []
    if claim is not None:
        moved = [p for c in candidates for p in c.reschedulable_pods]
        replacements.append(
            prepared.replacement(claim, moved, [o.instance_type for o in options], capacity_type)
        )
    command = Command(method, REASON_UNDERUTILIZED, candidates, replacements, DisruptionClass.GRACEFUL)
    command.message = describe(command)
    return command


def describe(command: Command) -> str:
    if not command.replacements:
        target = "pods fit on the remaining nodes"
    else:
        r = command.replacements[0]
        names = r.instance_type_names
        more = f" (+{len(names) - 1} more options)" if len(names) > 1 else ""
        target = f"1 {r.capacity_type} {names[0]}{more}"
    count = len(command.candidates)
    return f"{command.decision}: {count} node(s) -> {target} (saves ${command.savings_per_hour:.4f}/h)"


def filter_out_same_instance_type(
    options: Sequence[ClaimOption], candidates: Sequence[Candidate]
) -> list[ClaimOption]:
    """Multi-node only: if the replacement could be a type some candidate already is, it must be
    cheaper than the cheapest such candidate — otherwise keeping that node and deleting the others is
    the better command (e.g. 2 x 2xlarge + 1 small "replaced" by 1 small is 2 deletions)."""
    current: dict[str, float] = {}
    for c in candidates:
        name = c.instance_type_name
        if name and c.price is not None:
            current[name] = min(current.get(name, float("inf")), c.price)
    ceiling = min(
        (current[o.instance_type] for o in options if o.instance_type in current), default=float("inf")
    )
    return [o for o in options if o.worst_price < ceiling]


# --- The methods ----------------------------------------------------------------------------------


class _Consolidation:
    reason = REASON_UNDERUTILIZED
    disruption_class = DisruptionClass.GRACEFUL
    name = ""

    def should_disrupt(self, ctx: PlanContext, candidate: Candidate) -> bool:
        block = consolidation_block(ctx, candidate) or consolidation_policy_block(candidate)
        if block is not None:
            ctx.explain(candidate.name, self.name, block)
            return False
        return True

    def validate(self, ctx: PlanContext, command: Command) -> ValidationResult:
        # Imported here: the validation module builds on this one.
        from planner.consolidation_validation import validate_consolidation

        return validate_consolidation(ctx, command)


class MultiNodeConsolidation(_Consolidation):
    """Delete or replace as many cost-ordered candidates at once as the simulation allows (§2.2)."""

    name = MULTI_NODE_CONSOLIDATION
    consolidation_type = CONSOLIDATION_MULTI

    def __init__(self) -> None:
        self.timed_out = False
        self.probes = 0

    def compute(self, ctx: PlanContext, candidates: list[Candidate], budgets: BudgetMap) -> list[Command]:
        # Keep order, drop candidates whose pool budget is spent, so the search never considers more
        # nodes than it may disrupt. Budgets are only really spent for the chosen command.
        trial = budgets.copy()
        usable = [c for c in candidates if trial.take(c.pool_name)]
        self.timed_out, self.probes = False, 0
        if len(usable) < 2:
            return []
        prepared = snapshot_simulation(ctx)
        timeout = ctx.options.multi_node_timeout.total_seconds()
        start = ctx.clock()
        best: Proposal | None = None
        low, high = 1, min(ctx.options.multi_node_max_candidates, len(usable) - 1)
        while low <= high:
            if ctx.clock() - start >= timeout:
                self.timed_out = True
                break
            mid = (low + high) // 2
            proposal = self.probe(ctx, usable[: mid + 1], prepared)
            self.probes += 1
            if proposal.command is not None:
                best = proposal
                low = mid + 1
            else:
                high = mid - 1
        if best is None or best.command is None:
            return []
        for c in best.candidates:
            budgets.take(c.pool_name)
        if self.timed_out:
            best.command.message += " (search timed out; best command so far)"
        return [best.command]

    def probe(self, ctx: PlanContext, prefix: list[Candidate], prepared: SnapshotSimulation) -> Proposal:
        proposal = compute_consolidation(ctx, prefix, method=self.name, prepared=prepared)
        command = proposal.command
        if command is not None and command.replacements:
            options = filter_out_same_instance_type(proposal.options, prefix)
            if not options:
                proposal.command = None
                proposal.why = (
                    "the replacement would be no cheaper than a node of the same type being removed"
                )
                return proposal
            if len(options) != len(proposal.options):
                kept = {o.instance_type for o in options}
                replacement = command.replacements[0]
                replacement.instance_types = [t for t in replacement.instance_types if t.name in kept]
                proposal.options = options
                command.message = describe(command)
        return proposal


class SingleNodeConsolidation(_Consolidation):
    """Delete or replace one node: the first candidate, round-robin across NodePools, that works (§2.3)."""

    name = SINGLE_NODE_CONSOLIDATION
    consolidation_type = CONSOLIDATION_SINGLE

    def __init__(self) -> None:
        self.timed_out = False
        # NodePools a timed-out pass never reached: the caller passes them back as
        # `options.single_node_priority_pools` so the next pass starts with them.
        self.unreached_pools: list[str] = []
        self.probes = 0

    def compute(self, ctx: PlanContext, candidates: list[Candidate], budgets: BudgetMap) -> list[Command]:
        ordered = round_robin_by_nodepool(candidates, ctx.options.single_node_priority_pools)
        self.timed_out, self.unreached_pools, self.probes = False, [], 0
        prepared = snapshot_simulation(ctx) if ordered else None
        timeout = ctx.options.single_node_timeout.total_seconds()
        start = ctx.clock()
        for index, candidate in enumerate(ordered):
            if ctx.clock() - start >= timeout:
                self.timed_out = True
                reached = {c.pool_name for c in ordered[:index]}
                self.unreached_pools = sorted({c.pool_name for c in ordered[index:]} - reached)
                for later in ordered[index:]:
                    ctx.explain(later.name, self.name, "single-node consolidation timed out before this node")
                break
            if budgets.available(candidate.pool_name) <= 0:
                ctx.explain(candidate.name, self.name, budgets.exhausted_message(candidate.pool_name))
                continue
            if candidate.is_empty:
                # Left to emptiness: its own budget reason (Empty) must not be bypassed here.
                ctx.explain(candidate.name, self.name, "empty: left to emptiness")
                continue
            proposal = compute_consolidation(ctx, [candidate], method=self.name, prepared=prepared)
            self.probes += 1
            if proposal.command is None:
                ctx.explain(candidate.name, self.name, proposal.why)
                continue
            budgets.take(candidate.pool_name)
            for later in ordered[index + 1 :]:
                ctx.explain(later.name, self.name, "not evaluated: one single-node command per pass")
            return [proposal.command]
        return []


__all__ = [
    "MIN_SPOT_TO_SPOT_OPTIONS",
    "MultiNodeConsolidation",
    "Proposal",
    "SingleNodeConsolidation",
    "compute_consolidation",
    "filter_out_same_instance_type",
]
