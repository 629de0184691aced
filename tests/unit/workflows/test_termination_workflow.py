"""TerminationWorkflow on the time-skipping server with fake activities."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHistory

from api.workflow_io import TerminationInput
from workflows.termination import TerminationWorkflow


def local_activities(history: WorkflowHistory) -> list[str]:
    """The local activities a history recorded (one marker each), by activity type."""
    return [
        json.loads(e.marker_recorded_event_attributes.details["data"].payloads[0].data)["activity_type"]
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    ]


def a_node(harness) -> str:
    name = harness.id("node").replace("/", "-")
    harness.cluster.nodes.add(name)
    return name


async def terminate(harness, request: TerminationInput | dict):
    node = request.node if isinstance(request, TerminationInput) else request["node"]
    return await harness.client.start_workflow(
        TerminationWorkflow.run, request, id=f"termination/{node}", task_queue=harness.task_queue
    )


async def test_the_steps_run_in_karpenter_order(harness):
    node = a_node(harness)
    status = await (await terminate(harness, TerminationInput(node=node))).result()

    assert status.phase == "Succeeded" and status.pods_evicted == 3
    assert harness.cluster.names() == [
        "begin_termination",
        "termination_gate",
        "taint_for_termination",
        "drain_node",
        "await_volumes_detached",
        "terminate_instance",
        "remove_finalizer",
    ]
    assert harness.cluster.terminated == [f"i-{node}"]


async def test_a_termination_waits_for_the_controls_before_it_taints(harness):
    """The gate says "wait" twice (a NodeDisruptionBudget without room): the workflow sleeps on a
    durable timer, shows what it waits for, asks again, and only then taints and drains."""
    harness.cluster.gate_waits = 2
    node = a_node(harness)
    handle = await terminate(harness, TerminationInput(node=node, reason="Manual"))
    status = await handle.result()

    names = harness.cluster.names()
    assert names[:4] == ["begin_termination", "termination_gate", "termination_gate", "termination_gate"]
    assert names[4:] == [
        "taint_for_termination",
        "drain_node",
        "await_volumes_detached",
        "terminate_instance",
        "remove_finalizer",
    ]
    assert status.phase == "Succeeded" and status.waiting_for == ""
    history = await handle.fetch_history()
    timers = [e for e in history.events if e.HasField("timer_started_event_attributes")]
    assert [t.timer_started_event_attributes.start_to_fire_timeout.seconds for t in timers] == [5, 10]
    phases = [
        e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields[
            "KarpflowPhase"
        ].data
        for e in history.events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
        and "KarpflowPhase"
        in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    ]
    assert b'"Waiting"' in phases


async def test_the_taint_names_the_termination_as_holder_with_its_reason(harness):
    node = a_node(harness)
    handle = await terminate(harness, TerminationInput(node=node, reason="Manual"))
    await handle.result()
    # The taint is a local activity (PATCH_LEAN_HISTORY): its input is not in the history, so the
    # activity's own record of what it was sent is read.
    (taint,) = harness.cluster.termination_taints
    assert taint.holder == f"termination/{node}@{handle.result_run_id}" and taint.reason == "Manual"
    assert "taint_for_termination" in local_activities(await handle.fetch_history())


async def test_a_notready_node_whose_instance_is_gone_only_loses_its_finalizer(harness):
    harness.cluster.node_ready = False
    harness.cluster.instance_found = False
    node = a_node(harness)
    status = await (await terminate(harness, TerminationInput(node=node))).result()

    assert harness.cluster.names() == ["begin_termination", "describe_instance", "remove_finalizer"]
    assert "instance already gone" in status.message


async def test_a_ready_node_is_drained_even_if_ec2_does_not_know_its_instance(harness):
    harness.cluster.instance_found = False  # not trusted while the kubelet says Ready
    node = a_node(harness)
    await (await terminate(harness, TerminationInput(node=node))).result()

    assert "drain_node" in harness.cluster.names()


async def test_volumes_are_not_awaited_once_the_deadline_has_passed(harness):
    node = a_node(harness)
    request = TerminationInput(node=node, termination_grace_period=timedelta(0))
    await (await terminate(harness, request)).result()

    assert "await_volumes_detached" not in harness.cluster.names()
    assert "terminate_instance" in harness.cluster.names()


async def test_an_instance_this_cluster_does_not_own_fails_without_retry(harness):
    harness.cluster.owned = False
    node = a_node(harness)
    handle = await terminate(harness, TerminationInput(node=node))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()

    # The failure quotes its cause, with where it came from: not just "Activity task failed".
    cause = failure.value.cause
    assert cause.type == "TerminationFailed"
    assert cause.message.startswith("TerminatingInstance: activity terminate_instance: NotOwned: ")
    assert "not owned" in cause.message
    assert harness.cluster.names().count("terminate_instance") == 1
    assert "remove_finalizer" not in harness.cluster.names()
    status = await handle.query(TerminationWorkflow.status)
    assert status.phase == "Failed" and status.message == cause.message
    # ... and the node has a FailedTermination Event saying so, on the node it is pinned to
    (event,) = harness.cluster.events
    assert (event.kind, event.name, event.reason) == ("Node", node, "FailedTermination")
    assert event.uid == harness.cluster.uid(node) and event.message == cause.message


async def test_a_node_already_gone_still_has_its_instance_terminated(harness):
    request = TerminationInput(node=harness.id("gone").replace("/", "-"), provider_id="aws:///zone-a/i-gone")
    status = await (await terminate(harness, request)).result()

    assert harness.cluster.names() == ["begin_termination", "terminate_instance"]
    assert status.message == "node already gone; its instance is terminated"


async def test_a_hand_typed_input_is_enough(harness):
    node = a_node(harness)
    status = await (await terminate(harness, {"node": node, "termination_grace_period": "90s"})).result()
    assert status.phase == "Succeeded" and status.deadline is not None


async def test_a_malformed_input_names_the_field(harness):
    handle = await terminate(harness, {"node": harness.id("x"), "termination_grace_period": "a while"})
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert "termination_grace_period" in failure.value.cause.message
    assert harness.cluster.calls == []


async def test_a_start_without_input_fails_the_workflow_at_once(harness):
    handle = await harness.client.start_workflow(
        "TerminationWorkflow", id=harness.id("termination/none"), task_queue=harness.task_queue
    )
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), 10)
    assert "no input given" in failure.value.cause.message
    assert harness.cluster.calls == []


# -- issue 30 item 2: a gate wait does not spend the drain's deadline ---------------------------------


async def test_a_gate_wait_longer_than_the_grace_period_leaves_the_drain_its_grace_period(
    harness, time_skipping_env
):
    """A `kubectl delete node` waits ~3 minutes for its NodeDisruptionBudget with a grace period of
    2: the drain's clock starts when the gate lets it go, so the drain begins with its two minutes
    ahead (before: the deadline was stamped at the deletion and had passed, and the drain would
    have deleted every pod at once, do-not-disrupt and PDBs included)."""
    harness.cluster.clock = time_skipping_env.get_current_time
    harness.cluster.gate_waits = 6  # 5 + 10 + 20 + 40 + 60 + 60 s
    node = a_node(harness)
    deleted = await time_skipping_env.get_current_time()
    request = TerminationInput(node=node, reason="Manual", termination_grace_period=timedelta(minutes=2))
    status = await (await terminate(harness, request)).result()

    ((drain, began),) = harness.cluster.drains
    assert began - deleted >= timedelta(minutes=3)  # the gate did wait longer than the grace period
    assert drain.deadline is not None and drain.deadline > began
    assert drain.deadline - began >= timedelta(minutes=2) - timedelta(seconds=5)
    assert status.deadline == drain.deadline == harness.cluster.deadline_annotations[node]


async def test_a_hard_deadline_is_never_postponed_by_the_gate(harness, time_skipping_env):
    """A deadline given in the input (a spot interruption's time) is when every pod must be gone:
    whatever the gate waited, the drain keeps it."""
    harness.cluster.clock = time_skipping_env.get_current_time
    harness.cluster.gate_waits = 6
    node = a_node(harness)
    hard = await time_skipping_env.get_current_time() + timedelta(minutes=1)
    request = TerminationInput(
        node=node, reason="Manual", termination_grace_period=timedelta(hours=1), deadline=hard
    )
    await (await terminate(harness, request)).result()

    ((drain, _),) = harness.cluster.drains
    assert drain.deadline == hard
