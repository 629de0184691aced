"""consolidateAfter on destination nodes (Karpenter v1.14, kubernetes-sigs/karpenter #3006): a
consolidation moves no pod onto an existing node still inside its own NodePool's consolidateAfter
window, measured from its last pod event, else from when it became Ready (planner/candidates.py
`under_consolidate_after`, the simulation's `consolidation=True`)."""

from __future__ import annotations

from datetime import timedelta

from planner.candidates import under_consolidate_after
from planner.model import PlanOptions
from planner.plan import plan
from planner.scheduling.adapter import SnapshotSimulation, settling_nodes
from planner.why_not import Kind, kind_of
from sim.cluster_builder import ClusterBuilder

ON_DEMAND = [
    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
]
RECENT, SETTLED = timedelta(seconds=30), timedelta(minutes=2)


def two_cheapest(dest_pod_age: timedelta, dest_pool: str = "default") -> ClusterBuilder:
    """Two nodes of the cheapest type (no cheaper replacement exists): the only move is to delete
    `src` and put its pod on `dest`, whose own pod started `dest_pod_age` ago."""
    b = ClusterBuilder()
    b.nodepool("default", consolidate_after="1m", budgets=[{"nodes": "100%"}], requirements=ON_DEMAND)
    if dest_pool != "default":
        b.nodepool(dest_pool, consolidate_after="Never", budgets=[{"nodes": "100%"}], requirements=ON_DEMAND)
    b.node("dest", instance_type="t3.micro", pool=dest_pool)
    b.pod("web-1", "dest", age=dest_pod_age)
    b.node("src", instance_type="t3.micro")
    b.pod("web-2", "src")
    return b


def run(b: ClusterBuilder):
    return plan(b.snapshot(), b.catalog, PlanOptions())


def test_no_pod_moves_onto_a_node_inside_its_window_until_it_ends():
    """Karpenter consolidation_test.go "Consolidation / Delete / should not consolidate pods onto a
    destination node that is under its consolidateAfter window": no command while the destination's
    window runs (the plan says why), the delete once it has passed (fails on the old code, which
    deleted `src` at once)."""
    within = run(two_cheapest(RECENT))
    assert within.commands == []
    reasons = {x.node: x.reason for x in within.blocked}
    assert "pods kept off dest: inside its NodePool's consolidateAfter window" in reasons["src"]
    assert kind_of(reasons["src"]) == Kind.CONSOLIDATE_AFTER  # the why-not answer, its metric and Event
    (command,) = run(two_cheapest(SETTLED)).commands  # either node may go: both are settled now
    assert command.decision == "delete" and len(command.nodes) == 1


def test_a_pool_with_consolidate_after_never_is_still_a_destination():
    """Karpenter consolidation_test.go "Consolidation / Delete / should consolidate pods onto a
    destination node with consolidateAfter set to Never": Never keeps the node from being a source,
    never from being a destination."""
    b = two_cheapest(RECENT, dest_pool="keep")
    (command,) = run(b).commands
    assert (command.decision, command.nodes) == ("delete", ["src"])


def test_a_replacement_is_not_held_back_by_a_settling_node():
    """Karpenter consolidation_test.go "Consolidation / Delete / should replace a node with a cheaper
    one even when consolidateAfter has not expired": the window gates existing destinations only, so
    the pod that may not join the settling node goes to a cheaper new one."""
    b = ClusterBuilder()
    b.nodepool("default", consolidate_after="1m", budgets=[{"nodes": "100%"}], requirements=ON_DEMAND)
    b.node("dest", instance_type="t3.small")
    b.pod("web-1", "dest", age=RECENT)
    b.node("src", instance_type="m5.large")
    b.pod("web-2", "src")
    (command,) = run(b).commands
    assert (command.decision, command.nodes) == ("replace", ["src"])
    assert command.replacements[0].pods == 1


def test_the_window_runs_from_the_last_pod_event_else_from_ready():
    """Karpenter pkg/utils/disruption/disruption.go `IsUnderConsolidateAfter`: the last pod event, else
    the node's initialization (karpflow: when it became Ready); never for 0 or Never, nor for a node
    not initialized."""
    b = ClusterBuilder()
    b.nodepool("default", consolidate_after="1m")
    b.nodepool("instant", consolidate_after="0s")
    b.node("fresh", ready_for=timedelta(seconds=20))
    b.node("old", ready_for=timedelta(hours=1))
    b.node("old-busy", ready_for=timedelta(hours=1))
    b.pod("web-1", "old-busy", age=RECENT)
    b.node("instant-busy", pool="instant")
    b.pod("web-2", "instant-busy", age=RECENT)
    b.node("joining", initialized=False, ready_for=timedelta(seconds=20))
    snapshot = b.snapshot()
    assert sorted(settling_nodes(snapshot)) == ["fresh", "old-busy"]
    node = snapshot.nodes["old"]
    assert not under_consolidate_after(node, snapshot.nodepools["default"], snapshot.now)


def test_pending_pods_and_pods_of_deleting_nodes_may_still_go_there():
    """Karpenter provisioning/scheduling/scheduler.go `addToExistingNode`: pending pods and pods from
    nodes marked for deletion are exempt; only the consolidation's own moved pods are kept off."""
    b = two_cheapest(RECENT)
    b.node("going", instance_type="t3.micro", deleting=True)
    b.pod("api-1", "going")
    b.pod("pending-1", None)
    snapshot = b.snapshot()
    prepared = SnapshotSimulation(snapshot, b.catalog)
    result = prepared.run(["src"], consolidation=True, max_new_claims=1)
    assert result.placements["default/api-1"] == "dest"
    assert result.placements["default/pending-1"] == "dest"
    assert result.placements["default/web-2"] != "dest"
    assert result.held_off == {"default/web-2": "dest"}
    plain = prepared.run(["src"], max_new_claims=1)  # drift, expiration: no window on destinations
    assert plain.placements["default/web-2"] == "dest" and plain.held_off == {}
