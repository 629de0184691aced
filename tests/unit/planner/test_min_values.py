"""NodePool minValues and the MinValuesPolicy (Strict / BestEffort) on new nodes, written from
Karpenter's tests (each test names the one it comes from)."""

from __future__ import annotations

from planner.catalog import catalog_from_dict
from planner.consolidation import SingleNodeConsolidation
from planner.scheduling.adapter import SnapshotSimulation
from planner.scheduling.min_values import (
    MIN_VALUES_RELAXED_ANNOTATION,
    min_values_shortfall,
    truncate,
)
from planner.scheduling.requirements import Req, freeze
from tests.unit.planner.sched_fixtures import CATALOG, node, nodepool, pod, snapshot
from tests.unit.planner.test_consolidation import run_method

TYPE = "node.kubernetes.io/instance-type"
FAMILY = "karpenter.k8s.aws/instance-family"


def _pool(values: list[str], min_values: int, **kwargs: object) -> dict:
    return nodepool(
        requirements=[
            {"key": TYPE, "operator": "In", "values": values, "minValues": min_values},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        ],
        **kwargs,  # type: ignore[arg-type]
    )


def _simulation(snap, policy: str) -> SnapshotSimulation:
    return SnapshotSimulation(snap, CATALOG, min_values_policy=policy)  # type: ignore[arg-type]


# Two of the three values exist, as in Karpenter's MinValuesPolicy tests (only instance-type-1 and
# instance-type-2 in the cloud provider, minValues 3).
TWO_OF_THREE = ["c5.large", "m5.large", "x9.large"]


def test_strict_does_not_open_a_node_whose_types_miss_min_values():
    """pkg/controllers/provisioning/suite_test.go, Context "MinValuesPolicy" / "with MinValuesPolicy
    set to Strict": It("should not schedule when minValues requirement is not met")."""
    snap = snapshot(_pool(TWO_OF_THREE, 3), node("a"), pod("app", "a", cpu="500m", memory="512Mi"))
    result = _simulation(snap, "Strict").run(["a"])
    assert not result.all_non_pending_scheduled
    why = result.unschedulable["default/app"]
    assert "minValues requirement is not met for label(s) ['node.kubernetes.io/instance-type']" in why
    assert "has 2 of minValues 3" in why


def test_best_effort_opens_the_node_with_min_values_lowered_and_says_so():
    """pkg/controllers/provisioning/suite_test.go, Context "MinValuesPolicy" / "with MinValuesPolicy
    set to BestEffort": It("should schedule even when minValues requirement is not met"): the
    NodeClaim's instance-type requirement carries minValues 2 and the relaxed annotation "true"."""
    snap = snapshot(_pool(TWO_OF_THREE, 3), node("a"), pod("app", "a", cpu="500m", memory="512Mi"))
    prepared = _simulation(snap, "BestEffort")
    result = prepared.run(["a"])
    assert result.all_non_pending_scheduled
    (claim,) = result.new_claims
    assert claim.instance_types == ("c5.large", "m5.large")
    assert next(r for r in claim.requirements if r.key == TYPE).min_values == 2
    assert claim.min_values_relaxed
    replacement = prepared.replacement(claim)
    assert replacement.annotations == {MIN_VALUES_RELAXED_ANNOTATION: "true"}
    assert replacement.min_values == {TYPE: 2}


def test_a_met_min_values_is_not_relaxed():
    """pkg/controllers/provisioning/scheduling/scheduler.go sets the annotation to "false" when no
    minValues was lowered (instance_selection_test.go It("should schedule respecting the minValues
    from instance-type requirements"))."""
    snap = snapshot(
        _pool(["c5.large", "m5.large", "r5.large"], 3), node("a"), pod("app", "a", cpu="500m", memory="512Mi")
    )
    prepared = _simulation(snap, "BestEffort")
    (claim,) = prepared.run(["a"]).new_claims
    assert len(claim.instance_types) == 3 and not claim.min_values_relaxed
    assert prepared.replacement(claim).annotations == {MIN_VALUES_RELAXED_ANNOTATION: "false"}


def test_best_effort_relaxes_before_falling_back_to_a_lighter_nodepool():
    """pkg/controllers/provisioning/suite_test.go, Context "MinValuesPolicy" / BestEffort:
    It("should relax minValues before falling back to other nodepools"); under Strict the pod goes to
    the lighter pool instead."""
    heavy = _pool(TWO_OF_THREE, 3, name="heavy", weight=100)
    light = nodepool(
        "light",
        weight=10,
        requirements=[{"key": TYPE, "operator": "In", "values": ["c5.large", "m5.large", "r5.large"]}],
    )
    snap = snapshot(heavy, light, node("a", pool="light"), pod("app", "a", cpu="500m", memory="512Mi"))
    (relaxed,) = _simulation(snap, "BestEffort").run(["a"]).new_claims
    assert relaxed.nodepool == "heavy" and relaxed.min_values_relaxed
    (strict,) = _simulation(snap, "Strict").run(["a"]).new_claims
    assert strict.nodepool == "light" and not strict.min_values_relaxed


