"""One rule for "is this node disrupting" (kube/disruption.py), read the same by the planner's budgets
and by the NodeDisruptionBudget claims taken at the moment of acting (activities/budget_claims.py).

Issue 30 item 3: the claims read only `karpenter.sh/disrupted`. Beside Karpenter
(--karpenter-coexistence) karpflow's own taint is `karpflow.dev/disrupted`, so a node it had taken
counted as available: a second node could be claimed past the budget, and the sweep dropped the
claims of nodes karpflow was draining."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities import budget_claims
from api.constants import DISRUPTED_TAINT_KEY, KARPFLOW_DISRUPTED_TAINT_KEY
from api.node_disruption_budget import BudgetClaim
from kube.disruption import RawNodeState, is_disrupting
from kube.times import rfc3339
from planner.budgets import is_disrupting as planner_is_disrupting
from planner.node_disruption_budgets import read_ndb, unavailable
from planner.snapshot import Snapshot
from sim.cluster_builder import ClusterBuilder

TAINTS = [
    pytest.param({"key": DISRUPTED_TAINT_KEY, "effect": "NoSchedule"}, id="karpenter"),
    pytest.param({"key": KARPFLOW_DISRUPTED_TAINT_KEY, "effect": "NoSchedule"}, id="karpflow-beside"),
    pytest.param(
        {"key": "karpenter.sh/disruption", "value": "disrupting", "effect": "NoSchedule"}, id="v1beta1"
    ),
]


def ingress(name: str, taint: dict[str, Any] | None = None, ready: bool = True) -> dict[str, Any]:
    taints = [dict(taint)] if taint is not None else None
    return ClusterBuilder().node(name, labels={"example.com/role": "ingress"}, ready=ready, taints=taints)


def budget(max_unavailable: int) -> dict[str, Any]:
    return {
        "apiVersion": "karpflow.dev/v1alpha1",
        "kind": "NodeDisruptionBudget",
        "metadata": {"name": "ingress"},
        "spec": {
            "selector": {"matchLabels": {"example.com/role": "ingress"}},
            "maxUnavailable": max_unavailable,
        },
    }


@pytest.mark.parametrize("taint", TAINTS)
def test_a_claim_counts_a_node_under_either_disruption_taint_as_unavailable(taint):
    nodes = {"in-0": ingress("in-0", taint), "in-1": ingress("in-1")}
    denied = budget_claims.room(read_ndb(budget(1)), nodes, [], [nodes["in-1"]])
    assert denied is not None and denied.unavailable == 1, denied
    assert "(in-0)" in denied.message


@pytest.mark.parametrize("taint", TAINTS)
def test_the_planner_and_the_claims_read_the_same_nodes_as_disrupting(taint):
    tainted, plain, not_ready = ingress("a", taint), ingress("b"), ingress("c", ready=False)
    snapshot = Snapshot.from_objects([tainted, plain, not_ready])
    seen = {}
    for raw in (tainted, plain, not_ready):
        planned = snapshot.nodes[raw["metadata"]["name"]]
        claimed = budget_claims.is_down(raw)
        assert planner_is_disrupting(planned) == unavailable(planned) == claimed
        seen[planned.name] = claimed
    assert seen == {"a": True, "b": False, "c": True}


def test_a_node_only_deleting_is_disrupting_for_the_planner_but_not_yet_down_for_a_claim():
    """The one difference, on purpose: a `kubectl delete node` whose termination waits for its claim
    still runs its pods; counting it would grant its own claim at once, and two deletions would wait
    for each other."""
    raw = ingress("a")
    raw["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    state = RawNodeState.of(raw)
    assert is_disrupting(state) and not is_disrupting(state, counting_deleting=False)
    assert not budget_claims.is_down(raw)


class NodesOnly:
    """The two calls `sweep` makes: the nodes, and the budgets with their status (and writes)."""

    def __init__(self, nodes: list[dict[str, Any]], budgets: list[dict[str, Any]]) -> None:
        self.nodes = nodes
        self.budgets = {b["metadata"]["name"]: b for b in budgets}

    async def list_nodes(self) -> dict[str, Any]:
        return {"items": self.nodes}

    async def list_cluster_custom(self, *_: Any) -> list[dict[str, Any]]:
        return list(self.budgets.values())

    async def get_cluster_custom(self, _group: str, _version: str, _plural: str, name: str) -> dict[str, Any]:
        return self.budgets[name]

    async def replace_cluster_custom_status(self, *args: Any) -> dict[str, Any]:
        body = args[-1]
        self.budgets[body["metadata"]["name"]] = body
        return body


@pytest.mark.parametrize("taint", TAINTS)
async def test_the_sweep_keeps_a_claim_whose_node_is_tainted_by_a_command_that_stopped(taint):
    """The claim's holder no longer runs (its worker lost it, visibility lags), but its node carries a
    disruption taint: the node is going down, and its claim must keep counting."""
    node = ingress("in-0", taint)
    old = rfc3339(datetime.now(UTC) - timedelta(hours=1))
    claim = BudgetClaim(node="in-0", uid=node["metadata"]["uid"], holder="disruption/x/y@r", since=old)
    held = budget(1) | {"status": {"claims": [claim.to_wire()]}}
    kube = NodesOnly([node], [held])
    assert await budget_claims.sweep(kube, running=set(), older_than_seconds=60) == 0  # type: ignore[arg-type]
    assert [c["node"] for c in kube.budgets["ingress"]["status"]["claims"]] == ["in-0"]
