"""Running beside Karpenter: its NodePool fields zeroed, karpflow's own settings in karpflow.dev/*."""

from datetime import timedelta

import pytest

from api.karpflow_overrides import BUDGETS, read_overrides
from planner.drift import Drift
from planner.emptiness import Emptiness
from planner.model import PlanOptions
from planner.plan import plan
from sim.cluster_builder import ClusterBuilder

# What stops Karpenter from disrupting anything: the only switches it has.
KARPENTER_OFF = {"budgets": [{"nodes": "0"}], "expire_after": "Never", "consolidate_after": "Never"}
KARPFLOW_ON = {
    "karpflow.dev/consolidation-policy": "WhenEmptyOrUnderutilized",
    "karpflow.dev/consolidate-after": "0s",
    "karpflow.dev/budgets": '[{"nodes": "100%"}]',
    "karpflow.dev/expire-after": "24h",
    "karpflow.dev/termination-grace-period": "1h",
}


def cluster(annotations: dict[str, str]) -> ClusterBuilder:
    b = ClusterBuilder()
    pool = b.nodepool("default", **KARPENTER_OFF)
    pool["metadata"]["annotations"] = annotations
    b.node("empty", age=timedelta(hours=2))
    b.node("old", age=timedelta(hours=30))
    b.pod("web-1", "old")
    return b


def run(b: ClusterBuilder):
    return plan(
        b.snapshot(), b.catalog, PlanOptions(all_methods=True), methods=[Emptiness(), Drift()], simulate=None
    )


def test_with_karpenters_fields_zeroed_nothing_is_disrupted():
    result = run(cluster({}))
    assert result.commands == []


def test_karpflows_annotations_take_precedence_for_karpflow():
    result = run(cluster(KARPFLOW_ON))
    by_reason = {c.reason: c.nodes for c in result.commands}
    assert by_reason == {"Expired": ["old"], "Empty": ["empty"]}
    # The template is untouched, so the hashes stamped at launch still match: nothing is drifted.
    assert all(c.reason != "Drifted" for c in result.commands)


def test_the_termination_grace_period_comes_from_the_annotation():
    b = cluster(KARPFLOW_ON)
    result = run(b)
    (expired,) = [c for c in result.commands_ if c.reason == "Expired"]
    assert expired.candidates[0].termination_grace_period == timedelta(hours=1)


def test_an_invalid_annotation_fails_the_pool_closed_and_says_why():
    b = cluster({**KARPFLOW_ON, BUDGETS: '[{"nodes": "ten"}]'})
    snapshot = b.snapshot()
    assert any(
        "karpflow.dev/budgets" in p and "expected a non-negative integer or a percentage" in p
        for p in snapshot.problems
    )
    result = plan(snapshot, b.catalog, PlanOptions(all_methods=True), methods=[Emptiness()], simulate=None)
    assert [c.reason for c in result.commands] == ["Expired"]  # forceful: budgets do not apply


@pytest.mark.parametrize(
    ("annotations", "problem"),
    [
        (
            {"karpflow.dev/consolidation-policy": "Sometimes"},
            "expected one of WhenEmpty, WhenEmptyOrUnderutilized",
        ),
        ({"karpflow.dev/expire-after": "a while"}, "karpflow.dev/expire-after='a while'"),
        ({"karpflow.dev/termination-grace-period": "Never"}, "karpflow.dev/termination-grace-period"),
        ({"karpflow.dev/budgets": "{"}, "not JSON"),
        ({"karpflow.dev/budgets": '{"nodes": "1"}'}, "expected a JSON list of budgets"),
        ({"karpflow.dev/consolidate-afer": "1m"}, "annotation karpflow.dev/consolidate-afer: unknown"),
    ],
)
def test_each_bad_annotation_is_named(annotations: dict[str, str], problem: str):
    overrides, problems = read_overrides(annotations)
    assert overrides.disruption == {}
    # An invalid duration reads as the value that drives nothing, never as "absent" (which would
    # fall back to Karpenter's value): Never expires, no drain deadline.
    assert overrides.expire_after == ("Never" if "karpflow.dev/expire-after" in annotations else None)
    assert overrides.termination_grace_period == (
        "Never" if "karpflow.dev/termination-grace-period" in annotations else None
    )
    assert len(problems) == 1 and problem in problems[0]


@pytest.mark.parametrize("value", ["-5m", "soon"])
def test_an_invalid_consolidate_after_annotation_reads_as_never(value: str):
    overrides, problems = read_overrides({"karpflow.dev/consolidate-after": value})
    assert overrides.disruption == {"consolidateAfter": "Never"}
    assert len(problems) == 1 and "read as Never" in problems[0]


def test_other_annotations_are_ignored():
    overrides, problems = read_overrides(
        {"karpenter.sh/nodepool-hash": "123", "karpflow.dev/expire-after": "Never"}
    )
    assert problems == [] and overrides.expire_after == "Never"


@pytest.mark.parametrize(("value", "timeout"), [("4h", timedelta(hours=4)), ("1h30m", timedelta(minutes=90))])
def test_the_approval_timeout_is_a_duration(value: str, timeout: timedelta):
    overrides, problems = read_overrides({"karpflow.dev/approval-timeout": value})
    assert problems == [] and overrides.approval_timeout == timeout


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0s", "must be longer than 0s"),
        ("Never", "is not allowed here"),
        ("-1h", "must not be negative"),
        ("a day", "karpflow.dev/approval-timeout='a day'"),
    ],
)
def test_a_bad_approval_timeout_is_named_and_reads_as_the_default(value: str, problem: str):
    overrides, problems = read_overrides({"karpflow.dev/approval-timeout": value})
    assert overrides.approval_timeout is None  # the default (24h) where a command still waits
    assert len(problems) == 1 and problem in problems[0] and "read as the default, 24h" in problems[0]


def test_the_policy_annotation_takes_balanced():
    # Karpenter v1.14's third policy is accepted beside Karpenter too (planner/balanced.py scores it).
    b = cluster({**KARPFLOW_ON, "karpflow.dev/consolidation-policy": "Balanced"})
    assert b.snapshot().nodepools["default"].spec.disruption.consolidation_policy == "Balanced"
    result = run(b)
    assert result.problems == []
    assert {c.reason: c.nodes for c in result.commands}["Empty"] == ["empty"]  # empty: every policy
