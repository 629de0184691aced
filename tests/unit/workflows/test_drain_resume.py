"""A drain cut short by a crash resumes from its last heartbeat: counters carry over."""

from __future__ import annotations

import asyncio
import dataclasses

from temporalio.testing import ActivityEnvironment

from activities.kubernetes import KubernetesActivities
from api.activity_io import DrainRequest


class NoPodsLeft:
    """The node after the earlier attempt: every pod it waited for is gone."""

    async def pods_on_node(self, node: str) -> list[dict]:
        return []

    async def find_node(self, name: str) -> dict | None:
        return None


class SlowPods:
    """A pass that takes longer than a heartbeat interval (a node with many pods to list)."""

    def __init__(self) -> None:
        self.calls = 0

    async def find_node(self, name: str) -> dict | None:
        return None

    async def pods_on_node(self, node: str) -> list[dict]:
        self.calls += 1
        if self.calls == 1:
            await asyncio.sleep(2.5)
        return []


async def test_a_resumed_drain_keeps_the_counters_of_the_attempt_before():
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        attempt=2,
        heartbeat_details=[{"tier": "default", "evicted": 7, "deleted": 1, "pods_left": 0}],
    )
    activities = KubernetesActivities(NoPodsLeft(), poll_interval=0.01)  # type: ignore[arg-type]
    result = await env.run(activities.drain_node, DrainRequest(node="n1", reason="Drifted"))
    assert (result.evicted, result.deleted) == (7, 1)


async def test_a_first_attempt_starts_from_zero():
    activities = KubernetesActivities(NoPodsLeft(), poll_interval=0.01)  # type: ignore[arg-type]
    result = await ActivityEnvironment().run(activities.drain_node, DrainRequest(node="n1", reason="Drifted"))
    assert (result.evicted, result.deleted) == (0, 0)


async def test_the_drain_heartbeats_inside_a_long_pass():
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    activities = KubernetesActivities(SlowPods(), poll_interval=0.01)  # type: ignore[arg-type]
    await env.run(activities.drain_node, DrainRequest(node="n1", reason="Drifted"))
    # One beat from the 2 s ticker while the first listing hangs, one at the end of the pass.
    assert len(beats) >= 2
