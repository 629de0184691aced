"""Drift within the budget in one pass (issue 35 item 1), on the local stack: a change to the
EC2NodeClass drifts five nodes of a pool whose Drifted budget is 3; one pass starts three drift
commands at once (one workflow task of the controller), never more than three are in flight, and
every node is replaced in the end.

Real parts: the worker with its controller, the Temporal dev server, the emulator, moto, kubectl for
the user's patch."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from api.constants import NODEPOOL_LABEL
from api.workflow_ids import controller_workflow_id
from sim.scenario import scenario_from_documents
from sim.scenarios import generate_demo as gen
from sim.testing import assert_no_violations
from tests.integration.controller.test_controller import FAST
from tests.integration.workflows.conftest import Workload, node

pytestmark = pytest.mark.integration

BUDGET = 3
NODES = [node(f"172.31.7.{10 * i}", "m5.large") for i in range(1, 6)]
WEB = Workload("shop", "web", "250m", "256Mi", [str(10 * i) for i in range(1, 6)] * 2)


def drift_scenario() -> Any:
    listing = copy.deepcopy(gen.scenario_list(NODES, [WEB]))
    for item in listing["items"]:
        if item["kind"] == "NodePool" and item["metadata"]["name"] == "default":
            item["spec"]["disruption"] = {
                "consolidationPolicy": "WhenEmpty",
                "consolidateAfter": "Never",
                "budgets": [{"nodes": str(BUDGET), "reasons": ["Drifted"]}],
            }
    return scenario_from_documents([listing], "drift batch scenario")


async def default_nodes(karpflow: Any) -> set[str]:
    return {
        name
        for name, n in (await karpflow.nodes()).items()
        if (n["metadata"].get("labels") or {}).get(NODEPOOL_LABEL) == "default"
        and not n["metadata"].get("deletionTimestamp")
    }


async def drift_commands(karpflow: Any) -> list[Any]:
    query = f'WorkflowType="DisruptionWorkflow" AND TaskQueue="{karpflow.task_queue}"'
    return [e async for e in karpflow.client.list_workflows(query) if "/Drifted/" in e.id]


def most_at_once(executions: list[Any]) -> int:
    """The most commands running at the same moment (visibility's start and close times)."""
    edges = sorted(
        [(e.start_time, 1) for e in executions] + [(e.close_time, -1) for e in executions if e.close_time]
    )
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


@pytest.mark.sim_stack(scenario=drift_scenario())
async def test_one_pass_starts_the_drifted_budget_at_once_and_never_more(karpflow):
    async with karpflow.worker(**FAST):
        seeded = await default_nodes(karpflow)
        assert len(seeded) == len(NODES)
        patch = {"spec": {"tags": {"rollout": "issue-35"}}}  # the class's hash changes: all drift
        await karpflow.run(
            "kubectl", "patch", "ec2nodeclass", "default", "--type", "merge", "-p", json.dumps(patch),
            **karpflow.stack.client_env(),
        )  # fmt: skip

        async def all_replaced() -> list[Any] | None:
            executions = await drift_commands(karpflow)
            done = [e for e in executions if e.status == WorkflowExecutionStatus.COMPLETED]
            left = await default_nodes(karpflow) & seeded
            return executions if len(done) >= len(NODES) and not left else None

        executions = await karpflow.eventually(all_replaced, within=300, what="every drifted node replaced")
        controller = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
        history = await controller.fetch_history()
    assert all(e.status == WorkflowExecutionStatus.COMPLETED for e in executions), [
        (e.id, e.status) for e in executions
    ]
    # The first pass after the change started the whole budget in one workflow task.
    per_task: dict[int, int] = {}
    for event in history.events:
        if event.HasField("start_child_workflow_execution_initiated_event_attributes"):
            started = event.start_child_workflow_execution_initiated_event_attributes
            if "/Drifted/" in started.workflow_id:
                task = started.workflow_task_completed_event_id
                per_task[task] = per_task.get(task, 0) + 1
    first = per_task[min(per_task)]
    assert first == BUDGET, per_task
    assert max(per_task.values()) <= BUDGET and sum(per_task.values()) == len(NODES), per_task
    assert most_at_once(executions) <= BUDGET
    assert_no_violations(karpflow.stack)
