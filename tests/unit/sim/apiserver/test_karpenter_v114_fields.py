"""The NodePool and EC2NodeClass fields of Karpenter v1.14 on the emulator, validated by the bundled
v1.14.1 CRDs: each field a v1.14 user writes is accepted, and each value the CRD's schema or CEL rules
refuse is refused with kube-apiserver's 422 and its words.

The cases come from Karpenter's own CEL tests, named in each docstring:
kubernetes-sigs/karpenter v1.14.1 pkg/apis/v1/nodepool_validation_cel_test.go ("CEL/Validation") and
aws/karpenter-provider-aws v1.14.1 pkg/apis/v1/ec2nodeclass_validation_cel_test.go."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sim.apiserver import cel, crds, resources
from sim.apiserver.errors import Invalid
from sim.apiserver.store import Store
from sim.cluster_builder import NODECLAIM_SPEC
from sim.scenarios import generate_demo

ZONE = "topology.kubernetes.io/zone"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
REQUIREMENTS = "spec.template.spec.requirements"
NUMERIC = (
    "Invalid value: \"array\": requirements operator 'Gt', 'Lt', 'Gte', or 'Lte' must have a single "
    "positive integer value"
)


def nodepool(name: str = "p", **spec: Any) -> dict[str, Any]:
    """A NodePool as a user writes it; `spec` adds to (or replaces) its spec's fields."""
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {"template": {"spec": copy.deepcopy(NODECLAIM_SPEC)}, **spec},
    }


def with_requirements(*requirements: dict[str, Any]) -> dict[str, Any]:
    pool = nodepool()
    pool["spec"]["template"]["spec"]["requirements"] = list(requirements)
    return pool


def errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    plural = {"NodePool": "nodepools", "EC2NodeClass": "ec2nodeclasses"}[obj["kind"]]
    return crds.schema_errors(resources.resolve(plural), obj, old)


def refusal(obj: dict[str, Any]) -> str:
    """What kube-apiserver answers a create of `obj` with: a 422, in its words."""
    plural = {"NodePool": "nodepools", "EC2NodeClass": "ec2nodeclasses"}[obj["kind"]]
    with pytest.raises(Invalid) as refused:
        Store().create(plural, obj)
    assert refused.value.code == 422
    return str(refused.value)


# --- accepted -------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["WhenEmpty", "WhenEmptyOrUnderutilized", "Balanced"])
def test_every_consolidation_policy_of_v1_14_is_accepted(policy):
    """Karpenter: Context("Disruption") DescribeTable("should succeed on a valid consolidationPolicy"),
    Entry("Balanced") among them."""
    pool = nodepool(disruption={"consolidationPolicy": policy, "consolidateAfter": "30s"})
    assert errors(pool) == []
    assert Store().create("nodepools", pool)["spec"]["disruption"]["consolidationPolicy"] == policy


@pytest.mark.parametrize("replicas", [0, 5, 1000])
def test_a_static_nodepool_with_replicas_is_accepted(replicas):
    """Karpenter: Context("Replicas") Context("Valid Replicas Values") It("should succeed when replicas
    is set to zero" / "to a positive value" / "to a large value")."""
    assert errors(nodepool(replicas=replicas)) == []


def test_a_static_nodepool_with_a_nodes_limit_and_budgets_is_accepted():
    """Karpenter: DescribeTable("should succeed for compatible fields"), Entry("limits.nodes") and
    Entry("disruption with multiple budgets")."""
    budgets = [{"nodes": "1"}, {"nodes": "0", "schedule": "0 9 * * 1-5", "duration": "8h"}]
    pool = nodepool(
        replicas=10, limits={"nodes": 12}, disruption={"consolidateAfter": "0s", "budgets": budgets}
    )
    assert errors(pool) == []


def test_gte_and_lte_requirements_are_accepted():
    """Karpenter: Context("Requirements") It("should allow supported ops") (Gte and Lte among them)."""
    pool = with_requirements(
        {"key": "karpenter.k8s.aws/instance-cpu", "operator": "Gte", "values": ["4"]},
        {"key": "karpenter.k8s.aws/instance-memory", "operator": "Lte", "values": ["65536"]},
        {"key": "karpenter.k8s.aws/instance-generation", "operator": "Gte", "values": ["0"]},
    )
    assert errors(pool) == []


