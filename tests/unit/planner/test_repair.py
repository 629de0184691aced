"""Node repair and NodePool deletion: forceful commands, outside the budgets."""

from datetime import timedelta

from planner.model import PlanOptions
from planner.plan import plan
from sim.cluster_builder import ClusterBuilder


def run(b: ClusterBuilder, **options):
    return plan(b.snapshot(), b.catalog, PlanOptions(**options), methods=[])


def pool_of(b: ClusterBuilder, nodes: int, budgets=None) -> list[str]:
    b.nodepool("default", budgets=budgets or [{"nodes": "0"}])
    names = [f"n{i}" for i in range(nodes)]
    for name in names:
        b.node(name)
    return names


def test_a_node_not_ready_past_its_toleration_is_replaced_despite_a_zero_budget():
    b = ClusterBuilder()
    for name in pool_of(b, 9):
        b.pod(f"busy-{name}", name, cpu="1500m")  # no room left for web-1 elsewhere
    b.node("sick", ready=False, ready_for=timedelta(minutes=31))
    b.pod("web-1", "sick", cpu="1500m")
    (command,) = run(b).commands
    assert (command.method, command.reason, command.disruption_class) == ("repair", "Unhealthy", "forceful")
    assert command.nodes == ["sick"] and "Ready=False since" in command.message
    assert command.replacements, "its pod gets capacity before the drain"


def test_a_node_not_ready_for_less_than_its_toleration_waits():
    b = ClusterBuilder()
    pool_of(b, 9)
    b.node("flaky", ready=False, ready_for=timedelta(minutes=10))
    assert run(b).commands == []
    assert run(b, repair_tolerations={"Ready=False": timedelta(minutes=5)}).commands[0].nodes == ["flaky"]


def test_no_repair_when_more_than_a_fifth_rounded_up_is_unhealthy():
    b = ClusterBuilder()
    pool_of(b, 6)
    for name in ("sick-1", "sick-2", "sick-3"):  # 3 of 9: more than ceil(20 % of 9) = 2
        b.node(name, ready=False, ready_for=timedelta(hours=2))
    result = run(b)
    assert result.commands == []
    reasons = " ".join(d.reason for x in result.blocked for d in x.details)
    assert "3 of 9 nodes of NodePool default are unhealthy (more than 2: 20% rounded up)" in reasons


def test_one_unhealthy_node_of_a_small_pool_is_repaired_as_karpenter_rounds_up():
    """Karpenter allows ceil(20 %) unhealthy nodes: 1 of 3 or 4, 2 of 8 (its health controller)."""
    for size, sick in ((3, 1), (4, 1), (8, 2)):
        b = ClusterBuilder()
        pool_of(b, size - sick)
        names = [f"sick-{i}" for i in range(sick)]
        for name in names:
            b.node(name, ready=False, ready_for=timedelta(hours=2))
        repaired = sorted(n for c in run(b).commands for n in c.nodes)
        assert repaired == names, f"{sick} of {size}"


def test_repair_can_be_turned_off():
    b = ClusterBuilder()
    pool_of(b, 9)
    b.node("sick", ready=False, ready_for=timedelta(hours=1))
    assert run(b, repair_tolerations={}).commands == []


def test_the_nodes_of_a_nodepool_being_deleted_are_terminated():
    b = ClusterBuilder()
    pool = b.nodepool("old", budgets=[{"nodes": "0"}])
    pool["metadata"]["deletionTimestamp"] = "2026-11-22T09:00:00Z"
    pool["metadata"]["finalizers"] = ["karpenter.sh/termination"]
    b.nodepool("default")
    b.node("a", pool="old")
    b.node("b", pool="old")
    b.node("c", pool="default")
    commands = run(b).commands
    assert sorted(n for c in commands for n in c.nodes) == ["a", "b"]
    assert {(c.method, c.reason, c.disruption_class) for c in commands} == {
        ("nodepool-deletion", "NodePoolDeleted", "forceful")
    }
    assert all(c.replacements == [] for c in commands)


def test_a_node_that_never_became_ready_within_15_minutes_of_launch_is_terminated():
    b = ClusterBuilder()
    pool_of(b, 9)
    b.node(
        "stuck", age=timedelta(minutes=16), ready=False, initialized=False, ready_for=timedelta(minutes=16)
    )
    b.node(
        "booting", age=timedelta(minutes=5), ready=False, initialized=False, ready_for=timedelta(minutes=5)
    )
    (command,) = run(b, repair_tolerations={}).commands
    assert (command.method, command.reason, command.nodes) == ("liveness", "Unhealthy", ["stuck"])
    assert "not Ready and initialized 16m" in command.message


def test_nodes_already_in_flight_get_no_second_forceful_command():
    """A node a running workflow holds (shown to the planner with the disrupted taint) is not planned
    again by expiration, repair, liveness or NodePool deletion: each pass would otherwise start its
    command again the moment the previous one closed, and count its pods' capacity twice."""
    b = ClusterBuilder()
    held = [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]
    pool_of(b, 9)
    b.node("expired", age=timedelta(days=40), taints=held)
    b.node("sick", ready=False, ready_for=timedelta(hours=1), taints=held)
    b.node("stuck", age=timedelta(minutes=20), ready=False, initialized=False, taints=held)
    old = b.nodepool("old")
    old["metadata"]["deletionTimestamp"] = "2026-11-22T09:00:00Z"
    b.node("leaving", pool="old", taints=held)
    assert run(b).commands == []


def test_an_initialized_node_annotated_do_not_repair_is_left_alone_and_says_why():
    """karpflow's karpenter.sh/do-not-repair: the taint refused the repair, but the planner
    planned it again every pass."""
    b = ClusterBuilder()
    pool_of(b, 9)
    sick = b.node("sick", ready=False, ready_for=timedelta(minutes=31))
    sick["metadata"].setdefault("annotations", {})["karpenter.sh/do-not-repair"] = "true"
    result = run(b)
    assert result.commands == []
    (blocked,) = [b for b in result.blocked if b.node == "sick"]
    said = [blocked.reason, *(str(d) for d in blocked.details)]
    assert any("annotated karpenter.sh/do-not-repair: no repair" in s for s in said), said
