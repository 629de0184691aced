"""Running workflows survive a code change: recorded histories replay against the current code.

tests/unit/workflows/histories/ holds one history per path that matters (happy path, rollback,
cancel, a drain with retries, the controller starting a command; a long controller run that
continues as new, one cut by its history size, one stopped) and histories recorded by older code
that must keep replaying (`controller-before-issue-17*`, never re-recorded). Temporal's `Replayer`
runs the current workflow code against each; a change that alters the sequence of commands a
running workflow would issue fails here with a non-determinism error, before it reaches a cluster.
The rule for changing workflows is in docs/workflow-changes.md.

Re-record after an intended, versioned change (and say so in the commit); the `-k` picks the
controller's or the others':

    KARPFLOW_RECORD_HISTORIES=1 .venv/bin/pytest tests/unit/workflows/test_replay.py -k record
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import temporalio.workflow
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistory,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, Worker
from temporalio.workflow import NondeterminismError

from api.controller_io import (
    UPDATE_PAUSE,
    UPDATE_RESUME,
    ControlCondition,
    ControllerInput,
    ControlsUpkeep,
    FailedCommand,
    PlannedCommand,
)
from api.workflow_io import Approval, DisruptionInput, ReplacementSpec, TerminationInput
from tests.unit.workflows.controller_fakes import (  # noqa: F401 - the fixtures
    PassScript,
    controller_harness_fixture,
)
from worker import WORKFLOWS
from workflows.controller import PATCH_BOUNDED_HISTORY, PATCH_COUNT_FAILURES_ONCE, PATCH_OPERATOR_CONTROLS
from workflows.disruption import UPDATE_APPROVE
from workflows.disruption_patches import (
    PATCH_APPROVAL_GATE,
    PATCH_LEAN_HISTORY,
    PATCH_NODECLAIM_ONE_WAIT,
    PATCH_NODECLAIM_REPLACEMENTS,
    PATCH_TERMINATION_PER_INCARNATION,
)
from workflows.termination import (
    PATCH_CONTROLS_GATE,
    PATCH_FAILURE_EVENT,
    PATCH_KARPENTER_HANDOVER,
)
from workflows.termination import PATCH_LEAN_HISTORY as PATCH_TERMINATION_LEAN

HISTORIES = Path(__file__).parent / "histories"
CONTROLLER_HISTORIES = ("controller-long", "controller-history-limit", "controller-stopped")
RECORD = os.environ.get("KARPFLOW_RECORD_HISTORIES") == "1"
LEAN_TERMINATION_HISTORIES = (
    "termination-lean",
    "termination-lean-drain-retries",
    "termination-lean-failed",
    "termination-lean-controls-gate",
    "termination-lean-handover",
    "termination-lean-unpinned",
)
COEXISTENCE_HISTORIES = ("disruption-nodeclaim", "disruption-nodeclaim-rollback", "termination-handover")
# Every workflow type, and the paths of each that a change is most likely to break.
EXPECTED = {
    "disruption-replace",
    "disruption-rollback",
    "disruption-cancel",
    "termination",
    "termination-drain-retries",
    "controller",
    # Recorded after the node pinning (issue 17): the child termination's id per node incarnation,
    # behind workflow.patched, and a forceful command with a spot deadline.
    "disruption-replace-pinned",
    "disruption-forceful-deadline",
    "termination-pinned",
    # A termination that fails (an instance this cluster does not own): recorded before issue 20 (no
    # FailedTermination Event; never re-record it) and after, behind its patch.
    "termination-failed-before-issue-20",
    "termination-failed",
    # The controller starting a command with its summary, details and memo (issue 20).
    "controller-summaries",
    # The controller as it ran before issue 17 (never re-recorded: it proves that runs started on that
    # code replay, taking the old side of every patch), and fresh runs of today's controller.
    "controller-before-issue-17",
    "controller-before-issue-17-backoff",
    *CONTROLLER_HISTORIES,
    # Beside Karpenter (issue 18): replacements as NodeClaims, a rollback deleting them, a termination
    # handed to Karpenter, each behind its patch marker.
    *COEXISTENCE_HISTORIES,
    # Recorded after the operator controls (issue 19): a controller paused and resumed by updates,
    # tidying the controls, and a termination waiting for a NodeDisruptionBudget. The histories above
    # were recorded before them and take the old side of those patches.
    "controller-operator-controls",
    "termination-controls-gate",
    "disruption-approved",
    "disruption-rejected-by-timeout",
    # The RolloutWorkflow (issue 19): a rollout that completes, and one cancelled (its marks off).
    "rollout",
    "rollout-cancel",
    # The lean termination (issue 21): short steps as local activities, fewer upserts, behind one patch.
    # Every termination history above was recorded before it and replays on the old side.
    *LEAN_TERMINATION_HISTORIES,
}


def _disruption(nodes: list[str]) -> DisruptionInput:
    spec = ReplacementSpec(nodepool="default", instance_types=["m5.large"], zones=["zone-a"])
    command = DisruptionInput(reason="Underutilized", nodes=nodes, replacements=[spec])
    # The test server does not skip time while an activity runs: short waits keep recording fast.
    command.timeouts.replacement_ready = timedelta(seconds=1)
    return command


async def _save(name: str, handle: WorkflowHandle) -> None:
    history = await handle.fetch_history()
    (HISTORIES / f"{name}.json").write_text(history.to_json())


async def _settle(handle: WorkflowHandle) -> None:
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()


async def _approve_when_waiting(handle: WorkflowHandle) -> None:
    """Approve a gated disruption once it waits for approval (polled for up to 5 s, as recorded)."""
    for _ in range(100):
        if (await handle.query("phase")) == "AwaitingApproval":
            break
        await asyncio.sleep(0.05)
    await handle.execute_update(UPDATE_APPROVE, {"by": "replay"})


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_histories(harness):
    client, queue, cluster = harness.client, harness.task_queue, harness.cluster
    HISTORIES.mkdir(exist_ok=True)

    async def start(workflow: str, arg: object, name: str) -> WorkflowHandle:
        return await client.start_workflow(
            workflow, arg, id=f"{name}/{harness.id('replay')}", task_queue=queue
        )

    cluster.nodes.update({"n1", "n2", "n3", "n4", "n5"})
    handle = await start(
        "DisruptionWorkflow", _disruption(["n1"]), "disruption/default/Underutilized/replace"
    )
    await _settle(handle)
    await _save("disruption-replace", handle)

    cluster.never_initializes = True
    handle = await start(
        "DisruptionWorkflow", _disruption(["n2"]), "disruption/default/Underutilized/rollback"
    )
    await _settle(handle)
    await _save("disruption-rollback", handle)

    cluster.never_initializes, cluster.never_registers = False, True
    handle = await start("DisruptionWorkflow", _disruption(["n3"]), "disruption/default/Underutilized/cancel")
    await asyncio.sleep(0.5)
    await handle.cancel()
    await _settle(handle)
    await _save("disruption-cancel", handle)
    cluster.never_registers = False

    handle = await start("TerminationWorkflow", TerminationInput(node="n4"), "termination/n4")
    await _settle(handle)
    await _save("termination", handle)

    cluster.drain_failures = 2
    handle = await start("TerminationWorkflow", TerminationInput(node="n5"), "termination/n5")
    await _settle(handle)
    await _save("termination-drain-retries", handle)

    cluster.planned = [
        PlannedCommand(
            workflow_id="disruption/default/Empty/replay",
            method="emptiness",
            reason="Empty",
            nodes=["n1"],
            nodepools=["default"],
            forceful=False,
            needs_validation=True,
            input=DisruptionInput(reason="Empty", nodes=["n1"]).model_dump(mode="json"),
            planned={},
        )
    ]
    handle = await start(
        "ControllerWorkflow",
        ControllerInput(
            cluster="replay", task_queue=queue, interval_seconds=1, validation_seconds=1, passes_per_run=3
        ),
        "karpflow-controller",
    )
    # After 3 passes it continues as new: the first run's history is then complete.
    first_run = client.get_workflow_handle(handle.id, run_id=handle.result_run_id)
    for _ in range(600):
        if (await first_run.describe()).status != WorkflowExecutionStatus.RUNNING:
            break
        await asyncio.sleep(0.1)
    await _save("controller", first_run)
    await client.get_workflow_handle(handle.id).terminate("recorded")


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_pinned_histories(harness):
    """The paths the node pinning added, beside the histories recorded before it (record only these:
    `KARPFLOW_RECORD_HISTORIES=1 pytest tests/unit/workflows/test_replay.py -k pinned`)."""
    client, queue, cluster = harness.client, harness.task_queue, harness.cluster
    cluster.nodes.update({"p1", "p2", "p3"})

    async def start(workflow: str, arg: object, name: str) -> WorkflowHandle:
        return await client.start_workflow(
            workflow, arg, id=f"{name}/{harness.id('replay')}", task_queue=queue
        )

    pinned = _disruption(["p1"])
    pinned.node_uids = {"p1": cluster.uid("p1")}
    handle = await start("DisruptionWorkflow", pinned, "disruption/replay/default/Underutilized/pinned")
    await _settle(handle)
    await _save("disruption-replace-pinned", handle)

    spot = DisruptionInput(
        reason="Interrupted",
        nodes=["p2"],
        node_uids={"p2": cluster.uid("p2")},
        replacements=[ReplacementSpec(nodepool="default", instance_types=["m5.large"], zones=["zone-a"])],
        termination_deadline=datetime.now(UTC) + timedelta(minutes=2),
    )
    spot.timeouts.replacement_ready = timedelta(seconds=1)
    handle = await start("DisruptionWorkflow", spot, "interruption/replay/i-p2/spot")
    await _settle(handle)
    await _save("disruption-forceful-deadline", handle)

    handle = await start(
        "TerminationWorkflow", TerminationInput(node="p3", uid=cluster.uid("p3")), "termination/replay/p3"
    )
    await _settle(handle)
    await _save("termination-pinned", handle)


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_controller_summaries(harness):
    """The controller starting a command with its summary, details and memo (`-k controller_summaries`)."""
    client, queue, cluster = harness.client, harness.task_queue, harness.cluster
    cluster.nodes.add("s1")
    cluster.planned = [
        PlannedCommand(
            workflow_id="disruption/default/Empty/summaries",
            method="emptiness",
            reason="Empty",
            nodes=["s1"],
            nodepools=["default"],
            forceful=False,
            needs_validation=False,
            input=DisruptionInput(reason="Empty", nodes=["s1"]).model_dump(mode="json"),
            planned={},
            decision="delete",
            consolidation_type="empty",
            summary="Empty: delete 1 node: s1",
            details="**Empty** (emptiness, delete)",
            memo={"command": "karpflow controller (karpflow-controller/replay)", "reason": "Empty"},
        )
    ]
    handle = await client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(cluster="replay", task_queue=queue, interval_seconds=1, passes_per_run=2),
        id=harness.id("karpflow-controller"),
        task_queue=queue,
    )
    first_run = client.get_workflow_handle(handle.id, run_id=handle.result_run_id)
    for _ in range(600):
        if (await first_run.describe()).status != WorkflowExecutionStatus.RUNNING:
            break
        await asyncio.sleep(0.1)
    await _save("controller-summaries", first_run)
    await client.get_workflow_handle(handle.id).terminate("recorded")


def test_the_controller_history_starts_its_command_with_summary_and_memo():
    (started,) = [
        e.start_child_workflow_execution_initiated_event_attributes
        for e in _load(HISTORIES / "controller-summaries.json").events
        if e.HasField("start_child_workflow_execution_initiated_event_attributes")
    ]
    # (the static summary and details travel as the command's user metadata; the time-skipping server
    # keeps them on the child, where test_workflow_observability reads them, not on this event)
    assert "command" in started.memo.fields and "reason" in started.memo.fields


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_failed_termination(harness):
    """A termination that fails (`-k failed_termination`); recorded on the code before issue 20 as
    termination-failed-before-issue-20 (KARPFLOW_HISTORY_NAME), and never re-recorded under that name."""
    harness.cluster.owned = False
    harness.cluster.nodes.add("f1")
    handle = await harness.client.start_workflow(
        "TerminationWorkflow",
        TerminationInput(node="f1", uid=harness.cluster.uid("f1")),
        id=f"termination/replay/f1/{harness.id('replay')}",
        task_queue=harness.task_queue,
    )
    await _settle(handle)
    await _save(os.environ.get("KARPFLOW_HISTORY_NAME", "termination-failed"), handle)


def test_a_failed_termination_replays_both_ways():
    """Runs that failed before issue 20 recorded no patch and no record_event activity; runs after
    take the patch: a FailedTermination Event through record_event, then the failure quoting its cause."""

    def activities(name: str) -> list[str]:
        return [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in _load(HISTORIES / f"{name}.json").events
            if e.HasField("activity_task_scheduled_event_attributes")
        ]

    old, new = "termination-failed-before-issue-20", "termination-failed"
    assert _patches(_load(HISTORIES / f"{old}.json")) == set() and "record_event" not in activities(old)
    assert _patches(_load(HISTORIES / f"{new}.json")) >= {PATCH_FAILURE_EVENT}
    assert activities(new)[-1] == "record_event"


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_coexistence_histories(harness):
    """The paths beside Karpenter (record only these:
    `KARPFLOW_RECORD_HISTORIES=1 pytest tests/unit/workflows/test_replay.py -k coexistence`)."""
    client, queue, cluster = harness.client, harness.task_queue, harness.cluster
    cluster.karpenter_coexistence = True
    cluster.nodes.update({"k1", "k2", "k3"})

    async def start(workflow: str, arg: object, name: str) -> WorkflowHandle:
        return await client.start_workflow(
            workflow, arg, id=f"{name}/{harness.id('replay')}", task_queue=queue
        )

    command = _disruption(["k1"])
    command.node_uids = {"k1": cluster.uid("k1")}
    handle = await start("DisruptionWorkflow", command, "disruption/replay/default/Underutilized/claim")
    await _settle(handle)
    await _save("disruption-nodeclaim", handle)

    cluster.karpenter_gives_up = True
    command = _disruption(["k2"])
    command.node_uids = {"k2": cluster.uid("k2")}
    handle = await start("DisruptionWorkflow", command, "disruption/replay/default/Underutilized/gone")
    await _settle(handle)
    await _save("disruption-nodeclaim-rollback", handle)
    cluster.karpenter_gives_up = False

    handle = await start(
        "TerminationWorkflow", TerminationInput(node="k3", uid=cluster.uid("k3")), "termination/replay/k3"
    )
    await _settle(handle)
    await _save("termination-handover", handle)


def _activities(path: Path) -> list[str]:
    return [
        event["activityTaskScheduledEventAttributes"]["activityType"]["name"]
        for event in _events(path)
        if "activityTaskScheduledEventAttributes" in event
    ]


def test_the_coexistence_histories_take_the_new_paths_behind_their_patches():
    """Runs beside Karpenter recorded the patch markers and the NodeClaim activities; the histories of
    the older paths have neither (test_recorded_history_replays_on_the_current_code replays all)."""
    for name in ("disruption-nodeclaim", "disruption-nodeclaim-rollback"):
        path = HISTORIES / f"{name}.json"
        assert PATCH_NODECLAIM_REPLACEMENTS in _patches(_load(path)), name
        assert "create_nodeclaim" in _activities(path) and "launch_instance" not in _activities(path)
    assert "delete_nodeclaims" in _activities(HISTORIES / "disruption-nodeclaim-rollback.json")
    handover = HISTORIES / "termination-handover.json"
    assert _patches(_load(handover)) == {PATCH_KARPENTER_HANDOVER}
    steps = _activities(handover)
    assert "await_karpenter_termination" in steps and "drain_node" not in steps
    for name in ("disruption-replace-pinned", "termination-pinned"):
        assert not _patches(_load(HISTORIES / f"{name}.json")) & {
            PATCH_NODECLAIM_REPLACEMENTS,
            PATCH_KARPENTER_HANDOVER,
        }, name


def _events(path: Path) -> list[dict]:
    return json.loads(path.read_text())["events"]


def _child_ids(path: Path) -> list[str]:
    return [
        event["startChildWorkflowExecutionInitiatedEventAttributes"]["workflowId"]
        for event in _events(path)
        if "startChildWorkflowExecutionInitiatedEventAttributes" in event
    ]


def test_the_termination_id_change_replays_both_ways():
    """Runs started before the change started their child as `termination/<node>` and recorded no
    patch; runs started after, as `termination/<cluster>/<node>/<uid>` behind the patch marker.
    Both replay on the current code (test_recorded_history_replays_on_the_current_code)."""
    old = HISTORIES / "disruption-replace.json"
    new = HISTORIES / "disruption-replace-pinned.json"
    assert _child_ids(old) == ["termination/n1"] and _patches(_load(old)) == set()
    assert _child_ids(new) == ["termination/fake/p1/uid-p1"]
    assert _patches(_load(new)) == {PATCH_TERMINATION_PER_INCARNATION}


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_rollout_histories(ts_client):
    from tests.unit.workflows.test_rollout_workflow import FakeNodes, Rollouts, status_when

    nodes = FakeNodes(3)
    task_queue = f"record-{uuid.uuid4().hex[:8]}"
    async with Worker(
        ts_client, task_queue=task_queue, workflows=list(WORKFLOWS), activities=nodes.activities()
    ):
        rollouts = Rollouts(ts_client, nodes, task_queue)
        done = await rollouts.start()
        await status_when(done, lambda s: s.phase == "Rolling")
        nodes.gone(0)
        await status_when(done, lambda s: s.replaced == 1)
        nodes.gone(1, 2)
        await done.result()
        await _save("rollout", done)
        nodes.nodes = {"uid-9": ["node-9", None]}
        cancelled = await rollouts.start()
        await status_when(cancelled, lambda s: s.phase == "Rolling")
        await cancelled.cancel()
        await _settle(cancelled)
        await _save("rollout-cancel", cancelled)


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_termination_lean_histories(harness):
    """The terminations of issue 21 (`-k record_termination_lean`): a plain one, drain retries, a
    failure, a wait for a NodeDisruptionBudget, one started by hand without a UID, a node handed to
    Karpenter."""
    client, queue, cluster = harness.client, harness.task_queue, harness.cluster
    cluster.nodes.update({"l1", "l2", "l3", "l4", "l5", "l6"})

    async def record(node: str, name: str, reason: str = "Expired", pinned: bool = True) -> None:
        handle = await client.start_workflow(
            "TerminationWorkflow",
            TerminationInput(node=node, uid=cluster.uid(node) if pinned else None, reason=reason),
            id=f"termination/replay/{node}/{harness.id('lean')}",
            task_queue=queue,
        )
        await _settle(handle)
        await _save(name, handle)

    await record("l1", "termination-lean")
    cluster.drain_failures = 2
    await record("l2", "termination-lean-drain-retries")
    cluster.owned = False
    await record("l3", "termination-lean-failed")
    cluster.owned = True
    cluster.gate_waits = 1
    await record("l4", "termination-lean-controls-gate", reason="Manual")
    await record("l6", "termination-lean-unpinned", pinned=False)
    cluster.karpenter_coexistence = True
    await record("l5", "termination-lean-handover")


def test_the_lean_terminations_take_the_new_path_behind_one_patch():
    """The lean histories carry PATCH_TERMINATION_LEAN and no marker of the older termination patches (their
    steps are on the lean path without them); the short steps are local activities, the drain, volume
    wait, instance and Karpenter waits regular ones; a plain termination stays within issue 21's 30
    events. The older termination histories have no lean marker (they replay on the old side)."""
    short = {"begin_termination", "termination_gate", "taint_for_termination", "remove_finalizer"}
    for name in LEAN_TERMINATION_HISTORIES:
        path = HISTORIES / f"{name}.json"
        assert _patches(_load(path)) == {PATCH_TERMINATION_LEAN}, name
        if name == "termination-lean-unpinned":
            continue
        regular = set(_activities(path))
        assert not regular & short, (name, regular)
        local = _local_activities(path)
        assert local[0] == "begin_termination", (name, local)
    # Unpinned, begin_termination tells a retry by its attempt: a regular activity, the rest local.
    unpinned = HISTORIES / "termination-lean-unpinned.json"
    assert _activities(unpinned) == ["begin_termination", "drain_node", "terminate_instance"]
    assert "begin_termination" not in _local_activities(unpinned)
    plain = HISTORIES / "termination-lean.json"
    assert len(_events(plain)) <= 30
    assert _activities(plain) == ["drain_node", "terminate_instance"]
    assert _local_activities(plain) == [
        "begin_termination",
        "termination_gate",
        "taint_for_termination",
        "await_volumes_detached",
        "remove_finalizer",
    ]
    assert _activities(HISTORIES / "termination-lean-drain-retries.json").count("drain_node") == 1
    assert _activities(HISTORIES / "termination-lean-failed.json")[-1] == "record_event"
    assert _activities(HISTORIES / "termination-lean-handover.json") == [
        "await_karpenter_termination",
        "terminate_instance",
    ]
    assert _local_activities(HISTORIES / "termination-lean-controls-gate.json").count("termination_gate") == 2
    for older in (
        "termination",
        "termination-pinned",
        "termination-drain-retries",
        "termination-failed",
        "termination-controls-gate",
        "termination-handover",
    ):
        assert PATCH_TERMINATION_LEAN not in _patches(_load(HISTORIES / f"{older}.json")), older


def test_every_workflow_has_recorded_histories():
    assert {p.stem for p in HISTORIES.glob("*.json")} >= EXPECTED


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
async def test_recorded_history_replays_on_the_current_code(path: Path):
    history = WorkflowHistory.from_json(path.stem, await asyncio.to_thread(path.read_text))
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)


# -- the controller (issue 17): a long run, a run cut by its history size, a stopped run -------------


def _delete(nodes: list[str], reason: str, workflow_id: str, validate: bool = False) -> PlannedCommand:
    return PlannedCommand(
        workflow_id=workflow_id,
        method="emptiness" if validate else "drift",
        reason=reason,
        nodes=nodes,
        nodepools=["default"],
        forceful=False,
        needs_validation=validate,
        input=DisruptionInput(reason=reason, nodes=nodes).model_dump(mode="json"),
        planned={},
    )


async def _first_run_closed(handle: WorkflowHandle, client: Client, within: float = 120) -> WorkflowHandle:
    first_run = client.get_workflow_handle(handle.id, run_id=handle.result_run_id)
    for _ in range(int(within * 10)):
        if (await first_run.describe()).status != WorkflowExecutionStatus.RUNNING:
            return first_run
        await asyncio.sleep(0.1)
    raise AssertionError(f"{handle.id}: the first run did not close within {within}s")


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_controller_histories(controller_harness):
    """Every path of a pass in one long run (failed activities, commands started at once and after
    validation, a backoff, a failure listed twice, good and bad signals) until it continues as new;
    a run that continues as new because of its history size; a run an operator stopped."""
    client, queue = controller_harness.client, controller_harness.task_queue
    fake, cluster = controller_harness.controller, controller_harness.cluster
    HISTORIES.mkdir(exist_ok=True)
    cluster.nodes.update({"n1", "n2", "n3", "n4"})
    now = datetime.now(UTC)
    failed = FailedCommand(
        workflow_id="disruption/batch/Drifted/x",
        run_id="r1",
        nodepools=["batch"],
        reason="Drifted",
        closed_at=now,
    )
    fake.reasons = {f"n{i}": "nodepool default has consolidationPolicy WhenEmpty" for i in range(1, 5)}
    fake.script = [
        PassScript(fail={"plan_pass"}),
        PassScript(
            commands=[
                _delete(["n1"], "Drifted", "disruption/default/Drifted/long-1"),
                _delete(["n2"], "Empty", "disruption/default/Empty/long-2", validate=True),
            ],
            orphan_taints=["n9"],
            finalizers={"default": True},
            annotations=[{"node": "n3", "key": "karpenter.sh/voluntary-disruption", "value": "drifted"}],
        ),
        PassScript(
            commands=[_delete(["n3"], "Empty", "disruption/default/Empty/long-3", validate=True)],
            orphan_taints=["n9"],
            fail={"untaint_orphans", "validate_commands"},
        ),
        PassScript(
            failed=[failed],
            commands=[
                _delete(["n4"], "Drifted", "disruption/default/Drifted/long-4").model_copy(
                    update={"nodepools": ["batch"]}
                )
            ],
        ),
        PassScript(failed=[failed]),
    ]
    fake.each_pass = lambda n, f: f.reasons.update({"n4": f"changed in pass {n}"}) if n % 5 == 0 else None
    handle = await client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(
            cluster="replay",
            task_queue=queue,
            interval_seconds=0.05,
            validation_seconds=0.05,
            passes_per_run=30,
        ),
        id=f"karpflow-controller/long/{harness_suffix(queue)}",
        task_queue=queue,
    )
    await asyncio.sleep(0.5)
    offering = {"instance_type": "m5.large", "zone": "us-west-2a", "until": "2099-01-01T00:00:00Z"}
    await handle.signal("offering_unavailable", offering)
    await handle.signal("offering_unavailable", {**offering, "until": "2099-01-01T00:00:00"})
    await handle.signal("wake")
    await handle.signal("no_such_signal", 1)
    first_run = await _first_run_closed(handle, client)
    await _save("controller-long", first_run)
    await client.get_workflow_handle(handle.id).terminate("recorded")

    fake.full_reasons = True
    fake.reasons = {
        f"node-{i:03d}": f"left alone for a reason about this long: {'x' * 50}" for i in range(200)
    }
    handle = await client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(cluster="replay", task_queue=queue, interval_seconds=0.01, max_history_bytes=60_000),
        id=f"karpflow-controller/history-limit/{harness_suffix(queue)}",
        task_queue=queue,
    )
    first_run = await _first_run_closed(handle, client)
    await _save("controller-history-limit", first_run)
    await client.get_workflow_handle(handle.id).terminate("recorded")

    fake.full_reasons, fake.reasons = False, {"n1": "quiet"}
    handle = await client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(cluster="replay", task_queue=queue, interval_seconds=0.05),
        id=f"karpflow-controller/stopped/{harness_suffix(queue)}",
        task_queue=queue,
    )
    await asyncio.sleep(0.5)
    await handle.signal("stop", {"reason": "recording", "by": "test_replay"})
    await asyncio.wait_for(handle.result(), 60)
    await _save("controller-stopped", handle)


def harness_suffix(queue: str) -> str:
    return queue.rsplit("-", 1)[-1]


def _load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


def _patches(history: WorkflowHistory) -> set[str]:
    """The patch ids a history recorded (Temporal's `core_patch` markers)."""
    found = set()
    for event in history.events:
        if event.HasField("marker_recorded_event_attributes"):
            marker = event.marker_recorded_event_attributes
            if marker.marker_name == "core_patch":
                found.add(json.loads(marker.details["patch-data"].payloads[0].data)["id"])
    return found


def test_the_controller_histories_take_both_sides_of_every_patch():
    """Runs started before a patch replay its old side (no marker), runs started after take the new
    side (marker); both kinds of history are replayed by the test above."""

    patches = {PATCH_COUNT_FAILURES_ONCE, PATCH_BOUNDED_HISTORY}
    assert _patches(_load(HISTORIES / "controller-before-issue-17.json")) == set()
    for name in CONTROLLER_HISTORIES:
        assert _patches(_load(HISTORIES / f"{name}.json")) == patches, name


async def test_without_its_patch_a_run_of_the_older_code_would_not_replay(monkeypatch: pytest.MonkeyPatch):
    """controller-before-issue-17-backoff was recorded by the code before issue 17 (commit 186cbe5;
    a scripted plan_pass: passes 1 and 2 list the same failed command, pass 3 plans a command of its
    NodePool 8 s later; interval 4 s, backoff 6 s). The failure was counted twice, and the doubled
    backoff held the command back; today's count (once) starts it. The patch keeps that run on its
    old path; taking the new path anyway breaks its replay, which is what a running controller would
    have met on upgrade."""
    history = WorkflowHistory.from_json(
        "backoff", (HISTORIES / "controller-before-issue-17-backoff.json").read_text()
    )
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
    monkeypatch.setattr(temporalio.workflow, "patched", lambda patch_id: True)
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(history)


# -- operator controls (issue 19) ----------------------------------------------------------------------


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_operator_controls_termination(harness):
    """Record only these two: `KARPFLOW_RECORD_HISTORIES=1 pytest ... -k operator_controls`."""
    harness.cluster.nodes.add("g1")
    harness.cluster.gate_waits = 1  # a NodeDisruptionBudget without room, once
    handle = await harness.client.start_workflow(
        "TerminationWorkflow",
        TerminationInput(node="g1", uid=harness.cluster.uid("g1"), reason="Manual"),
        id=f"termination/replay/g1/{harness.id('gate')}",
        task_queue=harness.task_queue,
    )
    await _settle(handle)
    await _save("termination-controls-gate", handle)

    harness.cluster.nodes.update({"a1", "a2"})
    for node, name in (("a1", "disruption-approved"), ("a2", "disruption-rejected-by-timeout")):
        gated = _disruption([node])
        gated.approval = Approval(timeout=timedelta(hours=1), savings_per_hour=0.05)
        handle = await harness.client.start_workflow(
            "DisruptionWorkflow",
            gated,
            id=f"disruption/replay/{harness.id(name)}",
            task_queue=harness.task_queue,
        )
        if name == "disruption-approved":
            await _approve_when_waiting(handle)
        await _settle(handle)
        await _save(name, handle)


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_operator_controls_controller(controller_harness):
    """A run that tidies the controls, is paused by NodePool and resumed, then continues as new (on
    the dev server: updates are its to test)."""
    client, queue, fake = (
        controller_harness.client,
        controller_harness.task_queue,
        controller_harness.controller,
    )
    fake.reasons = {"n1": "quiet"}
    bad = ControlCondition(kind="MaintenanceWindow", name="broken", valid=False, message="spec.actions")
    fake.script = [PassScript(upkeep=ControlsUpkeep(conditions=[bad], stale_claims=1, running=["x"]))]
    handle = await client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(cluster="replay", task_queue=queue, interval_seconds=1, passes_per_run=4),
        id=f"karpflow-controller/controls/{harness_suffix(queue)}",
        task_queue=queue,
    )
    await handle.execute_update(UPDATE_PAUSE, {"scope": "nodepool", "nodepool": "default", "by": "replay"})
    await asyncio.sleep(1.5)
    await handle.execute_update(UPDATE_RESUME, {"scope": "nodepool", "nodepool": "default"})
    first_run = await _first_run_closed(handle, client)
    await _save("controller-operator-controls", first_run)
    await client.get_workflow_handle(handle.id).terminate("recorded")


