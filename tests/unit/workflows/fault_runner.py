"""Running one cell of the fault matrix (fault_matrix.py) on the time-skipping server.

A cell starts its path's workflow against a fresh FakeCluster, arms its fault (and the path's primary
fault, which takes the run onto the path), drives what the fault needs from outside (the cancel, the
worker's stop and a new worker on the same task queue, the child's termination), waits for the run
to close (or checks the documented wait, then ends the fault) and reports what it saw: the close,
the phase the status query and the Phase search attribute give, what is left in the cluster, the
workflow task failures, and the histories, which it replays.

Time is short here: the options the workflows read from passed-through modules (workflows/options.py,
workflows/events.py) are shrunk (a call times out after 1 s, retries come back in milliseconds), and
the inputs carry short timeouts, so a timeout costs about a second of waiting and no CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowHistory
from temporalio.common import RetryPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from api import search_attributes as sa
from api.controller_io import SIGNAL_STOP, ControllerInput, ControllerStatus, ControlsUpkeep, PlannedCommand
from api.notifications import Notification
from api.rollout_io import AbortRequest, RolloutInput, RolloutNode, RolloutStatus
from api.rollout_policy import RolloutPolicy
from api.workflow_io import (
    Approval,
    DisruptionInput,
    DisruptionStatus,
    DisruptionTimeouts,
    ReplacementSpec,
    TerminationInput,
    TerminationStatus,
    TerminationTimeouts,
)
from tests.unit.workflows.fakes import FakeCluster
from tests.unit.workflows.fault_injection import Armed, Fault
from tests.unit.workflows.fault_matrix import (
    APPROVAL,
    BESIDE_KARPENTER,
    CONTROLLER_PASS,
    DRAIN_STUCK,
    FORCEFUL,
    HALTED,
    HANDOVER,
    INTERRUPTED,
    MANUAL,
    NODECLAIM_ROLLBACK,
    NOT_READY,
    NOTIFY,
    ROLLS,
    RUNNING,
    SPOT,
    WAVES,
    Cell,
    Path,
    workflow_modules,
    workflow_name,
)
from worker import WORKFLOWS
from workflows import events as workflow_events
from workflows import notify, options, rollout_waves
from workflows.disruption import UPDATE_APPROVE

# Without the sandbox: it costs about 70 ms of CPU a cell (each run, each worker's check of the
# workflows and each replay imports the workflow modules again), two fifths of the matrix. The
# sandbox's refusals are every other workflow test's business, and test_replay.py replays the
# recorded histories in it; here it is the faults. A build id given saves hashing every module's
# code for each worker.
RUNNER = UnsandboxedWorkflowRunner()
BUILD_ID = "fault-matrix"
TERMINATION = TerminationTimeouts(
    heartbeat=timedelta(seconds=1),
    drain_attempt=timedelta(seconds=3),
    volume_detach=timedelta(seconds=2),
    instance_terminate=timedelta(seconds=3),
    drain_stuck=None,  # DRAIN_STUCK's own (a timer beside every drain would change no other cell)
)
DISRUPTION = DisruptionTimeouts(replacement_ready=timedelta(seconds=4), heartbeat=timedelta(seconds=1))
WITHIN = 30.0  # seconds a cell may take to close (most take a fraction of one)
# A local activity holds its workflow task open: the worker heartbeats the task (at 80 % of this), and
# only then does a cancel that came meanwhile reach the workflow and cancel the activity. Short, so a
# cell's cancel lands in a second and not in eight; a test server that refuses a task's completion
# (a cancel of an activity that had just completed: ACTIVITY_UNKNOWN) has it retried as soon.
TASK_TIMEOUT = timedelta(seconds=1)
# The waves' cells: three nodes, waves of 1 then 2, a 1-s soak (the time-skipping server skips it
# while the cell awaits the close).
WAVE_POLICY = RolloutPolicy.model_validate({"canary": 1, "soak": "1s", "growth": 2})
# Activities the halted path calls only once aborted: the cell aborts first, then does its fault.
AFTER_THE_ABORT = frozenset({"unmark_rollout_nodes#2", "mark_rollout_wave#2"})


def _quick(policy: RetryPolicy) -> RetryPolicy:
    return replace(
        policy, initial_interval=timedelta(milliseconds=10), maximum_interval=timedelta(milliseconds=50)
    )


SHORT: dict[str, object] = {
    "API_CALL": timedelta(seconds=2),
    "API_RETRY": _quick(options.API_RETRY),
    "WAIT_RETRY": _quick(options.WAIT_RETRY),
    "DRAIN_RETRY": _quick(options.DRAIN_RETRY),
    "INSTANCE_TERMINATE_HEARTBEAT": timedelta(seconds=1),
    "INSTANCE_TERMINATE": timedelta(seconds=3),
    "PASS_TIMEOUT": timedelta(seconds=2),
    "PASS_HEARTBEAT": timedelta(seconds=1),
    "PASS_STEP": timedelta(seconds=1),
    "PASS_RETRY": _quick(options.PASS_RETRY),
    "GARBAGE_COLLECTION_TIMEOUT": timedelta(seconds=2),
    "CHECK_RETRY": _quick(options.CHECK_RETRY),
    "EVENT_TIMEOUT": timedelta(seconds=1),
    "EVENT_RETRY": _quick(workflow_events.EVENT_RETRY),
    "NOTIFY_FOR": timedelta(seconds=3),
    "NOTIFY_ATTEMPT": timedelta(seconds=2),
    "NOTIFY_RETRY": _quick(notify.NOTIFY_RETRY),
}


def shorten_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workflows' timeouts and retries, short: in workflows/options.py and workflows/events.py,
    and in the workflow modules (a workflow's class's, its parts' and its waves'), which bound them
    when they were imported (without the sandbox nothing imports them again for a run)."""
    workflow_code = [m for w in WORKFLOWS for m in workflow_modules(w)]
    # And the parts a workflow runs without inheriting them (RolloutWorkflow's waves).
    workflow_code.append(rollout_waves)
    for module in (options, workflow_events, *workflow_code):
        for name, value in SHORT.items():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, value)


