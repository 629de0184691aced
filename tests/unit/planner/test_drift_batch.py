"""Drift within the budget in one pass (issue 35 item 1, planner/drift_batch.py): each control bounds
the batch, the batch's pods fit together, and a batch of one is Karpenter's pace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from activities.controls_gate import pause_windows
from api.controller_io import Pause
from planner.drift import Drift
from planner.model import PlanOptions
from planner.operator_controls import with_outside_controls
from planner.plan import Plan, plan
from planner.rate_budgets import RecentDisruption
from planner.scheduling.adapter import simulate as real_simulation
from planner.snapshot import Snapshot
from planner.static_drift import StaticDrift
from sim.cluster_builder import STALE_NODEPOOL_HASH, ClusterBuilder
from tests.unit.planner.test_drift import FakeSimulation

NOW = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
ONLY_M5_LARGE = [
    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large"]},
]


def cluster(budgets: list[dict[str, Any]] | None = None, **pool: Any) -> ClusterBuilder:
    b = ClusterBuilder(now=NOW)
    b.nodeclass()
    b.nodepool(
        "default",
        consolidate_after="Never",
        budgets=budgets if budgets is not None else [{"nodes": "100%"}],
        **pool,
    )
    return b


def drifted(b: ClusterBuilder, name: str, days: int, *, pod_cpu: str | None = "100m", **node: Any) -> None:
    """A node drifted by its NodePool's template, `days` old, with one pod (None: empty)."""
    b.node(name, age=timedelta(days=days), stamp_hash=False, annotations=STALE_NODEPOOL_HASH, **node)
    if pod_cpu is not None:
        b.pod(f"{name}-pod", name, cpu=pod_cpu, memory="256Mi")


def drift_pass(
    b: ClusterBuilder, snapshot: Snapshot | None = None, simulate: Any = None, **options: Any
) -> Plan:
    return plan(
        snapshot or b.snapshot(),
        b.catalog,
        PlanOptions(**options),
        methods=[StaticDrift(), Drift()],
        simulate=simulate or FakeSimulation(),
    )


def started(result: Plan) -> list[str]:
    return [node for command in result.commands for node in command.nodes]


def reasons(result: Plan) -> dict[str, str]:
    return {x.node: x.reason for x in result.blocked}


# --- Each control bounds the batch ----------------------------------------------------------------


def test_one_pass_takes_the_whole_drifted_budget_oldest_first_and_never_more():
    b = cluster(budgets=[{"nodes": "30%", "reasons": ["Drifted"]}, {"nodes": "100%"}])
    for i in range(10):
        drifted(b, f"n{i}", days=20 - i)
    result = drift_pass(b)
    assert started(result) == ["n0", "n1", "n2"]  # 30 % of 10, the oldest
    assert result.budgets["default"]["Drifted"] == 0
    assert "budget for Drifted is used up (3 allowed: 3 by this plan's commands" in reasons(result)["n3"]


def test_nodes_already_disrupting_count_against_the_batch():
    b = cluster(budgets=[{"nodes": "3"}])
    drifted(b, "in-flight", days=30, taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}])
    for i in range(5):
        drifted(b, f"n{i}", days=20 - i)
    assert started(drift_pass(b)) == ["n0", "n1"]


def test_the_per_pass_setting_caps_the_batch_and_one_is_karpenters_pace():
    b = cluster()
    for i in range(5):
        drifted(b, f"n{i}", days=20 - i)
    two = drift_pass(b, drift_commands_per_pass=2)
    assert started(two) == ["n0", "n1"]
    assert reasons(two)["n2"].startswith(
        "drifted (NodePoolDrifted); this pass started its 2 drift commands (the most per pass)"
    )
    one = drift_pass(b, drift_commands_per_pass=1)
    assert started(one) == ["n0"]
    assert reasons(one)["n1"] == "drifted (NodePoolDrifted); one drift command per pass, waits for the next"


