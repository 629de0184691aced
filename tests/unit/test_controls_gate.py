"""The taint's check of the controls outside the cluster (activities/controls_gate.py, issue 30 item 6):
the controller's pauses and rate budgets, for a command started by anyone. Temporal (the controller's
query, visibility) and the API server are faked at their boundary; the gate and the rules are real.
The same check on the real stack: tests/integration/controller/test_controls_at_the_taint.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.controls_gate import ControlsGate
from api import search_attributes as sa
from api.controller_io import Pause, Pauses
from sim.cluster_builder import ClusterBuilder

NOW = datetime.now(UTC)
COMMAND = "disruption/prod/default/Drifted/abc@run-1"


def cluster(budgets: list[dict[str, Any]] | None = None, nodes: int = 4) -> ClusterBuilder:
    b = ClusterBuilder(now=NOW)
    b.nodepool("default", budgets=budgets)
    for i in range(nodes):
        b.node(f"n{i}")
    return b


class FakeKube:
    def __init__(self, b: ClusterBuilder) -> None:
        self.objects = b.objects
        self.calls: Counter[str] = Counter()

    async def list_nodes(self, label_selector: str | None = None) -> dict[str, Any]:
        self.calls["list_nodes"] += 1
        return {"items": [o for o in self.objects if o["kind"] == "Node"]}

    async def get_cluster_custom(self, _group: str, _version: str, _plural: str, name: str) -> dict[str, Any]:
        self.calls["get nodepool"] += 1
        return next(o for o in self.objects if o["kind"] == "NodePool" and o["metadata"]["name"] == name)

    def node(self, name: str) -> dict[str, Any]:
        return next(o for o in self.objects if o["kind"] == "Node" and o["metadata"]["name"] == name)


class Listed:
    def __init__(self, node: str, minutes_ago: int, workflow_id: str = "", run_id: str = "run", **kw: Any):
        self.id, self.run_id = workflow_id or f"disruption/prod/default/Drifted/{node}", run_id
        self.workflow_type = kw.get("workflow_type", "DisruptionWorkflow")
        self.status = kw.get("status", WorkflowExecutionStatus.RUNNING)
        self.start_time = NOW - timedelta(minutes=minutes_ago)
        pairs = [SearchAttributePair(sa.NODES, [node]), SearchAttributePair(sa.NODEPOOL, "default")]
        self.typed_search_attributes = TypedSearchAttributes(pairs)


class FakeClient:
    def __init__(
        self, pauses: list[Pause] = (), started: list[Listed] = (), query_error: Exception | None = None
    ) -> None:
        self.pauses, self.started, self.query_error = list(pauses), list(started), query_error
        self.calls: Counter[str] = Counter()

    def get_workflow_handle(self, _workflow_id: str) -> FakeClient:
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


def gate(client: FakeClient) -> ControlsGate:
    return ControlsGate(client, "prod", "tq")  # type: ignore[arg-type]


async def refusal(
    client: FakeClient, b: ClusterBuilder, nodes: list[str], reason: str = "Drifted", **kw: Any
):
    kube = FakeKube(b)
    taking = [kube.node(n) for n in nodes]
    return await gate(client).refusal(kube, reason, kw.get("command", COMMAND), taking, NOW)  # type: ignore[arg-type]


def pause(**request: Any) -> Pause:
    return Pause(**request, reason="upgrade", by="ops", since=NOW)


async def test_a_pause_refuses_what_it_covers_at_the_taint():
    b = cluster()
    why = await refusal(FakeClient([pause(scope="nodepool", nodepool="default")]), b, ["n0"])
    assert why is not None and why.startswith("node n0: paused (NodePool default by ops: upgrade)"), why
    assert await refusal(FakeClient([pause(scope="action", action="Consolidation")]), b, ["n0"]) is None
    why = await refusal(
        FakeClient([pause(scope="action", action="Consolidation")]), b, ["n0"], "Underutilized"
    )
    assert why is not None and "paused" in why


async def test_a_rebalance_command_is_paused_as_rebalance_not_drift():
    b = cluster()
    rebalance = "interruption/prod/i-0abc/rebalance@run"
    drift_paused = FakeClient([pause(scope="action", action="Drift")])
    assert await refusal(drift_paused, b, ["n0"], command=rebalance) is None
    why = await refusal(FakeClient([pause(scope="action", action="Rebalance")]), b, ["n0"], command=rebalance)
    assert why is not None and "paused" in why


async def test_interruption_never_waits_for_the_controller():
    client = FakeClient(query_error=RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b""))
    assert (
        await refusal(client, cluster(), ["n0"], "Interrupted", command="interruption/prod/i-0/spot@r")
        is None
    )
    assert client.calls["query pauses"] == 0


@pytest.mark.parametrize(
    "error",
    [
        RPCError("deadline exceeded", RPCStatusCode.DEADLINE_EXCEEDED, b""),
        RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b""),
        TimeoutError("no worker answered"),
    ],
)
async def test_pauses_that_cannot_be_read_fail_closed_and_are_retried(error):
    with pytest.raises(ApplicationError) as raised:
        await refusal(FakeClient(query_error=error), cluster(), ["n0"])
    assert not raised.value.non_retryable and raised.value.type == "Unavailable"
    assert "pauses cannot be read" in raised.value.message and "no Drifted disruption" in raised.value.message


async def test_a_cluster_whose_controller_never_started_holds_no_pause():
    """(One that ended still holds its pauses: tests/unit/workflows/test_controller_pauses_query.py.)"""
    error = RPCError("not found", RPCStatusCode.NOT_FOUND, b"")
    assert await refusal(FakeClient(query_error=error), cluster(), ["n0"]) is None


async def test_a_rate_budget_counts_the_others_starts_and_not_the_commands_own():
    rated = cluster([{"nodes": "100%"}, {"nodes": "2", "per": "1h"}])
    own = Listed("n0", 1, workflow_id=COMMAND.partition("@")[0], run_id="run-1")
    assert await refusal(FakeClient(started=[own]), rated, ["n0"]) is None
    # The same id's earlier run took another node this hour: it counts.
    earlier = Listed("gone", 30, workflow_id=COMMAND.partition("@")[0], run_id="run-0")
    assert await refusal(FakeClient(started=[own, earlier]), rated, ["n0"]) is None
    two = [earlier, Listed("n3", 5)]
    why = await refusal(FakeClient(started=[own, *two]), rated, ["n0"])
    assert why is not None and "rate budget for Drifted is used up (2 per 1h: 2 started" in why, why
    # A start older than the period, or one that took nothing, does not count.
    rejected = Listed("n3", 5, status=WorkflowExecutionStatus.COMPLETED)
    rejected.typed_search_attributes = TypedSearchAttributes(
        [*rejected.typed_search_attributes, SearchAttributePair(sa.PHASE, "Rejected")]
    )
    assert await refusal(FakeClient(started=[earlier, Listed("x", 61), rejected]), rated, ["n0"]) is None


async def test_a_command_larger_than_the_rate_is_refused_whole():
    rated = cluster([{"nodes": "100%"}, {"nodes": "50%", "per": "1h"}])
    assert await refusal(FakeClient(), rated, ["n0", "n1"]) is None
    why = await refusal(FakeClient(), rated, ["n0", "n1", "n2"])
    assert why is not None and "2 per 1h" in why


async def test_visibility_is_read_only_for_a_pool_with_a_rate_budget_and_voluntary_reasons():
    client = FakeClient(started=[Listed("n3", 5)] * 5)
    assert await refusal(client, cluster(), ["n0"]) is None
    assert client.calls["list_workflows"] == 0
    rated = cluster([{"nodes": "1", "per": "1h"}])
    assert (
        await refusal(client, rated, ["n0"], "Expired", command="disruption/prod/default/Expired/x@r") is None
    )
    assert client.calls["list_workflows"] == 0


async def test_a_rate_budget_that_does_not_read_fails_the_pool_closed():
    broken = cluster([{"nodes": "1", "per": "soon"}])
    why = await refusal(FakeClient(), broken, ["n0"])
    assert why is not None and "fail closed" in why and "spec.disruption.budgets[0]" in why, why
