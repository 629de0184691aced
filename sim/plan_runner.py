"""Run a plan: start its commands as DisruptionWorkflows, then follow them to the end.

Client-side code (a Temporal client, no worker): what `karpflow demo` uses today and what a
`karpflow disrupt` command can use as it is. It imports nothing from the simulator; it lives in
`sim/` only because the demo is its first user.

    started = await start_disruptions(client, plan.commands_)
    rows = await follow_disruptions(client, started, within=120, on_progress=print_rows)
    failed = [row for row in rows if not row.succeeded]

Workflow ids come from `api.workflow_io.disruption_workflow_id` (stable for the same decision), the
inputs from `disruption_input`. A command whose workflow already runs is followed, not started twice.
Progress comes from the workflows themselves: the `status` query of each DisruptionWorkflow and the
`phase` query of the TerminationWorkflows it started, and the failure of a workflow that failed.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field
from rich.table import Table
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowQueryFailedError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from api.workflow_ids import termination_workflow_id
from api.workflow_io import (
    DisruptionInput,
    DisruptionStatus,
    ReplacementStatus,
    disruption_input,
    disruption_workflow_id,
)

TASK_QUEUE = "karpflow"
WORKFLOW_TYPE = "DisruptionWorkflow"


@dataclass(frozen=True)
class StartedDisruption:
    """One command handed to Temporal: its workflow id and what it was asked to do."""

    workflow_id: str
    method: str
    reason: str
    decision: str  # "delete" or "replace"
    nodes: tuple[str, ...]
    input: DisruptionInput
    already_running: bool = False  # the id was running already: it is followed, not started again

    @property
    def replacements(self) -> list[str]:
        return [
            f"{spec.nodepool}: {', '.join(spec.instance_types[:3])}"
            f"{' …' if len(spec.instance_types) > 3 else ''} {'/'.join(spec.capacity_type)}"
            for spec in self.input.replacements
        ]


async def start_disruptions(
    client: Client, commands: Iterable[Any], *, task_queue: str = TASK_QUEUE
) -> list[StartedDisruption]:
    """Start one DisruptionWorkflow per planner `Command` (planner/model.py), in the plan's order."""
    started = []
    for command in commands:
        workflow_id = disruption_workflow_id(command)
        workflow_input = disruption_input(command)
        try:
            await client.start_workflow(WORKFLOW_TYPE, workflow_input, id=workflow_id, task_queue=task_queue)
            already_running = False
        except WorkflowAlreadyStartedError:
            already_running = True
        started.append(
            StartedDisruption(
                workflow_id=workflow_id,
                method=command.method,
                reason=command.reason,
                decision=command.decision,
                nodes=tuple(command.nodes),
                input=workflow_input,
                already_running=already_running,
            )
        )
    return started


# -- following them ------------------------------------------------------------------------------


class DisruptionProgress(BaseModel):
    """Where one DisruptionWorkflow is: one row of the progress table."""

    workflow_id: str
    reason: str
    nodes: list[str]
    execution: str = "Running"  # Temporal's execution status: Running, Completed, Failed, Canceled...
    phase: str = "Starting"  # the workflow's own phase (status query), "Starting" before it answers
    # One line per replacement (see replacement_text), then the offerings found without capacity.
    replacements: list[str] = Field(default_factory=list)
    terminations: dict[str, str] = Field(default_factory=dict)  # candidate -> termination state/phase
    replaced_by: list[str] = Field(default_factory=list)  # nodes of the initialized replacements
    failure: str = ""  # why the workflow failed, from its failure (empty unless it did)

    @property
    def done(self) -> bool:
        return self.execution != "Running"

    @property
    def succeeded(self) -> bool:
        return self.execution == "Completed"


class FollowTimeout(TimeoutError):
    """The workflows did not all close in time; `rows` is where each one was."""

    def __init__(self, timeout: float, rows: list[DisruptionProgress]) -> None:
        running = [row.workflow_id for row in rows if not row.done]
        super().__init__(
            f"{len(running)} workflow(s) still running after {timeout:.0f}s: {', '.join(running)}"
        )
        self.rows = rows


_EXECUTION_NAMES = {
    WorkflowExecutionStatus.RUNNING: "Running",
    WorkflowExecutionStatus.COMPLETED: "Completed",
    WorkflowExecutionStatus.FAILED: "Failed",
    WorkflowExecutionStatus.CANCELED: "Canceled",
    WorkflowExecutionStatus.TERMINATED: "Terminated",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "ContinuedAsNew",
    WorkflowExecutionStatus.TIMED_OUT: "TimedOut",
}


async def disruption_progress(client: Client, started: StartedDisruption) -> DisruptionProgress:
    """Ask Temporal and the workflow where it is (a few RPCs; safe to call every half second)."""
    handle = client.get_workflow_handle(started.workflow_id, result_type=DisruptionStatus)
    row = DisruptionProgress(
        workflow_id=started.workflow_id, reason=started.reason, nodes=list(started.nodes)
    )
    description = await handle.describe()
    row.execution = _EXECUTION_NAMES.get(description.status, str(description.status))
    status: DisruptionStatus | None = None
    if row.execution == "Completed":
        status = await handle.result()
    else:
        # A query before the first workflow task has run, or on a closed workflow whose worker is
        # gone, has no answer: the row then shows what Temporal itself knows.
        try:
            status = await handle.query("status", result_type=DisruptionStatus)
        except (RPCError, WorkflowQueryFailedError):
            status = None
    if row.done and not row.succeeded:
        row.failure = await _failure(handle)
    if status is not None:
        row.phase = status.phase
        row.replacements = [replacement_text(r) for r in status.replacements] + [
            f"no capacity: {u.offering}" for u in status.unavailable_offerings
        ]
        row.replaced_by = [r.node for r in status.replacements if r.node and r.state == "Initialized"]
        row.terminations = {c.node: c.termination for c in status.candidates}
        running = [c.node for c in status.candidates if c.termination == "Running"]
        phases = await asyncio.gather(*(_termination_phase(client, node) for node in running))
        for node, phase in zip(running, phases, strict=True):
            if phase:
                row.terminations[node] = phase
        if row.done and not row.succeeded and not row.failure:
            row.failure = status.message
    elif row.done:
        row.phase = row.execution
    return row


