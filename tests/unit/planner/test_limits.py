"""NodePool spec.limits (resources and `nodes`, Karpenter v1.11) bound every replacement karpflow plans.

Written from kubernetes-sigs/karpenter pkg/controllers/provisioning/suite_test.go Context "Resource
Limits" and the rule of pkg/controllers/disruption/helpers.go `SimulateScheduling` (the candidates are
left out of the state nodes, so their own capacity is freed first) with
pkg/controllers/provisioning/scheduling/scheduler.go (`remainingResources`, `filterByRemainingResources`,
`subtractMax`, the `nodes` check).
"""

from __future__ import annotations

from typing import Any

from planner.limits import within_limits
from planner.model import OPTIMAL_CONSOLIDATION, Command, DisruptionClass, PlanOptions
from planner.plan import plan
from planner.why_not import Kind, kind_of
from sim.cluster_builder import ClusterBuilder
from tests.unit.planner.test_optimal_consolidation import fragmented


def drifted_pool(limits: dict[str, str], *, full_neighbour: bool = True) -> ClusterBuilder:
    """Pool `capped` with m5.large c0 (a 1-CPU pod) and, optionally, m5.large c1 that has no room for
    it; the template changed after both launched, so both are drifted."""
    b = ClusterBuilder()
    b.nodeclass()
    b.nodepool("capped", limits=limits, labels={"team": "a"})
    b.node("c0", pool="capped")
    b.pod("app-1", "c0", cpu="1")
    if full_neighbour:
        b.node("c1", pool="capped")
        b.pod("big-1", "c1", cpu="1500m")
    pool = next(o for o in b.objects if o["kind"] == "NodePool")
    pool["spec"]["template"]["metadata"]["labels"] = {"team": "b"}
    return b


def run(b: ClusterBuilder, **options: Any):
    assert b.catalog is not None
    return plan(b.snapshot(), b.catalog, PlanOptions(**options))


def test_a_replacement_fits_node_limits_once_its_candidate_is_freed():
    # provisioning/suite_test.go Context "Resource Limits" It "should not schedule if limits would be exceeded
    # (node)", as a disruption: limits.nodes 2, two nodes; c0's own node is freed first, so one new node fits.
    result = run(drifted_pool({"nodes": "2"}))
    (command,) = result.commands_
    assert command.nodes == ["c0"] and len(command.replacements) == 1


def test_no_replacement_when_node_limits_leave_no_room():
    # The same It: a third node would exceed the limit. limits.nodes 1, two nodes: with c0 freed, c1 takes it.
    result = run(drifted_pool({"nodes": "1"}))
    assert result.commands_ == []
    reason = next(x.reason for x in result.blocked if x.node == "c0")
    assert "within limits" in reason


def test_a_cpu_limit_rules_out_types_bigger_than_the_room_left():
    # provisioning/suite_test.go Context "Resource Limits"
    # It "should not schedule if limits would be exceeded":
    # cpu 3 with c1 (2 CPU) staying leaves 1 CPU: no 2-CPU type fits; cpu 4 leaves room for one.
    assert run(drifted_pool({"cpu": "3"})).commands_ == []
    (command,) = run(drifted_pool({"cpu": "4"})).commands_
    assert all(t.cpu <= 2000 for t in command.replacements[0].instance_types)


def test_the_check_after_each_method_drops_a_command_beyond_the_limits_and_says_why():
    # The one check every method's commands pass (the Optimal strategy's too): scheduler.go's remaining
    # resources with the command's candidates freed (helpers.go SimulateScheduling).
    b = drifted_pool({"cpu": "3"})
    assert b.catalog is not None
    ctx = b.context()
    candidate = next(c for c in _candidates(ctx) if c.name == "c0")
    replacement_of = run(drifted_pool({"cpu": "4"})).commands_[0].replacements[0]
    command = Command("drift", "Drifted", [candidate], [replacement_of], DisruptionClass.EVENTUAL)
    assert within_limits(ctx, "drift", [command]) == []
    (why,) = ctx.explanations["c0"]
    assert "spec.limits.cpu (4 of 3" in why[1] and kind_of(why[1]) == Kind.LIMITS
    # Without c1 the pool has room once c0 is freed: the command is kept.
    b = drifted_pool({"cpu": "3"}, full_neighbour=False)
    ctx = b.context()
    candidate = next(c for c in _candidates(ctx) if c.name == "c0")
    command = Command("drift", "Drifted", [candidate], [replacement_of], DisruptionClass.EVENTUAL)
    assert within_limits(ctx, "drift", [command]) == [command]


