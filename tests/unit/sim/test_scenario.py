"""Scenario files: parsing, errors that name the object, time shifting, and the shipped scenarios."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from api import constants as k
from planner.snapshot import load_snapshot
from sim.scenario import ScenarioError, load_scenario, parse_scenario, scenario_from_documents, shift_times
from sim.scenarios import generate_demo

SCENARIOS = Path(generate_demo.__file__).parent


def test_a_kubectl_list_is_flattened():
    text = """
apiVersion: v1
kind: List
metadata: {resourceVersion: ""}
items:
- {apiVersion: v1, kind: Node, metadata: {name: n1}}
- apiVersion: v1
  kind: PodList
  items:
  - {apiVersion: v1, kind: Pod, metadata: {name: p1, namespace: shop}}
"""
    scenario = parse_scenario(text, "cluster.yaml")
    assert [(o["kind"], o["metadata"]["name"]) for o in scenario.objects] == [("Node", "n1"), ("Pod", "p1")]
    assert scenario.captured_at is None


def test_multi_document_yaml_and_json_both_load():
    node = "apiVersion: v1\nkind: Node\nmetadata: {{name: {}}}\n"
    docs = node.format("a") + "---\n" + node.format("b")
    assert len(parse_scenario(docs).objects) == 2
    as_json = json.dumps({"apiVersion": "v1", "kind": "List", "items": [yaml.safe_load(node.format("a"))]})
    assert parse_scenario(as_json).objects[0]["metadata"]["name"] == "a"


def test_unquoted_timestamps_stay_text():
    text = "apiVersion: v1\nkind: Node\nmetadata: {name: a, creationTimestamp: 2026-01-15T12:00:00Z}\n"
    assert parse_scenario(text).objects[0]["metadata"]["creationTimestamp"] == "2026-01-15T12:00:00Z"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: Node\nmetadata: {name: a}\n", "document 0: object without apiVersion/kind"),
        ("apiVersion: v1\nkind: Node\nmetadata: {}\n", "Node without metadata.name"),
        ("- 3\n", "expected a Kubernetes object or List, got int"),
        ("a: [\n", "not valid YAML or JSON"),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: x}\n---\n"
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: x}\n",
            "Pod x/p appears twice",
        ),
    ],
)
def test_errors_name_the_file_and_object(text, message):
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, "bad.yaml")
    assert "bad.yaml" in str(err.value)
    assert message in str(err.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario(tmp_path / "nope.yaml")


def test_shift_times_moves_every_timestamp_and_the_deadline():
    obj = {
        "metadata": {
            "creationTimestamp": "2026-01-15T12:00:00Z",
            "annotations": {
                k.TERMINATION_TIMESTAMP_ANNOTATION: "2026-01-15T13:00:00Z",
                "other": "2026-01-15T12:00:00Z",
            },
        },
        "status": {"conditions": [{"lastTransitionTime": "2026-01-15T11:00:00Z"}], "startTime": "bogus"},
    }
    shift_times(obj, timedelta(days=1))
    assert obj["metadata"]["creationTimestamp"] == "2026-01-16T12:00:00Z"
    assert obj["metadata"]["annotations"][k.TERMINATION_TIMESTAMP_ANNOTATION] == "2026-01-16T13:00:00Z"
    assert obj["metadata"]["annotations"]["other"] == "2026-01-15T12:00:00Z"  # not a time field
    assert obj["status"]["conditions"][0]["lastTransitionTime"] == "2026-01-16T11:00:00Z"
    assert obj["status"]["startTime"] == "bogus"


@pytest.mark.parametrize("name", sorted(generate_demo.SCENARIOS))
def test_shipped_scenarios_are_what_the_generator_writes(name):
    assert (SCENARIOS / name).read_text() == generate_demo.render(name), (
        f"{name} is stale: run `python -m sim.scenarios.generate_demo`"
    )


def test_demo_scenario_has_what_the_demo_needs():
    scenario = load_scenario(SCENARIOS / "demo.yaml")
    assert scenario.captured_at == datetime(2026, 1, 15, 12, tzinfo=UTC)
    nodes = scenario.of_kind("Node")
    assert 10 <= len(nodes) <= 16
    for node in nodes:
        labels = node["metadata"]["labels"]
        for label in (
            k.NODEPOOL_LABEL,
            k.INITIALIZED_LABEL,
            k.CAPACITY_TYPE_LABEL,
            k.INSTANCE_TYPE_LABEL,
            k.ZONE_LABEL,
            k.REGION_LABEL,
            k.ARCH_LABEL,
        ):
            assert label in labels, f"{node['metadata']['name']} lacks {label}"
        assert node["metadata"]["finalizers"] == [k.TERMINATION_FINALIZER]
    assert {n["metadata"]["labels"][k.CAPACITY_TYPE_LABEL] for n in nodes} == {"spot", "on-demand"}
    assert {n["metadata"]["labels"][k.ZONE_LABEL] for n in nodes} == {"us-west-2a", "us-west-2b"}
    assert {p["metadata"]["name"] for p in scenario.of_kind("NodePool")} == {"default", "batch", "arm"}
    pods = scenario.of_kind("Pod")
    assert any(k.DO_NOT_DISRUPT_ANNOTATION in (p["metadata"].get("annotations") or {}) for p in pods)
    assert len(scenario.of_kind("PodDisruptionBudget")) >= 3 and scenario.of_kind("DaemonSet")
    busy = {p["spec"]["nodeName"] for p in pods if p["metadata"]["namespace"] != "monitoring"}
    assert len(busy) < len(nodes), "the demo needs at least one node with only DaemonSet pods"


@pytest.mark.parametrize("name", sorted(generate_demo.SCENARIOS))
def test_the_planner_reads_the_shipped_scenarios(name):
    snapshot = load_snapshot(SCENARIOS / name)
    assert snapshot.problems == []
    assert len(snapshot.nodes) == len(load_scenario(SCENARIOS / name).of_kind("Node"))


def test_the_demo_drift_needs_a_replacement(tmp_path: Path):
    """The demo's second pass: once pass 1's nodes are gone, drift must *replace* the drifted node (its
    12Gi sessions pod fits on no other us-west-2b node), with a type the simulator can launch."""
    from planner.catalog import bundled_catalog
    from planner.plan import plan

    catalog = bundled_catalog("us-west-2")
    cluster = yaml.safe_load((SCENARIOS / "demo.yaml").read_text())
    first = plan(load_snapshot(SCENARIOS / "demo.yaml"), catalog)
    gone = {n for c in first.commands_ for n in c.nodes}
    assert [c.method for c in first.commands_] == ["expiration", "emptiness"]
    # Pass 1's nodes and their pods go (evicted pods only take room elsewhere: they cannot help).
    cluster["items"] = [
        o
        for o in cluster["items"]
        if not (o["kind"] == "Node" and o["metadata"]["name"] in gone)
        and not (o["kind"] == "Pod" and o["spec"].get("nodeName") in gone)
    ]
    (tmp_path / "pass2.json").write_text(json.dumps(cluster))
    (drift,) = plan(load_snapshot(tmp_path / "pass2.json"), catalog).commands_
    assert (drift.method, drift.decision) == ("drift", "replace")
    assert drift.nodes == ["ip-172-31-20-80.us-west-2.compute.internal"]
    (replacement,) = drift.replacements
    assert replacement.nodepool == "default" and replacement.zones == ["us-west-2b"]
    assert replacement.instance_types[0].name == "r5.large"


def test_documents_in_memory_make_the_same_scenario_as_their_yaml():
    """The tests' scenario builders skip the YAML round trip (scenario_from_documents): the demo's
    generated List, with a datetime in it as YAML would read one, gives the same objects either way."""
    # A copy: the generator shares its NodePool specs between calls.
    listing = copy.deepcopy(generate_demo.scenario_list(generate_demo.NODES, generate_demo.WORKLOADS))
    listing["items"][0]["metadata"]["creationTimestamp"] = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
    via_yaml = parse_scenario(yaml.safe_dump(listing), "s")
    in_memory = scenario_from_documents([listing], "s")
    assert in_memory.objects == via_yaml.objects and in_memory.captured_at == via_yaml.captured_at
    assert in_memory.objects[0]["metadata"]["creationTimestamp"] == "2026-11-20T08:00:00Z"
