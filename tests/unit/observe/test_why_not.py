""" "Why is this node not disrupted?": each reason the planner (or the controller's pass) gives for a
node it leaves alone, built with the real planner on a small cluster, is read as its kind (the
`reason` label of karpflow_unremovable_nodes), recorded under the Event its kind calls for, counted
in the metric, and named by `karpflow status --node`. A reworded planner reason that no longer
classifies fails here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from activities import pass_report
from activities.planning import backed_off, held_reason
from api.controller_io import ControllerStatus, FailedCommand
from api.event_reasons import Reason
from planner import why_not
from planner.plan import PlanOptions, plan
from planner.why_not import Kind
from runtime import metrics
from runtime.controller_cli import node_answer
from sim.cluster_builder import ClusterBuilder

ON_DEMAND = [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]


def cluster(**pool: object) -> ClusterBuilder:
    b = ClusterBuilder()
    b.nodeclass()
    b.nodepool("default", **pool)  # type: ignore[arg-type]
    return b


def window() -> ClusterBuilder:
    b = cluster(budgets=[{"nodes": "100%"}])
    b.node("n")
    b.maintenance_window("freeze", actions=["Emptiness"])
    return b


def node_disruption_budget() -> ClusterBuilder:
    b = cluster(budgets=[{"nodes": "100%"}])
    for name in ("m", "n"):
        b.node(name, labels={"role": "ingress"})
    b.node_disruption_budget("ingress", selector={"matchLabels": {"role": "ingress"}}, max_unavailable=1)
    return b


def nodepool_budget() -> ClusterBuilder:
    b = cluster(budgets=[{"nodes": "0"}])
    b.node("n")
    return b


def do_not_disrupt() -> ClusterBuilder:
    b = cluster()
    b.node("n")
    b.node("m")
    b.pod("p", "n", annotations={"karpenter.sh/do-not-disrupt": "true"})
    return b


def pod_disruption_budget() -> ClusterBuilder:
    b = cluster()
    b.node("n")
    b.node("m")
    b.pod("p", "n", app="web")
    b.pdb("web", allowed=0)
    return b


def consolidate_after() -> ClusterBuilder:
    b = cluster(consolidate_after="1h")
    b.node("n", age=timedelta(minutes=5))
    b.pod("p", "n", age=timedelta(minutes=5))
    return b


def no_cheaper_placement() -> ClusterBuilder:
    b = cluster(requirements=ON_DEMAND)
    b.node("n", instance_type="t3.micro")  # the catalog's cheapest on-demand type
    b.pod("p", "n", cpu="10m", memory="10Mi")
    return b


def not_initialized() -> ClusterBuilder:
    b = cluster()
    b.node("n", initialized=False)
    return b


def consolidation_policy() -> ClusterBuilder:
    b = cluster(policy="WhenEmpty")
    b.node("n")
    b.pod("p", "n")
    return b


PLANNED = [
    (window, Kind.MAINTENANCE_WINDOW, Reason.DISRUPTION_WAITING_WINDOW),
    (node_disruption_budget, Kind.NODE_DISRUPTION_BUDGET, Reason.DISRUPTION_WAITING_NODE_DISRUPTION_BUDGET),
    (nodepool_budget, Kind.BUDGET, Reason.DISRUPTION_BLOCKED),
    (do_not_disrupt, Kind.DO_NOT_DISRUPT, Reason.DISRUPTION_BLOCKED),
    (pod_disruption_budget, Kind.POD_DISRUPTION_BUDGET, Reason.DISRUPTION_BLOCKED),
    (consolidate_after, Kind.CONSOLIDATE_AFTER, Reason.UNCONSOLIDATABLE),
    (no_cheaper_placement, Kind.NO_CHEAPER_PLACEMENT, Reason.UNCONSOLIDATABLE),
    (not_initialized, Kind.NOT_INITIALIZED, Reason.DISRUPTION_BLOCKED),
    (consolidation_policy, Kind.CONSOLIDATION_POLICY, Reason.UNCONSOLIDATABLE),
]


@pytest.mark.parametrize(("build", "kind", "event"), PLANNED, ids=lambda x: getattr(x, "__name__", str(x)))
def test_a_node_the_planner_holds_back_shows_why_in_the_event_the_metric_and_status(build, kind, event):
    b = build()
    snapshot = b.snapshot()
    result = plan(snapshot, b.catalog, PlanOptions(all_methods=True))
    reasons = {x.node: x.reason for x in result.blocked}
    assert why_not.kind_of(reasons["n"]) == kind, reasons["n"]

    # the Event on the node, pinned to its UID, says the planner's words
    (recorded,) = [e for e in pass_report.pass_events(result, snapshot, reasons) if e.on.name == "n"]
    assert recorded.reason == event and reasons["n"] in recorded.message
    assert recorded.on.kind == "Node" and recorded.on.uid == snapshot.nodes["n"].uid

    # the metric counts it under its kind, and only there (a kind gone is zero)
    pass_report.record_pass_metrics(result, reasons, 0.01)
    assert metrics.UNREMOVABLE_NODES.labels(reason=str(kind))._value.get() == list(reasons.values()).count(
        reasons["n"]
    )
    others = [k for k in Kind if k != kind and k not in {why_not.kind_of(r) for r in reasons.values()}]
    assert all(metrics.UNREMOVABLE_NODES.labels(reason=str(k))._value.get() == 0 for k in others)

    # `karpflow status --node n` names it from the controller's status
    status = ControllerStatus(cluster="c", blocked=reasons, last_pass_at=datetime.now(UTC))
    answer = node_answer(status, "n")
    assert answer["held_back"] and answer["kind"] == str(kind) and answer["reason"] == reasons["n"]
    assert answer["event"] == str(event)


def test_a_nodepool_whose_budget_allows_nothing_gets_its_own_event():
    b = nodepool_budget()
    snapshot = b.snapshot()
    result = plan(snapshot, b.catalog)
    reasons = {x.node: x.reason for x in result.blocked}
    pools = [e for e in pass_report.pass_events(result, snapshot, reasons) if e.on.kind == "NodePool"]
    assert pools and {e.on.name for e in pools} == {"default"}
    assert all(e.reason == Reason.DISRUPTION_BLOCKED and "blocking budget" in e.message for e in pools)
    pass_report.record_pass_metrics(result, reasons, 0.01)
    assert metrics.ALLOWED_DISRUPTIONS.labels(nodepool="default", reason="Empty")._value.get() == 0


def test_a_nodepool_with_a_bad_karpflow_annotation_gets_a_warning_naming_it():
    """Issue 31 item 8: `kubectl describe nodepool` showed only the budget message."""
    b = ClusterBuilder()
    pool = b.nodepool("default")
    pool["metadata"]["annotations"] = {"karpflow.dev/max-disruptions-per-hour": "lots"}
    b.node("n")
    snapshot = b.snapshot()
    result = plan(snapshot, b.catalog)
    reasons = {x.node: x.reason for x in result.blocked}
    (warning,) = [
        e
        for e in pass_report.pass_events(result, snapshot, reasons)
        if e.reason == Reason.INVALID_NODEPOOL_SETTINGS
    ]
    assert (warning.on.kind, warning.on.name, warning.event_type) == ("NodePool", "default", "Warning")
    assert "karpflow.dev/max-disruptions-per-hour" in warning.message and "lots" in warning.message


def test_a_backoff_an_approval_and_a_disruption_in_flight_are_named_by_the_pass():
    failed = FailedCommand(
        workflow_id="disruption/c/default/Underutilized/1",
        run_id="r",
        nodepools=["default"],
        reason="Underutilized",
        closed_at=datetime.now(UTC),
        message="InstanceNotOwned: instance i-0abc is not tagged for cluster c",
    )
    (backoff,) = backed_off([], [failed], datetime.now(UTC)).values()
    assert why_not.kind_of(backoff) == Kind.BACKOFF and "InstanceNotOwned" in backoff
    assert why_not.event_for(backoff) == (Reason.DISRUPTION_BLOCKED, f"Cannot disrupt Node: {backoff}")

    tainted = "disruption already in progress (karpenter.sh/disrupted taint)"  # the planner's words
    waiting = held_reason(tainted, ("disruption/c/default/Drifted/2", why_not.AWAITING_APPROVAL_PHASE))
    assert why_not.kind_of(waiting) == Kind.AWAITING_APPROVAL
    assert why_not.event_for(waiting) == (Reason.DISRUPTION_AWAITING_APPROVAL, waiting)
    running = held_reason(tainted, ("disruption/c/default/Drifted/2", "Draining"))
    assert running == "disruption in progress: disruption/c/default/Drifted/2"
    assert why_not.kind_of(running) == Kind.IN_PROGRESS and why_not.event_for(running) is None
    assert held_reason("pdb default/web prevents pod evictions", ("x", "Draining")).startswith("pdb")


def test_status_of_a_node_not_held_back_says_what_else_is_known():
    status = ControllerStatus(cluster="c", blocked={}, last_pass_at=datetime.now(UTC))
    assert node_answer(status, "n", ["disruption/c/default/Drifted/2"]) | {"last_pass_at": None} == {
        "node": "n",
        "cluster": "c",
        "last_pass_at": None,
        "held_back": False,
        "reason": "being disrupted: disruption/c/default/Drifted/2",
    }
    assert not node_answer(status, "n")["held_back"]


def test_a_repair_held_off_gets_node_repair_blocked_on_each_sick_node():
    b = cluster(budgets=[{"nodes": "0"}])
    for index in range(6):
        b.node(f"n{index}")
    for name in ("sick-1", "sick-2", "sick-3"):  # 3 of 9: more than 20 % rounded up
        b.node(name, ready=False, ready_for=timedelta(hours=2))
    snapshot = b.snapshot()
    result = plan(snapshot, b.catalog, PlanOptions(), methods=[])
    reasons = {x.node: x.reason for x in result.blocked}
    repairs = [
        e
        for e in pass_report.pass_events(result, snapshot, reasons)
        if e.reason == Reason.NODE_REPAIR_BLOCKED
    ]
    assert {e.on.name for e in repairs} == {"sick-1", "sick-2", "sick-3"}
    assert all("unhealthy (more than 2" in e.message for e in repairs)