def test_best_effort_does_not_consolidate_when_the_cheaper_types_miss_the_relaxed_min_values():
    """pkg/controllers/disruption/consolidation_test.go, Context "MinValuesPolicy": It("should not
    consolidate a node by relaxing min values when policy is set to BestEffort"): two types, the node
    on the dearer one; the simulation relaxes minValues 3 to 2, and the one cheaper type is fewer."""
    snap = snapshot(
        _pool(["c5.large", "m5.large", "x9.large"], 3),
        node("a", "m5.large"),
        pod("app", "a", cpu="500m", memory="512Mi"),
    )
    commands, ctx = run_method(SingleNodeConsolidation(), snap, min_values_policy="BestEffort")
    assert commands == []
    (why,) = [text for method, text in ctx.explanations["a"] if method == "single-node-consolidation"]
    assert "Filtering by price: minValues requirement is not met for label(s)" in why


def test_strict_refuses_the_same_move_earlier_with_its_reason():
    """The same cluster under Strict: no new node can be opened at all, and `karpflow plan`'s reason
    says which minValues (Karpenter: Unconsolidatable, "minValues requirement is not met")."""
    snap = snapshot(
        _pool(["c5.large", "m5.large", "x9.large"], 3),
        node("a", "m5.large"),
        pod("app", "a", cpu="500m", memory="512Mi"),
    )
    commands, ctx = run_method(SingleNodeConsolidation(), snap, min_values_policy="Strict")
    assert commands == []
    (why,) = [text for method, text in ctx.explanations["a"] if method == "single-node-consolidation"]
    assert "minValues requirement is not met" in why and "MinValuesPolicy Strict" in why


def _many_types(count: int, odd_one: str) -> object:
    """`count` one-family types priced in name order, plus one of another family, the dearest."""
    names = [f"m5.n{i:03d}" for i in range(count)] + [odd_one]
    return catalog_from_dict(
        {
            "region": "test-1",
            "instanceTypes": [
                {
                    "name": name,
                    "cpu": "4",
                    "memory": "16Gi",
                    "pods": 30,
                    "offerings": [
                        {"zone": "test-1a", "capacityType": "on-demand", "price": 0.1 + index / 1000}
                    ],
                }
                for index, name in enumerate(names)
            ],
        }
    )


def test_strict_refuses_a_launch_whose_60_cheapest_types_miss_min_values():
    """pkg/controllers/provisioning/scheduling/instance_selection_test.go, Context "MinValues":
    It("schedule should fail if minimum number of InstanceTypes is not met as per the minValues in the
    requirement after truncation"); the truncation is the AWS provider's 60 at launch
    (pkg/providers/instance/instance.go `filterInstanceTypes`, cloudprovider.InstanceTypes.Truncate)."""
    catalog = _many_types(60, "c5.odd")
    pool = nodepool(requirements=[{"key": FAMILY, "operator": "Exists", "minValues": 2}])
    snap = snapshot(pool, node("a", "m5.n000"), pod("app", "a", cpu="500m", memory="512Mi"))
    strict = SnapshotSimulation(snap, catalog, min_values_policy="Strict")
    (claim,) = strict.run(["a"]).new_claims  # 61 options meet minValues 2 ...
    why = strict.launch_refusal(claim)  # ... the 60 launched do not
    assert why is not None and "validating minValues of the 60 cheapest options" in why
    assert strict.scheduling_result(strict.run(["a"]), []).new_nodes == []
    best_effort = SnapshotSimulation(snap, catalog, min_values_policy="BestEffort")
    (claim,) = best_effort.run(["a"]).new_claims
    assert best_effort.launch_refusal(claim) is None
    assert len(best_effort.replacement(claim).instance_types) == 60


def test_shortfall_walks_the_options_in_order():
    """pkg/cloudprovider/types.go `SatisfiesMinValues`, the examples of its doc comment: three types
    spanning three families pass with 3 needed; two families fail on the family key."""
    reqs = freeze(
        [
            Req.of(
                TYPE, "In", ["c4.large", "c4.xlarge", "c5.large", "c5.xlarge", "m4.large", "m4.xlarge"], 3
            ),
            Req.of(FAMILY, "In", ["c4", "c5", "m4"], 3),
        ]
    )

    def values_of(name: str, key: str) -> list[str]:
        return [name] if key == TYPE else [name.split(".")[0]]

    assert min_values_shortfall(reqs, ["c4.large", "c5.xlarge", "m4.2xlarge"], values_of) == (3, {})
    assert min_values_shortfall(reqs, ["c4.large", "c4.xlarge", "c5.2xlarge"], values_of) == (3, {FAMILY: 2})
    # Truncate under Strict refuses what BestEffort keeps.
    assert truncate(["c4.large", "c4.xlarge", "c5.2xlarge"], reqs, 2, "Strict", values_of)[1] is not None
    assert truncate(["c4.large", "c4.xlarge", "c5.2xlarge"], reqs, 2, "BestEffort", values_of) == (
        ["c4.large", "c4.xlarge"],
        None,
    )


def test_karpflow_plan_says_a_replacement_was_relaxed():
    """`karpflow plan` shows each decision with its reason: the JSON's replacement says
    `minValuesRelaxed` (Karpenter's karpenter.sh/nodeclaim-min-values-relaxed) under BestEffort."""
    from planner.model import PlanOptions
    from planner.plan import plan

    snap = snapshot(
        _pool(TWO_OF_THREE, 3), node("a", "m5.2xlarge"), pod("app", "a", cpu="500m", memory="512Mi")
    )
    (command,) = [c for c in plan(snap, CATALOG, PlanOptions(min_values_policy="BestEffort")).commands]
    (replacement,) = command.replacements
    assert replacement.min_values_relaxed and replacement.instance_types == ["c5.large", "m5.large"]
    assert plan(snap, CATALOG, PlanOptions()).commands == []
