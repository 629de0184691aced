"""A node a RolloutWorkflow marked (`karpflow.dev/rollout-requested`) is drifted: replaced by the Drift
method, under the Drifted budget and the Drift window action, like any drifted node."""

from __future__ import annotations

from datetime import timedelta

from api.constants import ROLLOUT_ANNOTATION
from planner.drift import ROLLOUT_REQUESTED, Drift, voluntary_disruption_markers
from planner.model import PlanOptions
from planner.plan import plan
from planner.snapshot import RecentDisruption
from tests.unit.planner.test_drift import FakeSimulation, cluster, status_of

MARK = {ROLLOUT_ANNOTATION: "rollout/c/default/0123456789"}


def marked_cluster(budgets=None):
    b = cluster(budgets=budgets or [{"nodes": "100%"}])
    # Not drifted otherwise: the AMI and groups are the EC2NodeClass's.
    b.node("old", ami="ami-new", security_groups="sg-1,sg-2", annotations=MARK, age=timedelta(days=3))
    b.node("other", ami="ami-new", security_groups="sg-1,sg-2", age=timedelta(days=9))
    return b


def drift_plan(b, **options):
    return plan(b.snapshot(), b.catalog, PlanOptions(**options), methods=[Drift()], simulate=FakeSimulation())


def test_a_marked_node_is_drifted_with_the_rollout_named_and_an_unmarked_one_is_not():
    b = marked_cluster()
    drift = status_of(b, "old")
    assert drift is not None and drift.reason == ROLLOUT_REQUESTED
    assert "rollout/c/default/0123456789" in drift.detail
    assert status_of(b, "other") is None


def test_the_drift_method_replaces_the_marked_node_under_the_drifted_reason():
    b = marked_cluster()
    b.pod("web-1", "old")
    (command,) = drift_plan(b).commands
    assert command.nodes == ["old"] and command.reason == "Drifted" and command.decision == "replace"
    assert "RolloutRequested" in command.message


def test_the_drifted_budget_holds_a_marked_node_back():
    b = marked_cluster(budgets=[{"nodes": "0", "reasons": ["Drifted"]}, {"nodes": "100%"}])
    result = drift_plan(b)
    assert result.commands == []
    assert "budget allows no Drifted disruptions now" in {x.node: x.reason for x in result.blocked}["old"]


def test_a_window_that_blocks_drift_holds_a_marked_node_back():
    b = marked_cluster()
    b.maintenance_window("freeze", actions=["Drift"])
    result = drift_plan(b)
    assert result.commands == []
    assert "MaintenanceWindow freeze blocks Drift" in {x.node: x.reason for x in result.blocked}["old"]


def test_a_marked_node_gets_the_seed_era_drifted_marker_too():
    assert ("old", "drifted") in voluntary_disruption_markers(marked_cluster().context(PlanOptions()))


def test_a_held_back_marked_node_says_what_holds_drift_back_not_another_methods_reason():
    b = cluster(
        budgets=[{"nodes": "0", "reasons": ["Drifted"]}, {"nodes": "100%"}], consolidate_after="Never"
    )
    b.node("old", ami="ami-new", security_groups="sg-1,sg-2", annotations=MARK)
    result = plan(b.snapshot(), b.catalog, PlanOptions(), simulate=FakeSimulation())
    (held,) = result.blocked
    assert "budget allows no Drifted disruptions now" in held.reason, held


def test_a_rate_of_two_per_hour_lets_a_rollout_of_five_take_two_an_hour():
    """Passes through a simulated morning: one drift command per pass, two starts an hour."""
    b = cluster(consolidate_after="Never")
    b.objects[1]["metadata"]["annotations"] = {"karpflow.dev/max-disruptions-per-hour": "2"}
    for i in range(5):
        b.node(
            f"n{i}", ami="ami-new", security_groups="sg-1,sg-2", annotations=MARK, age=timedelta(days=9 - i)
        )
    started: list[RecentDisruption] = []
    by_hour: dict[int, list[str]] = {}
    for minute in range(0, 180, 5):  # a pass every 5 simulated minutes for 3 hours
        snapshot = b.snapshot()
        snapshot.now = b.now + timedelta(minutes=minute)
        snapshot.recent_disruptions = list(started)
        snapshot.nodes = {k: v for k, v in snapshot.nodes.items() if k not in {r.node for r in started}}
        result = plan(snapshot, b.catalog, PlanOptions(), simulate=FakeSimulation())
        for node in (n for c in result.commands for n in c.nodes):
            started.append(
                RecentDisruption(node=node, nodepool="default", reason="Drifted", started_at=snapshot.now)
            )
            by_hour.setdefault(minute // 60, []).append(node)
    assert by_hour == {0: ["n0", "n1"], 1: ["n2", "n3"], 2: ["n4"]}
