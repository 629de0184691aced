"""consolidationPolicy Balanced (planner/balanced.py), written from Karpenter's tests in
kubernetes-sigs/karpenter pkg/controllers/disruption/ (balanced_test.go, balanced_scoring_test.go,
singlenodeconsolidation_test.go); each test names the one it comes from."""

from __future__ import annotations

import math

import pytest

from api.nodepool import NodePool
from planner.balanced import (
    BALANCED_K,
    BalancedGate,
    PoolTotals,
    candidate_disruption_cost,
    savings_ratio,
    score_move,
    sort_by_savings_ratio,
)
from planner.budgets import build_budget_map
from planner.candidates import build_candidates, sort_by_disruption_cost
from planner.catalog import catalog_from_dict
from planner.consolidation import MultiNodeConsolidation, SingleNodeConsolidation
from planner.emptiness import Emptiness
from planner.model import Command
from planner.plan import command_out, plan
from planner.scheduling.adapter import simulate
from planner.why_not import Kind, kind_of
from tests.unit.planner.sched_fixtures import CATALOG, context, node, nodepool, pod, replicas, snapshot

# balanced_test.go's RFC pool: eight m7i.xlarge and two m7i.2xlarge ($58.08/day), 80 pods:
# disruption 90 (10 nodes x 1.0 + 80 pods x 1.0).
RFC = PoolTotals(cost=58.08, disruption_cost=90)


def score(savings: float, disruption: float, totals: PoolTotals = RFC) -> float:
    return score_move("default", savings, disruption, totals).value


# --- ScoreMove ------------------------------------------------------------------------------------


def test_an_oversized_node_is_approved():
    # balanced_test.go Describe("ScoreMove") / "should approve an oversized node consolidation"
    result = score_move("default", 7.26, 4.0, RFC)
    assert result.approved
    assert result.savings_fraction == pytest.approx(7.26 / 58.08)
    assert result.disruption_fraction == pytest.approx(4.0 / 90)
    assert result.value == pytest.approx((7.26 / 58.08) / (4.0 / 90))


def test_a_spare_capacity_delete_is_approved():
    # balanced_test.go "should approve a spare capacity delete"
    assert score_move("default", 4.84, 5.0, RFC).approved


def test_a_marginal_move_is_rejected():
    # balanced_test.go "should reject a marginal move": 2.42 saved for 8 pods
    result = score_move("default", 2.42, 9.0, RFC)
    assert not result.approved
    assert result.value == pytest.approx((2.42 / 58.08) / (9.0 / 90))
    assert result.describe().startswith("score 0.42 below 0.5 (savings 4.2% of nodepool default's cost")


def test_a_well_packed_node_with_zero_savings_scores_zero():
    # balanced_test.go "should reject a well-packed node with zero savings"
    result = score_move("default", 0.0, 11.0, RFC)
    assert result.value == 0 and not result.approved


def test_a_replace_in_a_uniform_pool_is_approved_at_exactly_the_threshold():
    # balanced_test.go "should approve a replace in a uniform pool": score 0.50 >= 0.5
    result = score_move("default", 2.42, 9.0, PoolTotals(48.40, 90))
    assert result.value == pytest.approx(0.5)
    assert result.approved and result.threshold == 1 / BALANCED_K


def test_low_disruption_nodes_pass_and_high_disruption_nodes_do_not():
    # balanced_test.go "should approve low-disruption nodes and reject high-disruption nodes"
    totals = PoolTotals(58.08, 117)
    assert score_move("default", 4.84, 5.0, totals).approved
    assert not score_move("default", 4.84, 32.0, totals).approved


def test_the_score_does_not_depend_on_the_pool_size():
    # balanced_test.go "should produce the same score regardless of pool size"
    assert score(7.26, 4.0) == pytest.approx(score(7.26, 4.0, PoolTotals(580.80, 900)))


def test_zero_disruption_with_savings_is_infinite_and_approved():
    # balanced_test.go "should approve with +Inf score when move disruption is zero and savings positive"
    result = score_move("default", 4.84, 0.0, RFC)
    assert math.isinf(result.value) and result.approved


@pytest.mark.parametrize(
    ("savings", "disruption", "totals"),
    [
        (0.0, 0.0, RFC),  # "should reject when both savings and disruption are zero"
        (4.84, 5.0, PoolTotals(0, 90)),  # "should reject when nodepool cost is zero"
        (4.84, 5.0, None),  # balanced_scoring_test.go "should reject when candidate NodePool is missing ..."
    ],
)
def test_degenerate_moves_are_rejected(savings, disruption, totals):
    # balanced_test.go Context("edge cases with zero values")
    result = score_move("default", savings, disruption, totals)
    assert result.value == 0 and not result.approved