def test_the_operator_controls_histories_take_the_new_side_of_their_patches():
    controller = _load(HISTORIES / "controller-operator-controls.json")
    assert _patches(controller) == {PATCH_COUNT_FAILURES_ONCE, PATCH_BOUNDED_HISTORY, PATCH_OPERATOR_CONTROLS}
    accepted = [
        e for e in controller.events if e.HasField("workflow_execution_update_accepted_event_attributes")
    ]
    assert len(accepted) == 2  # pause and resume
    assert _patches(_load(HISTORIES / "termination-controls-gate.json")) == {PATCH_CONTROLS_GATE}
    for name in ("disruption-approved", "disruption-rejected-by-timeout"):
        assert PATCH_APPROVAL_GATE in _patches(_load(HISTORIES / f"{name}.json")), name
        # The gate records DisruptionAwaitingApproval before it waits: the first activity of the run.
        scheduled = [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in _load(HISTORIES / f"{name}.json").events
            if e.HasField("activity_task_scheduled_event_attributes")
        ]
        assert scheduled[0] == "record_event", (name, scheduled)
        assert ("taint_disrupted" in scheduled) == (name == "disruption-approved"), (name, scheduled)
    assert PATCH_APPROVAL_GATE not in _patches(_load(HISTORIES / "disruption-replace.json"))
    for older in ("termination", "termination-pinned", "termination-drain-retries"):
        assert PATCH_CONTROLS_GATE not in _patches(_load(HISTORIES / f"{older}.json")), older


