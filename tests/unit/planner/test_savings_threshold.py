"""The savings floor (issue 19): replaces that save too little are skipped, and said so per node."""

from __future__ import annotations

import pytest

from api.karpflow_overrides import read_overrides, read_savings_floor
from planner.model import OPTIMAL_CONSOLIDATION, SINGLE_NODE_CONSOLIDATION, PlanOptions
from planner.plan import plan
from planner.savings_threshold import MARKER
from sim.cluster_builder import ClusterBuilder

ON_DEMAND = [
    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
]


@pytest.mark.parametrize(
    ("annotations", "per_hour", "fraction"),
    [
        ({"karpflow.dev/min-savings-per-hour": "0.05"}, 0.05, None),
        ({"karpflow.dev/min-savings-per-hour": "$0.5"}, 0.5, None),
        ({"karpflow.dev/min-savings-fraction": "10%"}, None, 0.1),
        ({"karpflow.dev/min-savings-fraction": "0.25"}, None, 0.25),
    ],
)
def test_floor_values_in_the_shapes_people_write(annotations, per_hour, fraction):
    floor, problems = read_savings_floor(annotations)
    assert problems == []
    assert floor.per_hour == per_hour
    assert floor.fraction == (pytest.approx(fraction) if fraction is not None else None)


@pytest.mark.parametrize(
    "annotations",
    [
        {"karpflow.dev/min-savings-per-hour": "cheap"},
        {"karpflow.dev/min-savings-per-hour": "-1"},
        {"karpflow.dev/min-savings-per-hour": "nan"},
        {"karpflow.dev/min-savings-fraction": "150%"},
        {"karpflow.dev/min-savings-fraction": "-0.1"},
    ],
)
def test_bad_floor_values_are_problems(annotations):
    _, problems = read_savings_floor(annotations)
    assert len(problems) == 1 and next(iter(annotations)) in problems[0]


def test_floor_annotations_are_known_and_never_fail_the_pools_budgets():
    _, problems = read_overrides({"karpflow.dev/min-savings-fraction": "oops"})
    assert problems == []  # read_savings_floor reports it; the pool's budgets stay valid


def one_replace_cluster(annotations: dict[str, str] | None = None) -> ClusterBuilder:
    """One m5.2xlarge ($0.384/h) holding a 1-vCPU pod: single-node consolidation replaces it with a
    smaller node; the guaranteed saving (worst-case option) is $0.027/h, 7 % of what it costs."""
    b = ClusterBuilder()
    pool = b.nodepool("default", budgets=[{"nodes": "100%"}], expire_after="Never", requirements=ON_DEMAND)
    pool["metadata"]["annotations"] = dict(annotations or {})
    b.nodeclass()
    b.node("big", instance_type="m5.2xlarge")
    b.pod("solo-1", "big", cpu="1", memory="1Gi")
    return b


def single_node(result):
    return [c for c in result.commands_ if c.method == SINGLE_NODE_CONSOLIDATION]


def test_without_a_floor_the_replace_happens():
    b = one_replace_cluster()
    (command,) = single_node(plan(b.snapshot(), b.catalog))
    assert command.decision == "replace" and command.savings_per_hour == pytest.approx(0.027)


def test_a_replace_under_min_savings_per_hour_is_skipped_and_explained_on_the_node():
    b = one_replace_cluster({"karpflow.dev/min-savings-per-hour": "1.00"})
    result = plan(b.snapshot(), b.catalog)
    assert result.commands_ == []
    (blocked,) = [x for x in result.blocked if x.node == "big"]
    assert blocked.reason.startswith(MARKER)
    assert "min-savings-per-hour $1.0000/h" in blocked.reason


def test_a_replace_under_min_savings_fraction_is_skipped():
    b = one_replace_cluster({"karpflow.dev/min-savings-fraction": "10%"})
    result = plan(b.snapshot(), b.catalog)
    assert result.commands_ == []
    assert "min-savings-fraction 10.0%" in next(x for x in result.blocked if x.node == "big").reason


def test_a_replace_above_both_floors_goes_ahead():
    b = one_replace_cluster(
        {"karpflow.dev/min-savings-per-hour": "0.02", "karpflow.dev/min-savings-fraction": "5%"}
    )
    assert single_node(plan(b.snapshot(), b.catalog))


def test_a_bad_floor_is_a_problem_and_stops_replaces_but_not_deletes():
    b = one_replace_cluster({"karpflow.dev/min-savings-per-hour": "lots"})
    b.node("spare", instance_type="m5.large")
    b.pod("tiny-1", "spare", cpu="100m", memory="128Mi")  # fits on `big`: a delete
    result = plan(b.snapshot(), b.catalog)
    assert any("min-savings-per-hour" in p and "replace-consolidation" in p for p in result.problems)
    assert [c.decision for c in result.commands_] == ["delete"]
    assert result.budgets_at_start["default"]["Underutilized"] > 0  # the pool's budgets did not fail closed


def test_the_floor_applies_to_optimal_moves_too():
    b = ClusterBuilder()
    pool = b.nodepool("default", budgets=[{"nodes": "100%"}], expire_after="Never", requirements=ON_DEMAND)
    pool["metadata"]["annotations"] = {
        "karpflow.dev/consolidation-strategy": "Optimal",
        "karpflow.dev/min-savings-fraction": "99%",
    }
    b.nodeclass()
    for i in range(4):
        b.node(f"n{i}", instance_type="m5.2xlarge")
        b.pod(f"w{i}-1", f"n{i}", cpu="3", memory="6Gi")
    result = plan(b.snapshot(), b.catalog, PlanOptions())
    assert not [c for c in result.commands_ if c.replacements]
    told = [d.reason for x in result.blocked for d in x.details if d.method == OPTIMAL_CONSOLIDATION]
    assert any(MARKER in t for t in told)
