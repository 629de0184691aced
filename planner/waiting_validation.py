"""A command that waited (for an operator's approval) is checked again before it takes any node.

A plan is a judgement on the cluster as it was: a command that waited up to a day for approval would
otherwise taint and drain on a plan that no longer holds (its nodes replaced, a pod with
do-not-disrupt arrived, the NodePool's budget spent by other commands, a pause or a window begun, the
drift reverted). So, when the wait ends and before the taint, the command is judged again on a fresh
view, as strictly as the pass that planned it:

1. its nodes are there, with the UIDs it was decided for, and not held by another command;
2. each is still a candidate of its method (the node filters; `should_disrupt`: still empty, still
   drifted, consolidatable) and no pod blocks it (graceful methods);
3. the operator's controls allow it: MaintenanceWindows and pauses, NodeDisruptionBudgets, and the
   NodePool's disruption and rate budgets for its reason;
4. the method's own validation (consolidation's: its pods still fit, the replacement still saves).

A command without its planner form (started by hand) gets 1 and 3. The approval itself is read again
too: when no NodePool of the command still asks for one (`karpflow.dev/require-approval` removed),
the wait ends on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from api.constants import BUDGET_REASONS
from api.karpflow_overrides import read_overrides
from api.nodepool import NodePool
from planner.budgets import build_budget_map
from planner.candidates import make_candidate, node_block
from planner.catalog import Catalog
from planner.health_breaker import with_health_breaker
from planner.model import DisruptionClass, Method, PlanContext, PlanOptions
from planner.operator_controls import ndb_ledger, voluntary_block
from planner.plan import CommandOut, ValidationOut, command_from_out, command_out, default_methods
from planner.snapshot import Node, Snapshot


def approval_required(snapshot: Snapshot, nodes: Iterable[str], reason: str) -> bool:
    """Whether a NodePool of these nodes still asks an operator to approve `reason` (as
    api/workflow_io.py `approval_for` decides it when the command is planned)."""
    for name in nodes:
        node = snapshot.nodes.get(name)
        pool = snapshot.nodepools.get(node.nodepool or "") if node is not None else None
        if pool is None:
            continue
        overrides = read_overrides(pool.metadata.annotations or {})[0]
        if reason in (overrides.require_approval or []):
            return True
    return False


def validate_waited(
    snapshot: Snapshot,
    catalog: Catalog,
    nodes: Sequence[str],
    reason: str,
    uids: Mapping[str, str],
    planned: CommandOut | None,
    options: PlanOptions | None = None,
    *,
    held: Mapping[str, str] | None = None,
    methods: Sequence[Method] | None = None,
) -> ValidationOut:
    """The verdict on a command that waited (module docstring). `held`: node -> the other command
    that holds it now."""
    options = options or PlanOptions()
    snapshot, _ = with_health_breaker(snapshot, options)
    ctx = PlanContext(snapshot=snapshot, catalog=catalog, options=options)
    for name in nodes:
        node = snapshot.nodes.get(name)
        if node is None:
            return ValidationOut(valid=False, reason=f"{name}: the node is gone")
        if uids.get(name) and node.uid and node.uid != uids[name]:
            return ValidationOut(valid=False, reason=f"{name}: the name now belongs to another node")
        if held and name in held:
            return ValidationOut(valid=False, reason=f"{name}: {held[name]} holds it now")
        pool = snapshot.nodepools.get(node.nodepool or "")
        if (why := node_block(node, pool)) is not None:
            return ValidationOut(valid=False, reason=f"{name}: {why}")
    by_name = {m.name: m for m in (methods if methods is not None else default_methods())}
    method = by_name.get(planned.method) if planned is not None else None
    command = command_from_out(ctx, planned) if planned is not None else None
    if planned is not None and command is None:
        return ValidationOut(valid=False, reason="a node of the command or its nodepool is gone")
    candidates = (
        command.candidates
        if command is not None
        else [make_candidate(ctx, node, pool) for node, pool in _nodes_and_pools(snapshot, nodes)]
    )
    if method is not None:
        graceful = method.disruption_class != DisruptionClass.EVENTUAL
        for candidate in candidates:
            if candidate.pod_block is not None and (graceful or not candidate.termination_grace_period):
                return ValidationOut(valid=False, reason=f"{candidate.name}: {candidate.pod_block}")
            if not method.should_disrupt(ctx, candidate):
                return ValidationOut(valid=False, reason=f"{candidate.name}: no longer {reason}")
    ledger = ndb_ledger(ctx)
    for candidate in candidates:
        if (why := voluntary_block(ctx, candidate.node, reason, ledger)) is not None:
            return ValidationOut(valid=False, reason=f"{candidate.name}: {why}")
    if (status := ledger.blocking([c.name for c in candidates])) is not None:
        return ValidationOut(valid=False, reason=status.message())
    if reason in BUDGET_REASONS:
        budgets = build_budget_map(ctx, reason)
        for candidate in candidates:
            if not budgets.take(candidate.pool_name):
                return ValidationOut(
                    valid=False, reason=f"budget: {budgets.exhausted_message(candidate.pool_name)}"
                )
    if method is None or command is None:
        return ValidationOut(valid=True, command=planned)
    result = method.validate(ctx, command)
    return ValidationOut(
        valid=result.valid,
        reason=result.reason,
        command=command_out(result.command) if result.command is not None else None,
    )


def _nodes_and_pools(snapshot: Snapshot, nodes: Iterable[str]) -> list[tuple[Node, NodePool]]:
    pairs = []
    for name in nodes:
        node = snapshot.nodes[name]
        pool = snapshot.nodepools.get(node.nodepool or "")
        if pool is not None:
            pairs.append((node, pool))
    return pairs
