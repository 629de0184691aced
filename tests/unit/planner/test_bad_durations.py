"""Every duration karpflow reads fails closed when it is invalid, and is reported (issue 17 item 1).

A negative or unparseable duration used to be read as written: `expire-after=-1h` expired every node
of the pool (and each replacement seconds after it registered), a negative consolidateAfter
consolidated at once, a negative budget duration switched a freeze off. Now each one is a problem
in the plan and reads as the value that drives nothing."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from api.constants import DO_NOT_DISRUPT_ANNOTATION
from planner.candidates import pod_block
from planner.emptiness import Emptiness
from planner.model import PlanOptions
from planner.plan import plan
from sim.cluster_builder import NODECLAIM_SPEC, ClusterBuilder

BAD = ["-1h", "-5m", "a while", "1d"]


def run(b: ClusterBuilder, methods=None):
    methods = methods if methods is not None else [Emptiness()]
    return plan(b.snapshot(), b.catalog, PlanOptions(all_methods=True), methods=methods, simulate=None)


def reported(result, *needles: str) -> bool:
    return any(all(n in p for n in needles) for p in result.problems)


def old_and_empty(b: ClusterBuilder) -> None:
    """Two nodes that any sane expireAfter under 30 days and any consolidateAfter would act on."""
    b.node("old", age=timedelta(days=40))
    b.pod("web-1", "old")
    b.node("empty", age=timedelta(days=40))


# --- expireAfter ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", BAD)
def test_a_bad_expire_after_annotation_expires_nothing_and_is_reported(value):
    b = ClusterBuilder()
    pool = b.nodepool("arm", expire_after="720h", budgets=[{"nodes": "100%"}])
    pool["metadata"]["annotations"] = {"karpflow.dev/expire-after": value}
    b.node("old", pool="arm", age=timedelta(days=40))
    result = run(b, methods=[])
    assert result.commands == []
    assert reported(result, "arm", "karpflow.dev/expire-after", value)


@pytest.mark.parametrize("value", BAD)
def test_a_bad_template_expire_after_expires_nothing_and_is_reported(value):
    b = ClusterBuilder()
    b.nodepool("arm", expire_after=value)
    b.node("old", pool="arm", age=timedelta(days=40))
    result = run(b, methods=[])
    assert result.commands == []
    assert reported(result, "arm", "expireAfter", value)


def test_a_bad_nodeclaim_expire_after_expires_nothing_and_is_reported():
    b = ClusterBuilder()
    b.nodepool("default", expire_after="720h")
    node = b.node("n1", age=timedelta(hours=3))
    b.add(
        {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {"name": "c1", "creationTimestamp": node["metadata"]["creationTimestamp"]},
            "spec": {**NODECLAIM_SPEC, "expireAfter": "-1h"},
            "status": {"nodeName": "n1"},
        }
    )
    result = run(b, methods=[])
    assert result.commands == []
    assert reported(result, "NodeClaim c1", "expireAfter", "-1h")


@pytest.mark.parametrize("ttl", [-3600, "an hour"])
def test_a_bad_provisioner_ttl_until_expired_expires_nothing_and_is_reported(ttl):
    b = ClusterBuilder()
    b.add(
        {
            "apiVersion": "karpenter.sh/v1alpha5",
            "kind": "Provisioner",
            "metadata": {"name": "default"},
            "spec": {"ttlSecondsUntilExpired": ttl, "consolidation": {"enabled": True}},
        }
    )
    b.node("old", age=timedelta(days=40))
    b.pod("web-1", "old")
    result = run(b, methods=[])
    assert result.commands == []
    assert reported(result, "default", "ttlSecondsUntilExpired")


# --- consolidateAfter -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", BAD)
def test_a_bad_consolidate_after_annotation_consolidates_nothing_and_is_reported(value):
    b = ClusterBuilder()
    pool = b.nodepool("default", expire_after="Never", budgets=[{"nodes": "100%"}])
    pool["metadata"]["annotations"] = {"karpflow.dev/consolidate-after": value}
    old_and_empty(b)
    result = run(b)
    assert result.commands == []
    assert reported(result, "default", "karpflow.dev/consolidate-after", value)


@pytest.mark.parametrize("value", BAD)
def test_a_bad_spec_consolidate_after_consolidates_nothing_and_is_reported(value):
    b = ClusterBuilder()
    b.nodepool("default", expire_after="Never", consolidate_after=value, budgets=[{"nodes": "100%"}])
    old_and_empty(b)
    result = run(b)
    assert result.commands == []
    assert reported(result, "default", "consolidateAfter", value)


def test_a_negative_provisioner_ttl_after_empty_consolidates_nothing_and_is_reported():
    b = ClusterBuilder()
    b.add(
        {
            "apiVersion": "karpenter.sh/v1alpha5",
            "kind": "Provisioner",
            "metadata": {"name": "default"},
            "spec": {"ttlSecondsAfterEmpty": -30},
        }
    )
    b.node("empty", age=timedelta(days=2))
    result = run(b)
    assert result.commands == []
    assert reported(result, "default", "ttlSecondsAfterEmpty")


# --- terminationGracePeriod -------------------------------------------------------------------------


def _expired_candidate_grace(b: ClusterBuilder):
    result = run(b, methods=[])
    (command,) = result.commands_
    return result, command.candidates[0].termination_grace_period


@pytest.mark.parametrize("value", ["-1h", "a while"])
def test_a_bad_termination_grace_period_annotation_is_no_deadline_and_is_reported(value):
    """The safe reading: no deadline (the drain keeps honouring PDBs and do-not-disrupt), never a
    deadline in the past that would force pods out at once, nor Karpenter's value instead."""
    b = ClusterBuilder()
    pool = b.nodepool("default", expire_after="24h", termination_grace_period="2h")
    pool["metadata"]["annotations"] = {"karpflow.dev/termination-grace-period": value}
    b.node("old", age=timedelta(days=2))
    result, grace = _expired_candidate_grace(b)
    assert grace is None
    assert reported(result, "default", "karpflow.dev/termination-grace-period", value)


