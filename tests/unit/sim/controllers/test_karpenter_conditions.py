"""The simulated Karpenter's NodeClaim conditions follow operatorpkg's ConditionSet
(awslabs/operatorpkg status/condition_set.go): Ready is derived from Launched, Registered and
Initialized (kubernetes-sigs/karpenter pkg/apis/v1/nodeclaim_status.go)."""

from __future__ import annotations

from typing import Any

from sim.apiserver import crds, resources
from sim.controllers.karpenter.conditions import condition, initialize, set_condition
from sim.controllers.karpenter.seed import nodeclaim_for


def ready(status: dict[str, Any]) -> tuple[str, str, str]:
    c = condition(status, "Ready") or {}
    return c.get("status", ""), c.get("reason", ""), c.get("message", "")


def test_ready_follows_the_three_lifecycle_conditions():
    status: dict[str, Any] = {}
    assert initialize(status, at="2026-01-01T00:00:00Z")
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Initialized", "Unknown", "AwaitingReconciliation"),
        ("Launched", "Unknown", "AwaitingReconciliation"),
        ("Ready", "Unknown", "ReconcilingDependents"),
        ("Registered", "Unknown", "AwaitingReconciliation"),
    ]
    assert not initialize(status)  # nothing missing any more
    set_condition(status, "Launched", "True", "Launched", at="2026-01-01T00:00:01Z")
    set_condition(status, "Registered", "True", "Registered", at="2026-01-01T00:00:02Z")
    assert ready(status) == ("Unknown", "ReconcilingDependents", "Initialized=Unknown")
    set_condition(status, "Initialized", "True", "Initialized", at="2026-01-01T00:00:03Z")
    assert ready(status) == ("True", "Ready", "")
    # A condition outside the set (termination's) leaves Ready alone; a dependent going False fails it.
    set_condition(status, "Drained", "Unknown", "Draining", "Draining")
    assert ready(status) == ("True", "Ready", "")
    set_condition(status, "Registered", "False", "MultipleNodesFound", "two nodes")
    assert ready(status) == ("False", "UnhealthyDependents", "Registered=False")


def test_setting_the_same_condition_again_changes_nothing_and_a_new_reason_moves_the_time():
    status: dict[str, Any] = {}
    assert set_condition(status, "Launched", "Unknown", "LaunchFailed", "no capacity", at="t1")
    assert not set_condition(status, "Launched", "Unknown", "LaunchFailed", "no capacity", at="t2")
    assert set_condition(status, "Launched", "Unknown", "LaunchFailed", "throttled", at="t3")
    launched = condition(status, "Launched") or {}
    assert (launched["lastTransitionTime"], launched["observedGeneration"]) == ("t3", 1)


def test_a_seeded_nodeclaim_of_a_ready_node_is_ready_and_valid_for_its_crd():
    node = {
        "metadata": {
            "name": "n1",
            "labels": {"karpenter.sh/nodepool": "default", "karpenter.sh/initialized": "true"},
        },
        "spec": {"providerID": "aws:///us-west-2a/i-0123456789abcdef0"},
        "status": {
            "capacity": {"cpu": "2"},
            "allocatable": {"cpu": "2"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    pool = {
        "metadata": {"name": "default", "uid": "p1"},
        "spec": {
            "template": {
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                    "requirements": [],
                }
            }
        },
    }
    claim = nodeclaim_for(node, pool, None)
    assert ready(claim["status"]) == ("True", "Ready", "")
    errors = crds.schema_errors(resources.resolve("nodeclaims"), claim)
    assert not [e for e in errors if e[0].startswith("status")], errors
