"""A static NodePool's spot node interrupted (planner/interruption.py `static_replacement`, driven by the
interruption poller, cluster/interruption.py): one node of the pool's template restores the count, as
Karpenter's static provisioning controller does once the interrupted NodeClaim is deleting, never
dynamic capacity from another pool; within `limits.nodes`, and only while the pool is below its
replicas. Temporal and the API server are faked at their boundary (the client's calls, the API's
listing); the snapshot and catalog are the planner's own."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from activities.planning import without_offerings
from api.controller_io import OfferingUnavailable
from cluster.interruption import InterruptionPoller
from planner.interruption import spot_replacements
from sim.cluster_builder import ClusterBuilder

SPOT_OR_ON_DEMAND = [
    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]},
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
]
RECLAIMED = ("m5.large", "us-west-2a", "spot")


def static_cluster(replicas: int = 2, nodes: int = 2, limits: dict[str, str] | None = None) -> ClusterBuilder:
    """Static pool `fixed` (spot or on-demand) with `nodes` spot m5.large in us-west-2a, each running a
    pod, beside a dynamic pool `default` with room-rich nodes elsewhere."""
    b = ClusterBuilder()
    b.nodepool("default")
    b.nodepool("fixed", requirements=SPOT_OR_ON_DEMAND, replicas=replicas, limits=limits)
    for i in range(nodes):
        b.node(f"fixed-{i}", pool="fixed", zone="us-west-2a", capacity_type="spot")
        b.pod(f"app-{i}", f"fixed-{i}")
    b.node("roomy", instance_type="m5.2xlarge", zone="us-west-2b")
    return b


def reclaimed_catalog(b: ClusterBuilder):
    gone = OfferingUnavailable(
        instance_type="m5.large",
        zone="us-west-2a",
        capacity_type="spot",
        until=b.now.replace(year=b.now.year + 1),
        reason="spot interruption",
    )
    return without_offerings(b.catalog, [gone], b.now)


def test_the_interrupted_node_is_replaced_by_one_of_its_pools_template():
    """Karpenter static/provisioning/suite_test.go "Static Provisioning Controller / Reconcile / should
    create nodeclaims when current node count is less than desired replicas" and "should respect
    nodepool template specifications": the pods would fit on `roomy` (the old code planned nothing,
    leaving the pool one short of its replicas), but the count is the user's."""
    b = static_cluster()
    (replacement,) = spot_replacements(b.snapshot(), reclaimed_catalog(b), "fixed-0", RECLAIMED)
    assert replacement.nodepool == "fixed" and replacement.pods == 1
    assert replacement.offerings and RECLAIMED not in replacement.offerings
    capacity = [ct for _, _, ct in replacement.offerings]
    assert capacity[0] == "spot" and "on-demand" in capacity  # spot first, on-demand as the pool allows
    assert {t for t, _, _ in replacement.offerings} <= {it.name for it in b.catalog}


def test_no_replica_when_the_pool_keeps_its_count_or_its_node_limit_is_reached():
    """Karpenter static/provisioning/suite_test.go "should return early if current node count exceeds
    desired replicas" and "should not create additional nodeclaims when node limits are reached" (the
    interrupted node still counts against limits.nodes while it is there)."""
    over = static_cluster(replicas=1)
    assert spot_replacements(over.snapshot(), reclaimed_catalog(over), "fixed-0", RECLAIMED) == []
    capped = static_cluster(limits={"nodes": "2"})
    assert spot_replacements(capped.snapshot(), reclaimed_catalog(capped), "fixed-0", RECLAIMED) == []
    room = static_cluster(limits={"nodes": "3"})
    (replacement,) = spot_replacements(room.snapshot(), reclaimed_catalog(room), "fixed-0", RECLAIMED)
    assert replacement.nodepool == "fixed"


class FakeClient:
    def __init__(self) -> None:
        self.started: list[tuple[str, Any]] = []

    async def start_workflow(self, workflow: str, arg: Any, *, id: str, **_: Any) -> None:
        self.started.append((id, arg))

    def get_workflow_handle(self, _id: str) -> Any:
        class Handle:
            async def signal(self, *_: Any) -> None:
                return None

        return Handle()


class FakeKube:
    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = nodes

    async def list_nodes(self) -> dict[str, Any]:
        return {"items": self.nodes}


async def test_the_poller_starts_the_interruption_command_with_the_static_replica(
    monkeypatch: pytest.MonkeyPatch,
):
    b = static_cluster()
    node = next(o for o in b.objects if o["kind"] == "Node" and o["metadata"]["name"] == "fixed-0")
    instance = node["spec"]["providerID"].rsplit("/", 1)[-1]
    client = FakeClient()
    poller = InterruptionPoller(None, "queue", FakeKube([node]), client, "tq", "c", catalog=b.catalog)  # type: ignore[arg-type]
    snapshot = b.snapshot()

    async def current() -> Any:
        return snapshot

    async def nothing(*_: Any, **__: Any) -> None:
        return None

    monkeypatch.setattr(poller, "snapshot", current)
    monkeypatch.setattr(InterruptionPoller, "_record_event", nothing)
    body = {
        "version": "0",
        "id": "warning-1",
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": "us-west-2",
        "resources": [],
        "detail": {"instance-id": instance, "instance-action": "terminate"},
    }
    await poller.handle({"MessageId": "m-1", "Body": json.dumps(body)})
    ((workflow_id, command),) = client.started
    assert workflow_id == f"interruption/c/{instance}/spot"
    assert command.reason == "Interrupted" and command.nodes == ["fixed-0"]
    (replacement,) = command.replacements
    assert replacement.nodepool == "fixed"
    offerings = [(o.instance_type, o.zone, o.capacity_type) for o in replacement.offerings]
    assert offerings and RECLAIMED not in offerings
