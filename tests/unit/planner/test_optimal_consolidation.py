"""Optimal consolidation (planner/optimal/): the target, the plan held across passes, its moves, the
leaving taints and plan markers, validation, and Karpenter's methods beside it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from api.constants import CAPACITY_TYPE_LABEL
from api.workflow_io import disruption_input
from planner.model import (
    MULTI_NODE_CONSOLIDATION,
    OPTIMAL_CONSOLIDATION,
    SINGLE_NODE_CONSOLIDATION,
    PlanOptions,
)
from planner.optimal.held import PLAN_ANNOTATION, PlanMarker
from planner.optimal.layout import PLANNED_PREFIX
from planner.optimal.leaving import LEAVING_TAINT_EFFECT, LEAVING_TAINT_KEY, leaving_taint_changes
from planner.plan import Plan, command_out, plan, validate_command
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


def test_a_balanced_pool_is_left_to_karpenters_scored_methods_even_when_optimal():
    # karpflow's choice (docs/karpenter-versions.md): Optimal plans a fleet, not scored moves, so a
    # Balanced pool never takes the Optimal strategy and each of its moves is scored.
    b = fragmented()
    b.objects[0]["spec"]["disruption"]["consolidationPolicy"] = "Balanced"
    for options in (PlanOptions(), PlanOptions(consolidation_strategy="Optimal")):
        result = plan(b.snapshot(), b.catalog, options)
        assert result.target_fleet is None and not optimal_commands(result)
        assert "[Balanced score " in result.commands_[0].message


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
    from bench_quality import apply, apply_markers, cluster_cost, fragmented_cluster

    b = fragmented_cluster(30, 1, "on-demand")
    options = PlanOptions(consolidation_strategy="Optimal")
    start, _ = cluster_cost(b)
    counter = [0]
    plans: dict[str, float] = {}  # plan id -> cost when it started
    for _ in range(40):
        result = plan(b.snapshot(via_yaml=False), b.catalog, options)
        commands = [c for c in result.commands_ if c.method != "expiration"]
        apply_markers(b, result)
        if not commands:
            break
        for command in commands:
            before, _ = cluster_cost(b)
            apply(b, command, counter)  # asserts no node is over-committed
            after, _ = cluster_cost(b)
            if command.method == OPTIMAL_CONSOLIDATION:
                held = result.target_fleet.plan
                plans.setdefault(held.id, before)
                # A move may cost more than it saves, never more than its plan has saved.
                assert after <= plans[held.id] + 1e-9, (command, plans)
            else:
                assert after < before, command
        b.now += timedelta(minutes=1)
    assert plans
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


# --- the plan held across passes (planner/optimal/held.py) ------------------------------------------


def node_obj(b: ClusterBuilder, name: str) -> dict:
    return next(o for o in b.objects if o["kind"] == "Node" and o["metadata"]["name"] == name)


def markers(b: ClusterBuilder) -> dict[str, PlanMarker]:
    out = {}
    for o in b.objects:
        raw = (o["metadata"].get("annotations") or {}).get(PLAN_ANNOTATION) if o["kind"] == "Node" else None
        if raw is not None:
            out[o["metadata"]["name"]] = PlanMarker.model_validate_json(raw)
    return out


def carry_out(b: ClusterBuilder, result: Plan, counter: list[int]) -> None:
    """What the controller and the DisruptionWorkflows do with a pass: its annotations and taints, then
    its commands (nodes gone, replacements joined with their annotations, pods where planned)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from bench_quality import apply, apply_markers

    apply_markers(b, result)
    for command in result.commands_:
        apply(b, command, counter)
    b.now += timedelta(minutes=1)


