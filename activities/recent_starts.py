"""The disruptions that started recently, as rate budgets count them (planner/rate_budgets.py), read
from Temporal visibility: one definition for the controller's pass (activities/planning.py), the
interruption poller's rebalance check (cluster/interruption.py) and the taint of every voluntary
command (activities/controls_gate.py).

Counted: this task queue's DisruptionWorkflows and TerminationWorkflows by StartTime, each node
they name (KarpflowNodes), under the NodePools they name (KarpflowNodePool), except the
DisruptionWorkflows that took no node:

- closed FAILED, CANCELED or TERMINATED (a voluntary command that fails rolls back: phase RolledBack);
- closed in phase Rejected: an approval that was rejected or timed out completes (COMPLETED, like a
  command that succeeded) having changed nothing (workflows/disruption.py `_approved`); so does one
  whose plan no longer held when it was judged again (phase Invalidated).

Why by the Phase search attribute, and why here rather than in the visibility query: the status
cannot tell a rejected command from one that succeeded (both COMPLETED), and reading each
workflow's result would cost a call per command; Phase is what the workflow itself upserts as it
closes, and visibility returns it with every execution listed. It is filtered on here, not with
`KarpflowPhase != 'Rejected'` in the query: a command upserts its first Phase only when it first
waits, and SQL visibility (the dev server's SQLite, checked) drops executions without the attribute
from a `!=` comparison, so a command just started would stop counting. Running commands count
whatever their phase: one awaiting approval may take its nodes at any moment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus

from api import search_attributes as sa
from planner.rate_budgets import RecentDisruption

WORKFLOW_TYPES = ("DisruptionWorkflow", "TerminationWorkflow")
UNDONE = frozenset(
    {WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.CANCELED, WorkflowExecutionStatus.TERMINATED}
)
# The phases a DisruptionWorkflow closes in having taken no node (api/workflow_io.py DisruptionPhase).
NOTHING_TAKEN_PHASES = frozenset({"Rejected", "Invalidated", "RolledBack"})


@dataclass(frozen=True)
class Start:
    """One workflow that started a disruption: its nodes and the NodePools it names."""

    workflow_id: str
    run_id: str
    nodes: tuple[str, ...]
    nodepools: tuple[str, ...]
    reason: str
    started_at: datetime


def took_no_node(workflow_type: str, status: WorkflowExecutionStatus | None, phase: str) -> bool:
    """A DisruptionWorkflow that disrupted nothing (see the module's docstring). A termination always
    took its node, whatever its end."""
    if workflow_type != "DisruptionWorkflow":
        return False
    return status in UNDONE or (status != WorkflowExecutionStatus.RUNNING and phase in NOTHING_TAKEN_PHASES)


def starts_query(task_queue: str, since: datetime) -> str:
    types = ", ".join(f"'{t}'" for t in WORKFLOW_TYPES)
    return (
        f"WorkflowType IN ({types}) AND TaskQueue = '{task_queue}' "
        f"AND StartTime > '{since.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')}'"
    )


def start_of(execution: Any) -> Start | None:
    """An execution as `client.list_workflows` lists it, as a Start (None: it took no node)."""
    attributes = execution.typed_search_attributes
    if took_no_node(execution.workflow_type, execution.status, attributes.get(sa.PHASE) or ""):
        return None
    return Start(
        workflow_id=execution.id,
        run_id=execution.run_id or "",
        nodes=tuple(attributes.get(sa.NODES) or ()),
        nodepools=tuple(p for p in (attributes.get(sa.NODEPOOL) or "").split(",") if p),
        reason=attributes.get(sa.REASON) or "",
        started_at=execution.start_time,
    )


async def recent_starts(client: Client, task_queue: str, since: datetime) -> list[Start]:
    """The starts since `since` that took (or may yet take) nodes, in visibility's order."""
    found = []
    async for execution in client.list_workflows(starts_query(task_queue, since)):
        start = start_of(execution)
        if start is not None:
            found.append(start)
    return found


def recent_disruptions(
    starts: Iterable[Start],
    pool_of: Callable[[str], str | None],
    holding: Iterable[str] = (),
    now: datetime | None = None,
) -> list[RecentDisruption]:
    """The starts as rate budgets count them: each node under its NodePool (`pool_of`: the pool of a
    node that still exists; a gone node counts under every pool its command named), once, at its
    earliest start; `holding` are nodes of commands started at `now` that visibility may not list yet."""
    earliest: dict[tuple[str, str], RecentDisruption] = {}

    def add(node: str, pools: Iterable[str], reason: str, started: datetime) -> None:
        known = pool_of(node)
        for pool in [known] if known else pools:
            entry = earliest.get((node, pool))
            if pool and (entry is None or started < entry.started_at):
                earliest[(node, pool)] = RecentDisruption(node, pool, reason, started)

    for start in starts:
        for node in start.nodes:
            add(node, start.nodepools, start.reason, start.started_at)
    if now is not None:
        for node in holding:
            add(node, (), "", now)
    return sorted(earliest.values(), key=lambda d: (d.started_at, d.node))
