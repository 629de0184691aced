"""CRD printer columns: the JSONPath kubectl and kube-apiserver share (k8s.io/client-go/util/jsonpath)
and the table convertor of apiextensions-apiserver (pkg/registry/customresource/tableconvertor)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sim.apiserver import crds, jsonpath, resources, tables
from sim.apiserver.resources import ResourceType

CLAIM = {
    "metadata": {"name": "c1", "labels": {"karpenter.sh/nodepool": "default", "a.b/c": "x"}},
    "spec": {"parts": ["a", "b"], "weights": {"z": 1, "a": 2.5}, "count": 3},
    "status": {
        "conditions": [
            {"type": "Ready", "status": "True", "n": 1},
            {"type": "Drifted", "status": "False", "n": 5},
        ]
    },
}


@pytest.mark.parametrize(
    ("path", "found"),
    [
        ('.status.conditions[?(@.type=="Ready")].status', ["True"]),
        (".status.conditions[?(@.type!='Ready')].type", ["Drifted"]),
        (".status.conditions[?(@.n > 2)].type", ["Drifted"]),
        (".status.conditions[?(@.missing)].type", []),
        (".status.conditions[?(@.n)].type", ["Ready", "Drifted"]),
        (r".metadata.labels.karpenter\.sh/nodepool", ["default"]),
        (r".metadata.labels.a\.b/c", ["x"]),
        (".metadata.labels['a.b/c']", ["x"]),
        (".spec.parts", [["a", "b"]]),
        (".spec.parts[*]", ["a", "b"]),
        (".spec.parts[-1]", ["b"]),
        (".spec.parts[0:1]", ["a"]),
        (".spec.parts[5]", []),
        (".status.conditions[*].type", ["Ready", "Drifted"]),
        ("..type", ["Ready", "Drifted"]),
        (".spec.nothing.deeper", []),
        ("{.spec.count}", [3]),
    ],
)
def test_jsonpath_finds_what_client_go_finds(path, found):
    assert jsonpath.find(CLAIM, path) == found


@pytest.mark.parametrize("path", ["spec", ".spec[", ".spec[?(x==1)]", ".spec[a]", ".spec[?(@.a ~ 1)]"])
def test_a_malformed_jsonpath_is_refused(path):
    with pytest.raises(ValueError):
        jsonpath.parse(path)


def test_results_print_as_kubectl_prints_them():
    """PrintResults: JSON for lists and maps (encoding/json: sorted keys, <>& escaped), fmt for the rest."""
    assert jsonpath.text(["a", "b"]) == '["a","b"]'
    assert jsonpath.text({"z": 1, "a": 2.5, "b": 2.0}) == '{"a":2.5,"b":2,"z":1}'
    assert jsonpath.text(["<&>"]) == '["\\u003c\\u0026\\u003e"]'
    assert [jsonpath.text(v) for v in (True, 3, 1.5, 1e6, 0.00001, "s")] == [
        "true",
        "3",
        "1.5",
        "1e+06",
        "1e-05",
        "s",
    ]


def custom(columns: tuple[dict[str, Any], ...]) -> ResourceType:
    return ResourceType(
        "example.com",
        "v1",
        "Thing",
        "things",
        "thing",
        False,
        custom=True,
        schema={},
        printer_columns=columns,
    )


def test_a_table_has_name_then_the_crds_columns_typed_as_declared():
    rt = custom(
        (
            {"name": "Parts", "type": "string", "jsonPath": ".spec.parts"},
            {"name": "Count", "type": "integer", "jsonPath": ".spec.count"},
            {"name": "Weight", "type": "number", "jsonPath": ".spec.weights.a", "priority": 1},
            {"name": "Ready", "type": "boolean", "jsonPath": ".status.conditions[0].status"},
            {"name": "Missing", "type": "string", "jsonPath": ".spec.none", "description": "mine"},
            {"name": "Created", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        )
    )
    obj = {**CLAIM, "metadata": {**CLAIM["metadata"]}}
    obj["metadata"]["creationTimestamp"] = (datetime.now(UTC) - timedelta(minutes=5)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    table = tables.table(rt, [obj])
    definitions = table["columnDefinitions"]
    assert [(d["name"], d["type"], d["priority"]) for d in definitions] == [
        ("Name", "string", 0),
        ("Parts", "string", 0),
        ("Count", "integer", 0),
        ("Weight", "number", 1),
        ("Ready", "boolean", 0),
        ("Missing", "string", 0),
        ("Created", "date", 0),
    ]
    assert definitions[0]["format"] == "name"
    assert (
        definitions[1]["description"] == "Custom resource definition column (in JSONPath format): .spec.parts"
    )
    assert definitions[5]["description"] == "mine"
    # a boolean column over a string value is no boolean: nothing; a missing value is null
    assert table["rows"][0]["cells"] == ["c1", '["a","b"]', 3, 2.5, None, None, "5m"]


def test_a_crd_without_columns_shows_its_age_and_an_unparsable_column_ends_the_list():
    assert [c.name for c in tables.columns_for(custom(()))] == ["Name", "Age"]
    broken = custom(
        (
            {"name": "A", "type": "string", "jsonPath": ".spec.count"},
            {"name": "B", "type": "string", "jsonPath": ".spec["},
            {"name": "C", "type": "string", "jsonPath": ".spec.count"},
        )
    )
    assert [c.name for c in tables.columns_for(broken)] == ["Name", "A"]


def test_karpenters_kinds_take_their_columns_from_the_bundled_crds():
    nodepools = resources.resolve("nodepools")
    bundled = crds.bundled_crds()[("karpenter.sh", "nodepools")]["spec"]["versions"][0]
    assert [c.name for c in tables.columns_for(nodepools)][1:] == [
        c["name"] for c in bundled["additionalPrinterColumns"]
    ]
    assert [c.name for c in tables.columns_for(resources.resolve("pods"))][:3] == ["Name", "Ready", "Status"]
