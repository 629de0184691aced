from datetime import UTC, datetime, timedelta, timezone

import pytest
import yaml

from api.nodepool import Budget
from kube.times import parse_time
from planner.budgets import BudgetError, budget_active, build_budget_map, next_budget_change
from planner.candidates import build_candidates
from planner.cli import parse_at
from planner.snapshot import Snapshot
from sim.cluster_builder import ClusterBuilder


def pool_with(budgets, nodes: int = 10, at: datetime | None = None, **node_kwargs) -> ClusterBuilder:
    b = ClusterBuilder(now=at) if at else ClusterBuilder()
    b.nodepool("default", budgets=budgets)
    for i in range(nodes):
        b.node(f"n{i:02d}", **node_kwargs)
    return b


def remaining(b: ClusterBuilder, reason: str = "Underutilized") -> int:
    return build_budget_map(b.context(), reason).available("default")


def test_percentages_round_up():
    assert remaining(pool_with([{"nodes": "15%"}], nodes=10)) == 2
    assert remaining(pool_with([{"nodes": "1%"}], nodes=3)) == 1


def test_an_integer_budget_is_a_node_count():
    assert remaining(pool_with([{"nodes": "3"}], nodes=10)) == 3


def test_the_default_budget_is_ten_percent():
    assert remaining(pool_with(None, nodes=25)) == 3


def test_the_minimum_of_the_active_budgets_applies():
    assert remaining(pool_with([{"nodes": "50%"}, {"nodes": "2"}, {"nodes": "40%"}], nodes=10)) == 2


def test_nodes_zero_freezes_the_pool():
    assert remaining(pool_with([{"nodes": "0"}], nodes=10)) == 0


def test_budget_reasons_scope_which_disruptions_they_limit():
    b = pool_with([{"nodes": "0", "reasons": ["Drifted"]}, {"nodes": "5", "reasons": ["Empty", "Drifted"]}])
    assert remaining(b, "Drifted") == 0
    assert remaining(b, "Empty") == 5
    assert remaining(b, "Underutilized") == 10  # no budget names it: unlimited (capped at pool size)


WEEKDAY_FREEZE = [{"nodes": "10"}, {"nodes": "0", "schedule": "0 9 * * mon-fri", "duration": "8h"}]


@pytest.mark.parametrize(
    ("at", "expected"),
    [
        (datetime(2026, 11, 23, 8, 59, tzinfo=UTC), 10),  # Monday before the window
        (datetime(2026, 11, 23, 9, 0, tzinfo=UTC), 0),  # the cron hit itself
        (datetime(2026, 11, 23, 16, 59, tzinfo=UTC), 0),
        (datetime(2026, 11, 23, 17, 0, tzinfo=UTC), 10),  # duration elapsed
        (datetime(2026, 11, 22, 12, 0, tzinfo=UTC), 10),  # Sunday
    ],
)
def test_a_scheduled_budget_applies_only_inside_its_utc_window(at, expected):
    assert remaining(pool_with(WEEKDAY_FREEZE, at=at)) == expected


MORNING_FREEZE = [{"nodes": "0", "schedule": "0 9 * * *", "duration": "1h"}]
PLUS_TWO = timezone(timedelta(hours=2))


def test_a_schedule_is_read_in_utc_whatever_the_offset_of_now():
    same_instant = datetime(2026, 11, 22, 11, 30, tzinfo=PLUS_TWO)  # 09:30Z
    assert budget_active(Budget(**MORNING_FREEZE[0]), same_instant)
    assert remaining(pool_with(MORNING_FREEZE, at=same_instant)) == 0
    # 09:30+02:00 is 07:30Z: before the UTC window, although 09:30 on a local clock.
    assert not budget_active(Budget(**MORNING_FREEZE[0]), datetime(2026, 11, 22, 9, 30, tzinfo=PLUS_TWO))


def test_plan_times_with_an_offset_are_normalised_to_utc():
    assert parse_at("2026-11-22T11:30:00+02:00") == datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
    assert parse_time("2026-11-22T11:30:00+02:00") == datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
    snapshot = Snapshot(now=datetime(2026, 11, 22, 11, 30, tzinfo=PLUS_TWO))
    assert snapshot.now.tzinfo is UTC and snapshot.now.hour == 9


def test_cron_macros_are_accepted():
    at = datetime(2026, 11, 22, 0, 30, tzinfo=UTC)
    assert budget_active(Budget(nodes="0", schedule="@daily", duration="1h"), at)
    assert budget_active(Budget(nodes="0", schedule="@midnight", duration="1h"), at)
    assert not budget_active(Budget(nodes="0", schedule="@weekly", duration="10m"), at)


def test_next_budget_change_is_when_the_window_closes_or_opens():
    b = pool_with(WEEKDAY_FREEZE, at=datetime(2026, 11, 23, 10, 0, tzinfo=UTC))
    ctx = b.context()
    pool = ctx.snapshot.nodepools["default"]
    assert next_budget_change(pool, ctx.now) == datetime(2026, 11, 23, 17, 0, tzinfo=UTC)