@dataclass
class Seen:
    """What a cell saw."""

    status: str
    phase: str
    phase_attribute: str | None
    left: dict[str, list[str]]
    task_failures: list[str]
    histories: list[WorkflowHistory]
    armed: Armed
    waited_in: str = ""
    message: str = ""


@dataclass
class Run:
    """One cell's run: its fakes, its worker (stopped and started again for a worker-killed cell),
    and its nodes, whose names carry the cell's tag."""

    env: WorkflowEnvironment
    client: Client
    cell: Cell
    cluster: FakeCluster = field(default_factory=FakeCluster)
    task_queue: str = field(default_factory=lambda: f"matrix-{uuid.uuid4().hex[:8]}")
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    worker: Worker | None = None
    worker_task: asyncio.Task[None] | None = None
    candidates: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)  # workflow ids of the children to wait for
    primary: Armed | None = None  # the fault that takes the run onto its path

    # -- workers -------------------------------------------------------------------------------------

    def _new_worker(self) -> Worker:
        # No workflow cache: with one, the test server would hand the next workflow task to the sticky
        # queue of a stopped worker and never time it out; without, every task replays its history.
        killing = self.cell.fault == Fault.WORKER_KILLED
        return Worker(
            self.client,
            task_queue=self.task_queue,
            workflows=list(WORKFLOWS),
            activities=self.cluster.activities(),
            graceful_shutdown_timeout=timedelta(0),
            max_cached_workflows=0 if killing else 100,
            workflow_runner=RUNNER,
            build_id=BUILD_ID,
        )

    async def start_worker(self) -> None:
        self.worker = self._new_worker()
        self.worker_task = asyncio.create_task(self.worker.run())

    async def stop_worker(self) -> None:
        if self.worker is not None:
            await self.worker.shutdown()
        if self.worker_task is not None:
            with contextlib.suppress(BaseException):
                await self.worker_task
        self.worker, self.worker_task = None, None

    # -- inputs -----------------------------------------------------------------------------------------

    def node(self, name: str = "n") -> str:
        node = f"{name}-{self.tag}"
        self.cluster.nodes.add(node)
        self.candidates.append(node)
        return node

    def termination_id(self, node: str) -> str:
        return f"termination/fake/{node}/{self.cluster.uid(node)}"