# -- issue 21: the lean disruption history ----------------------------------------------------------

LEAN_HISTORIES = (
    "disruption-lean-replace",
    "disruption-lean-rollback",
    "disruption-lean-cancel",
    "disruption-lean-forceful-deadline",
    "disruption-lean-approved",
    "disruption-lean-nodeclaim",
    "disruption-lean-nodeclaim-rollback",
    # Forceful commands recorded before issue 30 (never re-record): a replacement that ended, and a
    # spot candidate whose termination failed while its replacement was still waited for.
    "disruption-lean-forceful-ended-before-issue-30",
    "disruption-lean-spot-termination-refused-before-issue-30",
)
EXPECTED.update(LEAN_HISTORIES)
# Issue 30, behind its patches as well (test_replay_relaunch.py).
RELAUNCH_HISTORIES = (
    "disruption-lean-forceful-relaunch",
    "disruption-lean-spot-termination-refused",
    "disruption-lean-spot-replacement-lost",
)
EXPECTED.update(RELAUNCH_HISTORIES)
# The steps that stay regular activities on the lean path: the taint (its completion is where a
# cancellation is seen before a launch), the waits, which heartbeat, the approval gate's Event.
LEAN_REGULAR = {
    "taint_disrupted",
    "await_node_ready",
    "await_nodeclaim",
    "terminate_instance",
    "record_event",
}


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_lean_disruption_histories(harness):
    """The disruption's paths behind disruption-lean-history (record only these:
    `KARPFLOW_RECORD_HISTORIES=1 pytest tests/unit/workflows/test_replay.py -k record_lean`)."""
    client, queue, cluster = harness.client, harness.task_queue, harness.cluster
    cluster.nodes.update({"l1", "l2", "l3", "l4", "l5", "l6", "l7"})

    async def run(name: str, command: DisruptionInput, cancel_after: float | None = None) -> WorkflowHandle:
        command.node_uids = {n: cluster.uid(n) for n in command.nodes}
        handle = await client.start_workflow(
            "DisruptionWorkflow", command, id=f"disruption/replay/{harness.id(name)}", task_queue=queue
        )
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            await handle.cancel()
        await _settle(handle)
        await _save(name, handle)
        return handle

    await run("disruption-lean-replace", _disruption(["l1"]))
    cluster.never_initializes = True
    await run("disruption-lean-rollback", _disruption(["l2"]))
    cluster.never_initializes, cluster.never_registers = False, True
    await run("disruption-lean-cancel", _disruption(["l3"]), cancel_after=0.5)
    cluster.never_registers = False

    spot = DisruptionInput(
        reason="Interrupted",
        nodes=["l4"],
        replacements=[ReplacementSpec(nodepool="default", instance_types=["m5.large"], zones=["zone-a"])],
        termination_deadline=datetime.now(UTC) + timedelta(minutes=2),
    )
    spot.timeouts.replacement_ready = timedelta(seconds=1)
    await run("disruption-lean-forceful-deadline", spot)

    gated = _disruption(["l5"])
    gated.approval = Approval(timeout=timedelta(hours=1), savings_per_hour=0.05)
    gated.node_uids = {"l5": cluster.uid("l5")}
    handle = await client.start_workflow(
        "DisruptionWorkflow", gated, id=f"disruption/replay/{harness.id('approved')}", task_queue=queue
    )
    await _approve_when_waiting(handle)
    await _settle(handle)
    await _save("disruption-lean-approved", handle)

    cluster.karpenter_coexistence = True
    await run("disruption-lean-nodeclaim", _disruption(["l6"]))
    cluster.karpenter_gives_up = True
    await run("disruption-lean-nodeclaim-rollback", _disruption(["l7"]))


