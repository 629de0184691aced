"""DisruptionWorkflow end to end: real Temporal dev server, the emulator, moto, the real worker."""

from __future__ import annotations

import json

import pytest
from temporalio.client import WorkflowFailureError

from api.constants import DISRUPTED_TAINT_KEY, NODEPOOL_LABEL
from api.workflow_io import DisruptionInput, DisruptionTimeouts, ReplacementSpec
from planner.catalog import bundled_catalog
from sim.binaries import temporal_cli
from sim.testing import assert_no_violations, kubectl
from tests.integration.workflows.conftest import Workload, assert_rbac_allows, node, scenario, worker_requests
from workflows.disruption import DisruptionWorkflow

pytestmark = pytest.mark.integration

# Two m5.xlarge, 10 % used: one m5.xlarge holds every pod, at half the price.
A, B = node("172.31.1.10", "m5.xlarge"), node("172.31.2.20", "m5.xlarge")
TWENTY_PODS = [Workload("shop", "web", "100m", "128Mi", ["10"] * 10 + ["20"] * 10, pdb={"maxUnavailable": 2})]


def replace_both(**timeouts: object) -> DisruptionInput:
    return DisruptionInput(
        reason="Underutilized",
        nodes=[A.name, B.name],
        replacements=[
            ReplacementSpec(
                nodepool="default", instance_types=["m5.xlarge", "m5.2xlarge"], zones=["us-west-2a"]
            )
        ],
        timeouts=DisruptionTimeouts(**timeouts),
    )


@pytest.mark.sim_stack(scenario=scenario([A, B], TWENTY_PODS))
async def test_two_nodes_are_replaced_by_one_and_every_pod_moves(karpflow):
    before = {i["InstanceId"] for i in karpflow.instances()}
    async with karpflow.worker():
        handle = await karpflow.client.start_workflow(
            DisruptionWorkflow.run,
            replace_both(),
            id=karpflow.workflow_id("disruption/default/Underutilized"),
            task_queue=karpflow.task_queue,
        )
        status = await handle.result()

    replacement = status.replacements[0]
    assert status.phase == "Succeeded" and replacement.state == "Initialized"
    assert replacement.offering.instance_type == "m5.xlarge"
    catalog = bundled_catalog("us-west-2")

    def hourly(instance_type: str) -> float:
        return catalog.get(instance_type).price("us-west-2a", "on-demand")

    assert hourly(replacement.offering.instance_type) < hourly(A.instance_type) + hourly(B.instance_type)
    nodes = await karpflow.nodes()
    assert set(nodes) == {replacement.node}
    new = nodes[replacement.node]
    assert new["metadata"]["labels"][NODEPOOL_LABEL] == "default"
    assert new["metadata"]["labels"]["karpenter.sh/initialized"] == "true"
    assert "karpenter.sh/termination" in new["metadata"]["finalizers"]
    web = [p for p in await karpflow.pods() if p["metadata"]["namespace"] == "shop"]
    assert len(web) == 20 and all(
        p["spec"]["nodeName"] == replacement.node and p["status"]["phase"] == "Running" for p in web
    )
    running = {i["InstanceId"] for i in karpflow.instances()}
    assert running == {replacement.instance_id} and not running & before
    assert len(karpflow.instances(("pending", "running", "shutting-down", "terminated"))) == 3
    assert_no_violations(karpflow.stack)
    calls = worker_requests(karpflow.stack)
    assert {("create", "pods/eviction"), ("update", "nodes"), ("get", "nodepools")} <= calls
    assert_rbac_allows(calls)


@pytest.mark.sim_stack(scenario=scenario([A, B], TWENTY_PODS))
async def test_capacity_error_on_the_first_offering_moves_to_the_second(karpflow):
    karpflow.stack.faults.add_insufficient_capacity("m5.xlarge", zone="us-west-2a")
    async with karpflow.worker():
        status = await karpflow.client.execute_workflow(
            DisruptionWorkflow.run,
            replace_both(),
            id=karpflow.workflow_id("disruption/ice"),
            task_queue=karpflow.task_queue,
        )

    assert status.replacements[0].offering.instance_type == "m5.2xlarge"
    assert [u.offering for u in status.unavailable_offerings] == ["m5.xlarge/us-west-2a/on-demand"]
    assert karpflow.stack.faults.counters.insufficient_capacity == 1
    assert [i["InstanceType"] for i in karpflow.instances()] == ["m5.2xlarge"]
    assert_no_violations(karpflow.stack)


