"""`karpflow rollout`: replace every node of a NodePool created before now (workflows/rollout.py).

`karpflow rollout NODEPOOL [--selector k=v,...]` starts the RolloutWorkflow and prints its id, once
the cluster has that NodePool (else exit 2, nothing started); `--status ID` prints its progress (the
workflow's `status` query) or, for a rollout that ended without succeeding, how it ended and why
(exit 1); `--cancel ID` cancels it and waits until its marks are off. The same as `temporal workflow
start/query/cancel` (README). A rollout id that names no workflow, or another kind of workflow, is
exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from api.rollout_io import AbortRequest, RolloutInput, RolloutStatus, parse_selector
from api.rollout_policy import ROLLOUT_POLICY_ANNOTATION, PolicyError, parse_policy
from api.workflow_ids import rollout_workflow_id
from runtime.controller_cli import _client, _connection_options, _leave, find_in_cluster, no_such
from runtime.settings import WorkerSettings
from workflows.failures import one_line


def describe(status: RolloutStatus) -> str:
    text = f"{status.rollout_id}: {status.phase}, {status.replaced}/{status.total} replaced"
    if status.policy is not None:
        text += f", wave {status.wave}"
        if status.wave_nodes:
            text += f" ({len(status.wave_nodes)} to go: {', '.join(status.wave_nodes[:10])})"
        if status.soak_until is not None and status.phase == "Soaking":
            text += f", soaking until {status.soak_until:%Y-%m-%dT%H:%M:%SZ}"
    if status.halted:
        text += f"\n  halted by the gate: {status.halted}"
        rid = status.rollout_id
        text += f"\n  `karpflow rollout --resume {rid}` or `karpflow rollout --abort {rid} [--rollback]`"
    elif status.gate:
        text += "\n  gate: " + "; ".join(status.gate)
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
        notify=True,  # a no-op child where the worker has no webhook (activities/notifications.py)
    )
    found = await find_in_cluster(settings, "NodePool", nodepool)
    if found is None:
        click.echo(
            f"karpflow rollout: {no_such('NodePool', nodepool, 'nodepools')}; nothing started", err=True
        )
        return 2
    # The pool's rollout policy (api/rollout_policy.py) applies to a requested rollout too: waves.
    try:
        request.policy = parse_policy(
            (found.get("metadata") or {}).get("annotations", {}).get(ROLLOUT_POLICY_ANNOTATION)
        )
    except PolicyError as err:
        click.echo(f"karpflow rollout: NodePool {nodepool}: {err}; nothing started", err=True)
        return 2
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


async def _rollout(
    client: Client, workflow_id: str
) -> tuple[WorkflowHandle[Any, Any], WorkflowExecutionStatus | None]:
    """The rollout's handle and its execution status; leaves with 2 when the id names no rollout."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        described = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            click.echo(
                f"karpflow rollout: no rollout {workflow_id} in namespace {client.namespace}", err=True
            )
        else:
            click.echo(f"{workflow_id}: {err.message}", err=True)
        _leave(2)
        raise  # unreachable
    if described.workflow_type != "RolloutWorkflow":
        click.echo(f"karpflow rollout: {workflow_id} is a {described.workflow_type}, not a rollout", err=True)
        _leave(2)
    return handle, described.status


async def _ended(handle: WorkflowHandle[Any, Any]) -> str:
    """Why a rollout that did not succeed ended: its failure's innermost cause ("" when none is told)."""
    try:
        await handle.result()
    except WorkflowFailureError as err:
        return one_line(err)
    return ""


async def _status(settings: WorkerSettings, workflow_id: str, as_json: bool) -> int:
    client = await _client(settings)
    handle, closed = await _rollout(client, workflow_id)
    if closed in (
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.TERMINATED,
        WorkflowExecutionStatus.TIMED_OUT,
    ):
        # It never got far enough to say so itself: its status query would show its first phase.
        why, phase = await _ended(handle), closed.name.title()
        if as_json:
            click.echo(json.dumps({"rollout_id": workflow_id, "phase": phase, "message": why}, indent=2))
        else:
            click.echo(f"{workflow_id}: {phase}" + (f": {why}" if why else ""))
        return 1
    try:
        status = await handle.query("status", result_type=RolloutStatus)
    except RPCError as err:
        click.echo(f"{workflow_id}: {err.message}", err=True)
        return 1
    running = closed == WorkflowExecutionStatus.RUNNING
    waits = await why_waiting(client, settings, status.remaining) if running else {}
    if as_json:
        click.echo(json.dumps({**status.model_dump(mode="json"), "waiting": waits}, indent=2))
        return 0
    click.echo(describe(status))
    for node, why in waits.items():
        click.echo(f"  {node}: {why}")
    return 0


