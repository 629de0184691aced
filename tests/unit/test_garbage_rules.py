"""activities/garbage_rules.py: which of karpflow's launches are garbage, without I/O."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities.garbage_rules import NodeFacts, command_state, launch_of, suspect

CLUSTER = "prod"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
GRACE, TTL = timedelta(seconds=30), timedelta(minutes=15)


def instance(
    age: timedelta = timedelta(hours=1), state: str = "running", **tags: str | None
) -> dict[str, Any]:
    every = {
        f"kubernetes.io/cluster/{CLUSTER}": "owned",
        "karpenter.sh/nodepool": "default",
        "karpflow.io/command-id": "disruption/prod/default/Drifted/abc@run-1",
        "karpflow.io/capacity-type": "spot",
    }
    every.update(tags)
    return {
        "InstanceId": "i-1",
        "InstanceType": "m5.large",
        "State": {"Name": state},
        "LaunchTime": NOW - age,
        "Placement": {"AvailabilityZone": "us-west-2a"},
        "Tags": [{"Key": k, "Value": v} for k, v in every.items() if v is not None],
    }


def node(
    *, initialized: bool = False, unregistered: bool = False, ready: bool = False, **meta: Any
) -> dict[str, Any]:
    taints = [{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}] if unregistered else []
    taints += meta.pop("taints", [])
    labels = {"karpenter.sh/initialized": "true"} if initialized else {}
    return {
        "metadata": {"name": "ip-10-0-0-1", "uid": "u1", "labels": labels, **meta},
        "spec": {"providerID": "aws:///us-west-2a/i-1", "taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_a_launch_reads_its_command_run_and_provider_id():
    launch = launch_of(instance(), CLUSTER)
    assert launch is not None
    assert (launch.workflow_id, launch.first_run_id) == ("disruption/prod/default/Drifted/abc", "run-1")
    assert launch.provider_id == "aws:///us-west-2a/i-1"
    assert (launch.nodepool, launch.capacity_type, launch.live) == ("default", "spot", True)


@pytest.mark.parametrize(
    "tags",
    [
        {f"kubernetes.io/cluster/{CLUSTER}": None},  # not this cluster's
        {f"kubernetes.io/cluster/{CLUSTER}": "shared"},  # the cluster's, not owned
        {"karpenter.sh/nodepool": None},  # an EKS node group's instance carries the cluster tag too
        {"karpflow.io/command-id": None},  # not launched for a command
        {"karpflow.io/command-id": "no-run-id"},
        {"karpflow.io/command-id": "@run-1"},
        {"karpflow.io/command-id": "disruption/x@"},
    ],
    ids=str,
)
def test_an_instance_without_the_ownership_tags_or_a_command_is_never_a_launch(tags):
    assert launch_of(instance(**tags), CLUSTER) is None
    assert launch_of(instance(), "another-cluster") is None


@pytest.mark.parametrize(
    ("found", "running", "run_id", "first_run_id", "state"),
    [
        (False, False, "", "", "closed"),  # not found (retention passed): closed
        (True, False, "run-1", "run-1", "closed"),  # its run ended (terminated, failed, completed)
        (True, False, "run-9", "run-9", "closed"),  # a later command of the id ended too
        (True, True, "run-1", "run-1", "open"),
        (True, True, "run-2", "run-1", "open"),  # a reset of it: the same chain
        (True, True, "run-9", "run-9", "closed"),  # a later command reused the id
        (True, True, "run-1", "", "open"),  # an older server: no first run id, but the same run
        (True, True, "run-2", "", "unknown"),  # an older server: a reset, or a later command?
    ],
)
def test_the_command_is_closed_only_when_its_chain_runs_no_more(found, running, run_id, first_run_id, state):
    assert command_state(found, running, run_id, first_run_id, "run-1") == state


def launch(**kwargs: Any):
    found = launch_of(instance(**kwargs), CLUSTER)
    assert found is not None
    return found


def test_no_node_is_garbage_only_past_the_grace_period():
    assert suspect(launch(age=timedelta(seconds=29)), None, NOW, GRACE, TTL) is None
    found = suspect(launch(age=timedelta(seconds=31)), None, NOW, GRACE, TTL)
    assert found is not None and found.reason == "garbage_collected"
    assert "no Node registered in 31s" in found.why


def test_a_node_that_never_initialized_is_garbage_only_past_the_registration_ttl():
    unregistered = NodeFacts.of(node(unregistered=True, ready=True))
    assert suspect(launch(age=timedelta(minutes=14)), unregistered, NOW, GRACE, TTL) is None
    found = suspect(launch(age=timedelta(minutes=16)), unregistered, NOW, GRACE, TTL)
    assert found is not None and found.reason == "registration_timeout"
    assert "still unregistered" in found.why
    not_ready = suspect(launch(), NodeFacts.of(node()), NOW, GRACE, TTL)
    assert not_ready is not None and "not Ready" in not_ready.why


@pytest.mark.parametrize(
    "facts",
    [
        node(initialized=True),  # initialized: capacity, for consolidation to judge
        node(initialized=True, unregistered=True),
        node(ready=True),  # registered and Ready: pods may already run there
        node(deletionTimestamp="2026-12-01T11:00:00Z"),  # its termination has it
        node(annotations={"karpflow.io/disruption-command": "disruption/other@r"}),  # another command's
        node(taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]),
    ],
    ids=["initialized", "initialized-unregistered", "ready", "deleting", "holder", "disrupted-taint"],
)
def test_a_node_that_initialized_runs_pods_or_is_held_keeps_its_instance(facts):
    assert suspect(launch(age=timedelta(days=1)), NodeFacts.of(facts), NOW, GRACE, TTL) is None


def test_an_ending_instance_leaves_only_its_releasable_node_to_collect():
    ending = launch(state="shutting-down")
    assert suspect(ending, None, NOW, GRACE, TTL) is None
    assert suspect(launch(state="terminated"), NodeFacts.of(node(initialized=True)), NOW, GRACE, TTL) is None
    found = suspect(ending, NodeFacts.of(node(unregistered=True)), NOW, GRACE, TTL)
    assert found is not None and "shutting-down" in found.why
