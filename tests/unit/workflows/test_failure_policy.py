"""Which failures end a run, and which only fail its workflow task until better code is deployed
(issue 30 item 1; docs/workflow-changes.md, "When a workflow fails").

A failed child fails its parent, which says where and why; a bug in a disruption's, termination's or
rollout's code fails the run visibly after its compensation; two `--input` values fail at once; a
NondeterminismError (a bad deploy, the sandbox's refusals included) keeps its task retrying and is
never compensated or turned into a failure, so the run goes on when code that matches its history
is deployed.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, ChildWorkflowError

from api import node_reasons
from api.controller_io import UPDATE_PAUSE, ControllerInput, ControllerStatus
from api.rollout_io import RolloutInput
from api.workflow_ids import controller_workflow_id
from api.workflow_io import DisruptionInput, ReplacementSpec, TerminationInput
from runtime.controller_start import ensure_controller
from runtime.settings import WorkerSettings
from tests.unit.workflows.conftest import Harness
from tests.unit.workflows.controller_fakes import (  # noqa: F401 - the fixture
    ControllerHarness,
    controller_harness_fixture,
)
from workflows import workflow_metrics
from workflows.disruption import DisruptionWorkflow
from workflows.failures import describe, where
from workflows.termination import TerminationWorkflow

WEBHOOK_400 = (
    "eviction of pod default/web-1: Kubernetes API 400: admission webhook "
    '"deny-evictions.example.com" denied the request'
)


def a_node(harness: Harness) -> str:
    name = harness.id("node").replace("/", "-")
    harness.cluster.nodes.add(name)
    return name


async def task_failures(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The messages of the workflow task failures in the history (a bug, a nondeterminism)."""
    history = await handle.fetch_history()
    return [
        e.workflow_task_failed_event_attributes.failure.message
        for e in history.events
        if e.HasField("workflow_task_failed_event_attributes")
    ]


async def closed(handle: WorkflowHandle[Any, Any], within: float = 20) -> Any:
    """The run's result (or its failure, raised), failing at once when a workflow task fails instead."""
    result = asyncio.ensure_future(handle.result())  # awaiting it lets the test server skip time
    try:
        for _ in range(int(within / 0.1)):
            if result.done():
                return result.result()
            if failures := await task_failures(handle):
                raise AssertionError(f"a workflow task failed: {failures[0]}")
            await asyncio.sleep(0.1)
        raise AssertionError(f"still running after {within} s")
    finally:
        result.cancel()


async def start_disruption(harness: Harness, command: DisruptionInput) -> WorkflowHandle[Any, Any]:
    return await harness.client.start_workflow(
        DisruptionWorkflow.run,
        command,
        id=harness.id("disruption/default/Underutilized"),
        task_queue=harness.task_queue,
    )


# -- a failed child ---------------------------------------------------------------------------------


async def test_a_failed_termination_fails_its_disruption_instead_of_wedging_it(harness: Harness) -> None:
    """Every eviction denied by an admission webhook: the TerminationWorkflow fails, and its
    DisruptionWorkflow fails with it, saying which child failed and why; its status query answers,
    and it no longer holds its nodes in flight (a closed run is not in flight)."""
    node = a_node(harness)
    harness.cluster.faults.refuse("TerminationWorkflow", "drain_node", WEBHOOK_400)
    handle = await start_disruption(harness, DisruptionInput(reason="Underutilized", nodes=[node]))

    with pytest.raises(WorkflowFailureError) as failure:
        await closed(handle)

    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "TerminationFailed"
    assert f"TerminationWorkflow termination/fake/{node}/uid-{node}" in cause.message
    assert "admission webhook" in cause.message
    status = await handle.query(DisruptionWorkflow.status)
    assert status.phase == "Failed"
    assert [c.termination for c in status.candidates] == ["Failed"]
    assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED
    assert await task_failures(handle) == []


def test_where_names_a_child_by_its_workflow_id() -> None:
    child = ChildWorkflowError(
        "Child Workflow execution failed",
        namespace="default",
        workflow_id="termination/c/n/u",
        run_id="r",
        workflow_type="TerminationWorkflow",
        initiated_event_id=1,
        started_event_id=2,
        retry_state=None,
    )
    child.__cause__ = ApplicationError("Draining: evictions denied", type="TerminationFailed")
    assert where(child) == ["TerminationWorkflow termination/c/n/u"]
    assert describe(child).startswith("TerminationWorkflow termination/c/n/u: TerminationFailed: ")