async def start(run: Run) -> WorkflowHandle[Any, Any]:
    """Start the cell's path; the handle of the workflow under test."""
    path, cluster, client, tq = run.cell.path, run.cluster, run.client, run.task_queue
    spec = ReplacementSpec(nodepool="default", instance_types=["m5.large"], zones=["zone-a"])
    if path is CONTROLLER_PASS:
        # Each pass finds work for the cell's own step only (a pass of every step is ~7 activities).
        command = PlannedCommand(
            workflow_id=f"disruption/default/Empty/{run.tag}",
            method="emptiness",
            reason="Empty",
            nodes=[run.node()],
            nodepools=["default"],
            forceful=False,
            needs_validation=True,
            input=DisruptionInput(reason="Empty", nodes=run.candidates, termination=TERMINATION).model_dump(
                mode="json"
            ),
            planned={},
        )
        if run.cell.is_child:  # started once (a second pass would start it again once it closed)
            cluster.planned = [command]
            run.children.append(command.workflow_id)
        elif run.cell.target == "validate_commands":
            cluster.planned_every_pass = [command]
            cluster.commands_valid = False  # nothing is started
        step_finds = {
            "untaint_orphans": ("orphan_taints", [f"orphan-{run.tag}"]),
            "sync_nodepool_finalizers": ("nodepool_finalizers", {"default": True}),
            "apply_annotations": ("annotations", [{"node": "x", "set": {"a": "b"}}]),
            "apply_taints": ("taints", [{"node": "x", "add": True}]),
            "sync_operator_controls": ("upkeep", ControlsUpkeep(stale_claims=1)),
        }
        if run.cell.target in step_finds:
            key, value = step_finds[run.cell.target]
            cluster.pass_extras = {key: value}
        return await client.start_workflow(
            "ControllerWorkflow",
            ControllerInput(
                cluster=run.tag,
                task_queue=tq,
                interval_seconds=0.05,
                validation_seconds=0.01,
                gc_interval_seconds=0.01,
            ),
            id=f"karpflow-controller/{run.tag}",
            task_queue=tq,
            task_timeout=TASK_TIMEOUT,
        )
    if path.workflow.__name__ == "DisruptionWorkflow":
        node = run.node()
        run.children.append(run.termination_id(node))
        if path in (BESIDE_KARPENTER, NODECLAIM_ROLLBACK):
            cluster.karpenter_coexistence = True
        command = DisruptionInput(
            reason="Underutilized",
            nodes=[node],
            replacements=[] if path is APPROVAL else [spec],
            timeouts=DISRUPTION,
            termination=TERMINATION,
            notify=True,
        )
        if path is APPROVAL:
            command.approval = Approval(timeout=timedelta(hours=1))
        if path is FORCEFUL:
            command.reason = "Expired"
        if path is SPOT:
            command.reason = "Interrupted"
            command.termination_deadline = await run.env.get_current_time() + timedelta(minutes=2)
        return await client.start_workflow(
            "DisruptionWorkflow",
            command,
            id=f"disruption/default/{command.reason}/{run.tag}",
            task_queue=tq,
            task_timeout=TASK_TIMEOUT,
        )
    if path is NOTIFY:
        return await client.start_workflow(
            "NotificationWorkflow",
            Notification(event="CommandFailed", workflow_id="disruption/x", text="fault matrix"),
            id=f"notify/{run.tag}",
            task_queue=tq,
            task_timeout=TASK_TIMEOUT,
        )
    if path.workflow.__name__ == "TerminationWorkflow":
        node = run.node()
        request = TerminationInput(
            node=node,
            uid=cluster.uid(node),
            reason="Manual",
            termination_grace_period=timedelta(minutes=1),
            timeouts=TERMINATION,
        )
        if path is MANUAL:
            cluster.volumes_attached_once = True
        if path is NOT_READY:
            cluster.node_ready = False
        if path is HANDOVER:
            cluster.karpenter_coexistence = True
        if path is INTERRUPTED:
            request.reason = "Interrupted"
            request.deadline = await run.env.get_current_time()
        if path is DRAIN_STUCK:  # the drain's first attempt hangs for drain_attempt (3 s)
            request.timeouts = TERMINATION.model_copy(update={"drain_stuck": timedelta(seconds=1)})
            request.notify = True
        return await client.start_workflow(
            "TerminationWorkflow",
            request,
            id=run.termination_id(node),
            task_queue=tq,
            task_timeout=TASK_TIMEOUT,
        )
    # The rollout: three marked nodes, the planner replacing one a poll.
    cluster.rollout_marks = {f"uid-{i}-{run.tag}": [f"r{i}-{run.tag}", None] for i in range(3)}
    cluster.rollout_replaces = path in (ROLLS, WAVES)
    request = RolloutInput(
        cluster="c",
        nodepool="default",
        requested_at=await run.env.get_current_time(),
        poll_interval=timedelta(milliseconds=200),
        notify=True,
    )
    if path in (WAVES, HALTED):
        # A drift rollout, as the controller starts one: the pool's drifted nodes given, its target.
        nodes = [RolloutNode(name=str(n), uid=u) for u, (n, _) in sorted(cluster.rollout_marks.items())]
        request = request.model_copy(
            update={
                "mode": "drift",
                "target": f"target-{run.tag}",
                "policy": WAVE_POLICY,
                "nodes": nodes,
                "total": len(nodes),
            }
        )
    if path is HALTED:
        # The canary's replacement is up and NotReady while the canary drains: the gate fails it.
        cluster.gate_fails = True
        cluster.rollout_marks[f"uid-new-r0-{run.tag}"] = [f"new-r0-{run.tag}", None]
        cluster.rollout_new.add(f"uid-new-r0-{run.tag}")
    return await client.start_workflow(
        "RolloutWorkflow",
        request.model_dump(mode="json"),
        id=f"rollout/c/default/{run.tag}",
        task_queue=tq,
        task_timeout=TASK_TIMEOUT,
    )


