"""Multi- and single-node consolidation, one behaviour per test (behaviour notes §2.2 to §2.5)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from planner.budgets import build_budget_map
from planner.candidates import build_candidates, sort_by_disruption_cost
from planner.catalog import catalog_from_dict
from planner.consolidation import (
    MultiNodeConsolidation,
    SingleNodeConsolidation,
    compute_consolidation,
    filter_out_same_instance_type,
    spot_last,
)
from planner.model import PlanOptions
from planner.plan import command_out, plan
from planner.scheduling.adapter import simulate
from planner.scheduling.results import ClaimOption
from tests.unit.planner.sched_fixtures import (
    CATALOG,
    NOW,
    context,
    from_yaml,
    node,
    nodepool,
    pod,
    replicas,
    snapshot,
)

AMD64_ON_DEMAND = [
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
]


class FakeClock:
    """Monotonic seconds that advance by `step` on every read: timeouts without waiting."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        value = self.now
        self.now += self.step
        return value


def run_method(method, snap, catalog=CATALOG, clock=None, **options):
    """What planner.plan does for one method: eligible candidates in cost order, a fresh budget map."""
    ctx = context(snap, catalog, **options)
    ctx.simulate = simulate
    if clock is not None:
        ctx.clock = clock
    candidates, _ = build_candidates(ctx)
    eligible = [c for c in candidates if c.pod_block is None and method.should_disrupt(ctx, c)]
    budgets = build_budget_map(ctx, method.reason)
    return method.compute(ctx, sort_by_disruption_cost(eligible), budgets), ctx


def single(snap, **kwargs):
    return run_method(SingleNodeConsolidation(), snap, **kwargs)


def multi(snap, **kwargs):
    return run_method(MultiNodeConsolidation(), snap, **kwargs)


def catalog_with(prices: dict[str, dict[tuple[str, str], float]], shapes: dict[str, tuple[int, int]]):
    """A catalog with per-offering prices {type: {(zone, ct): price}} and shapes {type: (cpu, GiB)}."""
    return catalog_from_dict(
        {
            "region": "test-1",
            "instanceTypes": [
                {
                    "name": name,
                    "cpu": str(shapes[name][0]),
                    "memory": f"{shapes[name][1]}Gi",
                    "pods": 30,
                    "allocatable": {
                        "cpu": str(shapes[name][0]),
                        "memory": f"{shapes[name][1]}Gi",
                        "pods": "30",
                    },
                    "offerings": [
                        {"zone": z, "capacityType": ct, "price": p} for (z, ct), p in offers.items()
                    ],
                }
                for name, offers in prices.items()
            ],
        }
    )


# --- decisions ------------------------------------------------------------------------------------


def test_delete_when_every_pod_fits_on_the_remaining_nodes():
    snap = snapshot(nodepool(), node("a"), node("b"), pod("one", "a"), pod("two", "b"))
    [command], _ = single(snap)
    assert command.decision == "delete" and command.nodes == ["a"]
    assert command.savings_per_hour == pytest.approx(0.192)
    assert "saves $0.1920/h" in command.message


def test_replace_with_one_cheaper_node():
    snap = snapshot(nodepool(), node("a", "m5.2xlarge"), pod("app", "a", cpu="1", memory="1Gi"))
    [command], _ = single(snap)
    assert command.decision == "replace"
    [replacement] = command.replacements
    assert replacement.instance_type_names[0] == "m6g.large"
    assert replacement.capacity_type == "on-demand"
    assert [p.name for p in replacement.pods] == ["app"]


def test_savings_are_guaranteed_at_the_worst_case_price_the_decision_uses():
    snap = snapshot(nodepool(), node("a", "m5.2xlarge"), pod("app", "a", cpu="1", memory="1Gi"))
    [command], _ = single(snap)
    # Options cheaper than $0.384 run from m6g.large ($0.077) to m5.xlarge ($0.192): any may launch.
    assert command.savings_per_hour == pytest.approx(0.384 - 0.192)
    assert command.savings_per_hour_best == pytest.approx(0.384 - 0.077)
    assert "saves $0.1920/h, up to $0.3070/h" in command.message
    out = command_out(command)
    assert (out.savings_per_hour, out.savings_per_hour_best) == (0.192, 0.307)
    assert (out.replacements[0].price, out.replacements[0].worst_case_price) == (0.077, 0.192)


