"""What the worker logs when an activity fails as expected (issue 17 item 15): one line with the
cause, not Temporal's traceback of every attempt. The worker's own interceptors, fake activities."""

from __future__ import annotations

import logging
import uuid

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from api.workflow_io import DisruptionInput, ReplacementSpec
from tests.unit.workflows.fakes import FakeCluster
from worker import WORKFLOWS, worker_interceptors


async def test_an_expected_refusal_is_one_line_with_its_cause_and_no_traceback(
    ts_client: Client, caplog: pytest.LogCaptureFixture
):
    cluster = FakeCluster()
    cluster.nodes.add("n1")
    cluster.fail_launch_of = {0}  # EC2 refuses the launch for good: the command rolls back
    task_queue = f"unit-{uuid.uuid4().hex[:8]}"
    spec = ReplacementSpec(nodepool="default", instance_types=["m5.large"], zones=["zone-a"])
    caplog.set_level(logging.DEBUG)
    async with Worker(
        ts_client,
        task_queue=task_queue,
        workflows=list(WORKFLOWS),
        activities=cluster.activities(),
        interceptors=worker_interceptors(),
    ):
        handle = await ts_client.start_workflow(
            "DisruptionWorkflow",
            DisruptionInput(reason="Underutilized", nodes=["n1"], replacements=[spec]),
            id=f"disruption/default/Underutilized/{task_queue}",
            task_queue=task_queue,
        )
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    launch = [
        r for r in caplog.records if "launch_instance" in r.getMessage() or _activity(r) == "launch_instance"
    ]
    noisy = [r for r in launch if r.levelno >= logging.WARNING and r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]
    (line,) = [r for r in launch if r.name == "karpflow.activities"]
    assert line.levelno == logging.WARNING and line.exc_info is None
    assert line.getMessage() == (
        f"launch_instance of {handle.id} attempt 1 refused (InvalidRequest): launch refused"
    )


def _activity(record: logging.LogRecord) -> str:
    details = getattr(record, "temporal_activity", None) or {}
    return details.get("activity_type", "")
