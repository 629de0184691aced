"""ControllerWorkflow on the time-skipping server with fake planning activities: what one pass hands
the next, whatever Temporal visibility says."""

from __future__ import annotations

import asyncio

from temporalio.client import WorkflowExecutionStatus

from api import search_attributes as sa
from api.controller_io import ControllerInput, PlannedCommand
from api.workflow_io import DisruptionInput
from tests.unit.workflows.conftest import Harness

WID = "disruption/default/Underutilized/hold"


def command(nodes: list[str]) -> PlannedCommand:
    return PlannedCommand(
        workflow_id=WID,
        method="multi-node-consolidation",
        reason="Underutilized",
        nodes=nodes,
        nodepools=["default"],
        forceful=False,
        needs_validation=False,
        input=DisruptionInput(reason="Underutilized", nodes=nodes).model_dump(mode="json"),
        planned={},
    )


async def passes(harness: Harness, count: int) -> None:
    for _ in range(600):
        if len(harness.cluster.pass_requests) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"only {len(harness.cluster.pass_requests)} passes")


async def test_a_started_command_is_held_out_of_planning_until_visibility_lists_it(harness: Harness):
    cluster = harness.cluster
    cluster.taint_seconds = 3600  # the child stays in Tainting
    cluster.planned = [command(["n1", "n2"])]
    # Visibility lags: the pass after the start does not list it yet, the one after that does.
    cluster.visible = [[], [], [WID], [WID]]
    handle = await harness.client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(cluster="hold", task_queue=harness.task_queue, interval_seconds=0.2),
        id=harness.id("karpflow-controller"),
        task_queue=harness.task_queue,
    )
    try:
        await passes(harness, 4)
    finally:
        await handle.terminate("test over")
    holding = [r.holding for r in cluster.pass_requests[:4]]
    # Held from the start until a pass saw it in flight, then released (visibility holds its nodes).
    assert holding == [[], ["n1", "n2"], ["n1", "n2"], []]

    child = harness.client.get_workflow_handle(WID)
    assert (await child.describe()).status == WorkflowExecutionStatus.RUNNING
    # Searchable from the start (the started event carries them), not only once the child's first
    # task upserts them.
    started = (await child.fetch_history()).events[0].workflow_execution_started_event_attributes
    fields = started.search_attributes.indexed_fields
    assert sa.NODES.name in fields and sa.REASON.name in fields, sorted(fields)
    await child.terminate("test over")
