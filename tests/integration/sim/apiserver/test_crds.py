"""CustomResourceDefinitions applied with the real kubectl: the kind is served (discovery, storage,
schema validation) until the CRD goes. Karpenter's own kinds are validated by Karpenter's CRDs: the
local stack refuses what a real cluster refuses, in the same words (issue 18 item 4)."""

from __future__ import annotations

import json
import shutil

import pytest

KUBECTL = shutil.which("kubectl")
pytestmark = [pytest.mark.integration, pytest.mark.skipif(KUBECTL is None, reason="needs kubectl")]

# A kind of our own; the test does not lean on any project's published CRD.
WIDGETS = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "shortNames": ["wdg"]},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "required": ["spec"],
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1},
                                    "color": {"type": "string", "enum": ["red", "blue"]},
                                },
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


def widget(name: str, **spec: object) -> dict:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def test_a_crd_applied_with_kubectl_serves_its_kind_until_it_is_deleted(kubectl):
    assert "widgets" not in kubectl("api-resources").stdout
    assert "created" in kubectl("apply", "-f", "-", stdin=WIDGETS).stdout
    kubectl("wait", "--for", "condition=established", "crd/widgets.example.com", "--timeout", "10s")
    resources = kubectl("api-resources", "--api-group", "example.com").stdout
    assert "widgets" in resources and "wdg" in resources and "Widget" in resources

    assert (
        "widget.example.com/small created"
        in kubectl("apply", "-f", "-", stdin=widget("small", size=2)).stdout
    )
    assert "unchanged" in kubectl("apply", "-f", "-", stdin=widget("small", size=2)).stdout
    shown = json.loads(kubectl("get", "wdg", "small", "-o", "json").stdout)
    assert shown["spec"] == {"size": 2} and shown["metadata"]["generation"] == 1

    # The schema refuses what it does not allow, naming the field, as kube-apiserver does.
    wrong = kubectl("apply", "-f", "-", stdin=widget("bad", size="big", color="green"), check=False)
    assert wrong.returncode != 0
    assert 'The Widget "bad" is invalid' in wrong.stderr, wrong.stderr
    assert 'spec.size: Invalid value: "big": spec.size in body must be of type integer' in wrong.stderr
    assert 'spec.color: Unsupported value: "green"' in wrong.stderr
    missing = kubectl("apply", "-f", "-", stdin=widget("empty"), check=False)
    assert "spec.size: Required value" in missing.stderr, missing.stderr
    too_small = kubectl("apply", "-f", "-", stdin=widget("zero", size=0), check=False)
    expected = "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1"
    assert expected in too_small.stderr, too_small.stderr

    kubectl("delete", "crd", "widgets.example.com")
    # kubectl's discovery cache still knows the kind; the server does not any more
    gone = kubectl("get", "widgets", check=False)
    assert gone.returncode != 0 and "could not find the requested resource" in gone.stderr, gone.stderr
    assert "widgets" not in kubectl("api-resources", "--api-group", "example.com", "--cached=false").stdout


def test_a_crd_for_a_kind_served_natively_is_accepted_and_the_kind_keeps_working(kubectl, emu):
    nodepools = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "nodepools.karpenter.sh"},
        "spec": {
            "group": "karpenter.sh",
            "scope": "Cluster",
            "names": {"kind": "NodePool", "plural": "nodepools", "singular": "nodepool"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
    kubectl("apply", "-f", "-", stdin=nodepools)
    kubectl("wait", "--for", "condition=established", "crd/nodepools.karpenter.sh", "--timeout", "10s")
    assert "nodepools" in kubectl("api-resources", "--api-group", "karpenter.sh").stdout
    assert kubectl("get", "nodepools").returncode == 0


def nodepool(name: str, **disruption: object) -> dict:
    """A NodePool as users write it; `disruption` replaces its spec.disruption."""
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                    "requirements": [
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}
                    ],
                }
            },
            "disruption": disruption or {"consolidateAfter": "30s", "budgets": [{"nodes": "10%"}]},
        },
    }