def test_replacement_must_be_strictly_cheaper():
    snap = snapshot(
        nodepool(requirements=AMD64_ON_DEMAND), node("a", "c5.large"), pod("app", "a", cpu="1500m")
    )
    commands, ctx = single(snap)
    assert commands == []
    assert any("Can't replace with a cheaper node" in why for _, why in ctx.explanations["a"])


def test_replacement_options_are_compared_at_their_worst_case_price():
    catalog = catalog_with(
        {
            "m5.xlarge": {("test-1a", "on-demand"): 0.192, ("test-1b", "on-demand"): 0.192},
            "m5.large": {
                ("test-1a", "on-demand"): 0.09,
                ("test-1b", "on-demand"): 0.30,
            },  # cheap in one zone only
            "c5.large": {("test-1a", "on-demand"): 0.15, ("test-1b", "on-demand"): 0.15},
        },
        {"m5.xlarge": (4, 16), "m5.large": (2, 8), "c5.large": (2, 4)},
    )
    snap = snapshot(nodepool(), node("a", "m5.xlarge"), pod("app", "a", cpu="1", memory="2Gi"))
    [command], _ = single(snap, catalog=catalog)
    assert command.replacements[0].instance_type_names == ["c5.large"]


def test_never_replaces_one_node_with_two():
    snap = snapshot(nodepool(), node("a", "m5.4xlarge"), replicas("big", [("a", 3)], cpu="6", memory="1Gi"))
    commands, ctx = single(snap)
    assert commands == []
    assert any("more than one new node" in why for _, why in ctx.explanations["a"])


def test_pods_that_fit_nowhere_block_consolidation_with_the_reason():
    # The pool is at its cpu limit without a, and b is full: a's pod has nowhere to go.
    snap = snapshot(
        nodepool(limits={"cpu": "4"}),
        node("a"),
        node("b"),
        pod("app", "a", cpu="3"),
        pod("full", "b", cpu="4"),
    )
    commands, ctx = single(snap)
    assert commands == []
    assert any("cannot be rescheduled" in why for _, why in ctx.explanations["a"])


def test_on_demand_node_replaced_by_a_spot_or_on_demand_claim_is_pinned_to_spot():
    pool = nodepool(
        requirements=[
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]}
        ]
    )
    snap = snapshot(pool, node("a", "m5.xlarge"), pod("app", "a", cpu="1"))
    [command], _ = single(snap)
    replacement = command.replacements[0]
    assert replacement.capacity_type == "spot"
    assert replacement.instance_type_names[0] == "m6g.large"
    assert replacement.price == pytest.approx(0.032)


# --- spot -----------------------------------------------------------------------------------------

