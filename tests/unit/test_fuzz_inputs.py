"""Bad input where it arrives (SECURITY.md): arbitrary input to the snapshot loader, the workflow
input models, the interruption queue's parser and the user-data builder is either accepted or refused
with the parser's own error, never another exception (which a worker would retry forever or crash on).

Example counts come from the hypothesis profile (tests/conftest.py): `ci` by default, `nightly` for a
longer search (`HYPOTHESIS_PROFILE=nightly .venv/bin/pytest tests/unit/test_fuzz_inputs.py`).
"""

from __future__ import annotations

import email
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from temporalio.contrib.pydantic import pydantic_data_converter

from api.controller_io import ControllerInput
from api.interruption_events import UnparseableMessage, parse_message
from api.maintenance_window import MaintenanceWindow
from api.node_disruption_budget import NodeDisruptionBudget
from api.nodepool import EC2NodeClass
from api.nodepool_reader import read_nodepool
from api.workflow_io import DisruptionInput, InvalidInput, TerminationInput, parse_input
from launch.userdata import ClusterInfo, NodeBootstrap, generate
from planner.snapshot import SnapshotError, load_snapshot

# tmp_path is reused across a test's examples: each example writes its own file first.
FUNCTION_FIXTURE = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

# JSON values, biased toward the shapes the parsers expect (objects of strings, lists and numbers).
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)


def objects_with(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects whose keys are mostly the model's own, with any values (and now and then a stray key)."""
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), json_values, max_size=len(keys) + 1)


# -- Workflow inputs (the `temporal` CLI sends any JSON) -----------------------------------------------

TERMINATION_KEYS = list(TerminationInput.model_fields)
DISRUPTION_KEYS = list(DisruptionInput.model_fields)
CONTROLLER_KEYS = list(ControllerInput.model_fields)


async def round_trips(value: BaseModel) -> None:
    """What validated must survive Temporal's converter: the workflow reads back what was started."""
    (payload,) = await pydantic_data_converter.encode([value])
    (back,) = await pydantic_data_converter.decode([payload], [type(value)])
    assert back == value


@pytest.mark.parametrize(
    ("model", "keys"),
    [
        (TerminationInput, TERMINATION_KEYS),
        (DisruptionInput, DISRUPTION_KEYS),
        (ControllerInput, CONTROLLER_KEYS),
    ],
    ids=["termination", "disruption", "controller"],
)
@given(data=st.data())
async def test_a_workflow_input_is_valid_or_refused_with_invalid_input(model, keys, data):
    raw = data.draw(objects_with(keys) | json_values)
    try:
        value = parse_input(model, raw)
    except InvalidInput as err:
        assert str(err).startswith(f"invalid {model.__name__}: ")
        return
    await round_trips(value)


@given(
    node=st.text(min_size=1, max_size=40),
    grace=st.one_of(st.text(max_size=8), st.integers(-(2**31), 2**31), st.floats(allow_nan=False)),
)
@example(node="n", grace="-1s")
@example(node="n", grace=1e300)
async def test_a_termination_grace_period_is_a_duration_or_refused(node, grace):
    try:
        value = parse_input(TerminationInput, {"node": node, "termination_grace_period": grace})
    except InvalidInput as err:
        assert "termination_grace_period" in str(err)
        return
    assert value.termination_grace_period is not None and value.termination_grace_period.total_seconds() >= 0
    await round_trips(value)


# -- The cluster's objects, in the shape users write them ---------------------------------------------


def kube_object(kind: str, spec_keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "apiVersion": st.just("v1"),
            "kind": st.just(kind),
            "metadata": objects_with(["name", "annotations"]),
        },
        optional={"spec": objects_with(spec_keys) | json_values},
    )


@given(raw=kube_object("NodePool", ["template", "disruption", "limits", "weight"]))
def test_a_nodepool_is_read_or_refused_with_a_validation_error(raw):
    try:
        pool, problems = read_nodepool(raw)
    except ValidationError:
        return
    assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
    assert pool.metadata.name == raw["metadata"].get("name", pool.metadata.name)


@pytest.mark.parametrize(
    ("model", "spec_keys"),
    [
        (
            EC2NodeClass,
            ["amiFamily", "role", "userData", "subnetSelectorTerms", "kubelet", "blockDeviceMappings"],
        ),
        (MaintenanceWindow, ["schedule", "duration", "nodeSelector", "actions", "timeZone"]),
        (NodeDisruptionBudget, ["nodeSelector", "maxUnavailable", "minAvailable", "reasons"]),
    ],
    ids=["ec2nodeclass", "maintenancewindow", "nodedisruptionbudget"],
)
@given(data=st.data())
def test_an_object_is_read_or_refused_with_a_validation_error(model, spec_keys, data):
    raw = data.draw(kube_object(model.__name__, spec_keys))
    try:
        value = model.model_validate(raw)
    except ValidationError:
        return
    # What was accepted reads back the same from its own wire form.
    assert model.model_validate(value.to_wire()) == value


# -- The interruption queue (any body SQS delivers) ----------------------------------------------------

EVENT_KINDS = [
    ("aws.ec2", "EC2 Spot Instance Interruption Warning"),
    ("aws.ec2", "EC2 Instance Rebalance Recommendation"),
    ("aws.ec2", "EC2 Instance State-change Notification"),
    ("aws.health", "AWS Health Event"),
]
envelopes = st.builds(
    lambda kind, version, event_id, time, detail: {
        "version": version,
        "id": event_id,
        "detail-type": kind[1],
        "source": kind[0],
        "time": time,
        "detail": detail,
    },
    st.sampled_from(EVENT_KINDS),
    st.sampled_from(["0", "1"]) | st.text(max_size=3),
    st.text(max_size=10),
    st.sampled_from(["2026-11-26T15:00:00Z"]) | st.text(max_size=25),
    objects_with(
        ["instance-id", "instance-action", "state", "service", "eventTypeCategory", "affectedEntities"]
    )
    | json_values,
)


