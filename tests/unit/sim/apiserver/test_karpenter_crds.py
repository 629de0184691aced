"""The emulator validates Karpenter's kinds by Karpenter's published CRDs (OpenAPI and CEL rules), and
every NodePool, EC2NodeClass and NodeClaim the project's scenarios and fixtures write passes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sim.apiserver import cel, crds, resources
from sim.apiserver.errors import Invalid
from sim.apiserver.store import Store
from sim.cluster_builder import NODECLAIM_SPEC, ClusterBuilder
from sim.scenarios import generate_demo

SCENARIOS = Path(generate_demo.__file__).parent
KINDS = {"NodePool": "nodepools", "EC2NodeClass": "ec2nodeclasses", "NodeClaim": "nodeclaims"}


def errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    return crds.schema_errors(resources.resolve(KINDS[obj["kind"]]), obj, old)


def karpenter_objects(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [i for i in items if i.get("kind") in KINDS]


@pytest.mark.parametrize("scenario", sorted(p.name for p in SCENARIOS.glob("*.yaml")))
def test_the_demo_scenarios_pass_karpenters_crds(scenario):
    items = karpenter_objects(yaml.safe_load((SCENARIOS / scenario).read_text())["items"])
    assert {i["kind"] for i in items} >= {"NodePool", "EC2NodeClass"}
    assert {i["metadata"]["name"]: errors(i) for i in items if errors(i)} == {}


def test_the_cluster_builders_objects_pass_karpenters_crds():
    b = ClusterBuilder()
    b.nodepool(
        "default",
        termination_grace_period="1h",
        budgets=[{"nodes": "0", "schedule": "@daily", "duration": "8h"}],
    )
    b.nodepool("frozen", consolidate_after="Never", expire_after="Never", policy="WhenEmpty")
    b.nodeclass("default")
    claim = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": "c"},
        "spec": NODECLAIM_SPEC,
    }
    items = [*karpenter_objects(b.objects), claim]
    assert len(items) == 4
    assert {i["metadata"]["name"]: errors(i) for i in items if errors(i)} == {}


def nodepool(**disruption: Any) -> dict[str, Any]:
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": "p"},
        "spec": {
            "template": {"spec": dict(NODECLAIM_SPEC)},
            **({"disruption": disruption} if disruption else {}),
        },
    }


def test_defaults_apply_before_validation():
    """No disruption at all, or a budget without `nodes`: the CRD's defaults fill them in."""
    assert errors(nodepool()) == []
    assert errors(nodepool(consolidateAfter="1m", budgets=[{"schedule": "@daily", "duration": "1h"}])) == []
    # consolidateAfter has no default inside a disruption that is given (Karpenter v1.14)
    assert errors(nodepool(consolidationPolicy="WhenEmpty")) == [
        ("spec.disruption.consolidateAfter", "FieldValueRequired", "Required value")
    ]


def with_requirements(*requirements: dict[str, Any]) -> dict[str, Any]:
    pool = nodepool()
    pool["spec"]["template"]["spec"]["requirements"] = list(requirements)
    return pool


def test_a_macro_is_false_when_any_element_is_false_even_if_another_cannot_be_evaluated():
    """cel-go's semantics (cel-python follows them; the Rust-based library raised here)."""
    gt = {"key": "karpenter.k8s.aws/instance-generation", "operator": "Gt"}
    refused = errors(with_requirements({**gt, "values": ["x"]}, {**gt, "values": ["-1"]}))
    assert refused == [
        (
            "spec.template.spec.requirements",
            "FieldValueInvalid",
            "Invalid value: \"array\": requirements operator 'Gt', 'Lt', 'Gte', or 'Lte' must have a single "
            "positive integer value",
        )
    ]
    (alone,) = errors(with_requirements({**gt, "values": ["x"]}))
    assert "evaluating rule: requirements operator 'Gt'" in alone[2]


def test_restricted_label_domains_are_refused_per_requirement():
    refused = errors(
        with_requirements(
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
            {"key": "karpenter.sh/custom", "operator": "Exists"},
        )
    )
    assert refused == [
        (
            "spec.template.spec.requirements[1].key",
            "FieldValueInvalid",
            'Invalid value: "string": label domain "karpenter.sh" is restricted',
        )
    ]


def test_transition_rules_need_the_old_object():
    """A NodeClaim's spec is immutable (`self == oldSelf`): checked on update, not on create."""
    store = Store()
    claim = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": "c"},
        "spec": NODECLAIM_SPEC,
    }
    created = store.create("nodeclaims", claim)
    changed = {**created, "spec": {**NODECLAIM_SPEC, "expireAfter": "1h"}}
    with pytest.raises(Invalid, match=r'spec: Invalid value: "object": spec is immutable'):
        store.update("nodeclaims", changed)
    relabelled = store.patch("nodeclaims", "c", {"metadata": {"labels": {"team": "a"}}})
    assert relabelled["metadata"]["labels"] == {"team": "a"}


def test_the_store_refuses_an_invalid_nodepool_with_kube_apiservers_message():
    with pytest.raises(Invalid) as refused:
        Store().create("nodepools", nodepool(consolidateAfter="-5m"))
    assert str(refused.value).startswith(
        'NodePool.karpenter.sh "p" is invalid: spec.disruption.consolidateAfter'
    )


@pytest.mark.parametrize(
    ("rule", "value", "ok"),
    [
        ("self.find('^([^/]+)') == 'karpenter.sh'", "karpenter.sh/nodepool", True),
        ("self.find('^[0-9]+') == ''", "abc", True),
        ("self.split('@')[1] == 'latest'", "al2023@latest", True),
        ("self.all(k, k != '' && self[k] != '')", {"a": "b", "c": ""}, False),
    ],
)
def test_the_kubernetes_library_functions_karpenters_rules_call(rule, value, ok):
    schema = {
        "type": "object" if isinstance(value, dict) else "string",
        "x-kubernetes-validations": [{"rule": rule}],
    }
    if isinstance(value, dict):
        schema["additionalProperties"] = {"type": "string"}
    assert (cel.rule_errors(schema, value, path="x") == []) is ok
