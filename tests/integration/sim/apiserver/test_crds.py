"""CustomResourceDefinitions applied with the real kubectl: the kind is served (discovery, storage,
schema validation) until the CRD goes."""

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
    assert "spec.size" in too_small.stderr and "minimum" in too_small.stderr, too_small.stderr

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
