"""Issue 30 items 5 and 6 across processes: a command started outside the controller's passes (by
hand here; the interruption poller's rebalance and an approval given hours later take the same taint)
is held to the controller's pauses, read with the controller's `pauses` query, and to rate budgets,
counted from Temporal visibility, where a rejected approval counts as nothing. Real parts: the
worker (its ServiceAccount and deploy/base's RBAC), its controller, the Temporal dev server and its
visibility, the emulator and moto."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

from api.constants import DISRUPTED_TAINT_KEY
from api.controller_io import UPDATE_PAUSE, UPDATE_RESUME, PauseRequest
from api.karpflow_overrides import MAX_DISRUPTIONS_PER_HOUR
from api.workflow_ids import controller_workflow_id
from api.workflow_io import Approval, ApprovalDecision, DisruptionInput
from tests.integration.controller.test_controller import FAST, TWENTY_PODS, A, B, scenario, status
from workflows.disruption import UPDATE_APPROVE, UPDATE_REJECT, DisruptionWorkflow

pytestmark = pytest.mark.integration

# Nothing for the controller to do: the only commands are the test's.
QUIET = scenario([A, B], TWENTY_PODS, consolidate_after="Never")


def tainted(node: dict[str, Any]) -> bool:
    return any(t["key"] == DISRUPTED_TAINT_KEY for t in node["spec"].get("taints") or ())


async def by_hand(karpflow: Any, node: str, name: str, approval: bool = False) -> Any:
    """A Drifted delete of `node`, started by hand (`temporal workflow start`), pinned to its UID."""
    uid = (await karpflow.nodes())[node]["metadata"]["uid"]
    return await karpflow.client.start_workflow(
        DisruptionWorkflow.run,
        DisruptionInput(
            reason="Drifted",
            nodes=[node],
            node_uids={node: uid},
            approval=Approval() if approval else None,
        ),
        id=f"disruption/{karpflow.stack.cluster_name}/default/Drifted/{name}",
        task_queue=karpflow.task_queue,
    )


async def refusal(handle: Any) -> str:
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = failed.value.cause
    while getattr(cause, "cause", None) is not None:
        cause = cause.cause
    return str(cause)


async def listed(karpflow: Any, handle: Any, phase: str) -> bool:
    query = f"WorkflowId = '{handle.id}' AND KarpflowPhase = '{phase}'"
    return bool([e async for e in karpflow.client.list_workflows(query)])


@pytest.mark.sim_stack(scenario=QUIET)
async def test_a_command_started_by_hand_waits_for_the_controllers_pause(karpflow):
    async with karpflow.worker(**FAST):
        await karpflow.eventually(lambda: _passes(karpflow, 1), within=60, what="a first pass")
        controller = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
        pause = PauseRequest(scope="nodepool", nodepool="default", reason="driver upgrade", by="ops")
        await controller.execute_update(UPDATE_PAUSE, pause)

        why = await refusal(await by_hand(karpflow, A.name, "paused"))
        assert "paused (NodePool default by ops: driver upgrade)" in why, why
        assert not tainted((await karpflow.nodes())[A.name])  # refused before any change

        await controller.execute_update(UPDATE_RESUME, PauseRequest(scope="nodepool", nodepool="default"))
        resumed = await by_hand(karpflow, A.name, "resumed")
        await karpflow.eventually(
            lambda: _tainted(karpflow, A.name), within=60, what="the resumed command's taint"
        )
        await resumed.terminate("the taint was the point")


@pytest.mark.sim_stack(scenario=QUIET)
async def test_a_rate_budget_holds_a_command_started_by_hand_and_a_rejected_approval_counts_as_nothing(
    karpflow,
):
    await karpflow.kube.request(
        "PATCH",
        "/apis/karpenter.sh/v1/nodepools/default",
        body={"metadata": {"annotations": {MAX_DISRUPTIONS_PER_HOUR: "1"}}},
        content_type="application/merge-patch+json",
    )
    async with karpflow.worker():
        waiting = await by_hand(karpflow, A.name, "awaits-approval", approval=True)
        await karpflow.eventually(
            lambda: listed(karpflow, waiting, "AwaitingApproval"), within=30, what="visibility lists it"
        )
        # A running command counts: it may take its node whenever it is approved.
        why = await refusal(await by_hand(karpflow, B.name, "over-the-rate"))
        assert "rate budget for Drifted is used up (1 per 1h: 1 started in the last 1h" in why, why
        assert not tainted((await karpflow.nodes())[B.name])

        await waiting.execute_update(UPDATE_REJECT, ApprovalDecision(by="ops", reason="not now"))
        assert (await waiting.describe()).status == WorkflowExecutionStatus.COMPLETED
        await karpflow.eventually(lambda: listed(karpflow, waiting, "Rejected"), within=30, what="Rejected")
        # Rejected, it took nothing: the hour's one disruption is still there to take.
        within_rate = await by_hand(karpflow, B.name, "within-the-rate")
        await karpflow.eventually(lambda: _tainted(karpflow, B.name), within=60, what="B tainted")
        await within_rate.terminate("the taint was the point")


async def _passes(karpflow: Any, count: int) -> bool:
    try:
        return (await status(karpflow)).passes >= count
    except Exception:
        return False


async def _tainted(karpflow: Any, name: str) -> bool:
    node = (await karpflow.nodes()).get(name)
    return node is not None and tainted(node)


@pytest.mark.sim_stack(scenario=QUIET)
async def test_approving_a_command_of_a_paused_pool_ends_it_with_nothing_taken(karpflow):
    """Issue 31 item 6: approving while the pool was paused went on (only a window was read again)."""
    async with karpflow.worker(**FAST):
        await karpflow.eventually(lambda: _passes(karpflow, 1), within=60, what="a first pass")
        waiting = await by_hand(karpflow, A.name, "approved-while-paused", approval=True)
        await karpflow.eventually(
            lambda: listed(karpflow, waiting, "AwaitingApproval"), within=30, what="it waits for approval"
        )
        controller = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
        pause = PauseRequest(scope="nodepool", nodepool="default", reason="driver upgrade", by="ops")
        await controller.execute_update(UPDATE_PAUSE, pause)
        await waiting.execute_update(UPDATE_APPROVE, ApprovalDecision(by="ops"))
        done = await waiting.result()
        assert done.phase == "Invalidated", done
        assert "approved by ops, but the plan no longer holds" in done.message
        assert "paused (NodePool default by ops: driver upgrade)" in done.message, done.message
        assert not tainted((await karpflow.nodes())[A.name])
