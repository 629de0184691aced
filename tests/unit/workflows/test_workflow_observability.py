"""What the workflows show operators, on the time-skipping server with fake activities: a one-line
summary on every activity, Events asked of the activities that act (candidates named and pinned),
phase durations, decisions and rollbacks through the workflow metric meter (read back through the
same bridge /metrics uses), and the summary, details and memo the controller sets on what it starts.

The worker here runs on a Temporal runtime whose metrics go to a buffer, as the real worker's do.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.runtime import MetricBuffer, MetricBufferDurationFormat, Runtime, TelemetryConfig
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from api.activity_io import NodeRef
from api.controller_io import ControllerInput, PlannedCommand
from api.workflow_io import DisruptionInput, ReplacementSpec
from planner import why_not
from runtime.connections import with_karpflow_converter
from runtime.metrics import TemporalMetrics
from tests.unit.workflows.controller_fakes import FakeController, PassScript, other_activities
from tests.unit.workflows.fakes import FakeCluster
from worker import WORKFLOWS
from workflows import events as workflow_events
from workflows.disruption import DisruptionWorkflow


@dataclass
class Metered:
    client: Client
    cluster: FakeCluster
    controller: FakeController
    metrics: TemporalMetrics
    task_queue: str

    def id(self, prefix: str) -> str:
        return f"{prefix}/{uuid.uuid4().hex[:8]}"

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in self.metrics.collect()
            for s in family.samples
        }

    def value(self, name: str, **labels: str) -> float:
        return sum(v for (n, ls), v in self.samples().items() if n == name and set(labels.items()) <= set(ls))


@pytest_asyncio.fixture
async def metered(time_skipping_env: WorkflowEnvironment, ts_client: Client) -> AsyncIterator[Metered]:
    # ts_client registers karpflow's search attributes on the server
    buffer = MetricBuffer(10_000, MetricBufferDurationFormat.SECONDS)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    client = with_karpflow_converter(
        await Client.connect(time_skipping_env.client.service_client.config.target_host, runtime=runtime)
    )
    cluster, controller = FakeCluster(), FakeController()
    task_queue = f"metered-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=list(WORKFLOWS),
        activities=[*controller.activities(), *other_activities(cluster)],
    ):
        yield Metered(client, cluster, controller, TemporalMetrics(buffer), task_queue)


def replace(nodes: list[str]) -> DisruptionInput:
    spec = ReplacementSpec(nodepool="default", instance_types=["m5.large"], zones=["zone-a"])
    return DisruptionInput(
        reason="Underutilized",
        nodes=nodes,
        node_uids={n: f"uid-{n}" for n in nodes},
        replacements=[spec],
    )


async def summaries(handle: WorkflowHandle) -> list[str]:
    """The one-line summary of each activity the workflow ran, in order: a regular activity's on its
    ActivityTaskScheduled event, a local activity's on its marker (what the Web UI shows for each)."""
    out = []
    async for event in handle.fetch_history_events():
        if event.event_type in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
            EventType.EVENT_TYPE_MARKER_RECORDED,
        ) and event.user_metadata.HasField("summary"):
            out.append(json.loads(event.user_metadata.summary.data))
    return out


async def test_a_replace_summarizes_every_step_names_its_candidates_and_times_its_phases(metered):
    first, second = metered.id("ip-10-0-1-2").replace("/", "-"), metered.id("ip-10-0-1-3").replace("/", "-")
    metered.cluster.nodes.update({first, second})
    metered.cluster.pods_on[first] = 3
    handle = await metered.client.start_workflow(
        DisruptionWorkflow.run,
        replace([first, second]),
        id=metered.id("disruption/default/Underutilized"),
        task_queue=metered.task_queue,
    )
    status = await handle.result()
    assert status.phase == "Succeeded"
    steps = await summaries(handle)
    assert steps[:2] == ["taint 2 nodes", "replacement 0: read NodePool default and its EC2NodeClass"]
    assert steps[2] == "launch m5.large on-demand in zone-a"
    instance = status.replacements[0].instance_id
    # Registration and initialization are one wait (await_node_ready, disruption-lean-history).
    assert steps[3] == f"wait for {instance} (m5.large) to register and initialize"
    # The activities that act get the candidates, pinned to their UIDs, for their Events.
    pinned = [NodeRef(node=first, uid=f"uid-{first}"), NodeRef(node=second, uid=f"uid-{second}")]
    (launch,) = metered.cluster.requests["launch_instance"]
    assert launch.candidates == pinned and launch.reason == "Underutilized"
    assert metered.cluster.requests["await_node_registered"][0].candidates == pinned
    assert metered.cluster.requests["await_node_initialized"][0].candidates == pinned
    # The termination of the first candidate says how many pods its drain starts with.
    termination = metered.client.get_workflow_handle(status.candidates[0].termination_id)
    drain = [s for s in await summaries(termination) if s.startswith("drain ")]
    assert drain == [f"drain {first}: 3 pods left"], drain
    # Phase durations, by workflow type and phase, recorded once each.
    phases = "karpflow_workflow_phase_duration_seconds_count"
    for phase in ("Tainting", "Launching", "WaitingForReplacements", "Terminating"):
        assert metered.value(phases, workflow_type="DisruptionWorkflow", phase=phase) == 1, phase
    for phase in ("Starting", "Tainting", "Draining", "TerminatingInstance", "RemovingFinalizer"):
        assert metered.value(phases, workflow_type="TerminationWorkflow", phase=phase) == 2, phase
    assert metered.value("karpflow_disruption_rollbacks_total") == 0