def test_a_plan_is_held_on_its_nodes_and_carried_on_by_the_next_pass():
    b = fragmented(nodes=8, budget="2")
    first = plan(b.snapshot(), b.catalog)
    (move,) = optimal_commands(first)
    held = first.target_fleet.plan
    assert held is not None and held.state == "started" and held.ledger < 0
    # The plan's leaving nodes get its marker, the move's new nodes carry it to the cluster.
    wanted = {
        c.node: PlanMarker.model_validate_json(c.value) for c in first.annotations if c.key == PLAN_ANNOTATION
    }
    assert set(wanted) == set(held.leaving) and {m.role for m in wanted.values()} == {"leaving"}
    assert {m.id for m in wanted.values()} == {held.id}
    for replacement in disruption_input(move).replacements:
        launched = PlanMarker.model_validate_json(replacement.annotations[PLAN_ANNOTATION])
        assert (launched.id, launched.role) == (held.id, "launched")
    counter = [0]
    carry_out(b, first, counter)
    second = plan(b.snapshot(), b.catalog)
    again = second.target_fleet.plan
    assert (again.id, again.state) == (held.id, "continued")
    assert set(again.leaving) == set(held.leaving) - set(move.nodes)
    (next_move,) = optimal_commands(second)
    assert set(next_move.nodes) <= set(again.leaving)
    # Until the plan is done: then its markers and leaving taints are gone.
    result = second
    for _ in range(10):
        carry_out(b, result, counter)
        result = plan(b.snapshot(), b.catalog)
        if not result.commands_:
            break
    carry_out(b, result, counter)
    assert not markers(b)
    assert not any(
        t.get("key") == LEAVING_TAINT_KEY
        for o in b.objects
        if o["kind"] == "Node"
        for t in o["spec"].get("taints") or []
    )


def investment_cluster() -> ClusterBuilder:
    """Budget 1. keeper (protected) has room for d's small pod only; b1..b3 each run a 1-CPU pod that
    nothing that stays can take: their cheapest home is one new c5.xlarge ($0.17/h) for the three,
    dearer than one of them ($0.096/h). Removing d first pays for it."""
    b = ClusterBuilder()
    pool = b.nodepool("default", budgets=[{"nodes": "1"}], expire_after="Never", requirements=ON_DEMAND_M5_C5)
    pool["metadata"]["annotations"] = dict(OPTIMAL)
    b.nodeclass()
    b.node("keeper", instance_type="m5.large")
    b.pod("pinned", "keeper", cpu="1500m", memory="1Gi", annotations={"karpenter.sh/do-not-disrupt": "true"})
    b.node("d", instance_type="m5.xlarge")
    b.pod("small", "d", cpu="100m", memory="128Mi", app="small")
    for i in range(1, 4):
        b.node(f"b{i}", instance_type="m5.large")
        b.pod(f"web-{i}", f"b{i}", cpu="1", memory="512Mi", app="web")
    return b


def test_a_move_may_cost_more_than_it_saves_but_never_more_than_its_plan_saved():
    b = investment_cluster()
    counter = [0]
    start, _ = cost_of(b)
    result = plan(b.snapshot(), b.catalog)
    savings = []
    while optimal_commands(result):
        (move,) = optimal_commands(result)
        savings.append(move.savings_per_hour)
        assert result.target_fleet.plan.ledger <= 1e-9
        carry_out(b, result, counter)
        assert cost_of(b)[0] <= start + 1e-9
        result = plan(b.snapshot(), b.catalog)
    # d first (a delete saving $0.192/h), then a move launching the c5.xlarge for one b node (it costs
    # $0.074/h more than it saves), then the other b nodes onto it.
    assert savings[0] == pytest.approx(0.192)
    assert any(s < 0 for s in savings[1:]), savings
    end, nodes = cost_of(b)
    assert nodes == 2 and end == pytest.approx(0.096 + 0.17)


def test_without_a_held_plan_the_investing_move_is_never_made():
    """Each pass a fresh plan (markers lost): a first move must save on its own, so the b nodes stay
    where Karpenter's rules would keep them too."""
    b = investment_cluster()
    counter = [0]
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from bench_quality import apply

    for _ in range(6):
        result = plan(b.snapshot(), b.catalog)
        for command in optimal_commands(result):
            assert command.savings_per_hour > 0
            apply(b, command, counter)
        b.now += timedelta(minutes=1)


