"""Karpenter's inclusive `Gte`/`Lte` requirement operators (v1.9), written from Karpenter's tests in
kubernetes-sigs/karpenter (pkg/scheduling/requirement_test.go, pkg/apis/v1/nodepool_validation_cel_test.go,
pkg/controllers/provisioning/scheduling/suite_test.go); each test names the one it comes from."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.nodepool import NodePool, NodeSelectorRequirement
from kube.selectors import Requirement
from planner.scheduling.requirements import Req
from tests.unit.planner.sched_fixtures import node, nodepool, pod, simulation, snapshot

GTE2 = Req.of("key", "Gte", ["2"])
LTE8 = Req.of("key", "Lte", ["8"])


def test_gte_is_an_inclusive_lower_bound():
    # requirement_test.go Context("Gte and Lte Operators") / "should treat Gte as inclusive lower bound"
    assert all(GTE2.has(v) for v in ("2", "3", "100"))
    assert not any(GTE2.has(v) for v in ("1", "0"))


def test_lte_is_an_inclusive_upper_bound():
    # requirement_test.go "should treat Lte as inclusive upper bound"
    assert all(LTE8.has(v) for v in ("8", "7", "0"))
    assert not any(LTE8.has(v) for v in ("9", "10"))


def test_gte_and_lte_intersect_to_a_closed_range():
    # requirement_test.go "should intersect Gte and Lte correctly"
    both = GTE2.intersect(LTE8)
    assert all(both.has(v) for v in ("2", "5", "8"))
    assert not any(both.has(v) for v in ("1", "9"))


def test_gte_and_lte_are_gt_and_lt_one_step_further_out():
    # requirement_test.go "should be equivalent to adjusted Gt/Lt"
    assert Req.of("key", "Gt", ["1"]) == GTE2
    assert Req.of("key", "Lt", ["9"]) == LTE8


@pytest.mark.parametrize(
    ("a", "b", "inside", "outside"),
    [
        (("Gt", "4"), ("Gte", "5"), "5", "4"),  # "should collapse redundant bounds in intersection"
        (("Gt", "5"), ("Gte", "5"), "6", "5"),  # "should keep Gt when Gt is more restrictive"
        (("Gt", "3"), ("Gte", "6"), "6", "5"),  # "should keep more restrictive Gte when Gte > Gt+1"
        (("Lt", "5"), ("Lte", "5"), "4", "5"),  # "should keep Lt when Lt is more restrictive"
        (("Lt", "9"), ("Lte", "5"), "5", "6"),  # "should keep more restrictive Lte when Lte < Lt-1"
    ],
)
def test_mixed_bounds_keep_the_tighter_one(a, b, inside, outside):
    # requirement_test.go Context("Gte and Lte Operators"), the intersection cases
    merged = Req.of("key", a[0], [a[1]]).intersect(Req.of("key", b[0], [b[1]]))
    assert merged.has(inside) and not merged.has(outside)


def test_gte_0_and_lte_0_boundaries():
    # requirement_test.go "should handle Gte 0 boundary" and "should handle Lte 0 boundary"
    assert Req.of("key", "Gte", ["0"]).has("0") and not Req.of("key", "Gte", ["0"]).has("-1")
    assert Req.of("key", "Lte", ["0"]).has("0") and not Req.of("key", "Lte", ["0"]).has("1")
    assert Req.of("key", "Gte", ["5"]).any_value() and Req.of("key", "Lte", ["10"]).any_value()


@pytest.mark.parametrize("operator", ["Gte", "Lte", "Gt", "Lt"])
@pytest.mark.parametrize("values", [[], ["1", "2"], ["a"], ["-1"]])
def test_bounds_need_one_non_negative_integer(operator, values):
    # nodepool_validation_cel_test.go "should fail with invalid GTE or LTE values" (and "... GT or LT values")
    with pytest.raises(ValidationError, match="non-negative integer"):
        NodeSelectorRequirement.model_validate({"key": "k", "operator": operator, "values": values})


def test_a_nodepool_with_gte_and_lte_is_read():
    # nodepool_validation_cel_test.go: the CEL rule accepts one non-negative integer for Gte/Lte.
    pool = NodePool.model_validate(nodepool(requirements=[_req("Gte", "4"), _req("Lte", "8")]))
    assert [r.operator for r in pool.spec.template.spec.requirements] == ["Gte", "Lte"]


def _req(operator: str, value: str) -> dict:
    return {"key": "karpenter.k8s.aws/instance-cpu", "operator": operator, "values": [value]}


@pytest.mark.parametrize(
    ("requirements", "expected"),
    [
        # suite_test.go "should schedule compatible requirements with Operator=Gte": 8 is included
        ([_req("Gte", "8")], {"m5.2xlarge", "m5.4xlarge"}),
        # suite_test.go "should schedule compatible requirements with Operator=Lte": 2 is included
        ([_req("Lte", "2")], {"c5.large", "m5.large", "r5.large"}),
        ([_req("Gte", "4"), _req("Lte", "4")], {"c5.xlarge", "m5.xlarge"}),
    ],
)
def test_nodepool_gte_and_lte_choose_the_instance_types_of_a_new_node(requirements, expected):
    pool = nodepool(
        requirements=[*requirements, {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]
    )
    snap = snapshot(pool, node("a"), pod("app", "a", cpu="100m", memory="128Mi"))
    result = simulation(snap).run(["a"])
    assert set(result.new_claims[0].instance_types) == expected


def test_drift_reads_gte_and_lte_inclusively():
    # The node-side check of drift (planner/drift.py) uses kube.selectors with Karpenter's operators.
    assert Requirement("k", "Gte", frozenset({"4"}), karpenter=True).matches_value("4")
    assert not Requirement("k", "Gte", frozenset({"4"}), karpenter=True).matches_value("3")
    assert Requirement("k", "Lte", frozenset({"4"}), karpenter=True).matches_value("4")
    assert not Requirement("k", "Lte", frozenset({"4"}), karpenter=True).matches_value("5")
    with pytest.raises(ValueError, match="unknown operator"):
        Requirement("k", "Gte", frozenset({"4"}))  # Kubernetes node affinity has no Gte
