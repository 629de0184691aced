"""`karpflow disrupt NODE...`: plan on the live cluster, show the disruptions that name these nodes,
ask, start them and follow them live until they end.

    karpflow disrupt ip-10-0-1-2.us-west-2.compute.internal        # show the command, ask, start, follow
    karpflow disrupt --dry-run ip-10-0-1-2.us-west-2.compute.internal   # only show what would start
    karpflow disrupt --yes --all                                    # every command of the plan, no question

The plan is `karpflow plan --live --all-methods` with the nodes of running disruptions and
terminations held out exactly as the controller holds them out (activities/in_flight.py: read from
Temporal visibility, shown to the planner as tainted), so a node another command holds is never
given a second one: it is named with the command that holds it (and, when that one waits for
approval, the `karpflow approve` that ends the wait). A named node that is not in the cluster is an
error. Every command that would start is shown first, with every node it disrupts (a multi-node
command may take nodes, even of another NodePool, that were not named: they are marked), and the
operator is asked; `--yes` skips the question, `--dry-run` only shows. Without a terminal to ask on
and without `--yes`, nothing starts (exit 2).

Each command starts as a DisruptionWorkflow under the id the controller would give it (so a command
the controller already started is followed, not started twice), searchable by its nodes from the
start (as the controller's are), with a summary and a memo the Web UI shows
(api/workflow_summaries.py). While one follows, the display shows each command's progress and what it
waits for (approval, replacements, drains, a MaintenanceWindow or NodeDisruptionBudget), with the
command that ends the wait where there is one. Connection settings are the worker's (`KARPFLOW_*`;
`source .state/env` or `karpflow --state-dir DIR disrupt ...` on the dev stack).

Exit status: 0 when every disruption succeeded (with --dry-run: something would start; with
--no-follow: they started), 1 when one failed, was cancelled, the operator said no, or nothing could
start, 2 for unusable input (no cluster, a node that does not exist, unknown settings, no terminal to
ask on without --yes).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowQueryFailedError
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.service import RPCError

from activities.in_flight import InFlight, read_in_flight
from api import search_attributes as sa
from api.constants import NODEPOOL_LABEL
from api.duration import format_duration
from api.workflow_io import (
    DisruptionStatus,
    TerminationStatus,
    disruption_input,
    disruption_workflow_id,
)
from api.workflow_summaries import disruption_details, disruption_memo, disruption_summary, short_node
from planner import why_not
from runtime.connections import connect_temporal
from runtime.settings import WorkerSettings, explain

POLL_SECONDS = 0.5
CLOSED_OK = {WorkflowExecutionStatus.COMPLETED}


@dataclass
class Followed:
    workflow_id: str
    summary: str
    handle: WorkflowHandle[Any, Any]
    client: Client
    status: DisruptionStatus | None = None
    closed: WorkflowExecutionStatus | None = None
    seen: list[str] = field(default_factory=list)  # phases, in order
    terminations: dict[str, TerminationStatus] = field(default_factory=dict)  # node -> its termination
    waiting: str = ""  # what it waits for now, in words ("" when it does not wait)

    @property
    def phase(self) -> str:
        if self.closed is not None and self.closed not in CLOSED_OK:
            return self.closed.name.title()
        return self.status.phase if self.status else "Starting"


def _leave(code: int) -> None:
    """Exit at once: a process that used the Temporal client can abort while the interpreter
    finalizes (sdk-python #300)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"karpflow disrupt: {message}", err=True)
    _leave(code)


# -- what to start ------------------------------------------------------------------------------------


def held_line(node: str, holder: tuple[str, str]) -> str:
    """A named node that a running command holds: which one, and what ends its wait if it waits."""
    workflow_id, phase = holder
    line = f"{node}: {why_not.in_flight_reason(workflow_id, phase)}"
    if phase == why_not.AWAITING_APPROVAL_PHASE:
        line += f" (`karpflow approve {workflow_id}` or `karpflow reject {workflow_id}`)"
    return line + "; nothing new started for it"


def unknown_nodes(objects: list[dict[str, Any]], nodes: Collection[str]) -> tuple[list[str], list[str]]:
    """The named nodes the cluster has no Node of, and those it has that belong to no NodePool."""
    labels = {
        (o.get("metadata") or {}).get("name"): (o.get("metadata") or {}).get("labels") or {}
        for o in objects
        if o.get("kind") == "Node"
    }
    missing = [n for n in nodes if n not in labels]
    unmanaged = [n for n in nodes if n in labels and NODEPOOL_LABEL not in labels[n]]
    return missing, unmanaged


def choose(
    result: Any, nodes: tuple[str, ...], every: bool, flying: InFlight | None = None
) -> tuple[list[Any], list[str]]:
    """The plan's commands that name any of `nodes` (all with `every`), and a line for each node
    that no command names: the command that holds it, else the plan's reason."""
    commands = list(result.commands_)
    if every:
        return commands, []
    wanted = set(nodes)
    chosen = [c for c in commands if wanted & set(c.nodes)]
    named = {n for c in chosen for n in c.nodes}
    holders = flying.holders if flying is not None else {}
    blocked = {b.node: b.reason for b in result.blocked}
    unchosen = "no disruption method selects it now (not a candidate, or nothing to gain)"
    missing = [
        held_line(node, holders[node]) if node in holders else f"{node}: {blocked.get(node, unchosen)}"
        for node in nodes
        if node not in named
    ]
    return chosen, missing


def preview(commands: list[Any], nodes: Collection[str], every: bool, settings: WorkerSettings) -> Table:
    """What would start: each command's id, what it does, every node it disrupts (with its NodePool,
    marked when it was not named) and whether it waits for approval."""
    table = Table(title="karpflow disrupt would start", title_justify="left", header_style="bold")
    for column in ("workflow", "what", "nodes it disrupts", "approval"):
        table.add_column(column, overflow="fold")
    named = set(nodes)
    for command in commands:
        workflow_input = disruption_input(command)
        lines = []
        for candidate in command.candidates:
            mark = "" if every or candidate.name in named else "  [yellow]not named[/yellow]"
            lines.append(f"{candidate.name} (NodePool {candidate.pool_name}){mark}")
        approval = workflow_input.approval
        table.add_row(
            disruption_workflow_id(command, settings.cluster_name),
            disruption_summary(command),
            "\n".join(lines),
            f"waits for `karpflow approve` (rejected after {format_duration(approval.timeout)})"
            if approval is not None
            else "-",
        )
    return table


def also_disrupted(commands: list[Any], nodes: Collection[str]) -> list[str]:
    """Nodes the commands disrupt that were not named."""
    named = set(nodes)
    return sorted({n for c in commands for n in c.nodes} - named)


def confirm(console: Console, count: int, extra: list[str], yes: bool, dry_run: bool) -> None:
    """Ask before anything starts; leave with 1 on no, 2 when nobody can be asked (no terminal)."""
    if extra:
        console.print(
            f"[yellow]also disrupted, not named:[/yellow] {', '.join(extra)} (the plan's command takes them "
            "together with the named node)"
        )
    if dry_run:
        console.print(f"--dry-run: {count} disruption(s) would start; nothing started.")
        _leave(0)
    if yes:
        return
    if not sys.stdin.isatty():
        _fail(
            "standard input is not a terminal, so there is no one to ask: pass --yes to start the "
            "disruption(s) shown above without asking, or --dry-run to only show them; nothing started"
        )
    if not click.confirm(f"Start {count} disruption(s)?", default=False):
        console.print("Nothing started.")
        _leave(1)


# -- starting and following -----------------------------------------------------------------------------


def start_attributes(command: Any) -> TypedSearchAttributes:
    """What the command is searchable by from its start, as the controller starts its own (the next
    pass and any other `disrupt` hold its nodes out before its first workflow task runs)."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(sa.NODES, sa.nodes_value(list(command.nodes))),
            SearchAttributePair(sa.REASON, command.reason),
            SearchAttributePair(sa.NODEPOOL, ",".join(command.nodepools)),
        ]
    )


async def start(client: Client, settings: WorkerSettings, command: Any, started_by: str) -> Followed:
    workflow_id = disruption_workflow_id(command, settings.cluster_name)
    from planner.plan import command_out

    workflow_input = disruption_input(
        command,
        planned=command_out(command).model_dump(mode="json", by_alias=True),
        recheck_every=timedelta(seconds=settings.approval_recheck_interval),
    )
    summary = disruption_summary(command, workflow_input.approval)
    handle = await client.start_workflow(
        "DisruptionWorkflow",
        workflow_input,
        id=workflow_id,
        task_queue=settings.task_queue,
        # The controller may have started the same command: follow that one.
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        search_attributes=start_attributes(command),
        static_summary=summary,
        static_details=disruption_details(command, workflow_input.approval),
        memo=disruption_memo(command, started_by),
    )
    return Followed(workflow_id, summary, handle, client)


def waiting_for(item: Followed) -> str:
    """What the command waits for now, and the command that ends the wait where one does."""
    status = item.status
    if item.closed is not None or status is None:
        return ""
    if status.phase == "AwaitingApproval":
        return (
            f"approval: `karpflow approve {item.workflow_id}` lets it go on, "
            f"`karpflow reject {item.workflow_id}` ends it"
        )
    if status.phase in ("Launching", "WaitingForReplacements"):
        pending = [r for r in status.replacements if r.state != "Initialized"]
        if pending:
            states = ", ".join(f"{r.index}: {r.state}" for r in pending)
            return f"replacements to launch and become ready ({states})"
    if status.phase == "Terminating":
        parts = []
        for candidate in status.candidates:
            if candidate.termination in ("Succeeded", "Failed"):
                continue
            termination = item.terminations.get(candidate.node)
            if termination is None:
                parts.append(f"termination of {short_node(candidate.node)}")
            elif termination.phase == "Waiting":
                parts.append(
                    f"{short_node(candidate.node)} waits for {termination.waiting_for or 'its budget'}"
                    " (no command ends this wait: it ends when the control allows)"
                )
            elif termination.phase == "Draining":
                parts.append(f"drain of {short_node(candidate.node)} (PodDisruptionBudgets may hold it)")
            else:
                parts.append(f"the termination of {short_node(candidate.node)} ({termination.phase})")
        return "; ".join(parts)
    return ""


def progress(status: DisruptionStatus | None, closed: bool) -> tuple[int, int]:
    """Steps done and steps in all: the taint, each replacement ready, each candidate terminated."""
    if status is None:
        return 0, 1
    total = 1 + len(status.replacements) + len(status.candidates)
    if closed and status.phase == "Succeeded":
        return total, total
    tainted = status.phase not in ("Validating", "AwaitingApproval", "Tainting") or any(
        c.tainted for c in status.candidates
    )
    ready = sum(1 for r in status.replacements if r.state == "Initialized")
    gone = sum(1 for c in status.candidates if c.termination == "Succeeded")
    return int(tainted) + ready + gone, total


async def refresh(item: Followed) -> None:
    try:
        described = await item.handle.describe()
        if described.status != WorkflowExecutionStatus.RUNNING:
            item.closed = described.status
        item.status = await item.handle.query("status", result_type=DisruptionStatus)
        if item.status.phase == "Terminating":
            for candidate in item.status.candidates:
                if candidate.termination_id and candidate.termination not in ("Succeeded", "Failed"):
                    with_status = item.client.get_workflow_handle(candidate.termination_id)
                    item.terminations[candidate.node] = await with_status.query(
                        "status", result_type=TerminationStatus
                    )
    except (RPCError, WorkflowQueryFailedError):
        pass  # not queryable yet (first task not run), just closed, or a task failing: look again
    item.waiting = waiting_for(item)
    if not item.seen or item.seen[-1] != item.phase:
        item.seen.append(item.phase)


def _replacements(status: DisruptionStatus | None) -> str:
    if not status or not status.replacements:
        return "-"
    return "\n".join(
        " ".join(
            part
            for part in (
                r.state,
                r.offering.instance_type if r.offering else "",
                r.instance_id or "",
                short_node(r.node) if r.node else "",
            )
            if part
        )
        for r in status.replacements
    )


def render(items: list[Followed]) -> Table:
    table = Table(title="karpflow disrupt", header_style="bold", title_justify="left")
    for column in ("workflow", "phase", "progress", "candidates", "replacements", "waiting for"):
        table.add_column(column, overflow="fold")
    for item in items:
        status = item.status
        candidates = (
            "\n".join(f"{short_node(c.node)} {c.termination}" for c in status.candidates) if status else "-"
        )
        done, total = progress(status, item.closed is not None)
        bar = Group(f"{done}/{total} steps", ProgressBar(total=total, completed=done, width=12))
        table.add_row(
            f"{item.workflow_id}\n{item.summary}",
            item.phase,
            bar,
            candidates,
            _replacements(status),
            item.waiting or "-",
        )
    return table


async def follow(items: list[Followed], console: Console) -> None:
    # The phase and wait lines are printed as they change, so a log (no terminal) tells it too.
    with Live(render(items), console=console, refresh_per_second=4, transient=False) as live:
        while True:
            before = {i.workflow_id: (i.phase, i.waiting) for i in items}
            await asyncio.gather(*(refresh(i) for i in items))
            for item in items:
                phase, waiting = before[item.workflow_id]
                if item.phase != phase:
                    console.print(f"{item.workflow_id}: {item.phase}", highlight=False)
                if item.waiting and item.waiting != waiting:
                    console.print(f"{item.workflow_id} waits for {item.waiting}", highlight=False)
            live.update(render(items))
            if all(i.closed is not None for i in items):
                return
            await asyncio.sleep(POLL_SECONDS)


# -- the command ----------------------------------------------------------------------------------------


async def _read_cluster(kubeconfig: str | None) -> list[dict[str, Any]]:
    from planner.cli import read_live_objects

    try:
        return await read_live_objects(kubeconfig)
    except Exception as err:
        _fail(f"cannot read the cluster: {err}")
        raise  # unreachable: _fail exits


def _plan(objects: list[dict[str, Any]], held: Collection[str], node_overlay: bool = False) -> Any:
    """The live plan, with the worker's NodeOverlay gate (KARPFLOW_NODE_OVERLAY) as the controller plans."""
    from planner.catalog import DEFAULT_REGION, bundled_catalog
    from planner.cli import with_held_tainted
    from planner.model import PlanOptions
    from planner.plan import plan
    from planner.snapshot import Snapshot

    snapshot = Snapshot.from_objects(with_held_tainted(objects, held), source="the live cluster")
    catalog = bundled_catalog(snapshot.region() or DEFAULT_REGION)
    return plan(snapshot, catalog, PlanOptions(all_methods=True, node_overlay=node_overlay))


async def run(
    settings: WorkerSettings,
    nodes: tuple[str, ...],
    every: bool,
    kubeconfig: str | None,
    ask: Callable[[int, list[str]], None],
    no_follow: bool,
    console: Console,
) -> int:
    try:
        client = await connect_temporal(settings)
    except Exception as err:
        click.echo(f"cannot reach Temporal at {settings.temporal_address}: {err}", err=True)
        return 2
    objects = await _read_cluster(kubeconfig)
    if not any(o.get("kind") == "Node" for o in objects):
        _fail("the live cluster has no Node: nothing to disrupt")
    missing, unmanaged = unknown_nodes(objects, nodes)
    for node in missing:
        click.echo(
            f"karpflow disrupt: no Node {node} in the cluster (`kubectl get nodes` lists them)", err=True
        )
    for node in unmanaged:
        click.echo(
            f"karpflow disrupt: Node {node} belongs to no NodePool (no {NODEPOOL_LABEL} label): "
            "karpflow disrupts only the nodes it manages",
            err=True,
        )
    if missing or unmanaged:
        return 2
    # What the controller holds out of every pass: the nodes of running disruptions and terminations.
    flying = await read_in_flight(client, settings.task_queue)
    result = await asyncio.to_thread(_plan, objects, flying.nodes, settings.node_overlay)
    commands, left = choose(result, nodes, every, flying)
    for line in left:
        console.print(f"[yellow]not disrupted[/yellow] {line}")
    if not commands:
        console.print("Nothing to start.")
        return 1
    console.print(preview(commands, nodes, every, settings))
    ask(len(commands), [] if every else also_disrupted(commands, nodes))
    started_by = shlex.join(["karpflow", *sys.argv[1:]])
    items = [await start(client, settings, command, started_by) for command in commands]
    for item in items:
        console.print(f"started {item.workflow_id}: {item.summary}")
    if no_follow:
        return 0
    await follow(items, console)
    failed = [i for i in items if i.closed not in CLOSED_OK]
    for item in failed:
        message = item.status.message if item.status else ""
        console.print(f"[red]{item.workflow_id} {item.phase}[/red] {message}")
    return 1 if failed else 0


@click.command("disrupt")
@click.argument("nodes", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Start every command of the plan.")
@click.option(
    "--yes",
    "-y",
    is_flag=True,
    help="Start what is shown without asking (needed without a terminal: scripts, CI).",
)
@click.option(
    "--dry-run", is_flag=True, help="Only show what would start (every node it disrupts); start nothing."
)
@click.option("--no-follow", is_flag=True, help="Start them and return (print the workflow ids).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), help="default: KUBECONFIG")
@click.option("--cluster-name", help="default: KARPFLOW_CLUSTER_NAME")
@click.option("--temporal-address", help="default: KARPFLOW_TEMPORAL_ADDRESS, else localhost:7233")
@click.option("--temporal-namespace", help="default: KARPFLOW_TEMPORAL_NAMESPACE, else default")
@click.option("--task-queue", help="default: KARPFLOW_TASK_QUEUE, else karpflow")
def disrupt(
    nodes: tuple[str, ...],
    every: bool,
    yes: bool,
    dry_run: bool,
    no_follow: bool,
    kubeconfig: str | None,
    **connection: Any,
) -> None:
    """Start the disruptions the live plan has for NODES (or --all) and follow them to the end.

    Nodes that running disruptions or terminations hold are left out, as the controller leaves them
    out, and the command that holds each is named. What would start is shown first (every node it
    disrupts, named or not) and you are asked: --yes starts without asking, --dry-run only shows."""
    if bool(nodes) == every:
        _fail("name nodes or give --all (one of them)")
    given = {k: v for k, v in connection.items() if v is not None}
    try:
        settings = WorkerSettings(**given, metrics=False)
    except ValidationError as err:
        click.echo(explain(err), err=True)
        _leave(2)
    console = Console(highlight=False)
    path = kubeconfig or (str(settings.kubeconfig) if settings.kubeconfig else None)

    def ask(count: int, extra: list[str]) -> None:
        confirm(console, count, extra, yes, dry_run)

    _leave(asyncio.run(run(settings, nodes, every, path, ask, no_follow, console)))