def test_proportionally_equivalent_moves_in_different_pools_score_alike():
    # balanced_test.go Context("cross-NodePool scoring") / "should produce identical scores for
    # proportionally equivalent moves"
    on_demand = score_move("od", 4.84, 4.0, PoolTotals(48.40, 90))
    spot = score_move("spot", 1.45, 4.0, PoolTotals(14.50, 90))
    assert on_demand.value == pytest.approx(spot.value, abs=0.01)
    assert on_demand.approved and spot.approved


# --- Candidates, totals and whole moves -----------------------------------------------------------


def _pool(n: int, policy: str = "Balanced", name: str = "default", pods_each: int = 1) -> list[dict]:
    objects: list[dict] = [nodepool(name, policy=policy)]
    for i in range(n):
        objects.append(node(f"{name}-{i}", pool=name))
        objects += replicas(f"{name}-w{i}", [(f"{name}-{i}", pods_each)], cpu="100m")
    return objects


def _candidates(*objects):
    ctx = context(snapshot(*objects))
    ctx.simulate = simulate
    candidates, _ = build_candidates(ctx)
    return ctx, {c.name: c for c in candidates}


def test_a_delete_in_a_ten_node_pool_scores_one():
    # balanced_scoring_test.go Describe("EvaluateBalancedMove") / "should approve a delete command
    # for a single Balanced NodePool": savings 10% of the cost, disruption 10% of the disruption.
    ctx, by_name = _candidates(*_pool(10))
    gate = BalancedGate(ctx, list(by_name.values()))
    [result] = gate.scores(Command("single-node-consolidation", "Underutilized", [by_name["default-0"]]))
    assert result.value == pytest.approx(1.0) and result.approved


def test_pool_totals_count_every_node_of_the_pool_not_only_the_candidates():
    # balanced_scoring_test.go Describe("computeNodePoolTotals") / "should produce totals from ALL
    # candidates, not just a filtered subset"
    ctx, by_name = _candidates(*_pool(10))
    gate = BalancedGate(ctx, [by_name["default-0"]])
    totals = gate.totals["default"]
    assert totals.disruption_cost == pytest.approx(20.0)  # 10 x (1.0 + one pod)
    assert totals.cost == pytest.approx(10 * CATALOG.get("m5.xlarge").price("test-1a", "on-demand"))


def test_pools_with_another_policy_are_not_scored():
    # balanced_scoring_test.go "should skip non-Balanced pools and approve unconditionally"
    ctx, by_name = _candidates(*_pool(5, policy="WhenEmptyOrUnderutilized"))
    gate = BalancedGate(ctx, list(by_name.values()))
    command = Command(
        "multi-node-consolidation", "Underutilized", [by_name["default-0"], by_name["default-1"]]
    )
    assert gate.scores(command) == [] and gate.rejection([]) is None


def test_cross_pool_savings_are_shared_by_the_source_pools_cost():
    # balanced_scoring_test.go "should attribute savings proportionally in cross-NodePool scenarios"
    ctx, by_name = _candidates(
        *_pool(5, name="bal"), *_pool(5, policy="WhenEmptyOrUnderutilized", name="other")
    )
    gate = BalancedGate(ctx, list(by_name.values()))
    command = Command("multi-node-consolidation", "Underutilized", [by_name["bal-0"], by_name["other-0"]])
    [result] = gate.scores(command)
    assert result.pool == "bal" and result.value == pytest.approx(1.0) and result.approved


def test_negative_eviction_costs_count_as_zero_and_the_node_as_one():
    # balanced_scoring_test.go Describe("Candidate.SavingsRatio"): no pods -> price / 1.0, three
    # default pods -> price / 4.0; the scoring path clamps negative pod costs to 0 (types.go).
    cheap = {"controller.kubernetes.io/pod-deletion-cost": "-2147483647"}
    _, by_name = _candidates(
        nodepool(policy="Balanced"),
        node("none"),
        node("three"),
        *replicas("w", [("three", 3)], cpu="100m"),
        node("cheap"),
        pod("c", "cheap", cpu="100m", annotations=cheap),
    )
    price = by_name["none"].price
    assert savings_ratio(by_name["none"]) == pytest.approx(price)
    assert savings_ratio(by_name["three"]) == pytest.approx(price / 4.0)
    assert candidate_disruption_cost(by_name["cheap"]) == pytest.approx(1.0)