def cost_of(b: ClusterBuilder) -> tuple[float, int]:
    snapshot = b.snapshot(via_yaml=False)
    total = 0.0
    for node in snapshot.nodes.values():
        kind = b.catalog.get(node.instance_type)
        total += kind.price(node.zone or "", node.capacity_type or "") or 0.0
    return total, len(snapshot.nodes)


def test_a_plan_is_dropped_when_a_leaving_node_can_no_longer_move():
    b = fragmented(nodes=8, budget="2")
    counter = [0]
    first = plan(b.snapshot(), b.catalog)
    carry_out(b, first, counter)
    held = first.target_fleet.plan
    protected = sorted(set(held.leaving) - set(optimal_commands(first)[0].nodes))[0]
    b.pod(
        "pinned", protected, cpu="100m", memory="128Mi", annotations={"karpenter.sh/do-not-disrupt": "true"}
    )
    second = plan(b.snapshot(), b.catalog)
    assert second.target_fleet.ended.startswith(f"plan {held.id} dropped: {protected} can no longer move")
    # The dropped plan's markers and the protected node's leaving taint go.
    removed = {c.node for c in second.annotations if c.key == PLAN_ANNOTATION and c.value is None}
    assert protected in removed
    assert any(t.node == protected and not t.add for t in second.taints)


def test_karpenters_methods_leave_a_held_plans_pool_alone_while_its_move_is_in_flight():
    b = fragmented(nodes=8, budget="2")
    counter = [0]
    first = plan(b.snapshot(), b.catalog)
    (move,) = optimal_commands(first)
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from bench_quality import apply_markers

    apply_markers(b, first)
    for name in move.nodes:  # in flight: tainted by its DisruptionWorkflow
        node_obj(b, name)["spec"].setdefault("taints", []).append(
            {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
        )
    b.now += timedelta(minutes=1)
    waiting = plan(b.snapshot(), b.catalog, PlanOptions(all_methods=True))
    assert waiting.target_fleet.plan.state == "waiting"
    assert not [c for c in waiting.commands_ if c.method != "expiration"]
    details = {d.method: d.reason for x in waiting.blocked for d in x.details}
    for method in (MULTI_NODE_CONSOLIDATION, SINGLE_NODE_CONSOLIDATION):
        assert "being consolidated by Optimal plan" in details[method]
    assert not [c for c in waiting.annotations if c.key == PLAN_ANNOTATION]  # nothing to change
    del counter


def test_the_rest_of_a_plan_that_no_longer_pays_back_is_dropped():
    b = fragmented(nodes=8, budget="2")
    counter = [0]
    first = plan(b.snapshot(), b.catalog)
    carry_out(b, first, counter)
    # Say its leaving nodes were worth nothing when it started: it has spent more than it saved.
    for name, marker in markers(b).items():
        cheap = marker.model_copy(update={"leaving_cost": 0.0})
        node_obj(b, name)["metadata"]["annotations"][PLAN_ANNOTATION] = cheap.as_value()
    second = plan(b.snapshot(), b.catalog)
    held = first.target_fleet.plan
    assert second.target_fleet.ended.startswith(f"plan {held.id} dropped: the rest no longer saves")


def test_validation_refuses_a_move_that_would_leave_its_plan_dearer_than_it_found_the_cluster():
    b = investment_cluster()
    counter = [0]
    result = plan(b.snapshot(), b.catalog)
    carry_out(b, result, counter)  # d goes: the plan has saved $0.192/h
    snapshot = b.snapshot()
    second = plan(snapshot, b.catalog)
    (out,) = [c for c in second.commands if c.method == OPTIMAL_CONSOLIDATION]
    assert out.savings_per_hour < 0
    assert validate_command(snapshot, b.catalog, out).valid
    for name, marker in markers(b).items():  # as if the plan had saved nothing yet
        node_obj(b, name)["metadata"]["annotations"][PLAN_ANNOTATION] = marker.model_copy(
            update={"leaving_cost": marker.leaving_cost - 0.192}
        ).as_value()
    verdict = validate_command(b.snapshot(), b.catalog, out)
    assert not verdict.valid and verdict.reason.startswith("ledger")


def test_markers_on_a_pool_that_left_the_strategy_are_removed():
    b = fragmented(nodes=8, budget="2")
    first = plan(b.snapshot(), b.catalog)
    carry_out(b, first, [0])
    assert markers(b)
    pool = next(o for o in b.objects if o["kind"] == "NodePool")
    pool["metadata"]["annotations"] = {}
    result = plan(b.snapshot(), b.catalog)
    assert {c.node for c in result.annotations if c.key == PLAN_ANNOTATION and c.value is None} == set(
        markers(b)
    )
    assert all(not t.add for t in result.taints)


def test_the_simulation_takes_a_planned_destination_only_when_the_rules_allow():
    from planner.scheduling.adapter import SnapshotSimulation

    b = ClusterBuilder()
    b.nodepool("default", expire_after="Never")
    b.nodeclass()
    b.node("a-first", instance_type="m5.xlarge")
    b.node("b-second", instance_type="m5.xlarge")
    b.node(
        "c-tainted",
        instance_type="m5.xlarge",
        taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}],
    )
    b.node("going", instance_type="m5.large")
    b.pod("web-1", "going", cpu="500m", memory="512Mi")
    b.pod("web-2", "going", cpu="500m", memory="512Mi")
    snapshot = b.snapshot()
    sim = SnapshotSimulation(snapshot, b.catalog)
    plain = sim.run(["going"])
    assert set(plain.placements.values()) == {"a-first"}  # first fit by name
    planned = sim.run(["going"], prefer={"default/web-1": "b-second", "default/web-2": "c-tainted"})
    assert planned.placements["default/web-1"] == "b-second"
    assert planned.placements["default/web-2"] == "a-first"  # the taint is not tolerated: as usual