def test_replacements_earlier_in_the_pass_take_their_room():
    b = drifted_pool({"nodes": "2"}, full_neighbour=False)
    b.node("c2", pool="capped")
    b.pod("app-2", "c2", cpu="1")
    ctx = b.context()
    by_name = {c.name: c for c in _candidates(ctx)}
    replacement_of = run(drifted_pool({"nodes": "2"})).commands_[0].replacements[0]
    first = Command("drift", "Drifted", [by_name["c0"]], [replacement_of, replacement_of])
    second = Command("drift", "Drifted", [by_name["c2"]], [replacement_of])
    # c0 freed: c2 + 2 new = 3 > 2. Alone, c2 freed: c0 + 1 new = 2 fits; after `first` kept nothing.
    assert within_limits(ctx, "drift", [first]) == []
    assert within_limits(ctx, "drift", [second]) == [second]
    third = Command("drift", "Drifted", [by_name["c0"]], [replacement_of])
    assert within_limits(ctx, "drift", [third]) == []  # c2's replacement holds the room now


def test_the_optimal_target_launches_nothing_into_a_pool_over_its_node_limit():
    # provisioning/suite_test.go Context "Resource Limits" It "should not schedule if limits would be exceeded
    # (node)", for the Optimal strategy: six nodes under limits.nodes 2, so the target only removes nodes.
    b = fragmented()
    pool = next(o for o in b.objects if o["kind"] == "NodePool")
    pool["spec"]["limits"] = {"nodes": "2"}
    result = run(b)
    moves = [c for c in result.commands_ if c.method == OPTIMAL_CONSOLIDATION]
    assert moves and all(c.replacements == [] for c in moves)
    # Without the limit the same fleet is consolidated onto a new node.
    unlimited = [c for c in run(fragmented()).commands_ if c.method == OPTIMAL_CONSOLIDATION]
    assert any(c.replacements for c in unlimited)


def _candidates(ctx: Any) -> list[Any]:
    from planner.candidates import build_candidates

    return build_candidates(ctx)[0]


def test_a_held_optimal_plan_whose_move_the_limits_refuse_is_dropped_with_the_reason():
    # provisioning/suite_test.go Context "Resource Limits" It "should not schedule if limits would be
    # exceeded", for a plan held across passes (planner/optimal/): its second move launches a node; the
    # pool's limits.cpu, lowered after the plan started, leave no room for it. The plan is dropped (its
    # markers and leaving taints go) with the limits' reason, instead of staying held without a move
    # (the old code kept it, and Karpenter's methods left the pool alone, until the plan was 1 h old).
    from tests.unit.planner.test_optimal_consolidation import carry_out

    b = fragmented(nodes=12, budget="2")
    first = plan(b.snapshot(), b.catalog)
    held = first.target_fleet.plan
    carry_out(b, first, [0])
    pool = next(o for o in b.objects if o["kind"] == "NodePool")
    pool["spec"]["limits"] = {"cpu": "37"}  # 44 CPUs run now; the next move would leave 38
    second = run(b)
    ended = second.target_fleet.ended
    assert ended.startswith(f"plan {held.id} dropped: the limits check refuses its move: ")
    assert "spec.limits.cpu (38 of 37" in ended
    plan_now = second.target_fleet.plan
    assert plan_now is None or plan_now.id != held.id  # a new plan may start, within the limits
    for command in second.commands_:
        assert command.replacements == []  # the pool is over its limit: nothing is launched into it