@given(body=st.text(max_size=200) | envelopes.map(json.dumps) | json_values.map(json.dumps))
@example(body="[]")
@example(body='{"version": "0", "id": "x", "detail-type": "EC2 Instance Rebalance Recommendation"}')
def test_any_queue_body_is_an_interruption_or_unparseable(body):
    try:
        interruption = parse_message(body)
    except UnparseableMessage as err:
        assert str(err)
        return
    assert interruption.kind == "Unknown" or interruption.instance_ids
    assert all(isinstance(i, str) for i in interruption.instance_ids)


# -- Snapshot files (`karpflow plan`, the simulator's scenarios) ---------------------------------------

SNAPSHOT_KINDS = ["Node", "Pod", "NodePool", "EC2NodeClass", "PodDisruptionBudget", "DaemonSet", "NodeClaim"]
snapshot_objects = st.builds(
    lambda kind, metadata, spec, status: {"kind": kind, "metadata": metadata, "spec": spec, "status": status},
    st.sampled_from(SNAPSHOT_KINDS) | st.text(max_size=8),
    objects_with(["name", "namespace", "uid", "labels", "annotations", "ownerReferences"]) | json_values,
    objects_with(["nodeName", "providerID", "taints", "containers", "template", "disruption"]) | json_values,
    objects_with(["capacity", "allocatable", "conditions", "phase"]) | json_values,
)
snapshot_documents = st.one_of(
    st.builds(
        lambda items: {"kind": "List", "items": items}, st.lists(snapshot_objects | json_values, max_size=4)
    ),
    snapshot_objects,
    json_values,
)


def load(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "snapshot"
    path.write_bytes(data)
    try:
        load_snapshot(path)
    except SnapshotError as err:
        assert str(path) in str(err)


@FUNCTION_FIXTURE
@given(data=st.binary(max_size=300))
@example(data=b"{")
@example(data=b"- [")
@example(data=b'{"kind": "List", "items": 3}')
def test_any_bytes_load_as_a_snapshot_or_a_snapshot_error(tmp_path, data):
    load(tmp_path, data)


@FUNCTION_FIXTURE
@given(document=snapshot_documents, as_yaml=st.booleans())
def test_any_objects_load_as_a_snapshot_or_a_snapshot_error(tmp_path, document, as_yaml):
    text = yaml.safe_dump(document) if as_yaml else json.dumps(document)
    load(tmp_path, text.encode())


# -- User data (the EC2NodeClass's userData merged with karpflow's bootstrap) --------------------------

CLUSTER = ClusterInfo(
    name="prod", endpoint="https://k8s.example", ca_bundle="Q0E=", service_cidr="10.100.0.0/16"
)
label_keys = st.from_regex(r"\A[a-z0-9]([a-z0-9.-]{0,15}/)?[a-z0-9]([a-z0-9_.-]{0,14}[a-z0-9])?\Z")
label_values = st.from_regex(r"\A([a-z0-9]([a-z0-9_.-]{0,14}[a-z0-9])?)?\Z")
bootstraps = st.builds(
    NodeBootstrap,
    nodepool=st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,14}[a-z0-9])?\Z"),
    labels=st.dictionaries(label_keys, label_values, max_size=3),
    taints=st.lists(
        st.builds(
            lambda k, v, e: f"{k}={v}:{e}",
            label_keys,
            label_values,
            st.sampled_from(["NoSchedule", "NoExecute"]),
        ),
        max_size=2,
    ),
    max_pods=st.none() | st.integers(1, 737),
)
user_data = st.one_of(
    st.none(),
    st.text(max_size=120),
    st.sampled_from(
        ["#!/bin/bash\necho hi\n", "[settings.kubernetes]\nmax-pods = 3\n", "MIME-Version: 1.0\n"]
    ),
    st.dictionaries(st.text(max_size=6), json_values, max_size=3).map(
        lambda d: "\n".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in d.items())
    ),
)


@given(family=st.sampled_from(["AL2023", "Bottlerocket", "AL2", "Custom"]), node=bootstraps, text=user_data)
@example(family="Bottlerocket", node=NodeBootstrap(nodepool="p"), text='settings = "x"')
@example(family="Bottlerocket", node=NodeBootstrap(nodepool="p"), text="[settings]\nkubernetes = 1\n")
@example(
    family="Bottlerocket", node=NodeBootstrap(nodepool="p"), text='[settings.kubernetes]\nnode-labels = "a"\n'
)
@example(family="Bottlerocket", node=NodeBootstrap(nodepool="p"), text='"é" = 1\n')
@example(family="Bottlerocket", node=NodeBootstrap(nodepool="p"), text='a = "x\\ny"\n')
def test_user_data_is_built_and_carries_the_bootstrap_or_is_refused(family, node, text):
    try:
        built = generate(family, CLUSTER, node, text)
    except ValueError:  # the activity answers it as a permanent INVALID (activities/ec2.py)
        return
    if family == "Custom":
        assert built == (text or "")
    elif family == "Bottlerocket":
        kube = tomllib.loads(built)["settings"]["kubernetes"]
        assert kube["cluster-name"] == CLUSTER.name
        assert kube["node-labels"] == {**kube["node-labels"], **node.kubelet_labels()}
    else:
        parts = [p for p in email.message_from_string(built).walk() if not p.is_multipart()]
        ours = parts[-1].get_payload(decode=True).decode()
        assert CLUSTER.name in ours and f"karpenter.sh/nodepool={node.nodepool}" in ours
