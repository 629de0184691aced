"""Guards at the moment of acting, tried as a new user would: through the real `temporal` CLI.

Each case starts a workflow by hand on a node karpflow must not touch, and checks the refusal message
and that nothing changed: no taint, no finalizer, the node still there, the instance still running.
"""

from __future__ import annotations

import json
import os

import pytest

from api.constants import DISRUPTED_TAINT_KEY, NODEPOOL_LABEL, TERMINATION_FINALIZER
from sim.binaries import temporal_cli
from sim.testing import assert_no_violations
from tests.integration.workflows.conftest import Workload, node, scenario

pytestmark = pytest.mark.integration

A, B = node("172.31.1.10", "m5.xlarge"), node("172.31.2.20", "m5.xlarge")
PODS = [Workload("shop", "web", "100m", "128Mi", ["10", "20"])]


async def start_and_wait(karpflow, workflow_type: str, workflow_id: str, body: dict) -> str:
    """`temporal workflow start` then `temporal workflow result`: what an operator would see."""
    temporal = temporal_cli()
    env = {"TEMPORAL_ADDRESS": karpflow.temporal_address}
    await karpflow.run(
        temporal, "workflow", "start", "--type", workflow_type, "--task-queue", karpflow.task_queue,
        "--workflow-id", workflow_id, "--input", json.dumps(body), **env,
    )  # fmt: skip
    result = await karpflow.run(
        temporal, "workflow", "result", "--workflow-id", workflow_id, check=False, **env
    )
    assert result.returncode != 0, f"{workflow_id} should have failed: {result.stdout}"
    return result.stdout + result.stderr


async def unchanged(karpflow, name: str, instance_running: bool = True) -> None:
    """Not deleted, not tainted, its finalizers as registration left them (the scenario's nodes carry
    karpenter.sh/termination already, as Karpenter's do), its instance running."""
    nodes = await karpflow.nodes()
    assert name in nodes, f"{name} was deleted"
    meta, spec = nodes[name]["metadata"], nodes[name]["spec"]
    assert not meta.get("deletionTimestamp")
    assert (meta.get("finalizers") or []) == [TERMINATION_FINALIZER]
    assert not any(t["key"] == DISRUPTED_TAINT_KEY for t in spec.get("taints") or ())
    assert "karpflow.io/disruption-command" not in (meta.get("annotations") or {})
    if instance_running:
        instance_id = spec["providerID"].rsplit("/", 1)[-1]
        described = karpflow.stack.ec2_client().describe_instances(InstanceIds=[instance_id])
        assert described["Reservations"][0]["Instances"][0]["State"]["Name"] == "running"


async def relabel(karpflow, name: str, key: str, value: str | None) -> None:
    def mutate(n):
        labels = n["metadata"].setdefault("labels", {})
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
        return True

    await karpflow.kube.update_node(name, mutate)


async def annotate(karpflow, name: str, key: str, value: str) -> None:
    def mutate(n):
        n["metadata"].setdefault("annotations", {})[key] = value
        return True

    await karpflow.kube.update_node(name, mutate)


@pytest.mark.sim_stack(scenario=scenario([A, B], PODS))
async def test_termination_refuses_a_node_without_a_nodepool(karpflow):
    await relabel(karpflow, A.name, NODEPOOL_LABEL, None)
    async with karpflow.worker():
        shown = await start_and_wait(
            karpflow, "TerminationWorkflow", f"termination/{A.name}", {"node": A.name, "reason": "Manual"}
        )
    assert f"node {A.name} has no karpenter.sh/nodepool label: karpflow does not manage it" in shown
    await unchanged(karpflow, A.name)