async def test_a_rollback_is_counted_and_its_untaint_carries_why_for_the_event(metered):
    node = metered.id("ip-10-0-2-2").replace("/", "-")
    metered.cluster.nodes.add(node)
    metered.cluster.never_initializes = True
    command = replace([node])
    command.timeouts.replacement_ready = timedelta(seconds=1)
    handle = await metered.client.start_workflow(
        DisruptionWorkflow.run,
        command,
        id=metered.id("disruption/default/Underutilized"),
        task_queue=metered.task_queue,
    )
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert failure.value.cause.type == "DisruptionFailed"
    (untaint,) = metered.cluster.requests["untaint_disrupted"]
    assert untaint.rolled_back.startswith("replacement 0 ") and "did not initialize" in untaint.rolled_back
    assert f"roll back: untaint {node}" in await summaries(handle)
    assert metered.value("karpflow_disruption_rollbacks_total", reason="Underutilized") == 1
    phases = "karpflow_workflow_phase_duration_seconds_count"
    assert metered.value(phases, workflow_type="DisruptionWorkflow", phase="RollingBack") == 1


def planned(workflow_id: str, nodes: list[str], **extra: Any) -> PlannedCommand:
    return PlannedCommand(
        workflow_id=workflow_id,
        method="multi-node-consolidation",
        reason="Underutilized",
        nodes=nodes,
        nodepools=["default"],
        forceful=False,
        needs_validation=False,
        savings_per_hour=0.0416,
        input=DisruptionInput(reason="Underutilized", nodes=nodes).model_dump(mode="json"),
        planned={},
        **extra,
    )


async def test_the_controller_starts_a_command_with_its_summary_and_memo_and_counts_the_decision(metered):
    node = metered.id("ip-10-0-3-3").replace("/", "-")
    metered.cluster.nodes.add(node)
    child = metered.id("disruption/c/default/Underutilized")
    memo = {"command": "karpflow controller (karpflow-controller/c)", "reason": "Underutilized"}
    summary = "Underutilized: delete 1 node: ip-10-0-3-3, saves $0.0416/h"
    metered.controller.script = [
        PassScript(
            commands=[
                planned(
                    child,
                    [node],
                    decision="delete",
                    consolidation_type="multi",
                    summary=summary,
                    details="**Underutilized** (multi-node-consolidation, delete)",
                    memo=memo,
                )
            ]
        ),
        # a result from a worker of the previous version: no decision, summary or memo
        PassScript(commands=[planned(metered.id("disruption/c/default/Underutilized"), [node])]),
    ]
    handle = await metered.client.start_workflow(
        "ControllerWorkflow",
        ControllerInput(cluster="c", task_queue=metered.task_queue, interval_seconds=0.05),
        id=metered.id("karpflow-controller/c"),
        task_queue=metered.task_queue,
    )
    try:
        described = None
        for _ in range(200):
            try:
                described = await metered.client.get_workflow_handle(child).describe()
                break
            except Exception:
                await asyncio.sleep(0.05)
        assert described is not None
        assert await described.static_summary() == summary
        assert (await described.static_details()).startswith("**Underutilized**")
        assert await described.memo() == memo
        for _ in range(200):
            if metered.value("karpenter_voluntary_disruption_decisions_total") >= 2:
                break
            await asyncio.sleep(0.05)
        decisions = "karpenter_voluntary_disruption_decisions_total"
        labels = {"decision": "delete", "reason": "Underutilized", "workflow_type": "ControllerWorkflow"}
        assert metered.value(decisions, consolidation_type="multi", **labels) == 1
        assert metered.value(decisions, consolidation_type="", **labels) == 1  # derived from the input
    finally:
        await handle.terminate("test over")


@workflow.defn(name="GateEventsProbe")
class GateEventsProbe:
    """What the approval and NDB gates (issue 19) call: one line each."""

    @workflow.run
    async def run(self) -> None:
        pinned = [NodeRef(node="ip-10-0-4-4", uid="uid-a"), NodeRef(node="ip-10-0-4-5", uid="uid-b")]
        await workflow_events.awaiting_approval(pinned, "disruption/c/default/Drifted/1")
        await workflow_events.waiting_node_disruption_budget(
            pinned[0], "ingress", "NodeDisruptionBudget ingress allows 0 (maxUnavailable 1)"
        )


async def test_the_gates_record_their_events_in_one_call_on_the_pinned_nodes(ts_client):
    cluster = FakeCluster()
    task_queue = f"gates-{uuid.uuid4().hex[:8]}"
    async with Worker(
        ts_client,
        task_queue=task_queue,
        workflows=[GateEventsProbe],
        activities=[cluster.record_event],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        await ts_client.execute_workflow(GateEventsProbe.run, id=f"gates/{task_queue}", task_queue=task_queue)
    recorded = sorted((e.reason, e.name, e.uid, e.message) for e in cluster.events)
    approval = "Disruption disruption/c/default/Drifted/1 waits for approval"
    assert recorded == [
        ("DisruptionAwaitingApproval", "ip-10-0-4-4", "uid-a", approval),
        ("DisruptionAwaitingApproval", "ip-10-0-4-5", "uid-b", approval),
        (
            "DisruptionWaitingNodeDisruptionBudget",
            "ip-10-0-4-4",
            "uid-a",
            "NodeDisruptionBudget ingress allows 0 (maxUnavailable 1)",
        ),
    ]
    # the approval's words are the controller pass's for the same wait: one Event, counted
    held = why_not.in_flight_reason("disruption/c/default/Drifted/1", why_not.AWAITING_APPROVAL_PHASE)
    assert why_not.event_for(held) == ("DisruptionAwaitingApproval", approval)
