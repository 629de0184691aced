"""The `collect_garbage` activity: EC2 in moto (in process, through the real EC2 activities and their
ownership-guarded terminate), the cluster cache, the Kubernetes API and Temporal faked at their
boundaries. The rule itself is tests/unit/test_garbage_rules.py; the real stack is
tests/integration/workflows/test_garbage_collection.py."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from moto import mock_aws
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities import errors
from activities.garbage_collection import GarbageCollector
from api.garbage_io import GarbageCollectionRequest
from kube.client import Json, KubeError
from runtime.metrics import REGISTRY
from tests.unit.workflows.test_ec2_activities import REGION, aws, request

CLOSED = "disruption/prod/default/Drifted/closed"
OPEN = "disruption/prod/default/Drifted/open"
RUN = "run-1"


class FakeCache:
    """ClusterCache as the collector reads it: Nodes by instance, NodePools, synced and current."""

    def __init__(self) -> None:
        self.nodes: dict[str, Json] = {}  # instance id -> node
        self.pools: list[Json] = [{"metadata": {"name": "default", "uid": "pool-uid"}}]
        self.stale_reasons: list[str] = []

    def start(self) -> None:
        pass

    async def wait_ready(self, within: float) -> bool:
        return True

    def unsynced(self) -> list[str]:
        return []

    def stale(self) -> list[str]:
        return list(self.stale_reasons)

    def node_by_instance(self, instance_id: str) -> Json | None:
        return self.nodes.get(instance_id)

    def objects_of(self, kind: str) -> list[Json]:
        return self.pools if kind == "NodePool" else []


class FakeKube:
    """The Kubernetes API: nodes by name (read-modify-write, delete with a UID precondition), Events."""

    def __init__(self) -> None:
        self.nodes: dict[str, Json] = {}
        self.events: list[Json] = []
        self.deleted: list[str] = []

    async def find_node(self, name: str) -> Json | None:
        return copy.deepcopy(self.nodes.get(name))

    async def update_node(self, name: str, mutate: Callable[[Json], bool]) -> Json:
        if name not in self.nodes:
            raise KubeError(404, "Not Found")
        node = copy.deepcopy(self.nodes[name])
        if mutate(node):
            self.nodes[name] = node
        return node

    async def delete_node(self, name: str, uid: str | None = None) -> None:
        if name not in self.nodes:
            raise KubeError(404, "Not Found")
        if uid and self.nodes[name]["metadata"]["uid"] != uid:
            raise KubeError(409, "Conflict")
        assert not self.nodes[name]["metadata"].get("finalizers"), "deleted before its finalizer was dropped"
        del self.nodes[name]
        self.deleted.append(name)

    async def request(self, method: str, path: str, body: Json | None = None, **_: Any) -> Json:
        assert method == "POST" and path.endswith("/events"), (method, path)
        self.events.append(body or {})
        return body or {}


class FakeTemporal:
    """Describe by workflow id: the latest run's status and chain, not found, or an error."""

    def __init__(self) -> None:
        self.workflows: dict[str, Any] = {}
        self.described: list[str] = []

    def run(
        self, workflow_id: str, status: WorkflowExecutionStatus, run_id: str = RUN, first: str = RUN
    ) -> None:
        self.workflows[workflow_id] = SimpleNamespace(
            status=status, run_id=run_id, raw_info=SimpleNamespace(first_run_id=first)
        )

    def get_workflow_handle(self, workflow_id: str) -> Any:
        async def describe() -> Any:
            self.described.append(workflow_id)
            found = self.workflows.get(workflow_id)
            if found is None:
                raise RPCError(f"workflow not found for ID: {workflow_id}", RPCStatusCode.NOT_FOUND, b"")
            if isinstance(found, Exception):
                raise found
            return found

        return SimpleNamespace(describe=describe)


