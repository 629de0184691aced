"""Starting, keeping and stopping the cluster's ControllerWorkflow: one definition for the worker
(at start-up and in its supervision loop) and for `karpflow controller start|stop`.

How a stop is remembered: the controller never completes on its own (it continues as new), so a
latest run that COMPLETED was stopped by an operator (`stop` signal: its result says by whom and
why), and one that was CANCELED was cancelled by one (`temporal workflow cancel`, the Web UI). The
workers leave those alone. Any other end (FAILED, TERMINATED, TIMED_OUT) or no controller at all is
an accident: every worker's supervision starts it again, idempotently (one id per cluster, and
USE_EXISTING when two workers start it at once). `karpflow controller start` starts it whatever
the last run's end, which undoes a stop.
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
# Ends an operator chose: the supervision must not undo them.
STOPPED_ON_PURPOSE = frozenset({WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.CANCELED})


def controller_input(settings: WorkerSettings) -> ControllerInput:
    return ControllerInput(
        cluster=settings.cluster_name,
        task_queue=settings.task_queue,
        interval_seconds=settings.controller_interval,
        validation_seconds=settings.controller_validation,
        gc_interval_seconds=settings.gc_interval,
        gc_grace_seconds=settings.gc_grace,
        gc_registration_ttl_seconds=settings.gc_registration_ttl,
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

    @property
    def stopped(self) -> bool:
        return self.status in STOPPED_ON_PURPOSE


async def latest_status(client: Client, cluster: str) -> WorkflowExecutionStatus | None:
    try:
        described = await client.get_workflow_handle(controller_workflow_id(cluster)).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return described.status


async def ensure_controller(client: Client, settings: WorkerSettings) -> ControllerCheck:
    """Start the controller if it is missing or ended by accident; leave a running or a stopped one."""
    status = await latest_status(client, settings.cluster_name)
    if status in RUNNING or status in STOPPED_ON_PURPOSE:
        return ControllerCheck(status)
    handle = await start_controller(client, settings)
    return ControllerCheck(status, handle.result_run_id)


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
