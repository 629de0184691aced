"""The paths the fault matrix (issue 30) changed, recorded by the code before and after the change.

Each `*-before-issue-30` history was recorded by the code of commit 87be083 (`git stash` the
workflows, then `KARPFLOW_RECORD_HISTORIES=1 pytest tests/unit/workflows/test_replay_fault_paths.py
-k record_before`; never re-record them): it must replay on the current code, on the old side of
the change's patch. The histories without the suffix are recorded by today's code (`-k record_after`)
and take the new side. test_replay.py replays every history in histories/; here, which side each
takes is checked.

- a disruption cancelled while it awaits approval (`disruption-canceled-phase`);
- a rollback whose listing of the command's instances fails (`disruption-discard-known-instances`);
- a termination cancelled while it records its failure's Event (`termination-failure-through-cancel`);
- a disruption whose TerminationWorkflow is cancelled from outside (no patch: the same commands, the
  candidate now Failed instead of the run saying it was cancelled).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle, WorkflowHistory

from api.workflow_io import Approval, DisruptionInput, ReplacementSpec, TerminationInput
from tests.unit.workflows.conftest import Harness
from tests.unit.workflows.fault_injection import Fault
from tests.unit.workflows.test_replay import (
    FAULT_PATH_CHANGES,
    HISTORIES,
    RECORD,
    _load,
    _patches,
    _save,
    _settle,
)

BEFORE = tuple(f"{name}-before-issue-30" for name in FAULT_PATH_CHANGES)


async def _phase(handle: WorkflowHandle[Any, Any], phase: str) -> None:
    for _ in range(200):
        if await handle.query("phase") == phase:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never reached {phase}")


async def record(harness: Harness, suffix: str) -> None:
    client, queue, cluster = harness.client, harness.task_queue, harness.cluster
    spec = ReplacementSpec(nodepool="default", instance_types=["m5.large"], zones=["zone-a"])
    cluster.nodes.update({"a1", "l1", "e1", "c1"})

    gated = DisruptionInput(
        reason="Underutilized", nodes=["a1"], approval=Approval(timeout=timedelta(hours=1))
    )
    handle = await client.start_workflow(
        "DisruptionWorkflow", gated, id=f"disruption/default/Underutilized/a1-{suffix}", task_queue=queue
    )
    await _phase(handle, "AwaitingApproval")
    await handle.cancel()
    await _settle(handle)
    await _save(f"disruption-approval-canceled{suffix}", handle)

    cluster.faults.arm("DisruptionWorkflow", "await_node_ready", Fault.PERMANENT)
    cluster.faults.arm("DisruptionWorkflow", "find_command_instances", Fault.PERMANENT)
    command = DisruptionInput(reason="Underutilized", nodes=["l1"], replacements=[spec])
    handle = await client.start_workflow(
        "DisruptionWorkflow", command, id=f"disruption/default/Underutilized/l1-{suffix}", task_queue=queue
    )
    await _settle(handle)
    await _save(f"disruption-listing-failed{suffix}", handle)

    cluster.faults.refuse("TerminationWorkflow", "drain_node", "eviction refused (replay)")
    event = cluster.faults.arm("TerminationWorkflow", "record_event", Fault.CANCELLED)
    handle = await client.start_workflow(
        "TerminationWorkflow",
        TerminationInput(node="e1", uid="uid-e1"),
        id=f"termination/e1-{suffix}",
        task_queue=queue,
    )
    await asyncio.wait_for(event.reached.wait(), 20)
    await handle.cancel()
    event.released.set()
    await _settle(handle)
    await _save(f"termination-event-canceled{suffix}", handle)

    cluster.faults.armed.pop("drain_node")
    drain = cluster.faults.arm("TerminationWorkflow", "drain_node", Fault.CANCELLED)  # holds until cancelled
    handle = await client.start_workflow(
        "DisruptionWorkflow",
        DisruptionInput(reason="Underutilized", nodes=["c1"]),
        id=f"disruption/default/Underutilized/c1-{suffix}",
        task_queue=queue,
    )
    await asyncio.wait_for(drain.reached.wait(), 20)
    await client.get_workflow_handle("termination/fake/c1/uid-c1").cancel()
    await _settle(handle)
    await _save(f"disruption-child-canceled{suffix}", handle)


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 (on the code of 87be083)")
async def test_record_before(harness: Harness) -> None:
    await record(harness, "-before-issue-30")


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_after(harness: Harness) -> None:
    await record(harness, "")


def _history(name: str) -> WorkflowHistory:
    return _load(HISTORIES / f"{name}.json")


def _closes(history: WorkflowHistory) -> str:
    return EventType.Name(history.events[-1].event_type)


def test_the_older_runs_take_the_old_side_and_todays_the_new() -> None:
    from workflows.disruption_patches import PATCH_CANCELED_PHASE, PATCH_DISCARD_KNOWN_INSTANCES
    from workflows.termination import PATCH_FAILED_THROUGH_CANCEL

    issue_30 = {PATCH_CANCELED_PHASE, PATCH_DISCARD_KNOWN_INSTANCES, PATCH_FAILED_THROUGH_CANCEL}
    for name in BEFORE:
        assert not (_patches(_history(name)) & issue_30), name
    assert PATCH_CANCELED_PHASE in _patches(_history("disruption-approval-canceled"))
    assert PATCH_DISCARD_KNOWN_INSTANCES in _patches(_history("disruption-listing-failed"))
    assert PATCH_FAILED_THROUGH_CANCEL in _patches(_history("termination-event-canceled"))
    # What changed, as the histories show it: a failed termination stays Failed through the cancel;
    # the older code closed it Canceled.
    assert _closes(_history("termination-event-canceled-before-issue-30")).endswith("CANCELED")
    assert _closes(_history("termination-event-canceled")).endswith("FAILED")