@pytest.mark.sim_stack(scenario=scenario([A, B], PODS))
async def test_termination_refuses_a_node_whose_instance_this_cluster_does_not_own(karpflow):
    """An EKS managed node group's node: labelled like ours, but its instance lacks the owned tag."""
    ec2 = karpflow.stack.ec2_client()
    ours = (await karpflow.nodes())[A.name]
    described = ec2.describe_instances(InstanceIds=[ours["spec"]["providerID"].rsplit("/", 1)[-1]])
    template = described["Reservations"][0]["Instances"][0]
    launched = ec2.run_instances(
        ImageId=template["ImageId"],
        InstanceType="m5.large",
        SubnetId=template["SubnetId"],
        MinCount=1,
        MaxCount=1,
    )
    instance_id = launched["Instances"][0]["InstanceId"]  # no kubernetes.io/cluster/<name> tag
    name = "ip-172-31-9-98.us-west-2.compute.internal"
    foreign = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {k: ours["metadata"][k] for k in ("labels", "annotations", "finalizers")}
        | {"name": name},
        "spec": {"providerID": f"aws:///us-west-2a/{instance_id}"},
        "status": ours["status"],
    }
    await karpflow.kube.request("POST", "/api/v1/nodes", body=foreign)
    tag = f"kubernetes.io/cluster/{karpflow.stack.cluster_name}"
    async with karpflow.worker():
        shown = await start_and_wait(
            karpflow, "TerminationWorkflow", f"termination/{name}", {"node": name, "reason": "Manual"}
        )
    assert f"its instance {instance_id} is not tagged {tag}=owned, so this cluster does not own it" in shown
    await unchanged(karpflow, name)


@pytest.mark.sim_stack(scenario=scenario([A, B], PODS))
async def test_termination_refuses_a_providerid_pointing_nowhere(karpflow):
    """A node registered by hand, labelled like ours, whose instance does not exist."""
    ghost = (await karpflow.nodes())[A.name]
    name = "ip-172-31-9-99.us-west-2.compute.internal"
    ghost["metadata"] = {k: ghost["metadata"][k] for k in ("labels", "annotations", "finalizers")} | {
        "name": name
    }
    ghost["spec"]["providerID"] = "aws:///us-west-2a/i-0000000000000dead"
    await karpflow.kube.request("POST", "/api/v1/nodes", body=ghost)
    async with karpflow.worker():
        shown = await start_and_wait(
            karpflow, "TerminationWorkflow", f"termination/{name}", {"node": name, "reason": "Manual"}
        )
    assert "its instance i-0000000000000dead does not exist in EC2" in shown
    await unchanged(karpflow, name, instance_running=False)


@pytest.mark.sim_stack(scenario=scenario([A, B], PODS))
async def test_termination_of_a_misspelled_node_is_an_error(karpflow):
    wrong = A.name.replace("ip-", "ipp-")
    async with karpflow.worker():
        shown = await start_and_wait(
            karpflow, "TerminationWorkflow", f"termination/{wrong}", {"node": wrong, "reason": "Manual"}
        )
    assert f"node {wrong} does not exist" in shown
    await unchanged(karpflow, A.name)


@pytest.mark.sim_stack(scenario=scenario([A, B], PODS))
async def test_voluntary_disruption_rechecks_do_not_disrupt_and_other_holders(karpflow):
    await annotate(karpflow, A.name, "karpenter.sh/do-not-disrupt", "true")
    body = {"reason": "Empty", "nodes": [A.name]}
    async with karpflow.worker():
        shown = await start_and_wait(karpflow, "DisruptionWorkflow", "disruption/default/Empty/dnd", body)
        assert (
            f"node {A.name} is annotated karpenter.sh/do-not-disrupt: no voluntary disruption (Empty)"
            in shown
        )
        await unchanged(karpflow, A.name)

        # B is held by a command still in flight (its taint records the owner).
        def held(n):
            n["spec"].setdefault("taints", []).append({"key": DISRUPTED_TAINT_KEY, "effect": "NoSchedule"})
            n["metadata"].setdefault("annotations", {})["karpflow.io/disruption-command"] = (
                "disruption/x/Drifted/1"
            )
            return True

        await karpflow.kube.update_node(B.name, held)
        body = {"reason": "Underutilized", "nodes": [B.name]}
        shown = await start_and_wait(
            karpflow, "DisruptionWorkflow", "disruption/default/Underutilized/b", body
        )
        assert (
            f"node {B.name} is already held by command disruption/x/Drifted/1: one command at a time" in shown
        )
        taints = (await karpflow.nodes())[B.name]["spec"]["taints"]
        assert [t for t in taints if t["key"] == DISRUPTED_TAINT_KEY]  # left as the holder set it
    assert len(karpflow.instances()) == 2


