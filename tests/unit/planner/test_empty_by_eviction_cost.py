"""Empty by eviction cost (Karpenter v1.14 `Candidate.IsEmpty`, pkg/controllers/disruption/types.go):
a node whose reschedulable pods add no positive eviction cost is empty, deleted by Emptiness without
a simulation, and left alone by consolidation (planner/emptiness.py, kube/eviction_cost.py)."""

from __future__ import annotations

import pytest

from kube.eviction_cost import empty_by_eviction_cost, eviction_cost, reschedule_disruption_cost
from planner.emptiness import Emptiness
from planner.model import PlanOptions
from planner.plan import plan, validate_command
from sim.cluster_builder import ClusterBuilder

COST = "controller.kubernetes.io/pod-deletion-cost"
FREE = {COST: str(-(2**27))}  # eviction cost 1 - 1 = 0
NEGATIVE = {COST: "-2147483647"}  # the annotation's minimum: eviction cost about -15, clamped to -10


def run(b: ClusterBuilder, methods=None):
    return plan(b.snapshot(), b.catalog, PlanOptions(), methods=methods)


def emptied(b: ClusterBuilder) -> list[str]:
    return sorted(n for c in run(b, [Emptiness()]).commands if c.method == "emptiness" for n in c.nodes)


@pytest.mark.parametrize(
    ("annotations", "priority", "cost"),
    [
        ({}, None, 1.0),
        (FREE, None, 0.0),
        (NEGATIVE, None, -10.0),
        ({COST: "2147483647"}, None, 10.0),
        ({}, -(2**25), 0.0),
        ({COST: "not-a-number"}, None, 1.0),
    ],
)
def test_eviction_cost_of_a_pod(annotations, priority, cost):
    """Karpenter pkg/utils/disruption/disruption.go `EvictionCost` (1 + deletion-cost/2^27 +
    priority/2^25, clamped to [-10, 10]), as the planner's parsed pod reads it."""
    assert eviction_cost(annotations, priority or 0) == pytest.approx(cost)
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("n1")
    b.pod("web-1", "n1", annotations=annotations, priority=priority)
    (pod,) = b.snapshot().nodes["n1"].pods
    assert pod.eviction_cost == pytest.approx(cost)


def test_a_node_is_empty_when_no_pod_adds_a_positive_cost():
    """Karpenter balanced_scoring_test.go "Candidate.SavingsRatio / should compute expected ratios for
    different configurations" (no pods: 1.0; three default pods: 1.0 + 3.0) and types.go `IsEmpty`
    (cost at most the per-node base)."""
    assert reschedule_disruption_cost([]) == 1.0 and empty_by_eviction_cost([])
    assert reschedule_disruption_cost([1.0, 1.0, 1.0]) == 4.0 and not empty_by_eviction_cost([1.0, 1.0, 1.0])
    assert empty_by_eviction_cost([0.0, -10.0]) and reschedule_disruption_cost([0.0, -10.0]) == 1.0
    assert not empty_by_eviction_cost([-10.0, 1e-9])


def test_a_node_whose_pods_cost_nothing_to_evict_is_deleted_by_emptiness():
    """Karpenter emptiness_test.go "Emptiness / Metrics / should correctly report eligible nodes": a node
    is skipped while its pod adds disruption cost above the base; here the pods add none (very negative
    deletion cost), so Emptiness takes the node, with no replacement, and says its drain evicts them."""
    b = ClusterBuilder()
    b.nodepool("default", budgets=[{"nodes": "100%"}])
    b.node("cheap-pods")
    b.pod("batch-1", "cheap-pods", annotations=NEGATIVE)
    b.pod("batch-2", "cheap-pods", annotations=FREE)
    b.node("busy")
    b.pod("web-1", "busy")
    result = run(b, [Emptiness()])
    (command,) = result.commands
    assert (command.method, command.reason, command.nodes, command.replacements) == (
        "emptiness",
        "Empty",
        ["cheap-pods"],
        [],
    )
    assert command.pods == 2
    assert "2 pod(s) with no positive eviction cost" in command.message


def test_one_pod_with_a_positive_cost_keeps_the_node_non_empty():
    """Karpenter emptiness_test.go "Emptiness / Emptiness / should ignore nodes that have pods": one pod
    of default cost (1.0) is enough, whatever the others' costs."""
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("mixed")
    b.pod("batch-1", "mixed", annotations=NEGATIVE)
    b.pod("web-1", "mixed")  # eviction cost 1.0
    b.node("slightly-negative")
    b.pod("web-2", "slightly-negative", annotations={COST: "-1000"})  # 1 - 1000/2^27: still positive
    assert emptied(b) == []


def test_negative_priority_makes_a_pod_free_to_evict():
    """Karpenter disruption.go `EvictionCost`: priority / 2^25 enters the cost too."""
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("n1")
    b.pod("preemptible-1", "n1", priority=-(2**25))
    assert emptied(b) == ["n1"]


def test_consolidation_leaves_such_a_node_to_emptiness_and_its_budget():
    """Karpenter consolidation.go `ShouldDisrupt` ("Empty nodes are handled by Emptiness (reason Empty)
    for correct budget accounting") and emptiness_test.go "Emptiness / Budgets / should allow no empty
    nodes to be disrupted": with the Empty budget at 0, neither Emptiness nor consolidation (under the
    Underutilized budget) deletes the node."""
    b = ClusterBuilder()
    b.nodepool("default", budgets=[{"nodes": "0", "reasons": ["Empty"]}, {"nodes": "100%"}])
    b.node("cheap-pods")
    b.pod("batch-1", "cheap-pods", annotations=NEGATIVE)
    b.node("other")
    b.pod("web-1", "other")
    result = run(b)
    assert [c.nodes for c in result.commands if "cheap-pods" in c.nodes] == []
    reasons = {x.node: x.reason for x in result.blocked}
    assert "allows no Empty disruptions" in reasons["cheap-pods"]


def test_a_when_empty_pool_deletes_such_a_node():
    """Karpenter emptiness.go `ShouldDisrupt` runs for WhenEmpty and WhenEmptyOrUnderutilized alike."""
    b = ClusterBuilder()
    b.nodepool("default", policy="WhenEmpty")
    b.node("n1")
    b.pod("batch-1", "n1", annotations=FREE)
    assert emptied(b) == ["n1"]


def test_validation_drops_a_node_whose_pods_became_costly():
    """Karpenter validation.go `EmptinessValidator` keeps the candidates still empty: a pod of default
    cost landing during the 15 s wait leaves that node out."""
    b = ClusterBuilder()
    b.nodepool("default", budgets=[{"nodes": "100%"}])
    b.node("n0")
    b.pod("batch-1", "n0", annotations=FREE)
    b.node("n1")
    b.pod("batch-2", "n1", annotations=FREE)
    planned = run(b, [Emptiness()]).commands[0]
    assert planned.nodes == ["n0", "n1"]
    b.pod("arrived", "n1")
    result = validate_command(b.snapshot(), b.catalog, planned, methods=[Emptiness()])
    assert result.valid and result.command.nodes == ["n0"]
