"""`karpflow rollout`: replace every node of a NodePool created before now (workflows/rollout.py).

`karpflow rollout NODEPOOL [--selector k=v,...]` starts the RolloutWorkflow and prints its id;
`--status ID` prints its progress (the workflow's `status` query), `--cancel ID` cancels it and waits
until its marks are off. The same as `temporal workflow start/query/cancel` (README).
"""

from __future__ import annotations

import asyncio
import getpass
import socket
from datetime import UTC, datetime, timedelta

import click
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError

from api.rollout_io import RolloutInput, RolloutStatus, parse_selector
from api.workflow_ids import rollout_workflow_id
from runtime.controller_cli import _client, _connection_options, _leave
from runtime.settings import WorkerSettings


def describe(status: RolloutStatus) -> str:
    text = f"{status.rollout_id}: {status.phase}, {status.replaced}/{status.total} replaced"
    if status.remaining:
        shown = ", ".join(status.remaining[:20]) + (" ..." if len(status.remaining) > 20 else "")
        text += f", {len(status.remaining)} remaining: {shown}"
    return text + (f" ({status.message})" if status.message else "")


async def _start(settings: WorkerSettings, nodepool: str, selector: dict[str, str], poll: float) -> int:
    requested_at = datetime.now(UTC)
    request = RolloutInput(
        cluster=settings.cluster_name,
        nodepool=nodepool,
        selector=selector,
        requested_at=requested_at,
        requested_by=f"{getpass.getuser()}@{socket.gethostname()}",
        poll_interval=timedelta(seconds=poll),
    )
    workflow_id = rollout_workflow_id(settings.cluster_name, nodepool, selector, requested_at.isoformat())
    client = await _client(settings)
    handle = await client.start_workflow(
        "RolloutWorkflow",
        request.model_dump(mode="json"),
        id=workflow_id,
        task_queue=settings.task_queue,
    )
    click.echo(handle.id)
    return 0


async def _status(settings: WorkerSettings, workflow_id: str, as_json: bool) -> int:
    handle = (await _client(settings)).get_workflow_handle(workflow_id)
    try:
        status = await handle.query("status", result_type=RolloutStatus)
    except RPCError as err:
        click.echo(f"{workflow_id}: {err.message}", err=True)
        return 1
    click.echo(status.model_dump_json(indent=2) if as_json else describe(status))
    return 0


async def _cancel(settings: WorkerSettings, workflow_id: str) -> int:
    handle = (await _client(settings)).get_workflow_handle(workflow_id)
    try:
        await handle.cancel()
        await handle.result()
    except WorkflowFailureError:
        pass  # cancelled: the status query tells what the cancel did
    except RPCError as err:
        click.echo(f"{workflow_id}: {err.message}", err=True)
        return 1
    status = await handle.query("status", result_type=RolloutStatus)
    click.echo(describe(status))
    return 0


@click.command("rollout")
@click.argument("nodepool", required=False)
@click.option("--selector", default="", help="only nodes with these labels: k=v,k2=v2")
@click.option("--poll-interval", default=30.0, show_default=True, help="seconds between progress checks")
@click.option("--status", "status_of", metavar="ID", help="show the progress of this rollout")
@click.option("--cancel", "cancel", metavar="ID", help="cancel this rollout: its marks come off")
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_connection_options
def rollout(
    settings: WorkerSettings,
    nodepool: str | None,
    selector: str,
    poll_interval: float,
    status_of: str | None,
    cancel: str | None,
    output: str,
) -> None:
    """Replace every node of NODEPOOL (matching --selector) created before now, as drift would:
    within budgets, rate budgets, MaintenanceWindows (Drift), NodeDisruptionBudgets, pauses and
    approval. Prints the rollout's id; --status ID shows its progress, --cancel ID stops it."""
    if status_of:
        _leave(asyncio.run(_status(settings, status_of, output == "json")))
    if cancel:
        _leave(asyncio.run(_cancel(settings, cancel)))
    if not nodepool:
        raise click.UsageError("name the NodePool to roll out (or --status ID, --cancel ID)")
    try:
        labels = parse_selector(selector)
        _leave(asyncio.run(_start(settings, nodepool, labels, poll_interval)))
    except ValueError as err:
        raise click.UsageError(str(err)) from None
