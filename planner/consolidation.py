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

- Multi-node binary-searches the longest prefix of the savings-ratio-ordered non-empty candidates (at most
  100 + 1; empty ones are left to emptiness and its budget) that consolidates, and for replacements
  drops options that are not cheaper than a candidate of the same type
  (`filter_out_same_instance_type`), and the replacement when what is left no longer meets the
  NodePool's minValues.
- Single-node walks candidates (savings-ratio order) round-robin across NodePools and returns the
  first valid command.
- Both spend the Underutilized budget per candidate, stop at their timeout (1 min / 3 min by default,
  measured with `ctx.clock`) and return the best found so far. Validation before execution (§1.7) is
  in `planner.consolidation_validation`.

consolidationPolicy Balanced (planner/balanced.py): a command whose Balanced source pools do not all
score it at least 1/2 is no command either (single-node tries the next candidate, multi-node a
shorter prefix), and single-node skips a candidate whose outright delete would already score too
low; an approved command's message carries its score. Candidates are tried in Karpenter's current
order, highest savings ratio (price / disruption cost) first.

A replace under the NodePools' savings floor (`karpflow.dev/min-savings-*`, planner/savings_threshold.py)
is no command either: single-node consolidation tries the next candidate, multi-node a shorter prefix.

karpflow extension, opt-in (`PlanOptions.max_replacements` > 1, `karpflow plan --max-replacements`):
multi-node consolidation may replace its candidates with up to that many new nodes. The rules stay
Karpenter's, applied to the total: every pod must be placed, the worst case of all launches together
must be strictly below what the candidates cost, spot/on-demand replacements are pinned to spot, an
all-spot set needs spot-to-spot, and `filter_out_same_instance_type` applies to each new node. The new
nodes are packed two ways (Karpenter's, and the cost-aware packing of planner.scheduling.packing) and
the cheaper is kept. With spot-to-spot off the candidates are searched spot nodes last (`spot_last`).
Why: with one replacement, the end state keeps nodes that are full on CPU with memory idle next to
replacements that are full on memory (bench/bench_quality.py); several new nodes sized for what they
hold close most of that gap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from api.constants import (
    CAPACITY_ON_DEMAND,
    CAPACITY_RESERVED,
    CAPACITY_SPOT,
    CAPACITY_TYPE_LABEL,
    REASON_UNDERUTILIZED,
)
from planner.balanced import BalancedGate, describe_scores, sort_by_savings_ratio
from planner.candidates import consolidation_block, consolidation_policy_block, round_robin_by_nodepool
from planner.consolidation_validation import validate_consolidation
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
from planner.savings_threshold import below_floor, explain_skipped
from planner.scheduling.adapter import SnapshotSimulation, launch_capacity_type, snapshot_simulation
from planner.scheduling.requirements import Req
from planner.scheduling.results import (
    COST_PACKING,
    KARPENTER_PACKING,
    ClaimOption,
    NewNodeClaim,
    Packing,
    SimulationResult,
)

# Single-node spot-to-spot needs this many strictly cheaper types and launches with the cheapest this
# many, so the new node is always among them and the next pass cannot "race to the bottom" (§2.5).
MIN_SPOT_TO_SPOT_OPTIONS = 15


@dataclass
class Proposal:
    """What removing some candidates would take: a command, or why there is none."""

    candidates: list[Candidate]
    command: Command | None = None
    why: str = ""
    # Per replacement, its launch options (cheapest first), in the order of command.replacements.
    options: list[list[ClaimOption]] = field(default_factory=list)
    simulation: SimulationResult | None = None


def source_price(candidates: Sequence[Candidate]) -> float:
    """What the candidates cost per hour now (each node's own zone and capacity-type offering)."""
    return sum(c.price or 0.0 for c in candidates)


def compute_consolidation(
    ctx: PlanContext,
    candidates: Sequence[Candidate],
    *,
    method: str,
    prepared: SnapshotSimulation | None = None,
    max_replacements: int = 1,
) -> Proposal:
    """Karpenter's computeConsolidation for one candidate set (see the module docstring).

    With `max_replacements` > 1 (the karpflow extension, multi-node only) the pods may need up to that
    many new nodes. Two packings are simulated: Karpenter's (each new node grows until no instance
    type holds more) and the cost-aware one of planner.scheduling.packing (each new node sized for
    the instance type that hosts its pods at the lowest price per share). The cheaper valid answer is
    kept; a delete always wins.
    """
    prepared = prepared or snapshot_simulation(ctx)
    candidates = list(candidates)
    free = _simulate(ctx, prepared, candidates, max_replacements)
    proposal = _floored(
        ctx, refuse_unlaunchable(_proposal(ctx, candidates, free, method, prepared), prepared), method
    )
    if max_replacements <= 1 or (proposal.command is not None and not proposal.command.replacements):
        return proposal
    cost = _simulate(ctx, prepared, candidates, max_replacements, COST_PACKING)
    other = refuse_unlaunchable(_proposal(ctx, candidates, cost, method, prepared), prepared)
    return _cheaper(proposal, _floored(ctx, other, method))


def refuse_unlaunchable(proposal: Proposal, prepared: SnapshotSimulation) -> Proposal:
    """No command whose replacement cannot launch: under MinValuesPolicy Strict, the 60 cheapest of
    its options (what the launch sends) must still meet its NodePool's minValues (Karpenter's AWS
    provider fails such a launch; karpflow does not take the move)."""
    if proposal.command is None or proposal.simulation is None:
        return proposal
    for claim, options in zip(proposal.simulation.replacements, proposal.options, strict=False):
        why = prepared.launch_refusal(claim, [o.instance_type for o in options])
        if why is not None:
            proposal.command, proposal.why = None, why
            return proposal
    return proposal


def _floored(ctx: PlanContext, proposal: Proposal, method: str) -> Proposal:
    """No replace under the NodePools' savings floor (planner/savings_threshold.py). Single-node
    consolidation explains its rejections itself; the multi-node search is told here, once a node."""
    why = below_floor(proposal.command) if proposal.command is not None else None
    if why is not None:
        assert proposal.command is not None
        if method != SINGLE_NODE_CONSOLIDATION:
            explain_skipped(ctx, method, proposal.command, why)
        proposal.command, proposal.why = None, why
    return proposal


def _simulate(
    ctx: PlanContext,
    prepared: SnapshotSimulation,
    candidates: Sequence[Candidate],
    max_replacements: int,
    packing: Packing = KARPENTER_PACKING,
) -> SimulationResult:
    return prepared.run(
        [c.name for c in candidates],
        gone=ctx.marked_for_deletion,
        max_new_claims=max_replacements,
        stop_on_failure=True,
        packing=packing,
        consolidation=True,
    )


def _cheaper(a: Proposal, b: Proposal) -> Proposal:
    """The proposal with a command that launches less (expected price), then fewer nodes; ties keep `a`."""
    if a.command is None or b.command is None:
        return a if b.command is None else b
    key_a = (round(a.command.replacement_price, 6), len(a.command.replacements))
    key_b = (round(b.command.replacement_price, 6), len(b.command.replacements))
    return b if key_b < key_a else a


def _proposal(
    ctx: PlanContext,
    candidates: list[Candidate],
    result: SimulationResult,
    method: str,
    prepared: SnapshotSimulation,
) -> Proposal:
    proposal = Proposal(candidates, simulation=result)
    if not result.all_non_pending_scheduled:
        if result.aborted and "new node" in result.aborted:
            proposal.why = _too_many_nodes(ctx, method) + result.held_off_note()
        else:
            proposal.why = f"pods cannot be rescheduled: {result.non_pending_errors()}"
        return proposal
    claims = result.replacements
    if not claims:
        proposal.command = _command(method, candidates, [], prepared, result)
        return proposal
    price = source_price(candidates)
    all_spot = all(c.capacity_type == CAPACITY_SPOT for c in candidates)
    if len(claims) == 1:
        claim = claims[0]
        if all_spot and CAPACITY_SPOT in claim.capacity_types and not _reserved_options(prepared, claim):
            return _spot_to_spot(ctx, proposal, claim, price, method, prepared)
        options, capacity_type = _launch_options(prepared, claim)
        cheaper, proposal.why = _cheaper_than(prepared, claim, options, price)
        if proposal.why:
            proposal.why += result.held_off_note()
            return proposal
        proposal.options = [cheaper]
        proposal.command = _command(method, candidates, [(claim, cheaper, capacity_type)], prepared, result)
        return proposal
    return _several(ctx, proposal, claims, price, method, prepared)


def _too_many_nodes(ctx: PlanContext, method: str) -> str:
    if method == MULTI_NODE_CONSOLIDATION and ctx.options.max_replacements > 1:
        return f"can't remove without creating more than {ctx.options.max_replacements} new nodes"
    return "can't remove without creating more than one new node"


_SPOT = Req.equals(CAPACITY_TYPE_LABEL, CAPACITY_SPOT)


def _cheaper_than(
    prepared: SnapshotSimulation, claim: NewNodeClaim, options: Sequence[ClaimOption], price: float
) -> tuple[list[ClaimOption], str]:
    """The options whose worst-case launch price is strictly below `price` (§2.4), and why they
    cannot make a replacement ("" when they can): none left, or the claim's minValues no longer met."""
    cheaper = [o for o in options if o.worst_price < price]
    missing = prepared.simulator.min_values_met(claim, [o.instance_type for o in cheaper])
    if missing:
        return cheaper, f"Filtering by price: {missing}"
    if not cheaper:
        return cheaper, f"Can't replace with a cheaper node (current ${price:.4f}/h)"
    return cheaper, ""


def _launch_options(prepared: SnapshotSimulation, claim: NewNodeClaim) -> tuple[list[ClaimOption], str]:
    """The claim's options as it would launch, and the capacity type. A claim that may be spot or
    on-demand is priced as spot and pinned to spot, so an unavailable spot launch cannot fall back to
    a dearer on-demand node (§2.4)."""
    reserved = _reserved_options(prepared, claim)
    if reserved:
        return reserved, CAPACITY_RESERVED
    if CAPACITY_SPOT in claim.capacity_types and CAPACITY_ON_DEMAND in claim.capacity_types:
        return list(prepared.simulator.reprice(claim, [_SPOT])), CAPACITY_SPOT
    return list(claim.options), launch_capacity_type(claim.capacity_types)


_RESERVED = Req.equals(CAPACITY_TYPE_LABEL, CAPACITY_RESERVED)


def _reserved_options(prepared: SnapshotSimulation, claim: NewNodeClaim) -> list[ClaimOption]:
    """The claim's options pinned to reserved capacity, when it may launch into a reservation:
    Karpenter's scheduler reserves the offerings and narrows the NodeClaim to `reserved` before
    consolidation sees it (nodeclaim.go `offeringsToReserve`), so such a claim is neither pinned to
    spot nor taken for spot-to-spot (planner/reservations.py then counts the instances)."""
    if CAPACITY_RESERVED not in claim.capacity_types:
        return []
    return list(prepared.simulator.reprice(claim, [_RESERVED]))


def _several(
    ctx: PlanContext,
    proposal: Proposal,
    claims: list[NewNodeClaim],
    price: float,
    method: str,
    prepared: SnapshotSimulation,
) -> Proposal:
    """Replace with two or more new nodes (the `max_replacements` extension): the same rules as one
    replacement, applied to the total. The worst case of all launches together must be strictly below
    what the candidates cost; the saving left over is shared equally, so each replacement lists every
    option whose worst-case price stays within its share."""
    all_spot = all(c.capacity_type == CAPACITY_SPOT for c in proposal.candidates)
    launches: list[tuple[NewNodeClaim, list[ClaimOption], str]] = []
    for claim in claims:
        if all_spot and CAPACITY_SPOT in claim.capacity_types and not _reserved_options(prepared, claim):
            if not ctx.options.spot_to_spot:
                proposal.why = "SpotToSpotConsolidation is disabled, can't replace spot nodes with spot nodes"
                return proposal
            options, capacity_type = list(prepared.simulator.reprice(claim, [_SPOT])), CAPACITY_SPOT
        else:
            options, capacity_type = _launch_options(prepared, claim)
        if not options:
            proposal.why = f"no instance type can launch new node {len(launches) + 1} of {len(claims)}"
            return proposal
        launches.append((claim, options, capacity_type))
    floors = [min(o.worst_price for o in options) for _, options, _ in launches]
    if sum(floors) >= price:
        proposal.why = (
            f"Can't replace with {len(claims)} cheaper nodes (current ${price:.4f}/h, "
            f"the new nodes cost at least ${sum(floors):.4f}/h)"
        )
        return proposal
    share = (price - sum(floors)) / len(launches)
    kept = []
    for (claim, options, capacity_type), floor in zip(launches, floors, strict=True):
        cheaper, proposal.why = _cheaper_than(prepared, claim, options, floor + share)
        if proposal.why:
            return proposal
        kept.append((claim, cheaper, capacity_type))
    proposal.options = [options for _, options, _ in kept]
    proposal.command = _command(method, proposal.candidates, kept, prepared, proposal.simulation)
    return proposal


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
    cheaper, proposal.why = _cheaper_than(prepared, claim, prepared.simulator.reprice(claim, [_SPOT]), price)
    if proposal.why:
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
    proposal.options = [cheaper]
    proposal.command = _command(
        method, proposal.candidates, [(claim, cheaper, CAPACITY_SPOT)], prepared, proposal.simulation
    )
    return proposal


def _command(
    method: str,
    candidates: list[Candidate],
    launches: Sequence[tuple[NewNodeClaim, Sequence[ClaimOption], str]],
    prepared: SnapshotSimulation,
    result: SimulationResult | None,
) -> Command:
    moved = prepared.pods_of([c.name for c in candidates])
    replacements = [
        prepared.replacement(claim, moved, [o.instance_type for o in options], capacity_type)
        for claim, options, capacity_type in launches
    ]
    command = Command(method, REASON_UNDERUTILIZED, candidates, replacements, DisruptionClass.GRACEFUL)
    if result is not None:
        claim_names = {c.name for c in result.new_claims}
        command.placements = {
            p.key: target
            for p in moved
            if (target := result.placements.get(p.key)) is not None and target not in claim_names
        }
    command.message = describe(command)
    return command


def describe(command: Command) -> str:
    if not command.replacements:
        target = "pods fit on the remaining nodes"
    elif len(command.replacements) == 1:
        r = command.replacements[0]
        names = r.instance_type_names
        more = f" (+{len(names) - 1} more options)" if len(names) > 1 else ""
        target = f"1 {r.capacity_type} {names[0]}{more}"
    else:
        shapes = ", ".join(f"{r.capacity_type} {r.instance_type_names[0]}" for r in command.replacements)
        target = f"{len(command.replacements)} new nodes ({shapes})"
    count = len(command.candidates)
    saves = f"saves ${command.savings_per_hour:.4f}/h"
    if command.savings_per_hour_best != command.savings_per_hour:
        saves += f", up to ${command.savings_per_hour_best:.4f}/h"
    return f"{command.decision}: {count} node(s) -> {target} ({saves})"


def spot_last(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The `max_replacements` extension's order for multi-node consolidation when spot-to-spot is off:
    the cost order, with spot nodes moved after the others. Freshly launched spot replacements hold
    few pods, so they lead the cost order; a prefix made only of them may only be deleted, which stops
    the prefix search before it reaches on-demand nodes that could be repacked onto cheaper spot
    nodes. Behind the others they can still be deleted or repacked along with on-demand nodes."""
    return [c for c in candidates if c.capacity_type != CAPACITY_SPOT] + [
        c for c in candidates if c.capacity_type == CAPACITY_SPOT
    ]


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


def apply_balanced_gate(gate: BalancedGate, proposal: Proposal) -> Proposal:
    """Drop the command when a Balanced source pool rejects it (Karpenter's ApproveCommand); an
    approved one says its score in its message."""
    command = proposal.command
    if command is None:
        return proposal
    scores = gate.scores(command)
    why = gate.rejection(scores)
    if why is not None:
        proposal.command, proposal.why = None, why
    elif scores:
        command.scores = [s.verdict() for s in scores]
        command.message += f" [{describe_scores(scores)}]"
    return proposal


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
        return validate_consolidation(ctx, command)


class MultiNodeConsolidation(_Consolidation):
    """Delete or replace as many savings-ratio-ordered candidates at once as the simulation allows (§2.2)."""

    name = MULTI_NODE_CONSOLIDATION
    consolidation_type = CONSOLIDATION_MULTI

    def __init__(self) -> None:
        self.timed_out = False
        self.probes = 0
        self.gate: BalancedGate | None = None

    def compute(self, ctx: PlanContext, candidates: list[Candidate], budgets: BudgetMap) -> list[Command]:
        candidates = sort_by_savings_ratio(candidates)
        if ctx.options.max_replacements > 1 and not ctx.options.spot_to_spot:
            candidates = spot_last(candidates)
        usable = self.usable(ctx, candidates, budgets)
        self.timed_out, self.probes = False, 0
        if len(usable) < 2:
            return []
        self.gate = BalancedGate(ctx, usable)
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

    def usable(self, ctx: PlanContext, candidates: list[Candidate], budgets: BudgetMap) -> list[Candidate]:
        """The candidates the prefix search may use, in order: not empty, and within the pool's budget.

        Empty nodes are left to emptiness (Karpenter v1.x): taking them here would spend the
        Underutilized budget on them and bypass a stricter Empty budget (`nodes: "0"`, reasons Empty).
        Budget-spent pools are dropped so the search never considers more nodes than it may disrupt;
        budgets are only really spent for the chosen command."""
        trial = budgets.copy()
        usable = []
        for candidate in candidates:
            if candidate.empty_by_eviction_cost:
                ctx.explain(candidate.name, self.name, "empty: left to emptiness")
            elif trial.take(candidate.pool_name):
                usable.append(candidate)
        return usable

    def probe(self, ctx: PlanContext, prefix: list[Candidate], prepared: SnapshotSimulation) -> Proposal:
        proposal = compute_consolidation(
            ctx, prefix, method=self.name, prepared=prepared, max_replacements=ctx.options.max_replacements
        )
        command = proposal.command
        if command is None:
            return proposal
        if not command.replacements:
            return apply_balanced_gate(self.gate, proposal) if self.gate is not None else proposal
        filtered = [filter_out_same_instance_type(options, prefix) for options in proposal.options]
        if not all(filtered):
            proposal.command = None
            proposal.why = "the replacement would be no cheaper than a node of the same type being removed"
            return proposal
        missing = self.min_values_missing(proposal, filtered, prepared)
        if missing:
            # Karpenter's filterByPriceWithMinValues: a launch that cannot honour minValues is dropped.
            proposal.command = None
            proposal.why = f"Filtering out the removed nodes' instance types: {missing}"
            return proposal
        if filtered != proposal.options:
            assert proposal.simulation is not None
            proposal.options = filtered
            if refuse_unlaunchable(proposal, prepared).command is None:
                return proposal
            for replacement, claim, options in zip(
                command.replacements, proposal.simulation.replacements, filtered, strict=True
            ):
                replacement.instance_types = prepared.replacement(
                    claim, options=[o.instance_type for o in options]
                ).instance_types
            command.message = describe(command)
        return apply_balanced_gate(self.gate, proposal) if self.gate is not None else proposal

    @staticmethod
    def min_values_missing(
        proposal: Proposal, filtered: list[list[ClaimOption]], prepared: SnapshotSimulation
    ) -> str | None:
        """What minValues a new node's filtered options no longer satisfy (None: all still do)."""
        assert proposal.simulation is not None
        claims = proposal.simulation.replacements
        for claim, options in zip(claims, filtered, strict=True):
            missing = prepared.simulator.min_values_met(claim, [o.instance_type for o in options])
            if missing:
                return missing
        return None


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
        ordered = round_robin_by_nodepool(
            sort_by_savings_ratio(candidates), ctx.options.single_node_priority_pools
        )
        self.timed_out, self.unreached_pools, self.probes = False, [], 0
        gate = BalancedGate(ctx, ordered)
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
            if candidate.empty_by_eviction_cost:
                # Left to emptiness: its own budget reason (Empty) must not be bypassed here.
                ctx.explain(candidate.name, self.name, "empty: left to emptiness")
                continue
            best_case = gate.can_pass(candidate)
            if best_case is not None:
                # Karpenter's CanPassThreshold: even deleting it outright scores too low.
                why = f"consolidationPolicy Balanced: even deleting it, {best_case.describe()}"
                ctx.explain(candidate.name, self.name, why)
                continue
            proposal = compute_consolidation(ctx, [candidate], method=self.name, prepared=prepared)
            proposal = apply_balanced_gate(gate, proposal)
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
    "spot_last",
]