@pytest.mark.sim_stack(scenario=scenario([A, B], PODS))
async def test_a_forceful_command_goes_despite_do_not_disrupt(karpflow):
    """Expiration and the other forceful reasons are not stopped by do-not-disrupt (it only slows the
    drain until the grace period), as in Karpenter."""
    await annotate(karpflow, A.name, "karpenter.sh/do-not-disrupt", "true")
    async with karpflow.worker():
        temporal = temporal_cli()
        env = {"TEMPORAL_ADDRESS": karpflow.temporal_address}
        body = {"reason": "Expired", "nodes": [A.name], "termination": {"drain_attempt": "30s"}}
        start = ["workflow", "start", "--type", "DisruptionWorkflow", "--task-queue", karpflow.task_queue]
        await karpflow.run(
            temporal,
            *start,
            "--workflow-id",
            "disruption/default/Expired/a",
            "--input",
            json.dumps(body),
            **env,
        )

        async def tainted() -> bool:
            node_ = (await karpflow.nodes()).get(A.name)
            return node_ is None or any(
                t["key"] == DISRUPTED_TAINT_KEY for t in node_["spec"].get("taints") or ()
            )

        assert await karpflow.eventually(tainted, within=30)
        await karpflow.client.get_workflow_handle("disruption/default/Expired/a").terminate("test over")
    assert os.environ.get("PATH")
    assert_no_violations(karpflow.stack, in_flight=[A.name])


@pytest.mark.sim_stack(scenario=scenario([A, B], PODS))
async def test_an_emptiness_command_refuses_a_node_that_is_no_longer_empty(karpflow):
    """Pods can land between the planner's validation and the taint; nothing would replace them."""
    async with karpflow.worker():
        body = {"reason": "Empty", "nodes": [B.name]}
        shown = await start_and_wait(karpflow, "DisruptionWorkflow", "disruption/default/Empty/late", body)
    assert f"node {B.name} is no longer empty: pod shop/web-" in shown
    await unchanged(karpflow, B.name)


C = node("172.31.3.30", "m5.xlarge")  # no pod of PODS runs here


@pytest.mark.sim_stack(scenario=scenario([A, B, C], PODS))
async def test_an_emptiness_command_goes_on_with_the_candidates_still_empty(karpflow):
    """Karpenter's emptiness validator keeps the subset still empty: a pod that landed on one
    candidate leaves that node out, and the others are disrupted."""
    async with karpflow.worker():
        workflow_id = karpflow.workflow_id("disruption/default/Empty/subset")
        handle = await karpflow.client.start_workflow(
            "DisruptionWorkflow",
            {"reason": "Empty", "nodes": [B.name, C.name]},
            id=workflow_id,
            task_queue=karpflow.task_queue,
        )
        status = await handle.result()
        await karpflow.eventually(lambda: _gone(karpflow, C.name), within=60, what=f"{C.name} gone")
    skipped = next(c for c in status["candidates"] if c["node"] == B.name)
    assert not skipped["tainted"] and "is no longer empty: pod shop/web-" in skipped["message"]
    assert status["phase"] == "Succeeded"
    await unchanged(karpflow, B.name)
    assert_no_violations(karpflow.stack)


# A CapacityBuffer CRD of the test's own (Karpenter ships autoscaling.x-k8s.io_capacitybuffers.yaml;
# the emulator needs only the kind, its scope and the status subresource).
BUFFER_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "capacitybuffers.autoscaling.x-k8s.io"},
    "spec": {
        "group": "autoscaling.x-k8s.io",
        "scope": "Namespaced",
        "names": {"kind": "CapacityBuffer", "plural": "capacitybuffers", "singular": "capacitybuffer"},
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


@pytest.mark.sim_stack(scenario=scenario([A, B, C], PODS))
async def test_an_emptiness_command_refuses_its_nodes_when_a_capacity_buffer_grew_since_the_plan(karpflow):
    """A CapacityBuffer's pods exist in no API object, so the taint cannot see which node they would
    hold: a buffer that became ready (or bigger) after the plan, which accounted for none, leaves
    every candidate out and nothing changes (activities/buffer_guard.py)."""
    kube = karpflow.kube
    await kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=BUFFER_CRD)
    path = "/apis/autoscaling.x-k8s.io/v1beta1/namespaces/default/capacitybuffers"
    created = await kube.request(
        "POST",
        path,
        body={
            "apiVersion": "autoscaling.x-k8s.io/v1beta1",
            "kind": "CapacityBuffer",
            "metadata": {"name": "warm", "namespace": "default"},
            "spec": {"podTemplateRef": {"name": "warm-pods"}, "replicas": 2},
        },
    )
    created["status"] = {"replicas": 2, "conditions": [{"type": "ReadyForProvisioning", "status": "True"}]}
    await kube.request("PUT", f"{path}/warm/status", body=created)
    async with karpflow.worker():
        body = {"reason": "Empty", "nodes": [C.name], "capacity_buffers": {}}
        shown = await start_and_wait(karpflow, "DisruptionWorkflow", "disruption/default/Empty/buffer", body)
    assert "CapacityBuffer(s) default/warm (0 -> 2 replicas) changed since the plan" in shown
    await unchanged(karpflow, C.name)


