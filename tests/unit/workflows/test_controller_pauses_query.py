"""The `pauses` query every voluntary path outside a pass reads (activities/controls_gate.py), against
the real ControllerWorkflow on the dev server (its activities scripted): what a paused controller
answers, and that a controller that does not run holds no pause (issue 30 item 6)."""

from __future__ import annotations

import uuid

from activities.controls_gate import controller_pauses
from api.controller_io import UPDATE_PAUSE, ControllerInput, PauseRequest
from api.workflow_ids import controller_workflow_id
from tests.unit.workflows.controller_fakes import (  # noqa: F401 - the fixture
    ControllerHarness,
    controller_harness_fixture,
)


async def test_the_pauses_query_answers_what_the_controller_holds_while_it_runs(
    controller_harness: ControllerHarness,
):
    harness = controller_harness
    cluster = f"unit-{uuid.uuid4().hex[:8]}"
    assert await controller_pauses(harness.client, cluster) == []  # never started: nobody paused
    handle = await harness.client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(cluster=cluster, task_queue=harness.task_queue, interval_seconds=0.01),
        id=controller_workflow_id(cluster),
        task_queue=harness.task_queue,
    )
    try:
        assert await controller_pauses(harness.client, cluster) == []
        await handle.execute_update(UPDATE_PAUSE, PauseRequest(scope="nodepool", nodepool="gpu", by="ops"))
        (pause,) = await controller_pauses(harness.client, cluster)
        assert pause.key == "nodepool/gpu" and pause.by == "ops"
    finally:
        await handle.terminate("test over")
    assert await controller_pauses(harness.client, cluster) == []  # its pauses ended with its run