def test_candidates_are_ordered_by_savings_ratio_highest_first():
    # singlenodeconsolidation_test.go Context("Candidate Shuffling") / "should sort candidates by
    # savings ratio with different disruption costs": price/1 before price/5 before price/20.
    _, by_name = _candidates(
        nodepool(),
        node("dear", "m5.2xlarge"),  # $0.384 / (1 + 3)
        *replicas("d", [("dear", 3)], cpu="10m"),
        node("cheap", "m5.large"),  # $0.096 / (1 + 1)
        pod("c", "cheap", cpu="10m"),
        node("crowded"),  # $0.192 / (1 + 19)
        *replicas("m", [("crowded", 19)], cpu="10m"),
    )
    assert [c.name for c in sort_by_savings_ratio(by_name.values())] == ["dear", "cheap", "crowded"]
    # The order karpflow used before (lowest disruption cost first) puts the cheap node first.
    assert [c.name for c in sort_by_disruption_cost(by_name.values())] == ["cheap", "dear", "crowded"]


# --- Through the methods, as `karpflow plan` runs them --------------------------------------------


def _run(method, snap, catalog=CATALOG):
    ctx = context(snap, catalog)
    ctx.simulate = simulate
    candidates, _ = build_candidates(ctx)
    eligible = [c for c in candidates if c.pod_block is None and method.should_disrupt(ctx, c)]
    return method.compute(ctx, sort_by_disruption_cost(eligible), build_budget_map(ctx, method.reason)), ctx


def _crowded_pool(policy: str):
    """`busy` (m5.xlarge) holds 12 small pods a cheaper type would hold; `full` holds a pod that fits
    nowhere cheaper. Replacing busy disrupts 13 of the pool's 15 units of disruption for less than
    half its cost."""
    return snapshot(
        nodepool(policy=policy),
        node("full", "c5.xlarge"),
        pod("big", "full", cpu="3600m"),
        node("busy"),
        *replicas("small", [("busy", 12)], cpu="100m", memory="256Mi"),
    )


def test_single_node_consolidation_takes_the_move_under_when_empty_or_underutilized():
    # The control for the next test: the same move is taken without the score gate.
    [command], _ = _run(SingleNodeConsolidation(), _crowded_pool("WhenEmptyOrUnderutilized"))
    assert command.nodes == ["busy"] and command.decision == "replace"
    assert "Balanced" not in command.message


def test_single_node_consolidation_refuses_a_move_that_scores_below_the_threshold():
    # balanced_integration_test.go-style: the marginal replace is rejected under Balanced, and the
    # why-not answer carries the score.
    commands, ctx = _run(SingleNodeConsolidation(), _crowded_pool("Balanced"))
    assert commands == []
    [(_, why)] = ctx.explanations["busy"]
    assert why.startswith("consolidationPolicy Balanced: score 0.") and " below 0.5 " in why
    assert kind_of(why) == Kind.CONSOLIDATION_POLICY


def test_an_approved_balanced_move_shows_its_score():
    # balanced_test.go "should approve a spare capacity delete": b's pod fits on a, a delete.
    snap = snapshot(
        nodepool(policy="Balanced"),
        node("a"),
        *replicas("w", [("a", 2)], cpu="100m"),
        node("b"),
        pod("p", "b", cpu="100m"),
    )
    [command], _ = _run(SingleNodeConsolidation(), snap)
    assert command.decision == "delete"
    assert "[Balanced score " in command.message and ">= 0.5" in command.message
    [shown] = command_out(command).scores  # the plan table's "Balanced score" column and JSON
    assert shown.startswith("default: score ") and shown.endswith(">= 0.5")


def test_single_node_skips_a_candidate_whose_delete_alone_cannot_pass():
    # balanced.go CanPassThreshold, used by singlenodeconsolidation.go ComputeCommands: 30 pods on one
    # m5.large cannot pass even if deleted outright (0.096/0.266 of the cost for 29/31 of the
    # disruption); `stuck`, tried first, has a pod that fits nowhere cheaper.
    snap = snapshot(
        nodepool(policy="Balanced"),
        node("stuck", "c5.xlarge"),
        pod("one", "stuck", cpu="3600m"),
        node("heavy", "m5.large"),
        *replicas("h", [("heavy", 28)], cpu="10m", memory="16Mi"),
    )
    _, ctx = _run(SingleNodeConsolidation(), snap)
    assert any("even deleting it, score" in why for _, why in ctx.explanations["heavy"])


