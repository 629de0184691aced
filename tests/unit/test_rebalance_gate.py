"""The interruption poller's rebalance replacement passes the gate a pass applies (issue 30 item 6):
the controller's pauses, read with its `pauses` query, and the starts rate budgets count, read from
visibility. A unit test: Temporal and the API server are faked at their boundary (the client's query,
list and start calls; the API's requests); the poller, the gate and the planner are real.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from api import search_attributes as sa
from api.controller_io import Pause, Pauses
from cluster.interruption import REBALANCE_ANNOTATION, InterruptionPoller
from sim.cluster_builder import ClusterBuilder
from tests.unit.workflows.planning_stubs import StaticCache


def cluster(rate: str | None = None) -> ClusterBuilder:
    b = ClusterBuilder(now=datetime.now(UTC))
    b.nodeclass()
    budgets = [{"nodes": "100%"}] + ([{"nodes": rate, "per": "1h"}] if rate else [])
    pool = b.nodepool("default", budgets=budgets)
    pool["metadata"]["annotations"] = {REBALANCE_ANNOTATION: "true"}
    b.node("a", capacity_type="spot")
    b.node("b")
    return b


class Cache(StaticCache):
    """The informer cache's face to the poller: the planner's snapshot of the objects; instances are
    looked up in the API's node listing."""

    def node_by_instance(self, _instance_id: str) -> None:
        return None

    def current(self, _kind: str) -> None:
        return None  # no kind is watched here: the node is looked up in the listing


class FakeKube:
    def __init__(self, b: ClusterBuilder) -> None:
        self.objects = b.objects

    async def list_nodes(self, label_selector: str | None = None) -> dict[str, Any]:
        return {"items": [o for o in self.objects if o["kind"] == "Node"]}

    async def get_cluster_custom(self, _group: str, _version: str, _plural: str, name: str) -> dict[str, Any]:
        return next(o for o in self.objects if o["kind"] == "NodePool" and o["metadata"]["name"] == name)

    async def request(self, *_: Any, **__: Any) -> dict[str, Any]:
        return {}  # Events


class Listed:
    def __init__(self, node: str, minutes_ago: int) -> None:
        self.id, self.run_id = f"disruption/{node}", "run"
        self.workflow_type, self.status = "DisruptionWorkflow", WorkflowExecutionStatus.COMPLETED
        self.start_time = datetime.now(UTC) - timedelta(minutes=minutes_ago)
        self.typed_search_attributes = TypedSearchAttributes(
            [SearchAttributePair(sa.NODES, [node]), SearchAttributePair(sa.NODEPOOL, "default")]
        )


class FakeClient:
    """The controller answers its `pauses` query with `pauses` (or fails with `query_error`);
    visibility lists `started`; starts are counted."""

    def __init__(
        self, pauses: list[Pause] = (), started: list[Listed] = (), query_error: Exception | None = None
    ) -> None:
        self.pauses, self.started, self.query_error = list(pauses), list(started), query_error
        self.calls: Counter[str] = Counter()

    def get_workflow_handle(self, workflow_id: str) -> FakeClient:
        assert workflow_id.startswith("karpflow-controller/")
        return self

    async def query(self, name: str, **_: Any) -> Pauses:
        self.calls[f"query {name}"] += 1
        if self.query_error is not None:
            raise self.query_error
        return Pauses(pauses=self.pauses)

    def list_workflows(self, query: str) -> AsyncIterator[Listed]:
        self.calls["list_workflows"] += 1

        async def listed() -> AsyncIterator[Listed]:
            for execution in self.started:
                yield execution

        return listed()

    async def start_workflow(self, workflow: str, _input: Any, *, id: str, **_: Any) -> None:
        self.calls[f"start {id.split('/')[-1]}"] += 1


def recommendation(b: ClusterBuilder) -> dict[str, Any]:
    node = next(o for o in b.objects if o["kind"] == "Node" and o["metadata"]["name"] == "a")
    instance = node["spec"]["providerID"].rsplit("/", 1)[-1]
    body = {
        "version": "0",
        "id": "rebalance-1",
        "detail-type": "EC2 Instance Rebalance Recommendation",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": "us-west-2",
        "resources": [],
        "detail": {"instance-id": instance},
    }
    return {"MessageId": "m-1", "Body": json.dumps(body)}


async def handled(b: ClusterBuilder, client: FakeClient) -> InterruptionPoller:
    poller = InterruptionPoller(
        None,
        "queue",
        FakeKube(b),  # type: ignore[arg-type]
        client,  # type: ignore[arg-type]
        "tq",
        "prod",
        cache=Cache(b.objects),  # type: ignore[arg-type]
    )
    await poller.handle(recommendation(b))
    return poller


def paused(**request: Any) -> Pause:
    return Pause(**request, reason="incident", by="ops", since=datetime.now(UTC))


async def test_an_opted_in_pool_replaces_on_a_rebalance_recommendation():
    client = FakeClient()
    await handled(cluster(), client)
    assert client.calls["start rebalance"] == 1 and client.calls["query pauses"] == 1


@pytest.mark.parametrize(
    "pause",
    [
        paused(scope="global"),
        paused(scope="nodepool", nodepool="default"),
        paused(scope="action", action="Rebalance"),
    ],
    ids=["global", "the-pool", "rebalance"],
)
async def test_a_paused_controller_holds_the_rebalance_replacement_back(pause):
    client = FakeClient(pauses=[pause])
    await handled(cluster(), client)
    assert client.calls["start rebalance"] == 0


async def test_a_pause_of_another_pool_or_action_lets_it_go():
    client = FakeClient(
        pauses=[paused(scope="nodepool", nodepool="gpu"), paused(scope="action", action="Drift")]
    )
    await handled(cluster(), client)
    assert client.calls["start rebalance"] == 1


async def test_pauses_that_cannot_be_read_hold_it_back():
    client = FakeClient(query_error=RPCError("deadline exceeded", RPCStatusCode.DEADLINE_EXCEEDED, b""))
    poller = await handled(cluster(), client)
    assert client.calls["start rebalance"] == 0
    assert poller.counters["rebalance_controls_unreadable"] == 1


async def test_no_controller_means_no_pause():
    client = FakeClient(query_error=RPCError("not found", RPCStatusCode.NOT_FOUND, b""))
    await handled(cluster(), client)
    assert client.calls["start rebalance"] == 1


async def test_a_rate_budget_used_up_holds_it_back_and_is_read_only_when_there_is_one():
    client = FakeClient(started=[Listed("gone", 10)])
    await handled(cluster(rate="1"), client)
    assert client.calls["start rebalance"] == 0 and client.calls["list_workflows"] == 1

    older = FakeClient(started=[Listed("gone", 90)])  # before the hour
    await handled(cluster(rate="1"), older)
    assert older.calls["start rebalance"] == 1

    unrated = FakeClient(started=[Listed("gone", 10)])
    await handled(cluster(), unrated)
    assert unrated.calls["start rebalance"] == 1 and unrated.calls["list_workflows"] == 0