def replacement_text(replacement: ReplacementStatus) -> str:
    """Where one replacement is, e.g. `Registered r5.large/us-west-2b/spot i-0abc → ip-172-31-16-4`:
    its state, the offering it was launched with, the instance and the node that registered for it
    (each as soon as it is known), and why it failed if it did."""
    parts = [f"{replacement.nodepool}: {replacement.state}"]
    if replacement.offering is not None:
        parts.append(replacement.offering.key)
    if replacement.instance_id:
        parts.append(replacement.instance_id)
    if replacement.node:
        parts.append(f"→ {short_node(replacement.node)}")
    text = " ".join(parts)
    if replacement.state in ("Failed", "Discarded") and replacement.message:
        text += f" ({replacement.message})"
    return text


async def _termination_phase(client: Client, node: str) -> str | None:
    """The TerminationWorkflow's phase (Draining...), or None while it cannot answer: the candidate's
    own state (Running) then stands."""
    try:
        return await client.get_workflow_handle(termination_workflow_id(node)).query("phase", result_type=str)
    except Exception:
        return None


async def _failure(handle: Any) -> str:
    """The message of a closed workflow's failure, with its cause chain."""
    try:
        await handle.result()
    except WorkflowFailureError as err:
        messages, cause = [], err.cause
        while cause is not None:
            text = getattr(cause, "message", None) or str(cause)
            if text and text not in messages:
                messages.append(text)
            cause = cause.__cause__
        return ": ".join(messages) or str(err)
    except Exception as err:
        return str(err)
    return ""


async def follow_disruptions(
    client: Client,
    started: Sequence[StartedDisruption],
    *,
    within: float,
    interval: float = 0.5,
    on_progress: Callable[[list[DisruptionProgress]], None] | None = None,
) -> list[DisruptionProgress]:
    """Poll every workflow until all have closed; call `on_progress` with every round of rows.

    Returns the final rows (check `.succeeded`). Raises FollowTimeout after `within` seconds; the
    workflows keep running (they are durable: follow them again, or cancel them)."""
    deadline = time.monotonic() + within
    latest: dict[str, DisruptionProgress] = {}
    while True:
        # A closed workflow does not change any more: it is asked once.
        still_open = [s for s in started if s.workflow_id not in latest or not latest[s.workflow_id].done]
        for row in await asyncio.gather(*(disruption_progress(client, s) for s in still_open)):
            latest[row.workflow_id] = row
        rows = [latest[s.workflow_id] for s in started]
        if on_progress is not None:
            on_progress(rows)
        if all(row.done for row in rows):
            return rows
        if time.monotonic() > deadline:
            raise FollowTimeout(within, rows)
        await asyncio.sleep(interval)


# -- showing them -------------------------------------------------------------------------------


def short_node(name: str) -> str:
    """`ip-172-31-5-90` for `ip-172-31-5-90.us-west-2.compute.internal`: tables stay narrow."""
    return name.split(".", 1)[0]


def progress_table(rows: Sequence[DisruptionProgress], title: str = "Disruptions") -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in ("Workflow", "Reason", "Execution", "Phase", "Replacements", "Terminations"):
        table.add_column(column)
    colours = {"Completed": "green", "Running": "yellow"}
    for row in rows:
        colour = colours.get(row.execution, "red")
        table.add_row(
            row.workflow_id,
            row.reason,
            f"[{colour}]{row.execution}[/{colour}]",
            row.phase,
            "\n".join(row.replacements) or "-",
            "\n".join(f"{short_node(node)}: {state}" for node, state in row.terminations.items()) or "-",
        )
    return table


def progress_line(row: DisruptionProgress) -> str:
    """One line per change, for logs and terminals without live tables."""
    parts = [f"{row.workflow_id}: {row.execution}/{row.phase}"]
    if row.replacements:
        parts.append("replacements " + "; ".join(row.replacements))
    if row.terminations:
        parts.append("terminations " + ", ".join(f"{short_node(n)} {s}" for n, s in row.terminations.items()))
    return "  ".join(parts)


def workflows_query(nodes: Iterable[str]) -> str:
    """A visibility query for every karpflow workflow about these nodes: the disruptions and the
    terminations they started (search attribute `KarpflowNodes`)."""
    quoted = ", ".join(f"'{node}'" for node in sorted(set(nodes)))
    return f"KarpflowNodes IN ({quoted})"


def ui_workflows_url(ui_url: str, namespace: str, query: str) -> str:
    """The Temporal Web UI's workflow list, filtered by a visibility query."""
    return (
        f"{ui_url.rstrip('/')}/namespaces/{urllib.parse.quote(namespace, safe='')}/workflows"
        f"?query={urllib.parse.quote(query, safe='')}"
    )
