"""The invariant checker's MaintenanceWindow and NodeDisruptionBudget rules, fed by hand."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from api import constants as k
from sim.invariants import InvariantBounds, InvariantChecker
from sim.timescale import TimeScale

THURSDAY_10 = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)


class Wall:
    def __init__(self) -> None:
        self.now = THURSDAY_10

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def wall() -> Wall:
    return Wall()


@pytest.fixture
def checker(wall: Wall) -> InvariantChecker:
    bounds = InvariantBounds(min_wall=0, window_grace=30, window_min_wall=0)
    return InvariantChecker("c1", scale=TimeScale(1.0), bounds=bounds, wall=wall)


def node(name: str, pool: str = "blue", *, ready: bool = True, role: str | None = None) -> dict:
    labels = {"karpenter.sh/nodepool": pool, k.INITIALIZED_LABEL: "true"}
    if role:
        labels["role"] = role
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {}},
        "spec": {"providerID": f"aws:///us-west-2a/i-{name}"},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def tainted(obj: dict, holder: str | None, *, deleting: bool = False) -> dict:
    out = copy.deepcopy(obj)
    out["spec"]["taints"] = [{"key": k.DISRUPTED_TAINT_KEY, "effect": "NoSchedule"}]
    if holder is not None:
        out["metadata"]["annotations"]["karpflow.io/disruption-command"] = f"{holder}@run-1"
    if deleting:
        out["metadata"]["deletionTimestamp"] = "2026-01-01T09:59:00Z"
    return out


def start(checker: InvariantChecker, obj: dict, holder: str | None, **kwargs) -> None:
    checker.observe("MODIFIED", tainted(obj, holder, **kwargs))


def window(name: str, actions: list[str], schedules=None, selector=None) -> dict:
    spec: dict = {"actions": actions}
    if schedules:
        spec["schedules"] = schedules
    if selector:
        spec["selector"] = selector
    return {"kind": "MaintenanceWindow", "metadata": {"name": name}, "spec": spec}


def ndb(name: str, **spec) -> dict:
    return {"kind": "NodeDisruptionBudget", "metadata": {"name": name}, "spec": spec}


def found(checker: InvariantChecker, invariant: str) -> list[str]:
    return [v.subject for v in checker.check().violations if v.invariant == invariant]


BLUE = [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["blue"]}]
MORNINGS = [{"cron": "0 9 * * *", "duration": "2h"}]


# --- maintenance-window ---------------------------------------------------------------------------


def test_a_start_that_a_matching_active_window_blocks_is_a_violation(checker, wall):
    checker.observe("ADDED", window("mornings", ["Consolidation"], MORNINGS, BLUE))
    wall.now += timedelta(minutes=5)
    for name, pool in (("a", "blue"), ("b", "green")):
        checker.observe("ADDED", node(name, pool))
    start(checker, node("a"), "disruption/blue/Underutilized/abc")
    start(checker, node("b", "green"), "disruption/green/Underutilized/def")
    (violation,) = checker.check().violations
    assert (violation.invariant, violation.subject) == ("maintenance-window", "node a")
    assert (
        "Consolidation started (disruption/blue/Underutilized/abc@run-1) while MaintenanceWindow mornings"
        in (violation.message)
    )


def test_other_actions_closed_windows_and_interruptions_are_not_violations(checker, wall):
    checker.observe("ADDED", window("mornings", ["Consolidation", "Expiration"], MORNINGS, BLUE))
    wall.now += timedelta(minutes=5)
    checker.observe("ADDED", node("a"))
    start(checker, node("a"), "disruption/blue/Drifted/abc")  # Drift: not blocked
    checker.observe("MODIFIED", node("a"))
    start(checker, node("a"), "interruption/i-a")  # interruption: never blocked
    checker.observe("MODIFIED", node("a"))
    wall.now = datetime(2026, 1, 1, 11, 0, tzinfo=UTC)  # the window has closed
    start(checker, node("a"), "disruption/blue/Expired/abc")
    assert found(checker, "maintenance-window") == []


def test_a_start_just_after_a_window_opened_is_within_grace(checker, wall):
    wall.now = datetime(2026, 1, 1, 8, 0, tzinfo=UTC)
    checker.observe("ADDED", window("mornings", ["Expiration"], MORNINGS, BLUE))
    wall.now = datetime(2026, 1, 1, 9, 0, 10, tzinfo=UTC)  # 10 s after the cron hit, grace is 30 s
    checker.observe("ADDED", node("a"))
    start(checker, node("a"), "disruption/blue/Expired/abc")
    assert found(checker, "maintenance-window") == []
    checker.observe("MODIFIED", node("a"))
    wall.now = datetime(2026, 1, 1, 9, 1, tzinfo=UTC)
    start(checker, node("a"), "disruption/blue/Expired/abc")
    assert found(checker, "maintenance-window") == ["node a"]


def test_an_unscheduled_window_blocks_from_when_it_appears_and_a_broken_one_everything(checker, wall):
    checker.observe("ADDED", node("a"))
    checker.observe("ADDED", window("pause", ["Drift"]))
    start(checker, node("a"), "disruption/blue/Drifted/abc")  # the pause was created this instant
    assert found(checker, "maintenance-window") == []
    checker.observe("MODIFIED", node("a"))
    checker.observe("DELETED", window("pause", ["Drift"]))
    checker.observe("ADDED", window("typo", ["Consolidaton"]))
    wall.now += timedelta(minutes=1)
    start(checker, node("a"), "disruption/blue/Empty/abc")
    assert found(checker, "maintenance-window") == ["node a"]


# --- node-disruption-budget -----------------------------------------------------------------------


def ingress(checker: InvariantChecker, count: int = 3) -> list[dict]:
    nodes = [node(f"in-{i}", role="ingress") for i in range(count)]
    for obj in nodes:
        checker.observe("ADDED", obj)
    checker.observe("ADDED", ndb("ingress", selector={"matchLabels": {"role": "ingress"}}, maxUnavailable=1))
    return nodes


def test_a_voluntary_start_past_the_budget_is_a_violation(checker):
    nodes = ingress(checker)
    start(checker, nodes[0], "disruption/blue/Drifted/a")
    assert found(checker, "node-disruption-budget") == []
    start(checker, nodes[1], "disruption/blue/Drifted/b")
    (violation,) = [v for v in checker.check().violations if v.invariant == "node-disruption-budget"]
    assert violation.subject == "node in-1"
    assert "allowed 1 unavailable of 3 and 2 are (in-0, in-1)" in violation.message


def test_forceful_work_counts_but_is_never_a_violation(checker):
    nodes = ingress(checker)
    start(checker, nodes[0], "interruption/i-in-0")
    start(checker, nodes[1], "disruption/blue/Expired/x")
    assert found(checker, "node-disruption-budget") == []
    start(checker, nodes[2], "disruption/blue/Empty/y")  # voluntary, while two are already down
    assert found(checker, "node-disruption-budget") == ["node in-2"]


def test_notready_nodes_count_and_unselected_nodes_do_not(checker):
    nodes = ingress(checker)
    checker.observe("MODIFIED", node("in-0", role="ingress", ready=False))
    checker.observe("ADDED", node("web-0"))
    start(checker, node("web-0"), "disruption/blue/Drifted/w")
    assert found(checker, "node-disruption-budget") == []
    start(checker, nodes[1], "disruption/blue/Drifted/b")
    assert found(checker, "node-disruption-budget") == ["node in-1"]


def test_a_termination_without_holder_is_not_judged_but_reported(checker):
    nodes = ingress(checker)
    start(checker, nodes[0], None, deleting=True)
    start(checker, nodes[1], None, deleting=True)
    report = checker.check()
    assert report.ok
    (line,) = report.unjudged["node-disruption-budget"]
    assert line.startswith("node in-1: a termination without a holder started while NodeDisruptionBudget")


@pytest.mark.parametrize(
    "spec",
    [
        {"selector": {"matchLabels": {"role": "ingress"}}, "maxUnavailable": 1, "minAvailable": 1},
        {"selector": {"matchLabels": {"role": "ingress"}}, "maxUnavailable": "150%"},
    ],
)
def test_a_broken_budget_allows_nothing(checker, spec):
    checker.observe("ADDED", node("in-0", role="ingress"))
    checker.observe("ADDED", ndb("bad", **spec))
    start(checker, node("in-0", role="ingress"), "disruption/blue/Empty/a")
    assert found(checker, "node-disruption-budget") == ["node in-0"]


@pytest.mark.parametrize("selector", [None, {}])
def test_a_null_or_empty_selector_selects_nothing(checker, selector):
    checker.observe("ADDED", node("in-0", role="ingress"))
    checker.observe("ADDED", ndb("none", selector=selector, maxUnavailable=0))
    start(checker, node("in-0", role="ingress"), "disruption/blue/Empty/a")
    assert found(checker, "node-disruption-budget") == []


def test_the_report_counts_what_it_watches(checker):
    ingress(checker)
    checker.observe("ADDED", window("w", ["Drift"]))
    observed = checker.check().observed
    assert (observed["maintenance-windows"], observed["node-disruption-budgets"]) == (1, 1)


def test_the_reason_is_read_from_a_cluster_scoped_command_id_too():
    from sim.invariants import disruption_reason

    def held_by(holder: str) -> dict:
        return {"metadata": {"annotations": {"karpflow.io/disruption-command": holder}}}

    assert disruption_reason(held_by("disruption/prod/blue+green/Underutilized/abc@r1")) == "Underutilized"
    assert disruption_reason(held_by("disruption/blue/Drifted/abc@r1")) == "Drifted"
    assert disruption_reason(held_by("interruption/prod/i-1/spot@r1")) == "Interrupted"


def manual(obj: dict, holder: str = "termination/c1/in-1/uid-1") -> dict:
    out = tainted(obj, holder, deleting=True)
    out["metadata"]["annotations"]["karpflow.io/disruption-reason"] = "Manual"
    return out


def test_a_kubectl_delete_past_the_budget_is_judged_from_its_holder(checker):
    """Phase 2: the termination of `kubectl delete node` names itself holder with reason Manual, so
    the checker judges it like a voluntary disruption instead of listing it as unjudged."""
    nodes = ingress(checker)
    start(checker, nodes[0], "disruption/blue/Drifted/a")
    checker.observe("MODIFIED", manual(nodes[1]))
    report = checker.check()
    assert [v.subject for v in report.violations if v.invariant == "node-disruption-budget"] == ["node in-1"]
    assert "Manual disruption (termination/c1/in-1/uid-1@run-1)" in report.violations[0].message
    assert "node-disruption-budget" not in report.unjudged


def test_repair_of_a_node_already_down_takes_nothing_away(checker):
    nodes = ingress(checker)
    start(checker, nodes[0], "disruption/blue/Drifted/a")
    sick = node("in-1", role="ingress", ready=False)
    checker.observe("MODIFIED", sick)
    start(checker, sick, "disruption/blue/Unhealthy/r")  # NotReady before: nothing more is down
    assert found(checker, "node-disruption-budget") == []
    start(checker, nodes[2], "disruption/blue/Unhealthy/s")  # a Ready node repaired past the budget
    assert found(checker, "node-disruption-budget") == ["node in-2"]


def test_an_expiration_a_window_deferred_is_governed_by_budgets(checker):
    nodes = ingress(checker)
    start(checker, nodes[0], "disruption/blue/Drifted/a")
    deferred = copy.deepcopy(nodes[1])
    deferred["metadata"]["annotations"]["karpflow.io/expiration-deferred"] = "2026-01-01T08:00:00Z"
    checker.observe("MODIFIED", deferred)
    start(checker, deferred, "disruption/blue/Expired/e")
    assert found(checker, "node-disruption-budget") == ["node in-1"]


def test_the_rebalance_replacement_is_the_rebalance_action(checker, wall):
    from sim.invariants import disruption_reason

    checker.observe("ADDED", window("no-rebalance", ["Rebalance"]))
    wall.now += timedelta(minutes=5)
    checker.observe("ADDED", node("a"))
    held = tainted(node("a"), "interruption/c1/i-a/rebalance")
    held["metadata"]["annotations"]["karpflow.io/disruption-reason"] = "Drifted"
    assert disruption_reason(held) == "Rebalance"
    checker.observe("MODIFIED", held)
    assert found(checker, "maintenance-window") == ["node a"]
