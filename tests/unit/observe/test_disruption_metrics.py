"""Karpenter's labels and pod count for a disrupted node (activities/disruption_metrics.py), from
kubernetes-sigs/karpenter #3015 (karpenter_pods_disruption_initiated_total) and #3179
(consolidation_policy, termination_mode), both on main after v1.14.1."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from activities.disruption_metrics import (
    consolidation_policy_label,
    disruption_labels,
    reschedulable_pods,
    snake_case,
    termination_mode,
)


def pod(
    name: str,
    owner: str | None = "ReplicaSet",
    *,
    phase: str = "Running",
    deleting: bool = False,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner, "name": "owner", "uid": "owner-uid", "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-08-01T00:00:00Z"
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"nodeName": "n"}, "status": {"phase": phase}}


def test_only_reschedulable_pods_are_counted_not_daemonset_pods():
    """pkg/utils/node/suite_test.go, Context "ReschedulablePods", It "should return only
    reschedulable pods bound to the node": two active pods and one DaemonSet pod give 2 (as the
    expiration suite's "should fire karpenter_pods_disruption_initiated_total by the count of
    reschedulable pods on the node when expired")."""
    assert reschedulable_pods([pod("a"), pod("b"), pod("ds", owner="DaemonSet")]) == 2


def test_a_node_without_pods_counts_none():
    """pkg/utils/node/suite_test.go, It "should return no pods when no pods are bound to the node"."""
    assert reschedulable_pods([]) == 0


def test_terminating_pods_count_only_for_statefulsets_and_mirror_and_finished_pods_never():
    """pkg/utils/pod/scheduling.go `IsReschedulable` (the rule ReschedulablePods applies): active, or
    terminating and owned by a StatefulSet; never owned by a DaemonSet or the Node (mirror pods)."""
    pods = [
        pod("terminating-web", deleting=True),
        pod("terminating-db", owner="StatefulSet", deleting=True),
        pod("mirror", owner="Node", annotations={"kubernetes.io/config.mirror": "x"}),
        pod("done", phase="Succeeded"),
        pod("failed", phase="Failed"),
        pod("bare", owner=None),
    ]
    assert reschedulable_pods(pods) == 2  # terminating-db and bare


def test_termination_mode_follows_the_termination_grace_period():
    """pkg/utils/nodeclaim/nodeclaim.go `DisruptionTerminationMode`; the expiration and health suites
    expect `graceful` for a NodeClaim without a terminationGracePeriod."""
    assert termination_mode(None) == "graceful"
    assert termination_mode(timedelta(0)) == "forceful"
    assert termination_mode(timedelta(seconds=-1)) == "forceful"
    assert termination_mode(timedelta(hours=1)) == "eventual"


def test_the_policy_is_reported_for_consolidation_only_in_snake_case():
    """pkg/controllers/disruption/queue.go `waitOrTerminate`: "Drift also flows through this queue, so
    only report a policy for consolidation" (a command with a consolidation type: emptiness, multi-
    and single-node), in pretty.ToSnakeCase; the other controllers report ""."""
    assert snake_case("WhenEmptyOrUnderutilized") == "when_empty_or_underutilized"
    assert (
        consolidation_policy_label("Underutilized", "WhenEmptyOrUnderutilized")
        == "when_empty_or_underutilized"
    )
    assert consolidation_policy_label("Empty", "WhenEmpty") == "when_empty"
    assert consolidation_policy_label("Underutilized", "Balanced") == "balanced"
    for reason in ("Drifted", "Expired", "Unhealthy", "Interrupted", "garbage_collected"):
        assert consolidation_policy_label(reason, "WhenEmptyOrUnderutilized") == "", reason


def test_both_series_get_the_same_five_labels():
    """pkg/metrics/metrics.go: NodeClaimsDisruptedTotal and PodsDisruptionInitiatedTotal share
    reason, nodepool, capacity_type, consolidation_policy and termination_mode."""
    assert disruption_labels(
        reason="Empty",
        nodepool="default",
        capacity_type="spot",
        policy="WhenEmptyOrUnderutilized",
        grace=timedelta(minutes=10),
    ) == {
        "reason": "Empty",
        "nodepool": "default",
        "capacity_type": "spot",
        "consolidation_policy": "when_empty_or_underutilized",
        "termination_mode": "eventual",
    }
