"""Running workflows survive a code change: recorded histories replay against the current code.

tests/unit/workflows/histories/ holds one history per path that matters (happy path, rollback,
cancel, a drain with retries, the controller starting a command). Temporal's `Replayer` runs the
current workflow code against each; a change that alters the sequence of commands a running
workflow would issue fails here with a non-determinism error, before it reaches a cluster. The
rule for changing workflows is in docs/workflow-changes.md.

Re-record after an intended, versioned change (and say so in the commit):

    KARPFLOW_RECORD_HISTORIES=1 .venv/bin/pytest tests/unit/workflows/test_replay.py
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from api.controller_io import ControllerInput, PlannedCommand
from api.workflow_io import DisruptionInput, ReplacementSpec, TerminationInput
from worker import WORKFLOWS
from workflows.disruption import PATCH_TERMINATION_PER_INCARNATION

HISTORIES = Path(__file__).parent / "histories"
RECORD = os.environ.get("KARPFLOW_RECORD_HISTORIES") == "1"
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


def _events(path: Path) -> list[dict]:
    return json.loads(path.read_text())["events"]


def _child_ids(path: Path) -> list[str]:
    return [
        event["startChildWorkflowExecutionInitiatedEventAttributes"]["workflowId"]
        for event in _events(path)
        if "startChildWorkflowExecutionInitiatedEventAttributes" in event
    ]


def _patches(path: Path) -> list[str]:
    """The workflow.patched ids a history recorded (core's `core_patch` markers)."""
    found = []
    for event in _events(path):
        marker = event.get("markerRecordedEventAttributes") or {}
        if marker.get("markerName") == "core_patch":
            for payload in marker["details"]["patch-data"]["payloads"]:
                found.append(json.loads(base64.b64decode(payload["data"]))["id"])
    return found


def test_the_termination_id_change_replays_both_ways():
    """Runs started before the change started their child as `termination/<node>` and recorded no
    patch; runs started after, as `termination/<cluster>/<node>/<uid>` behind the patch marker.
    Both replay on the current code (test_recorded_history_replays_on_the_current_code)."""
    old = HISTORIES / "disruption-replace.json"
    new = HISTORIES / "disruption-replace-pinned.json"
    assert _child_ids(old) == ["termination/n1"] and _patches(old) == []
    assert _child_ids(new) == ["termination/fake/p1/uid-p1"]
    assert _patches(new) == [PATCH_TERMINATION_PER_INCARNATION]


def test_every_workflow_has_recorded_histories():
    assert {p.stem for p in HISTORIES.glob("*.json")} >= EXPECTED


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
async def test_recorded_history_replays_on_the_current_code(path: Path):
    history = WorkflowHistory.from_json(path.stem, await asyncio.to_thread(path.read_text))
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
