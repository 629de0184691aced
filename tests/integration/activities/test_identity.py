"""A node name is not an identity (issue 17 item 2): EKS names nodes by private DNS, which comes back
with the IP. Every step that touches a node by name checks the UID its workflow is pinned to, so a
workflow started for one node never acts on a later node that reuses the name."""

from __future__ import annotations

import pytest
from temporalio.testing import ActivityEnvironment

from api.activity_io import BeginTerminationRequest, DrainRequest, TaintRequest, UntaintRequest, VolumeRequest
from api.constants import DISRUPTED_TAINT_KEY, TERMINATION_FINALIZER

pytestmark = pytest.mark.integration


def tainted(node: dict) -> bool:
    return any(t["key"] == DISRUPTED_TAINT_KEY for t in node["spec"].get("taints") or ())


def reuse_the_name(world, name: str) -> tuple[dict, dict]:
    """`name` registers, goes (its finalizer removed by someone, then deleted), and a new instance
    registers under the same name with a pod of its own. Returns (old, new) as the API had them."""
    old = world.node(name)
    world.emu.store.update("nodes", {**old, "metadata": {**old["metadata"], "finalizers": []}})
    world.emu.store.delete("nodes", name)
    assert world.get_node(name) is None
    new = world.node(name)
    world.pod("web-1", name)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    return old, new


def pods_on(world, name: str) -> list[dict]:
    return [
        p
        for p in world.emu.store.list("pods").items
        if p["spec"].get("nodeName") == name and not p["metadata"].get("deletionTimestamp")
    ]


async def test_a_termination_pinned_to_a_node_does_not_delete_or_drain_a_new_node_of_its_name(world):
    world.nodepool()
    old, new = reuse_the_name(world, "n1")
    acts, env = world.activities(), ActivityEnvironment()
    pin = {"uid": old["metadata"]["uid"], "provider_id": old["spec"]["providerID"]}

    info = await env.run(acts.begin_termination, BeginTerminationRequest(node="n1", reason="Manual", **pin))
    drained = await env.run(acts.drain_node, DrainRequest(node="n1", uid=pin["uid"], reason="Manual"))
    detached = await env.run(acts.await_volumes_detached, VolumeRequest(node="n1", uid=pin["uid"]))

    # The pinned node is gone: only its instance may be left; the new node is not touched.
    assert not info.found and info.instance_id == old["spec"]["providerID"].rsplit("/", 1)[-1]
    assert "another node now" in info.message and "another node now" in drained.message and detached
    now = world.get_node("n1")
    assert now["metadata"]["uid"] == new["metadata"]["uid"] and not now["metadata"].get("deletionTimestamp")
    assert [p["metadata"]["name"] for p in pods_on(world, "n1")] == ["web-1"]


async def test_the_termination_steps_after_the_start_leave_a_new_node_of_the_name_alone(world):
    from api.activity_io import NodeRef  # the pinned form of the steps that used to take a name

    world.nodepool()
    old, _ = reuse_the_name(world, "n1")
    acts, env = world.activities(), ActivityEnvironment()
    target = NodeRef(node="n1", uid=old["metadata"]["uid"])

    await env.run(acts.taint_for_termination, target)
    await env.run(acts.remove_finalizer, target)

    now = world.get_node("n1")
    assert not tainted(now) and now["metadata"]["finalizers"] == [TERMINATION_FINALIZER]
    # A workflow started before pinning sends a plain name: that still works on the node of the name.
    await env.run(acts.taint_for_termination, "n1")
    assert tainted(world.get_node("n1"))


async def test_a_command_pinned_to_a_node_does_not_claim_or_release_a_new_node_of_its_name(world):
    world.nodepool()
    old, new = reuse_the_name(world, "n1")
    acts, env = world.activities(), ActivityEnvironment()
    uids = {"n1": old["metadata"]["uid"]}

    (result,) = await env.run(
        acts.taint_disrupted,
        TaintRequest(
            nodes=["n1"], command_id="disruption/prod/default/Expired/x@r", reason="Expired", uids=uids
        ),
    )
    assert not result.ok and "another node now" in result.message
    assert not tainted(world.get_node("n1"))

    # The new node, claimed by another command, is not released by a rollback pinned to the old one.
    (other,) = await env.run(
        acts.taint_disrupted,
        TaintRequest(nodes=["n1"], command_id="disruption/prod/default/Expired/x@r", reason="Expired"),
    )
    assert other.ok and other.uid == new["metadata"]["uid"]
    assert other.termination_id == f"termination/prod/n1/{new['metadata']['uid']}"
    released = await env.run(
        acts.untaint_disrupted,
        UntaintRequest(nodes=["n1"], command_id="disruption/prod/default/Expired/x@r", uids=uids),
    )
    assert released == [] and tainted(world.get_node("n1"))


async def test_the_controllers_annotations_go_only_to_the_node_the_pass_saw(world):
    """Issue 30 item 9: the controller's node annotations were written by name."""
    from activities.planning import PlanningActivities

    world.nodepool()
    old, new = reuse_the_name(world, "n1")
    planning = PlanningActivities(None, world.kube, None)  # type: ignore[arg-type]
    marker = {"node": "n1", "key": "karpenter.sh/voluntary-disruption", "value": "drifted"}
    env = ActivityEnvironment()
    assert await env.run(planning.apply_annotations, [{**marker, "uid": old["metadata"]["uid"]}]) == 0
    assert "karpenter.sh/voluntary-disruption" not in (
        world.get_node("n1")["metadata"].get("annotations") or {}
    )
    assert await env.run(planning.apply_annotations, [{**marker, "uid": new["metadata"]["uid"]}]) == 1
    assert world.get_node("n1")["metadata"]["annotations"]["karpenter.sh/voluntary-disruption"] == "drifted"