def _local_activities(path: Path) -> list[str]:
    """The local activities a history recorded (`core_local_activity` markers), in order."""
    found = []
    for event in _events(path):
        marker = event.get("markerRecordedEventAttributes")
        if marker and marker["markerName"] == "core_local_activity":
            data = marker["details"]["data"]["payloads"][0]["data"]
            found.append(json.loads(base64.b64decode(data))["activity_type"])
    return found


def test_the_lean_histories_take_one_patch_and_run_the_short_calls_locally():
    """Runs on the lean path record its marker and none of the older disruption patches (which it
    implies); the short calls are local activities (markers), the waits and the taint regular; every
    older disruption history records no lean marker and replays on its old side."""
    for name in LEAN_HISTORIES:
        path = HISTORIES / f"{name}.json"
        assert _patches(_load(path)) == {PATCH_LEAN_HISTORY}, name
        assert set(_activities(path)) <= LEAN_REGULAR, (name, _activities(path))
        assert "taint_disrupted" in _activities(path), name
    # Issue 21's goal for a disruption's history (the approval's update and timer cost more: 52
    # events, from 73; beside Karpenter, 47 from 61 until disruption-nodeclaim-one-wait made it 36).
    for name in ("replace", "rollback", "cancel", "forceful-deadline"):
        events = _events(HISTORIES / f"disruption-lean-{name}.json")
        assert len(events) <= 40, (name, len(events))
    replace = HISTORIES / "disruption-lean-replace.json"
    assert _local_activities(replace) == ["resolve_replacement", "launch_instance"]
    assert _activities(replace) == ["taint_disrupted", "await_node_ready"]
    assert _child_ids(replace) == ["termination/fake/l1/uid-l1"]
    rollback = HISTORIES / "disruption-lean-rollback.json"
    assert _local_activities(rollback) == [
        "resolve_replacement",
        "launch_instance",
        "untaint_disrupted",
        "find_command_instances",
        "release_node",
    ]
    assert _activities(rollback) == ["taint_disrupted", "await_node_ready", "terminate_instance"]
    claims = HISTORIES / "disruption-lean-nodeclaim-rollback.json"
    assert "create_nodeclaim" in _local_activities(claims) and "delete_nodeclaims" in _local_activities(
        claims
    )
    assert _activities(HISTORIES / "disruption-lean-approved.json")[0] == "record_event"
    for older in HISTORIES.glob("disruption-*.json"):
        if older.stem not in {
            *LEAN_HISTORIES,
            *ONE_WAIT_HISTORIES,
            *FAULT_PATH_HISTORIES,
            FORCEFUL_FAILED,
            FORCEFUL_FAILED_BEFORE,
            *RELAUNCH_HISTORIES,
        }:
            assert PATCH_LEAN_HISTORY not in _patches(_load(older)), older.stem


