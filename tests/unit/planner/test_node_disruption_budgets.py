"""NodeDisruptionBudgets: selection, availability, PDB arithmetic, fail-closed reading, and what a
pass does with them (docs/operator-controls.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from planner.model import PlanOptions
from planner.node_disruption_budgets import read_ndb, statuses
from planner.plan import plan
from planner.plan import validate_command as validate
from sim.cluster_builder import ClusterBuilder

INGRESS = {"matchLabels": {"role": "ingress"}}
DISRUPTED = [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]


def ndb(spec: dict, name: str = "ingress") -> dict:
    return {
        "apiVersion": "karpflow.dev/v1alpha1",
        "kind": "NodeDisruptionBudget",
        "metadata": {"name": name},
        "spec": spec,
    }


def status_of(b: ClusterBuilder):
    snapshot = b.snapshot()
    (status,) = statuses(snapshot.node_disruption_budgets.values(), snapshot.nodes.values())
    return status


def ingress_nodes(b: ClusterBuilder, count: int, **kwargs) -> None:
    for i in range(count):
        b.node(f"in-{i}", labels={"role": "ingress"}, **kwargs)


# --- The rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "allowed"),
    [
        ({"maxUnavailable": 1}, 1),
        ({"maxUnavailable": "25%"}, 2),  # 25 % of 5 is 1.25: rounded up, as a PDB's
        ({"minAvailable": 3}, 2),
        ({"minAvailable": "50%"}, 2),  # 3 must stay available
        ({"minAvailable": "100%"}, 0),
        ({"maxUnavailable": 0}, 0),
    ],
)
def test_allowed_unavailable_follows_pod_disruption_budget_arithmetic(spec, allowed):
    b = ClusterBuilder()
    b.nodepool("default")
    ingress_nodes(b, 5)
    b.node("other")
    b.add(ndb({"selector": INGRESS, **spec}))
    status = status_of(b)
    assert status.selected == [f"in-{i}" for i in range(5)]
    assert (status.allowed, status.remaining) == (allowed, allowed)


def test_notready_deleting_and_disrupted_nodes_are_unavailable():
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("in-ok", labels={"role": "ingress"})
    b.node("in-notready", labels={"role": "ingress"}, ready=False)
    b.node("in-deleting", labels={"role": "ingress"}, deleting=True)
    b.node("in-tainted", labels={"role": "ingress"}, taints=DISRUPTED)
    b.node("other", taints=DISRUPTED)
    b.add(ndb({"selector": INGRESS, "maxUnavailable": 4}))
    status = status_of(b)
    assert status.unavailable == ["in-deleting", "in-notready", "in-tainted"]
    assert status.remaining == 1


@pytest.mark.parametrize("selector", [None, {}, {"matchLabels": {}}])
def test_a_null_or_empty_selector_selects_no_node(selector):
    b = ClusterBuilder()
    b.nodepool("default")
    ingress_nodes(b, 2)
    b.add(ndb({"selector": selector, "maxUnavailable": 0}))
    assert status_of(b).selected == []


@pytest.mark.parametrize(
    ("spec", "every_node"),
    [
        ({"selector": INGRESS, "minAvailable": 1, "maxUnavailable": 1}, False),  # both
        ({"selector": INGRESS}, False),  # neither
        ({"selector": INGRESS, "maxUnavailable": "120%"}, False),
        ({"selector": INGRESS, "maxUnavailable": -1}, False),
        (
            {"selector": {"matchExpressions": [{"key": "role", "operator": "Near"}]}, "maxUnavailable": 1},
            True,
        ),
    ],
)
def test_a_broken_budget_allows_nothing_for_what_it_selects(spec, every_node):
    budget = read_ndb(ndb(spec))
    assert budget.broken and budget.allowed_unavailable(10) == 0
    assert budget.selects({"role": "ingress"})
    assert budget.selects({"role": "web"}) == every_node


def test_a_broken_budget_is_a_problem_of_the_snapshot():
    b = ClusterBuilder()
    b.add(ndb({"selector": INGRESS, "minAvailable": 1, "maxUnavailable": 1}))
    (problem,) = b.snapshot().problems
    assert problem == (
        "NodeDisruptionBudget ingress: spec: exactly one of minAvailable and maxUnavailable must be set "
        "(it fails closed: allows nothing for the nodes it selects)"
    )


# --- A planning pass ------------------------------------------------------------------------------


def empty_ingress(count: int = 4, **budget) -> ClusterBuilder:
    b = ClusterBuilder()
    b.nodepool("default", budgets=[{"nodes": "100%"}])
    ingress_nodes(b, count)
    b.add(ndb({"selector": INGRESS, **(budget or {"maxUnavailable": 1})}))
    return b


def test_voluntary_commands_take_only_what_the_budget_allows():
    result = plan(empty_ingress().snapshot(), empty_ingress().catalog)
    (command,) = result.commands
    assert (command.method, command.nodes) == ("emptiness", ["in-0"])
    reasons = {x.node: x.reason for x in result.blocked}
    assert reasons["in-1"] == (
        "NodeDisruptionBudget ingress allows 0 (maxUnavailable 1; 1 of 4 selected nodes unavailable)"
    )


def test_in_flight_nodes_use_up_the_budget():
    b = empty_ingress()
    b.objects[1]["spec"]["taints"] = DISRUPTED  # in-0: a command in flight holds it
    result = plan(b.snapshot(), b.catalog)
    assert result.commands == []
    assert {x.node: x.reason for x in result.blocked}["in-1"].startswith(
        "NodeDisruptionBudget ingress allows 0"
    )


def test_forceful_commands_are_never_stopped_but_count():
    b = ClusterBuilder()
    b.nodepool("default", expire_after="24h", budgets=[{"nodes": "100%"}])
    b.node("in-old-1", labels={"role": "ingress"}, age=timedelta(hours=30))
    b.node("in-old-2", labels={"role": "ingress"}, age=timedelta(hours=30))
    b.node("in-empty", labels={"role": "ingress"}, age=timedelta(hours=1))
    b.add(ndb({"selector": INGRESS, "maxUnavailable": 1}))
    result = plan(b.snapshot(), b.catalog)
    # both expire although the budget allows one; the empty node then finds no room
    assert sorted((c.method, tuple(c.nodes)) for c in result.commands) == [
        ("expiration", ("in-old-1",)),
        ("expiration", ("in-old-2",)),
    ]
    assert {x.node: x.reason for x in result.blocked}["in-empty"].startswith(
        "NodeDisruptionBudget ingress allows 0"
    )


def test_a_replace_that_does_not_fit_is_dropped_and_the_next_method_may_act():
    b = ClusterBuilder()
    b.nodepool("default", budgets=[{"nodes": "100%"}])
    for i in range(3):
        b.node(f"in-{i}", instance_type="m5.xlarge", labels={"role": "ingress"})
        b.pod(f"web-{i}", f"in-{i}", cpu="200m", memory="256Mi")
    b.add(ndb({"selector": INGRESS, "maxUnavailable": 1}))
    result = plan(b.snapshot(), b.catalog, PlanOptions(all_methods=True))
    # multi-node consolidation replaces all three by one node: more than the budget allows, and a
    # replacement sized for three cannot be cut down; single-node consolidation then takes one
    (command,) = result.commands
    assert (command.method, len(command.nodes)) == ("single-node-consolidation", 1)
    (left,) = [x for x in result.blocked if x.node != command.nodes[0]][:1]
    assert left.details[0].method == "multi-node-consolidation"
    assert left.details[0].reason == (
        "NodeDisruptionBudget ingress allows 1 (maxUnavailable 1; 0 of 3 selected nodes unavailable), "
        "and a replace of 3 of its nodes cannot be cut: not started"
    )


def test_nodes_the_budget_does_not_select_are_not_limited():
    b = empty_ingress()
    for i in range(3):
        b.node(f"web-{i}")
    (command,) = plan(b.snapshot(), b.catalog).commands
    assert sorted(command.nodes) == ["in-0", "web-0", "web-1", "web-2"]


def test_validation_refuses_a_command_the_budget_no_longer_has_room_for():
    b = empty_ingress(count=3)
    (command,) = plan(b.snapshot(), b.catalog).commands
    b.objects[2]["spec"]["taints"] = DISRUPTED  # in-1 started disrupting meanwhile
    verdict = validate(b.snapshot(), b.catalog, command)
    assert not verdict.valid and "NodeDisruptionBudget ingress allows 0" in verdict.reason


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"metadata": [], "spec": "all"},
        {"metadata": {"name": "n"}, "spec": {"selector": "role=ingress", "maxUnavailable": 1}},
        {"metadata": {"name": "n"}, "spec": {"selector": {"matchLabels": []}, "maxUnavailable": {}}},
    ],
)
def test_any_object_reads_as_a_budget_that_allows_nothing(raw):
    budget = read_ndb(raw)
    assert budget.broken and budget.allowed_unavailable(5) == 0