@pytest.mark.sim_stack(scenario=scenario([A, B], TWENTY_PODS))
async def test_a_replacement_that_never_initializes_is_rolled_back(karpflow):
    karpflow.stack.faults.add_never_ready(instance_types=["m5.xlarge"])
    before = {i["InstanceId"] for i in karpflow.instances()}
    async with karpflow.worker():
        handle = await karpflow.client.start_workflow(
            DisruptionWorkflow.run,
            replace_both(replacement_ready="3s", heartbeat="2s"),
            id=karpflow.workflow_id("disruption/never-ready"),
            task_queue=karpflow.task_queue,
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()

    message = failure.value.cause.message
    assert "replacement 0 (nodepool default, m5.xlarge/us-west-2a/on-demand, instance i-" in message
    assert "the node did not initialize within 0:00:03" in message
    assert "not Ready" in message
    assert "untainted 2 candidate(s), terminated 1 replacement instance(s)" in message
    nodes = await karpflow.nodes()
    assert set(nodes) == {A.name, B.name}
    assert not any(
        t["key"] == DISRUPTED_TAINT_KEY for n in nodes.values() for t in n["spec"].get("taints") or ()
    )
    assert {i["InstanceId"] for i in karpflow.instances()} == before
    # Each candidate's Events tell the story: launched for, waited for, rolled back (and why).
    listed = json.loads(kubectl(karpflow.stack, "get", "events", "-A", "-o", "json"))["items"]
    for candidate in (A.name, B.name):
        on_node = {e["reason"]: e for e in listed if e["involvedObject"]["name"] == candidate}
        assert {"DisruptionLaunching", "DisruptionWaitingReadiness", "DisruptionRolledBack"} <= set(on_node)
        assert on_node["DisruptionRolledBack"]["involvedObject"]["uid"] == nodes[candidate]["metadata"]["uid"]
        assert "did not initialize" in on_node["DisruptionRolledBack"]["message"]
    assert_no_violations(karpflow.stack)


@pytest.mark.sim_stack(scenario=scenario([A, B], TWENTY_PODS))
async def test_temporal_workflow_cancel_while_waiting_for_a_replacement_compensates(karpflow):
    karpflow.stack.faults.add_never_ready(instance_types=["m5.xlarge"])
    before = {i["InstanceId"] for i in karpflow.instances()}
    workflow_id = karpflow.workflow_id("disruption/cancel")
    async with karpflow.worker():
        handle = await karpflow.client.start_workflow(
            DisruptionWorkflow.run,
            replace_both(),
            id=workflow_id,
            task_queue=karpflow.task_queue,
        )
        await karpflow.eventually(
            lambda: _phase_is(handle, "WaitingForReplacements"),
            what="the workflow to wait for its replacement",
        )
        await karpflow.run(
            temporal_cli(),
            "workflow",
            "cancel",
            "--workflow-id",
            workflow_id,
            "--address",
            karpflow.temporal_address,
        )
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        status = await handle.query(DisruptionWorkflow.status)

    described = await handle.describe()
    assert described.status.name == "CANCELED"
    assert status.phase == "Canceled"
    assert "untainted 2 candidate(s), terminated 1 replacement instance(s)" in status.message
    assert {i["InstanceId"] for i in karpflow.instances()} == before
    nodes = await karpflow.nodes()
    assert set(nodes) == {A.name, B.name}
    assert not any(
        t["key"] == DISRUPTED_TAINT_KEY for n in nodes.values() for t in n["spec"].get("taints") or ()
    )
    assert_no_violations(karpflow.stack)


async def _phase_is(handle, phase: str) -> bool:
    return (await handle.query(DisruptionWorkflow.status)).phase == phase


@pytest.mark.sim_stack(scenario=scenario([A, B], TWENTY_PODS))
async def test_user_data_that_does_not_bootstrap_gives_no_node_and_the_disruption_rolls_back(karpflow):
    """The simulator registers a node only from what its user data tells the kubelet. With amiFamily
    Custom the EC2NodeClass's user data goes out untouched; this one never starts a kubelet."""

    def custom(nodeclass: dict) -> None:
        nodeclass["spec"]["amiFamily"] = "Custom"
        nodeclass["spec"]["userData"] = "#!/bin/bash\necho 'no bootstrap here'\n"

    karpflow.stack.store.mutate("ec2nodeclasses", "default", custom)
    before = {i["InstanceId"] for i in karpflow.instances()}
    async with karpflow.worker():
        handle = await karpflow.client.start_workflow(
            DisruptionWorkflow.run,
            replace_both(replacement_ready="3s", heartbeat="2s"),
            id=karpflow.workflow_id("disruption/no-bootstrap"),
            task_queue=karpflow.task_queue,
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()

    message = failure.value.cause.message
    assert "failed while Launched: no node registered within 0:00:03" in message, message
    assert "untainted 2 candidate(s), terminated 1 replacement instance(s)" in message
    nodes = await karpflow.nodes()
    assert set(nodes) == {A.name, B.name}
    assert not any(
        t["key"] == DISRUPTED_TAINT_KEY for n in nodes.values() for t in n["spec"].get("taints") or ()
    )
    assert {i["InstanceId"] for i in karpflow.instances()} == before
    failures = karpflow.stack.controllers.controllers["nodes"].boot_failures
    assert any("names no cluster" in why for why in failures.values()), failures
    assert_no_violations(karpflow.stack)