# -- issue 21: one wait for a NodeClaim beside Karpenter -----------------------------------------------

ONE_WAIT_HISTORIES = ("disruption-nodeclaim-one-wait", "disruption-nodeclaim-one-wait-rollback")
EXPECTED.update(ONE_WAIT_HISTORIES)
# The paths the fault matrix changed (issue 30), recorded on the lean path before and after the change:
# test_replay_fault_paths.py records them and checks which side of each patch each takes.
FAULT_PATH_CHANGES = (
    "disruption-approval-canceled",
    "disruption-listing-failed",
    "termination-event-canceled",
    "disruption-child-canceled",
)
FAULT_PATH_HISTORIES = (*FAULT_PATH_CHANGES, *(f"{name}-before-issue-30" for name in FAULT_PATH_CHANGES))
EXPECTED.update(FAULT_PATH_HISTORIES)


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_nodeclaim_one_wait_histories(harness):
    """Beside Karpenter, after disruption-nodeclaim-one-wait (record only these:
    `KARPFLOW_RECORD_HISTORIES=1 pytest tests/unit/workflows/test_replay.py -k record_nodeclaim_one`)."""
    client, queue, cluster = harness.client, harness.task_queue, harness.cluster
    cluster.nodes.update({"w1", "w2"})
    cluster.karpenter_coexistence = True
    for name, node in zip(ONE_WAIT_HISTORIES, ("w1", "w2"), strict=True):
        command = _disruption([node])
        command.node_uids = {node: cluster.uid(node)}
        handle = await client.start_workflow(
            "DisruptionWorkflow", command, id=f"disruption/replay/{harness.id(name)}", task_queue=queue
        )
        await _settle(handle)
        await _save(name, handle)
        cluster.karpenter_gives_up = True  # the second: Karpenter deletes the NodeClaim, a rollback