class World:
    def __init__(self, ec2: Any) -> None:
        self.ec2 = ec2
        self.aws = aws(ec2, "prod", poll_interval=0.01)
        self.cache, self.kube, self.temporal = FakeCache(), FakeKube(), FakeTemporal()
        self.later = timedelta(hours=1)  # how long after now the collection runs

    async def launch(self, workflow_id: str = CLOSED, index: int = 0) -> str:
        launched = await self.aws.launch_instance(
            request(self.ec2, index=index, command=f"{workflow_id}@{RUN}")
        )
        return launched.instance_id

    async def collect(self, **fields: float) -> Any:
        collector = GarbageCollector(
            self.cache,  # type: ignore[arg-type]
            self.kube,  # type: ignore[arg-type]
            self.temporal,  # type: ignore[arg-type]
            self.aws,
            "prod",
            clock=lambda: datetime.now(UTC) + self.later,
        )
        return await collector.collect_garbage(GarbageCollectionRequest(**fields))

    def state(self, instance_id: str) -> str:
        described = self.ec2.describe_instances(InstanceIds=[instance_id])
        return described["Reservations"][0]["Instances"][0]["State"]["Name"]

    def node(self, instance_id: str, *, initialized: bool = False, unregistered: bool = True) -> Json:
        name = f"ip-{instance_id}"
        node: Json = {
            "metadata": {
                "name": name,
                "uid": f"uid-{instance_id}",
                "labels": {"karpenter.sh/initialized": "true"} if initialized else {},
                "finalizers": ["karpenter.sh/termination"],
            },
            "spec": {
                "providerID": f"aws:///us-west-2a/{instance_id}",
                "taints": [{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]
                if unregistered
                else [],
            },
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        self.cache.nodes[instance_id] = copy.deepcopy(node)
        self.kube.nodes[name] = copy.deepcopy(node)
        return node


@pytest.fixture
def world() -> Iterator[World]:
    with mock_aws():
        yield World(boto3.client("ec2", region_name=REGION))


def collected_count(reason: str) -> float:
    labels = {
        "reason": reason,
        "nodepool": "default",
        "capacity_type": "on-demand",
        "consolidation_policy": "",  # Karpenter's garbage collection reports none (#3179)
        "termination_mode": "graceful",  # the pool sets no terminationGracePeriod
    }
    return REGISTRY.get_sample_value("karpenter_nodeclaims_disrupted_total", labels) or 0.0


async def test_a_closed_commands_instance_with_no_node_is_terminated_with_an_event_and_a_metric(world):
    instance = await world.launch()  # its workflow is not found: closed (retention passed, or never)
    before = collected_count("garbage_collected")
    result = await world.collect()

    assert world.state(instance) == "terminated"
    assert [(c.instance_id, c.reason, c.node) for c in result.collected] == [
        (instance, "garbage_collected", None)
    ]
    assert result.collected[0].command_id == f"{CLOSED}@{RUN}"
    assert collected_count("garbage_collected") == before + 1
    (event,) = world.kube.events
    assert event["reason"] == "InstanceGarbageCollected" and event["type"] == "Warning"
    assert event["involvedObject"] == {
        "kind": "NodePool",
        "name": "default",
        "apiVersion": "karpenter.sh/v1",
        "uid": "pool-uid",
    }
    assert instance in event["message"] and "no Node registered" in event["message"]
    assert world.temporal.described == [CLOSED]
    assert (await world.collect()).collected == []  # idempotent: terminated is not listed as live


@pytest.mark.parametrize(
    "status",
    [WorkflowExecutionStatus.TERMINATED, WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.COMPLETED],
)
async def test_any_closed_run_of_the_command_closes_it(world, status):
    world.temporal.run(CLOSED, status)
    instance = await world.launch()
    await world.collect()
    assert world.state(instance) == "terminated"


async def test_a_running_command_keeps_its_instance_and_so_does_its_reset(world):
    world.temporal.run(OPEN, WorkflowExecutionStatus.RUNNING)
    world.temporal.run(f"{OPEN}-reset", WorkflowExecutionStatus.RUNNING, run_id="run-2", first=RUN)
    kept = [await world.launch(OPEN), await world.launch(f"{OPEN}-reset")]
    result = await world.collect()

    assert result.collected == [] and result.in_doubt == [] and result.instances == 2
    assert [world.state(i) for i in kept] == ["running", "running"]


async def test_a_later_command_that_reused_the_id_does_not_keep_the_earlier_ones_instance(world):
    world.temporal.run(CLOSED, WorkflowExecutionStatus.RUNNING, run_id="run-9", first="run-9")
    instance = await world.launch()
    await world.collect()
    assert world.state(instance) == "terminated"


@pytest.mark.parametrize(
    "failure",
    [
        RPCError("connection refused", RPCStatusCode.UNAVAILABLE, b""),
        RPCError("Namespace default is not found.", RPCStatusCode.NOT_FOUND, b""),
        RuntimeError("a bug"),
    ],
    ids=["unavailable", "namespace-not-found", "bug"],
)
async def test_a_command_temporal_cannot_vouch_for_is_kept_and_said_to_be_in_doubt(world, failure):
    world.temporal.workflows[CLOSED] = failure
    instance = await world.launch()
    result = await world.collect()

    assert world.state(instance) == "running" and result.collected == []
    assert len(result.in_doubt) == 1 and instance in result.in_doubt[0]


async def test_a_launch_within_its_grace_period_is_not_even_asked_about(world):
    world.later = timedelta(seconds=0)
    instance = await world.launch()
    result = await world.collect(grace_seconds=30)

    assert world.state(instance) == "running" and result.collected == []
    assert world.temporal.described == []


@pytest.mark.parametrize("missing", ["kubernetes.io/cluster/prod", "karpenter.sh/nodepool"])
async def test_an_instance_without_the_ownership_tags_is_never_terminated(world, missing):
    """Tagged with a closed command but not owned (an EKS node group's instance carries the cluster tag
    alone; a hand-made one anything): never listed as garbage, never terminated."""
    tags = {
        "kubernetes.io/cluster/prod": "owned",
        "karpenter.sh/nodepool": "default",
        "karpflow.io/command-id": f"{CLOSED}@{RUN}",
    }
    del tags[missing]
    instance = world.ec2.run_instances(
        ImageId="ami-x86",
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ],
    )["Instances"][0]["InstanceId"]
    result = await world.collect()

    assert world.state(instance) == "running"
    assert result.collected == [] and result.instances == 0 and world.temporal.described == []


async def test_a_node_that_never_initialized_goes_with_its_instance_after_the_registration_ttl(world):
    instance = await world.launch()
    node = world.node(instance)
    world.later = timedelta(minutes=5)
    assert (await world.collect()).collected == []  # registered only 5 min ago: Karpenter waits 15
    assert world.state(instance) == "running"

    world.later = timedelta(minutes=16)
    before = collected_count("registration_timeout")
    result = await world.collect()

    assert world.state(instance) == "terminated"
    assert world.kube.deleted == [node["metadata"]["name"]]
    ((collected),) = result.collected
    assert (collected.reason, collected.node) == ("registration_timeout", node["metadata"]["name"])
    assert "never initialized (still unregistered)" in collected.why
    assert collected_count("registration_timeout") == before + 1
    on = {(e["involvedObject"]["kind"], e["involvedObject"].get("uid")) for e in world.kube.events}
    assert on == {("NodePool", "pool-uid"), ("Node", node["metadata"]["uid"])}


async def test_a_node_that_initialized_since_the_cache_saw_it_is_kept_with_its_instance(world):
    instance = await world.launch()
    node = world.node(instance)
    world.kube.nodes[node["metadata"]["name"]]["metadata"]["labels"]["karpenter.sh/initialized"] = "true"
    result = await world.collect()

    assert result.collected == [] and world.state(instance) == "running" and world.kube.deleted == []


async def test_an_initialized_node_keeps_its_instance_whatever_its_command(world):
    instance = await world.launch()
    world.node(instance, initialized=True)
    assert (await world.collect()).collected == []
    assert world.state(instance) == "running" and world.temporal.described == []


async def test_a_retry_after_the_termination_releases_the_node_left_behind(world):
    """A collection that terminated the instance and died before deleting the Node: the next one
    finds the instance ending, and deletes the Node (no second count: the instance was counted)."""
    instance = await world.launch()
    node = world.node(instance)
    world.ec2.terminate_instances(InstanceIds=[instance])
    before = collected_count("registration_timeout") + collected_count("garbage_collected")
    result = await world.collect()

    assert world.kube.deleted == [node["metadata"]["name"]]
    assert [c.node for c in result.collected] == [node["metadata"]["name"]]
    assert collected_count("registration_timeout") + collected_count("garbage_collected") == before


async def test_a_refused_termination_is_a_problem_of_the_result_and_the_node_stays(world, monkeypatch):
    instance = await world.launch()
    node = world.node(instance)

    async def refuse(_: Any) -> Any:
        raise ApplicationError("refusing to terminate: not owned", type=errors.NOT_OWNED, non_retryable=True)

    monkeypatch.setattr(world.aws, "terminate_instance", refuse)
    result = await world.collect()

    assert result.collected == [] and world.kube.deleted == []
    assert node["metadata"]["name"] in world.kube.nodes
    assert result.problems == [f"instance {instance}: refusing to terminate: not owned"]


async def test_no_collection_on_a_stale_cache(world):
    await world.launch()
    world.cache.stale_reasons = ["Node not watched for 90s"]
    with pytest.raises(ApplicationError) as stale:
        await world.collect()
    assert stale.value.type == errors.STALE_VIEW and not stale.value.non_retryable


async def test_every_page_of_the_listing_is_read(world):
    instances = [await world.launch(index=i) for i in range(7)]
    listed = await world.aws.command_launches(page_size=5)
    assert sorted(i["InstanceId"] for i in listed) == sorted(instances)