@pytest.mark.parametrize("value", ["-1h", "a while", "Never"])
def test_a_bad_template_termination_grace_period_is_no_deadline_and_is_reported(value):
    b = ClusterBuilder()
    b.nodepool("default", expire_after="24h", termination_grace_period=value)
    b.node("old", age=timedelta(days=2))
    result, grace = _expired_candidate_grace(b)
    assert grace is None
    assert reported(result, "default", "terminationGracePeriod", value)


# --- budgets ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["spec", "annotation"])
def test_a_negative_budget_duration_fails_the_pool_closed(where):
    """A freeze `nodes: "0"` every minute for -1h used to be never active: no limit at all."""
    b = ClusterBuilder()
    budgets = [{"nodes": "100%"}, {"nodes": "0", "schedule": "* * * * *", "duration": "-1h"}]
    if where == "spec":
        b.nodepool("default", expire_after="Never", budgets=budgets)
    else:
        pool = b.nodepool("default", expire_after="Never")
        pool["metadata"]["annotations"] = {"karpflow.dev/budgets": json.dumps(budgets)}
    b.node("empty", age=timedelta(days=2))
    result = run(b)
    assert result.commands == []
    assert reported(result, "default", "-1h")


# --- do-not-disrupt with a duration -----------------------------------------------------------------


def _pod_cluster(value: str) -> ClusterBuilder:
    b = ClusterBuilder()
    b.nodepool("default", expire_after="Never", budgets=[{"nodes": "100%"}])
    b.node("a", age=timedelta(days=2))
    b.pod("batch-1", "a", annotations={DO_NOT_DISRUPT_ANNOTATION: value})
    return b


@pytest.mark.parametrize("value", ["-5m", "a while", "1d"])
def test_a_pod_do_not_disrupt_that_is_no_duration_protects_and_is_reported(value):
    """Karpenter reads it as absent (and emits InvalidDoNotDisruptAnnotation); karpflow fails closed:
    the pod stays protected, as with "true", and the plan says why."""
    b = _pod_cluster(value)
    snapshot = b.snapshot()
    block = pod_block(snapshot, snapshot.nodes["a"])
    assert block is not None and DO_NOT_DISRUPT_ANNOTATION in block
    assert reported(run(b), "batch-1", DO_NOT_DISRUPT_ANNOTATION, value)


@pytest.mark.parametrize("value", ["false", "0s"])
def test_a_pod_do_not_disrupt_that_says_no_protection_does_not_protect(value):
    b = _pod_cluster(value)
    snapshot = b.snapshot()
    assert pod_block(snapshot, snapshot.nodes["a"]) is None
    assert run(b).problems == []
