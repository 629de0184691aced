"""A command that waited for approval, judged again on the cluster as it is now
(planner/waiting_validation.py)."""

from __future__ import annotations

from planner.emptiness import Emptiness
from planner.model import PlanOptions
from planner.plan import CommandOut, command_out, plan
from planner.waiting_validation import approval_required, validate_waited
from sim.cluster_builder import ClusterBuilder


def empty_pool(**pool: object) -> ClusterBuilder:
    b = ClusterBuilder()
    b.nodepool("default", **{"budgets": [{"nodes": "100%"}], **pool})
    b.node("n1")
    b.node("n2")
    return b


def planned(b: ClusterBuilder) -> CommandOut:
    (command,) = plan(b.snapshot(), b.catalog, PlanOptions(), methods=[Emptiness()]).commands_
    return command_out(command)


def judge(b: ClusterBuilder, out: CommandOut | None, nodes=None, **kwargs):
    snapshot = b.snapshot()
    names = nodes or (out.nodes if out else ["n1"])
    uids = {n: snapshot.nodes[n].uid for n in names if n in snapshot.nodes}
    return validate_waited(snapshot, b.catalog, names, "Empty", uids, out, methods=[Emptiness()], **kwargs)


def test_a_plan_that_still_holds_is_valid():
    b = empty_pool()
    out = planned(b)
    verdict = judge(b, out)
    assert verdict.valid and verdict.command is not None and sorted(verdict.command.nodes) == ["n1", "n2"]


def test_a_node_no_longer_empty_is_left_out_and_a_gone_one_ends_it():
    b = empty_pool()
    out = planned(b)
    b.pod("web-1", "n2")  # a pod arrived while the command waited
    verdict = judge(b, out)
    assert not verdict.valid and verdict.reason == "n2: no longer Empty"
    gone = empty_pool()
    snapshot_then = planned(gone)
    gone.objects = [o for o in gone.objects if o["metadata"]["name"] != "n2"]
    assert judge(gone, snapshot_then).reason == "n2: the node is gone"


def test_a_name_reused_by_another_node_is_not_taken():
    b = empty_pool()
    out = planned(b)
    snapshot = b.snapshot()
    uids = {"n1": "the-old-uid", "n2": snapshot.nodes["n2"].uid}
    verdict = validate_waited(snapshot, b.catalog, out.nodes, "Empty", uids, out, methods=[Emptiness()])
    assert not verdict.valid and verdict.reason == "n1: the name now belongs to another node"


def test_a_node_another_command_holds_now_ends_it():
    b = empty_pool()
    verdict = judge(b, planned(b), held={"n1": "disruption/c/default/Drifted/1"})
    assert not verdict.valid and verdict.reason == "n1: disruption/c/default/Drifted/1 holds it now"


def test_the_controls_are_read_again():
    b = empty_pool(budgets=[{"nodes": "0"}])
    out = CommandOut(
        id="x", method="emptiness", reason="Empty", decision="delete", nodes=["n1"], nodepools=["default"],
        replacements=[], savings_per_hour=0.1, disruption_class="graceful", pods=0,
    )  # fmt: skip
    verdict = judge(b, out)
    assert not verdict.valid and verdict.reason.startswith("budget:")
    windowed = empty_pool()
    out = planned(windowed)
    windowed.maintenance_window("freeze", actions=["Emptiness"])  # begun while the command waited
    verdict = judge(windowed, out)
    assert not verdict.valid and "freeze" in verdict.reason


def test_a_command_started_by_hand_is_judged_by_its_nodes_and_controls():
    b = empty_pool()
    assert judge(b, None, nodes=["n1"]).valid
    b.node_disruption_budget(
        "none", selector={"matchLabels": {"karpenter.sh/nodepool": "default"}}, max_unavailable=0
    )
    verdict = judge(b, None, nodes=["n1"])
    assert not verdict.valid and "none" in verdict.reason


def test_approval_is_asked_for_while_a_pool_of_the_nodes_says_so():
    b = ClusterBuilder()
    b.nodepool("default")
    b.nodepool("batch")
    b.node("d1", pool="default")
    b.node("b1", pool="batch")
    pool = next(o for o in b.objects if o["kind"] == "NodePool" and o["metadata"]["name"] == "default")
    pool["metadata"]["annotations"] = {"karpflow.dev/require-approval": "Empty"}
    snapshot = b.snapshot()
    assert approval_required(snapshot, ["d1", "b1"], "Empty")
    assert not approval_required(snapshot, ["b1"], "Empty")
    assert not approval_required(snapshot, ["d1"], "Drifted")