def test_limits_nodes_on_a_dynamic_nodepool_is_accepted_as_an_integer_or_a_quantity():
    """limits.nodes (v1.11) beside resource limits; the CRD's limits are int-or-string quantities."""
    assert errors(nodepool(limits={"cpu": "1000", "memory": "1000Gi", "nodes": 10})) == []
    assert errors(nodepool(limits={"nodes": "10"})) == []


def test_min_values_up_to_the_number_of_values_is_accepted():
    """Karpenter: It("should allow more than 50 values if minValues is not specified."), and minValues
    within the In operator's values (the opposite of "should error when minValues is greater than the
    number of unique values specified within In operator")."""
    many = [f"instance{i}" for i in range(90)]
    assert errors(with_requirements({"key": INSTANCE_TYPE, "operator": "In", "values": many})) == []
    requirement = {"key": INSTANCE_TYPE, "operator": "In", "values": ["m5.large", "c5.large"], "minValues": 2}
    assert errors(with_requirements(requirement)) == []
    assert errors(with_requirements({"key": INSTANCE_TYPE, "operator": "Exists", "minValues": 50})) == []


def test_an_ec2nodeclass_kubelet_as_v1_14_1_validates_it_is_accepted():
    """aws/karpenter-provider-aws: Context("Kubelet") It("should succeed on evictionSoft with valid
    keys") and It("should succeed on a valid imageGCHighThresholdPercent")."""
    spec = copy.deepcopy(generate_demo.NODECLASS_SPECS["default"])
    spec["kubelet"] = {
        "maxPods": 58,
        "kubeReserved": {"cpu": "100m", "memory": "1Gi"},
        "evictionSoft": {"memory.available": "5%"},
        "evictionSoftGracePeriod": {"memory.available": "1m"},
        "imageGCHighThresholdPercent": 85,
        "imageGCLowThresholdPercent": 80,
    }
    assert errors({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "spec": spec}) == []


# --- refused --------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["balanced", "WhenUnderutilized", "", "foo"])
def test_an_unknown_consolidation_policy_is_refused(policy):
    """Karpenter: DescribeTable("should fail on an invalid consolidationPolicy"), Entry("lowercase
    balanced"), Entry("WhenUnderutilized"), Entry("empty string"), Entry("arbitrary string")."""
    message = refusal(nodepool(disruption={"consolidationPolicy": policy, "consolidateAfter": "30s"}))
    assert message == (
        f'NodePool.karpenter.sh "p" is invalid: spec.disruption.consolidationPolicy: Unsupported value: '
        f'"{policy}": supported values: "WhenEmpty", "WhenEmptyOrUnderutilized", "Balanced"'
    )


def test_negative_replicas_are_refused():
    """Karpenter: Context("Invalid Replicas Values") It("should fail when replicas is set to a negative
    value")."""
    assert refusal(nodepool(replicas=-100)).endswith(
        "spec.replicas: Invalid value: -100: spec.replicas in body should be greater than or equal to 0"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("limits", {"cpu": "1000"}), ("limits", {"memory": "10Gi"}), ("limits", {"pods": "100"}),
     ("limits", {"ephemeral-storage": "100Gi"}), ("limits", {"nodes": 12, "cpu": "1000"})],
)  # fmt: skip
def test_a_static_nodepool_refuses_limits_other_than_nodes(field, value):
    """Karpenter: DescribeTable("should fail for incompatible fields"), Entry("limits.cpu"),
    Entry("limits.memory"), Entry("limits.pods"), Entry("limits.ephemeral-storage")."""
    assert refusal(nodepool(replicas=10, **{field: value})).endswith(
        "spec: Invalid value: \"object\": only 'limits.nodes' is supported on static NodePools"
    )


def test_a_static_nodepool_refuses_a_weight():
    """Karpenter: DescribeTable("should fail for incompatible fields"), Entry("weight")."""
    assert refusal(nodepool(replicas=10, weight=25)).endswith(
        "spec: Invalid value: \"object\": 'weight' is not supported on static NodePools"
    )


