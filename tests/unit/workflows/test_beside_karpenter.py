"""The workflows beside Karpenter (--karpenter-coexistence), on the time-skipping server with fake
activities: a replacement is a NodeClaim followed through Karpenter's conditions, a rollback deletes
the NodeClaims (karpflow launches and terminates no instance), and a termination hands the node to
Karpenter instead of draining it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import CancelledError

from api.workflow_ids import replacement_nodeclaim_name
from api.workflow_io import TerminationInput
from tests.unit.workflows.test_disruption_workflow import command, nodes, start, wait_for_phase
from workflows.disruption import DisruptionWorkflow
from workflows.termination import TerminationWorkflow


@pytest.fixture
def beside_karpenter(harness):
    harness.cluster.karpenter_coexistence = True
    return harness


async def test_a_replacement_is_a_nodeclaim_karpenter_launches(beside_karpenter):
    harness = beside_karpenter
    candidates = nodes(harness, 1)
    handle = await start(harness, command(candidates))
    status = await handle.result()

    assert status.phase == "Succeeded"
    (replacement,) = status.replacements
    assert replacement.state == "Initialized"
    assert replacement.nodeclaim == replacement_nodeclaim_name("default", status.command_id, 0)
    assert replacement.node == f"node-{replacement.nodeclaim}"
    assert replacement.offering.key == "m5.large/zone-a/on-demand"
    calls = harness.cluster.names()
    assert "launch_instance" not in calls and "await_node_registered" not in calls
    waits = [arg for name, arg in harness.cluster.calls if name == "await_nodeclaim"]
    # One wait until Initialized (disruption-nodeclaim-one-wait), not one per condition.
    assert waits == [f"{replacement.nodeclaim}:Initialized"]
    assert calls.index("create_nodeclaim") > calls.index("taint_disrupted")
    assert calls.index("begin_termination") > calls.index("await_nodeclaim")
    # the candidate's termination was handed to Karpenter: no drain, the instance only checked
    assert "drain_node" not in calls and "await_karpenter_termination" in calls


async def test_a_nodeclaim_karpenter_gives_up_on_rolls_back_by_deleting_it(beside_karpenter):
    harness = beside_karpenter
    harness.cluster.karpenter_gives_up = True
    candidates = nodes(harness, 1)
    handle = await start(harness, command(candidates))
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    status = await handle.query(DisruptionWorkflow.status)
    assert status.phase == "RolledBack"
    assert "was deleted before it was Initialized" in status.message
    assert "deleted 1 replacement NodeClaim(s) (Karpenter terminates their instances)" in status.message
    assert harness.cluster.deleted_nodeclaims == [status.replacements[0].nodeclaim]
    calls = harness.cluster.names()
    assert "terminate_instance" not in calls and "find_command_instances" not in calls
    assert "untaint_disrupted" in calls


async def test_a_replacement_that_never_initializes_is_deleted_at_its_deadline(beside_karpenter):
    harness = beside_karpenter
    harness.cluster.karpenter_never_initializes = True
    candidates = nodes(harness, 1)
    cmd = command(candidates)
    cmd.timeouts.replacement_ready = timedelta(seconds=3)  # real seconds: an activity runs meanwhile
    handle = await start(harness, cmd)
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    status = await handle.query(DisruptionWorkflow.status)
    assert status.phase == "RolledBack"
    (replacement,) = status.replacements
    assert replacement.state == "Discarded"
    assert f"NodeClaim {replacement.nodeclaim}" in status.message
    assert "Initialized=Unknown" in status.message  # what Karpenter said it still waited for
    assert harness.cluster.deleted_nodeclaims == [replacement.nodeclaim]


async def test_a_cancel_while_karpenter_launches_deletes_the_nodeclaim(beside_karpenter):
    harness = beside_karpenter
    harness.cluster.karpenter_never_initializes = True
    candidates = nodes(harness, 1)
    handle = await start(harness, command(candidates))
    await wait_for_phase(handle, "WaitingForReplacements")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    status = await handle.query(DisruptionWorkflow.status)
    assert status.phase == "Canceled"
    (replacement,) = status.replacements
    assert harness.cluster.deleted_nodeclaims == [replacement.nodeclaim]
    assert ("untaint_disrupted", candidates) in harness.cluster.calls
    assert "terminate_instance" not in harness.cluster.names()
    assert "begin_termination" not in harness.cluster.names()


async def test_a_termination_hands_the_node_to_karpenter(beside_karpenter):
    harness = beside_karpenter
    (name,) = nodes(harness, 1)
    status = await harness.client.execute_workflow(
        TerminationWorkflow.run,
        TerminationInput(node=name),
        id=harness.id("termination"),
        task_queue=harness.task_queue,
    )
    assert status.phase == "Succeeded"
    assert status.message.startswith("handed to Karpenter: Karpenter drained and terminated")
    calls = harness.cluster.names()
    assert calls == [
        "begin_termination",
        "await_karpenter_termination",
        "terminate_instance",  # a no-op once Karpenter terminated it; ends it when Karpenter did not
    ]
    assert ("await_karpenter_termination", f"claim-{name}") in harness.cluster.calls
