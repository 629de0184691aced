"""The RolloutWorkflow's activities over HTTP against the emulator: which nodes a rollout marks, that
it follows them by UID (a node that reuses a name is another node), and that a cancel takes off only
its own marks."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.errors import REFUSED
from activities.rollout import RolloutActivities
from api.constants import ROLLOUT_ANNOTATION
from api.rollout_io import MarkRequest, MarkWaveRequest, RemainingRequest, RolloutNode, UnmarkRequest

pytestmark = pytest.mark.integration

ME, OTHER = "rollout/prod/default/aaaaaaaaaa", "rollout/prod/default/bbbbbbbbbb"


def mark_of(world, name: str) -> str | None:
    node = world.get_node(name)
    return None if node is None else (node["metadata"].get("annotations") or {}).get(ROLLOUT_ANNOTATION)


def request(selector: dict[str, str] | None = None) -> MarkRequest:
    return MarkRequest(
        rollout_id=ME, nodepool="default", selector=selector or {}, requested_at=datetime.now(UTC)
    )


async def test_a_nodepool_that_does_not_exist_is_refused_before_anything_is_marked(world):
    world.node("n1")  # labelled for NodePool default, which is not there
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(RolloutActivities(world.kube).mark_rollout_nodes, request())
    assert refused.value.type == REFUSED and refused.value.non_retryable
    assert mark_of(world, "n1") is None


async def test_it_marks_the_pools_older_matching_nodes_once_and_leaves_another_rollouts_mark(world):
    world.nodepool("default")
    world.nodepool("other")
    world.node("old-a", labels={"team": "a"})
    world.node("old-b", labels={"team": "b"})
    world.node("theirs", labels={"team": "a"}, annotations={ROLLOUT_ANNOTATION: OTHER})
    world.node("elsewhere", pool="other", labels={"team": "a"})
    leaving = world.node("leaving", labels={"team": "a"})
    leaving["metadata"]["finalizers"] = ["karpenter.sh/termination"]
    world.emu.store.update("nodes", leaving)
    world.emu.store.delete("nodes", "leaving")  # lingers, being deleted: it leaves anyway
    marking = request({"team": "a"})
    await asyncio.sleep(1.1)  # creation times have one-second resolution
    world.node("young", labels={"team": "a"})  # created after the request
    activities = RolloutActivities(world.kube)
    first = await ActivityEnvironment().run(activities.mark_rollout_nodes, marking)
    assert [n.name for n in first] == ["old-a", "theirs"]
    assert (mark_of(world, "old-a"), mark_of(world, "theirs"), mark_of(world, "old-b")) == (ME, OTHER, None)
    assert mark_of(world, "young") is None and mark_of(world, "elsewhere") is None
    again = await ActivityEnvironment().run(activities.mark_rollout_nodes, marking)  # a retry
    assert again == first

    cancelled = await ActivityEnvironment().run(
        activities.unmark_rollout_nodes, UnmarkRequest(rollout_id=ME, nodepool="default", nodes=first)
    )
    assert cancelled == 1 and mark_of(world, "old-a") is None and mark_of(world, "theirs") == OTHER


async def test_remaining_follows_uids_and_marks_again_what_was_taken_off_by_hand(world):
    world.nodepool("default")
    world.node("n1")
    world.node("n2")
    activities = RolloutActivities(world.kube)
    nodes = await ActivityEnvironment().run(activities.mark_rollout_nodes, request())
    gone = world.emu.store.get("nodes", "n1")
    gone["metadata"]["finalizers"] = []
    world.emu.store.update("nodes", gone)
    world.emu.store.delete("nodes", "n1")
    world.node("n1")  # the name again: another node, never the rollout's
    node = world.emu.store.get("nodes", "n2")
    del node["metadata"]["annotations"][ROLLOUT_ANNOTATION]
    world.emu.store.update("nodes", node)
    remaining = await ActivityEnvironment().run(
        activities.rollout_remaining, RemainingRequest(rollout_id=ME, nodepool="default", nodes=nodes)
    )
    assert [n.name for n in remaining] == ["n2"] and mark_of(world, "n2") == ME
    assert mark_of(world, "n1") is None
    unmarked = await ActivityEnvironment().run(
        activities.unmark_rollout_nodes, UnmarkRequest(rollout_id=ME, nodepool="default")
    )
    assert unmarked == 1 and mark_of(world, "n2") is None


async def test_mark_rollout_wave_marks_by_uid_and_skips_what_is_gone(world):
    world.nodepool("default")
    world.node("w1")
    world.node("w2", annotations={ROLLOUT_ANNOTATION: OTHER})
    world.node("w3")
    uid = {n: world.get_node(n)["metadata"]["uid"] for n in ("w1", "w2", "w3")}
    wave = [RolloutNode(name=n, uid=uid[n]) for n in ("w1", "w2", "w3")]
    wave.append(RolloutNode(name="gone", uid="uid-gone"))
    wave[2] = RolloutNode(name="w3", uid="an-earlier-w3")  # the name is another node's now
    marked = await ActivityEnvironment().run(
        RolloutActivities(world.kube).mark_rollout_wave,
        MarkWaveRequest(rollout_id=ME, nodepool="default", nodes=wave),
    )
    assert [n.name for n in marked] == ["w1", "w2"]
    assert (mark_of(world, "w1"), mark_of(world, "w2"), mark_of(world, "w3")) == (ME, OTHER, None)
