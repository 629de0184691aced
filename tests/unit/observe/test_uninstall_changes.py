"""`karpflow uninstall`'s list of changes (runtime/uninstall_cli.py), from objects as the API lists them."""

from __future__ import annotations

import copy
from typing import Any

from runtime.uninstall_cli import uninstall_changes

TERMINATION = "karpenter.sh/termination"


def node(
    name: str,
    *,
    taints: list[str] = (),
    annotations: dict[str, str] | None = None,
    finalizer: bool = False,
    provider: str = "",
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "annotations": dict(annotations or {})}
    if finalizer:
        meta["finalizers"] = [TERMINATION]
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"providerID": provider, "taints": [{"key": k, "effect": "NoSchedule"} for k in taints]},
    }


def test_only_what_karpflow_wrote_is_taken_off():
    ours = node(
        "a",
        taints=["karpenter.sh/disrupted", "karpflow.io/leaving", "team.example/gpu"],
        annotations={
            "karpflow.io/disruption-command": "disruption/c/x@r",
            "karpflow.dev/rollout-requested": "r",
            "example.com/keep": "1",
        },
        finalizer=True,
        provider="aws:///us-west-2a/i-a",
    )
    # Karpenter's: its disrupted taint has no karpflow holder, and a NodeClaim names its instance.
    theirs = node("b", taints=["karpenter.sh/disrupted"], finalizer=True, provider="aws:///us-west-2a/i-b")
    clean = node("c", taints=["team.example/gpu"])
    pools = [
        {
            "metadata": {
                "name": "default",
                "uid": "p1",
                "finalizers": ["karpflow.io/nodepool-nodes", "x/keep"],
            }
        },
        {"metadata": {"name": "batch", "uid": "p2"}},
    ]
    budgets = [
        {"metadata": {"name": "web", "uid": "n1"}, "status": {"claims": [{"node": "a", "holder": "h"}]}},
        {"metadata": {"name": "idle", "uid": "n2"}, "status": {"claims": []}},
    ]
    claims = [{"status": {"providerID": "aws:///us-west-2a/i-b"}}]
    changes = uninstall_changes([ours, theirs, clean], pools, budgets, claims)
    assert [(c.kind, c.name) for c in changes] == [
        ("NodePool", "default"),
        ("Node", "a"),
        ("NodeDisruptionBudget", "web"),
    ]
    by_name = {c.name: c for c in changes}
    assert by_name["a"].what == [
        "taint karpenter.sh/disrupted",
        "taint karpflow.io/leaving",
        "annotation karpflow.dev/rollout-requested",
        "annotation karpflow.io/disruption-command",
        f"finalizer {TERMINATION}",
    ]
    edited = copy.deepcopy(ours)
    assert by_name["a"].edit(edited)
    assert [t["key"] for t in edited["spec"]["taints"]] == ["team.example/gpu"]
    assert edited["metadata"]["annotations"] == {"example.com/keep": "1"}
    assert edited["metadata"]["finalizers"] == []
    assert not by_name["a"].edit(edited)  # idempotent: nothing left to change
    pool = copy.deepcopy(pools[0])
    assert by_name["default"].edit(pool) and pool["metadata"]["finalizers"] == ["x/keep"]
    budget = copy.deepcopy(budgets[0])
    assert by_name["web"].edit(budget) and budget["status"]["claims"] == []


def test_a_deleting_node_or_pool_is_named_as_such():
    changes = uninstall_changes(
        [node("a", finalizer=True, deleting=True)],
        [{"metadata": {"name": "p", "finalizers": ["karpflow.io/nodepool-nodes"], "deletionTimestamp": "x"}}],
        [],
        [],
    )
    assert [c.what for c in changes] == [
        ["finalizer karpflow.io/nodepool-nodes (deleting)"],
        [f"finalizer {TERMINATION} (deleting)"],
    ]