# Each NodePool Karpenter's CRD refuses, and kube-apiserver's words for it with that CRD installed.
REFUSED = {
    "percent-over-100": (
        {"consolidateAfter": "30s", "budgets": [{"nodes": "150%"}]},
        'spec.disruption.budgets[0].nodes: Invalid value: "150%": spec.disruption.budgets[0].nodes in body '
        "should match '^((100|[0-9]{1,2})%|[0-9]+)$'",
    ),
    "bad-cron": (
        {"consolidateAfter": "30s", "budgets": [{"nodes": "0", "schedule": "0 9 * *", "duration": "8h"}]},
        'spec.disruption.budgets[0].schedule: Invalid value: "0 9 * *": spec.disruption.budgets[0].schedule '
        "in body should match",
    ),
    "schedule-without-duration": (
        {"consolidateAfter": "30s", "budgets": [{"nodes": "0", "schedule": "@daily"}]},
        "spec.disruption.budgets: Invalid value: \"array\": 'schedule' must be set with 'duration'",
    ),
    "negative-consolidate-after": (
        {"consolidateAfter": "-5m"},
        'spec.disruption.consolidateAfter: Invalid value: "-5m": spec.disruption.consolidateAfter in body '
        "should match '^(([0-9]+(s|m|h))+|Never)$'",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_kubectl_apply_of_a_nodepool_karpenter_refuses_is_refused_in_its_words(kubectl, name):
    disruption, message = REFUSED[name]
    refused = kubectl("apply", "-f", "-", stdin=nodepool(name, **disruption), check=False)
    assert refused.returncode != 0
    assert f'The NodePool "{name}" is invalid' in refused.stderr, refused.stderr
    assert message in refused.stderr, refused.stderr
    assert kubectl("get", "nodepool", name, check=False).returncode != 0  # nothing was stored


def test_a_valid_nodepool_and_an_update_karpenter_refuses(kubectl):
    assert "created" in kubectl("apply", "-f", "-", stdin=nodepool("ok")).stdout
    changed = nodepool("ok", consolidateAfter="30s")
    changed["spec"]["template"]["spec"]["requirements"].append(
        {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["other"]}
    )
    refused = kubectl("apply", "-f", "-", stdin=changed, check=False)
    assert refused.returncode != 0
    assert (
        'spec.template.spec.requirements[1].key: Invalid value: "string": label "karpenter.sh/nodepool" is '
        "restricted" in refused.stderr
    ), refused.stderr


def test_kubectl_applies_v1_14_nodepools_and_gets_the_release_crds_refusals(kubectl):
    """Balanced, a static pool with limits.nodes, Gte and minValues go in; what the v1.14.1 CRD's rules
    refuse comes back from `kubectl apply` in kube-apiserver's words (the unit tests,
    tests/unit/sim/apiserver/test_karpenter_v114_fields.py, cover each rule)."""
    balanced = nodepool("balanced", consolidationPolicy="Balanced", consolidateAfter="1m")
    balanced["spec"]["template"]["spec"]["requirements"] += [
        {"key": "karpenter.k8s.aws/instance-cpu", "operator": "Gte", "values": ["4"]},
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large", "c5.large"],
         "minValues": 2},
    ]  # fmt: skip
    assert "created" in kubectl("apply", "-f", "-", stdin=balanced).stdout
    static = nodepool("static")
    static["spec"] |= {"replicas": 2, "limits": {"nodes": 3}}
    assert "created" in kubectl("apply", "-f", "-", stdin=static).stdout

    static["spec"]["limits"] = {"nodes": 3, "cpu": "100"}
    refused = kubectl("apply", "-f", "-", stdin=static, check=False)
    assert refused.returncode != 0
    assert (
        'The NodePool "static" is invalid: spec: Invalid value: "object": only \'limits.nodes\' is supported '
        "on static NodePools" in refused.stderr
    ), refused.stderr
    del static["spec"]["replicas"], static["spec"]["limits"]
    refused = kubectl("apply", "-f", "-", stdin=static, check=False)
    assert (
        "Cannot transition NodePool between static (replicas set) and dynamic (replicas unset) "
        "provisioning modes" in refused.stderr
    ), refused.stderr
    shown = json.loads(kubectl("get", "nodepool", "static", "-o", "json").stdout)
    assert shown["spec"]["replicas"] == 2 and shown["spec"]["limits"] == {"nodes": 3}


def test_an_ec2nodeclass_karpenter_refuses_is_refused_in_its_words(kubectl):
    both = {
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": "both"},
        "spec": {
            "role": "KarpenterNodeRole",
            "instanceProfile": "KarpenterNodeInstanceProfile",
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
            "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
        },
    }
    refused = kubectl("apply", "-f", "-", stdin=both, check=False)
    assert refused.returncode != 0
    assert (
        "spec: Invalid value: \"object\": must specify exactly one of ['role', 'instanceProfile']"
        in refused.stderr
    ), refused.stderr
    del both["spec"]["instanceProfile"]
    assert "created" in kubectl("apply", "-f", "-", stdin=both).stdout


def node_overlay(name: str, **spec: object) -> dict:
    """A NodeOverlay (karpenter.sh/v1alpha1) selecting m5 types; `spec` adds to its spec."""
    return {
        "apiVersion": "karpenter.sh/v1alpha1",
        "kind": "NodeOverlay",
        "metadata": {"name": name},
        "spec": {
            "requirements": [
                {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5"]}
            ],
            **spec,
        },
    }


# NodeOverlays Karpenter's CRD refuses (pkg/apis/v1alpha1/nodeoverlay_validation_test.go's cases), and
# the words of its schema and CEL rules.
REFUSED_OVERLAYS = {
    # "shout not be able to set both price and priceAdjustment"
    "both-prices": (
        {"price": "0.432", "priceAdjustment": "+10%"},
        "cannot set both 'price' and 'priceAdjustment'",
    ),
    # "should not allow an unsigned priceAdjustment percentage"
    "unsigned-adjustment": ({"priceAdjustment": "1%"}, "spec.priceAdjustment in body should match"),
    # Context("price") "No explicit plus sign allowed"
    "signed-price": ({"price": "+42"}, "spec.price in body should match"),
    # Context("Capacity") "should not allow cpu resources override"
    "cpu-capacity": ({"capacity": {"cpu": "1"}}, "invalid resource restricted"),
    # weight is 1..10000
    "weight-zero": ({"weight": 0}, "spec.weight in body should be greater than or equal to 1"),
}


@pytest.mark.parametrize("name", sorted(REFUSED_OVERLAYS))
def test_kubectl_apply_of_a_node_overlay_karpenter_refuses_is_refused(kubectl, name):
    spec, message = REFUSED_OVERLAYS[name]
    refused = kubectl("apply", "-f", "-", stdin=node_overlay(name, **spec), check=False)
    assert refused.returncode != 0
    assert f'The NodeOverlay "{name}" is invalid' in refused.stderr, refused.stderr
    assert message in refused.stderr, refused.stderr
    assert kubectl("get", "nodeoverlay", name, check=False).returncode != 0


def test_a_valid_node_overlay_is_stored_and_listed(kubectl):
    # nodeoverlay_validation_test.go "should allow custom resources" and "should allow negative
    # percentage -100%"
    overlay = node_overlay("ok", priceAdjustment="-100%", capacity={"smarter-devices/fuse": "1"}, weight=10)
    assert "created" in kubectl("apply", "-f", "-", stdin=overlay).stdout
    listed = json.loads(kubectl("get", "overlays", "-o", "json").stdout)["items"]
    assert [o["spec"]["priceAdjustment"] for o in listed] == ["-100%"]


GADGETS = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gadgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Cluster",
        "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "additionalPrinterColumns": [
                    {"name": "Parts", "type": "string", "jsonPath": ".spec.parts"},
                    {"name": "Count", "type": "integer", "jsonPath": ".spec.count"},
                    {"name": "On", "type": "boolean", "jsonPath": ".spec.on"},
                    {
                        "name": "Ready",
                        "type": "string",
                        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                    },
                    {"name": "Owner", "type": "string", "jsonPath": ".metadata.labels.example\\.com/owner"},
                    {"name": "Since", "type": "date", "jsonPath": ".spec.since"},
                    {"name": "Note", "type": "string", "priority": 1, "jsonPath": ".spec.note"},
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "description": "A gadget of the tests.",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "description": "What the gadget is made of.",
                                "properties": {
                                    "parts": {"type": "array", "items": {"type": "string"}},
                                    "count": {"type": "integer", "description": "How many there are."},
                                    "on": {"type": "boolean"},
                                    "since": {"type": "string", "format": "date-time"},
                                    "note": {"type": "string"},
                                },
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


def test_kubectl_get_shows_the_columns_any_crd_declares_and_explain_its_descriptions(kubectl, emu):
    """The table convertor of apiextensions-apiserver (pkg/registry/customresource/tableconvertor):
    NAME, then the CRD's columns in its order, priority 1 only with -o wide, the first value a
    column's jsonPath finds, lists as JSON, dates as an age; kubectl explain reads the schema's
    descriptions from /openapi/v3."""
    kubectl("apply", "-f", "-", stdin=GADGETS)
    kubectl("wait", "--for", "condition=established", "crd/gadgets.example.com", "--timeout", "10s")
    gadget = {
        "apiVersion": "example.com/v1",
        "kind": "Gadget",
        "metadata": {"name": "g1", "labels": {"example.com/owner": "ops"}},
        "spec": {"parts": ["a", "b"], "count": 3, "on": True, "since": "2020-01-01T00:00:00Z", "note": "x"},
    }
    kubectl("apply", "-f", "-", stdin=gadget)
    kubectl("apply", "-f", "-", stdin={**gadget, "metadata": {"name": "g2"}, "spec": {}})
    emu.store.mutate(
        "gadgets", "g1", lambda g: g.update(status={"conditions": [{"type": "Ready", "status": "True"}]})
    )
    header, first, second = kubectl("get", "gadgets").stdout.splitlines()
    assert header.split() == ["NAME", "PARTS", "COUNT", "ON", "READY", "OWNER", "SINCE"]
    cells = first.split()
    assert cells[:6] == ["g1", '["a","b"]', "3", "true", "True", "ops"]
    assert cells[6].endswith("y")  # years since 2020
    assert second.split() == ["g2"]  # nothing found: empty cells
    assert kubectl("get", "gadgets", "-o", "wide").stdout.splitlines()[0].split()[-1] == "NOTE"

    explained = kubectl("explain", "gadget.spec").stdout
    assert "What the gadget is made of." in explained
    assert "count\t<integer>" in explained and "How many there are." in explained


def test_kubectl_get_of_karpenters_kinds_shows_their_crds_columns(kubectl, emu):
    emu.store.create(
        "nodeclaims",
        {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {
                "name": "default-x1",
                "labels": {
                    "karpenter.sh/nodepool": "default",
                    "node.kubernetes.io/instance-type": "m5.large",
                },
            },
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": [],
            },
            "status": {
                "nodeName": "n1",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Ready",
                        "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
            },
        },
        keep_status=True,
    )
    header, row = kubectl("get", "nodeclaims", "-o", "wide").stdout.splitlines()
    # karpenter_crds/karpenter.sh_nodeclaims.yaml's additionalPrinterColumns, in order
    assert header.split() == [
        "NAME", "TYPE", "CAPACITY", "ZONE", "NODE", "READY", "AGE", "IMAGEID", "ID", "NODEPOOL", "NODECLASS",
        "DRIFTED",
    ]  # fmt: skip
    # no capacity type, zone, image, provider ID or Drifted condition yet: empty cells
    assert row.split()[:4] == ["default-x1", "m5.large", "n1", "True"]
    assert row.split()[-2:] == ["default", "default"]
    explained = kubectl("explain", "nodepool.spec.disruption").stdout
    assert "consolidateAfter" in explained and "<empty>" not in explained.split("FIELDS:")[0]