def test_a_node_disruption_budget_bounds_the_nodes_it_selects_and_leaves_the_others():
    b = cluster()
    for i in range(4):
        drifted(b, f"blue-{i}", days=20 - i, labels={"team": "blue"})
    drifted(b, "green-0", days=1, labels={"team": "green"})
    b.node_disruption_budget("blue", selector={"matchLabels": {"team": "blue"}}, max_unavailable=2)
    result = drift_pass(b)
    assert started(result) == ["blue-0", "blue-1", "green-0"]
    assert "NodeDisruptionBudget blue allows 0 (maxUnavailable 2" in reasons(result)["blue-2"]


def test_a_rate_budget_bounds_the_batch_with_the_starts_it_already_counts():
    b = cluster(budgets=[{"nodes": "100%"}, {"nodes": "3", "per": "1h"}])
    for i in range(6):
        drifted(b, f"n{i}", days=20 - i)
    snapshot = b.snapshot()
    snapshot.recent_disruptions = [RecentDisruption("gone", "default", "Drifted", NOW - timedelta(minutes=5))]
    result = drift_pass(b, snapshot)
    assert started(result) == ["n0", "n1"]
    assert "rate budget for Drifted is used up (3 per 1h" in reasons(result)["n2"]


def test_maintenance_windows_and_pauses_keep_their_nodes_out_of_the_batch():
    b = cluster()
    b.nodepool("frozen", consolidate_after="Never", budgets=[{"nodes": "100%"}])
    for i in range(3):
        drifted(b, f"blue-{i}", days=20 - i, labels={"team": "blue"})
        drifted(b, f"frozen-{i}", days=10 - i, pool="frozen")
    drifted(b, "green-0", days=1)
    b.maintenance_window(
        "blue-freeze",
        actions=["Drift"],
        selector=[{"key": "team", "operator": "In", "values": ["blue"]}],
    )
    pause = Pause(scope="nodepool", nodepool="frozen", since=NOW)
    snapshot = with_outside_controls(b.snapshot(), pause_windows([pause]), None)
    result = drift_pass(b, snapshot)
    assert started(result) == ["green-0"]
    assert reasons(result)["blue-0"].startswith("MaintenanceWindow blue-freeze blocks Drift")
    assert "NodePool frozen" in reasons(result)["frozen-0"]


def test_a_static_pools_drifted_nodes_are_static_drifts_not_the_batchs():
    b = cluster()
    b.nodepool("fixed", consolidate_after="Never", budgets=[{"nodes": "100%"}], replicas=2)
    drifted(b, "fixed-0", days=9, pool="fixed", pod_cpu=None)
    drifted(b, "fixed-1", days=8, pool="fixed", pod_cpu=None)
    drifted(b, "n0", days=5)
    result = drift_pass(b)
    # StaticDrift ends the pass first (Karpenter's order); the dynamic pool's node waits for drift.
    assert {c.method for c in result.commands} == {"static-drift"}
    assert started(result) == ["fixed-0", "fixed-1"]
    assert started(drift_pass(b, simulate=FakeSimulation())) == started(result)


# --- The batch's pods fit together (the real scheduling simulation) -------------------------------


def test_room_on_an_existing_node_is_counted_once_for_the_batch():
    """Room for one more pod on the only node that stays: the first member's pod takes it (a plain
    delete), the second must buy a node. Simulated one by one, both would count on that room."""
    b = cluster(requirements=ONLY_M5_LARGE)
    b.node("spare", instance_type="m5.large")
    b.pod("resident", "spare", cpu="500m", memory="256Mi")
    drifted(b, "a", days=9, instance_type="m5.large", pod_cpu="1200m")
    drifted(b, "b", days=8, instance_type="m5.large", pod_cpu="1200m")
    result = drift_pass(b, simulate=real_simulation)
    by_node = {c.nodes[0]: c for c in result.commands}
    assert sorted(by_node) == ["a", "b"]
    assert by_node["a"].decision == "delete"
    assert by_node["b"].decision == "replace" and by_node["b"].replacements[0].pods == 1


