"""Optimal consolidation (planner/optimal/): the target, the step, the leaving taints, validation."""

from __future__ import annotations

from datetime import timedelta

import pytest

from api.constants import CAPACITY_TYPE_LABEL
from planner.model import OPTIMAL_CONSOLIDATION, PlanOptions
from planner.optimal.leaving import LEAVING_TAINT_EFFECT, LEAVING_TAINT_KEY, leaving_taint_changes
from planner.optimal.moves import PLANNED_PREFIX
from planner.plan import command_out, plan, validate_command
from sim.cluster_builder import ClusterBuilder

OPTIMAL = {"karpflow.dev/consolidation-strategy": "Optimal"}
ON_DEMAND_M5_C5 = [
    {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand"]},
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
    {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5", "c5"]},
]


def fragmented(
    nodes: int = 6, budget: str = "100%", annotate: bool = True, zone: str = "us-west-2a"
) -> ClusterBuilder:
    """`nodes` m5.xlarge nodes, each a quarter used by two 500m / 1Gi pods: the load fits on two."""
    b = ClusterBuilder()
    pool = b.nodepool(
        "default", budgets=[{"nodes": budget}], expire_after="Never", requirements=ON_DEMAND_M5_C5
    )
    if annotate:
        pool["metadata"]["annotations"] = dict(OPTIMAL)
    b.nodeclass()
    for i in range(nodes):
        name = f"node-{i}"
        b.node(name, instance_type="m5.xlarge", zone=zone)
        for j in range(2):
            b.pod(f"svc{i}-{j}", name, cpu="500m", memory="1Gi", app=f"svc{i}")
    return b


def optimal_commands(result):
    return [c for c in result.commands_ if c.method == OPTIMAL_CONSOLIDATION]


def test_pools_without_the_annotation_keep_karpenters_rules():
    b = fragmented(annotate=False)
    result = plan(b.snapshot(), b.catalog)
    assert result.target_fleet is None
    assert not optimal_commands(result)
    assert result.summary.ended_by == "multi-node-consolidation"
    assert result.taints == []


def test_an_optimal_pool_gets_a_cheaper_target_and_a_move_toward_it():
    b = fragmented()
    result = plan(b.snapshot(), b.catalog)
    target = result.target_fleet
    assert target is not None and target.nodes == 6 and target.pods == 12
    assert target.current_cost == pytest.approx(6 * 0.192)
    assert target.target_cost < target.current_cost
    assert target.fluid_optimum is not None and target.fluid_optimum <= target.target_cost
    (command,) = optimal_commands(result)
    assert command.savings_per_hour > 0
    assert set(command.nodes) <= set(target.remove)
    # Every moved pod has a place that stays: a node the target keeps or a new node.
    moved = {p.key for c in command.candidates for p in c.reschedulable_pods}
    on_new = {p.key for r in command.replacements for p in r.pods}
    assert moved == set(command.placements) | on_new
    assert not set(command.placements.values()) & set(target.remove)
    assert not any(n.startswith(PLANNED_PREFIX) for n in command.placements.values())
    out = command_out(command)
    assert out.savings_per_hour == pytest.approx(command.source_price - command.replacement_worst_case_price)


def test_the_move_stays_within_the_budget_and_the_rest_is_tainted_leaving():
    b = fragmented(budget="2")
    result = plan(b.snapshot(), b.catalog)
    (command,) = optimal_commands(result)
    target = result.target_fleet
    assert len(command.nodes) <= 2
    later = set(target.remove) - set(command.nodes)
    assert later, "the budget leaves removals for later passes"
    assert {t.node for t in result.taints if t.add} == later
    assert all(t.key == LEAVING_TAINT_KEY and t.effect == LEAVING_TAINT_EFFECT for t in result.taints)


def test_a_node_with_a_do_not_disrupt_pod_is_neither_moved_nor_targeted():
    b = fragmented()
    b.pod("pinned", "node-0", cpu="100m", memory="128Mi", annotations={"karpenter.sh/do-not-disrupt": "true"})
    result = plan(b.snapshot(), b.catalog)
    assert "node-0" not in result.target_fleet.remove
    assert all("node-0" not in c.nodes for c in result.commands_)


def test_pods_pinned_to_a_zone_get_new_nodes_in_that_zone():
    b = fragmented(zone="us-west-2b")
    for pod in (o for o in b.objects if o["kind"] == "Pod"):
        pod["spec"]["nodeSelector"] = {"topology.kubernetes.io/zone": "us-west-2b"}
    result = plan(b.snapshot(), b.catalog)
    (command,) = optimal_commands(result)
    for replacement in command.replacements:
        assert replacement.zones == ["us-west-2b"]


def test_a_packed_cluster_leaves_the_pass_to_karpenters_methods():
    b = ClusterBuilder()
    pool = b.nodepool("default", expire_after="Never", requirements=ON_DEMAND_M5_C5)
    pool["metadata"]["annotations"] = dict(OPTIMAL)
    b.nodeclass()
    b.node("full", instance_type="c5.large")
    b.pod("busy-1", "full", cpu="1500m", memory="2Gi")
    result = plan(b.snapshot(), b.catalog)
    assert not optimal_commands(result)
    assert "no cheaper fleet" in result.target_fleet.why_no_step
    reasons = [
        d.reason for blocked in result.blocked for d in blocked.details if d.method == OPTIMAL_CONSOLIDATION
    ]
    assert reasons and "left to Karpenter's methods" in reasons[0]


def test_a_tiny_time_limit_still_returns_a_plan():
    b = fragmented(nodes=30)
    options = PlanOptions(optimal_time_limit=timedelta(milliseconds=1))
    result = plan(b.snapshot(), b.catalog, options)
    assert result.target_fleet is not None
    assert result.target_fleet.target_cost <= result.target_fleet.current_cost


def test_the_strategy_option_applies_to_every_pool():
    b = fragmented(annotate=False)
    result = plan(b.snapshot(), b.catalog, PlanOptions(consolidation_strategy="Optimal"))
    assert optimal_commands(result)
    forced_off = plan(fragmented().snapshot(), b.catalog, PlanOptions(consolidation_strategy="Karpenter"))
    assert forced_off.target_fleet is None


def test_a_planned_command_validates_on_the_same_cluster_and_not_once_a_node_is_protected():
    b = fragmented()
    snapshot = b.snapshot()
    result = plan(snapshot, b.catalog)
    (out,) = [c for c in result.commands if c.method == OPTIMAL_CONSOLIDATION]
    assert validate_command(snapshot, b.catalog, out).valid
    node = next(o for o in b.objects if o["kind"] == "Node" and o["metadata"]["name"] == out.nodes[0])
    node["metadata"].setdefault("annotations", {})["karpenter.sh/do-not-disrupt"] = "true"
    verdict = validate_command(b.snapshot(), b.catalog, out)
    assert not verdict.valid and "churn" in verdict.reason


def test_validation_refuses_when_the_pods_no_longer_fit_the_planned_fleet():
    b = fragmented()
    snapshot = b.snapshot()
    (out,) = [c for c in plan(snapshot, b.catalog).commands if c.method == OPTIMAL_CONSOLIDATION]
    # Heavy pods appear on the nodes of the command: the planned new nodes cannot hold them.
    for name in out.nodes:
        b.pod(f"heavy-{name}", name, cpu="3", memory="12Gi", app="heavy")
    verdict = validate_command(b.snapshot(), b.catalog, out)
    assert not verdict.valid and verdict.reason.startswith("scheduling")


def test_leaving_taints_are_removed_when_not_wanted_and_kept_when_the_method_did_not_run():
    b = fragmented()
    b.objects[2]["spec"]["taints"] = [{"key": LEAVING_TAINT_KEY, "effect": LEAVING_TAINT_EFFECT}]
    tainted = b.objects[2]["metadata"]["name"]
    snapshot = b.snapshot()
    assert [(c.node, c.add) for c in leaving_taint_changes(snapshot, set(), (), {"default"})] == [
        (tainted, False)
    ]
    assert leaving_taint_changes(snapshot, None, (), {"default"}) == []
    # A pool that left the strategy loses the taint even when the method did not run.
    assert [(c.node, c.add) for c in leaving_taint_changes(snapshot, None, (), set())] == [(tainted, False)]
    assert leaving_taint_changes(snapshot, {tainted}, (), {"default"}) == []


def test_the_bench_scenario_ends_cheaper_than_it_starts_and_every_node_fits():
    """A few passes of the quality bench's loop, with its independent over-commit check."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from bench_quality import apply, cluster_cost, fragmented_cluster

    b = fragmented_cluster(30, 1, "on-demand")
    options = PlanOptions(consolidation_strategy="Optimal")
    start, _ = cluster_cost(b)
    counter = [0]
    used_optimal = False
    for _ in range(40):
        result = plan(b.snapshot(via_yaml=False), b.catalog, options)
        commands = [c for c in result.commands_ if c.method != "expiration"]
        if not commands:
            break
        for command in commands:
            used_optimal |= command.method == OPTIMAL_CONSOLIDATION
            before, _ = cluster_cost(b)
            apply(b, command, counter)  # asserts no node is over-committed
            assert cluster_cost(b)[0] < before, command
        b.now += timedelta(minutes=1)
    assert used_optimal
    assert cluster_cost(b)[0] < start / 2


def test_karpflow_plan_strategy_optimal_shows_the_target_fleet(tmp_path):
    import json

    from click.testing import CliRunner

    from cli import main

    path = fragmented(annotate=False).write(tmp_path / "cluster.yaml")
    runner = CliRunner()
    shown = runner.invoke(
        main, ["plan", "--snapshot", str(path), "--strategy", "optimal"], env={"COLUMNS": "200"}
    )
    assert shown.exit_code == 0, shown.output
    assert "Target fleet (Optimal NodePools: 6 candidate nodes, 12 pods)" in shown.output
    assert "fluid optimum" in shown.output and "move now:" in shown.output
    as_json = runner.invoke(main, ["plan", "--snapshot", str(path), "--strategy", "optimal", "-o", "json"])
    data = json.loads(as_json.output)  # nothing else on stdout (HiGHS prints a banner once per process)
    assert data["targetFleet"]["nodes"] == 6
    assert data["targetFleet"]["targetCost"] < data["targetFleet"]["currentCost"]
    default = runner.invoke(main, ["plan", "--snapshot", str(path), "-o", "json"])
    assert json.loads(default.output)["targetFleet"] is None
