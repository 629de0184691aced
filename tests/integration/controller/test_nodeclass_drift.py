"""The demo's `batch` pool on the local stack, driven by the controller: a patched EC2NodeClass drifts
its node, the replacement launches with the class's 100 GiB gp3 root volume (Karpenter's
`blockDeviceMappings` as users write them) and carries Karpenter's instance labels, and a newer AMI
in the class's status drifts that karpflow-launched node in turn (read from EC2, no label).

Real parts: the worker with its controller, the Temporal dev server, the emulator, moto (refusing
what EC2 refuses), kubectl for the user's patches."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from api.constants import NODEPOOL_LABEL
from sim.testing import assert_no_violations
from tests.integration.controller.test_controller import FAST, scenario, status, until_quiet
from tests.integration.workflows.conftest import Workload, gen

pytestmark = pytest.mark.integration

BATCH_NODE = next(n for n in gen.NODES if n.pool == "batch" and n.note.endswith("busy"))
QUEUE_WORKER = next(w for w in gen.WORKLOADS if w.name == "queue-worker")
SUFFIX = BATCH_NODE.ip.rsplit(".", 1)[-1]
# A batch workload that selects on Karpenter's instance labels: it finds the replacement only if
# registration wrote them (no kubelet does).
INDEXER = Workload(
    "batch",
    "indexer",
    "250m",
    "256Mi",
    [SUFFIX],
    node_selector={NODEPOOL_LABEL: "batch", "karpenter.k8s.aws/instance-category": "c"},
    tolerations=QUEUE_WORKER.tolerations,
)
DEMO_BATCH = scenario([dataclasses.replace(BATCH_NODE)], [QUEUE_WORKER, INDEXER], consolidate_after="1s")
INSTANCE_LABELS = (
    "karpenter.k8s.aws/instance-category",
    "karpenter.k8s.aws/instance-family",
    "karpenter.k8s.aws/instance-generation",
    "karpenter.k8s.aws/instance-size",
    "karpenter.k8s.aws/instance-cpu",
    "karpenter.k8s.aws/instance-memory",
    "karpenter.k8s.aws/instance-network-bandwidth",
    "karpenter.k8s.aws/instance-hypervisor",
    "karpenter.k8s.aws/instance-encryption-in-transit-supported",
    "karpenter.sh/capacity-type",
    "topology.k8s.aws/zone-id",
)


async def batch_nodes(karpflow: Any) -> dict[str, dict[str, Any]]:
    return {
        name: node
        for name, node in (await karpflow.nodes()).items()
        if (node["metadata"].get("labels") or {}).get(NODEPOOL_LABEL) == "batch"
        and not node["metadata"].get("deletionTimestamp")
    }


def instance_of(karpflow: Any, node: dict[str, Any]) -> dict[str, Any]:
    instance_id = node["spec"]["providerID"].rsplit("/", 1)[-1]
    described = karpflow.stack.ec2_client().describe_instances(InstanceIds=[instance_id])
    return described["Reservations"][0]["Instances"][0]


async def replaced(karpflow: Any, old: str, within: float = 120) -> dict[str, Any]:
    """The one batch node left once `old` is gone, initialized, with every batch pod Running on it."""

    async def done() -> dict[str, Any] | None:
        nodes = await batch_nodes(karpflow)
        if old in await karpflow.nodes() or len(nodes) != 1:
            return None
        ((name, node),) = nodes.items()
        if (node["metadata"].get("labels") or {}).get("karpenter.sh/initialized") != "true":
            return None
        pods = [p for p in await karpflow.pods() if p["metadata"]["namespace"] == "batch"]
        running = [
            p for p in pods if p["status"].get("phase") == "Running" and p["spec"].get("nodeName") == name
        ]
        return node if len(running) == len(pods) == 4 else None

    return await karpflow.eventually(done, within=within, what=f"node {old} replaced and its pods running")


async def completed_disruptions(karpflow: Any, count: int) -> list[str]:
    """The DisruptionWorkflows of this test, once `count` have completed (none failed)."""
    query = f'WorkflowType="DisruptionWorkflow" AND TaskQueue="{karpflow.task_queue}"'

    async def done() -> list[str] | None:
        found = []
        async for execution in karpflow.client.list_workflows(query):
            assert execution.status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.RUNNING), (
                execution.id,
                execution.status,
            )
            if execution.status == WorkflowExecutionStatus.COMPLETED:
                found.append(execution.id)
        return sorted(found) if len(found) == count else None

    return await karpflow.eventually(done, within=60, what=f"{count} completed disruption(s)")


def volumes(karpflow: Any, instance_id: str) -> list[tuple[str, int, str]]:
    found = karpflow.stack.ec2_client().describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [instance_id]}]
    )["Volumes"]
    return sorted((v["Attachments"][0]["Device"], v["Size"], v["VolumeType"]) for v in found)


async def kubectl(karpflow: Any, *args: str) -> None:
    await karpflow.run("kubectl", *args, **karpflow.stack.client_env())


@pytest.mark.sim_stack(scenario=DEMO_BATCH)
async def test_the_demo_batch_class_drifts_relaunches_with_its_volume_and_drifts_again_on_a_new_ami(karpflow):
    ec2 = karpflow.stack.ec2_client()
    async with karpflow.worker(**FAST):
        (seeded,) = await batch_nodes(karpflow)
        # The user adds a tag to the class: its hash changes, the node launched before drifts.
        patch = {"spec": {"tags": {"team": "batch", "cost-center": "42"}}}
        await kubectl(karpflow, "patch", "ec2nodeclass", "batch", "--type", "merge", "-p", json.dumps(patch))
        first = await replaced(karpflow, seeded)
        instance = instance_of(karpflow, first)
        assert volumes(karpflow, instance["InstanceId"]) == [("/dev/xvda", 100, "gp3")]
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags["cost-center"] == "42" and tags["team"] == "batch"
        (first_command,) = await completed_disruptions(karpflow, 1)
        assert first_command.startswith(f"disruption/{karpflow.stack.cluster_name}/batch/Drifted/")

        # Karpenter's labels, written at registration from EC2's description of the instance.
        labels = first["metadata"]["labels"]
        assert all(key in labels for key in INSTANCE_LABELS), sorted(set(INSTANCE_LABELS) - set(labels))
        assert labels["karpenter.k8s.aws/instance-family"] == instance["InstanceType"].split(".")[0]
        assert labels["karpenter.sh/capacity-type"] == "spot"
        subnet = ec2.describe_subnets(SubnetIds=[instance["SubnetId"]])["Subnets"][0]
        assert labels["topology.k8s.aws/zone-id"] == subnet["AvailabilityZoneId"]
        # The simulator wrote no label or annotation of karpflow's, nor an AMI, subnet or group one.
        annotations = first["metadata"].get("annotations") or {}
        assert not [k for k in [*labels, *annotations] if k.startswith("karpflow.io/") and "command" not in k]
        assert not [k for k in labels if k.endswith("-ami-id")]

        # Launched from the class as it is now, the replacement does not drift: passes go by quietly.
        await until_quiet(karpflow, after_passes=(await status(karpflow)).passes + 3)
        assert set(await batch_nodes(karpflow)) == {first["metadata"]["name"]}
        assert len(await completed_disruptions(karpflow, 1)) == 1

        # Karpenter resolves newer AMIs (one per architecture) into the class's status: the
        # karpflow-launched node drifts, as EC2 says it runs another image.
        newer = {
            kube_arch: max(
                ec2.describe_images(
                    Filters=[{"Name": "name", "Values": [f"amzn2-ami-hvm-2.0.*-{ec2_arch}-gp2"]}]
                )["Images"],
                key=lambda image: image["Name"],
            )
            for kube_arch, ec2_arch in (("amd64", "x86_64"), ("arm64", "arm64"))
        }
        assert instance["ImageId"] not in {image["ImageId"] for image in newer.values()}
        amis = [
            {
                "id": image["ImageId"],
                "name": image["Name"],
                "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": [arch]}],
            }
            for arch, image in newer.items()
        ]
        await kubectl(
            karpflow, "patch", "ec2nodeclass", "batch", "--subresource", "status", "--type", "merge",
            "-p", json.dumps({"status": {"amis": amis}}),
        )  # fmt: skip
        second = await replaced(karpflow, first["metadata"]["name"])
        arch = second["metadata"]["labels"]["kubernetes.io/arch"]
        assert instance_of(karpflow, second)["ImageId"] == newer[arch]["ImageId"]
        assert volumes(karpflow, instance_of(karpflow, second)["InstanceId"]) == [("/dev/xvda", 100, "gp3")]
        assert first_command in await completed_disruptions(karpflow, 2)
    assert_no_violations(karpflow.stack)