def test_beside_karpenter_a_replacement_is_one_wait_and_the_history_meets_the_goal():
    """The three waits (Launched, Registered, Initialized) are one: 47 events to 36, within issue
    21's goal of 40; the rollback still deletes the NodeClaim. Older lean NodeClaim runs never
    recorded the patch and replay on the three waits."""
    done = HISTORIES / "disruption-nodeclaim-one-wait.json"
    assert _patches(_load(done)) == {PATCH_LEAN_HISTORY, PATCH_NODECLAIM_ONE_WAIT}
    assert _activities(done) == ["taint_disrupted", "await_nodeclaim"]
    assert _local_activities(done) == ["resolve_replacement", "create_nodeclaim"]
    assert len(_events(done)) <= 40, len(_events(done))
    rollback = HISTORIES / "disruption-nodeclaim-one-wait-rollback.json"
    assert _activities(rollback) == ["taint_disrupted", "await_nodeclaim"]
    assert "delete_nodeclaims" in _local_activities(rollback)
    for older in ("disruption-lean-nodeclaim", "disruption-lean-nodeclaim-rollback"):
        assert PATCH_NODECLAIM_ONE_WAIT not in _patches(_load(HISTORIES / f"{older}.json")), older


async def test_a_lean_nodeclaim_run_of_the_older_code_would_not_replay_with_one_wait(
    monkeypatch: pytest.MonkeyPatch,
):
    """What the patch is for: the lean NodeClaim history of before replays as it was recorded, and
    breaks if the one wait is forced on it."""
    history = _load(HISTORIES / "disruption-lean-nodeclaim.json")
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
    monkeypatch.setattr(
        temporalio.workflow,
        "patched",
        lambda patch_id: patch_id in (PATCH_LEAN_HISTORY, PATCH_NODECLAIM_ONE_WAIT),
    )
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(history)