def test_validation_places_a_moves_pods_where_its_plan_put_them():
    """First fit would put the 1-CPU pod on the kept node and leave the memory-heavy one for the new
    c5.large, which cannot hold it; the move planned the other way round, and its CommandOut says so."""
    from planner.plan import CommandOut, ReplacementOut

    b = ClusterBuilder()
    pool = b.nodepool("default", expire_after="Never", requirements=ON_DEMAND_M5_C5)
    pool["metadata"]["annotations"] = dict(OPTIMAL)
    b.nodeclass()
    b.node("kept", instance_type="m5.xlarge", zone="us-west-2a")
    b.pod(
        "resident", "kept", cpu="2920m", memory="10000Mi", annotations={"karpenter.sh/do-not-disrupt": "true"}
    )
    b.node("going", instance_type="m5.large", zone="us-west-2a")
    b.pod("cpu-heavy", "going", cpu="1", memory="1Gi")
    b.pod("memory-heavy", "going", cpu="500m", memory="3500Mi")
    snapshot = b.snapshot()
    planned = CommandOut(
        id="x",
        method=OPTIMAL_CONSOLIDATION,
        reason="Underutilized",
        decision="replace",
        nodes=["going"],
        nodepools=["default"],
        replacements=[
            ReplacementOut(
                nodepool="default",
                instance_types=["c5.large"],
                capacity_type="on-demand",
                zones=["us-west-2a"],
                price=0.085,
                pods=1,
                pod_keys=["default/cpu-heavy"],
            )
        ],
        savings_per_hour=0.011,
        disruption_class="graceful",
        pods=2,
        placements={"default/memory-heavy": "kept"},
    )
    assert validate_command(snapshot, b.catalog, planned).valid
    first_fit = planned.model_copy(
        update={
            "placements": {},
            "replacements": [planned.replacements[0].model_copy(update={"pod_keys": []})],
        }
    )
    verdict = validate_command(snapshot, b.catalog, first_fit)
    assert not verdict.valid and verdict.reason.startswith("scheduling")
    # A planned move carries its destinations into the controller (PassResult) and back.
    b2 = fragmented(nodes=8, budget="2")
    (move,) = [c for c in plan(b2.snapshot(), b2.catalog).commands if c.method == OPTIMAL_CONSOLIDATION]
    carried = {k for r in move.replacements for k in r.pod_keys} | set(move.placements)
    assert carried and len(carried) == move.pods


