"""`karpflow controller start|stop|status`, `karpflow status`, `karpflow pause|resume`: the controller
from a terminal.

Both read the worker's settings (flags, or `KARPFLOW_*` variables: `source .state/env` on the dev
stack), so they talk to the same Temporal namespace and cluster as the worker. `status` asks the
ControllerWorkflow's `status` query: what the last pass did, what is in flight, which pools back
off, and whether the cluster is quiet (converged under the current rules). `stop` asks the
controller to finish and close as completed, which the workers' supervision then leaves alone;
`start` starts it again (runtime/controller_start.py). `pause` and `resume` send the controller's
updates of those names: a pause covers everything, a NodePool (`--nodepool`) or an action
(`--action`); what the controller refuses is printed with its reason, exit 1. `approve` and `reject`
send a DisruptionWorkflow waiting for approval the updates of those names. `status` also lists the
running rollouts with their progress (runtime/rollout_progress.py).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import wraps
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.service import RPCError

from api.controller_io import (
    UPDATE_PAUSE,
    UPDATE_RESUME,
    ControllerStatus,
    ControllerStopped,
    PauseRequest,
    Pauses,
    StopRequest,
)
from api.garbage_io import GarbageCollectionResult
from api.maintenance_window import WINDOW_ACTIONS
from api.workflow_ids import controller_workflow_id
from api.workflow_io import DisruptionStatus
from planner import why_not
from runtime.connections import connect_temporal
from runtime.controller_start import STOPPED_ON_PURPOSE, latest_status, start_controller, stop_controller
from runtime.rollout_progress import RolloutProgress, running_rollouts
from runtime.settings import WorkerSettings, explain

EXIT_UNREACHABLE = 3


def _leave(code: int = 0) -> None:
    """Flush and exit at once: a process that used the Temporal client can abort while the
    interpreter finalizes (sdk-python #300), turning a good answer into exit 134."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _connection_options(command: Callable[..., Any]) -> Callable[..., Any]:
    @click.option("--cluster-name", help="default: KARPFLOW_CLUSTER_NAME")
    @click.option("--temporal-address", help="default: KARPFLOW_TEMPORAL_ADDRESS, else localhost:7233")
    @click.option("--temporal-namespace", help="default: KARPFLOW_TEMPORAL_NAMESPACE, else default")
    @click.option("--task-queue", help="default: KARPFLOW_TASK_QUEUE, else karpflow")
    @wraps(command)
    def wrapper(**flags: Any) -> Any:
        names = ("cluster_name", "temporal_address", "temporal_namespace", "task_queue")
        given = {n: flags.pop(n) for n in names if flags.get(n) is not None}
        for name in names:
            flags.pop(name, None)
        try:
            settings = WorkerSettings(**given)
        except ValidationError as err:
            click.echo(explain(err), err=True)
            sys.exit(2)
        return command(settings, **flags)

    return wrapper


async def _client(settings: WorkerSettings) -> Client:
    try:
        return await connect_temporal(settings)
    except Exception as err:
        click.echo(f"cannot reach Temporal at {settings.temporal_address}: {err}", err=True)
        _leave(EXIT_UNREACHABLE)
        raise  # unreachable: _leave does not return


async def activity_pollers(client: Client, task_queue: str) -> int:
    """How many workers poll the task queue's activities now (every worker runs the controller's)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )
    return len((await client.workflow_service.describe_task_queue(request)).pollers)


async def read_status(client: Client, cluster: str) -> ControllerStatus:
    handle = client.get_workflow_handle(controller_workflow_id(cluster))
    return await handle.query("status", result_type=ControllerStatus)


@click.group("controller")
def controller() -> None:
    """Start the cluster's ControllerWorkflow or show what it is doing."""


@controller.command("start")
@_connection_options
def start(settings: WorkerSettings) -> None:
    """Start the ControllerWorkflow unless it runs already; starts a stopped one again (workers keep
    a running one running, and restart one that failed or was terminated)."""

    async def go() -> None:
        client = await _client(settings)
        handle = await start_controller(client, settings)
        click.echo(f"{handle.id} running (run {handle.result_run_id})")
        if not await activity_pollers(client, settings.task_queue):
            click.echo(
                f"no worker polls task queue {settings.task_queue} now: the controller's first pass "
                "runs when one starts (`karpflow worker`, or `karpflow dev up` on the dev stack)",
                err=True,
            )

    asyncio.run(go())
    _leave(0)


@controller.command("stop")
@click.option("--reason", default="", help="why, shown by `karpflow status` and in the workflow's result")
@click.option(
    "--wait", "wait_seconds", default=60.0, show_default=True, help="seconds to wait for it to close"
)
@_connection_options
def stop(settings: WorkerSettings, reason: str, wait_seconds: float) -> None:
    """Stop the ControllerWorkflow: it starts nothing more and completes (within the step it is in:
    a planning call, or a consolidation's 15 s wait), and workers leave it stopped until `karpflow
    controller start`. Commands already started go on."""

    async def go() -> int:
        client = await _client(settings)
        by = f"{getpass.getuser()}@{socket.gethostname()}"
        handle = await stop_controller(client, settings, StopRequest(reason=reason, by=by))
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            if await latest_status(client, settings.cluster_name) in STOPPED_ON_PURPOSE:
                click.echo(f"{handle.id} stopped; `karpflow controller start` starts it again")
                return 0
            await asyncio.sleep(0.5)
        click.echo(
            f"{handle.id}: stop requested, not closed after {wait_seconds:.0f}s (is a worker running?); "
            "it stops at its next workflow task",
            err=True,
        )
        return 1

    _leave(asyncio.run(go()))


async def _stopped(client: Client, cluster: str) -> ControllerStopped | None:
    """The stop that ended the latest run, if an operator stopped it."""
    if await latest_status(client, cluster) not in STOPPED_ON_PURPOSE:
        return None
    try:
        handle = client.get_workflow_handle(controller_workflow_id(cluster), result_type=ControllerStopped)
        return await handle.result()
    except WorkflowFailureError:  # cancelled, not stopped: no result to read
        return ControllerStopped(reason="cancelled", at=datetime.now(UTC))


def node_answer(status: ControllerStatus, node: str, running: list[str] | None = None) -> dict[str, Any]:
    """What holds `node` back, from the controller's last pass: the reason in words, its kind (the
    `reason` label of karpflow_unremovable_nodes) and the Event it is recorded under; `running`: the
    workflows that name the node now (visibility), for a node the pass did not hold back."""
    answer: dict[str, Any] = {"node": node, "cluster": status.cluster, "last_pass_at": status.last_pass_at}
    why = status.blocked.get(node)
    if why is not None:
        chosen = why_not.event_for(why)
        return answer | {
            "held_back": True,
            "kind": str(why_not.kind_of(why)),
            "reason": why,
            "event": str(chosen[0]) if chosen else None,
        }
    if running:
        return answer | {"held_back": False, "reason": f"being disrupted: {', '.join(running)}"}
    return answer | {
        "held_back": False,
        "reason": "not held back by the last pass: a command was planned for it, or it is not a node "
        "of a NodePool (or was not seen yet)",
    }


async def running_for(client: Client, node: str) -> list[str]:
    """The running disruptions and terminations that name `node` (the KarpflowNodes search attribute)."""
    query = f"KarpflowNodes = '{node}' AND ExecutionStatus = 'Running'"
    return [execution.id async for execution in client.list_workflows(query)]


def render_node(answer: dict[str, Any], console: Console) -> None:
    when = answer["last_pass_at"]
    ago = f"{(datetime.now(UTC) - when).total_seconds():.0f}s ago" if when else "never"
    console.print(f"node [bold]{answer['node']}[/] (controller of {answer['cluster']}, last pass {ago})")
    if not answer["held_back"]:
        console.print(answer["reason"])
        return
    console.print(f"held back: [yellow]{answer['kind']}[/]")
    console.print(f"why: {answer['reason']}")
    if answer["event"]:
        console.print(
            f"Event: {answer['event']} (kubectl describe node {answer['node']}); "
            f'metric: karpflow_unremovable_nodes{{reason="{answer["kind"]}"}}'
        )


def _status_command(settings: WorkerSettings, output: str, node: str | None = None) -> None:
    running: list[str] = []
    rollouts: list[RolloutProgress] = []

    async def go() -> ControllerStatus:
        client = await _client(settings)
        if node is not None:
            running.extend(await running_for(client, node))
        else:
            rollouts.extend(await running_rollouts(client, settings.cluster_name))
        try:
            stopped = await _stopped(client, settings.cluster_name)
            status = await read_status(client, settings.cluster_name)
            if stopped is not None:
                who = f" by {stopped.by}" if stopped.by else ""
                why = stopped.reason or "no reason given"
                text = f"stopped{who} at {stopped.at:%Y-%m-%d %H:%M:%S}: {why}"
                status = status.model_copy(update={"stopping": text, "quiet": False})
            return status
        except RPCError as err:
            click.echo(
                f"no controller answers for cluster {settings.cluster_name} "
                f"({controller_workflow_id(settings.cluster_name)}): {err.message}. "
                "Is a worker running? `karpflow controller start` starts it.",
                err=True,
            )
            _leave(1)
            raise  # unreachable: _leave does not return

    status = asyncio.run(go())
    if node is not None:
        answer = node_answer(status, node, running)
        if output == "json":
            click.echo(json.dumps(answer, indent=2, default=str))
        else:
            render_node(answer, Console())
        _leave(0)
    if output == "json":
        shown = {**status.model_dump(mode="json"), "rollouts": [r.model_dump() for r in rollouts]}
        click.echo(json.dumps(shown, indent=2))
    else:
        console = Console()
        render(status, console)
        for rollout in rollouts:
            console.print(f"rollout {rollout.line()}")
    _leave(0)


@controller.command("status")
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_connection_options
def controller_status(settings: WorkerSettings, output: str) -> None:
    """What the controller's last pass did, what is in flight, and whether the cluster is quiet."""
    _status_command(settings, output)


@click.command("status")
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--node", help="what holds this node back, from the controller's last pass")
@_connection_options
def status(settings: WorkerSettings, output: str, node: str | None) -> None:
    """The controller's status (same as `karpflow controller status`); with --node, why that node is
    not disrupted."""
    _status_command(settings, output, node)


def render(status: ControllerStatus, console: Console) -> None:
    when = status.last_pass_at
    ago = f"{(datetime.now(UTC) - when).total_seconds():.0f}s ago" if when else "never"
    state = "[green]quiet[/]" if status.quiet else "[yellow]working[/]"
    console.print(
        f"controller of [bold]{status.cluster}[/]: {state}; pass {status.passes}, last {ago} "
        f"({status.last_pass_seconds:.2f}s, {status.last_pass_nodes} nodes)"
    )
    if status.stopping:
        console.print(f"[yellow]controller {status.stopping}[/] (`karpflow controller start` starts it)")
    for pause in status.pauses:
        console.print(
            f"[yellow]paused[/] {pause.describe()} since {pause.since:%Y-%m-%d %H:%M:%S} "
            "(new commands it covers wait; `karpflow resume` lifts it)"
        )
    if status.error:
        console.print(f"[red]last pass failed:[/] {status.error}")
    for title, rows in (
        ("started by the last pass", status.started),
        ("in flight", status.in_flight),
        ("validating", status.validating),
        ("taints cleaned up", status.cleaned_taints),
        ("waiting (consolidateAfter, windows, pauses, rates)", status.waiting),
    ):
        if rows:
            console.print(f"{title}: {', '.join(rows)}")
    if status.garbage is not None:
        render_garbage(status.garbage, console)
    for workflow_id, why in status.rejected.items():
        console.print(f"rejected by validation: {workflow_id}: {why}")
    if status.backoffs:
        table = Table("NodePool", "reason", "failures", "until", "last failure", title="backoffs")
        for b in status.backoffs:
            table.add_row(b.nodepool, b.reason, str(b.failures), f"{b.until:%H:%M:%S}", b.last_failure)
        console.print(table)
    if status.budgets:
        table = Table("NodePool", "reason", "allowed now", title="budgets left")
        for pool, reasons in sorted(status.budgets.items()):
            for reason, allowed in sorted(reasons.items()):
                table.add_row(pool, reason, str(allowed))
        console.print(table)
    if status.blocked:
        table = Table("node", "held back by", "why", title=f"blocked ({len(status.blocked)})")
        for node, why in sorted(status.blocked.items())[:50]:
            table.add_row(node, str(why_not.kind_of(why)), why)
        console.print(table)
    for problem in status.problems:
        console.print(f"[yellow]problem:[/] {problem}")
    for dropped in status.bad_signals:
        console.print(f"[yellow]dropped signal:[/] {dropped}")
    if status.history_events:
        console.print(
            f"history of this run: {status.history_events} events, {status.history_bytes / 1e6:.1f} MB"
        )


def render_garbage(garbage: GarbageCollectionResult, console: Console) -> None:
    """The last garbage collection of karpflow's own launches (docs/garbage-collection.md)."""
    console.print(
        f"garbage collection {garbage.at:%H:%M:%S}: {garbage.instances} running launch(es) of commands, "
        f"{len(garbage.collected)} collected"
    )
    for collected in garbage.collected:
        node = f", node {collected.node} deleted" if collected.node else ""
        console.print(f"  collected {collected.instance_id} ({collected.reason}{node}): {collected.why}")
    for doubt in garbage.in_doubt:
        console.print(f"  [yellow]kept, command in doubt:[/] {doubt}")
    for problem in garbage.problems:
        console.print(f"  [red]problem:[/] {problem}")


# -- `karpflow pause` and `karpflow resume`: the controller's updates (docs/operator-controls.md) ------


def _request(nodepool: str | None, action: str | None, reason: str = "") -> PauseRequest:
    if nodepool and action:
        raise click.UsageError("name a NodePool or an action, not both")
    scope = "nodepool" if nodepool else "action" if action else "global"
    by = f"{getpass.getuser()}@{socket.gethostname()}"
    return PauseRequest(scope=scope, nodepool=nodepool, action=action, reason=reason, by=by)  # type: ignore[arg-type]


def _send(settings: WorkerSettings, update: str, request: PauseRequest) -> None:
    body = request.model_dump(mode="json", exclude_none=True)
    if update == UPDATE_RESUME:
        body = {k: v for k, v in body.items() if k in ("scope", "nodepool", "action")}

    async def go() -> int:
        handle = (await _client(settings)).get_workflow_handle(controller_workflow_id(settings.cluster_name))
        try:
            pauses = await handle.execute_update(update, body, result_type=Pauses)
        except WorkflowUpdateFailedError as err:
            click.echo(f"{update} refused: {err.cause}", err=True)
            return 1
        except RPCError as err:
            click.echo(f"{update}: {handle.id}: {err}", err=True)
            return 1
        if not pauses.pauses:
            click.echo("nothing paused")
        for pause in pauses.pauses:
            click.echo(f"paused: {pause.describe()} since {pause.since:%Y-%m-%d %H:%M:%S}")
        return 0

    _leave(asyncio.run(go()))


_NODEPOOL = click.option("--nodepool", help="only this NodePool's nodes")
_ACTION = click.option("--action", type=click.Choice(WINDOW_ACTIONS), help="only this action")


@click.command("pause")
@_NODEPOOL
@_ACTION
@click.option("--reason", default="", help="why, shown by `karpflow status` and on the held-back nodes")
@_connection_options
def pause(settings: WorkerSettings, nodepool: str | None, action: str | None, reason: str) -> None:
    """Start no new command (of a NodePool, or of an action) until `karpflow resume`; commands in
    flight finish. Pausing the same target again replaces the reason."""
    _send(settings, UPDATE_PAUSE, _request(nodepool, action, reason))


@click.command("resume")
@_NODEPOOL
@_ACTION
@_connection_options
def resume(settings: WorkerSettings, nodepool: str | None, action: str | None) -> None:
    """Lift the pause of that target (the same flags as the pause); the next pass starts at once."""
    _send(settings, UPDATE_RESUME, _request(nodepool, action))


# -- `karpflow approve` and `karpflow reject`: a command waiting for approval -----------------------


def _decide(settings: WorkerSettings, update: str, workflow_id: str, reason: str) -> None:
    body = {"by": f"{getpass.getuser()}@{socket.gethostname()}", "reason": reason}

    async def go() -> int:
        handle = (await _client(settings)).get_workflow_handle(workflow_id)
        try:
            status = await handle.execute_update(update, body, result_type=DisruptionStatus)
        except WorkflowUpdateFailedError as err:
            click.echo(f"{update} refused: {err.cause}", err=True)
            return 1
        except RPCError as err:
            click.echo(f"{update}: {workflow_id}: {err}", err=True)
            return 1
        nodes = ", ".join(c.node for c in status.candidates)
        click.echo(
            f"{workflow_id}: {'approved' if update == 'approve' else 'rejected'} ({status.reason}: {nodes})"
        )
        return 0

    _leave(asyncio.run(go()))


@click.command("approve")
@click.argument("workflow_id")
@click.option("--reason", default="", help="why, kept in the command's status")
@_connection_options
def approve(settings: WorkerSettings, workflow_id: str, reason: str) -> None:
    """Let a command waiting for approval (phase AwaitingApproval) go on: it taints next, checking
    windows and NodeDisruptionBudgets again."""
    _decide(settings, "approve", workflow_id, reason)


@click.command("reject")
@click.argument("workflow_id")
@click.option("--reason", default="", help="why, kept in the command's status")
@_connection_options
def reject(settings: WorkerSettings, workflow_id: str, reason: str) -> None:
    """End a command waiting for approval with nothing changed."""
    _decide(settings, "reject", workflow_id, reason)