async def test_a_run_of_the_older_disruption_code_would_not_replay_on_the_lean_path(
    monkeypatch: pytest.MonkeyPatch,
):
    """disruption-replace-pinned was recorded before disruption-lean-history: it replays on the old
    side; forcing the lean side on it (local activities, one wait, fewer upserts) breaks its replay,
    which is what a running disruption would have met on upgrade without the patch."""
    history = _load(HISTORIES / "disruption-replace-pinned.json")
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
    monkeypatch.setattr(temporalio.workflow, "patched", lambda patch_id: patch_id == PATCH_LEAN_HISTORY)
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(history)


# -- issue 30: a failed termination under a deadline discards the replacement still on its way --------

FORCEFUL_FAILED = "disruption-lean-forceful-deadline-failed"
FORCEFUL_FAILED_BEFORE = "disruption-lean-forceful-deadline-failed-before-issue-30"
EXPECTED.update({FORCEFUL_FAILED, FORCEFUL_FAILED_BEFORE})


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_forceful_failure_history(harness):
    """A spot command whose candidate's termination fails (its instance refused as not owned) while
    its replacement waits to register (record only this: `KARPFLOW_RECORD_HISTORIES=1 pytest
    tests/unit/workflows/test_replay.py -k record_forceful_failure`). Recorded once on the code before
    forceful-deadline-discard-on-failure under FORCEFUL_FAILED_BEFORE (KARPFLOW_HISTORY_NAME; never
    re-recorded under that name), and on today's code under FORCEFUL_FAILED."""
    client, queue, cluster = harness.client, harness.task_queue, harness.cluster
    cluster.nodes.add("f1")
    cluster.never_registers = True
    cluster.refused_terminations.add("i-f1")
    spot = DisruptionInput(
        reason="Interrupted",
        nodes=["f1"],
        node_uids={"f1": cluster.uid("f1")},
        replacements=[ReplacementSpec(nodepool="default", instance_types=["m5.large"], zones=["zone-a"])],
        termination_deadline=datetime.now(UTC) + timedelta(minutes=2),
    )
    spot.timeouts.replacement_ready = timedelta(hours=1)
    handle = await client.start_workflow(
        "DisruptionWorkflow", spot, id=f"disruption/replay/{harness.id('spot-failed')}", task_queue=queue
    )
    await _settle(handle)
    await _save(os.environ.get("KARPFLOW_HISTORY_NAME", FORCEFUL_FAILED), handle)


def test_the_forceful_failure_discards_its_replacement_behind_its_patch():
    """Today's run asks the patch and terminates the replacement it launched; the older run, which
    never asked, left it running, and replays on that side."""
    from workflows.disruption_patches import PATCH_DISCARD_ON_TERMINATION_FAILURE

    new = HISTORIES / f"{FORCEFUL_FAILED}.json"
    assert _patches(_load(new)) == {PATCH_LEAN_HISTORY, PATCH_DISCARD_ON_TERMINATION_FAILURE}
    assert "terminate_instance" in _activities(new)
    assert _local_activities(new)[-2:] == ["find_command_instances", "release_node"]
    old = HISTORIES / f"{FORCEFUL_FAILED_BEFORE}.json"
    assert _patches(_load(old)) == {PATCH_LEAN_HISTORY}
    assert "terminate_instance" not in _activities(old)
    assert "find_command_instances" not in _local_activities(old)


async def test_a_forceful_failure_of_the_older_code_would_not_replay_with_the_discard(
    monkeypatch: pytest.MonkeyPatch,
):
    """What the patch is for: forcing the discard on the older run's history breaks its replay."""
    history = _load(HISTORIES / f"{FORCEFUL_FAILED_BEFORE}.json")
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
    monkeypatch.setattr(temporalio.workflow, "patched", lambda patch_id: True)
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(history)


# -- issue 30: the controller's garbage collection ---------------------------------------------------

