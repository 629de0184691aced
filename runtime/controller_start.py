"""Starting the cluster's ControllerWorkflow: one definition for the worker (at start-up) and for
`karpflow controller start`. Idempotent: the id is the cluster's, and a running one is kept."""

from __future__ import annotations

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy

from api.controller_io import ControllerInput
from api.workflow_ids import controller_workflow_id
from runtime.settings import WorkerSettings


async def start_controller(client: Client, settings: WorkerSettings) -> WorkflowHandle:
    return await client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(
            cluster=settings.cluster_name,
            task_queue=settings.task_queue,
            interval_seconds=settings.controller_interval,
            validation_seconds=settings.controller_validation,
        ),
        id=controller_workflow_id(settings.cluster_name),
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
