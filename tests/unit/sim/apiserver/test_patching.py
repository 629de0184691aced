"""Merge patch, JSON patch and strategic merge patch with the real types' rules (pure)."""

from __future__ import annotations

import pytest

from sim.apiserver.errors import BadRequest, Invalid
from sim.apiserver.patching import json_patch, merge_patch, strategic_merge_patch
from sim.apiserver.resources import resolve

POD = resolve("pods").merge_rules
NODE = resolve("nodes").merge_rules
DEPLOYMENT = resolve("deployments").merge_rules


def test_merge_patch_rfc7386() -> None:
    doc = {"a": {"b": 1, "c": 2}, "l": [1, 2], "x": 1}
    out = merge_patch(doc, {"a": {"b": None, "d": 3}, "l": [3], "x": None})
    assert out == {"a": {"c": 2, "d": 3}, "l": [3]}
    assert doc == {"a": {"b": 1, "c": 2}, "l": [1, 2], "x": 1}  # input untouched


def test_json_patch() -> None:
    doc = {"metadata": {"labels": {"a": "1"}}}
    assert json_patch(doc, [{"op": "replace", "path": "/metadata/labels/a", "value": "2"}]) == {
        "metadata": {"labels": {"a": "2"}}
    }
    with pytest.raises(Invalid):
        json_patch(doc, [{"op": "test", "path": "/metadata/labels/a", "value": "9"}])
    with pytest.raises(Invalid):
        json_patch(doc, [{"op": "remove", "path": "/metadata/missing"}])
    with pytest.raises(BadRequest):
        json_patch(doc, {"op": "add"})


def test_node_taints_are_replaced_whole_and_conditions_merge_by_type() -> None:
    node = {
        "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}], "podCIDRs": ["10.0.0.0/24"]},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}],
            "addresses": [{"type": "InternalIP", "address": "1"}],
        },
    }
    out = strategic_merge_patch(
        node,
        {
            "spec": {"taints": [{"key": "b", "effect": "NoExecute"}], "podCIDRs": ["10.0.1.0/24"]},
            "status": {
                "conditions": [{"type": "Ready", "status": "False"}],
                "addresses": [{"type": "Hostname", "address": "h"}],
            },
        },
        NODE,
    )
    assert out["spec"]["taints"] == [{"key": "b", "effect": "NoExecute"}]
    assert out["spec"]["podCIDRs"] == ["10.0.0.0/24", "10.0.1.0/24"]
    assert out["status"]["conditions"] == [
        {"type": "Ready", "status": "False"},
        {"type": "DiskPressure", "status": "False"},
    ]
    assert [a["type"] for a in out["status"]["addresses"]] == ["InternalIP", "Hostname"]


def test_pod_lists_by_their_merge_keys() -> None:
    pod = {
        "metadata": {"finalizers": ["a"], "ownerReferences": [{"uid": "1", "name": "x"}]},
        "spec": {
            "containers": [
                {"name": "app", "image": "v1", "env": [{"name": "A", "value": "1"}]},
                {"name": "side", "image": "s"},
            ],
            "tolerations": [{"key": "t1", "operator": "Exists"}],
            "volumes": [{"name": "v", "emptyDir": {}}],
        },
    }
    out = strategic_merge_patch(
        pod,
        {
            "metadata": {"finalizers": ["b", "a"], "ownerReferences": [{"uid": "2", "name": "y"}]},
            "spec": {
                "containers": [{"name": "app", "env": [{"name": "B", "value": "2"}]}],
                "tolerations": [{"key": "t2", "operator": "Exists"}],
                "volumes": [{"name": "w", "configMap": {"name": "c"}}],
            },
        },
        POD,
    )
    assert out["metadata"]["finalizers"] == ["a", "b"]
    assert [o["uid"] for o in out["metadata"]["ownerReferences"]] == ["1", "2"]
    app = out["spec"]["containers"][0]
    assert app["image"] == "v1" and [e["name"] for e in app["env"]] == ["A", "B"]
    assert [c["name"] for c in out["spec"]["containers"]] == ["app", "side"]
    assert out["spec"]["tolerations"] == [{"key": "t2", "operator": "Exists"}]  # no strategy: replaced
    assert [v["name"] for v in out["spec"]["volumes"]] == ["v", "w"]


def test_directives() -> None:
    pod = {
        "metadata": {"finalizers": ["a", "b"]},
        "spec": {"containers": [{"name": "app", "image": "1"}, {"name": "side", "image": "2"}]},
    }
    out = strategic_merge_patch(
        pod,
        {
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]},
            "spec": {"containers": [{"name": "side", "$patch": "delete"}]},
        },
        POD,
    )
    assert out["metadata"]["finalizers"] == ["b"] and [c["name"] for c in out["spec"]["containers"]] == [
        "app"
    ]
    replaced = strategic_merge_patch(
        pod, {"spec": {"containers": [{"$patch": "replace"}, {"name": "x", "image": "y"}]}}, POD
    )
    assert replaced["spec"]["containers"] == [{"name": "x", "image": "y"}]
    whole = strategic_merge_patch(pod, {"spec": {"$patch": "replace", "nodeName": "n"}}, POD)
    assert whole["spec"] == {"nodeName": "n"}
    ordered = strategic_merge_patch(
        pod, {"spec": {"$setElementOrder/containers": [{"name": "side"}, {"name": "app"}]}}, POD
    )
    assert [c["name"] for c in ordered["spec"]["containers"]] == ["side", "app"]


def test_retain_keys_on_deployment_strategy() -> None:
    dep = {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}
    out = strategic_merge_patch(
        dep, {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}, DEPLOYMENT
    )
    assert out["spec"]["strategy"] == {"type": "Recreate"}


def test_template_containers_merge_by_name() -> None:
    dep = {
        "spec": {
            "template": {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "2"}]}}
        }
    }
    out = strategic_merge_patch(
        dep, {"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "3"}]}}}}, DEPLOYMENT
    )
    assert out["spec"]["template"]["spec"]["containers"] == [
        {"name": "a", "image": "1"},
        {"name": "b", "image": "3"},
    ]


def test_malformed_strategic_patches() -> None:
    with pytest.raises(BadRequest, match="merge key"):
        strategic_merge_patch({}, {"spec": {"containers": [{"image": "x"}]}}, POD)
    with pytest.raises(BadRequest):
        strategic_merge_patch({}, ["not", "a", "map"], POD)
    with pytest.raises(BadRequest):
        strategic_merge_patch({}, {"$patch": "explode"}, POD)