SPOT_POOL = nodepool(
    requirements=[{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]
)


def test_spot_nodes_are_only_deleted_without_spot_to_spot():
    snap = snapshot(SPOT_POOL, node("a", "m5.2xlarge", capacity_type="spot"), pod("app", "a"))
    commands, ctx = single(snap)
    assert commands == []
    assert any("SpotToSpotConsolidation is disabled" in why for _, why in ctx.explanations["a"])
    deletable = snapshot(
        SPOT_POOL,
        node("a", "m5.2xlarge", capacity_type="spot"),
        node("b", "m5.2xlarge", capacity_type="spot"),
        pod("app", "a"),
        pod("other", "b"),
    )
    [command], _ = single(deletable)
    assert command.decision == "delete"


def _many_spot_types(count: int):
    prices = {"x1.big": {("test-1a", "spot"): 0.5}}
    shapes = {"x1.big": (8, 32)}
    for i in range(count):
        prices[f"x1.s{i:02d}"] = {("test-1a", "spot"): 0.01 * (i + 1)}
        shapes[f"x1.s{i:02d}"] = (2, 4)
    return catalog_with(prices, shapes)


def test_single_node_spot_to_spot_needs_15_cheaper_types():
    snap = snapshot(SPOT_POOL, node("a", "x1.big", capacity_type="spot"), pod("app", "a", cpu="1"))
    commands, ctx = single(snap, catalog=_many_spot_types(10), spot_to_spot=True)
    assert commands == []
    assert any(
        "requires 15 cheaper instance type options" in why and "got 10" in why
        for _, why in ctx.explanations["a"]
    )


def test_single_node_spot_to_spot_launches_with_the_15_cheapest():
    snap = snapshot(SPOT_POOL, node("a", "x1.big", capacity_type="spot"), pod("app", "a", cpu="1"))
    [command], _ = single(snap, catalog=_many_spot_types(20), spot_to_spot=True)
    replacement = command.replacements[0]
    assert replacement.capacity_type == "spot"
    assert replacement.instance_type_names == [f"x1.s{i:02d}" for i in range(15)]


def test_multi_node_spot_to_spot_has_no_flexibility_rule():
    snap = snapshot(
        SPOT_POOL,
        node("a", "x1.big", capacity_type="spot"),
        node("b", "x1.big", capacity_type="spot"),
        pod("one", "a", cpu="500m"),
        pod("two", "b", cpu="500m"),
    )
    [command], _ = multi(snap, catalog=_many_spot_types(5), spot_to_spot=True)
    assert command.nodes == ["a", "b"]
    assert len(command.replacements[0].instance_type_names) == 5


# --- multi-node -----------------------------------------------------------------------------------


def test_multi_node_takes_the_longest_valid_prefix():
    # a, b, c (one pod each) come before d (two pods). All four fit on one m5.2xlarge at half the price.
    snap = snapshot(
        nodepool(requirements=AMD64_ON_DEMAND),
        node("a"),
        node("b"),
        node("c"),
        node("d"),
        pod("pa", "a"),
        pod("pb", "b"),
        pod("pc", "c"),
        replicas("pd", [("d", 2)], cpu="500m"),
    )
    method = MultiNodeConsolidation()
    [command], _ = run_method(method, snap)
    assert command.nodes == ["a", "b", "c", "d"]
    assert command.decision == "replace"
    assert command.replacements[0].instance_type_names[0] == "c5.xlarge"  # 4 cpu, 5 GiB
    assert command.savings_per_hour == pytest.approx(4 * 0.192 - 0.170)
    assert method.probes == 2  # prefixes of 3, then 4 nodes


def test_multi_node_prefers_delete_prefix_when_the_whole_set_cannot_consolidate():
    # e (16 cpu, not a candidate) leaves 1 cpu of the 17-cpu limit once a..d go: no new node can
    # launch, so the longest valid prefix is a, b, c, whose pods fit on d.
    snap = snapshot(
        nodepool(requirements=AMD64_ON_DEMAND, limits={"cpu": "17"}),
        node("a"),
        node("b"),
        node("c"),
        node("d"),
        node("e", "m5.4xlarge", annotations={"karpenter.sh/do-not-disrupt": "true"}),
        pod("pa", "a"),
        pod("pb", "b"),
        pod("pc", "c"),
        replicas("pd", [("d", 2)], cpu="500m"),
        pod("pe", "e", cpu="16"),
    )
    [command], _ = multi(snap)
    assert command.decision == "delete" and command.nodes == ["a", "b", "c"]


def test_multi_node_needs_at_least_two_candidates():
    snap = snapshot(nodepool(), node("a", "m5.2xlarge"), pod("app", "a"))
    assert multi(snap)[0] == []


def test_filter_out_same_instance_type_keeps_only_options_cheaper_than_a_removed_node_of_that_type():
    snap = snapshot(
        nodepool(requirements=AMD64_ON_DEMAND),
        node("a", "c5.large"),
        node("b", "c5.large"),
        pod("one", "a"),
        pod("two", "b"),
    )
    ctx = context(snap)
    candidates, _ = build_candidates(ctx)
    options = [ClaimOption("c5.large", 0.085, 0.085), ClaimOption("m5.large", 0.096, 0.096)]
    assert filter_out_same_instance_type(options, candidates) == []
    # Replacing the two c5.large with one c5.large is really deleting one: multi-node declines.
    assert multi(snap)[0] == []


MIN_VALUES_POOL = """
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}
      requirements:
      - {key: kubernetes.io/arch, operator: In, values: [amd64]}
      - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}
      - key: node.kubernetes.io/instance-type
        operator: In
        values: [c5.large, m5.large, r5.large, c5.xlarge, m5.xlarge]
        minValues: {min_values}
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 0s
    budgets: [{nodes: "100%"}]
"""


@pytest.mark.parametrize(("min_values", "kept"), [(1, ["c5.large"]), (2, None)])
def test_filtering_out_the_removed_nodes_types_must_leave_the_pools_min_values(min_values, kept):
    # Two m5.large ($0.096 each) fit one new node; price leaves c5.large, m5.large, r5.large and
    # c5.xlarge, then filterOutSameInstanceType keeps only c5.large (cheaper than a removed m5.large).
    snap = snapshot(
        from_yaml(MIN_VALUES_POOL.replace("{min_values}", str(min_values))),
        node("a", "m5.large"),
        node("b", "m5.large"),
        pod("pa", "a", cpu="750m", memory="1536Mi"),
        pod("pb", "b", cpu="750m", memory="1536Mi"),
    )
    commands, _ = multi(snap)
    assert [c.replacements[0].instance_type_names for c in commands] == ([kept] if kept else [])


def test_multi_node_spends_the_budget_per_candidate_and_skips_pools_without_budget():
    pool = nodepool(requirements=AMD64_ON_DEMAND, budgets=[{"nodes": "2"}])
    snap = snapshot(
        pool,
        node("a"),
        node("b"),
        node("c"),
        node("d"),
        pod("pa", "a"),
        pod("pb", "b"),
        pod("pc", "c"),
        replicas("pd", [("d", 3)], cpu="500m"),
    )
    ctx = context(snap)
    ctx.simulate = simulate
    candidates, _ = build_candidates(ctx)
    budgets = build_budget_map(ctx, "Underutilized")
    [command] = MultiNodeConsolidation().compute(ctx, sort_by_disruption_cost(candidates), budgets)
    assert command.nodes == ["a", "b"]
    assert budgets.available("default") == 0


EMPTY_BUDGET_FROZEN = """
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}
      requirements: [{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}]
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 0s
    budgets:
    - {nodes: "0", reasons: [Empty]}
    - {nodes: "100%"}
"""


def test_multi_node_leaves_empty_nodes_to_emptiness_so_an_empty_budget_of_zero_holds():
    snap = snapshot(
        from_yaml(EMPTY_BUDGET_FROZEN),
        node("e1", "m5.large"),
        node("e2", "m5.large"),
        node("e3", "m5.large"),
        node("busy", "m5.2xlarge"),
        pod("app", "busy"),
    )
    commands, ctx = multi(snap)
    assert commands == []
    assert ("multi-node-consolidation", "empty: left to emptiness") in ctx.explanations["e1"]
    # The whole pass: emptiness is frozen, so the empty nodes survive every method.
    result = plan(snap, CATALOG)
    assert all(not {"e1", "e2", "e3"} & set(c.nodes) for c in result.commands)


def test_multi_node_timeout_returns_the_best_command_so_far():
    snap = snapshot(
        nodepool(requirements=AMD64_ON_DEMAND),
        node("a"),
        node("b"),
        node("c"),
        node("d"),
        pod("pa", "a"),
        pod("pb", "b"),
        pod("pc", "c"),
        replicas("pd", [("d", 2)], cpu="500m"),
    )
    method = MultiNodeConsolidation()
    # 40 s per clock read: the first probe runs (t=40 < 60), the second check sees t=80.
    [command], _ = run_method(method, snap, clock=FakeClock(40), multi_node_timeout=timedelta(minutes=1))
    assert method.timed_out and method.probes == 1
    assert command.nodes == ["a", "b", "c"] and "timed out" in command.message


# --- single-node ----------------------------------------------------------------------------------


def _two_pool_cluster(budget_p2: str = "100%"):
    return snapshot(
        nodepool("p1", requirements=AMD64_ON_DEMAND),
        nodepool("p2", requirements=AMD64_ON_DEMAND, budgets=[{"nodes": budget_p2}]),
        node("base", "m5.2xlarge", pool=None),
        pod("fill", "base", cpu="6"),
        node("a1", "c5.xlarge", pool="p1"),
        pod("stuck", "a1", cpu="3600m"),  # fits nowhere, and nothing cheaper than c5.xlarge holds it
        node("a2", "m5.large", pool="p1"),
        pod("small", "a2", cpu="500m"),
        node("b1", pool="p2"),
        replicas("pair", [("b1", 2)], cpu="500m"),
    )


def test_single_node_interleaves_candidates_across_nodepools():
    # Savings-ratio order (price / (1 + pods)) is a1 (0.085), b1 (0.064), a2 (0.048); within p1 it is
    # a1, a2, and round-robin across pools makes it a1, b1, a2: b1 is chosen.
    [command], ctx = single(_two_pool_cluster())
    assert command.nodes == ["b1"] and command.decision == "delete"
    assert "a1" in ctx.explanations


def test_single_node_explains_the_nodes_it_did_not_reach():
    _, ctx = single(_two_pool_cluster())
    assert (
        "single-node-consolidation",
        "not evaluated: one single-node command per pass",
    ) in ctx.explanations["a2"]


def test_a_pool_whose_ec2nodeclass_is_missing_launches_no_replacement():
    # "preferred" outweighs "default" but its EC2NodeClass is not in the snapshot (which has others).
    preferred = nodepool("preferred", requirements=AMD64_ON_DEMAND, weight=100)
    preferred["spec"]["template"]["spec"]["nodeClassRef"]["name"] = "gone"
    snap = snapshot(
        from_yaml("""
apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {name: default}
"""),
        nodepool(requirements=AMD64_ON_DEMAND),
        preferred,
        node("a", "m5.2xlarge"),
        pod("app", "a"),
    )
    [command], _ = single(snap)
    assert [r.nodepool for r in command.replacements] == ["default"]


def test_single_node_skips_pools_without_budget():
    [command], ctx = single(_two_pool_cluster(budget_p2="0"))
    assert command.nodes == ["a2"]
    assert any("budget" in why for _, why in ctx.explanations["b1"])


def test_single_node_leaves_empty_nodes_to_emptiness():
    snap = snapshot(nodepool(), node("a"), node("b"), pod("one", "b"))
    commands, ctx = single(snap)
    assert commands == [] or commands[0].nodes != ["a"]
    assert ("single-node-consolidation", "empty: left to emptiness") in ctx.explanations["a"]


def test_single_node_timeout_reports_unreached_pools():
    method = SingleNodeConsolidation()
    commands, ctx = run_method(
        method, _two_pool_cluster(), clock=FakeClock(100), single_node_timeout=timedelta(minutes=3)
    )
    # Reads at 0 (start), 100 (a1 probed), 200 (b1 is past the timeout).
    assert commands == [] and method.timed_out
    assert method.unreached_pools == ["p2"]
    assert any("timed out" in why for _, why in ctx.explanations["b1"])


def test_priority_pools_from_a_timed_out_pass_go_first():
    [command], _ = single(_two_pool_cluster(), single_node_priority_pools=["p2"])
    assert command.nodes == ["b1"]


# --- who may be consolidated ----------------------------------------------------------------------


def test_only_when_empty_or_underutilized_pools_are_consolidated():
    snap = snapshot(nodepool(policy="WhenEmpty"), node("a"), node("b"), pod("one", "a"), pod("two", "b"))
    commands, ctx = single(snap)
    assert commands == []
    assert any("WhenEmpty" in why for _, why in ctx.explanations["a"])


def test_consolidate_after_must_have_elapsed():
    recent = pod("fresh", "a")
    recent["status"]["startTime"] = (NOW - timedelta(minutes=5)).isoformat()
    snap = snapshot(nodepool(consolidate_after="1h"), node("a"), node("b"), recent, pod("old", "b"))
    commands, ctx = single(snap)
    assert all(c.nodes != ["a"] for c in commands)
    assert any("not consolidatable until" in why for _, why in ctx.explanations["a"])


def test_consolidation_runs_in_the_planning_pass():
    snap = snapshot(nodepool(), node("a"), node("b"), pod("one", "a"), pod("two", "b"))
    result = plan(snap, CATALOG)
    # Multi-node runs first: both nodes' pods fit one cheaper node.
    assert [(c.method, c.decision, c.nodes) for c in result.commands] == [
        ("multi-node-consolidation", "replace", ["a", "b"])
    ]
    assert result.summary.ended_by == "multi-node-consolidation"


# --- the max_replacements extension (karpflow, opt-in) --------------------------------------------


def lopsided_pair(capacity_type: str = "on-demand", pool=None):
    """Two m5.4xlarge: a runs 2 CPU-heavy pods (3.5 cpu, 1Gi), b 2 memory-heavy ones (1 cpu, 14Gi).
    Together they need 9 cpu: one new node would be another m5.4xlarge, no cheaper than keeping one."""
    return snapshot(
        pool or nodepool(requirements=AMD64_ON_DEMAND),
        node("a", "m5.4xlarge", capacity_type=capacity_type),
        node("b", "m5.4xlarge", capacity_type=capacity_type),
        replicas("cpu", [("a", 2)], cpu="3500m", memory="1Gi"),
        replicas("mem", [("b", 2)], cpu="1", memory="14Gi"),
    )


def worst_case(replacement) -> float:
    return max(
        o.price
        for t in replacement.instance_types
        for o in t.offerings
        if o.available and o.capacity_type == replacement.capacity_type and o.zone in replacement.zones
    )


def test_max_replacements_defaults_to_karpenters_single_replacement():
    assert PlanOptions().max_replacements == 1
    assert multi(lopsided_pair())[0] == []
    proposal = compute_consolidation(
        context(lopsided_pair()),
        build_candidates(context(lopsided_pair()))[0],
        method="multi-node-consolidation",
    )
    assert proposal.command is not None and len(proposal.command.replacements) == 1  # filtered later


def test_multi_node_replaces_with_several_cheaper_nodes_when_allowed():
    [command], _ = multi(lopsided_pair(), max_replacements=3)
    assert command.decision == "replace" and command.nodes == ["a", "b"]
    assert sorted(r.instance_type_names[0] for r in command.replacements) == ["c5.xlarge", "m5.2xlarge"]
    assert sum(worst_case(r) for r in command.replacements) < command.source_price
    assert command.savings_per_hour == pytest.approx(
        2 * 0.768 - sum(worst_case(r) for r in command.replacements)
    )
    assert command.savings_per_hour_best == pytest.approx(2 * 0.768 - 0.384 - 0.170)
    moved = sorted(p.key for r in command.replacements for p in r.pods)
    assert moved == ["default/cpu-0", "default/cpu-1", "default/mem-0", "default/mem-1"]
    assert "2 new nodes" in command.message


def test_each_new_node_drops_options_no_cheaper_than_a_removed_node_of_that_type():
    [command], _ = multi(lopsided_pair(), max_replacements=3)
    assert all("m5.4xlarge" not in r.instance_type_names for r in command.replacements)


def test_several_new_nodes_must_be_strictly_cheaper_in_total():
    # Two c5.large each running 1.5 cpu: two new c5.large cost exactly what they do now.
    snap = snapshot(
        nodepool(requirements=AMD64_ON_DEMAND),
        node("a", "c5.large"),
        node("b", "c5.large"),
        pod("one", "a", cpu="1500m"),
        pod("two", "b", cpu="1500m"),
    )
    ctx = context(snap, max_replacements=3)
    candidates = build_candidates(ctx)[0]
    proposal = compute_consolidation(ctx, candidates, method="multi-node-consolidation", max_replacements=3)
    assert proposal.command is None
    assert "cheaper" in proposal.why


def test_several_new_nodes_for_spot_nodes_need_spot_to_spot():
    pool = nodepool(
        requirements=[
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
        ]
    )
    assert multi(lopsided_pair("spot", pool), max_replacements=3)[0] == []
    [command], _ = multi(lopsided_pair("spot", pool), max_replacements=3, spot_to_spot=True)
    assert len(command.replacements) == 2
    assert {r.capacity_type for r in command.replacements} == {"spot"}


def test_spot_last_moves_spot_candidates_behind_the_others_keeping_order():
    snap = snapshot(
        nodepool(),
        node("s1", capacity_type="spot"),
        node("o1"),
        node("s2", capacity_type="spot"),
        node("o2"),
    )
    candidates = build_candidates(context(snap))[0]
    assert [c.name for c in spot_last(candidates)] == ["o1", "o2", "s1", "s2"]


def test_command_records_where_moved_pods_land_on_existing_nodes():
    snap = snapshot(nodepool(), node("a"), node("b"), pod("one", "a"), pod("two", "b"))
    [command], _ = single(snap)
    assert command.placements == {"default/one": "b"}
