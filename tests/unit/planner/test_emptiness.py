from datetime import timedelta

from planner.emptiness import Emptiness
from planner.model import PlanOptions
from planner.plan import command_out, plan, validate_command
from sim.cluster_builder import ClusterBuilder


def run(b: ClusterBuilder):
    return plan(b.snapshot(), b.catalog, PlanOptions(), methods=[Emptiness()])


def emptied(b: ClusterBuilder) -> list[str]:
    return sorted(n for c in run(b).commands if c.method == "emptiness" for n in c.nodes)


def test_empty_nodes_are_deleted_in_one_command_within_the_budget():
    b = ClusterBuilder()
    b.nodepool("default", budgets=[{"nodes": "2"}])
    for i in range(4):
        b.node(f"empty-{i}")
    b.node("busy")
    b.pod("web-1", "busy")
    result = run(b)
    (command,) = result.commands
    assert (command.method, command.reason, command.decision) == ("emptiness", "Empty", "delete")
    assert len(command.nodes) == 2 and command.replacements == []
    assert command.savings_per_hour == round(2 * 0.096, 6)
    left = {x.node: x.reason for x in result.blocked}
    assert sum("budget for Empty is used up" in r for r in left.values()) == 2


def test_daemonset_and_mirror_pods_do_not_make_a_node_non_empty():
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("n1")
    b.daemonset_pod("n1")
    b.pod("static-n1", "n1", namespace="kube-system", annotations={"kubernetes.io/config.mirror": "x"})
    assert emptied(b) == ["n1"]


def test_a_terminating_statefulset_pod_keeps_the_node_non_empty_but_other_terminating_pods_do_not():
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("sts")
    b.pod("db-0", "sts", owner=("StatefulSet", "db"), deleting=True)
    b.node("rs")
    b.pod("web-1", "rs", deleting=True)
    assert emptied(b) == ["rs"]


def test_an_empty_node_waits_for_consolidate_after():
    b = ClusterBuilder()
    b.nodepool("default", consolidate_after="10m")
    b.node("n1", age=timedelta(hours=1), ready_for=timedelta(minutes=59))
    b.node("n2", age=timedelta(minutes=5), ready_for=timedelta(minutes=4))
    result = run(b)
    assert [c.nodes for c in result.commands] == [["n1"]]
    (left,) = result.blocked
    assert left.node == "n2" and left.reason.startswith("empty, but not consolidatable until")


def test_consolidate_after_never_disables_emptiness():
    b = ClusterBuilder()
    b.nodepool("default", consolidate_after="Never")
    b.node("n1")
    assert emptied(b) == []


def test_when_empty_policy_deletes_empty_nodes():
    b = ClusterBuilder()
    b.nodepool("default", policy="WhenEmpty")
    b.node("n1")
    assert emptied(b) == ["n1"]


def test_an_empty_node_with_a_do_not_disrupt_daemonset_pod_is_kept():
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("n1")
    b.daemonset_pod("n1")
    b.objects[-1]["metadata"]["annotations"] = {"karpenter.sh/do-not-disrupt": "true"}
    assert emptied(b) == []


def test_validation_keeps_the_subset_that_is_still_empty():
    b = ClusterBuilder()
    b.nodepool("default", budgets=[{"nodes": "3"}])
    for i in range(3):
        b.node(f"n{i}")
    planned = run(b).commands[0]
    assert planned.nodes == ["n0", "n1", "n2"]
    b.pod("arrived", "n1")  # a pod landed during the 15 s wait
    result = validate_command(b.snapshot(), b.catalog, planned, methods=[Emptiness()])
    assert result.valid and result.command.nodes == ["n0", "n2"]
    assert "n1" in result.reason


def test_validation_fails_when_no_node_is_still_empty():
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("n0")
    planned = run(b).commands[0]
    b.pod("arrived", "n0")
    result = validate_command(b.snapshot(), b.catalog, planned, methods=[Emptiness()])
    assert not result.valid and result.command is None


def test_validation_re_applies_a_fresh_budget():
    b = ClusterBuilder()
    b.nodepool("default", budgets=[{"nodes": "2"}])
    for i in range(4):
        b.node(f"n{i}")
    planned = run(b).commands[0]
    b.objects[-1]["metadata"]["deletionTimestamp"] = "2026-11-22T09:59:00Z"  # n3 started deleting meanwhile
    result = validate_command(b.snapshot(), b.catalog, planned, methods=[Emptiness()])
    assert result.valid and len(result.command.nodes) == 1


def test_command_out_round_trips_through_validation_unchanged_when_nothing_changed():
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("n0")
    ctx = b.context()
    planned = run(b).commands[0]
    result = validate_command(ctx.snapshot, b.catalog, planned, methods=[Emptiness()])
    assert result.valid and result.command == planned and result.reason == ""
    assert command_out(run(b).commands_[0]) == planned