def test_a_plan_not_done_in_time_is_dropped():
    b = fragmented(nodes=8, budget="2")
    first = plan(b.snapshot(), b.catalog)
    carry_out(b, first, [0])
    b.now += timedelta(hours=2)
    later = plan(b.snapshot(), b.catalog)
    assert later.target_fleet.ended.startswith(f"plan {first.target_fleet.plan.id} dropped: not done after")
    still = plan(b.snapshot(), b.catalog, PlanOptions(optimal_plan_max_age=timedelta(hours=3)))
    assert still.target_fleet.plan.id == first.target_fleet.plan.id


def test_a_held_plan_out_of_solver_time_waits_rather_than_drops(monkeypatch):
    import planner.optimal.method as method
    from planner.optimal.solver import TargetFleet

    b = fragmented(nodes=8, budget="2")
    first = plan(b.snapshot(), b.catalog)
    carry_out(b, first, [0])
    held = first.target_fleet.plan

    def out_of_time(problem, time_limit, removals=None, churn=0.0):
        return TargetFleet(set(), [], {}, 0.0, "Time limit reached", time_limit, False, True, False)

    monkeypatch.setattr(method, "solve_target", out_of_time)
    monkeypatch.setattr(method, "_options", lambda problem, keys: None)  # its planned nodes are gone
    result = plan(b.snapshot(), b.catalog)
    assert not optimal_commands(result)
    assert (result.target_fleet.plan.id, result.target_fleet.plan.state) == (held.id, "waiting")
    assert not [c for c in result.annotations if c.key == PLAN_ANNOTATION]  # its markers stay
    assert not [t for t in result.taints if not t.add]  # and its leaving taints


def test_the_savings_floor_judges_a_plan_as_a_whole():
    b = investment_cluster()  # the plan saves $0.31/h in all; one of its moves costs $0.074/h more
    pool = next(o for o in b.objects if o["kind"] == "NodePool")
    pool["metadata"]["annotations"]["karpflow.dev/min-savings-per-hour"] = "0.25"
    counter = [0]
    result = plan(b.snapshot(), b.catalog)
    savings = []
    while optimal_commands(result):
        savings.extend(c.savings_per_hour for c in optimal_commands(result))
        carry_out(b, result, counter)
        result = plan(b.snapshot(), b.catalog)
    assert any(s < 0 for s in savings), savings
    pool["metadata"]["annotations"]["karpflow.dev/min-savings-per-hour"] = "0.5"
    fresh = investment_cluster()
    next(o for o in fresh.objects if o["kind"] == "NodePool")["metadata"]["annotations"][
        "karpflow.dev/min-savings-per-hour"
    ] = "0.5"
    refused = plan(fresh.snapshot(), fresh.catalog)
    assert not optimal_commands(refused)
    assert "the plan as a whole: savings floor:" in refused.target_fleet.why_no_step


def test_later_moves_launch_the_nodes_the_plan_planned_when_they_still_hold_the_rest():
    b = fragmented(nodes=8, budget="2")
    first = plan(b.snapshot(), b.catalog)
    held = PlanMarker.model_validate_json(
        next(c.value for c in first.annotations if c.key == PLAN_ANNOTATION)
    )
    assert held.launches, "the plan records the new nodes it planned"
    counter = [0]
    launched = []
    result = first
    for _ in range(10):
        launched += [
            f"default/{r.instance_type_names[0]}/{r.capacity_type}"
            for c in optimal_commands(result)
            for r in c.replacements
        ]
        carry_out(b, result, counter)
        result = plan(b.snapshot(), b.catalog)
        if not optimal_commands(result):
            break
    assert sorted(launched) == sorted(held.launches)
