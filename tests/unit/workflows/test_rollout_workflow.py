"""RolloutWorkflow on the time-skipping server with fake activities: it marks, follows the nodes by UID
until none remains, continues as new with the remaining ones, survives failed polls, and on cancel
takes its marks off and ends Canceled."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.errors import REFUSED
from api.rollout_io import (
    MarkRequest,
    RemainingRequest,
    RolloutInput,
    RolloutNode,
    RolloutStatus,
    UnmarkRequest,
)
from worker import WORKFLOWS


class FakeNodes:
    """uid -> (name, mark): what the activities would find in the cluster."""

    def __init__(self, count: int) -> None:
        self.nodes = {f"uid-{i}": [f"node-{i}", None] for i in range(count)}
        self.pool_exists = True
        self.failing_polls = 0
        self.polls = 0
        self.slow_marking = 0.0  # seconds the marking takes, without a heartbeat
        self.slow_poll = 0.0

    def gone(self, *indexes: int) -> None:
        for i in indexes:
            self.nodes.pop(f"uid-{i}", None)

    def marks(self) -> dict[str, str | None]:
        return {name: mark for name, mark in self.nodes.values()}

    def activities(self) -> list:
        @activity.defn(name="mark_rollout_nodes")
        async def mark(request: MarkRequest) -> list[RolloutNode]:
            if not self.pool_exists:
                raise ApplicationError(
                    f"no such NodePool {request.nodepool}", type=REFUSED, non_retryable=True
                )
            for entry in self.nodes.values():
                entry[1] = entry[1] or request.rollout_id
            await asyncio.sleep(self.slow_marking)
            return [RolloutNode(name=n, uid=u) for u, (n, _) in sorted(self.nodes.items())]

        @activity.defn(name="rollout_remaining")
        async def remaining(request: RemainingRequest) -> list[RolloutNode]:
            self.polls += 1
            await asyncio.sleep(self.slow_poll)
            if self.failing_polls:
                self.failing_polls -= 1
                raise ApplicationError("apiserver down", type="Unavailable", non_retryable=True)
            return [n for n in request.nodes if n.uid in self.nodes]

        @activity.defn(name="unmark_rollout_nodes")
        async def unmark(request: UnmarkRequest) -> int:
            changed = 0
            for entry in self.nodes.values():
                if entry[1] == request.rollout_id:
                    entry[1] = None
                    changed += 1
            return changed

        return [mark, remaining, unmark]


class Rollouts:
    def __init__(self, client: Client, nodes: FakeNodes, task_queue: str) -> None:
        self.client, self.nodes, self.task_queue = client, nodes, task_queue

    async def start(self, **overrides) -> WorkflowHandle:
        request = RolloutInput(
            cluster="c",
            nodepool="default",
            requested_at=datetime(2026, 1, 1, tzinfo=UTC),
            poll_interval=timedelta(seconds=1),
        ).model_copy(update=overrides)
        return await self.client.start_workflow(
            "RolloutWorkflow",
            request.model_dump(mode="json"),
            id=f"rollout/c/default/{uuid.uuid4().hex[:10]}",
            task_queue=self.task_queue,
            result_type=RolloutStatus,
        )


@pytest_asyncio.fixture
async def rollouts(ts_client: Client) -> AsyncIterator[Rollouts]:
    nodes = FakeNodes(4)
    task_queue = f"unit-{uuid.uuid4().hex[:8]}"
    async with Worker(
        ts_client, task_queue=task_queue, workflows=list(WORKFLOWS), activities=nodes.activities()
    ):
        yield Rollouts(ts_client, nodes, task_queue)


async def status_when(handle: WorkflowHandle, check, within: float = 20) -> RolloutStatus:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        status = await handle.query("status", result_type=RolloutStatus)
        if check(status):
            return status
        assert asyncio.get_running_loop().time() < deadline, status
        await asyncio.sleep(0.1)


async def test_it_marks_the_nodes_shows_progress_and_completes_when_none_remains(rollouts):
    handle = await rollouts.start()
    status = await status_when(handle, lambda s: s.phase == "Rolling" and s.total == 4)
    assert set(rollouts.nodes.marks().values()) == {handle.id}
    rollouts.nodes.gone(0, 1)
    status = await status_when(handle, lambda s: s.replaced == 2)
    assert status.remaining == ["node-2", "node-3"]
    memo = await (await handle.describe()).memo_value("rollout")
    assert memo == {"phase": "Rolling", "total": 4, "replaced": 2, "remaining": 2}
    rollouts.nodes.gone(2, 3)
    done = await handle.result()
    assert (done.phase, done.total, done.replaced, done.remaining) == ("Succeeded", 4, 4, [])


async def test_it_continues_as_new_with_the_remaining_nodes_and_the_total(rollouts):
    handle = await rollouts.start(polls_per_run=2)
    first = (await handle.describe()).run_id
    await status_when(handle, lambda s: s.phase == "Rolling")
    rollouts.nodes.gone(0)
    await status_when(rollouts.client.get_workflow_handle(handle.id), lambda s: s.replaced == 1)
    latest = rollouts.client.get_workflow_handle(handle.id, result_type=RolloutStatus)
    deadline = asyncio.get_running_loop().time() + 20
    while (await latest.describe()).run_id == first:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.1)
    status = await status_when(latest, lambda s: s.total == 4 and s.replaced == 1)
    assert status.remaining == ["node-1", "node-2", "node-3"]
    rollouts.nodes.gone(1, 2, 3)
    done = await latest.result()
    assert (done.phase, done.total, done.replaced) == ("Succeeded", 4, 4)


async def test_a_failed_poll_is_shown_and_the_next_one_goes_on(rollouts):
    rollouts.nodes.failing_polls = 2
    handle = await rollouts.start()
    status = await status_when(handle, lambda s: "could not read the remaining nodes" in s.message)
    assert status.phase == "Rolling"
    rollouts.nodes.gone(0, 1, 2, 3)
    assert (await handle.result()).phase == "Succeeded"
    assert rollouts.nodes.polls >= 3


async def test_cancel_takes_the_marks_off_and_ends_canceled(rollouts):
    handle = await rollouts.start()
    await status_when(handle, lambda s: s.phase == "Rolling")
    rollouts.nodes.gone(0)
    await status_when(handle, lambda s: s.replaced == 1)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    assert set(rollouts.nodes.marks().values()) == {None}
    status = await handle.query("status", result_type=RolloutStatus)
    assert status.phase == "Canceled" and "marks of 3 node(s) taken off" in status.message


async def test_a_nodepool_that_does_not_exist_fails_it_with_nothing_marked(rollouts):
    rollouts.nodes.pool_exists = False
    handle = await rollouts.start()
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert "no such NodePool default" in str(failed.value.cause)
    assert set(rollouts.nodes.marks().values()) == {None}


async def test_an_input_that_does_not_validate_fails_it_with_the_reason(rollouts):
    handle = await rollouts.client.start_workflow(
        "RolloutWorkflow",
        {
            "cluster": "c",
            "nodepool": "default",
            "requested_at": "2026-01-01T00:00:00Z",
            "selector": {"a,b": "c"},
        },
        id=f"rollout/c/default/{uuid.uuid4().hex[:10]}",
        task_queue=rollouts.task_queue,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert "is not a label key" in str(failed.value.cause)


async def test_a_cancel_during_the_marking_is_not_swallowed_and_the_marks_come_off(rollouts):
    rollouts.nodes.slow_marking = 1.0  # finishes despite the cancel: it never heartbeats
    handle = await rollouts.start()
    await status_when(handle, lambda s: s.phase == "Marking")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), timeout=20)
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    assert set(rollouts.nodes.marks().values()) == {None}


async def test_a_cancel_while_a_poll_runs_ends_it_canceled_with_the_marks_off(rollouts):
    handle = await rollouts.start()
    await status_when(handle, lambda s: s.phase == "Rolling")
    rollouts.nodes.slow_poll = 30.0
    polls = rollouts.nodes.polls
    deadline = asyncio.get_running_loop().time() + 20
    while rollouts.nodes.polls == polls:  # the next poll is running now
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), timeout=20)
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    assert set(rollouts.nodes.marks().values()) == {None}


async def test_a_bug_in_the_rollout_fails_it_after_taking_its_marks_off(rollouts, monkeypatch):
    """Issue 30: a bug in the rollout's code (here: building its poll's request raises) fails the
    run, visibly, once its marks are off; before, its workflow task failed for ever and the marked
    nodes went on being replaced with nothing following them."""
    from api import rollout_io

    def broken(**_: object) -> None:
        raise TypeError("RemainingRequest() got an unexpected keyword argument")

    monkeypatch.setattr(rollout_io, "RemainingRequest", broken)
    handle = await rollouts.start()
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), 20)
    assert "unexpected keyword argument" in str(failure.value.cause)
    assert set(rollouts.nodes.marks().values()) == {None}
    status = await handle.query("status", result_type=RolloutStatus)
    assert status.phase == "Failed" and "the marks of 4 node(s) taken off" in status.message


async def test_a_halted_wave_rollout_stays_halted_across_a_continue_as_new_and_resumes(harness):
    """Issue 35: the wave state travels across continues-as-new, and so must what the run shows:
    its policy's durations read back from the input (pydantic writes a timedelta as ISO 8601), and
    a halted rollout's new run says Halted (status and Phase), so `resume`, which only a Halted
    rollout takes, still works."""
    from api import search_attributes as sa
    from api.rollout_policy import RolloutPolicy

    cluster = harness.cluster
    cluster.rollout_marks = {f"uid-{i}": [f"r{i}", None] for i in range(2)}
    cluster.rollout_marks["uid-new-r0"] = ["new-r0", None]  # the canary's replacement, NotReady
    cluster.rollout_new.add("uid-new-r0")
    cluster.gate_fails = True
    nodes = [RolloutNode(name="r0", uid="uid-0"), RolloutNode(name="r1", uid="uid-1")]
    request = RolloutInput(
        cluster="c",
        nodepool="default",
        requested_at=datetime(2026, 1, 1, tzinfo=UTC),
        poll_interval=timedelta(milliseconds=200),
        polls_per_run=3,
        mode="drift",
        target="t1",
        policy=RolloutPolicy.model_validate({"canary": 1, "soak": "1s"}),
        nodes=nodes,
        total=2,
    )
    handle = await harness.client.start_workflow(
        "RolloutWorkflow",
        request.model_dump(mode="json"),
        id=harness.id("rollout/c/default"),
        task_queue=harness.task_queue,
        result_type=RolloutStatus,
    )
    first = (await handle.describe()).run_id
    await status_when(handle, lambda s: s.phase == "Halted")
    latest = harness.client.get_workflow_handle(handle.id, result_type=RolloutStatus)
    deadline = asyncio.get_running_loop().time() + 20
    while (await latest.describe()).run_id == first:  # it continued as new while halted
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.1)
    status = await status_when(latest, lambda s: s.policy is not None)
    assert (status.phase, status.wave) == ("Halted", 1), status
    assert status.halted.startswith("node new-r0")
    assert (await latest.describe()).typed_search_attributes.get(sa.PHASE) == "Halted"
    cluster.gate_fails, cluster.rollout_replaces = False, True  # fixed; the planner replaces again
    await latest.signal("resume")
    done = await latest.result()
    assert (done.phase, done.replaced) == ("Succeeded", 2), done
