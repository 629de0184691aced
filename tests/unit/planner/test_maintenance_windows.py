"""MaintenanceWindows: matching, activity, "until when", fail-closed reading, and what a pass does
with them (docs/operator-controls.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from planner.maintenance_windows import blocked, read_window
from planner.model import PlanOptions
from planner.plan import plan
from planner.plan import validate_command as validate
from sim.cluster_builder import ClusterBuilder

MONDAY_10 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
BLUE = [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["blue"]}]


def window(name="w", *, actions=("Consolidation",), schedules=None, selector=None) -> dict:
    spec: dict = {"actions": list(actions)}
    if schedules is not None:
        spec["schedules"] = schedules
    if selector is not None:
        spec["selector"] = selector
    return {
        "apiVersion": "karpflow.dev/v1alpha1",
        "kind": "MaintenanceWindow",
        "metadata": {"name": name},
        "spec": spec,
    }


OFFICE_HOURS = [{"cron": "0 9 * * 1-5", "duration": "8h"}]


# --- The rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "expected"),
    [
        (datetime(2026, 11, 23, 8, 59, tzinfo=UTC), None),  # Monday, before the cron hit
        (datetime(2026, 11, 23, 9, 0, tzinfo=UTC), "2026-11-23 17:00:00+00:00"),  # the hit itself
        (datetime(2026, 11, 23, 16, 59, 59, tzinfo=UTC), "2026-11-23 17:00:00+00:00"),
        (datetime(2026, 11, 23, 17, 0, tzinfo=UTC), None),  # the duration has elapsed
        (datetime(2026, 11, 22, 12, 0, tzinfo=UTC), None),  # Sunday
    ],
)
def test_a_scheduled_window_blocks_from_each_cron_hit_for_its_duration(at, expected):
    found = blocked([read_window(window(schedules=OFFICE_HOURS))], "Consolidation", {}, at)
    assert (str(found.until) if found else None) == expected


def test_a_window_blocks_only_its_actions_on_the_nodes_its_selector_matches():
    w = read_window(window(actions=["Drift", "Expiration"], selector=BLUE))
    blue, green = {"karpenter.sh/nodepool": "blue"}, {"karpenter.sh/nodepool": "green"}
    assert blocked([w], "Drift", blue, MONDAY_10) is not None
    assert blocked([w], "Expiration", blue, MONDAY_10) is not None
    assert blocked([w], "Consolidation", blue, MONDAY_10) is None
    assert blocked([w], "Drift", green, MONDAY_10) is None
    assert blocked([w], "Drift", {}, MONDAY_10) is None  # no nodepool label: In does not match


def test_a_window_without_schedule_is_a_pause_until_it_is_deleted():
    found = blocked([read_window(window("pause", actions=["Drift"]))], "Drift", {"any": "node"}, MONDAY_10)
    assert found is not None and found.until is None
    assert found.message() == "MaintenanceWindow pause blocks Drift until pause is deleted (no schedule)"


def test_every_matching_window_must_allow_an_action_and_the_block_lasts_until_the_last_closes():
    morning = read_window(window("morning", schedules=[{"cron": "0 9 * * *", "duration": "2h"}]))
    # opens at 10:30, before the morning one closes: one block from 09:00 to 12:00
    late = read_window(window("late", schedules=[{"cron": "30 10 * * *", "duration": "90m"}]))
    found = blocked([morning, late], "Consolidation", {}, MONDAY_10)
    assert found.windows == ("morning",) and found.until == datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    assert found.message() == "MaintenanceWindow morning blocks Consolidation until 2026-11-23T12:00:00Z"
    both = blocked([morning, late], "Consolidation", {}, MONDAY_10 + timedelta(minutes=45))
    assert both.windows == ("late", "morning") and both.until == datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    assert blocked([morning, late], "Consolidation", {}, datetime(2026, 11, 23, 12, 0, tzinfo=UTC)) is None


def test_macros_are_robfig_cron_macros_in_utc():
    daily = read_window(window(schedules=[{"cron": "@daily", "duration": "1h"}]))
    assert blocked([daily], "Consolidation", {}, datetime(2026, 11, 23, 0, 30, tzinfo=UTC)) is not None
    assert blocked([daily], "Consolidation", {}, datetime(2026, 11, 23, 1, 0, tzinfo=UTC)) is None


def test_schedules_that_chain_without_a_gap_have_no_end():
    hourly = read_window(window(schedules=[{"cron": "0 * * * *", "duration": "90m"}]))
    found = blocked([hourly], "Consolidation", {}, MONDAY_10)
    assert found is not None and found.until is None
    assert "more than a year" in found.message()


# --- Bad objects fail closed ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "actions", "every_node"),
    [
        # a bad cron: always active, for the actions and nodes it names
        (
            {"schedules": [{"cron": "0 25 * * *", "duration": "1h"}], "actions": ["Drift"], "selector": BLUE},
            {"Drift"},
            False,
        ),
        # an unknown action: we cannot tell what it protects, so every action
        ({"actions": ["Consolidaton"], "selector": BLUE}, "all", False),
        # a selector that cannot be read: every node
        ({"actions": ["Drift"], "selector": [{"key": "x", "operator": "Near"}]}, {"Drift"}, True),
        # a duration of 0s, and no actions at all
        ({"schedules": [{"cron": "@daily", "duration": "0s"}], "actions": []}, "all", True),
    ],
)
def test_a_broken_window_blocks_what_it_names_everywhere_it_would_match(spec, actions, every_node):
    w = read_window({"metadata": {"name": "bad"}, "spec": spec})
    assert w.broken and w.problems
    expected = (
        {"Expiration", "Drift", "Emptiness", "Consolidation", "Rebalance", "Repair"}
        if actions == "all"
        else actions
    )
    assert w.actions == expected
    at = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)  # outside any schedule it names
    green = {"karpenter.sh/nodepool": "green"}
    assert (blocked([w], next(iter(expected)), green, at) is not None) == every_node
    found = blocked([w], next(iter(expected)), {"karpenter.sh/nodepool": "blue"}, at)
    assert found is not None and found.until is None and "until bad is fixed" in found.message()


def test_a_broken_window_is_a_problem_of_the_snapshot_and_the_plan():
    b = ClusterBuilder()
    b.add(
        {
            "apiVersion": "karpflow.dev/v1alpha1",
            "kind": "MaintenanceWindow",
            "metadata": {"name": "typo"},
            "spec": {"actions": ["Consolidaton"]},
        }
    )
    result = plan(b.snapshot(), b.catalog)
    (problem,) = [p for p in result.problems if "typo" in p]
    assert problem.startswith("MaintenanceWindow typo: spec.actions.0: Input should be")
    assert problem.endswith(
        "(it fails closed: blocks Consolidation, Drift, Emptiness, Expiration, Rebalance, "
        "Repair for every node)"
    )


# --- A planning pass ------------------------------------------------------------------------------


def two_pools(now: datetime = MONDAY_10) -> ClusterBuilder:
    """Two pools of two underutilized nodes each: consolidation can empty either pool."""
    b = ClusterBuilder(now=now)
    for pool in ("blue", "green"):
        b.nodepool(pool, budgets=[{"nodes": "100%"}])
        for i in range(2):
            b.node(f"{pool}-{i}", pool=pool, instance_type="m5.xlarge")
            b.pod(f"{pool}-app-{i}", f"{pool}-{i}", cpu="200m", memory="256Mi")
    return b


def disrupted(result) -> set[str]:
    return {n for c in result.commands for n in c.nodes}


def test_an_active_window_blocks_consolidation_of_matching_nodes_and_not_of_others():
    b = two_pools()
    b.maintenance_window("blue-hours", actions=["Consolidation"], schedules=OFFICE_HOURS, selector=BLUE)
    result = plan(b.snapshot(), b.catalog, PlanOptions(all_methods=True))
    assert disrupted(result) and not disrupted(result) & {"blue-0", "blue-1"}
    reasons = {x.node: x.reason for x in result.blocked}
    assert reasons["blue-0"] == "MaintenanceWindow blue-hours blocks Consolidation until 2026-11-23T17:00:00Z"


def test_when_the_window_closes_consolidation_proceeds():
    b = two_pools(now=datetime(2026, 11, 23, 17, 0, tzinfo=UTC))
    b.maintenance_window("blue-hours", actions=["Consolidation"], schedules=OFFICE_HOURS, selector=BLUE)
    result = plan(b.snapshot(), b.catalog, PlanOptions(all_methods=True))
    assert disrupted(result) & {"blue-0", "blue-1"}
    assert not [x for x in result.blocked if "MaintenanceWindow" in x.reason]


def test_the_plain_plan_names_a_window_before_not_chosen_this_pass():
    """Issue 31 item 9: without --all-methods, an empty node ends the pass at emptiness, and a node
    a window keeps from consolidation until Monday 17:00 said only "not chosen this pass"."""
    b = two_pools()
    b.node("green-empty", pool="green", instance_type="m5.xlarge")
    b.maintenance_window("blue-hours", actions=["Consolidation"], schedules=OFFICE_HOURS, selector=BLUE)
    result = plan(b.snapshot(), b.catalog, PlanOptions())
    assert [c.method for c in result.commands] == ["emptiness"]
    reasons = {x.node: x.reason for x in result.blocked}
    assert reasons["blue-0"] == "MaintenanceWindow blue-hours blocks Consolidation until 2026-11-23T17:00:00Z"
    assert reasons["green-0"].startswith("not chosen this pass: emptiness produced commands")


def test_a_window_for_another_action_does_not_stop_consolidation():
    b = two_pools()
    b.maintenance_window("no-drift", actions=["Drift", "Emptiness"])
    assert disrupted(plan(b.snapshot(), b.catalog, PlanOptions(all_methods=True))) & {"blue-0", "blue-1"}


def test_emptiness_and_drift_are_their_own_actions():
    b = ClusterBuilder(now=MONDAY_10)
    b.nodepool("default", budgets=[{"nodes": "100%"}])
    b.node("empty")
    b.node("drifted", annotations={"karpenter.sh/nodepool-hash": "stale"})
    b.pod("web-1", "drifted")
    b.maintenance_window("freeze", actions=["Emptiness", "Drift", "Consolidation"])
    result = plan(b.snapshot(), b.catalog, PlanOptions(all_methods=True))
    assert result.commands == []
    reasons = {x.node: x.reason for x in result.blocked}
    assert (
        reasons["empty"] == "MaintenanceWindow freeze blocks Emptiness until freeze is deleted (no schedule)"
    )
    assert reasons["drifted"] == "MaintenanceWindow freeze blocks Drift until freeze is deleted (no schedule)"
    b.objects[-1]["spec"]["actions"] = ["Drift"]  # emptiness is its own action: it goes again
    result = plan(b.snapshot(), b.catalog)
    assert [(c.method, c.nodes) for c in result.commands] == [("emptiness", ["empty"])]


def expired_cluster(now: datetime) -> ClusterBuilder:
    b = ClusterBuilder(now=now)
    b.nodepool("blue", expire_after="24h", budgets=[{"nodes": "0"}])
    b.node("old", pool="blue", age=timedelta(hours=30))
    b.maintenance_window("blue-hours", actions=["Expiration"], schedules=OFFICE_HOURS, selector=BLUE)
    return b


def test_soft_expiration_an_expired_node_waits_for_the_window_and_goes_when_it_allows():
    inside = expired_cluster(MONDAY_10)
    result = plan(inside.snapshot(), inside.catalog)
    assert result.commands == []
    (old,) = [x for x in result.blocked if x.node == "old"]
    assert old.reason == (
        "expired at 2026-11-23T04:00:00Z, but MaintenanceWindow blue-hours blocks Expiration until "
        "2026-11-23T17:00:00Z"
    )
    after = expired_cluster(datetime(2026, 11, 23, 17, 0, tzinfo=UTC))
    (command,) = plan(after.snapshot(), after.catalog).commands
    assert (command.method, command.nodes) == ("expiration", ["old"])


def test_repair_waits_for_a_window_that_blocks_it():
    b = ClusterBuilder(now=MONDAY_10)
    b.nodepool("default")
    for i in range(5):
        b.node(f"n{i}", ready=i != 0, ready_for=timedelta(hours=2))
    b.maintenance_window("no-repair", actions=["Repair"])
    result = plan(b.snapshot(), b.catalog, methods=[])
    assert [c for c in result.commands if c.method == "repair"] == []
    b.objects = [o for o in b.objects if o["kind"] != "MaintenanceWindow"]
    assert [c.nodes for c in plan(b.snapshot(), b.catalog, methods=[]).commands if c.method == "repair"] == [
        ["n0"]
    ]


def test_validation_refuses_a_command_a_window_now_blocks():
    b = two_pools()
    result = plan(b.snapshot(), b.catalog, PlanOptions(all_methods=True))
    command = next(c for c in result.commands if set(c.nodes) & {"blue-0", "blue-1"})
    b.maintenance_window("blue-hours", actions=["Consolidation"], selector=BLUE)
    verdict = validate(b.snapshot(), b.catalog, command)
    assert not verdict.valid
    assert "MaintenanceWindow blue-hours blocks Consolidation" in verdict.reason


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"metadata": [], "spec": "all"},
        {"metadata": {"name": "w"}, "spec": {"actions": "Drift", "selector": "x", "schedules": "daily"}},
        {
            "metadata": {"name": "w"},
            "spec": {"actions": ["Drift"], "schedules": [{"cron": 5, "duration": None}]},
        },
        {"metadata": {"name": "w"}, "spec": {"actions": ["Drift"], "selector": [None, 3]}},
    ],
)
def test_any_object_reads_as_a_window_that_fails_closed(raw):
    w = read_window(raw)
    assert w.broken and w.active_at(MONDAY_10) and w.actions
    assert blocked([w], next(iter(w.actions)), {}, MONDAY_10) is not None


def test_expired_nodes_a_window_deferred_are_paced_by_budgets_and_ndbs_when_it_closes():
    """Issue 19 (the lead's decision): nodes whose expiration a window deferred are not all released
    when it closes, but paced by the pool's budgets naming no reason and by NodeDisruptionBudgets;
    an expired node no window deferred stays forceful (Karpenter v1)."""

    def cluster(now: datetime, deferred: bool, ndb: bool = False) -> ClusterBuilder:
        b = ClusterBuilder(now=now)
        # One at a time for Expired (a budget naming no reason); one naming a reason does not count.
        budgets = [{"nodes": "100%" if ndb else "1"}, {"nodes": "0", "reasons": ["Drifted"]}]
        b.nodepool("blue", expire_after="24h", consolidate_after="Never", budgets=budgets)
        marker = {"karpflow.io/expiration-deferred": "2026-11-23T10:00:00Z"} if deferred else {}
        for i in range(3):
            b.node(f"old-{i}", pool="blue", age=timedelta(hours=30 + i), annotations=dict(marker))
            b.pod(f"web-{i}", f"old-{i}")
        if ndb:
            every = {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "Exists"}]}
            b.node_disruption_budget("one", selector=every, max_unavailable=1)
        b.maintenance_window("blue-hours", actions=["Expiration"], schedules=OFFICE_HOURS, selector=BLUE)
        return b

    inside = cluster(MONDAY_10, deferred=False)
    held = plan(inside.snapshot(), inside.catalog)
    assert held.commands == []
    assert sorted((a.node, a.key, a.value) for a in held.annotations) == [
        (f"old-{i}", "karpflow.io/expiration-deferred", "2026-11-23T10:00:00Z") for i in range(3)
    ]

    closed = datetime(2026, 11, 23, 17, 0, tzinfo=UTC)
    paced = cluster(closed, deferred=True)
    result = plan(paced.snapshot(), paced.catalog)
    assert [(c.method, c.nodes) for c in result.commands] == [("expiration", ["old-0"])]
    reasons = {x.node: x.reason for x in result.blocked}
    assert reasons["old-1"].endswith(
        "deferred by a window: nodepool blue budget for Expired allows 1 (1 disrupting)"
    ), reasons
    assert result.annotations == []  # marked once

    by_ndb = cluster(closed, deferred=True, ndb=True)
    result = plan(by_ndb.snapshot(), by_ndb.catalog)
    assert [c.nodes for c in result.commands] == [["old-0"]]
    assert "NodeDisruptionBudget one allows 0" in {x.node: x.reason for x in result.blocked}["old-1"]

    never = cluster(closed, deferred=False)  # never deferred: forceful, all at once, whatever the budget
    assert sorted(n for c in plan(never.snapshot(), never.catalog).commands for n in c.nodes) == [
        "old-0",
        "old-1",
        "old-2",
    ]
