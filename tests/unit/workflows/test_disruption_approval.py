"""A command whose NodePool requires approval (issue 19 item 6): nothing is tainted before `approve`;
`reject` and the timeout end it with nothing changed; the updates are validated."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import pytest_asyncio
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from api.activity_io import WaitingCommandVerdict
from api.event_reasons import RecordEventRequest
from api.workflow_io import Approval, DisruptionInput, DisruptionStatus
from runtime.connections import ensure_search_attributes, with_karpflow_converter
from tests.unit.workflows.conftest import Harness
from tests.unit.workflows.fakes import FakeCluster
from tests.unit.workflows.test_disruption_workflow import command, nodes, start, wait_for_phase
from worker import WORKFLOWS
from workflows.disruption import UPDATE_APPROVE, UPDATE_REJECT


def gated(harness, timeout: timedelta = timedelta(hours=24)) -> DisruptionInput:
    cmd = command(nodes(harness, 1))
    cmd.approval = Approval(timeout=timeout, savings_per_hour=0.05)
    return cmd


LOOKS = ("record_event", "check_waiting_command")


def changes(harness) -> list[str]:
    """The activities a command called, but the Events it recorded and its checks (they change no node)."""
    return [name for name in harness.cluster.names() if name not in LOOKS]


async def recorded_events(harness, count: int) -> list[RecordEventRequest]:
    for _ in range(200):
        if len(harness.cluster.events) >= count:
            break
        await asyncio.sleep(0.02)
    return harness.cluster.events


async def current_details(handle) -> str:
    """What the Web UI shows as the workflow's current details (the SDK's built-in metadata query)."""
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def test_nothing_is_tainted_before_approve(harness):
    cmd = gated(harness)
    cmd.node_uids = {cmd.nodes[0]: harness.cluster.uid(cmd.nodes[0])}
    handle = await start(harness, cmd)
    waiting = await wait_for_phase(handle, "AwaitingApproval")
    assert waiting.candidates and changes(harness) == []
    memo = await (await handle.describe()).memo_value("approval")
    assert memo["savings_per_hour"] == 0.05 and memo["nodes"] == [c.node for c in waiting.candidates]
    # kubectl describe node: the wait is an Event on each candidate, pinned to the planner's UID.
    (event,) = await recorded_events(harness, 1)
    assert (event.kind, event.name, event.uid) == ("Node", cmd.nodes[0], cmd.node_uids[cmd.nodes[0]])
    assert event.reason == "DisruptionAwaitingApproval"
    assert event.message == f"Disruption {handle.id} waits for approval"
    # The Web UI: the pending plan, its savings and when the timeout rejects it.
    details = await current_details(handle)
    assert details.startswith("**Awaiting approval**: Underutilized: replace ")
    assert "$0.0500/h" in details and "(timeout 24h)" in details and f"- {cmd.nodes[0]}" in details
    with pytest.raises(WorkflowUpdateFailedError) as bad:
        await handle.execute_update(UPDATE_APPROVE, {"by": "ops", "extra": 1})
    assert "approve:" in str(bad.value.cause)

    await handle.execute_update(UPDATE_APPROVE, {"by": "ops", "reason": "looks right"})
    status = await handle.result()
    assert status.phase == "Succeeded"
    assert changes(harness)[0] == "taint_disrupted"
    assert (await current_details(handle)) == "approved by ops: looks right"
    with pytest.raises((WorkflowUpdateFailedError, RPCError)):  # decided already, and closed
        await handle.execute_update(UPDATE_REJECT, {})


async def test_reject_ends_it_with_nothing_changed(harness):
    handle = await start(harness, gated(harness))
    await wait_for_phase(handle, "AwaitingApproval")
    await handle.execute_update(UPDATE_REJECT, {"by": "ops", "reason": "not during the sale"})
    status: DisruptionStatus = await handle.result()
    assert status.phase == "Rejected"
    assert status.message == "rejected by ops: not during the sale; nothing changed"
    assert changes(harness) == []


async def test_no_decision_within_the_timeout_rejects(harness):
    # Seconds, not hours: the test server skips time only while nothing else runs, and a session's
    # other tests leave workflows waiting (the run after test_disruption_workflow.py hung on 2 h).
    handle = await start(harness, gated(harness, timeout=timedelta(seconds=2)))
    status = await handle.result()
    assert status.phase == "Rejected" and status.message.startswith("rejected by timeout")
    assert changes(harness) == [] and [e.reason for e in harness.cluster.events] == [
        "DisruptionAwaitingApproval"
    ]


async def test_a_command_without_approval_refuses_the_updates(harness):
    handle = await start(harness, command(nodes(harness, 1)))
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(UPDATE_APPROVE, {})
    assert "not awaiting approval" in str(refused.value.cause)
    assert (await handle.result()).phase == "Succeeded"
    assert harness.cluster.events == []  # no approval Event for a command that never waited


async def test_an_approved_command_whose_plan_no_longer_holds_takes_no_node(harness):
    cmd = gated(harness)
    cmd.approval.planned = {"method": "SingleNodeConsolidation"}  # what the controller keeps for the check
    harness.cluster.waiting_verdicts = [
        WaitingCommandVerdict(
            valid=False, reason="pod shop/db-0 has karpenter.sh/do-not-disrupt", approval_required=True
        )
    ]
    handle = await start(harness, cmd)
    await wait_for_phase(handle, "AwaitingApproval")
    await handle.execute_update(UPDATE_APPROVE, {"by": "ops"})
    status = await handle.result()
    assert status.phase == "Invalidated", status
    assert status.message == (
        "approved by ops, but the plan no longer holds: pod shop/db-0 has karpenter.sh/do-not-disrupt; "
        "nothing changed"
    )
    assert changes(harness) == []
    (check,) = harness.cluster.requests["check_waiting_command"]
    assert (
        check.workflow_id == handle.id and check.nodes == cmd.nodes and check.planned == cmd.approval.planned
    )


async def test_a_plan_that_stops_holding_while_it_waits_ends_the_wait(harness):
    harness.cluster.waiting_verdicts = [
        WaitingCommandVerdict(valid=True, nodes=[], approval_required=True),
        WaitingCommandVerdict(valid=False, reason="n1: the node is gone", approval_required=True),
    ]
    status = await (await start(harness, gated(harness))).result()  # the time-skipping server: ~10 min
    assert status.phase == "Invalidated"
    assert (
        status.message
        == "while awaiting approval the plan stopped holding: n1: the node is gone; nothing changed"
    )
    assert changes(harness) == []
    assert harness.cluster.names().count("check_waiting_command") == 2


async def test_the_annotation_removed_ends_the_wait_as_approved(harness):
    cmd = gated(harness)
    harness.cluster.waiting_verdicts = [
        None,  # a check that fails leaves the wait as it is
        WaitingCommandVerdict(valid=True, nodes=list(cmd.nodes), approval_required=False),
    ]
    status = await (await start(harness, cmd)).result()
    assert status.phase == "Succeeded", status
    assert changes(harness)[0] == "taint_disrupted"
    # The failed check, the one that saw the annotation gone, and the last look before the taint.
    assert harness.cluster.names().count("check_waiting_command") == 3


async def test_an_approved_command_goes_on_with_the_nodes_its_check_kept(harness):
    cmd = command(nodes(harness, 2), replacements=0)
    cmd.reason = "Empty"
    cmd.approval = Approval()
    kept = cmd.nodes[1]
    harness.cluster.waiting_verdicts = [
        WaitingCommandVerdict(valid=True, nodes=[kept], approval_required=True)
    ]
    handle = await start(harness, cmd)
    await wait_for_phase(handle, "AwaitingApproval")
    await handle.execute_update(UPDATE_APPROVE, {})
    status = await handle.result()
    assert status.phase == "Succeeded", status
    assert [c.node for c in status.candidates] == [kept]
    assert ("taint_disrupted", [kept]) in harness.cluster.calls


def test_forceful_work_never_waits_for_approval():
    with pytest.raises(ValueError, match="only a voluntary command"):
        DisruptionInput(reason="Expired", nodes=["n1"], approval=Approval())


# -- `karpflow approve` and `karpflow reject`, the real commands against the dev server ------------------

KARPFLOW = os.path.join(os.path.dirname(sys.executable), "karpflow")


@pytest_asyncio.fixture
async def dev_harness(dev_server_env: WorkflowEnvironment) -> AsyncIterator[Harness]:
    client = with_karpflow_converter(dev_server_env.client)
    assert await ensure_search_attributes(client)
    cluster = FakeCluster()
    task_queue = f"unit-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client, task_queue=task_queue, workflows=list(WORKFLOWS), activities=cluster.activities()
    ):
        yield Harness(client, cluster, task_queue)


async def karpflow(harness: Harness, *argv: str) -> subprocess.CompletedProcess[str]:
    address = harness.client.service_client.config.target_host
    env = {**os.environ, "KARPFLOW_TEMPORAL_ADDRESS": address, "KARPFLOW_CLUSTER_NAME": "unit"}
    return await asyncio.to_thread(
        subprocess.run, [KARPFLOW, *argv], capture_output=True, text=True, timeout=60, env=env, check=False
    )


async def test_karpflow_approve_and_reject(dev_harness: Harness):
    first, second = await start(dev_harness, gated(dev_harness)), await start(dev_harness, gated(dev_harness))
    for handle in (first, second):
        await wait_for_phase(handle, "AwaitingApproval")

    refused = await karpflow(dev_harness, "approve", "disruption/none/such")
    assert refused.returncode == 2 and "no workflow disruption/none/such" in refused.stderr
    rejected = await karpflow(dev_harness, "reject", second.id, "--reason", "not now")
    assert rejected.returncode == 0 and "rejected" in rejected.stdout, rejected.stderr
    assert (await second.result()).phase == "Rejected"
    again = await karpflow(dev_harness, "approve", second.id)
    assert again.returncode == 2, again.stdout

    approved = await karpflow(dev_harness, "approve", first.id, "--reason", "looks right")
    assert approved.returncode == 0 and "approved" in approved.stdout, approved.stderr
    assert (await first.result()).phase == "Succeeded"
