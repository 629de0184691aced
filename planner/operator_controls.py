"""Where a planning pass meets the operator's controls: MaintenanceWindows and NodeDisruptionBudgets
(the rules themselves are in planner/maintenance_windows.py and planner/node_disruption_budgets.py).

In a pass (planner/plan.py):
- Forceful methods: expiration and repair leave alone a node whose action a window blocks (soft
  expiration: the node stays a candidate of the next pass and goes as soon as the window allows);
  NodePool deletion, liveness and interruption are never blocked. NodeDisruptionBudgets never stop
  them, but their nodes count as unavailable.
- Voluntary methods: a candidate is not eligible when a window blocks the method's action on it, or
  when a budget selecting it has no room left. The commands a method returns are then admitted in
  order against the budgets: a delete that takes more nodes than a budget allows keeps the nodes
  that fit, a replace that does not fit is dropped. Each node left out is explained ("MaintenanceWindow
  X blocks Consolidation until T", "NodeDisruptionBudget Y allows 0 (...)").
- Validation (15 s later, on a fresh snapshot) checks both again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.maintenance_windows import ACTION_OF_REASON, Window, WindowBlock, blocked
from planner.model import Command, PlanContext
from planner.node_disruption_budgets import NdbLedger, statuses
from planner.rate_budgets import RecentDisruption
from planner.snapshot import Node, Snapshot


def with_outside_controls(
    snapshot: Snapshot, pauses: Mapping[str, Window], recent: list[RecentDisruption] | None
) -> Snapshot:
    """The snapshot seen with the controls that are not cluster objects: the controller's pauses as
    windows, and the starts rate budgets count (None: not read, as no pool has a rate budget). A view:
    the snapshot itself is not changed (the interruption poller shares one between messages)."""
    view = snapshot.at(snapshot.now)
    view.maintenance_windows = {**snapshot.maintenance_windows, **pauses}
    if recent is not None:
        view.recent_disruptions = list(recent)
    return view


def window_block(ctx: PlanContext, node: Node, action: str) -> WindowBlock | None:
    """The windows that block `action` on `node` at the pass's time, if any."""
    windows = ctx.snapshot.maintenance_windows
    if not windows:
        return None
    return blocked(windows.values(), action, node.labels, ctx.now)


def action_of(reason: str) -> str | None:
    """The window action of a voluntary method's reason (Empty, Underutilized, Drifted)."""
    return ACTION_OF_REASON.get(reason)


def ndb_ledger(ctx: PlanContext) -> NdbLedger:
    """The budgets at this point of the pass: in-flight nodes and those this pass already took count."""
    return NdbLedger(
        statuses(
            ctx.snapshot.node_disruption_budgets.values(),
            ctx.snapshot.nodes.values(),
            ctx.marked_for_deletion,
        )
    )


def voluntary_block(ctx: PlanContext, node: Node, reason: str, ledger: NdbLedger | None = None) -> str | None:
    """Why a voluntary method with `reason` may not take `node` now (None: the controls allow it)."""
    action = action_of(reason)
    if action is not None and (block := window_block(ctx, node, action)) is not None:
        return block.message()
    if ctx.snapshot.node_disruption_budgets:
        status = (ledger or ndb_ledger(ctx)).blocking([node.name])
        if status is not None:
            return status.message()
    return None


def admit(
    ctx: PlanContext, method_name: str, commands: Sequence[Command], ledger: NdbLedger | None = None
) -> list[Command]:
    """The commands of a voluntary method that fit the NodeDisruptionBudgets, in order (a delete is
    trimmed to the nodes that fit; a replace that does not fit is dropped), spent from `ledger` (a
    fresh one by default). Every node left out is explained on behalf of `method_name`."""
    if not ctx.snapshot.node_disruption_budgets:
        return list(commands)
    ledger = ledger if ledger is not None else ndb_ledger(ctx)
    admitted = []
    for command in commands:
        status = ledger.blocking(command.nodes)
        if status is None:
            ledger.take(command.nodes)
            admitted.append(command)
            continue
        if command.decision == "replace":
            selected = sum(1 for name in command.nodes if name in status.selected)
            why = f"{status.message()}, and a replace of {selected} of its nodes cannot be cut: not started"
            for name in command.nodes:
                ctx.explain(name, method_name, why)
            continue
        kept = []
        for candidate in command.candidates:
            blocked_by = ledger.blocking([candidate.name])
            if blocked_by is None:
                ledger.take([candidate.name])
                kept.append(candidate)
            else:
                ctx.explain(candidate.name, method_name, blocked_by.message())
        if kept:
            command.candidates = kept
            command.message += f"; {len(kept)} node(s) kept within {status.ndb.name}"
            admitted.append(command)
    return admitted
