"""Interruption decided on a snapshot (planner/interruption.py): spot replacements from the
scheduling simulation, and the rebalance budget from the planner's own budget map."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.planning import without_offerings
from api.controller_io import OfferingUnavailable
from planner.interruption import rebalance_block, rebalance_budget, spot_replacements
from planner.maintenance_windows import pause_window
from planner.rate_budgets import RecentDisruption
from sim.cluster_builder import ClusterBuilder

SPOT_POOL = [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]}]
ZONE_A = {"topology.kubernetes.io/zone": "us-west-2a"}
RECLAIMED = ("m5.large", "us-west-2a", "spot")


def reclaimed_catalog(b: ClusterBuilder):
    gone = OfferingUnavailable(
        instance_type="m5.large",
        zone="us-west-2a",
        capacity_type="spot",
        until=datetime.now(UTC) + timedelta(minutes=3),
        reason="spot interruption",
    )
    return without_offerings(b.catalog, [gone], b.now)


def interrupted_cluster(pinned: bool) -> ClusterBuilder:
    b = ClusterBuilder()
    b.nodepool("default", requirements=SPOT_POOL)
    b.node("spot-a", zone="us-west-2a", capacity_type="spot")
    b.pod("web-1", "spot-a", cpu="1500m", spec={"nodeSelector": ZONE_A} if pinned else None)
    b.node("full-b", zone="us-west-2b")
    b.pod("busy-1", "full-b", cpu="1800m")
    return b


def test_a_zone_pinned_pod_gets_a_replacement_in_its_zone_never_on_the_reclaimed_offering():
    b = interrupted_cluster(pinned=True)
    (replacement,) = spot_replacements(b.snapshot(), reclaimed_catalog(b), "spot-a", RECLAIMED)
    assert replacement.nodepool == "default" and replacement.pods == 1
    assert replacement.offerings and RECLAIMED not in replacement.offerings
    assert {zone for _, zone, _ in replacement.offerings} == {"us-west-2a"}
    # Spot first, cheapest first; on-demand after, as the NodePool allows it.
    capacity = [ct for _, _, ct in replacement.offerings]
    assert capacity == sorted(capacity, key=lambda ct: ct != "spot") and "on-demand" in capacity


def test_pods_that_fit_on_the_other_nodes_need_no_replacement():
    b = interrupted_cluster(pinned=False)
    b.node("roomy-b", zone="us-west-2b", instance_type="m5.2xlarge")
    assert spot_replacements(b.snapshot(), reclaimed_catalog(b), "spot-a", RECLAIMED) == []


def test_a_pool_that_allows_spot_only_gets_no_on_demand_fallback():
    b = interrupted_cluster(pinned=True)
    b.nodepool("default", requirements=[{**SPOT_POOL[0], "values": ["spot"]}])
    (replacement,) = spot_replacements(b.snapshot(), reclaimed_catalog(b), "spot-a", RECLAIMED)
    assert {ct for _, _, ct in replacement.offerings} == {"spot"}


def test_the_rebalance_budget_counts_disrupting_nodes_as_the_planner_does():
    """One definition of "disrupting" (planner/budgets.py): a NotReady node consumes the budget,
    and an uninitialized node does not count toward a percentage."""
    b = ClusterBuilder()
    b.nodepool("default", budgets=[{"nodes": "1"}])
    b.node("a")
    b.node("b")
    assert rebalance_budget(b.snapshot(), "a") == (True, "")
    b.node("sick", ready=False)
    allowed, why = rebalance_budget(b.snapshot(), "a")
    assert not allowed and "1 of 3 disrupting" in why

    b = ClusterBuilder()
    b.nodepool("default", budgets=[{"nodes": "50%"}])
    b.node("a")
    for i in range(3):
        b.node(f"booting-{i}", initialized=False, ready=False, age=timedelta(minutes=1))
    # 50 % of the 1 initialized node rounds up to 1, and booting nodes are not disrupting ones.
    assert rebalance_budget(b.snapshot(), "a") == (True, "")


def test_a_rebalance_replacement_passes_the_gate_a_pass_applies_to_a_voluntary_candidate():
    """Issue 30 item 6: the rebalance check read only the pool's concurrency budgets: a pause of the
    controller (a window of every pass) and a rate budget used up let a proactive replacement start."""
    b = ClusterBuilder()
    b.nodepool("default", budgets=[{"nodes": "100%"}, {"nodes": "1", "per": "1h"}])
    b.node("a")
    b.node("b")
    assert rebalance_block(b.snapshot(), "a") is None

    paused = b.snapshot()
    paused.maintenance_windows["pause/global"] = pause_window("pause/global", "everything by ops: incident")
    why = rebalance_block(paused, "a")
    assert why is not None and why.startswith("paused (everything by ops: incident)"), why
    # A pause of one action covers that action only: Rebalance is its own.
    drift_only = b.snapshot()
    drift_only.maintenance_windows["pause/action/Drift"] = pause_window(
        "pause/action/Drift", "Drift", "Drift"
    )
    assert rebalance_block(drift_only, "a") is None

    rated = b.snapshot()
    rated.recent_disruptions = [
        RecentDisruption("gone", "default", "Expired", rated.now - timedelta(minutes=5))
    ]
    why = rebalance_block(rated, "a")
    assert why is not None and "rate budget for Drifted is used up" in why, why

    b.node_disruption_budget(
        "all", selector={"matchLabels": {"karpenter.sh/nodepool": "default"}}, max_unavailable=0
    )
    why = rebalance_block(b.snapshot(), "a")
    assert why is not None and "NodeDisruptionBudget all allows 0" in why, why