# -- driving a cell ------------------------------------------------------------------------------------


async def until(
    check: Callable[[], Awaitable[bool]], what: str, within: float = WITHIN, every: float = 0.05
) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never {what} within {within} s")
        await asyncio.sleep(every)


async def task_failures(handle: WorkflowHandle[Any, Any]) -> list[str]:
    return failures_in(await handle.fetch_history())


# Workflow task failures that say nothing about the code: the server refused a completion because new
# events came meanwhile (it hands the task out again with them), or the worker of a sticky task went.
BENIGN = frozenset(
    {
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_STICKY_TASK_QUEUE,
    }
)


def failures_in(history: WorkflowHistory) -> list[str]:
    """The workflow task failures a history holds (cause: message), but the benign ones."""
    failed = [
        e.workflow_task_failed_event_attributes
        for e in history.events
        if e.HasField("workflow_task_failed_event_attributes")
    ]
    return [
        f"{WorkflowTaskFailedCause.Name(f.cause)}: {f.failure.message}"
        for f in failed
        if f.cause not in BENIGN
    ]


async def closed(handle: WorkflowHandle[Any, Any], within: float = WITHIN) -> WorkflowExecutionStatus:
    """Wait for the run to close (awaiting its result lets the test server skip time); one still
    running then fails the cell, with the workflow task failures that kept it so, if any."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(handle.result(), within)
    status = (await handle.describe()).status
    if status == WorkflowExecutionStatus.RUNNING:
        failures = await task_failures(handle)
        raise AssertionError(
            f"{handle.id} still running after {within} s; workflow task failures: {failures}"
        )
    return status


def _status_type(path: Path) -> type:
    name = path.workflow.__name__
    return {
        "ControllerWorkflow": ControllerStatus,
        "DisruptionWorkflow": DisruptionStatus,
        "TerminationWorkflow": TerminationStatus,
        "RolloutWorkflow": RolloutStatus,
    }[name]


async def _query(run: Run, handle: WorkflowHandle[Any, Any]) -> Any:
    return await handle.query("status", result_type=_status_type(run.cell.path))


async def _phase_attribute(handle: WorkflowHandle[Any, Any]) -> str | None:
    described = await handle.describe()
    return described.typed_search_attributes.get(sa.PHASE)


def arm(run: Run) -> Armed:
    """The path's primary fault and the cell's own; the Armed the cell watches."""
    cell, faults = run.cell, run.cluster.faults
    name = workflow_name(cell.path.workflow)
    if cell.path.primary is not None:
        activity, fault = cell.path.primary
        run.primary = faults.arm(name, activity, fault)
    if not cell.is_child:
        return faults.arm(name, cell.activity, cell.fault, from_call=cell.call)
    if cell.target == "NotificationWorkflow":  # refused by the webhook, or held until acted on
        if cell.fault == Fault.CHILD_FAILS:
            return faults.refuse("NotificationWorkflow", "send_notification", "webhook answered 400")
        return faults.arm("NotificationWorkflow", "send_notification", Fault.CANCELLED)
    if name == "ControllerWorkflow":  # its child: a DisruptionWorkflow
        if cell.fault == Fault.CHILD_FAILS:
            return faults.refuse("DisruptionWorkflow", "taint_disrupted", "taint refused (fault matrix)")
        return faults.arm("DisruptionWorkflow", "taint_disrupted", Fault.CANCELLED)  # holds it there
    # A disruption's child: a TerminationWorkflow whose drain is refused, or holds until acted on.
    if cell.fault == Fault.CHILD_FAILS:
        return faults.refuse(
            "TerminationWorkflow", "drain_node", "eviction: Kubernetes API 400: webhook denied"
        )
    return faults.arm("TerminationWorkflow", "drain_node", Fault.CANCELLED)  # hangs, heartbeating


async def _reached(armed: Armed, what: str) -> None:
    try:
        await asyncio.wait_for(armed.reached.wait(), WITHIN)
    except TimeoutError:
        raise AssertionError(f"{what} was never reached: the path does not call it") from None


async def drive(run: Run, handle: WorkflowHandle[Any, Any], armed: Armed) -> str:
    """Do from outside what the fault needs; the phase of the documented wait, if one was checked."""
    cell = run.cell
    primary = run.primary
    if cell.path is HALTED and cell.target in AFTER_THE_ABORT:
        waited = await halted_then_abort(run, handle)
        await drive_fault(run, handle, armed)
        return waited
    if primary is not None and primary.fault == Fault.CANCELLED:
        await _reached(primary, f"{primary.activity} (the path's way in)")
        await handle.cancel()
        primary.released.set()
    # The judgement of an approved command comes after `approve`: approve first to reach it.
    approved_first = cell.path is APPROVAL and cell.target == "check_waiting_command"
    if approved_first:
        await approve(run, handle)
    await drive_fault(run, handle, armed)
    if cell.path is APPROVAL and cell.fault != Fault.CANCELLED and not approved_first:
        await approve(run, handle)
    if cell.path is HALTED:
        return "" if cell.fault == Fault.CANCELLED else await halted_then_abort(run, handle)
    waits = cell.expected.waits
    if waits:
        await until(lambda: asyncio.sleep(0, armed.calls >= 3), f"{cell.target} retried three times")

        async def waiting() -> bool:  # a wave's wait may come a poll after the third try (its soak)
            return (await _query(run, handle)).phase == waits and await _phase_attribute(handle) == waits

        await until(waiting, f"waiting in {waits}")
        armed.cleared = True
    return waits


async def drive_fault(run: Run, handle: WorkflowHandle[Any, Any], armed: Armed) -> None:
    """The cell's own fault, from outside: the cancel, the worker's stop, the child's end."""
    cell = run.cell
    if cell.fault in (Fault.CANCELLED, Fault.WORKER_KILLED, Fault.CHILD_TERMINATED, Fault.CHILD_CANCELLED):
        await _reached(armed, cell.target)
    if cell.is_child and cell.target == "NotificationWorkflow":
        await _reached(armed, "the notification's send")  # the path starts it
        run.children.insert(0, armed.workflow_ids[0])  # the child the fault is done to
    if cell.fault == Fault.CANCELLED:
        await handle.cancel()
        armed.released.set()
    elif cell.fault == Fault.WORKER_KILLED:
        await run.stop_worker()
        await run.start_worker()
    elif cell.fault in (Fault.CHILD_TERMINATED, Fault.CHILD_CANCELLED):
        child = run.client.get_workflow_handle(run.children[0])
        if cell.fault == Fault.CHILD_TERMINATED:
            await child.terminate("fault matrix: terminated from outside")
        else:
            await child.cancel()


