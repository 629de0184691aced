"""Starting, keeping and stopping the cluster's ControllerWorkflow: one definition for the worker
(at start-up and in its supervision loop) and for `karpflow controller start|stop`.

How a stop is remembered: the controller never completes on its own (it continues as new), so a
latest run that COMPLETED was stopped by an operator (`stop` signal: its result says by whom and
why), and one that was CANCELED was cancelled by one (`temporal workflow cancel`, the Web UI). The
workers leave those alone. Any other end (FAILED, TERMINATED, TIMED_OUT) or no controller at all is
an accident: every worker's supervision starts it again, idempotently (one id per cluster, and
USE_EXISTING when two workers start it at once). `karpflow controller start` starts it whatever
the last run's end, which undoes a stop.

Nothing an operator set is lost however the controller ended: a run started after another carries
over the last one's state (its pauses first, and its backoffs and unavailable offerings): from a
stopped run's result (ControllerStopped.state, readable without a worker), else from the ended run's
`state` query (Temporal replays a closed run's history on a worker to answer it). What was carried,
or why nothing could be, is said (`karpflow controller start` prints it; the workers log it).

A bug in the controller's workflow code does not fail its run: the controller lists no
`failure_exception_types`, so its workflow task fails and is retried until a worker with fixed
code runs it, which then carries on with the run's state (pauses, backoffs, unavailable offerings).
A failed run would be started again by this supervision with none of that state: a pause an
operator set would be silently lifted. A controller that retries starts nothing, which is safe, but
shows nothing either: the supervision logs a warning while its workflow task keeps failing
(docs/workflow-changes.md, "When a workflow fails").
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from api.controller_io import SIGNAL_STOP, ControllerInput, ControllerState, ControllerStopped, StopRequest
from api.workflow_ids import controller_workflow_id
from runtime.settings import WorkerSettings

log = logging.getLogger("karpflow.controller")

RUNNING = frozenset({WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW})
# A workflow task attempt from which the supervision says the controller is stuck (one failure may be a
# worker that died mid-task; several in a row are code that cannot run its history).
STUCK_TASK_ATTEMPT = 3
# Ends an operator chose: the supervision must not undo them.
STOPPED_ON_PURPOSE = frozenset({WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.CANCELED})


# How long the start waits for a worker to answer the ended run's `state` query, and how many
# supervision checks in a row may fail to read it before the controller starts without it.
STATE_QUERY_TIMEOUT = timedelta(seconds=10)
CARRY_ATTEMPTS = 3


def controller_input(settings: WorkerSettings, state: ControllerState | None = None) -> ControllerInput:
    return ControllerInput(
        cluster=settings.cluster_name,
        task_queue=settings.task_queue,
        interval_seconds=settings.controller_interval,
        validation_seconds=settings.controller_validation,
        state=state if state is not None else ControllerState(),
        gc_interval_seconds=settings.gc_interval,
        gc_grace_seconds=settings.gc_grace,
        gc_registration_ttl_seconds=settings.gc_registration_ttl,
    )


@dataclass(frozen=True)
class Carried:
    """What a new run takes over from the one before (None: nothing to take, or it could not be read)."""

    state: ControllerState | None = None
    problem: str = ""  # why the last run's state could not be read

    def describe(self) -> str:
        if self.problem:
            return f"nothing carried over from the last run: {self.problem}"
        if self.state is None:
            return "a first run: nothing to carry over"
        pauses = sorted(self.state.pauses.values(), key=lambda p: p.key)
        parts = [
            f"{len(pauses)} pause(s)" + (f" ({'; '.join(p.describe() for p in pauses)})" if pauses else "")
        ]
        if self.state.backoffs:
            parts.append(f"{len(self.state.backoffs)} backoff(s)")
        if self.state.unavailable:
            parts.append(f"{len(self.state.unavailable)} unavailable offering(s)")
        return "carried over from the last run: " + ", ".join(parts)


async def carried_state(client: Client, cluster: str) -> Carried:
    """The latest run's state, for the run about to start (module docstring)."""
    handle = client.get_workflow_handle(controller_workflow_id(cluster), result_type=ControllerStopped)
    try:
        described = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return Carried()
        return Carried(problem=f"cannot describe it: {err}")
    if described.status == WorkflowExecutionStatus.COMPLETED:
        try:
            stopped = await handle.result()
            if stopped.state is not None:
                return Carried(stopped.state)
        except Exception as err:  # an older run's result: ask it instead
            log.info("cannot read the stopped controller's result (%s): asking its state", err)
    try:
        state = await handle.query("state", result_type=ControllerState, rpc_timeout=STATE_QUERY_TIMEOUT)
    except Exception as err:
        return Carried(problem=f"its state query was not answered ({err}); is a worker running?")
    return Carried(state)


