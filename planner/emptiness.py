"""Emptiness: delete every empty, consolidatable node the budgets allow, in one command (§2.1).

Empty is Karpenter's (v1.14 `Candidate.IsEmpty`): no reschedulable pod with a positive eviction cost
(kube/eviction_cost.py; DaemonSet and mirror pods never count, terminating StatefulSet pods do). A
node whose pods all carry a very negative pod-deletion-cost or priority is empty too: it is deleted
without a scheduling simulation, as Karpenter deletes it, and its termination evicts those pods
as any drain does (the command's message counts them). The pool's consolidateAfter must not be
Never and the node must be Consolidatable. Works for every consolidation policy (Balanced never
scores an empty delete, as in Karpenter). Reason `Empty`, graceful class; validated after the 15 s
delay by `validate`, which keeps the subset of nodes still valid (the command fails only if none
remain); the taint activity checks the eviction cost once more (activities/guards.py
`no_longer_empty`).
A node hosting CapacityBuffer pods is not emptied (planner/buffer_hosts.py `buffer_block`).
"""

from __future__ import annotations

from api.constants import REASON_EMPTY
from planner.balanced import sort_by_savings_ratio
from planner.budgets import build_budget_map
from planner.buffer_hosts import buffer_block
from planner.candidates import build_candidates, consolidation_block
from planner.capacity_buffers import ready_buffers
from planner.model import (
    CONSOLIDATION_EMPTY,
    EMPTINESS,
    BudgetMap,
    Candidate,
    Command,
    DisruptionClass,
    PlanContext,
    ValidationResult,
)


class Emptiness:
    name = EMPTINESS
    reason = REASON_EMPTY
    disruption_class = DisruptionClass.GRACEFUL
    consolidation_type = CONSOLIDATION_EMPTY

    def should_disrupt(self, ctx: PlanContext, candidate: Candidate) -> bool:
        if not candidate.empty_by_eviction_cost:
            return False
        block = consolidation_block(ctx, candidate) or buffer_block(ctx, candidate.name)
        if block is not None:
            ctx.explain(candidate.name, self.name, f"empty, but {block}")
            return False
        return True

    def compute(self, ctx: PlanContext, candidates: list[Candidate], budgets: BudgetMap) -> list[Command]:
        chosen = []
        # Karpenter's Emptiness sorts with the consolidation order (savings ratio, highest first), so a
        # tight budget deletes the dearest empty nodes first.
        for candidate in sort_by_savings_ratio(candidates):
            if budgets.take(candidate.pool_name):
                chosen.append(candidate)
            else:
                ctx.explain(
                    candidate.name, self.name, f"empty, but {budgets.exhausted_message(candidate.pool_name)}"
                )
        if not chosen:
            return []
        command = Command(self.name, self.reason, chosen, [], self.disruption_class, empty_message(chosen))
        command.capacity_buffers = ready_buffers(ctx.snapshot)
        return [command]

    def validate(self, ctx: PlanContext, command: Command) -> ValidationResult:
        """Re-check on the fresh snapshot in `ctx`: keep the nodes that are still candidates, still
        empty and consolidatable, free of pod blocks, and within a freshly computed budget."""
        return validate_emptiness(ctx, command)


def validate_emptiness(ctx: PlanContext, command: Command) -> ValidationResult:
    candidates, _ = build_candidates(ctx)
    fresh = {c.name: c for c in candidates}
    budgets = build_budget_map(ctx, REASON_EMPTY)
    method = Emptiness()
    kept: list[Candidate] = []
    dropped: list[str] = []
    for name in command.nodes:
        candidate = fresh.get(name)
        if (
            candidate is None
            or candidate.pod_block is not None
            or not method.should_disrupt(ctx, candidate)
            or not budgets.take(candidate.pool_name)
        ):
            dropped.append(name)
            continue
        kept.append(candidate)
    if not kept:
        return ValidationResult(
            False, None, f"no node of the command is still empty and disruptable: {dropped}"
        )
    subset = Command(command.method, command.reason, kept, [], command.disruption_class, empty_message(kept))
    subset.capacity_buffers = ready_buffers(ctx.snapshot)
    return ValidationResult(True, subset, f"dropped {dropped}" if dropped else "")


def empty_message(nodes: list[Candidate]) -> str:
    """The command's message: how many nodes, and the pods its drains still evict (pods whose eviction
    cost is not positive leave a node empty; Karpenter evicts them without simulating where they go)."""
    evicted = sum(len(c.reschedulable_pods) for c in nodes)
    if not evicted:
        return f"{len(nodes)} empty node(s)"
    return (
        f"{len(nodes)} empty node(s); {evicted} pod(s) with no positive eviction cost "
        "(pod-deletion-cost, priority) evicted without a scheduling simulation"
    )
