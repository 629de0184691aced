"""The guards evaluated where the step is taken (activities/guards.py), against the emulator and moto."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import errors
from api.activity_io import BeginTerminationRequest, InstanceRequest, TaintRequest
from api.constants import (
    CLUSTER_TAG_VALUE,
    DISRUPTED_TAINT_KEY,
    TAG_NODEPOOL,
    TERMINATION_TIMESTAMP_ANNOTATION,
    cluster_tag,
)
from tests.integration.activities.conftest import CLUSTER

pytestmark = pytest.mark.integration

DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true"}


def tainted(node: dict) -> bool:
    return any(t["key"] == DISRUPTED_TAINT_KEY for t in node["spec"].get("taints") or ())


async def taint(world, reason: str, *nodes: str, command: str = "disruption/prod/default/x/1"):
    request = TaintRequest(nodes=list(nodes), command_id=command, reason=reason)
    return await ActivityEnvironment().run(world.activities().taint_disrupted, request)


# -- item 11: drift with a terminationGracePeriod is Karpenter's eventual class ----------------------


@pytest.mark.parametrize(
    "pool",
    [
        {"termination_grace_period": "1h"},
        {"annotations": {"karpflow.dev/termination-grace-period": "1h"}},
    ],
    ids=["template", "karpflow.dev override"],
)
async def test_drift_takes_a_node_with_a_do_not_disrupt_pod_when_a_grace_period_bounds_the_drain(world, pool):
    created = world.nodepool(termination_grace_period=pool.get("termination_grace_period"))
    if "annotations" in pool:
        created["metadata"]["annotations"] = pool["annotations"]
        world.emu.store.update("nodepools", created)
    world.node("n1")
    world.pod("batch-1", "n1", annotations=DO_NOT_DISRUPT)

    (result,) = await taint(world, "Drifted", "n1")

    assert result.ok and tainted(world.get_node("n1"))
    # The drain it leads to is bounded by the same grace period.
    info = await ActivityEnvironment().run(
        world.activities().begin_termination, BeginTerminationRequest(node="n1", reason="Drifted")
    )
    stamped = world.get_node("n1")["metadata"]["annotations"][TERMINATION_TIMESTAMP_ANNOTATION]
    assert info.deadline is not None and info.deletion_timestamp is not None and stamped
    assert round((info.deadline - info.deletion_timestamp).total_seconds()) == 3600


async def test_drift_without_a_grace_period_and_consolidation_still_refuse_a_do_not_disrupt_pod(world):
    world.nodepool()
    world.node("n1")
    world.pod("batch-1", "n1", annotations=DO_NOT_DISRUPT)
    for reason in ("Drifted", "Underutilized"):
        with pytest.raises(ApplicationError) as refused:
            await taint(world, reason, "n1")
        assert refused.value.type == errors.REFUSED and "annotated do-not-disrupt" in refused.value.message
    assert not tainted(world.get_node("n1"))


async def test_a_do_not_disrupt_node_is_refused_by_drift_even_with_a_grace_period(world):
    world.nodepool(termination_grace_period="1h")
    world.node("n1", annotations=DO_NOT_DISRUPT)
    with pytest.raises(ApplicationError, match=r"is annotated karpenter\.sh/do-not-disrupt"):
        await taint(world, "Drifted", "n1")
    assert not tainted(world.get_node("n1"))


# -- item 10: a node whose instance is gone ---------------------------------------------------------


async def test_a_notready_node_whose_instance_is_gone_is_taken_by_a_forceful_command(world):
    """Its instance was terminated outside karpflow and its kubelet is silent: nothing is left to
    protect, so a forceful command may taint it and its termination may delete it (which then only
    releases the finalizer), instead of being refused every pass."""
    world.nodepool()
    instance = world.instance()
    world.node("n1", instance_id=instance, ready=False)
    world.ec2.terminate_instances(InstanceIds=[instance])

    (result,) = await taint(world, "Unhealthy", "n1")
    assert result.ok and tainted(world.get_node("n1"))
    info = await ActivityEnvironment().run(
        world.activities().begin_termination, BeginTerminationRequest(node="n1", reason="Unhealthy")
    )
    assert info.found and not info.ready and info.instance_id == instance
    assert world.get_node("n1")["metadata"].get("deletionTimestamp")


async def test_a_ready_node_whose_instance_ec2_does_not_know_is_still_refused(world):
    """A live kubelet says the machine exists: a providerID EC2 does not know is not ours to act on."""
    world.nodepool()
    world.node("n1", instance_id="i-0000000000000dead")
    with pytest.raises(ApplicationError, match="its instance i-0000000000000dead does not exist in EC2"):
        await taint(world, "Unhealthy", "n1")
    with pytest.raises(ApplicationError, match="does not exist in EC2"):
        await ActivityEnvironment().run(
            world.activities().begin_termination, BeginTerminationRequest(node="n1", reason="Unhealthy")
        )
    assert not tainted(world.get_node("n1")) and not world.get_node("n1")["metadata"].get("deletionTimestamp")


# -- item 8: ownership is the cluster tag AND the NodePool tag, and the NodePool must match ---------


async def test_an_owned_instance_without_a_nodepool_tag_is_not_karpflows(world):
    """EKS managed node groups tag their instances kubernetes.io/cluster/<name>=owned too, and a
    kubelet may label itself karpenter.sh/nodepool: only the NodePool tag set at launch (by Karpenter
    or karpflow) makes an instance one of ours. Nothing is tainted, deleted or terminated."""
    world.nodepool()
    instance = world.instance({cluster_tag(CLUSTER): CLUSTER_TAG_VALUE, "eks:nodegroup-name": "system"})
    world.node("n1", instance_id=instance)
    for reason in ("Expired", "Drifted"):
        with pytest.raises(ApplicationError) as refused:
            await taint(world, reason, "n1")
        assert refused.value.type == errors.REFUSED
        assert f"its instance {instance} is not tagged karpenter.sh/nodepool" in refused.value.message
    with pytest.raises(ApplicationError, match=r"is not tagged karpenter\.sh/nodepool"):
        await ActivityEnvironment().run(
            world.activities().begin_termination, BeginTerminationRequest(node="n1", reason="Manual")
        )
    with pytest.raises(ApplicationError) as refused:
        await world.aws().terminate_instance(InstanceRequest(instance_id=instance, node="n1"))
    assert refused.value.type == errors.NOT_OWNED
    node = world.get_node("n1")
    assert not tainted(node) and not node["metadata"].get("deletionTimestamp")
    state = world.ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]["State"]
    assert state["Name"] == "running"


async def test_a_node_claiming_another_nodepool_than_its_instance_is_refused(world):
    world.nodepool("default")
    world.nodepool("gpu")
    instance = world.instance({cluster_tag(CLUSTER): CLUSTER_TAG_VALUE, TAG_NODEPOOL: "gpu"})
    world.node("n1", instance_id=instance, pool="default")
    with pytest.raises(ApplicationError) as refused:
        await taint(world, "Expired", "n1")
    assert (
        f"node n1 claims NodePool default by label, but its instance {instance} is tagged "
        "karpenter.sh/nodepool=gpu" in refused.value.message
    )
    assert not tainted(world.get_node("n1"))
