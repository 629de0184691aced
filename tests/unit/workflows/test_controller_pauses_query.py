"""The `pauses` query every voluntary path outside a pass reads (activities/controls_gate.py), against
the real ControllerWorkflow on the dev server (its activities scripted): what a paused controller
answers while it runs, and that a controller that ended still holds its pauses, which the run started
next carries over (issue 30 item 6)."""

from __future__ import annotations

import uuid

from temporalio.client import WorkflowHandle

from activities.controls_gate import controller_pauses
from api.controller_io import SIGNAL_STOP, UPDATE_PAUSE, ControllerInput, PauseRequest, StopRequest
from api.workflow_ids import controller_workflow_id
from tests.unit.workflows.controller_fakes import (  # noqa: F401 - the fixture
    ControllerHarness,
    controller_harness_fixture,
)


async def paused_controller(harness: ControllerHarness) -> tuple[str, WorkflowHandle]:
    cluster = f"unit-{uuid.uuid4().hex[:8]}"
    assert await controller_pauses(harness.client, cluster) == []  # never started: nobody paused
    handle = await harness.client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(cluster=cluster, task_queue=harness.task_queue, interval_seconds=0.01),
        id=controller_workflow_id(cluster),
        task_queue=harness.task_queue,
    )
    assert await controller_pauses(harness.client, cluster) == []
    await handle.execute_update(UPDATE_PAUSE, PauseRequest(scope="nodepool", nodepool="gpu", by="ops"))
    (pause,) = await controller_pauses(harness.client, cluster)
    assert pause.key == "nodepool/gpu" and pause.by == "ops"
    return cluster, handle


async def test_a_running_controller_answers_its_pauses_and_a_stopped_one_still_holds_them(
    controller_harness: ControllerHarness,
):
    cluster, handle = await paused_controller(controller_harness)
    await handle.signal(SIGNAL_STOP, StopRequest(reason="maintenance", by="ops"))
    await handle.result()
    assert [p.key for p in await controller_pauses(controller_harness.client, cluster)] == ["nodepool/gpu"]


async def test_a_controller_that_ended_by_accident_still_holds_its_pauses(
    controller_harness: ControllerHarness,
):
    cluster, handle = await paused_controller(controller_harness)
    await handle.terminate("an accident")
    assert [p.key for p in await controller_pauses(controller_harness.client, cluster)] == ["nodepool/gpu"]
