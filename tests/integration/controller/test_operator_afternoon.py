"""An operator's afternoon (issue 31's acceptance), on the local stack with the real worker and
controller, the `karpflow`, `temporal` and `kubectl` commands, and the invariant checker judging
every disruption:

1. NodePool `default` asks for approval; the controller proposes the empty node D1 and waits;
   `karpflow disrupt D1` at the same time starts nothing and names the command that holds D1;
2. the command is rejected; the controller proposes it again under the same id, and it waits again;
3. `batch` is paused, and the pause holds across `karpflow controller stop` + `start`;
4. the annotation is removed: the waiting command goes on by itself and D1 goes;
5. a rollout of `default` goes through a NodeDisruptionBudget of one node at a time;
6. `batch` is resumed and its empty nodes go.

At the end no command is stuck, no node was disrupted twice, nothing of `batch` started while it was
paused, and `karpflow status` shows only what is current.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

from api import search_attributes as sa
from api.rollout_io import RolloutStatus
from api.workflow_io import DisruptionStatus
from sim.testing import assert_no_violations, kubectl
from tests.integration.controller.test_controller import FAST, scenario, status
from tests.integration.controller.test_rollout import ONE_AT_A_TIME, cli_env
from tests.integration.workflows.conftest import DemoNode, Workload, node

pytestmark = [pytest.mark.integration, pytest.mark.slow]

D1, D2, D3 = node("172.31.1.10", "m5.large"), node("172.31.1.20"), node("172.31.1.30")
BATCH = [
    DemoNode(f"172.31.3.{i}", "c5.large", "us-west-2a", "spot", "batch", timedelta(days=1), "empty")
    for i in (31, 32)
]
PODS = [Workload("shop", "web", "100m", "128Mi", ["20", "30"])]
AFTERNOON = {**FAST, "approval_recheck_interval": 1.0}


async def commands(karpflow: Any, where: str = "") -> list[Any]:
    query = f"WorkflowType = 'DisruptionWorkflow' AND TaskQueue = '{karpflow.task_queue}'" + where
    return [e async for e in karpflow.client.list_workflows(query)]


async def waiting_for_approval(karpflow: Any, node_name: str, not_run: str = "") -> Any:
    for execution in await commands(karpflow, " AND ExecutionStatus = 'Running'"):
        attributes = execution.typed_search_attributes
        # Only default's: a first pass planned before the pause reached the controller may propose
        # batch's nodes with D1; that command is judged again within a second and ends Invalidated.
        if (
            node_name in (attributes.get(sa.NODES) or ())
            and attributes.get(sa.NODEPOOL) == "default"
            and attributes.get(sa.PHASE) == "AwaitingApproval"
            and execution.run_id != not_run
        ):
            return execution
    return None


async def terminations_per_node(karpflow: Any) -> dict[str, int]:
    query = f"WorkflowType = 'TerminationWorkflow' AND TaskQueue = '{karpflow.task_queue}'"
    counts: dict[str, int] = {}
    async for execution in karpflow.client.list_workflows(query):
        # One termination id per node incarnation (termination/<cluster>/<node>/<uid>): count ids.
        counts[execution.id] = counts.get(execution.id, 0) + 1
    return counts


async def cli(karpflow: Any, *argv: str, check: bool = True) -> Any:
    return await karpflow.run("karpflow", *argv, check=check, **cli_env(karpflow))


@pytest.mark.slow(seconds=105)
@pytest.mark.sim_stack(scenario=scenario([D1, D2, D3, *BATCH], PODS), time_scale=0.05)
async def test_an_operators_afternoon(karpflow):
    kubectl(karpflow.stack, "annotate", "nodepool", "default", "karpflow.dev/require-approval=true")
    async with karpflow.worker(**AFTERNOON):
        paused = await cli(karpflow, "pause", "--nodepool", "batch", "--reason", "batch freeze")
        assert "batch" in paused.stdout, paused
        paused_at = datetime.now(UTC)

        # 1. The controller proposes D1 and waits; `karpflow disrupt D1` meanwhile starts nothing.
        first = await karpflow.eventually(
            lambda: waiting_for_approval(karpflow, D1.name), within=60, what="D1's command awaiting approval"
        )
        raced = await cli(karpflow, "disrupt", D1.name, "--yes", "--no-follow", check=False)
        assert first.id in raced.stdout + raced.stderr, raced
        running = await commands(karpflow, " AND ExecutionStatus = 'Running'")
        assert [e.id for e in running if D1.name in (e.typed_search_attributes.get(sa.NODES) or ())] == [
            first.id
        ]

        # 2. Rejected, then proposed again under the same id: it waits again.
        rejected = await cli(karpflow, "reject", first.id, "--reason", "not now")
        assert "rejected" in rejected.stdout, rejected
        again = await karpflow.eventually(
            lambda: waiting_for_approval(karpflow, D1.name, not_run=first.run_id),
            within=60,
            what="D1's command proposed again",
        )
        assert again.id == first.id

        # 3. The pause of batch holds across a controller stop and start.
        await cli(karpflow, "controller", "stop", "--reason", "afternoon maintenance")
        started = await cli(karpflow, "controller", "start")
        assert "carried over from the last run: 1 pause(s) (NodePool batch" in started.stdout, started

        # 4. The annotation removed: the waiting command goes on by itself, and D1 goes.
        kubectl(karpflow.stack, "annotate", "nodepool", "default", "karpflow.dev/require-approval-")
        handle = karpflow.client.get_workflow_handle(
            again.id, run_id=again.run_id, result_type=DisruptionStatus
        )
        done = await asyncio.wait_for(handle.result(), timeout=90)
        assert done.phase == "Succeeded" and D1.name not in await karpflow.nodes(), done
        # By itself: nobody sent it an `approve` update.
        history = [e.event_type async for e in handle.fetch_history_events()]
        assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED not in history

        # 5. A rollout of default, one node at a time (NodeDisruptionBudget).
        path = karpflow.log_dir / "ndb.yaml"
        path.write_text(ONE_AT_A_TIME)
        kubectl(karpflow.stack, "apply", "-f", str(path))
        rolled = await cli(karpflow, "rollout", "default")
        rollout_id = rolled.stdout.strip()
        rollout = karpflow.client.get_workflow_handle(rollout_id, result_type=RolloutStatus)
        finished = await asyncio.wait_for(rollout.result(), timeout=180)
        assert finished.phase == "Succeeded" and finished.replaced == finished.total == 2, finished
        # Nothing of batch started while it was paused.
        left = await karpflow.nodes()
        assert all(b.name in left for b in BATCH)

        # 6. Resumed, batch's empty nodes go.
        resumed_at = datetime.now(UTC)
        resumed = await cli(karpflow, "resume", "--nodepool", "batch")
        assert "batch" in resumed.stdout, resumed

        async def batch_gone() -> bool:
            return not {b.name for b in BATCH} & set(await karpflow.nodes())

        await karpflow.eventually(batch_gone, within=120, what="batch's empty nodes consolidated")

        async def settled() -> Any:
            shown = await status(karpflow)
            running = await commands(karpflow, " AND ExecutionStatus = 'Running'")
            return shown if not running and not shown.in_flight else None

        await karpflow.eventually(settled, within=60, what="nothing in flight")
        shown = await cli(karpflow, "status")
        # Only what is current: running, nothing in flight, no pause, no backoff.
        assert f"controller of {karpflow.stack.cluster_name}: running" in shown.stdout, shown.stdout
        for stale in ("in flight:", "paused", "backoffs", "stopped"):
            assert stale not in shown.stdout, shown.stdout

    # No command stuck, no node disrupted twice, nothing of batch started while paused.
    assert not await commands(karpflow, " AND ExecutionStatus = 'Running'")
    assert all(count == 1 for count in (await terminations_per_node(karpflow)).values())
    for execution in await commands(karpflow):
        attributes = execution.typed_search_attributes
        if "batch" in (attributes.get(sa.NODEPOOL) or "").split(",") and paused_at <= execution.start_time:
            # Started while batch was paused: it must not have taken a node (judged again: Invalidated).
            assert execution.start_time >= resumed_at or attributes.get(sa.PHASE) == "Invalidated", (
                execution.id
            )
    assert_no_violations(karpflow.stack)
