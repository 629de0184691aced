"""The cluster-health breaker (issue 35 item 5; planner/health_breaker.py): voluntary disruption
waits while the cluster is sick, forceful methods go on, and it lifts on its own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from planner.health_breaker import cluster_health
from planner.model import PlanOptions
from planner.plan import plan, validate_command
from sim.cluster_builder import ClusterBuilder

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
STALE = {"karpenter.sh/nodepool-hash": "stale"}


def cluster(*, unready: int = 0, nodes: int = 10, pending: int = 0, pending_age=timedelta(hours=1)):
    """`nodes` nodes of pool default, the first `unready` NotReady for an hour; one drifted node
    with a pod, one empty node; `pending` pods pending for `pending_age`."""
    b = ClusterBuilder(now=NOW)
    b.nodepool("default", budgets=[{"nodes": "100%"}])
    for i in range(nodes):
        b.node(f"n-{i}", ready=i >= unready)
        b.pod(f"app-{i}", f"n-{i}", cpu="100m")
    b.node("drifted", annotations=STALE)
    b.pod("web", "drifted", cpu="100m")
    b.node("empty")
    for i in range(pending):
        b.pod(f"pending-{i}", None, cpu="100m", age=pending_age)
    return b


def methods(result) -> set[str]:
    return {c.method for c in result.commands}


@pytest.mark.parametrize(
    ("unready", "nodes", "open_"),
    [
        # Cluster Autoscaler's rule: more than 3 (--ok-total-unready-count) AND more than 45 %.
        (3, 4, False),  # 3 of 6 counted: 50 %, but not more than 3
        (4, 4, True),  # 4 of 6: 67 %
        (4, 10, False),  # 4 of 12: 33 %
        (6, 10, True),  # 6 of 12: 50 %
    ],
)
def test_the_breaker_opens_by_cluster_autoscalers_unready_rule(unready, nodes, open_):
    health = cluster_health(cluster(unready=unready, nodes=nodes).snapshot(), PlanOptions())
    assert health.open is open_, health
    assert health.unready == unready and health.nodes == nodes + 2


def test_an_open_breaker_holds_voluntary_methods_and_says_why():
    b = cluster(unready=6)
    healthy = plan(cluster().snapshot(), b.catalog, PlanOptions(all_methods=True))
    assert {"emptiness", "drift"} <= methods(healthy) and healthy.breaker == ""
    sick = plan(b.snapshot(), b.catalog, PlanOptions(all_methods=True))
    assert sick.breaker == "6 of 12 nodes NotReady (more than 3 and 45%)"
    assert not methods(sick) & {"emptiness", "drift", "multi-node-consolidation", "single-node-consolidation"}
    reasons = {x.node: x.reason for x in sick.blocked}
    assert reasons["empty"] == (
        "cluster-health breaker open (6 of 12 nodes NotReady (more than 3 and 45%)): "
        "Emptiness waits until the cluster recovers"
    )
    assert reasons["drifted"].endswith("Drift waits until the cluster recovers")


def test_forceful_methods_go_on_while_the_breaker_is_open():
    b = cluster(unready=6)
    b.node("old", age=timedelta(days=40))  # expireAfter 720h
    sick = plan(b.snapshot(), b.catalog, PlanOptions(all_methods=True))
    assert sick.breaker and "expiration" in methods(sick)


def test_starting_nodes_and_nodes_being_taken_away_do_not_count():
    b = cluster(nodes=6)
    for i in range(4):  # launched 5 minutes ago, not Ready yet: starting, as CA's NotStarted
        b.node(f"new-{i}", ready=False, age=timedelta(minutes=5))
    for i in range(4):  # karpflow is draining them
        b.node(
            f"leaving-{i}", ready=False, taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]
        )
    health = cluster_health(b.snapshot(), PlanOptions())
    assert not health.open and health.unready == 0


@pytest.mark.parametrize(
    ("pending", "age", "open_"),
    [
        (101, timedelta(minutes=11), True),
        (100, timedelta(minutes=11), False),
        (500, timedelta(minutes=9), False),
    ],
)
def test_pods_pending_too_long_open_the_breaker(pending, age, open_):
    health = cluster_health(cluster(pending=pending, pending_age=age).snapshot(), PlanOptions())
    assert health.open is open_
    if open_:
        assert health.describe() == "101 pods pending for more than 10 min (more than 100)"


def test_the_breaker_can_be_turned_off_or_tuned():
    sick = cluster(unready=6).snapshot()
    assert not cluster_health(sick, PlanOptions(breaker=False)).open
    assert not cluster_health(sick, PlanOptions(breaker_max_unready=0.6)).open
    few_pending = cluster(pending=5).snapshot()
    assert cluster_health(few_pending, PlanOptions(breaker_max_pending_pods=4)).open
    assert not cluster_health(few_pending, PlanOptions(breaker_max_pending_pods=0)).open


def test_a_command_planned_while_healthy_fails_validation_once_the_breaker_opens_and_passes_after():
    healthy = cluster()
    (command,) = [c for c in plan(healthy.snapshot(), healthy.catalog).commands if c.method == "emptiness"]
    sick = cluster(unready=6)
    verdict = validate_command(sick.snapshot(), sick.catalog, command)
    assert not verdict.valid and "cluster-health breaker open" in verdict.reason
    assert validate_command(healthy.snapshot(), healthy.catalog, command).valid


def test_karpflow_status_shows_an_open_breaker_like_a_pause():
    from io import StringIO

    from rich.console import Console

    from api.controller_io import ControllerStatus
    from runtime.controller_cli import render

    out = StringIO()
    render(
        ControllerStatus(cluster="c", breaker="6 of 12 nodes NotReady (more than 3 and 45%)"),
        Console(file=out, width=200),
    )
    assert "paused by the cluster-health breaker: 6 of 12 nodes NotReady" in out.getvalue()
    closed = StringIO()
    render(ControllerStatus(cluster="c"), Console(file=closed, width=200))
    assert "breaker" not in closed.getvalue()