async def halted_then_abort(run: Run, handle: WorkflowHandle[Any, Any]) -> str:
    """The halted path's wait: the gate failed the canary and the rollout waits for the operator
    (its status query and Phase say Halted); the operator then aborts it with `rollback`."""

    async def halted() -> bool:
        return (await _query(run, handle)).phase == "Halted" and await _phase_attribute(handle) == "Halted"

    await until(halted, "halted")
    await handle.signal("abort", AbortRequest(rollback=True, by="fault-matrix"))
    return "Halted"


async def approve(run: Run, handle: WorkflowHandle[Any, Any]) -> None:
    """An operator approves the command once it waits (before the cell awaits its close: the test
    server would skip to the approval's timeout)."""

    async def waiting() -> bool:
        return (await _query(run, handle)).phase == "AwaitingApproval"

    await until(waiting, "awaiting approval")
    await handle.execute_update(UPDATE_APPROVE, {"by": "fault-matrix"})


async def controller_outcome(run: Run, handle: WorkflowHandle[Any, Any], armed: Armed) -> ControllerStatus:
    """The controller goes on: two whole passes after the fault, then its status; then it is stopped."""
    passes = lambda: run.cluster.faults.started["plan_pass"]  # noqa: E731 (a pass, not a retry)
    if run.cell.is_child:
        child = run.client.get_workflow_handle(run.children[0])
        await until(lambda: _is_closed(child), "the child closed")
    else:
        await _reached(armed, run.cell.target)
    start = passes()
    await until(lambda: asyncio.sleep(0, passes() >= start + 2), "two more passes")
    status: ControllerStatus = await _query(run, handle)
    await handle.signal(SIGNAL_STOP)
    return status