# -- a bug in workflow code: the run fails, after its compensation ------------------------------------


def two_inputs(harness: Harness, name: str) -> list[Any]:
    node = a_node(harness)
    if name == "DisruptionWorkflow":
        one: Any = DisruptionInput(reason="Underutilized", nodes=[node])
    elif name == "TerminationWorkflow":
        one = TerminationInput(node=node)
    elif name == "RolloutWorkflow":
        one = RolloutInput(cluster="c", nodepool="default", requested_at=datetime(2026, 1, 1, tzinfo=UTC))
    else:
        one = {"cluster": "c", "task_queue": harness.task_queue}
    return [one, one]


@pytest.mark.parametrize(
    "name", ["DisruptionWorkflow", "TerminationWorkflow", "RolloutWorkflow", "ControllerWorkflow"]
)
async def test_a_start_with_two_inputs_fails_the_run_at_once(harness: Harness, name: str) -> None:
    """`temporal workflow start --input a --input b`: the run fails with the reason; before, the
    disruption's, termination's and rollout's workflow task failed with a TypeError for ever, and
    the controller listed the disruption as in flight."""
    handle = await harness.client.start_workflow(
        name, args=two_inputs(harness, name), id=harness.id(name), task_queue=harness.task_queue
    )
    with pytest.raises(WorkflowFailureError) as failure:
        await closed(handle)
    assert "positional argument" in str(failure.value.cause) or "expected one" in str(failure.value.cause)
    assert harness.cluster.calls == []


class BrokenPhaseEnd:
    """Workflow code raises `error` wherever the phase `phase` ends, except in the failure handlers
    (a termination's `_fail`, a disruption's `_roll_back`), as a bug or a sandbox refusal at that
    step would, on every attempt, until `fixed` (the better code deployed). workflow_metrics is
    passed through the sandbox: a run built after the patch reads the patched function."""

    HANDLERS = frozenset({"_fail", "_roll_back"})

    def __init__(self, monkeypatch: pytest.MonkeyPatch, phase: str, error: BaseException) -> None:
        self.phase, self.error, self.fixed, self.raised = phase, error, False, 0
        self._real = workflow_metrics.record_phase
        monkeypatch.setattr(workflow_metrics, "record_phase", self.record_phase)

    def record_phase(self, name: str, duration: timedelta) -> None:
        setting_next = sys._getframe(2).f_code.co_name  # whoever is setting the next phase
        if not self.fixed and name == self.phase and setting_next not in self.HANDLERS:
            self.raised += 1
            raise self.error
        self._real(name, duration)


