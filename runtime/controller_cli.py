"""`karpflow controller start|stop|status`, `karpflow status`, `karpflow pause|resume`,
`karpflow approve|reject`: the controller from a terminal.

All read the worker's settings (flags, or `KARPFLOW_*` variables: `source .state/env` on the dev
stack), so they talk to the same Temporal namespace and cluster as the worker. `status` says the
controller's state first (its latest run: running, stopped by whom and why, failed, never started),
then what its `status` query says of the last pass, less what is no longer true: what is in flight
is read from visibility now (activities/in_flight.py), a node held by a workflow that has finished
is left out, and so is a backoff that is over; `-o json` is JSON whatever the state. `stop` asks the
controller to finish and close as completed, which the workers' supervision then leaves alone;
`start` starts it again (runtime/controller_start.py). `pause` and `resume` send the controller's
updates of those names: a pause covers everything, a NodePool (`--nodepool`, which must exist
unless `--allow-missing`) or an action (`--action`); what the controller refuses is printed with its
reason, exit 1. `approve` and `reject` send a DisruptionWorkflow waiting for approval the updates of
those names, after checking the id names one. A target that does not exist is exit 2, named.
`status` also lists the running rollouts with their progress (runtime/rollout_progress.py).
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
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from activities.in_flight import InFlight, read_in_flight
from api.constants import KARPENTER_GROUP, KARPENTER_VERSION
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
from kube.client import Json, KubeApi, KubeError
from planner import why_not
from runtime.connections import connect_kubernetes, connect_temporal
from runtime.controller_start import (
    RUNNING,
    STOPPED_ON_PURPOSE,
    latest_status,
    start_controller,
    stop_controller,
)
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


async def _kube(settings: WorkerSettings) -> KubeApi:
    try:
        return await connect_kubernetes(settings)
    except Exception as err:
        click.echo(f"cannot reach the cluster (KUBECONFIG, or KARPFLOW_KUBECONFIG): {err}", err=True)
        _leave(2)
        raise  # unreachable: _leave does not return


async def find_in_cluster(settings: WorkerSettings, kind: str, name: str) -> Json | None:
    """The cluster's Node or NodePool of that name, None when there is none: a verb checks its target
    exists before it asks Temporal for anything. Leaves with 2 when the cluster cannot be read."""
    kube = await _kube(settings)
    try:
        if kind == "Node":
            return await kube.get_node(name)
        return await kube.get_cluster_custom(KARPENTER_GROUP, KARPENTER_VERSION, "nodepools", name)
    except KubeError as err:
        if err.status == 404:
            return None
        click.echo(f"cannot read {kind} {name} from the cluster: {err}", err=True)
        _leave(2)
        raise  # unreachable
    finally:
        await kube.close()


def no_such(kind: str, name: str, listing: str) -> str:
    return f"no {kind} {name} in the cluster (`kubectl get {listing}` lists them)"


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
    # A query by name is typed Any; result_type is what the payload is decoded as.
    status: ControllerStatus = await handle.query("status", result_type=ControllerStatus)
    return status


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
        handle, carried = await start_controller(client, settings)
        click.echo(f"{handle.id} running (run {handle.result_run_id}); {carried.describe()}")
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


async def _stop_of(client: Client, cluster: str) -> ControllerStopped:
    """The stop that ended the latest run (whose end an operator chose)."""
    try:
        handle = client.get_workflow_handle(controller_workflow_id(cluster), result_type=ControllerStopped)
        stopped: ControllerStopped = await handle.result()  # decoded as result_type
        return stopped
    except WorkflowFailureError:  # cancelled, not stopped: no result to read
        return ControllerStopped(reason="cancelled", at=datetime.now(UTC))


class ControllerRun(BaseModel):
    """The controller's state, from its latest run (runtime/controller_start.py), before anything its
    last pass said: `running`, `stopped` (by an operator: `stop` or a cancel), `failed`, `terminated`,
    `timed out` (accidents the workers' supervision undoes) or `missing` (never started)."""

    state: str
    workflow_id: str
    stopped: ControllerStopped | None = None

    def line(self) -> str:
        if self.state == "stopped" and self.stopped is not None:
            who = f" by {self.stopped.by}" if self.stopped.by else ""
            why = self.stopped.reason or "no reason given"
            return (
                f"stopped{who} at {self.stopped.at:%Y-%m-%d %H:%M:%S}: {why}; it starts no command until "
                "`karpflow controller start`"
            )
        if self.state == "missing":
            return "not started: no worker started it yet (`karpflow controller start` starts it)"
        if self.state != "running":
            return f"{self.state}: the workers' supervision starts it again (`karpflow controller start` now)"
        return "running"


async def controller_state(client: Client, cluster: str) -> ControllerRun:
    workflow_id = controller_workflow_id(cluster)
    latest = await latest_status(client, cluster)
    if latest is None:
        return ControllerRun(state="missing", workflow_id=workflow_id)
    if latest in STOPPED_ON_PURPOSE:
        return ControllerRun(
            state="stopped", workflow_id=workflow_id, stopped=await _stop_of(client, cluster)
        )
    if latest in RUNNING:
        return ControllerRun(state="running", workflow_id=workflow_id)
    return ControllerRun(state=latest.name.lower().replace("_", " "), workflow_id=workflow_id)


# The reasons a running workflow gives a node: true only while it runs.
HELD_KINDS = frozenset({why_not.Kind.IN_PROGRESS, why_not.Kind.AWAITING_APPROVAL})


def current(
    status: ControllerStatus, state: ControllerRun, flying: InFlight, now: datetime
) -> ControllerStatus:
    """The last pass's status with only what is still true now: what is in flight as visibility lists
    it now (not at the last pass), nodes held by a workflow only while it still runs (named with its
    phase now), backoffs not yet over; a controller that does not run validates nothing and is not
    quiet."""
    ended = set(status.in_flight) - set(flying.ids)
    blocked: dict[str, str] = {}
    for node, why in status.blocked.items():
        if why_not.kind_of(why) not in HELD_KINDS:
            blocked[node] = why
        elif node in flying.holders:
            blocked[node] = why_not.in_flight_reason(*flying.holders[node])
        elif not any(workflow_id in why for workflow_id in ended):
            blocked[node] = why  # held by no workflow the pass named (a node deleted by hand)
        # else: its holder finished since the pass; the next pass says what became of the node
    update: dict[str, Any] = {
        "in_flight": list(flying.ids),
        "blocked": blocked,
        "backoffs": [b for b in status.backoffs if b.until > now],
    }
    if state.state != "running":
        update |= {"validating": [], "quiet": False, "stopping": state.line()}
    return status.model_copy(update=update)


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
    if status.last_pass_at is None:
        return answer | {"held_back": False, "reason": "the controller has not run a pass yet"}
    return answer | {
        "held_back": False,
        "reason": "not held back by the last pass and nothing disrupts it now: the next pass may start "
        "a command for it (or the node joined after the last pass)",
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


def _no_answer(settings: WorkerSettings, state: ControllerRun, why: str, as_json: bool) -> None:
    """No status to show: the controller's state and why, as text or JSON; exit 1."""
    text = (
        f"no controller answers for cluster {settings.cluster_name} ({state.workflow_id}): {why}. "
        + ("Is a worker running? " if state.state in ("running", "stopped") else "")
        + "`karpflow controller start` starts it."
    )
    if as_json:
        shown = {"cluster": settings.cluster_name, "controller": state.model_dump(mode="json"), "error": text}
        click.echo(json.dumps(shown, indent=2))
    else:
        click.echo(f"controller of {settings.cluster_name}: {state.line()}", err=True)
        click.echo(text, err=True)
    _leave(1)


def _status_command(settings: WorkerSettings, output: str, node: str | None = None) -> None:
    as_json = output == "json"

    async def go() -> tuple[ControllerStatus, ControllerRun, list[str], list[RolloutProgress]]:
        if node is not None and await find_in_cluster(settings, "Node", node) is None:
            click.echo(f"karpflow status: {no_such('Node', node, 'nodes')}", err=True)
            _leave(2)
        client = await _client(settings)
        state = await controller_state(client, settings.cluster_name)
        if state.state == "missing":
            _no_answer(settings, state, "it was never started", as_json)
        try:
            status = await read_status(client, settings.cluster_name)
        except RPCError as err:
            _no_answer(settings, state, err.message, as_json)
            raise  # unreachable: _no_answer does not return
        flying = await read_in_flight(client, settings.task_queue)
        status = current(status, state, flying, datetime.now(UTC))
        running = await running_for(client, node) if node is not None else []
        rollouts = await running_rollouts(client, settings.cluster_name) if node is None else []
        return status, state, running, rollouts

    status, state, running, rollouts = asyncio.run(go())
    if node is not None:
        answer = node_answer(status, node, running) | {"controller": state.state}
        if as_json:
            click.echo(json.dumps(answer, indent=2, default=str))
        else:
            console = Console()
            if state.state != "running":
                console.print(f"[yellow]controller {state.line()}[/]")
            render_node(answer, console)
        _leave(0)
    if as_json:
        shown = {
            "controller": state.model_dump(mode="json"),
            **status.model_dump(mode="json"),
            "rollouts": [r.model_dump() for r in rollouts],
        }
        click.echo(json.dumps(shown, indent=2))
    else:
        console = Console()
        render(status, console, state)
        for rollout in rollouts:
            console.print(f"rollout {rollout.line()}")
    _leave(0)


@controller.command("status")
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_connection_options
def controller_status(settings: WorkerSettings, output: str) -> None:
    """The controller's state, then what its last pass did that still holds: what is in flight now,
    backoffs not over, and whether the cluster is quiet."""
    _status_command(settings, output)


@click.command("status")
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--node", help="what holds this node back, from the controller's last pass")
@_connection_options
def status(settings: WorkerSettings, output: str, node: str | None) -> None:
    """The controller's state and status (same as `karpflow controller status`); with --node, why that
    node is not disrupted (exit 2 when the cluster has no such Node)."""
    _status_command(settings, output, node)


def render(status: ControllerStatus, console: Console, state: ControllerRun | None = None) -> None:
    when = status.last_pass_at
    ago = f"{(datetime.now(UTC) - when).total_seconds():.0f}s ago" if when else "never"
    last = (
        f"pass {status.passes}, last {ago} ({status.last_pass_seconds:.2f}s, {status.last_pass_nodes} nodes)"
    )
    if state is None or state.state == "running":
        work = "[green]quiet[/]" if status.quiet else "[yellow]working[/]"
        console.print(f"controller of [bold]{status.cluster}[/]: running, {work}; {last}")
    else:
        console.print(f"controller of [bold]{status.cluster}[/]: [yellow]{state.line()}[/]")
        console.print(f"its last run's {last}: what follows is what that pass saw, less what ended since")
    if status.stopping and (state is None or state.state == "running"):
        console.print(f"[yellow]controller {status.stopping}[/]")  # asked to stop, not closed yet
    for pause in status.pauses:
        console.print(
            f"[yellow]paused[/] {pause.describe()} since {pause.since:%Y-%m-%d %H:%M:%S} "
            "(new commands it covers wait; `karpflow resume` lifts it)"
        )
    if status.breaker:
        console.print(
            f"[yellow]paused by the cluster-health breaker[/]: {status.breaker} (new emptiness, "
            "consolidation, drift and rebalance commands wait; it lifts when the cluster recovers)"
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
    # Validated as what click read (an action is a plain string there).
    return PauseRequest.model_validate(
        {"scope": scope, "nodepool": nodepool, "action": action, "reason": reason, "by": by}
    )


def _target(request: PauseRequest) -> str:
    return {
        "global": "everything",
        "nodepool": f"NodePool {request.nodepool}",
        "action": f"{request.action}",
    }[request.scope]


def _send(settings: WorkerSettings, update: str, request: PauseRequest, allow_missing: bool = False) -> None:
    body = request.model_dump(mode="json", exclude_none=True)
    if update == UPDATE_RESUME:
        body = {k: v for k, v in body.items() if k in ("scope", "nodepool", "action")}

    async def go() -> int:
        pool = request.nodepool if update == UPDATE_PAUSE and not allow_missing else None
        if pool and await find_in_cluster(settings, "NodePool", pool) is None:
            click.echo(
                f"pause refused: {no_such('NodePool', pool, 'nodepools')}, so the pause would hold back "
                "nothing (a misspelt name?). To pause a NodePool before it is created, pass "
                "--allow-missing; nothing paused",
                err=True,
            )
            return 2
        handle = (await _client(settings)).get_workflow_handle(controller_workflow_id(settings.cluster_name))
        try:
            pauses = await handle.execute_update(update, body, result_type=Pauses)
        except WorkflowUpdateFailedError as err:
            click.echo(f"{update} refused: {err.cause}", err=True)
            return 1
        except RPCError as err:
            click.echo(f"{update}: {handle.id}: {err}", err=True)
            return 1
        if update == UPDATE_RESUME:
            click.echo(f"resumed: {_target(request)} (new commands it held back start from the next pass)")
        still = "still paused" if update == UPDATE_RESUME else "paused"
        for pause in pauses.pauses:
            click.echo(f"{still}: {pause.describe()} since {pause.since:%Y-%m-%d %H:%M:%S}")
        if not pauses.pauses:
            click.echo("nothing paused now")
        return 0

    _leave(asyncio.run(go()))


_NODEPOOL = click.option("--nodepool", help="only this NodePool's nodes")
_ACTION = click.option("--action", type=click.Choice(WINDOW_ACTIONS), help="only this action")


@click.command("pause")
@_NODEPOOL
@_ACTION
@click.option("--reason", default="", help="why, shown by `karpflow status` and on the held-back nodes")
@click.option(
    "--allow-missing",
    is_flag=True,
    help="pause a NodePool the cluster does not have (yet): e.g. before applying it, so its first nodes "
    "wait for `karpflow resume`. Without it such a pause is refused (exit 2): a misspelt name would "
    "pause nothing and look like success.",
)
@_connection_options
def pause(
    settings: WorkerSettings, nodepool: str | None, action: str | None, reason: str, allow_missing: bool
) -> None:
    """Start no new command (of a NodePool, or of an action) until `karpflow resume`; commands in
    flight finish. Pausing the same target again replaces the reason. A NodePool must exist unless
    --allow-missing."""
    _send(settings, UPDATE_PAUSE, _request(nodepool, action, reason), allow_missing)


@click.command("resume")
@_NODEPOOL
@_ACTION
@_connection_options
def resume(settings: WorkerSettings, nodepool: str | None, action: str | None) -> None:
    """Lift the pause of that target (the same flags as the pause; refused when it is not paused); the
    next pass starts at once. Says what it resumed and what stays paused."""
    _send(settings, UPDATE_RESUME, _request(nodepool, action))


# -- `karpflow approve` and `karpflow reject`: a command waiting for approval -----------------------

WAITING_LIST = "temporal workflow list --query \"KarpflowPhase = 'AwaitingApproval'\""


async def _waiting_command(client: Client, workflow_id: str, update: str) -> str | None:
    """Why `workflow_id` cannot be approved or rejected (None when it is a running DisruptionWorkflow:
    the workflow itself refuses one that does not wait)."""
    try:
        described = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return f"no workflow {workflow_id} in namespace {client.namespace}"
        raise
    if described.workflow_type != "DisruptionWorkflow":
        return (
            f"{workflow_id} is a {described.workflow_type}, not a disruption: {update} takes the id of a "
            f"DisruptionWorkflow waiting for approval (`{WAITING_LIST}` lists them)"
        )
    if described.status != WorkflowExecutionStatus.RUNNING:
        name = described.status.name.title() if described.status else "closed"
        return f"{workflow_id} is closed ({name}): nothing waits for a decision"
    return None


def _decide(settings: WorkerSettings, update: str, workflow_id: str, reason: str) -> None:
    body = {"by": f"{getpass.getuser()}@{socket.gethostname()}", "reason": reason}

    async def go() -> int:
        client = await _client(settings)
        try:
            wrong = await _waiting_command(client, workflow_id, update)
        except RPCError as err:
            click.echo(f"{update}: {workflow_id}: {err.message}", err=True)
            return 1
        if wrong is not None:
            click.echo(f"{update} refused: {wrong}", err=True)
            return 2
        handle = client.get_workflow_handle(workflow_id)
        try:
            status = await handle.execute_update(update, body, result_type=DisruptionStatus)
        except WorkflowUpdateFailedError as err:
            click.echo(f"{update} refused: {err.cause}", err=True)
            return 1
        except RPCError as err:
            click.echo(f"{update}: {workflow_id}: {err.message}", err=True)
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
    windows and NodeDisruptionBudgets again. WORKFLOW_ID is a DisruptionWorkflow's."""
    _decide(settings, "approve", workflow_id, reason)


@click.command("reject")
@click.argument("workflow_id")
@click.option("--reason", default="", help="why, kept in the command's status")
@_connection_options
def reject(settings: WorkerSettings, workflow_id: str, reason: str) -> None:
    """End a command waiting for approval with nothing changed. WORKFLOW_ID is a DisruptionWorkflow's."""
    _decide(settings, "reject", workflow_id, reason)
