"""DisruptionWorkflow on the time-skipping server with fake activities: order, compensation, cancel."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.worker import Worker

from api.workflow_io import DisruptionInput, DisruptionStatus, ReplacementSpec
from tests.unit.workflows.conftest import Harness
from tests.unit.workflows.fakes import FakeCluster
from worker import WORKFLOWS
from workflows.disruption import DisruptionWorkflow


def command(nodes: list[str], *, replacements: int = 1, **spec: object) -> DisruptionInput:
    specs = [
        ReplacementSpec(
            nodepool="default", instance_types=["m5.large", "m5.xlarge"], zones=["zone-a"], **spec
        )
        for _ in range(replacements)
    ]
    return DisruptionInput(reason="Underutilized", nodes=nodes, replacements=specs)


def nodes(harness, count: int) -> list[str]:
    names = [harness.id("node").replace("/", "-") for _ in range(count)]
    harness.cluster.nodes.update(names)
    return names


async def start(harness, cmd: DisruptionInput) -> WorkflowHandle:
    return await harness.client.start_workflow(
        DisruptionWorkflow.run,
        cmd,
        id=harness.id("disruption/default/Underutilized"),
        task_queue=harness.task_queue,
    )


async def wait_for_phase(handle: WorkflowHandle, phase: str) -> DisruptionStatus:
    for _ in range(200):
        status = await handle.query(DisruptionWorkflow.status)
        if status.phase == phase:
            return status
        await asyncio.sleep(0.02)
    raise AssertionError(f"never reached {phase}: {status}")


async def test_replace_runs_the_runbook_in_order(harness):
    candidates = nodes(harness, 2)
    handle = await start(harness, command(candidates))
    status = await handle.result()

    assert status.phase == "Succeeded"
    assert [r.state for r in status.replacements] == ["Initialized"]
    assert status.replacements[0].offering.key == "m5.large/zone-a/on-demand"
    assert [c.termination for c in status.candidates] == ["Succeeded", "Succeeded"]
    calls = harness.cluster.names()
    order = [
        "taint_disrupted",
        "resolve_replacement",
        "launch_instance",
        "await_node_registered",
        "await_node_initialized",
        "begin_termination",
    ]
    assert [calls.index(name) for name in order] == sorted(calls.index(name) for name in order)
    # each candidate's instance is terminated by its TerminationWorkflow, the replacement is not
    assert sorted(harness.cluster.terminated) == sorted(f"i-{n}" for n in candidates)
    assert "untaint_disrupted" not in calls


async def test_capacity_error_on_the_first_offering_uses_the_second(harness):
    harness.cluster.ice.add("m5.large/zone-a/on-demand")
    handle = await start(harness, command(nodes(harness, 1)))
    status = await handle.result()

    assert status.replacements[0].offering.key == "m5.xlarge/zone-a/on-demand"
    assert [u.offering for u in status.unavailable_offerings] == ["m5.large/zone-a/on-demand"]
    launches = [arg for name, arg in harness.cluster.calls if name == "launch_instance"]
    assert launches == ["m5.large/zone-a/on-demand", "m5.xlarge/zone-a/on-demand"]


async def test_an_offering_out_of_capacity_is_not_retried_by_the_next_replacement(harness):
    harness.cluster.ice.add("m5.large/zone-a/on-demand")
    handle = await start(harness, command(nodes(harness, 2), replacements=2))
    status = await handle.result()

    launches = [arg for name, arg in harness.cluster.calls if name == "launch_instance"]
    # the two replacements launch in parallel, so both may try m5.large once; never more
    assert launches.count("m5.large/zone-a/on-demand") <= 2
    assert [r.offering.key for r in status.replacements] == ["m5.xlarge/zone-a/on-demand"] * 2


async def test_no_offering_with_capacity_rolls_back(harness):
    harness.cluster.ice.update({"m5.large/zone-a/on-demand", "m5.xlarge/zone-a/on-demand"})
    candidates = nodes(harness, 2)
    handle = await start(harness, command(candidates))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()

    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "DisruptionFailed"
    assert (
        "replacement 0" in cause.message
        and "m5.xlarge/zone-a/on-demand: InsufficientInstanceCapacity" in cause.message
    )
    assert ("untaint_disrupted", candidates) in harness.cluster.calls
    assert "begin_termination" not in harness.cluster.names()
    assert (await handle.query(DisruptionWorkflow.status)).phase == "RolledBack"


async def test_a_rollback_counts_only_the_candidates_it_had_tainted(harness):
    """The untaint activity names every node it leaves without this command's taint, a node it never
    tainted too (the do-not-disrupt one here): the rollback must not claim to have untainted it."""
    candidates = nodes(harness, 2)
    harness.cluster.do_not_disrupt.add(candidates[1])
    handle = await start(harness, command(candidates))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()

    message = failure.value.cause.message
    assert "could not taint candidate(s)" in message and "do-not-disrupt" in message
    assert "untainted 1 candidate(s)" in message, message
    assert ("untaint_disrupted", candidates) in harness.cluster.calls  # both asked, to be sure


async def test_a_replacement_that_never_initializes_is_terminated_and_candidates_untainted(harness):
    harness.cluster.never_initializes = True
    candidates = nodes(harness, 2)
    # The test server does not skip time while an activity runs: a short timeout keeps this fast.
    cmd = command(candidates)
    cmd.timeouts.replacement_ready = timedelta(seconds=1)
    handle = await start(harness, cmd)
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()

    message = failure.value.cause.message
    assert "replacement 0" in message and "failed while Registered" in message
    assert "did not initialize within 0:00:01" in message
    assert "untainted 2 candidate(s), terminated 1 replacement instance(s)" in message
    launched = [arg for name, arg in harness.cluster.calls if name == "await_node_registered"]
    assert harness.cluster.terminated == launched  # the replacement, and nothing else
    assert ("release_node", launched[0]) in harness.cluster.calls
    status = await handle.query(DisruptionWorkflow.status)
    assert status.replacements[0].state == "Discarded"
    assert not any(c.tainted for c in status.candidates)


async def test_a_candidate_that_cannot_be_tainted_aborts_a_replacement_command(harness):
    candidates = [*nodes(harness, 1), "missing-node"]
    handle = await start(harness, command(candidates))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()

    assert "missing-node (node not found)" in failure.value.cause.message
    assert "launch_instance" not in harness.cluster.names()
    assert ("untaint_disrupted", candidates) in harness.cluster.calls


async def test_a_delete_command_goes_on_with_the_candidates_it_could_taint(harness):
    present = nodes(harness, 1)
    handle = await start(harness, command([*present, "missing-node"], replacements=0))
    status = await handle.result()

    assert [(c.node, c.termination) for c in status.candidates] == [
        (present[0], "Succeeded"),
        ("missing-node", "NotStarted"),
    ]
    assert harness.cluster.terminated == [f"i-{present[0]}"]


async def test_cancel_while_waiting_for_a_replacement_compensates(harness):
    harness.cluster.never_registers = True
    candidates = nodes(harness, 2)
    handle = await start(harness, command(candidates))
    await wait_for_phase(handle, "WaitingForReplacements")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()

    assert isinstance(failure.value.cause, CancelledError)
    assert ("untaint_disrupted", candidates) in harness.cluster.calls
    assert len(harness.cluster.terminated) == 1 and harness.cluster.terminated[0].startswith("i-new")
    status = await handle.query(DisruptionWorkflow.status)
    assert status.phase == "Canceled"
    assert "canceled; rolled back" in status.message
    assert "begin_termination" not in harness.cluster.names()


async def test_a_cancel_during_a_taint_call_that_completes_is_not_lost(harness):
    harness.cluster.taint_seconds = 0.5
    candidates = nodes(harness, 1)
    handle = await start(harness, command(candidates))
    await wait_for_phase(handle, "Tainting")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()

    assert isinstance(failure.value.cause, CancelledError)
    assert "launch_instance" not in harness.cluster.names()
    assert ("untaint_disrupted", candidates) in harness.cluster.calls


async def test_cancel_after_the_terminations_started_lets_them_finish(harness):
    harness.cluster.drain_blocks = True
    candidates = nodes(harness, 1)
    handle = await start(harness, command(candidates))
    await wait_for_phase(handle, "Terminating")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()

    status = await handle.query(DisruptionWorkflow.status)
    assert status.phase == "Canceled" and "go on" in status.message, status
    assert "untaint_disrupted" not in harness.cluster.names()
    child = harness.client.get_workflow_handle(f"termination/fake/{candidates[0]}/uid-{candidates[0]}")
    assert (await child.describe()).status.name == "RUNNING"
    await child.terminate("test over")


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"reason": "Bored", "nodes": ["a"]}, "reason"),
        ({"reason": "Drifted", "nodes": []}, "nodes"),
        ({"reason": "Drifted", "nodes": ["a"], "replacements": [{"nodepool": "default"}]}, "replacements.0"),
        (
            {"reason": "Drifted", "nodes": ["a"], "timeouts": {"replacement_ready": "soon"}},
            "timeouts.replacement_ready",
        ),
        ({"reason": "Drifted", "nodes": ["a"], "colour": "blue"}, "colour"),
        (["not", "an", "object"], "JSON object"),
        # a zero or negative timeout would fail workflow tasks forever, not the workflow
        ({"reason": "Drifted", "nodes": ["a"], "timeouts": {"heartbeat": "0s"}}, "timeouts.heartbeat"),
        ({"reason": "Drifted", "nodes": ["a"], "termination": {"drain_attempt": "-5m"}}, "drain_attempt"),
        (None, "no input given"),
    ],
)
async def test_a_malformed_input_fails_at_once_naming_the_field(harness, raw, field):
    args = [] if raw is None else [raw]  # None: started with no input at all
    handle = await harness.client.start_workflow(
        "DisruptionWorkflow", args=args, id=harness.id("disruption/bad"), task_queue=harness.task_queue
    )
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), 10)

    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput" and cause.non_retryable
    assert field in cause.message
    assert harness.cluster.calls == []


async def test_a_run_reusing_a_closed_workflow_id_leaves_the_earlier_runs_replacement_alone(harness):
    workflow_id = harness.id("disruption/default/Drifted")
    first = await harness.client.start_workflow(
        DisruptionWorkflow.run, command(nodes(harness, 1)), id=workflow_id, task_queue=harness.task_queue
    )
    kept = (await first.result()).replacements[0].instance_id

    harness.cluster.never_initializes = True
    cmd = command(nodes(harness, 1))
    cmd.timeouts.replacement_ready = timedelta(seconds=1)
    second = await harness.client.start_workflow(
        DisruptionWorkflow.run, cmd, id=workflow_id, task_queue=harness.task_queue
    )
    with pytest.raises(WorkflowFailureError):
        await second.result()

    launched = (await second.query(DisruptionWorkflow.status)).replacements[0].instance_id
    assert launched != kept  # a new launch, not the first run's instance adopted
    assert launched in harness.cluster.terminated and kept not in harness.cluster.terminated
    assert kept in harness.cluster.instances


async def test_rollback_terminates_a_launch_that_ec2_does_not_list_yet(harness):
    harness.cluster.never_initializes = True
    harness.cluster.listing_lags = True
    cmd = command(nodes(harness, 1))
    cmd.timeouts.replacement_ready = timedelta(seconds=1)
    handle = await start(harness, cmd)
    with pytest.raises(WorkflowFailureError):
        await handle.result()

    status = await handle.query(DisruptionWorkflow.status)
    assert harness.cluster.terminated == [status.replacements[0].instance_id]
    assert status.replacements[0].state == "Discarded"


async def test_when_one_replacement_fails_the_other_stops_before_registering(harness):
    harness.cluster.fail_launch_of = {1}
    harness.cluster.launch_seconds = {0: 0.5}  # still launching when its sibling fails
    handle = await start(harness, command(nodes(harness, 2), replacements=2))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()

    assert "replacement 1" in failure.value.cause.message
    status = await handle.query(DisruptionWorkflow.status)
    assert status.replacements[0].state == "Discarded"
    assert harness.cluster.terminated == [status.replacements[0].instance_id]
    assert "await_node_registered" not in harness.cluster.names()


async def test_a_cancel_during_the_rollback_does_not_cut_it_short(harness):
    # The cancel lands while the rollback terminates the replacement (a regular activity: the untaint
    # before it is a local activity, run to the end inside one workflow task, which a cancel does not
    # interrupt; disruption-lean-history).
    harness.cluster.never_initializes = True
    harness.cluster.terminate_seconds = 0.5
    candidates = nodes(harness, 2)
    cmd = command(candidates)
    cmd.timeouts.replacement_ready = timedelta(seconds=1)
    handle = await start(harness, cmd)
    await wait_for_phase(handle, "RollingBack")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()

    status = await handle.query(DisruptionWorkflow.status)
    instance = status.replacements[0].instance_id
    terminates = [args for name, args in harness.cluster.calls if name == "terminate_instance"]
    assert terminates == [instance, instance]  # interrupted once, then run to the end
    untaints = [args for name, args in harness.cluster.calls if name == "untaint_disrupted"]
    assert untaints == [candidates]
    assert set(harness.cluster.terminated) == {instance} and status.replacements[0].state == "Discarded"
    assert ("release_node", instance) in harness.cluster.calls
    assert "compensation problems" not in status.message


# -- forceful commands (expiration, repair, interruption, NodePool deletion) ------------------------


def forceful(nodes: list[str], reason: str = "Expired", **fields: object) -> DisruptionInput:
    spec = ReplacementSpec(nodepool="default", instance_types=["m5.large"], zones=["zone-a"])
    return DisruptionInput(reason=reason, nodes=nodes, replacements=[spec], **fields)


async def test_a_forceful_command_terminates_its_candidates_even_when_the_replacement_fails(harness):
    harness.cluster.ice.add("m5.large/zone-a/on-demand")
    candidates = nodes(harness, 1)
    handle = await start(harness, forceful(candidates))
    status = await handle.result()

    assert status.phase == "Succeeded" and status.forceful
    assert [c.termination for c in status.candidates] == ["Succeeded"]
    assert "without replacements" in status.message and "InsufficientInstanceCapacity" in status.message
    assert "untaint_disrupted" not in harness.cluster.names()
    assert harness.cluster.terminated == [f"i-{candidates[0]}"]


async def test_a_forceful_command_drains_after_its_replacement_is_ready(harness):
    candidates = nodes(harness, 1)
    status = await (await start(harness, forceful(candidates, reason="Unhealthy"))).result()

    calls = harness.cluster.names()
    assert [r.state for r in status.replacements] == ["Initialized"]
    assert calls.index("await_node_initialized") < calls.index("begin_termination")


async def test_a_forceful_command_that_never_gets_its_replacement_drains_at_the_replacement_deadline(harness):
    harness.cluster.never_initializes = True
    candidates = nodes(harness, 1)
    cmd = forceful(candidates)
    cmd.timeouts.replacement_ready = timedelta(seconds=1)
    status = await (await start(harness, cmd)).result()

    assert [c.termination for c in status.candidates] == ["Succeeded"]
    assert [r.state for r in status.replacements] == ["Discarded"]
    assert "did not initialize" in status.message


async def test_a_termination_deadline_drains_at_once_and_reaches_the_termination(harness):
    harness.cluster.launch_seconds[0] = 0.5
    candidates = nodes(harness, 1)
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    status = await (
        await start(harness, forceful(candidates, reason="Interrupted", termination_deadline=deadline))
    ).result()

    calls = harness.cluster.names()
    assert calls.index("begin_termination") < calls.index("await_node_registered")
    assert harness.cluster.termination_deadlines[candidates[0]] == deadline
    assert [r.state for r in status.replacements] == ["Initialized"]


async def test_a_termination_that_fails_under_a_deadline_discards_the_replacement_still_on_its_way(harness):
    """Issue 30: with a spot deadline the candidates drain while the replacement launches. When their
    termination fails (here: the candidate's instance is refused as not owned) before the replacement
    is ready, the replacement is not abandoned: its wait runs to its deadline (the drained pods need
    the capacity: `forceful-replacements-outlive-failed-terminations`), and one that never comes up is
    terminated then, not left running with no command to own it."""
    harness.cluster.never_registers = True
    candidates = nodes(harness, 1)
    harness.cluster.refused_terminations.add(f"i-{candidates[0]}")
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    cmd = forceful(candidates, reason="Interrupted", termination_deadline=deadline)
    # The termination fails within a second or two; the wait goes on to this deadline (real seconds:
    # the waiting activity heartbeats, so the test server cannot skip the time).
    cmd.timeouts.replacement_ready = timedelta(seconds=8)
    handle = await start(harness, cmd)
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "TerminationFailed"
    status = await handle.query(DisruptionWorkflow.status)
    launched = status.replacements[0].instance_id
    assert launched is not None
    assert launched in harness.cluster.terminated and launched not in harness.cluster.instances
    assert ("release_node", launched) in harness.cluster.calls
    assert [r.state for r in status.replacements] == ["Discarded"]
    assert "termination failed for" in status.message


def test_a_termination_deadline_is_refused_for_a_voluntary_reason():
    with pytest.raises(ValueError, match="termination_deadline is for forceful reasons"):
        DisruptionInput(
            reason="Drifted", nodes=["a"], termination_deadline=datetime.now(UTC) + timedelta(minutes=1)
        )


async def test_an_unexpected_error_on_every_attempt_rolls_back_within_bounds(harness, monkeypatch):
    """A bug in an activity is retried a bounded number of times, then the command rolls back and
    fails with the activity's own message, its candidates untainted."""
    from workflows import options
    from workflows.options import API_ATTEMPTS

    # The attempts are what is under test, not the backoff: the real one (1 s doubling to 10 s)
    # would sleep ~65 s in the worker, where the time-skipping server cannot skip it. The sandbox
    # imports the workflow again for each run, so it reads the patched policy.
    monkeypatch.setattr(
        options,
        "API_RETRY",
        dataclasses.replace(
            options.API_RETRY,
            initial_interval=timedelta(milliseconds=10),
            maximum_interval=timedelta(milliseconds=50),
        ),
    )
    harness.cluster.resolve_bug = True
    candidates = nodes(harness, 1)
    handle = await start(harness, command(candidates))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    status = await handle.query(DisruptionWorkflow.status)
    assert status.phase == "RolledBack" or status.phase == "Failed"
    assert harness.cluster.names().count("resolve_replacement") == API_ATTEMPTS
    assert ("untaint_disrupted", candidates) in [
        (n, a) for n, a in harness.cluster.calls if n == "untaint_disrupted"
    ]
    text = str(failure.value.cause) + str(getattr(failure.value.cause, "cause", ""))
    assert "amiSelectorTerms" in text, text


async def test_a_disruption_evicted_from_the_cache_is_not_a_failed_replacement(ts_client, monkeypatch):
    """A worker that stops evicts its workflows: the SDK closes their coroutines (GeneratorExit). The
    replacement's `except BaseException` used to turn that into ReplacementFailed, which Python then
    reported as "Exception ignored" (seen in every full run) and the rollback tried to run."""
    ignored: list[str] = []
    monkeypatch.setattr(
        sys, "unraisablehook", lambda u: ignored.append(f"{u.exc_type.__name__}: {u.exc_value}")
    )
    cluster = FakeCluster()
    cluster.never_registers = True
    task_queue = f"unit-{uuid.uuid4().hex[:8]}"
    harness = Harness(ts_client, cluster, task_queue)
    candidates = nodes(harness, 1)
    async with Worker(
        ts_client, task_queue=task_queue, workflows=list(WORKFLOWS), activities=cluster.activities()
    ):
        handle = await start(harness, command(candidates))
        await wait_for_phase(handle, "WaitingForReplacements")
    gc.collect()
    await handle.terminate("test over")

    assert not [line for line in ignored if "Replacement" in line or "GeneratorExit" in line], ignored
    assert "terminate_instance" not in cluster.names()  # no rollback ran for an eviction


# -- issue 30: a forceful replacement whose instance ends is launched again --------------------------


def expired(nodes: list[str], instance_types: list[str], **fields: object) -> DisruptionInput:
    spec = ReplacementSpec(nodepool="default", instance_types=instance_types, zones=["zone-a"])
    return DisruptionInput(reason="Expired", nodes=nodes, replacements=[spec], **fields)


def launched_ids(harness) -> list[str]:
    return [r.instance.instance_id for r in harness.cluster.requests.get("await_node_registered", [])]


async def test_a_forceful_replacement_whose_instance_ends_is_launched_again_with_another_offering(harness):
    """Seed 4242 of the chaos run: the spot node's replacement ended while it booted, the node was
    drained anyway, and nothing provided for its pods. Now the ended instance is terminated, its
    offering remembered as unavailable, and the next offering launched and waited for."""
    harness.cluster.ends_before_registering.add("m5.large/zone-a/on-demand")
    candidates = nodes(harness, 1)
    status = await (await start(harness, expired(candidates, ["m5.large", "m5.xlarge"]))).result()

    assert status.phase == "Succeeded"
    [replacement] = status.replacements
    assert replacement.state == "Initialized" and replacement.offering.key == "m5.xlarge/zone-a/on-demand"
    first, second = launched_ids(harness)
    assert replacement.instance_id == second
    assert first in harness.cluster.terminated and ("release_node", first) in harness.cluster.calls
    assert [u.offering for u in status.unavailable_offerings] == ["m5.large/zone-a/on-demand"]
    assert "replacement instance failed" in status.unavailable_offerings[0].error
    assert "launched again after failed launches" in status.message and first in status.message
    assert "without replacements" not in status.message
    assert f"replaced by node-{second}" in status.message
    calls = harness.cluster.names()
    assert calls.index("terminate_instance") < len(calls) - 1 - calls[::-1].index("launch_instance")
    relaunch = harness.cluster.requests["launch_instance"][-1]
    assert relaunch.attempt == 1 and harness.cluster.requests["launch_instance"][0].attempt == 0
    # The drain came after the relaunched replacement was ready, and nothing launched is left over.
    assert calls.index("begin_termination") > len(calls) - 1 - calls[::-1].index("await_node_initialized")
    assert set(harness.cluster.instances) == {second}


async def test_relaunches_are_bounded_and_every_failed_launch_is_terminated(harness):
    types = ["m5.large", "m5.xlarge", "c5.large", "c5.xlarge", "r5.large"]
    harness.cluster.ends_before_registering.update(f"{t}/zone-a/on-demand" for t in types)
    candidates = nodes(harness, 1)
    status = await (await start(harness, expired(candidates, types))).result()

    launches = launched_ids(harness)
    assert len(launches) == 3  # MAX_LAUNCHES, though two offerings were left
    assert sorted(harness.cluster.terminated) == sorted([*launches, f"i-{candidates[0]}"])
    assert not harness.cluster.instances  # no replacement leaked
    assert [c.termination for c in status.candidates] == ["Succeeded"]
    assert "without replacements" in status.message and "after 2 earlier launch(es) failed" in status.message
    assert all(i in status.message for i in launches)


async def test_a_relaunch_that_finds_no_offering_left_says_so(harness):
    harness.cluster.ends_before_registering.add("m5.large/zone-a/on-demand")
    harness.cluster.ice.add("m5.xlarge/zone-a/on-demand")
    candidates = nodes(harness, 1)
    status = await (await start(harness, expired(candidates, ["m5.large", "m5.xlarge"]))).result()

    [first] = launched_ids(harness)
    assert harness.cluster.terminated == [first, f"i-{candidates[0]}"]
    assert "without replacements" in status.message and "no offering could be launched" in status.message
    assert "m5.large/zone-a/on-demand: skipped, replacement instance failed" in status.message
    assert status.replacements[0].state == "Failed"


async def test_a_voluntary_replacement_whose_instance_ends_still_rolls_back(harness):
    harness.cluster.ends_before_registering.add("m5.large/zone-a/on-demand")
    candidates = nodes(harness, 1)
    handle = await start(harness, command(candidates))
    with pytest.raises(WorkflowFailureError):
        await handle.result()

    assert len(launched_ids(harness)) == 1
    assert ("untaint_disrupted", candidates) in harness.cluster.calls


async def test_a_spot_deadline_command_relaunches_while_its_candidates_drain(harness):
    harness.cluster.ends_before_registering.add("m5.large/zone-a/on-demand")
    candidates = nodes(harness, 1)
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    cmd = expired(candidates, ["m5.large", "m5.xlarge"], termination_deadline=deadline)
    cmd.reason = "Interrupted"
    status = await (await start(harness, cmd)).result()

    assert [r.state for r in status.replacements] == ["Initialized"]
    assert status.replacements[0].offering.key == "m5.xlarge/zone-a/on-demand"
    assert [c.termination for c in status.candidates] == ["Succeeded"]


async def test_a_wait_outlasts_more_passing_errors_than_an_api_call_may(harness, monkeypatch):
    """Seed 4242 again: an interruption's replacement wait failed for good after ten 500s on its GETs,
    minutes before its deadline. A wait is bounded by its deadline, not by attempts."""
    from temporalio.common import RetryPolicy

    from workflows import disruption_replacements, options
    from workflows.options import API_ATTEMPTS

    # The same policy (no attempt bound) with short intervals: twelve retries of real time, not 90 s.
    quick = RetryPolicy(
        initial_interval=timedelta(milliseconds=50),
        maximum_interval=timedelta(milliseconds=100),
        maximum_attempts=options.WAIT_RETRY.maximum_attempts,
        non_retryable_error_types=options.WAIT_RETRY.non_retryable_error_types,
    )
    monkeypatch.setattr(options, "WAIT_RETRY", quick)
    monkeypatch.setattr(disruption_replacements, "WAIT_RETRY", quick)
    harness.cluster.wait_errors = API_ATTEMPTS + 2
    status = await (await start(harness, expired(nodes(harness, 1), ["m5.large"]))).result()

    assert [r.state for r in status.replacements] == ["Initialized"]
    assert ("await_node_ready", "ServerError") in harness.cluster.calls and harness.cluster.wait_errors == 0


async def test_a_spot_candidate_whose_termination_fails_still_gets_its_replacement(harness):
    """The chaos run's ownership fault on a spot node: karpflow refuses to terminate the instance, the
    termination fails after the drain began, and the command fails; the replacement launched beside
    the drain used to be cancelled (and left running, unwaited). The drained pods need it: it goes on."""
    candidates = nodes(harness, 1)
    harness.cluster.not_owned.add(f"i-{candidates[0]}")
    harness.cluster.register_seconds = 1.0  # still registering when the termination fails
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    handle = await start(harness, forceful(candidates, reason="Interrupted", termination_deadline=deadline))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()

    assert "NotOwned" in failure.value.cause.message
    status = await handle.query(DisruptionWorkflow.status)
    assert [r.state for r in status.replacements] == ["Initialized"]
    assert [c.termination for c in status.candidates] == ["Failed"]
    calls = harness.cluster.names()
    assert calls.index("terminate_instance") < calls.index("await_node_initialized")


async def test_a_spot_replacement_lost_before_the_drain_ends_is_launched_again(harness):
    """Chaos seed 1: the batch node's spot replacement initialized, then EC2 reclaimed it while the
    candidate's evictions were still denied; the pods, evicted later, found no batch node. Once the
    terminations are done the replacement is looked at again, and one gone is launched again."""
    harness.cluster.lose_initialized_replacements = True
    candidates = nodes(harness, 1)
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    cmd = expired(candidates, ["m5.large", "m5.xlarge"], termination_deadline=deadline)
    cmd.reason = "Interrupted"
    status = await (await start(harness, cmd)).result()

    [replacement] = status.replacements
    assert replacement.state == "Initialized" and replacement.offering.key == "m5.xlarge/zone-a/on-demand"
    first, second = launched_ids(harness)
    assert first in harness.cluster.terminated and set(harness.cluster.instances) == {second}
    calls = harness.cluster.names()
    assert calls.index("begin_termination") < calls.index("look_again")
    assert "launched again after failed launches" in status.message and first in status.message


async def test_a_spot_replacement_still_there_after_the_drain_is_kept(harness):
    candidates = nodes(harness, 1)
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    cmd = expired(candidates, ["m5.large", "m5.xlarge"], termination_deadline=deadline)
    cmd.reason = "Interrupted"
    status = await (await start(harness, cmd)).result()

    assert [r.offering.key for r in status.replacements] == ["m5.large/zone-a/on-demand"]
    assert (
        len(launched_ids(harness)) == 1
        and ("look_again", status.replacements[0].node) in harness.cluster.calls
    )


async def test_beside_karpenter_a_lost_spot_replacement_is_left_to_its_provisioner(harness):
    """The chaos run beside Karpenter: the look again found the NodeClaim's node gone and launched an
    EC2 instance of karpflow's own, which Karpenter garbage-collected. Beside Karpenter karpflow
    launches no instance: a NodeClaim replacement is not looked at again."""
    harness.cluster.karpenter_coexistence = True
    harness.cluster.lose_initialized_replacements = True
    candidates = nodes(harness, 1)
    deadline = datetime.now(UTC) + timedelta(minutes=2)
    cmd = expired(candidates, ["m5.large", "m5.xlarge"], termination_deadline=deadline)
    cmd.reason = "Interrupted"
    status = await (await start(harness, cmd)).result()

    assert [r.state for r in status.replacements] == ["Initialized"] and status.replacements[0].nodeclaim
    calls = harness.cluster.names()
    assert "launch_instance" not in calls and "look_again" not in calls
    # The candidate's only (Karpenter ends it with its NodeClaim; karpflow's check after is a no-op).
    assert set(harness.cluster.terminated) == {f"i-{candidates[0]}"}
