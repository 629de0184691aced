"""Rate budgets: `per` on a NodePool budget and karpflow.dev/max-disruptions-per-hour
(planner/rate_budgets.py, docs/operator-controls.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from api.nodepool import Budget
from planner.budgets import build_budget_map
from planner.plan import plan
from planner.rate_budgets import longest_period
from planner.snapshot import RecentDisruption
from sim.cluster_builder import ClusterBuilder


def empty_pool(budgets, annotations=None, nodes: int = 5) -> ClusterBuilder:
    b = ClusterBuilder()
    pool = b.nodepool("default", budgets=budgets)
    if annotations:
        pool["metadata"]["annotations"] = annotations
    for i in range(nodes):
        b.node(f"n{i}")
    return b


def run(b: ClusterBuilder, recent=()):
    snapshot = b.snapshot()
    snapshot.recent_disruptions = list(recent)
    return plan(snapshot, b.catalog)


def started(minutes_ago: int, *names: str, reason: str = "Empty", pool: str = "default"):
    at = ClusterBuilder().now - timedelta(minutes=minutes_ago)
    return [RecentDisruption(node=n, nodepool=pool, reason=reason, started_at=at) for n in names]


def chosen(result) -> list[str]:
    return [n for c in result.commands for n in c.nodes]


def test_a_rate_budget_limits_how_many_start_within_its_period():
    result = run(empty_pool([{"nodes": "100%"}, {"nodes": "2", "per": "1h"}]))
    assert chosen(result) == ["n0", "n1"]
    reasons = {x.node: x.reason for x in result.blocked}
    assert reasons["n2"] == (
        "empty, but nodepool default rate budget for Empty is used up "
        "(2 per 1h: 2 started in the last 1h; 0 left)"
    )


def test_recent_starts_count_whatever_their_reason_and_older_ones_do_not():
    b = empty_pool([{"nodes": "100%"}, {"nodes": "2", "per": "1h"}])
    assert chosen(run(b, started(30, "gone-1", reason="Expired"))) == ["n0"]
    assert chosen(run(b, started(30, "gone-1", "gone-2"))) == []
    assert chosen(run(b, started(61, "gone-1", "gone-2"))) == ["n0", "n1"]
    assert chosen(run(b, started(30, "gone-1", "gone-2", pool="other"))) == ["n0", "n1"]


def test_a_percentage_rate_is_of_the_pools_nodes_rounded_up():
    b = empty_pool([{"nodes": "100%"}, {"nodes": "30%", "per": "10m"}], nodes=5)  # 1.5 -> 2
    assert len(chosen(run(b))) == 2
    assert len(chosen(run(b, started(9, "gone-1")))) == 1
    assert len(chosen(run(b, started(11, "gone-1")))) == 2


def test_concurrency_budgets_still_apply_beside_a_rate():
    b = empty_pool([{"nodes": "1"}, {"nodes": "5", "per": "1h"}])
    assert chosen(run(b)) == ["n0"]
    budgets = build_budget_map(b.context(), "Empty")
    assert budgets.allowed["default"] == 1  # the rate is not a concurrency limit


def test_a_rate_budget_limits_only_the_reasons_it_names():
    b = empty_pool([{"nodes": "100%"}, {"nodes": "0", "per": "1h", "reasons": ["Drifted"]}])
    assert len(chosen(run(b))) == 5


def test_a_scheduled_rate_applies_only_inside_its_window():
    sunday_10 = {"schedule": "0 9 * * 0", "duration": "2h"}  # DEFAULT_NOW is Sunday 10:00 UTC
    inside = empty_pool([{"nodes": "100%"}, {"nodes": "1", "per": "1h", **sunday_10}])
    assert chosen(run(inside)) == ["n0"]
    monday = {"schedule": "0 9 * * 1", "duration": "2h"}
    outside = empty_pool([{"nodes": "100%"}, {"nodes": "1", "per": "1h", **monday}])
    assert len(chosen(run(outside))) == 5


def test_the_max_disruptions_per_hour_annotation_is_a_rate_of_n_per_hour():
    b = empty_pool([{"nodes": "100%"}], annotations={"karpflow.dev/max-disruptions-per-hour": "2"})
    assert chosen(run(b)) == ["n0", "n1"]
    assert chosen(run(b, started(59, "gone-1"))) == ["n0"]


def test_a_bad_annotation_fails_the_pool_closed():
    b = empty_pool([{"nodes": "100%"}], annotations={"karpflow.dev/max-disruptions-per-hour": "two"})
    result = run(b)
    assert result.commands == []
    assert any(
        "karpflow.dev/max-disruptions-per-hour='two': expected a non-negative integer" in p
        for p in result.problems
    )


@pytest.mark.parametrize("per", ["0s", "-1m", "soon"])
def test_per_must_be_a_positive_duration(per):
    with pytest.raises(ValidationError):
        Budget(nodes="1", per=per)


def test_an_invalid_per_in_the_spec_fails_the_pool_closed():
    result = run(empty_pool([{"nodes": "100%"}, {"nodes": "2", "per": "0s"}]))
    assert result.commands == []
    assert any("per '0s': must be longer than 0s" in p for p in result.problems)


def test_the_longest_period_says_how_far_back_the_controller_must_read_starts():
    b = empty_pool(
        [{"nodes": "100%"}, {"nodes": "2", "per": "10m"}],
        annotations={"karpflow.dev/max-disruptions-per-hour": "5"},
    )
    b.nodepool("other")
    snapshot = b.snapshot()
    assert longest_period(snapshot.nodepools.values()) == timedelta(hours=1)
    assert longest_period([snapshot.nodepools["other"]]) is None
