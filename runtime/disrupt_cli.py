"""`karpflow disrupt NODE...`: plan on the live cluster, start the disruptions that name these nodes,
and follow them live until they end.

    karpflow disrupt ip-10-0-1-2.us-west-2.compute.internal        # the command the plan has for it
    karpflow disrupt --all                                          # every command of the plan

The plan is `karpflow plan --live --all-methods`: every method runs, so a node is found whatever
rule would disrupt it. Each command starts as a DisruptionWorkflow under the id the controller would
give it (so a command the controller already started is followed, not started twice), with a
summary and a memo the Web UI shows (api/workflow_summaries.py). A node the plan leaves alone is
named with the reason, and nothing is started for it. Connection settings are the worker's
(`KARPFLOW_*`; `source .state/env` or `karpflow --state-dir DIR disrupt ...` on the dev stack).

Exit status: 0 when every disruption succeeded, 1 when one failed, was cancelled or nothing could
start, 2 for unusable input (no cluster, no Node, unknown settings).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.table import Table
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError

from api.workflow_io import DisruptionStatus, disruption_input, disruption_workflow_id
from api.workflow_summaries import disruption_details, disruption_memo, disruption_summary, short_node
from runtime.connections import connect_temporal
from runtime.settings import WorkerSettings, explain

POLL_SECONDS = 0.5
CLOSED_OK = {WorkflowExecutionStatus.COMPLETED}


@dataclass
class Followed:
    workflow_id: str
    summary: str
    handle: WorkflowHandle[Any, Any]
    status: DisruptionStatus | None = None
    closed: WorkflowExecutionStatus | None = None
    seen: list[str] = field(default_factory=list)  # phases, in order

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


def _plan(kubeconfig: str | None) -> Any:
    from planner.catalog import DEFAULT_REGION, bundled_catalog
    from planner.cli import _live_snapshot
    from planner.model import PlanOptions
    from planner.plan import plan

    snapshot = _live_snapshot(kubeconfig, None)  # exits 2 when the cluster cannot be read
    if not snapshot.nodes:
        click.echo("karpflow disrupt: the live cluster has no Node: nothing to disrupt", err=True)
        _leave(2)
    return plan(snapshot, bundled_catalog(snapshot.region() or DEFAULT_REGION), PlanOptions(all_methods=True))


def choose(result: Any, nodes: tuple[str, ...], every: bool) -> tuple[list[Any], list[str]]:
    """The plan's commands that name any of `nodes` (all with `every`), and a line for each node
    that no command names."""
    commands = list(result.commands_)
    if every:
        return commands, []
    wanted = set(nodes)
    chosen = [c for c in commands if wanted & set(c.nodes)]
    named = {n for c in chosen for n in c.nodes}
    blocked = {b.node: b.reason for b in result.blocked}
    unchosen = "no disruption method selects it now (not a candidate, or nothing to gain)"
    missing = [f"{node}: {blocked.get(node, unchosen)}" for node in nodes if node not in named]
    return chosen, missing


async def start(client: Client, settings: WorkerSettings, command: Any, started_by: str) -> Followed:
    workflow_id = disruption_workflow_id(command, settings.cluster_name)
    from planner.plan import command_out

    workflow_input = disruption_input(
        command, planned=command_out(command).model_dump(mode="json", by_alias=True)
    )
    summary = disruption_summary(command, workflow_input.approval)
    handle = await client.start_workflow(
        "DisruptionWorkflow",
        workflow_input,
        id=workflow_id,
        task_queue=settings.task_queue,
        # The controller may have started the same command: follow that one.
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=summary,
        static_details=disruption_details(command, workflow_input.approval),
        memo=disruption_memo(command, started_by),
    )
    return Followed(workflow_id, summary, handle)


async def refresh(item: Followed) -> None:
    try:
        described = await item.handle.describe()
        if described.status != WorkflowExecutionStatus.RUNNING:
            item.closed = described.status
        item.status = await item.handle.query("status", result_type=DisruptionStatus)
    except RPCError:
        pass  # not queryable yet (first task not run) or just closed: look again
    if not item.seen or item.seen[-1] != item.phase:
        item.seen.append(item.phase)


def render(items: list[Followed]) -> Table:
    table = Table(title="karpflow disrupt", header_style="bold", title_justify="left")
    for column in ("workflow", "phase", "candidates", "replacements"):
        table.add_column(column)
    for item in items:
        status = item.status
        candidates = (
            "\n".join(f"{short_node(c.node)} {c.termination}" for c in status.candidates) if status else "-"
        )
        replacements = (
            "\n".join(
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
            if status and status.replacements
            else "-"
        )
        table.add_row(f"{item.workflow_id}\n{item.summary}", item.phase, candidates, replacements)
    return table


async def follow(items: list[Followed], console: Console) -> None:
    with Live(render(items), console=console, refresh_per_second=4, transient=False) as live:
        while True:
            before = {i.workflow_id: i.phase for i in items}
            await asyncio.gather(*(refresh(i) for i in items))
            for item in items:
                if item.phase != before[item.workflow_id]:
                    console.print(f"{item.workflow_id}: {item.phase}", highlight=False)
            live.update(render(items))
            if all(i.closed is not None for i in items):
                return
            await asyncio.sleep(POLL_SECONDS)


@click.command("disrupt")
@click.argument("nodes", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Start every command of the plan.")
@click.option("--no-follow", is_flag=True, help="Start them and return (print the workflow ids).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), help="default: KUBECONFIG")
@click.option("--cluster-name", help="default: KARPFLOW_CLUSTER_NAME")
@click.option("--temporal-address", help="default: KARPFLOW_TEMPORAL_ADDRESS, else localhost:7233")
@click.option("--temporal-namespace", help="default: KARPFLOW_TEMPORAL_NAMESPACE, else default")
@click.option("--task-queue", help="default: KARPFLOW_TASK_QUEUE, else karpflow")
def disrupt(
    nodes: tuple[str, ...], every: bool, no_follow: bool, kubeconfig: str | None, **connection: Any
) -> None:
    """Start the disruptions the live plan has for NODES (or --all) and follow them to the end."""
    if bool(nodes) == every:
        click.echo("karpflow disrupt: name nodes or give --all (one of them)", err=True)
        _leave(2)
    given = {k: v for k, v in connection.items() if v is not None}
    try:
        settings = WorkerSettings(**given, metrics=False)
    except ValidationError as err:
        click.echo(explain(err), err=True)
        _leave(2)
    console = Console(highlight=False)
    result = _plan(kubeconfig or (str(settings.kubeconfig) if settings.kubeconfig else None))
    commands, missing = choose(result, nodes, every)
    for line in missing:
        console.print(f"[yellow]not disrupted[/yellow] {line}")
    if not commands:
        console.print("Nothing to start.")
        _leave(1)
    started_by = shlex.join(["karpflow", *sys.argv[1:]])

    async def go() -> int:
        try:
            client = await connect_temporal(settings)
        except Exception as err:
            click.echo(f"cannot reach Temporal at {settings.temporal_address}: {err}", err=True)
            return 2
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

    _leave(asyncio.run(go()))
