"""Starting, keeping and stopping the cluster's ControllerWorkflow: one definition for the worker
(at start-up and in its supervision loop) and for `karpflow controller start|stop`.

How a stop is remembered: the controller never completes on its own (it continues as new), so a
latest run that COMPLETED was stopped by an operator (`stop` signal: its result says by whom and
why), and one that was CANCELED was cancelled by one (`temporal workflow cancel`, the Web UI). The
workers leave those alone. Any other end (FAILED, TERMINATED, TIMED_OUT) or no controller at all is
an accident: every worker's supervision starts it again, idempotently (one id per cluster, and
USE_EXISTING when two workers start it at once). `karpflow controller start` starts it whatever
the last run's end, which undoes a stop.

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

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from api.controller_io import SIGNAL_STOP, ControllerInput, StopRequest
from api.workflow_ids import controller_workflow_id
from runtime.settings import WorkerSettings

log = logging.getLogger("karpflow.controller")

RUNNING = frozenset({WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW})
# A workflow task attempt from which the supervision says the controller is stuck (one failure may be a
# worker that died mid-task; several in a row are code that cannot run its history).
STUCK_TASK_ATTEMPT = 3
# Ends an operator chose: the supervision must not undo them.
STOPPED_ON_PURPOSE = frozenset({WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.CANCELED})


def controller_input(settings: WorkerSettings) -> ControllerInput:
    return ControllerInput(
        cluster=settings.cluster_name,
        task_queue=settings.task_queue,
        interval_seconds=settings.controller_interval,
        validation_seconds=settings.controller_validation,
    )


async def start_controller(client: Client, settings: WorkerSettings) -> WorkflowHandle:
    """Start the controller unless it runs already (a stopped one starts again)."""
    return await client.start_workflow(
        "ControllerWorkflow",
        controller_input(settings),
        id=controller_workflow_id(settings.cluster_name),
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


@dataclass(frozen=True)
class ControllerCheck:
    """What `ensure_controller` found and did."""

    status: WorkflowExecutionStatus | None  # the latest run's, before any start; None: never ran
    started_run: str | None = None  # the run it started, if it did
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


async def ensure_controller(client: Client, settings: WorkerSettings) -> ControllerCheck:
    """Start the controller if it is missing or ended by accident; leave a running or a stopped one."""
    latest = await _latest(client, settings.cluster_name)
    if latest.status in RUNNING or latest.status in STOPPED_ON_PURPOSE:
        return latest
    handle = await start_controller(client, settings)
    return ControllerCheck(latest.status, handle.result_run_id)


async def supervise_controller(client: Client, settings: WorkerSettings, every: float) -> None:
    """Every `every` seconds, `ensure_controller`; never raises (Temporal may be away a while)."""
    said_stopped = False
    while True:
        await asyncio.sleep(every)
        try:
            check = await ensure_controller(client, settings)
        except Exception as err:
            log.warning("cannot check the controller of cluster %s: %s", settings.cluster_name, err)
            continue
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


async def stop_controller(client: Client, settings: WorkerSettings, request: StopRequest) -> WorkflowHandle:
    """Ask the controller to stop. A controller that is not running (failed, terminated) gets a run
    that stops at once, so the stop is remembered and the workers do not start it again."""
    return await client.start_workflow(
        "ControllerWorkflow",
        controller_input(settings),
        id=controller_workflow_id(settings.cluster_name),
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=SIGNAL_STOP,
        start_signal_args=[request],
    )
