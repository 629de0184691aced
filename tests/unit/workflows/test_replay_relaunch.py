"""Issue 30's two changes to forceful commands, each behind its patch; the runs of the code before
them must still replay:

- `disruption-forceful-relaunch`: a replacement whose instance ended is terminated and launched again
  (another offering);
- `forceful-replacements-outlive-failed-terminations`: with a termination deadline (a spot
  interruption), a candidate's failed termination no longer cancels the replacement being waited for.

    KARPFLOW_RECORD_HISTORIES=1 .venv/bin/pytest tests/unit/workflows/test_replay_relaunch.py -k record

records `disruption-lean-forceful-relaunch` and `disruption-lean-spot-termination-refused`. The
`...-before-issue-30` histories were recorded by the same tests on the code before each patch and are
never re-recorded: the ended replacement discarded without a relaunch, and the replacement's wait
cancelled when the candidate's termination failed.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import temporalio.workflow
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from api.workflow_io import DisruptionInput, ReplacementSpec
from tests.unit.workflows.test_replay import (
    HISTORIES,
    RECORD,
    _activities,
    _child_ids,
    _events,
    _load,
    _patches,
    _save,
    _settle,
)
from worker import WORKFLOWS
from workflows.disruption_patches import (
    PATCH_FORCEFUL_RELAUNCH,
    PATCH_LEAN_HISTORY,
    PATCH_RECHECK_AFTER_DRAIN,
    PATCH_REPLACEMENTS_OUTLIVE,
)

RELAUNCH = "disruption-lean-forceful-relaunch"
BEFORE = "disruption-lean-forceful-ended-before-issue-30"
ENDED = "m5.large/zone-a/on-demand"


def _expired(node: str) -> DisruptionInput:
    spec = ReplacementSpec(nodepool="default", instance_types=["m5.large", "m5.xlarge"], zones=["zone-a"])
    return DisruptionInput(reason="Expired", nodes=[node], replacements=[spec])


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_forceful_relaunch_history(harness):
    cluster = harness.cluster
    cluster.nodes.add("r1")
    cluster.ends_before_registering.add(ENDED)
    command = _expired("r1")
    command.node_uids = {"r1": cluster.uid("r1")}
    handle = await harness.client.start_workflow(
        "DisruptionWorkflow",
        command,
        id=f"disruption/replay/{harness.id(RELAUNCH)}",
        task_queue=harness.task_queue,
    )
    await _settle(handle)
    await _save(RELAUNCH, handle)


SPOT_REFUSED = "disruption-lean-spot-termination-refused"
SPOT_REFUSED_BEFORE = "disruption-lean-spot-termination-refused-before-issue-30"


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_spot_termination_refused_history(harness):
    """A spot interruption whose candidate's termination fails (its instance lost its ownership tag)
    while the replacement still launches."""
    cluster = harness.cluster
    cluster.nodes.add("s1")
    cluster.not_owned.add("i-s1")
    cluster.never_registers = True  # still waited for when the termination fails
    spec = ReplacementSpec(nodepool="default", instance_types=["m5.large"], zones=["zone-a"])
    command = DisruptionInput(
        reason="Interrupted",
        nodes=["s1"],
        node_uids={"s1": cluster.uid("s1")},
        replacements=[spec],
        termination_deadline=datetime.now(UTC) + timedelta(minutes=2),
    )
    # The test server does not skip time while an activity runs: a short wait keeps this fast.
    command.timeouts.replacement_ready = timedelta(seconds=2)
    handle = await harness.client.start_workflow(
        "DisruptionWorkflow",
        command,
        id=f"interruption/replay/{harness.id(SPOT_REFUSED)}",
        task_queue=harness.task_queue,
    )
    await _settle(handle)
    await _save(SPOT_REFUSED, handle)


SPOT_LOST = "disruption-lean-spot-replacement-lost"


@pytest.mark.skipif(not RECORD, reason="set KARPFLOW_RECORD_HISTORIES=1 to re-record the histories")
async def test_record_spot_replacement_lost_history(harness):
    """A spot interruption whose replacement initialized and was gone when the drain ended."""
    cluster = harness.cluster
    cluster.nodes.add("s2")
    cluster.lose_initialized_replacements = True
    spec = ReplacementSpec(nodepool="default", instance_types=["m5.large", "m5.xlarge"], zones=["zone-a"])
    command = DisruptionInput(
        reason="Interrupted",
        nodes=["s2"],
        node_uids={"s2": cluster.uid("s2")},
        replacements=[spec],
        termination_deadline=datetime.now(UTC) + timedelta(minutes=2),
    )
    handle = await harness.client.start_workflow(
        "DisruptionWorkflow",
        command,
        id=f"interruption/replay/{harness.id(SPOT_LOST)}",
        task_queue=harness.task_queue,
    )
    await _settle(handle)
    await _save(SPOT_LOST, handle)


def _launches(path: Path) -> list[str]:
    """The offerings the local `launch_instance` calls of a history launched, in order."""
    found = []
    for event in _events(path):
        marker = event.get("markerRecordedEventAttributes")
        if not marker or marker["markerName"] != "core_local_activity":
            continue
        data = json.loads(base64.b64decode(marker["details"]["data"]["payloads"][0]["data"]))
        if data["activity_type"] == "launch_instance":
            result = marker["details"]["result"]["payloads"][0]["data"]
            found.append(json.loads(base64.b64decode(result))["offering"]["instance_type"])
    return found


def test_the_relaunch_history_takes_its_patch_and_the_older_one_does_not():
    relaunch, before = HISTORIES / f"{RELAUNCH}.json", HISTORIES / f"{BEFORE}.json"
    assert _patches(_load(relaunch)) == {PATCH_LEAN_HISTORY, PATCH_FORCEFUL_RELAUNCH}
    assert _patches(_load(before)) == {PATCH_LEAN_HISTORY}
    # The ended m5.large is terminated, then m5.xlarge launched and waited for; then the candidate goes.
    assert _launches(relaunch) == ["m5.large", "m5.xlarge"]
    assert _activities(relaunch) == [
        "taint_disrupted",
        "await_node_ready",
        "terminate_instance",
        "await_node_ready",
    ]
    assert _launches(before) == ["m5.large"]
    for path in (relaunch, before):
        assert _child_ids(path) == ["termination/fake/r1/uid-r1"]


async def test_a_run_of_the_older_code_replays_and_would_not_with_the_relaunch_forced(
    monkeypatch: pytest.MonkeyPatch,
):
    """What the patch is for: the command recorded before it discarded its ended replacement and went
    on; forcing the relaunch on that history breaks its replay."""
    history = _load(HISTORIES / f"{BEFORE}.json")
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
    await replayer.replay_workflow(_load(HISTORIES / f"{RELAUNCH}.json"))
    monkeypatch.setattr(
        temporalio.workflow,
        "patched",
        lambda patch_id: patch_id in (PATCH_LEAN_HISTORY, PATCH_FORCEFUL_RELAUNCH),
    )
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(history)


def test_the_spot_history_waits_for_its_replacement_behind_its_patch():
    after, before = HISTORIES / f"{SPOT_REFUSED}.json", HISTORIES / f"{SPOT_REFUSED_BEFORE}.json"
    assert _patches(_load(after)) == {PATCH_LEAN_HISTORY, PATCH_REPLACEMENTS_OUTLIVE}
    assert _patches(_load(before)) == {PATCH_LEAN_HISTORY}
    # After: the wait runs to its end and what did not initialize is terminated. Before: the wait was
    # cancelled and the launched instance left behind.
    assert _activities(after) == ["taint_disrupted", "await_node_ready", "terminate_instance"]
    assert _activities(before) == ["taint_disrupted", "await_node_ready"]
    kinds = [e["eventType"] for e in _events(before)]
    assert "EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED" in kinds


async def test_a_spot_run_of_the_older_code_replays_and_would_not_with_the_wait_forced(
    monkeypatch: pytest.MonkeyPatch,
):
    history = _load(HISTORIES / f"{SPOT_REFUSED_BEFORE}.json")
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
    await replayer.replay_workflow(_load(HISTORIES / f"{SPOT_REFUSED}.json"))
    monkeypatch.setattr(
        temporalio.workflow,
        "patched",
        lambda patch_id: patch_id in (PATCH_LEAN_HISTORY, PATCH_REPLACEMENTS_OUTLIVE),
    )
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(history)


def test_the_lost_spot_replacement_is_launched_again_behind_its_patch():
    lost = HISTORIES / f"{SPOT_LOST}.json"
    assert _patches(_load(lost)) == {PATCH_LEAN_HISTORY, PATCH_RECHECK_AFTER_DRAIN}
    assert _launches(lost) == ["m5.large", "m5.xlarge"]
    assert _activities(lost) == [
        "taint_disrupted",
        "await_node_ready",
        "terminate_instance",
        "await_node_ready",
    ]


async def test_a_spot_run_of_the_older_code_would_not_replay_with_the_look_again_forced(
    monkeypatch: pytest.MonkeyPatch,
):
    """disruption-lean-forceful-deadline (issue 21) reaches the point where the look again is asked,
    with a replacement initialized: it replays on the old side, and breaks with the patch forced."""
    history = _load(HISTORIES / "disruption-lean-forceful-deadline.json")
    replayer = Replayer(workflows=list(WORKFLOWS), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
    await replayer.replay_workflow(_load(HISTORIES / f"{SPOT_LOST}.json"))
    monkeypatch.setattr(
        temporalio.workflow,
        "patched",
        lambda patch_id: patch_id in (PATCH_LEAN_HISTORY, PATCH_RECHECK_AFTER_DRAIN),
    )
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(history)
