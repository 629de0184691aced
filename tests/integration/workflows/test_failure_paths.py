"""Failure paths on the real stack (issue 30's acceptance): what an operator sees when a step fails
for good, with the real `temporal` CLI, the worker, the emulator and moto.

Every eviction denied by an admission webhook (a 400, as a validating webhook on pods/eviction
answers), and a disruption of one node with pods started by hand: within 150 s the command has
closed, or it is still running and its status query answers; no workflow task failed on the way (a
failed workflow task is what wedged a parent whose child failed)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus

from api.workflow_io import DisruptionStatus
from sim.apiserver.faults import FaultRule
from sim.binaries import temporal_cli
from tests.integration.workflows.conftest import Workload, node, scenario

pytestmark = pytest.mark.integration

A, B = node("172.31.1.10", "m5.xlarge"), node("172.31.2.20", "m5.xlarge")
PODS = [Workload("shop", "web", "100m", "128Mi", ["10", "10", "20"])]
DENIED = 'admission webhook "deny-evictions.example.com" denied the request: evictions are frozen'


async def workflow_task_failures(karpflow, workflow_id: str) -> list[str]:
    failed = []
    async for event in karpflow.client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failed.append(event.workflow_task_failed_event_attributes.failure.message)
    return failed


@pytest.mark.slow  # up to about a minute: the drain's retries under denied evictions
@pytest.mark.sim_stack(scenario=scenario([A, B], PODS, termination_grace_period="60s"))
async def test_evictions_denied_for_good_never_wedge_a_hand_started_disruption(karpflow):
    karpflow.stack.api_faults.add(
        FaultRule(verb="create", resource="pods/eviction", status=400, message=DENIED)
    )
    workflow_id = karpflow.workflow_id("disruption/default/Underutilized")
    body = {"reason": "Underutilized", "nodes": [A.name]}
    async with karpflow.worker():
        await karpflow.run(
            temporal_cli(), "workflow", "start", "--type", "DisruptionWorkflow",
            "--task-queue", karpflow.task_queue, "--workflow-id", workflow_id, "--input", json.dumps(body),
            TEMPORAL_ADDRESS=karpflow.temporal_address,
        )  # fmt: skip
        handle = karpflow.client.get_workflow_handle(workflow_id)
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            described = await handle.describe()
            if described.status != WorkflowExecutionStatus.RUNNING:
                break
            status = await handle.query("status", result_type=DisruptionStatus)  # answers while it runs
            assert status.phase
            await asyncio.sleep(1)
        described = await handle.describe()
        failures = await workflow_task_failures(karpflow, workflow_id)
        assert failures == [], failures
        termination = None
        if described.status == WorkflowExecutionStatus.RUNNING:
            status = await handle.query("status", result_type=DisruptionStatus)
            assert status.phase, status
        else:
            status = await handle.query("status", result_type=DisruptionStatus)
            termination = next((c.termination_id for c in status.candidates if c.termination_id), None)
            # Closed with a cause an operator can read: the drain and the webhook's words.
            assert described.status in (WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.COMPLETED)
            assert status.message, status
        if termination:
            assert await workflow_task_failures(karpflow, termination) == []
