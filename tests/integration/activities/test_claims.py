"""Who holds a node: the disrupted taint and its holder annotation are claimed in one
read-modify-write with a resourceVersion precondition (issue 17 item 9), so two commands racing
for a node cannot both get it, a retried step cannot take it back from a command that superseded
it, and crash cleanup does not untaint a node whose holder is still running."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.testing import ActivityEnvironment

from activities.guards import OWNER_ANNOTATION
from activities.kubernetes import KubernetesActivities
from activities.planning import InFlight, PlanningActivities
from api.activity_io import TaintRequest, UntaintRequest
from api.constants import DISRUPTED_TAINT_KEY
from cluster.informer import ClusterCache
from kube.client import KubeApi
from tests.integration.activities.conftest import CLUSTER
from tests.integration.workflows.conftest import dev_client  # noqa: F401 - fixture

pytestmark = pytest.mark.integration


def holder(node: dict) -> str | None:
    return (node["metadata"].get("annotations") or {}).get(OWNER_ANNOTATION)


def tainted(node: dict) -> bool:
    return any(t["key"] == DISRUPTED_TAINT_KEY for t in node["spec"].get("taints") or ())


class SimultaneousWrites(KubeApi):
    """The real client, except that node writes wait until `parties` of them are ready: every
    command has passed its guards on the same untainted node before any of them writes."""

    def __init__(self, kube: KubeApi, parties: int) -> None:
        self.__dict__.update(kube.__dict__)
        self.barrier = asyncio.Barrier(parties)

    async def update_node(self, name, mutate, attempts=8, current=None):  # type: ignore[no-untyped-def]
        await self.barrier.wait()
        return await super().update_node(name, mutate, attempts, current)


def activities_with(world, kube: KubeApi) -> KubernetesActivities:
    return KubernetesActivities(kube, poll_interval=0.01, ownership=world.aws().ownership, cluster=CLUSTER)


async def test_two_voluntary_commands_racing_for_one_node_one_wins(world):
    world.nodepool()
    world.node("n1")
    racing = activities_with(world, SimultaneousWrites(world.kube, 2))

    async def claim(command: str):
        request = TaintRequest(nodes=["n1"], command_id=command, reason="Underutilized")
        return (await ActivityEnvironment().run(racing.taint_disrupted, request))[0]

    commands = ("disruption/prod/default/Underutilized/a", "disruption/prod/default/Underutilized/b")
    a, b = await asyncio.gather(*(claim(command) for command in commands))

    assert sorted([a.ok, b.ok]) == [False, True], (a, b)
    loser = b if a.ok else a
    node = world.get_node("n1")
    assert tainted(node) and holder(node) == (commands[0] if a.ok else commands[1])
    assert "already held by command" in loser.message


class GatedWrites(KubeApi):
    """The real client, except that node writes wait for `gate`: a step that has passed its guards
    and is about to write (a retried activity, a slow worker)."""

    def __init__(self, kube: KubeApi) -> None:
        self.__dict__.update(kube.__dict__)
        self.gate = asyncio.Event()

    async def update_node(self, name, mutate, attempts=8, current=None):  # type: ignore[no-untyped-def]
        await self.gate.wait()
        return await super().update_node(name, mutate, attempts, current)


async def test_a_forceful_command_takes_over_and_a_late_voluntary_write_does_not_take_it_back(world):
    """A rebalance's voluntary command holds the node; its taint step runs again (a retry) and has
    passed its guards when the spot warning's forceful command takes the node over. The late
    voluntary write must not put its holder back, and its rollback must not untaint the node the
    forceful command now drains."""
    world.nodepool()
    world.node("n1")
    acts = world.activities()
    voluntary, forceful = "interruption/prod/i-1/rebalance@r1", "interruption/prod/i-1/spot@r2"
    env = ActivityEnvironment()
    request = TaintRequest(nodes=["n1"], command_id=voluntary, reason="Drifted")
    (first,) = await env.run(acts.taint_disrupted, request)
    assert first.ok and holder(world.get_node("n1")) == voluntary

    gated = GatedWrites(world.kube)
    late = asyncio.create_task(env.run(activities_with(world, gated).taint_disrupted, request))
    await asyncio.sleep(0.5)  # its guards pass: the node is held by itself
    spot = TaintRequest(nodes=["n1"], command_id=forceful, reason="Interrupted")
    (taken,) = await env.run(acts.taint_disrupted, spot)
    assert taken.ok and holder(world.get_node("n1")) == forceful
    gated.gate.set()
    (retried,) = await late

    assert not retried.ok and holder(world.get_node("n1")) == forceful
    assert await env.run(acts.untaint_disrupted, UntaintRequest(nodes=["n1"], command_id=voluntary)) == []
    assert tainted(world.get_node("n1")) and holder(world.get_node("n1")) == forceful
    assert f"took over from command {voluntary}" in taken.message


class VisibilityLags(PlanningActivities):
    """Temporal visibility has not listed a just-started workflow yet (Elasticsearch refreshes every
    second; a burst of starts can take longer)."""

    async def _in_flight(self) -> InFlight:
        return InFlight()


async def test_crash_cleanup_inside_the_visibility_lag_keeps_a_taint_whose_holder_runs(world, dev_client):  # noqa: F811
    world.nodepool()
    world.node("held")
    world.node("orphan")
    workflow_id = f"interruption/prod/i-{uuid.uuid4().hex[:8]}/spot"
    # Started on a task queue no worker polls: it stays Running, as a command in flight does.
    handle = await dev_client.start_workflow(
        "DisruptionWorkflow",
        {"reason": "Interrupted", "nodes": ["held"]},
        id=workflow_id,
        task_queue=f"nobody-{uuid.uuid4().hex[:6]}",
    )
    try:
        acts = world.activities()
        env = ActivityEnvironment()
        await env.run(
            acts.taint_disrupted,
            TaintRequest(
                nodes=["held"], command_id=f"{workflow_id}@{handle.result_run_id}", reason="Interrupted"
            ),
        )
        await env.run(
            acts.taint_disrupted,
            TaintRequest(
                nodes=["orphan"], command_id="disruption/prod/default/Empty/gone@r0", reason="Empty"
            ),
        )
        planning = VisibilityLags(ClusterCache(world.kube), world.kube, dev_client)

        cleaned = await env.run(planning.untaint_orphans, ["held", "orphan"])

        assert cleaned == ["orphan"]
        assert tainted(world.get_node("held")) and not tainted(world.get_node("orphan"))
    finally:
        await handle.terminate("test over")