# Two shapes: one x4 costs a little less than two x2, so merging two busy x2 nodes saves 5% of the
# pool's cost for all of its disruption.
TWO_SHAPES = catalog_from_dict(
    {
        "region": "test-1",
        "instanceTypes": [
            {
                "name": name,
                "cpu": str(cpu),
                "memory": f"{cpu * 4}Gi",
                "pods": 30,
                "allocatable": {"cpu": str(cpu), "memory": f"{cpu * 4}Gi", "pods": "30"},
                "offerings": [{"zone": "test-1a", "capacityType": "on-demand", "price": price}],
            }
            for name, cpu, price in (("x2", 2, 1.0), ("x4", 4, 1.9))
        ],
    }
)


def _x2(name: str) -> dict:
    shaped = node(name, "x2")
    shaped["status"]["capacity"] = shaped["status"]["allocatable"] = {
        "cpu": "2",
        "memory": "8Gi",
        "pods": "30",
    }
    return shaped


def _two_busy(policy: str):
    return snapshot(
        nodepool(policy=policy),
        _x2("a"),
        *replicas("x", [("a", 15)], cpu="100m", memory="256Mi"),
        _x2("b"),
        *replicas("y", [("b", 15)], cpu="100m", memory="256Mi"),
    )


def test_multi_node_consolidation_drops_a_prefix_the_score_rejects():
    # multinodeconsolidation.go firstNConsolidationOption: a command the evaluator rejects is not a
    # valid decision, so the binary search shortens the prefix; here no prefix passes.
    commands, _ = _run(MultiNodeConsolidation(), _two_busy("Balanced"), TWO_SHAPES)
    [control], _ = _run(MultiNodeConsolidation(), _two_busy("WhenEmptyOrUnderutilized"), TWO_SHAPES)
    assert commands == [] and control.decision == "replace"


def test_empty_nodes_are_deleted_in_a_balanced_pool_without_a_score():
    # controller.go NewMethods: "Delete empty nodes across all consolidation policies (WhenEmpty,
    # WhenEmptyOrUnderutilized, Balanced)"; emptiness.go never calls the evaluator.
    snap = snapshot(nodepool(policy="Balanced"), node("empty"), node("used"), pod("p", "used", cpu="100m"))
    [command], _ = _run(Emptiness(), snap)
    assert command.nodes == ["empty"] and "score" not in command.message


def test_the_nodepool_model_reads_balanced():
    # pkg/apis/v1/nodepool.go ConsolidationPolicyBalanced
    pool = NodePool.model_validate(
        {"metadata": {"name": "p"}, "spec": {"disruption": {"consolidationPolicy": "Balanced"}}}
    )
    assert pool.spec.disruption.consolidation_policy == "Balanced"


def test_karpflow_plan_says_why_a_balanced_node_is_not_consolidated():
    # The "why not" answer of `karpflow plan` (Plan.blocked) for the rejected move carries its score.
    result = plan(_crowded_pool("Balanced"), CATALOG)
    assert result.commands_ == []
    [why] = [b.reason for b in result.blocked if b.node == "busy"]
    assert why.startswith("consolidationPolicy Balanced: score 0.") and " below 0.5 " in why
    [control] = plan(_crowded_pool("WhenEmptyOrUnderutilized"), CATALOG).commands
    assert control.nodes == ["busy"] and control.scores == []


def test_single_node_consolidation_takes_the_best_savings_ratio_first():
    # consolidation_test.go "should consolidate the node with best savings ratio first" (there the
    # nodes cost the same, so fewer pods wins either way); here the dearer node has more pods: the
    # old order (lowest disruption cost first) would delete `cheap`, Karpenter's today deletes `dear`.
    snap = snapshot(
        nodepool(),
        node("base", "m5.4xlarge", pool=None),  # room for every pod, not a candidate
        node("dear", "m5.2xlarge"),  # $0.384 / (1 + 3)
        *replicas("d", [("dear", 3)], cpu="100m"),
        node("cheap", "m5.large"),  # $0.096 / (1 + 1)
        pod("c", "cheap", cpu="100m"),
    )
    [command], _ = _run(SingleNodeConsolidation(), snap)
    assert command.nodes == ["dear"] and command.decision == "delete"