async def start_controller(
    client: Client, settings: WorkerSettings, carried: Carried | None = None
) -> tuple[WorkflowHandle[Any, Any], Carried]:
    """Start the controller unless it runs already (a stopped one starts again), carrying over the
    state of the run before it (`carried`: read already by the caller)."""
    if carried is None:
        status = await latest_status(client, settings.cluster_name)
        carried = Carried() if status in RUNNING else await carried_state(client, settings.cluster_name)
    handle = await client.start_workflow(
        "ControllerWorkflow",
        controller_input(settings, carried.state),
        id=controller_workflow_id(settings.cluster_name),
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return handle, carried


@dataclass(frozen=True)
class ControllerCheck:
    """What `ensure_controller` found and did."""

    status: WorkflowExecutionStatus | None  # the latest run's, before any start; None: never ran
    started_run: str | None = None  # the run it started, if it did
    carry_problem: str = ""  # not started: the ended run's state could not be read yet
    task_attempt: int = 0  # the running controller's pending workflow task's attempt (0: none pending)

    @property
    def stuck(self) -> bool:
        """Running, but its workflow task keeps failing (a bug, or code its history does not match)."""
        return self.status in RUNNING and self.task_attempt >= STUCK_TASK_ATTEMPT

    @property
    def stopped(self) -> bool:
        return self.status in STOPPED_ON_PURPOSE


async def latest_status(client: Client, cluster: str) -> WorkflowExecutionStatus | None:
    return (await _latest(client, cluster)).status


async def _latest(client: Client, cluster: str) -> ControllerCheck:
    try:
        described = await client.get_workflow_handle(controller_workflow_id(cluster)).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return ControllerCheck(None)
        raise
    pending = described.raw_description.pending_workflow_task  # attempt 0 when none is pending
    return ControllerCheck(described.status, task_attempt=pending.attempt)


async def ensure_controller(
    client: Client, settings: WorkerSettings, *, start_without_state: bool = True
) -> ControllerCheck:
    """Start the controller if it is missing or ended by accident; leave a running or a stopped one.
    A run whose state cannot be read is started again without it only with `start_without_state`
    (the supervision tries a few times first: a pause must not be lost to a passing fault)."""
    latest = await _latest(client, settings.cluster_name)
    if latest.status in RUNNING or latest.status in STOPPED_ON_PURPOSE:
        return latest
    carried = await carried_state(client, settings.cluster_name)
    if carried.problem and not start_without_state:
        return ControllerCheck(latest.status, carry_problem=carried.problem)
    handle, carried = await start_controller(client, settings, carried)
    if carried.problem or (carried.state is not None and carried.state.pauses):
        log.warning("controller %s: %s", handle.id, carried.describe())
    return ControllerCheck(latest.status, handle.result_run_id)


async def supervise_controller(client: Client, settings: WorkerSettings, every: float) -> None:
    """Every `every` seconds, `ensure_controller`; never raises (Temporal may be away a while)."""
    said_stopped = False
    carry_failures = 0
    while True:
        await asyncio.sleep(every)
        try:
            check = await ensure_controller(
                client, settings, start_without_state=carry_failures + 1 >= CARRY_ATTEMPTS
            )
        except Exception as err:
            log.warning("cannot check the controller of cluster %s: %s", settings.cluster_name, err)
            continue
        if check.carry_problem:
            carry_failures += 1
            log.warning(
                "controller %s ended (%s) and its state cannot be read yet (%s): try %d of %d before "
                "starting it without its pauses",
                controller_workflow_id(settings.cluster_name),
                check.status.name if check.status else "missing",
                check.carry_problem,
                carry_failures,
                CARRY_ATTEMPTS,
            )
            continue
        carry_failures = 0
        if check.started_run is not None:
            ended = check.status.name if check.status is not None else "missing"
            log.warning(
                "controller %s was %s: started it again (run %s)",
                controller_workflow_id(settings.cluster_name),
                ended,
                check.started_run,
            )
        if check.stuck:
            log.warning(
                "controller %s is running but its workflow task has failed %d times in a row (a bug in "
                "this version's workflow code, or code its history does not match): it starts nothing "
                "until a worker with fixed code runs it, and then carries on where it was; the "
                "worker log has the error",
                controller_workflow_id(settings.cluster_name),
                check.task_attempt - 1,
            )
        if check.stopped and not said_stopped:
            log.info(
                "controller %s is stopped (%s by an operator); `karpflow controller start` starts it",
                controller_workflow_id(settings.cluster_name),
                check.status.name if check.status else "",
            )
        said_stopped = check.stopped


async def stop_controller(
    client: Client, settings: WorkerSettings, request: StopRequest
) -> WorkflowHandle[Any, Any]:
    """Ask the controller to stop. A controller that is not running (failed, terminated) gets a run
    that stops at once, so the stop is remembered and the workers do not start it again; it carries
    the ended run's state, for the run that starts after the stop."""
    status = await latest_status(client, settings.cluster_name)
    carried = Carried() if status in RUNNING else await carried_state(client, settings.cluster_name)
    return await client.start_workflow(
        "ControllerWorkflow",
        controller_input(settings, carried.state),
        id=controller_workflow_id(settings.cluster_name),
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=SIGNAL_STOP,
        start_signal_args=[request],
    )