async def _is_closed(handle: WorkflowHandle[Any, Any]) -> bool:
    try:
        return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING
    except RPCError:
        return False


async def run_cell(env: WorkflowEnvironment, client: Client, cell: Cell) -> Seen:
    run = Run(env, client, cell)
    run.cluster.clock = env.get_current_time
    armed = arm(run)
    await run.start_worker()
    handles: list[WorkflowHandle[Any, Any]] = []
    try:
        handle = await start(run)
        handles.append(handle)
        waited = await drive(run, handle, armed)
        message = ""
        if cell.expected.status == RUNNING:
            controller = await controller_outcome(run, handle, armed)
            message = controller.error
        status = await closed(handle)
        query = await _query(run, handle) if cell.path is not NOTIFY else None
        phase = getattr(query, "phase", "")
        message = message or getattr(query, "message", "")
        attribute = await _phase_attribute(handle)
        for child_id in run.children:
            child = client.get_workflow_handle(child_id)
            with contextlib.suppress(RPCError):
                await child.describe()
                handles.append(child)
                if not cell.is_child or child_id != run.children[0]:
                    await closed(child)
        histories = [await h.fetch_history() for h in handles]
        failures = [f for history in histories for f in failures_in(history)]
        return Seen(
            status=status.name,
            phase=phase,
            phase_attribute=attribute,
            left=run.cluster.leftovers(run.candidates),
            task_failures=failures,
            histories=histories,
            armed=armed,
            waited_in=waited,
            message=message,
        )
    finally:
        for h in handles:
            with contextlib.suppress(BaseException):
                if not await _is_closed(h):
                    await h.terminate("fault matrix cell over")
        await run.stop_worker()


async def replay(histories: list[WorkflowHistory]) -> None:
    replayer = Replayer(
        workflows=list(WORKFLOWS),
        data_converter=pydantic_data_converter,
        workflow_runner=RUNNER,
        build_id=BUILD_ID,
    )
    for history in histories:
        await replayer.replay_workflow(history)
