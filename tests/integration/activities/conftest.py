"""The activities at the moment of acting, one by one: karpflow's real Kubernetes and EC2 activities
over HTTP against the emulator (sim/apiserver, the real REST protocol: resourceVersion conflicts,
UID preconditions, finalizers) and EC2 in moto, without Temporal around them.

`World` seeds a NodePool, nodes and their instances the way production has them: instances tagged
at launch with `kubernetes.io/cluster/<name>: owned` and `karpenter.sh/nodepool`, nodes carrying
the NodePool label and the termination finalizer.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
import pytest_asyncio
from moto import mock_aws

from activities.cluster_endpoint import ClusterEndpoint
from activities.ec2 import EC2Activities
from activities.kubernetes import KubernetesActivities
from api.constants import CLUSTER_TAG_VALUE, TAG_NODEPOOL, cluster_tag
from kube.client import KubeApi
from sim.apiserver import EmulatorServer
from sim.cluster_builder import ClusterBuilder
from sim.timescale import TimeScale

CLUSTER = "prod"
REGION = "us-west-2"


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorServer]:
    with EmulatorServer(timescale=TimeScale(0.01), bookmark_interval=0.2) as server:
        yield server


@dataclass
class World:
    emu: EmulatorServer
    kube: KubeApi
    ec2: Any
    builder: ClusterBuilder = field(default_factory=ClusterBuilder)

    def aws(self) -> EC2Activities:
        endpoint = ClusterEndpoint(
            CLUSTER, endpoint="https://api.example", ca_bundle="Q0E=", service_cidr="172.20.0.0/16"
        )
        return EC2Activities(self.ec2, CLUSTER, poll_interval=0.01, endpoint=endpoint)

    def activities(self) -> KubernetesActivities:
        return KubernetesActivities(
            self.kube, poll_interval=0.01, ownership=self.aws().ownership, cluster=CLUSTER
        )

    def nodepool(self, name: str = "default", **options: Any) -> dict[str, Any]:
        return self.emu.store.create("nodepools", self.builder.nodepool(name, **options))

    def instance(self, tags: dict[str, str] | None = None, zone: str = "us-west-2a") -> str:
        """An instance as a launch by Karpenter or karpflow tags it (unless `tags` says otherwise)."""
        subnet = self.ec2.describe_subnets(Filters=[{"Name": "availability-zone", "Values": [zone]}])[
            "Subnets"
        ][0]
        if tags is None:
            tags = {cluster_tag(CLUSTER): CLUSTER_TAG_VALUE, TAG_NODEPOOL: "default"}
        launched = self.ec2.run_instances(
            ImageId="ami-12c6146b",
            InstanceType="m5.large",
            MinCount=1,
            MaxCount=1,
            SubnetId=subnet["SubnetId"],
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
            ]
            if tags
            else [],
        )
        return launched["Instances"][0]["InstanceId"]

    def node(self, name: str, instance_id: str | None = None, **options: Any) -> dict[str, Any]:
        """A registered, initialized node of the NodePool on `instance_id` (a new owned one if None)."""
        instance_id = instance_id or self.instance(
            {cluster_tag(CLUSTER): CLUSTER_TAG_VALUE, TAG_NODEPOOL: options.get("pool") or "default"}
        )
        obj = copy.deepcopy(self.builder.node(name, zone="us-west-2a", **options))
        obj["spec"]["providerID"] = f"aws:///us-west-2a/{instance_id}"
        return self.emu.store.create("nodes", obj, keep_status=True)

    def pod(self, name: str, node: str, **options: Any) -> dict[str, Any]:
        obj = self.builder.pod(name, node, **options)
        return self.emu.store.create("pods", obj, keep_status=True)

    def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return self.emu.store.get("nodes", name)
        except Exception:
            return None


@pytest_asyncio.fixture
async def world(emulator: EmulatorServer) -> AsyncIterator[World]:
    emulator.store.reset()
    emulator.faults.clear()
    emulator.requests.clear()
    kube = KubeApi.for_host(emulator.url, user_agent="karpflow-worker/tests")
    with mock_aws():
        try:
            yield World(emulator, kube, boto3.client("ec2", region_name=REGION))
        finally:
            await kube.close()