def test_a_nodepool_cannot_change_between_static_and_dynamic():
    """Karpenter: Context("Update Scenarios") It("should fail when changing the NodePool from static to
    dynamic"), It("should fail when changing the NodePool from dynamic to static"), It("should succeed
    when increasing replicas in a NodePool") and It("should succeed when changing the static NodePool
    nodes limit")."""
    store = Store()
    static = store.create("nodepools", nodepool("static", replicas=3, limits={"nodes": 4}))
    dynamic = store.create("nodepools", nodepool("dynamic"))
    transition = (
        'spec: Invalid value: "object": Cannot transition NodePool between static (replicas set) and dynamic '
        "(replicas unset) provisioning modes"
    )
    unset = copy.deepcopy(static)
    del unset["spec"]["replicas"]
    with pytest.raises(Invalid, match=r"static \(replicas set\)") as refused:
        store.update("nodepools", unset)
    assert str(refused.value) == f'NodePool.karpenter.sh "static" is invalid: {transition}'
    made_static = copy.deepcopy(dynamic)
    made_static["spec"]["replicas"] = 3
    with pytest.raises(Invalid) as refused:
        store.update("nodepools", made_static)
    assert str(refused.value) == f'NodePool.karpenter.sh "dynamic" is invalid: {transition}'
    more = copy.deepcopy(static)
    more["spec"]["replicas"], more["spec"]["limits"] = 5, {"nodes": 6}
    assert store.update("nodepools", more)["spec"]["replicas"] == 5


@pytest.mark.parametrize("operator", ["Gte", "Lte"])
@pytest.mark.parametrize("values", [[], ["1", "2"], ["-1"]])
def test_a_gte_or_lte_requirement_needs_one_non_negative_integer(operator, values):
    """Karpenter: Context("Requirements") It("should fail with invalid GTE or LTE values") (the
    empty, two-value and negative entries; the non-integer one is below)."""
    refused = errors(with_requirements({"key": ZONE, "operator": operator, "values": values}))
    assert refused == [(REQUIREMENTS, "FieldValueInvalid", NUMERIC)]


def test_a_gte_requirement_on_a_non_integer_cannot_be_evaluated():
    """Karpenter: It("should fail with invalid GTE or LTE values"), the `Values: {"a"}` entry: `int("a")`
    fails, so kube-apiserver reports the rule it could not evaluate."""
    ((path, kind, message),) = errors(with_requirements({"key": ZONE, "operator": "Gte", "values": ["a"]}))
    assert (path, kind) == (REQUIREMENTS, "FieldValueInvalid")
    assert (
        message.startswith('Invalid value: "array": ') and "evaluating rule: requirements operator" in message
    )


def test_an_invalid_nodes_limit_is_refused():
    """The limits' quantity pattern (kubebuilder's resource.Quantity), on limits.nodes too."""
    message = refusal(nodepool(limits={"nodes": "ten"}))
    assert message.startswith(
        'NodePool.karpenter.sh "p" is invalid: spec.limits.nodes: Invalid value: "ten": spec.limits.nodes in '
        "body should match '^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))"
    ), message


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        (
            {"key": INSTANCE_TYPE, "operator": "In", "values": ["m5.large"], "minValues": -1},
            "spec.template.spec.requirements[0].minValues: Invalid value: -1: "
            "spec.template.spec.requirements[0].minValues in body should be greater than or equal to 1",
        ),
        (
            {"key": INSTANCE_TYPE, "operator": "In", "values": ["m5.large"], "minValues": 0},
            "spec.template.spec.requirements[0].minValues: Invalid value: 0: "
            "spec.template.spec.requirements[0].minValues in body should be greater than or equal to 1",
        ),
        (
            {"key": INSTANCE_TYPE, "operator": "Exists", "minValues": 51},
            "spec.template.spec.requirements[0].minValues: Invalid value: 51: "
            "spec.template.spec.requirements[0].minValues in body should be less than or equal to 50",
        ),
        (
            {"key": INSTANCE_TYPE, "operator": "In", "values": ["m5.large"], "minValues": 2},
            "spec.template.spec.requirements: Invalid value: \"array\": requirements with 'minValues' must "
            "have at least that many values specified in the 'values' field",
        ),
    ],
    ids=["negative", "zero", "over-50", "more-than-values"],
)
def test_min_values_out_of_bounds_are_refused(requirement, expected):
    """Karpenter: It("should error when minValues is negative"), It("should error when minValues is
    zero"), It("should error when minValues is more than 50"), It("should error when minValues is
    greater than the number of unique values specified within In operator")."""
    assert refusal(with_requirements(requirement)) == f'NodePool.karpenter.sh "p" is invalid: {expected}'


