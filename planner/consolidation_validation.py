"""Is a consolidation command still right on a fresh snapshot? (behaviour notes §1.7)

Pure: the controller waits its 15 s (a durable timer), observes the cluster again and calls
`validate_consolidation(fresh_ctx, command, method)` (through `method.validate`). The command stands
only if, on the fresh state:
1. every node of it is still a consolidation candidate (initialized, not deleting, no do-not-disrupt
   or blocking PDB, consolidatable, policy WhenEmptyOrUnderutilized): otherwise "churn";
2. all of them fit a freshly computed Underutilized budget: otherwise "budget";
3. re-simulating their removal places every non-pending pod ("scheduling" otherwise) and needs what
   the command planned: no new node for a delete; exactly one for a replace, whose options still
   include every instance type the command would launch (so the replacement is no more expensive);
   for a command of the `max_replacements` extension, exactly as many new nodes, each still allowing
   every type planned for it, with either packing.
Karpenter's nomination check (a pod about to land on a node) has no equivalent in a snapshot; the
controller should observe after the delay, which is when a nominated pod would show up as bound.
"""

from __future__ import annotations

from api.constants import REASON_UNDERUTILIZED
from planner.budgets import build_budget_map
from planner.candidates import build_candidates, consolidation_block, consolidation_policy_block
from planner.model import Candidate, Command, PlanContext, ValidationResult
from planner.scheduling.adapter import snapshot_simulation
from planner.scheduling.results import COST_PACKING, KARPENTER_PACKING


def validate_consolidation(ctx: PlanContext, command: Command) -> ValidationResult:
    """Re-check a multi- or single-node consolidation command against the fresh snapshot in `ctx`."""
    candidates, blocked = build_candidates(ctx)
    fresh = {c.name: c for c in candidates}
    why_blocked = {b.node: b.reason for b in blocked}
    kept: list[Candidate] = []
    for name in command.nodes:
        candidate = fresh.get(name)
        if candidate is None:
            reason = why_blocked.get(name, "it is gone or no longer managed")
            return ValidationResult(False, None, f"churn: {name} is no longer a candidate ({reason})")
        if candidate.pod_block is not None:
            return ValidationResult(False, None, f"churn: {name}: {candidate.pod_block}")
        block = consolidation_block(ctx, candidate) or consolidation_policy_block(candidate)
        if block is not None:
            return ValidationResult(False, None, f"churn: {name}: {block}")
        kept.append(candidate)
    if not kept:
        return ValidationResult(False, None, "churn: the command has no nodes")

    budgets = build_budget_map(ctx, REASON_UNDERUTILIZED)
    for candidate in kept:
        if not budgets.take(candidate.pool_name):
            return ValidationResult(False, None, f"budget: {budgets.exhausted_message(candidate.pool_name)}")

    if len(command.replacements) > 1:
        return _validate_several(ctx, command, kept)
    result = snapshot_simulation(ctx).run(
        [c.name for c in kept],
        gone=ctx.marked_for_deletion,
        max_new_claims=1,
        stop_on_failure=True,
        consolidation=True,
    )
    if not result.all_non_pending_scheduled:
        return ValidationResult(False, None, f"scheduling: {result.non_pending_errors()}")
    needed = result.replacements
    if not needed:
        if command.replacements:
            return ValidationResult(
                False, None, "scheduling: the pods now fit without a replacement; a better command exists"
            )
        return ValidationResult(True, command)
    if not command.replacements:
        return ValidationResult(False, None, "scheduling: the pods no longer fit without a new node")
    planned = set(command.replacements[0].instance_type_names)
    missing = sorted(planned - set(needed[0].instance_types))
    if missing:
        return ValidationResult(
            False,
            None,
            f"scheduling: the replacement can no longer be {', '.join(missing)}; it would cost more",
        )
    return ValidationResult(True, command)


def _validate_several(ctx: PlanContext, command: Command, kept: list[Candidate]) -> ValidationResult:
    """A command of the `max_replacements` extension stands if one of the two packings still needs
    exactly its number of new nodes and each new node, in order, may still be every instance type the
    command would launch it as (so no launch can cost more than planned)."""
    prepared = snapshot_simulation(ctx)
    planned = [set(r.instance_type_names) for r in command.replacements]
    why = ""
    for packing in (KARPENTER_PACKING, COST_PACKING):
        result = prepared.run(
            [c.name for c in kept],
            gone=ctx.marked_for_deletion,
            max_new_claims=len(planned),
            stop_on_failure=True,
            packing=packing,
            consolidation=True,
        )
        if not result.all_non_pending_scheduled:
            why = f"scheduling: {result.non_pending_errors()}"
            continue
        needed = result.replacements
        if len(needed) < len(planned):
            why = (
                f"scheduling: the pods now need {len(needed)} new node(s), not {len(planned)}; "
                "a better command exists"
            )
            continue
        for index, (types, claim) in enumerate(zip(planned, needed, strict=True), 1):
            missing = sorted(types - set(claim.instance_types))
            if missing:
                why = (
                    f"scheduling: new node {index} can no longer be {', '.join(missing)}; it would cost more"
                )
                break
        else:
            return ValidationResult(True, command)
    return ValidationResult(False, None, why)