async def _gone(karpflow, name: str) -> bool:
    return name not in await karpflow.nodes()


@pytest.mark.sim_stack(scenario=scenario([A, B], PODS))
async def test_a_refused_termination_of_a_deleted_node_is_retried_once_the_cause_is_fixed(karpflow):
    """`kubectl delete node` on a node whose instance lost its ownership tag: the watcher's termination
    is refused (nothing changed), says why it waits, and runs again with backoff; once the tag is
    back, the node is drained and its instance terminated."""
    from temporalio.client import WorkflowExecutionStatus

    instance_id = (await karpflow.nodes())[A.name]["spec"]["providerID"].rsplit("/", 1)[-1]
    tag = f"kubernetes.io/cluster/{karpflow.stack.cluster_name}"
    ec2 = karpflow.stack.ec2_client()
    ec2.delete_tags(Resources=[instance_id], Tags=[{"Key": tag}])
    termination = await karpflow.termination_id(A.name)
    async with karpflow.worker(node_watcher_retry=0.5) as worker:
        await karpflow.kube.delete_node(A.name)
        handle = karpflow.client.get_workflow_handle(termination)

        async def refused() -> bool:
            try:
                return (await handle.describe()).status == WorkflowExecutionStatus.FAILED
            except Exception:
                return False

        await karpflow.eventually(refused, within=30)
        await karpflow.eventually(lambda: _async(bool(worker.watcher.waiting.get(A.name))), within=30)
        assert "termination failed" in worker.watcher.waiting[A.name]
        assert A.name in await karpflow.nodes()  # still there, held by its finalizer
        ec2.create_tags(Resources=[instance_id], Tags=[{"Key": tag, "Value": "owned"}])

        async def gone() -> bool:
            return A.name not in await karpflow.nodes()

        await karpflow.eventually(gone, within=60, what=lambda: str(worker.watcher.waiting))
        # The failed run was found through visibility's query, not by describing every node.
        assert worker.watcher.visibility_failures == 0
    state = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["State"][
        "Name"
    ]
    assert state in ("shutting-down", "terminated")
    assert_no_violations(karpflow.stack)


async def _async(value: bool) -> bool:
    return value


@pytest.mark.sim_stack(scenario=scenario([A, B], PODS), time_scale=1)
async def test_a_notready_node_whose_instance_is_gone_is_removed_by_its_termination(karpflow):
    """The instance was terminated outside karpflow and the kubelet went silent (time scale 1: the
    simulated cloud node lifecycle controller would delete the node only 70 s later): a termination
    is not refused by the managed-node guard; its own "instance already gone" path releases the node."""
    instance_id = (await karpflow.nodes())[A.name]["spec"]["providerID"].rsplit("/", 1)[-1]
    karpflow.stack.ec2_client().terminate_instances(InstanceIds=[instance_id])
    node_ = (await karpflow.nodes())[A.name]
    node_["status"]["conditions"] = [c for c in node_["status"]["conditions"] if c["type"] != "Ready"] + [
        {
            "type": "Ready",
            "status": "Unknown",
            "reason": "NodeStatusUnknown",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ]
    await karpflow.kube.request("PUT", f"/api/v1/nodes/{A.name}/status", body=node_)
    async with karpflow.worker():
        handle = await karpflow.start_termination(A.name, reason="Unhealthy")
        status = await handle.result()
    assert "instance already gone" in status.message
    assert A.name not in await karpflow.nodes()
