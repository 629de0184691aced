"""Static NodePools (Karpenter v1.8 `spec.replicas`): never emptied or consolidated; StaticDrift.

Written from kubernetes-sigs/karpenter pkg/controllers/disruption/staticdrift_test.go (Describe
"StaticDrift"), emptiness.go / consolidation.go ShouldDisrupt (static pools skipped) and
nodeclaim/expiration/controller.go (no static case: static nodes expire).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from api.nodepool_reader import read_nodepool
from planner.candidates import STATIC_NEVER_CONSOLIDATED
from planner.model import EXPIRATION, PlanOptions
from planner.plan import plan
from planner.static_drift import STATIC_DRIFT
from planner.why_not import Kind, kind_of
from sim.cluster_builder import ClusterBuilder

ALL_DRIFTED = [{"nodes": "100%"}]  # the suite's BeforeEach: Budgets [{Nodes: "100%"}] ("Disrupt away!")


def static_cluster(
    nodes: int,
    *,
    replicas: int,
    limits: dict[str, str] | None = None,
    budgets: list[dict[str, Any]] | None = None,
    drifted: bool = True,
) -> ClusterBuilder:
    """A static pool `static` with `nodes` nodes; `drifted`: its template changed after they launched
    (NodePoolDrifted), as the Karpenter tests set Drifted=True on every NodeClaim."""
    b = ClusterBuilder()
    b.nodeclass()
    b.nodepool(
        "static",
        replicas=replicas,
        limits=limits,
        budgets=budgets if budgets is not None else ALL_DRIFTED,
        labels={"team": "a"},
    )
    for i in range(nodes):
        b.node(f"s{i}", pool="static")
    if drifted:
        pool = next(o for o in b.objects if o["kind"] == "NodePool" and o["metadata"]["name"] == "static")
        pool["spec"]["template"]["metadata"]["labels"] = {"team": "b"}
    return b


def run(b: ClusterBuilder, **options: Any):
    assert b.catalog is not None
    return plan(b.snapshot(), b.catalog, PlanOptions(**options))


def static_commands(b: ClusterBuilder) -> list[Any]:
    return [c for c in run(b).commands if c.method == STATIC_DRIFT]


def reason_for(result: Any, node: str) -> str:
    return next(b.reason for b in result.blocked if b.node == node)


# --- Never emptied or consolidated ------------------------------------------------------------------


def test_an_empty_static_node_is_left_alone_and_says_why():
    # emptiness.go / consolidation.go ShouldDisrupt: `if c.OwnedByStaticNodePool() { return false }`.
    b = static_cluster(2, replicas=2, drifted=False)
    result = run(b)
    assert result.commands == []
    assert STATIC_NEVER_CONSOLIDATED in reason_for(result, "s0")
    assert kind_of(reason_for(result, "s0")) == Kind.STATIC_NODEPOOL


def test_an_underutilized_static_node_is_not_consolidated_while_a_dynamic_one_is():
    b = static_cluster(1, replicas=1, drifted=False)
    b.nodepool("dynamic")
    b.node("d0", pool="dynamic", instance_type="m5.2xlarge")
    b.pod("web-1", "d0")
    b.pod("web-2", "s0")
    result = run(b, all_methods=True)
    nodes = {n for c in result.commands for n in c.nodes}
    assert "s0" not in nodes and "d0" in nodes
    assert STATIC_NEVER_CONSOLIDATED in reason_for(result, "s0")


def test_no_replacement_launches_into_a_static_pool():
    # provisioner.go NewScheduler filters out static NodePools: dynamic capacity never goes there.
    b = static_cluster(1, replicas=1, drifted=False)
    b.nodepool("dynamic")
    b.node("d0", pool="dynamic", instance_type="m5.2xlarge")
    b.pod("web-1", "d0", cpu="3")
    result = run(b, all_methods=True)
    assert all(r.nodepool != "static" for c in result.commands for r in c.replacements)


# --- StaticDrift ------------------------------------------------------------------------------------


def test_static_drift_replaces_each_node_one_for_one():
    # staticdrift_test.go Context "Edge Cases" It "should handle missing node limits gracefully":
    # replicas 5, no limits, 5 drifted -> 5 commands.
    cmds = static_commands(static_cluster(5, replicas=5))
    assert len(cmds) == 5
    for cmd in cmds:
        assert len(cmd.nodes) == 1 and len(cmd.replacements) == 1
        assert cmd.replacements[0].nodepool == "static" and cmd.reason == "Drifted"


def test_static_drift_respects_the_budget_node_count():
    # staticdrift_test.go Context "Budgets"
    # It "should respect disruption budgets (Nodes Count) for static drift".
    b = static_cluster(5, replicas=5, budgets=[{"nodes": "2", "reasons": ["Drifted"]}])
    assert len(static_commands(b)) == 2


def test_static_drift_respects_the_budget_percentage():
    # staticdrift_test.go Context "Budgets"
    # It "should respect disruption budgets (Nodes Percentage) for static drift":
    # 20% of 5 nodes -> 1.
    b = static_cluster(5, replicas=5, budgets=[{"nodes": "20%", "reasons": ["Drifted"]}])
    assert len(static_commands(b)) == 1


def test_static_drift_waits_when_limits_nodes_leaves_no_room():
    # staticdrift_test.go Context "Limits and Scaling"
    # It "should not drift nodes when we cannot acquire limits":
    # replicas 5, limits.nodes 5, 5 nodes -> no command (each replacement launches before its node goes).
    b = static_cluster(5, replicas=5, limits={"nodes": "5"})
    result = run(b)
    assert [c for c in result.commands if c.method == STATIC_DRIFT] == []
    assert "limits.nodes 5 leaves no room" in reason_for(result, "s0")
    assert kind_of(reason_for(result, "s0")) == Kind.LIMITS


def test_static_drift_replaces_when_limits_nodes_leaves_room():
    # staticdrift_test.go Context "Limits and Scaling" It "should drift nodes when we can acquire limits":
    # replicas 5, limits.nodes 5, 2 nodes -> 2 commands.
    assert len(static_commands(static_cluster(2, replicas=5, limits={"nodes": "5"}))) == 2


def test_static_drift_replaces_only_as_many_as_limits_nodes_leaves_room_for():
    # staticdrift_test.go Context "Limits and Scaling"
    # It "should drift partially when we can acquire some limits":
    # replicas 5, limits.nodes 7, 5 nodes -> 2 commands.
    b = static_cluster(5, replicas=5, limits={"nodes": "7"})
    result = run(b)
    assert len([c for c in result.commands if c.method == STATIC_DRIFT]) == 2
    waiting = [x for x in result.blocked if "replaced per pass now" in x.reason]
    assert len(waiting) == 3 and {kind_of(x.reason) for x in waiting} == {Kind.NOT_CHOSEN}


def test_static_drift_waits_while_the_pool_is_over_its_replicas():
    # staticdrift_test.go Context "Limits and Scaling" It "should wait until nodes are deprovisioned when we
    # are overscaled": replicas 1 with 2 nodes -> nothing; once one is gone -> 1 command.
    b = static_cluster(2, replicas=1)
    b.pod("app-1", "s0", cpu="1")
    result = run(b)
    assert [c for c in result.commands if c.method == STATIC_DRIFT] == []
    assert "over its 1 replicas" in reason_for(result, "s0")
    b = static_cluster(1, replicas=1)
    b.pod("app-1", "s0", cpu="1")
    assert len(static_commands(b)) == 1


def test_a_node_being_deleted_does_not_count_towards_replicas_but_towards_limits_nodes():
    # NodePoolState: the replicas check reads active + pending disruption, ReserveNodeCount also deleting.
    b = static_cluster(2, replicas=2)
    b.node("gone", pool="static", deleting=True)
    assert len(static_commands(b)) == 2
    b = static_cluster(2, replicas=2, limits={"nodes": "3"})
    b.node("gone", pool="static", deleting=True)
    assert static_commands(b) == []


def test_a_replacement_in_flight_makes_static_drift_wait():
    # Karpenter counts the replacement NodeClaim as active once created: running + pending > replicas.
    b = static_cluster(2, replicas=2)
    b.node("s9", pool="static", taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}])
    result = run(b)
    assert static_commands(b) == []
    assert "over its 2 replicas" in reason_for(result, "s0")


def test_zero_replicas_drifts_nothing():
    # staticdrift_test.go Context "Edge Cases" It "should handle zero replicas".
    assert static_commands(static_cluster(1, replicas=0)) == []


def test_nodes_that_are_not_drifted_are_ignored():
    # staticdrift_test.go Context "Edge Cases" It "should ignore nodes without the drifted status condition".
    assert static_commands(static_cluster(1, replicas=1, drifted=False)) == []


def test_a_do_not_disrupt_node_is_ignored():
    # staticdrift_test.go Context "Edge Cases" It "should ignore nodes with the karpenter.sh/do-not-disrupt
    # annotation".
    b = static_cluster(0, replicas=1)
    b.node("s0", pool="static", annotations={"karpenter.sh/do-not-disrupt": "true"})
    assert static_commands(b) == []


def test_pools_are_handled_independently():
    # staticdrift_test.go Context "Multiple NodePools" It "should handle drift for multiple static NodePools
    # independently": a pool at its node limit waits, the others drift.
    b = static_cluster(2, replicas=2)
    b.nodepool("capped", replicas=2, limits={"nodes": "2"}, budgets=ALL_DRIFTED, labels={"team": "a"})
    b.node("c0", pool="capped")
    b.node("c1", pool="capped")
    capped = next(o for o in b.objects if o["kind"] == "NodePool" and o["metadata"]["name"] == "capped")
    capped["spec"]["template"]["metadata"]["labels"] = {"team": "b"}
    pools = [c.nodepools for c in static_commands(b)]
    assert pools == [["static"], ["static"]]


def test_dynamic_drift_leaves_static_pools_to_static_drift():
    # drift.go ShouldDisrupt: `!c.OwnedByStaticNodePool() && Drifted`.
    cmds = run(static_cluster(1, replicas=1)).commands
    assert [c.method for c in cmds] == [STATIC_DRIFT]


# --- Expiration applies to static pools -------------------------------------------------------------


def test_an_expired_static_node_is_replaced_one_for_one_within_limits_nodes():
    # nodeclaim/expiration/controller.go has no static case; static/provisioning/controller.go restores the
    # count within limits.nodes (ReserveNodeCount).
    b = static_cluster(0, replicas=1, drifted=False)
    b.node("s0", pool="static", age=timedelta(days=40))
    cmds = [c for c in run(b).commands if c.method == EXPIRATION]
    assert len(cmds) == 1 and [r.nodepool for r in cmds[0].replacements] == ["static"]
    b = static_cluster(0, replicas=1, limits={"nodes": "1"}, drifted=False)
    b.node("s0", pool="static", age=timedelta(days=40))
    cmds = [c for c in run(b).commands if c.method == EXPIRATION]
    assert len(cmds) == 1 and cmds[0].replacements == []


# --- Reading -----------------------------------------------------------------------------------------


def test_an_invalid_replicas_reads_as_zero_and_is_reported():
    pool, problems = read_nodepool({"metadata": {"name": "p"}, "spec": {"replicas": -2}})
    assert pool.spec.replicas == 0 and pool.spec.is_static
    assert problems and "spec.replicas" in problems[0]


def test_an_invalid_limit_reads_as_zero_and_is_reported():
    pool, problems = read_nodepool(
        {"metadata": {"name": "p"}, "spec": {"limits": {"nodes": "many", "cpu": "4"}}}
    )
    assert pool.spec.limits == {"nodes": "0", "cpu": "4"}
    assert problems and "spec.limits.nodes" in problems[0]


def test_a_repaired_static_node_is_replaced_one_for_one():
    # Karpenter's node repair deletes the NodeClaim (no static case) and its static provisioning
    # controller launches a node of the template in its place.
    b = static_cluster(4, replicas=5, drifted=False)
    b.node("sick", pool="static", ready=False, ready_for=timedelta(minutes=31))
    (command,) = run(b).commands
    assert command.method == "repair" and [r.nodepool for r in command.replacements] == ["static"]


def test_static_drift_under_strict_waits_when_the_launch_cannot_meet_min_values():
    """A static NodeClaim carries its pool's requirements (Karpenter's NodeClaimTemplate.ToNodeClaim
    leaves static ones to the cloud provider), and the AWS provider's launch Truncates its options to
    60 checking minValues under Strict (pkg/providers/instance/instance.go `filterInstanceTypes`):
    the pool allows two existing types with minValues 3, so Strict waits and says why; BestEffort
    replaces with the two."""
    b = static_cluster(1, replicas=1)
    pool = next(o for o in b.objects if o["kind"] == "NodePool" and o["metadata"]["name"] == "static")
    pool["spec"]["template"]["spec"]["requirements"] = [
        {
            "key": "node.kubernetes.io/instance-type",
            "operator": "In",
            "values": ["m5.large", "m5.xlarge", "x9.large"],
            "minValues": 3,
        }
    ]
    strict = run(b)
    assert [c for c in strict.commands if c.method == STATIC_DRIFT] == []
    assert "couldn't meet minValues requirements at launch" in reason_for(strict, "s0")
    (command,) = [c for c in run(b, min_values_policy="BestEffort").commands if c.method == STATIC_DRIFT]
    assert command.replacements[0].instance_types == ["m5.large", "m5.xlarge"]