@pytest.mark.parametrize(
    ("kubelet", "field", "message"),
    [
        (
            {"kubeReserved": {"gpu": "1"}},
            "spec.kubelet.kubeReserved",
            "valid keys for kubeReserved are ['cpu','memory','ephemeral-storage','pid']",
        ),
        (
            {"systemReserved": {"memory": "-1Gi"}},
            "spec.kubelet.systemReserved",
            "systemReserved value cannot be a negative resource quantity",
        ),
        (
            {
                "evictionSoft": {"memory.available": "5%", "nodefs.available": "10%"},
                "evictionSoftGracePeriod": {"memory.available": "1m"},
            },
            "spec.kubelet",
            "evictionSoft OwnerKey does not have a matching evictionSoftGracePeriod",
        ),
        (
            # The rule reads the unset evictionSoftGracePeriod: cel-go cannot evaluate it, and
            # kube-apiserver says so in cel-go's words.
            {"evictionSoft": {"memory.available": "200Mi"}},
            "spec.kubelet",
            "no such key: evictionSoftGracePeriod evaluating rule: evictionSoft OwnerKey does not have a "
            "matching evictionSoftGracePeriod",
        ),
        (
            {"evictionSoftGracePeriod": {"memory.available": "1m"}},
            "spec.kubelet",
            "no such key: evictionSoft evaluating rule: evictionSoftGracePeriod OwnerKey does not have a "
            "matching evictionSoft",
        ),
        (
            {"imageGCHighThresholdPercent": 50, "imageGCLowThresholdPercent": 60},
            "spec.kubelet",
            "imageGCHighThresholdPercent must be greater than imageGCLowThresholdPercent",
        ),
    ],
    ids=[
        "reserved-key",
        "negative-reserved",
        "soft-unmatched",
        "soft-without-grace",
        "grace-without-soft",
        "image-gc",
    ],
)
def test_an_ec2nodeclass_kubelet_the_release_refuses_is_refused(kubelet, field, message):
    """aws/karpenter-provider-aws Context("Kubelet"): It("should fail on kubeReserved with invalid
    keys"), It("should fail on systemReserved with invalid keys") (a negative quantity here), It("should
    fail when eviction soft doesn't have matching grace period"), It("should fail when eviction soft
    grace period doesn't have matching threshold"), It("should fail when imageGCHighThresholdPercent is
    less than imageGCLowThresholdPercent"). The provider's main after v1.14.1 passes kubelet through
    unvalidated; the release validates it."""
    spec = {**copy.deepcopy(generate_demo.NODECLASS_SPECS["default"]), "kubelet": kubelet}
    obj = {
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": "k"},
        "spec": spec,
    }
    assert (
        refusal(obj)
        == f'EC2NodeClass.karpenter.k8s.aws "k" is invalid: {field}: Invalid value: "object": {message}'
    )


def test_the_bundled_crds_are_the_v1_14_1_release_and_say_so():
    """The files carry their source (tag and commit) and are the release's: the provider's main had
    added the `karpenter.k8s.aws/nitro-sandbox` label, v1.14.1 does not know it."""
    for path in sorted(crds._BUNDLED.glob("*.yaml")):
        header = path.read_text().split("\n---\n", 1)[0]
        assert "tag v1.14.1" in header and "bde00654cd316fddb3dccfba3f5ac07039865429" in header, path.name
    refused = errors(with_requirements({"key": "karpenter.k8s.aws/nitro-sandbox", "operator": "Exists"}))
    assert refused == [
        (
            "spec.template.spec.requirements[0].key",
            "FieldValueInvalid",
            'Invalid value: "string": label domain "karpenter.k8s.aws" is restricted',
        )
    ]


def _rules(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [str(r["rule"]) for r in node.get("x-kubernetes-validations") or []]
        return own + [rule for value in node.values() for rule in _rules(value)]
    if isinstance(node, list):
        return [rule for value in node for rule in _rules(value)]
    return []


def test_every_rule_of_the_bundled_crds_compiles_with_the_functions_the_emulator_has():
    """A rule calling a Kubernetes CEL library function cel.py lacks would fail to compile here (and
    be skipped by nothing: every object of the kind would be refused)."""
    rules = [rule for crd in crds.bundled_crds().values() for rule in _rules(crd)]
    assert len(rules) >= 80
    for rule in rules:
        assert cel._program(rule)