async def test_a_bug_before_the_handover_fails_the_disruption_after_rolling_it_back(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AttributeError in workflow code between the replacements and the terminations (where a
    bug escaped every handler): the run rolls back (candidates untainted, nothing left) and fails,
    quoting the bug, instead of failing its task for ever with the candidates tainted."""
    BrokenPhaseEnd(monkeypatch, "WaitingForReplacements", AttributeError("'X' object has no attribute 'id'"))
    node = a_node(harness)
    spec = ReplacementSpec(nodepool="default", instance_types=["m5.large"], zones=["zone-a"])
    handle = await start_disruption(
        harness, DisruptionInput(reason="Underutilized", nodes=[node], replacements=[spec])
    )

    with pytest.raises(WorkflowFailureError) as failure:
        await closed(handle)

    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "DisruptionFailed"
    assert "AttributeError: 'X' object has no attribute 'id'" in cause.message
    assert "begin_termination" not in harness.cluster.names()
    # The replacement initialized: it stays, an ordinary node; the candidate is as it was.
    assert harness.cluster.leftovers([node]) == {}
    assert (await handle.query(DisruptionWorkflow.status)).phase == "RolledBack"


async def test_a_bug_after_the_handover_fails_the_disruption_and_the_terminations_go_on(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    BrokenPhaseEnd(monkeypatch, "Terminating", TypeError("unsupported operand"))
    node = a_node(harness)
    handle = await start_disruption(harness, DisruptionInput(reason="Underutilized", nodes=[node]))

    with pytest.raises(WorkflowFailureError) as failure:
        await closed(handle)

    assert "unsupported operand" in str(failure.value.cause)
    child = harness.client.get_workflow_handle(f"termination/fake/{node}/uid-{node}")
    await child.result()
    assert harness.cluster.leftovers([node]) == {}


# -- a bad deploy: the task retries until code that matches the history runs it ----------------------


async def test_a_nondeterminism_in_a_termination_retries_its_task_and_never_fails_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox refusal (a NondeterminismError) inside a termination's steps: before, the run
    failed with TerminationFailed, its node left deleting. Now its workflow task fails and is
    retried; once the code is fixed (the patch undone) the same run carries on and succeeds."""
    refusal = workflow.NondeterminismError("Cannot access datetime.now from inside a workflow")
    broken = BrokenPhaseEnd(monkeypatch, "Starting", refusal)  # ends when the taint begins
    node = a_node(harness)
    handle = await harness.client.start_workflow(
        TerminationWorkflow.run,
        TerminationInput(node=node),
        id=f"termination/{node}",
        task_queue=harness.task_queue,
    )
    for _ in range(100):
        if await task_failures(handle):
            break
        await asyncio.sleep(0.05)
    assert "datetime.now" in (await task_failures(handle))[0]
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    assert "remove_finalizer" not in harness.cluster.names() and harness.cluster.events == []

    broken.fixed = True  # the fixed code is deployed
    status = await asyncio.wait_for(handle.result(), 30)
    assert status.phase == "Succeeded"
    assert harness.cluster.leftovers([node]) == {}


async def test_a_nondeterminism_in_a_disruption_is_not_rolled_back(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NondeterminismError inside the disruption's undoable steps: no compensation runs (its
    commands would be thrown away with the failed task anyway) and the run is not failed."""
    refusal = workflow.NondeterminismError("Cannot access os.environ from inside a workflow")
    broken = BrokenPhaseEnd(monkeypatch, "Tainting", refusal)  # ends when the launch begins
    node = a_node(harness)
    spec = ReplacementSpec(nodepool="default", instance_types=["m5.large"], zones=["zone-a"])
    handle = await start_disruption(
        harness, DisruptionInput(reason="Underutilized", nodes=[node], replacements=[spec])
    )
    for _ in range(100):
        if await task_failures(handle):
            break
        await asyncio.sleep(0.05)
    assert await task_failures(handle)
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    assert "untaint_disrupted" not in harness.cluster.names()

    broken.fixed = True
    status = await asyncio.wait_for(handle.result(), 30)
    assert status.phase == "Succeeded"


# -- the controller: a bug retries its task, and the fixed code carries on with its state ----------


async def test_a_bug_in_the_controller_keeps_it_running_and_the_fix_carries_on_with_its_pauses(
    controller_harness: ControllerHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller lists no failure types: a failed run would be started again by the workers'
    supervision with none of its state, an operator's pause silently lifted. Its workflow task
    retries instead, the supervision says it is stuck, and the fixed code goes on, pause and all."""
    harness = controller_harness
    settings = WorkerSettings(cluster_name=f"stuck-{uuid.uuid4().hex[:6]}", task_queue=harness.task_queue)
    handle = await harness.client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(cluster=settings.cluster_name, task_queue=harness.task_queue, interval_seconds=0.05),
        id=controller_workflow_id(settings.cluster_name),
        task_queue=harness.task_queue,
    )
    try:
        await handle.execute_update(UPDATE_PAUSE, {"scope": "nodepool", "nodepool": "gpu", "by": "ops"})
        real = node_reasons.waiting
        broken = True

        def waiting(reasons: dict[str, str]) -> list[str]:
            if broken:
                raise KeyError("a bug in the pass")
            return real(reasons)

        monkeypatch.setattr(node_reasons, "waiting", waiting)
        check = await ensure_controller(harness.client, settings)
        for _ in range(200):
            if check.stuck:
                break
            await asyncio.sleep(0.1)
            check = await ensure_controller(harness.client, settings)
        assert check.stuck and check.started_run is None  # running, not started again
        assert "a bug in the pass" in (await task_failures(handle))[0]

        broken = False  # the fixed code is deployed
        passes = harness.controller.requests
        count = len(passes)
        for _ in range(200):
            if len(passes) > count + 2:
                break
            await asyncio.sleep(0.05)
        status = await handle.query("status", result_type=ControllerStatus)
        assert [p.key for p in status.pauses] == ["nodepool/gpu"]
        assert not (await ensure_controller(harness.client, settings)).stuck
    finally:
        await handle.terminate("test over")
