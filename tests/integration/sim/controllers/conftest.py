"""Fixtures for the simulated-cluster controller tests: a real moto server over HTTP in process."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.config import Config
from kubernetes import client as k8s
from moto.server import ThreadedMotoServer

from api.constants import cluster_tag
from sim import ec2_faults
from sim.apiserver.runner import EmulatorServer
from sim.controllers.bootstrap import nodeconfig
from sim.controllers.kubelet_flags import parse_taints
from sim.controllers.nodes import NodeTimings
from sim.controllers.runner import SimControllers
from sim.timescale import TimeScale

REGION = "us-west-2"
logging.getLogger("werkzeug").setLevel(logging.ERROR)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server._server.server_port}"  # type: ignore[union-attr]
    # moto loads its AMI and instance type tables on first use (~2 s): pay that once, here.
    warm = ec2_client(endpoint)
    instance = warm.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)["Instances"][0]
    warm.terminate_instances(InstanceIds=[instance["InstanceId"]])
    try:
        yield endpoint
    finally:
        server.stop()


def ec2_client(endpoint: str, retries: int = 1):
    return boto3.client(
        "ec2",
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": retries, "mode": "standard"}),
    )


@pytest.fixture
def ec2(moto_endpoint: str):
    return ec2_client(moto_endpoint)


@pytest.fixture
def faults() -> Iterator[ec2_faults.Ec2Faults]:
    active = ec2_faults.install(ec2_faults.Ec2Faults())
    try:
        yield active
    finally:
        ec2_faults.uninstall(active)


@pytest.fixture
def cluster_name() -> str:
    # moto's state is one per process: a fresh cluster name keeps tests apart without a reset.
    return f"sim-{uuid.uuid4().hex[:8]}"


# --- a whole simulated cluster: emulator (own loop thread) + controllers + moto ---------------------


FAST = TimeScale(0.01)


@dataclass
class SimCluster:
    server: EmulatorServer
    controllers: SimControllers
    ec2: Any
    cluster_name: str
    faults: ec2_faults.Ec2Faults

    api: k8s.ApiClient

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api)

    @property
    def policy(self) -> k8s.PolicyV1Api:
        return k8s.PolicyV1Api(self.api)

    def launch(
        self,
        instance_type: str = "m5.large",
        count: int = 1,
        tags: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        taints: str = "",
        max_pods: int | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Instances whose user data bootstraps a kubelet with these labels and taints (kubelet flag
        syntax) and max pods, as a real AMI would read it."""
        all_tags = {cluster_tag(self.cluster_name): "owned", **(tags or {})}
        kwargs.setdefault(
            "UserData",
            nodeconfig(self.cluster_name, "https://sim.invalid", labels, parse_taints(taints), max_pods),
        )
        kwargs.setdefault("ImageId", "ami-12345678")
        response = self.ec2.run_instances(
            MinCount=count,
            MaxCount=count,
            InstanceType=instance_type,
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in all_tags.items()]}
            ],
            **kwargs,
        )
        return [i["InstanceId"] for i in response["Instances"]]

    def node_of(self, instance_id: str) -> Any:
        for node in self.core.list_node().items:
            if (node.spec.provider_id or "").endswith(f"/{instance_id}"):
                return node
        return None


def node_ready(node: Any) -> str | None:
    for cond in (node.status.conditions or []) if node is not None else []:
        if cond.type == "Ready":
            return cond.status
    return None


@pytest.fixture
def sim_cluster_factory(moto_endpoint: str, cluster_name: str):
    started: list[tuple[EmulatorServer, SimControllers]] = []
    active = ec2_faults.install(ec2_faults.Ec2Faults())

    def make(
        timings: NodeTimings | None = None,
        enabled: Any = None,
        pod_start_seconds: float = 2.0,
        ec2_source: str = "api",
    ) -> SimCluster:
        server = EmulatorServer(timescale=FAST).start_in_thread()
        controllers = SimControllers(
            server.store,
            ec2_endpoint=moto_endpoint,
            cluster_name=cluster_name,
            region=REGION,
            timescale=FAST,
            faults=active,
            node_timings=timings,
            enabled=enabled,
            pod_start_seconds=pod_start_seconds,
            ec2_source=ec2_source,
            api_endpoint="https://sim.invalid",
        )
        server.run_coroutine(controllers.start()).result(timeout=30)
        started.append((server, controllers))
        api = server.api_client()
        k8s.CoreV1Api(api).list_node()  # the client builds its models on first use (~1.5 s)
        return SimCluster(server, controllers, ec2_client(moto_endpoint), cluster_name, active, api)

    try:
        yield make
    finally:
        for server, controllers in started:
            server.run_coroutine(controllers.stop()).result(timeout=30)
            server.stop_thread()
        ec2_faults.uninstall(active)


@pytest.fixture
def sim_cluster(sim_cluster_factory) -> SimCluster:
    return sim_cluster_factory()
