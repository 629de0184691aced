"""The taint activity's emptiness guard (activities/guards.py `no_longer_empty`): at the moment of the
taint, a node is still empty by the planner's rule, Karpenter's `Candidate.IsEmpty` (no reschedulable
pod with a positive eviction cost), read on the pods' JSON as the API returns them."""

from __future__ import annotations

from typing import Any

from activities.guards import no_longer_empty

NODE = {"metadata": {"name": "n1"}}
COST = "controller.kubernetes.io/pod-deletion-cost"


def pod(
    name: str,
    *,
    cost: str | None = None,
    priority: int | None = None,
    owner: str = "ReplicaSet",
    deleting: bool = False,
    phase: str = "Running",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "ownerReferences": [{"kind": owner, "name": "x", "controller": True}],
    }
    if cost is not None:
        meta["annotations"] = {COST: cost}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T01:00:00Z"
    spec: dict[str, Any] = {"nodeName": "n1"}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_pods_that_cost_nothing_to_evict_leave_the_node_empty():
    """Karpenter types.go `IsEmpty`: the node is taken, and its drain evicts these pods (fails on the
    old guard, which refused any running pod)."""
    pods = [
        pod("batch-1", cost="-2147483647"),
        pod("batch-2", cost=str(-(2**27))),
        pod("low", priority=-(2**25)),
    ]
    assert no_longer_empty(NODE, pods) is None


def test_a_pod_with_a_positive_cost_refuses_the_node_and_says_its_cost():
    found = no_longer_empty(NODE, [pod("batch-1", cost="-2147483647"), pod("web-1")])
    assert found is not None
    assert found.startswith("node n1 is no longer empty: pod default/web-1 runs on it")
    assert "eviction cost 2.00, above 1.0" in found


def test_what_never_moves_does_not_count():
    """Karpenter pod.IsReschedulable: DaemonSet, mirror (Node-owned) and terminal pods never move; a
    terminating pod is gone unless a StatefulSet owns it (its replacement waits for it)."""
    quiet = [
        pod("ds", owner="DaemonSet"),
        pod("static", owner="Node"),
        pod("done", phase="Succeeded"),
        pod("leaving", deleting=True),
    ]
    assert no_longer_empty(NODE, quiet) is None
    found = no_longer_empty(NODE, [pod("db-0", owner="StatefulSet", deleting=True)])
    assert found is not None and "pod default/db-0" in found