def test_not_ready_deleting_and_disrupted_nodes_consume_the_budget():
    b = pool_with([{"nodes": "4"}], nodes=6)
    b.node("notready", ready=False)
    b.node("deleting", deleting=True)
    b.node("tainted", taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}])
    budget = build_budget_map(b.context(), "Empty")
    assert budget.total["default"] == 9
    assert budget.disrupting["default"] == 3
    assert budget.available("default") == 1


def test_a_node_tainted_by_a_v1beta1_controller_is_already_disrupting():
    b = pool_with([{"nodes": "2"}], nodes=3)
    b.add(
        yaml.safe_load("""
kind: Node
metadata: {name: old-style, labels: {karpenter.sh/nodepool: default, karpenter.sh/initialized: "true"}}
spec:
  taints: [{key: karpenter.sh/disruption, value: disrupting, effect: NoSchedule}]
status: {conditions: [{type: Ready, status: "True"}]}
""")
    )
    b.node(
        "other-value", taints=[{"key": "karpenter.sh/disruption", "value": "other", "effect": "NoSchedule"}]
    )
    ctx = b.context()
    budget = build_budget_map(ctx, "Underutilized")
    assert (budget.total["default"], budget.disrupting["default"], budget.available("default")) == (5, 1, 1)
    blocked = {x.node: x.reason for x in build_candidates(ctx)[1]}
    assert blocked == {
        "old-style": "disruption already in progress (karpenter.sh/disruption=disrupting taint)"
    }


def test_nodes_marked_for_deletion_in_this_pass_consume_the_budget():
    b = pool_with([{"nodes": "2"}], nodes=5)
    ctx = b.context()
    ctx.marked_for_deletion.add("n00")
    assert build_budget_map(ctx, "Drifted").available("default") == 1


def test_uninitialized_nodes_are_not_in_the_total():
    b = pool_with([{"nodes": "50%"}], nodes=2)
    for i in range(6):
        b.node(f"new{i}", initialized=False)
    assert remaining(b) == 1


def test_a_budget_that_fails_to_parse_fails_closed_and_is_reported():
    b = pool_with([{"nodes": "many"}, {"nodes": "5"}])
    budget = build_budget_map(b.context(), "Empty")
    assert budget.available("default") == 0
    assert "budget nodes 'many'" in budget.errors["default"][0]
    assert "fail closed" in budget.exhausted_message("default")


def test_a_bad_cron_schedule_fails_closed():
    b = pool_with([{"nodes": "5"}, {"nodes": "0", "schedule": "every monday", "duration": "1h"}])
    budget = build_budget_map(b.context(), "Empty")
    assert budget.available("default") == 0
    assert "every monday" in budget.errors["default"][0]
    with pytest.raises(BudgetError):
        budget_active(Budget(nodes="0", schedule="61 * * * *", duration="1h"), datetime.now(UTC))


def test_take_spends_the_budget_and_refuses_beyond_it():
    budget = build_budget_map(pool_with([{"nodes": "2"}]).context(), "Empty")
    assert budget.take("default") and budget.take("default")
    assert not budget.take("default")
    assert not budget.take("unknown-pool")


def test_budget_problems_are_reported_once_in_the_plan():
    from planner.plan import plan

    b = pool_with([{"nodes": "many"}], nodes=1)
    b.nodepool("cron", budgets=[{"nodes": "1", "schedule": "every monday", "duration": "1h"}])
    result = plan(b.snapshot(), b.catalog, methods=[], simulate=None)
    budget_lines = [p for p in result.problems if "budgets" in p]
    assert len(budget_lines) == 2
    assert any(p.startswith("NodePool default: spec.disruption.budgets[0]: nodes") for p in budget_lines)
    assert any(p.startswith("NodePool cron:") and "every monday" in p for p in budget_lines)
    assert result.budgets["default"] == {"Underutilized": 0, "Empty": 0, "Drifted": 0}


def test_used_up_message_separates_nodes_already_disrupting_from_this_plans_commands():
    b = pool_with([{"nodes": "2"}], nodes=4)
    b.node("notready", ready=False)
    ctx = b.context()
    ctx.marked_for_deletion.add("n00")  # an earlier command of this plan
    budget = build_budget_map(ctx, "Empty")
    assert budget.available("default") == 0
    assert budget.exhausted_message("default") == (
        "nodepool default budget for Empty is used up "
        "(2 allowed: 1 already disrupting, 1 by this plan's commands; 0 left)"
    )
    fresh = build_budget_map(pool_with([{"nodes": "2"}], nodes=4).context(), "Empty")
    assert fresh.take("default", 2)  # the method's own command spends the rest
    assert "(2 allowed: 2 by this plan's commands; 0 left)" in fresh.exhausted_message("default")