async def why_waiting(client: Client, settings: WorkerSettings, nodes: list[str]) -> dict[str, str]:
    """Why each node a running rollout still has to replace is not replaced yet: the command that holds
    it now (and what ends its wait), else the reason the controller's last pass gave (an NDB, a pod,
    a window, a budget), else that no pass has looked at it yet. Best effort: a part that cannot be
    read says so instead."""
    from activities.in_flight import read_in_flight
    from api.controller_io import ControllerStatus
    from api.workflow_ids import controller_workflow_id

    flying, unread = None, ""
    try:
        flying = await read_in_flight(client, settings.task_queue)
    except RPCError as err:
        unread = f"what is in flight cannot be read ({err.message})"
    try:
        controller = client.get_workflow_handle(controller_workflow_id(settings.cluster_name))
        blocked = (await controller.query("status", result_type=ControllerStatus)).blocked
    except RPCError:
        blocked = {}
    out: dict[str, str] = {}
    for node in nodes:
        holder = flying.holders.get(node) if flying is not None else None
        if holder is not None:
            held_by, phase = holder
            out[node] = f"being replaced by {held_by} ({phase or 'starting'})" + (
                f": waits for approval: `karpflow approve {held_by}`" if phase == "AwaitingApproval" else ""
            )
        elif node in blocked:
            out[node] = blocked[node]
        else:
            out[node] = unread if flying is None else "not looked at by a controller pass yet"
    return out


async def _signal(settings: WorkerSettings, workflow_id: str, abort: AbortRequest | None) -> int:
    """`--resume` (abort None) or `--abort`: signal the rollout, then show what it did."""
    handle, closed = await _rollout(await _client(settings), workflow_id)
    verb = "resume" if abort is None else "abort"
    if closed != WorkflowExecutionStatus.RUNNING and closed is not None:
        click.echo(
            f"karpflow rollout: {workflow_id} is closed ({closed.name.title()}): nothing to {verb}", err=True
        )
        return 1
    status = await handle.query("status", result_type=RolloutStatus)
    if status.policy is None:
        click.echo(
            f"karpflow rollout: {workflow_id} rolls without waves: nothing to {verb} (`--cancel` stops it)",
            err=True,
        )
        return 1
    if abort is None and status.phase != "Halted":
        click.echo(
            f"karpflow rollout: {workflow_id} is {status.phase}, not halted: nothing to resume", err=True
        )
        return 1
    try:
        if abort is None:
            await handle.signal("resume")
        else:
            await handle.signal("abort", abort.model_dump(mode="json"))
            with contextlib.suppress(WorkflowFailureError):
                await asyncio.wait_for(handle.result(), timeout=60)
    except (RPCError, TimeoutError) as err:
        click.echo(f"{workflow_id}: {getattr(err, 'message', None) or 'no answer within 60 s'}", err=True)
        return 1
    await asyncio.sleep(0.5)  # the signal's workflow task: the status then shows it taken
    click.echo(describe(await handle.query("status", result_type=RolloutStatus)))
    return 0


async def _cancel(settings: WorkerSettings, workflow_id: str) -> int:
    handle, closed = await _rollout(await _client(settings), workflow_id)
    if closed != WorkflowExecutionStatus.RUNNING and closed is not None:
        click.echo(
            f"karpflow rollout: {workflow_id} is closed ({closed.name.title()}): nothing to cancel", err=True
        )
        return 1
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
@click.option("--resume", "resume", metavar="ID", help="a rollout its gate halted: go on with the next wave")
@click.option("--abort", "abort", metavar="ID", help="stop a rollout with waves: its marks come off")
@click.option("--rollback", is_flag=True, help="with --abort: replace the nodes the rollout launched")
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_connection_options
def rollout(
    settings: WorkerSettings,
    nodepool: str | None,
    selector: str,
    poll_interval: float,
    status_of: str | None,
    cancel: str | None,
    resume: str | None,
    abort: str | None,
    rollback: bool,
    output: str,
) -> None:
    """Replace every node of NODEPOOL (matching --selector) created before now, as drift would:
    within budgets, rate budgets, MaintenanceWindows (Drift), NodeDisruptionBudgets, pauses and
    approval. Prints the rollout's id; --status ID shows its progress (or how it ended, and why),
    --cancel ID stops it. With the NodePool's karpflow.dev/rollout-policy the nodes go in waves, each
    held to a health gate; --resume ID goes on after a halt, --abort ID [--rollback] stops. A NodePool
    the cluster does not have is refused (exit 2)."""
    if rollback and not abort:
        raise click.UsageError("--rollback goes with --abort ID")
    if status_of:
        _leave(asyncio.run(_status(settings, status_of, output == "json")))
    if cancel:
        _leave(asyncio.run(_cancel(settings, cancel)))
    if resume:
        _leave(asyncio.run(_signal(settings, resume, None)))
    if abort:
        by = f"{getpass.getuser()}@{socket.gethostname()}"
        _leave(asyncio.run(_signal(settings, abort, AbortRequest(rollback=rollback, by=by))))
    if not nodepool:
        raise click.UsageError("name the NodePool to roll out (or --status ID, --cancel ID)")
    try:
        labels = parse_selector(selector)
        _leave(asyncio.run(_start(settings, nodepool, labels, poll_interval)))
    except ValueError as err:
        raise click.UsageError(str(err)) from None