def test_no_pod_is_planned_onto_another_node_of_the_batch():
    """`a`'s pod would fit on `b`, drifted too and in the same batch: it is given a node of its own.
    Karpenter's pace (one per pass) plans it onto `b`, which a later pass replaces."""
    b = cluster(requirements=ONLY_M5_LARGE)
    drifted(b, "a", days=9, instance_type="m5.large", pod_cpu="1200m")
    drifted(b, "b", days=8, instance_type="m5.large", pod_cpu="200m")
    batch = drift_pass(b, simulate=real_simulation)
    assert [(c.nodes, c.decision) for c in batch.commands] == [(["a"], "replace"), (["b"], "replace")]
    # Each replacement holds its own command's pod: another's only if the simulation said so.
    for command in batch.commands_:
        own = {p.key for p in command.candidates[0].reschedulable_pods}
        assert {p.key for r in command.replacements for p in r.pods} == own
    one = drift_pass(b, simulate=real_simulation, drift_commands_per_pass=1)
    assert [(c.nodes, c.decision) for c in one.commands] == [(["a"], "delete")]


def test_a_late_member_that_holds_pods_planned_by_the_batch_waits():
    """The batch of two chose `a` and `stuck`; `a`'s pod was planned onto `late` (not in the batch
    then). `stuck`'s pod fits nowhere, so `late` would take its place, but `a`'s pod counts on it."""
    b = cluster(requirements=ONLY_M5_LARGE)
    drifted(b, "a", days=9, instance_type="m5.large", pod_cpu="1200m")
    drifted(b, "stuck", days=8, instance_type="m5.xlarge", pod_cpu="3")
    drifted(b, "late", days=1, instance_type="m5.large", pod_cpu=None)
    b.pod("late-resident", "late", cpu="100m", memory="128Mi")
    result = drift_pass(b, simulate=real_simulation, drift_commands_per_pass=2)
    assert [(c.nodes, c.decision) for c in result.commands] == [(["a"], "delete")]
    why = reasons(result)
    assert "cannot be rescheduled" in why["stuck"]
    assert "pods of drifted nodes this pass replaces are planned onto it" in why["late"]


def test_a_closed_node_keeps_its_pods_and_takes_none():
    b = cluster(requirements=ONLY_M5_LARGE)
    b.node("open", instance_type="m5.large")
    b.node("closed", instance_type="m5.large")
    b.pod("mover", "open", cpu="1000m", memory="256Mi")
    ctx = b.context(simulate=real_simulation)
    candidate = next(c for c in _candidates(ctx) if c.name == "open")
    assert real_simulation(ctx, [candidate]).placements["default/mover"] == "closed"
    ctx.closed_nodes = frozenset({"closed"})
    result = real_simulation(ctx, [candidate])
    assert "default/mover" not in result.placements or result.placements["default/mover"] != "closed"
    assert [len(r.pods) for r in result.new_nodes] == [1]


def _candidates(ctx: Any) -> list[Any]:
    from planner.candidates import build_candidates

    return build_candidates(ctx)[0]


def test_at_the_taint_a_batch_that_fills_a_rate_passes_member_by_member_and_one_more_is_refused():
    """Issue 35: the batch's commands start at once, and each member's taint reads the others' starts
    (visibility lists them within a second): a batch the pass sized to the rate passes, one more is
    refused (planner/rate_budgets.py `rate_refusal`, which activities/controls_gate.py applies)."""
    from api.nodepool import NodePool
    from planner.rate_budgets import rate_refusal

    pool = NodePool.model_validate(
        {
            "metadata": {"name": "default"},
            "spec": {
                "template": {
                    "spec": {
                        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"}
                    }
                },
                "disruption": {"budgets": [{"nodes": "3", "per": "1h"}]},
            },
        }
    )
    batch = ["n0", "n1", "n2"]
    started = [RecentDisruption(n, "default", "Drifted", NOW - timedelta(seconds=1)) for n in batch]
    for member in batch:
        others = [s for s in started if s.node != member]
        assert rate_refusal(pool, 30, "Drifted", NOW, others, [member]) is None
    refusal = rate_refusal(pool, 30, "Drifted", NOW, started, ["n3"])
    assert refusal is not None and "rate budget for Drifted is used up" in refusal