CONTROLLER_GC = "controller-garbage-collection"
EXPECTED.add(CONTROLLER_GC)


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_controller_garbage_collection(controller_harness):
    """A run whose first pass collects an instance, whose next collection fails, then continues as
    new (record only this: `KARPFLOW_RECORD_HISTORIES=1 pytest tests/unit/workflows/test_replay.py -k
    record_controller_garbage`)."""
    from api.garbage_io import CollectedInstance, GarbageCollectionResult

    client, queue, fake = (
        controller_harness.client,
        controller_harness.task_queue,
        controller_harness.controller,
    )
    leak = CollectedInstance(
        instance_id="i-leak",
        nodepool="default",
        command_id="disruption/replay/x@r",
        reason="garbage_collected",
    )
    fake.garbage = [GarbageCollectionResult(at=datetime.now(UTC), instances=2, collected=[leak])]
    fake.script = [PassScript(), PassScript(), PassScript(fail={"collect_garbage"})]
    handle = await client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(
            cluster="replay", task_queue=queue, interval_seconds=1, passes_per_run=4, gc_interval_seconds=1.5
        ),
        id=f"karpflow-controller/gc/{harness_suffix(queue)}",
        task_queue=queue,
    )
    first_run = await _first_run_closed(handle, client)
    await _save(CONTROLLER_GC, first_run)
    await client.get_workflow_handle(handle.id).terminate("recorded")


def test_the_controller_collects_garbage_behind_its_patch():
    from workflows.controller import PATCH_GARBAGE_COLLECTION

    path = HISTORIES / f"{CONTROLLER_GC}.json"
    assert PATCH_GARBAGE_COLLECTION in _patches(_load(path))
    assert _activities(path).count("collect_garbage") >= 2
    recorded_since = {CONTROLLER_GC, "controller-drift-batch", "controller-drift-batch-before-issue-35"}
    for older in HISTORIES.glob("controller*.json"):
        if older.stem not in recorded_since:
            assert PATCH_GARBAGE_COLLECTION not in _patches(_load(older)), older.stem


async def test_a_controller_run_of_the_older_code_would_not_replay_with_the_collection(
    monkeypatch: pytest.MonkeyPatch,
):
    """controller-operator-controls was recorded before the collection: it replays on the old side,
    and forcing the collection on it breaks its replay, as a running controller would have met."""
    from workflows.controller import PATCH_GARBAGE_COLLECTION

    history = _load(HISTORIES / "controller-operator-controls.json")
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
    real = temporalio.workflow.patched
    monkeypatch.setattr(
        temporalio.workflow,
        "patched",
        lambda patch_id: patch_id == PATCH_GARBAGE_COLLECTION or real(patch_id),
    )
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(history)


# -- issue 35: a pass starts its batch of drift commands at once ---------------------------------------

CONTROLLER_DRIFT_BATCH = "controller-drift-batch"
# Recorded by the controller before issue 35 (commit 5fd2a61: one child started after another); never
# re-record it: it proves that a run of that code replays on the old side of the patch.
CONTROLLER_DRIFT_BATCH_BEFORE = "controller-drift-batch-before-issue-35"
EXPECTED.update({CONTROLLER_DRIFT_BATCH, CONTROLLER_DRIFT_BATCH_BEFORE})


async def _record_drift_batch(controller_harness, name: str) -> None:
    """A pass that starts four drift commands and a consolidation command validated with another,
    then quiet passes until the run continues as new."""
    client, queue = controller_harness.client, controller_harness.task_queue
    fake, cluster = controller_harness.controller, controller_harness.cluster
    nodes = [f"d{i}" for i in range(6)]
    cluster.nodes.update(nodes)
    fake.script = [
        PassScript(
            commands=[
                *(_delete([n], "Drifted", f"disruption/default/Drifted/batch-{n}") for n in nodes[:4]),
                _delete(["d4"], "Empty", "disruption/default/Empty/batch-d4", validate=True),
                _delete(["d5"], "Empty", "disruption/default/Empty/batch-d5", validate=True),
            ]
        ),
    ]
    handle = await client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(
            cluster="replay",
            task_queue=queue,
            interval_seconds=0.05,
            validation_seconds=0.05,
            passes_per_run=3,
        ),
        id=f"karpflow-controller/drift-batch/{harness_suffix(queue)}",
        task_queue=queue,
    )
    first_run = await _first_run_closed(handle, client)
    await _save(name, first_run)
    await client.get_workflow_handle(handle.id).terminate("recorded")


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_controller_drift_batch(controller_harness):
    """Record only this: `KARPFLOW_RECORD_HISTORIES=1 pytest tests/unit/workflows/test_replay.py -k
    record_controller_drift_batch`."""
    await _record_drift_batch(controller_harness, CONTROLLER_DRIFT_BATCH)


def _child_starts_per_task(path: Path) -> list[int]:
    """How many children each workflow task of a recorded history started (tasks that started any)."""
    counts, current = [], 0
    for event in _events(path):
        if "startChildWorkflowExecutionInitiatedEventAttributes" in event:
            current += 1
        elif "workflowTaskCompletedEventAttributes" in event and current:
            counts.append(current)
            current = 0
    return [*counts, current] if current else counts


def test_the_controller_starts_a_pass_commands_together_behind_its_patch():
    """Four drift commands in one workflow task, then the two validated ones in another; the run
    recorded before the patch started them one task each, and replays on that side."""
    from workflows.controller import PATCH_CONCURRENT_STARTS

    path = HISTORIES / f"{CONTROLLER_DRIFT_BATCH}.json"
    assert PATCH_CONCURRENT_STARTS in _patches(_load(path))
    assert _child_starts_per_task(path) == [4, 2]
    before = HISTORIES / f"{CONTROLLER_DRIFT_BATCH_BEFORE}.json"
    assert _child_starts_per_task(before) == [1, 1, 1, 1, 1, 1]
    for older in HISTORIES.glob("controller*.json"):
        if older.stem != CONTROLLER_DRIFT_BATCH:
            assert PATCH_CONCURRENT_STARTS not in _patches(_load(older)), older.stem


async def test_a_controller_run_of_the_older_code_replays_on_either_side_of_the_patch(
    monkeypatch: pytest.MonkeyPatch,
):
    """Measured, not assumed: the same commands in the same order, only in fewer workflow tasks, replay
    against the older run too (Temporal matches commands to the history's in sequence). The patch is
    there by the rule (docs/workflow-changes.md): a run started on the older code keeps its pace."""
    from workflows.controller import PATCH_CONCURRENT_STARTS

    history = _load(HISTORIES / f"{CONTROLLER_DRIFT_BATCH_BEFORE}.json")
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
    real = temporalio.workflow.patched
    monkeypatch.setattr(
        temporalio.workflow,
        "patched",
        lambda patch_id: patch_id == PATCH_CONCURRENT_STARTS or real(patch_id),
    )
    await replayer.replay_workflow(history)
