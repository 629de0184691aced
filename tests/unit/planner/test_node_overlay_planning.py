"""NodeOverlays in a planning pass: read from the snapshot, behind the NodeOverlay gate, their prices
deciding consolidation, Balanced's totals and the launch options, their capacity the simulation.
Karpenter's design (designs/node-overlay.md "Node Overlay Field Behavior and Consolidation
Integration"): overlaid prices are what consolidation compares; capacity overlays take effect
through the regular consolidation cycle."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from cli import main
from planner.balanced import pool_totals
from planner.candidates import node_price
from planner.model import PlanOptions
from planner.node_overlay import overlaid_catalog
from planner.plan import plan
from planner.why_not import Kind, kind_of
from sim.cluster_builder import ClusterBuilder

GATE = PlanOptions(node_overlay=True)
FUSE = "smarter-devices/fuse"


def overlay(name: str, requirements: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "karpenter.sh/v1alpha1",
        "kind": "NodeOverlay",
        "metadata": {"name": name},
        "spec": {"requirements": requirements, **spec},
    }


NOT_M5_2XLARGE = [{"key": "node.kubernetes.io/instance-type", "operator": "NotIn", "values": ["m5.2xlarge"]}]


def oversized() -> ClusterBuilder:
    """One on-demand m5.2xlarge holding one small pod, in an on-demand pool: single-node consolidation
    replaces it with a smaller type."""
    b = ClusterBuilder()
    b.nodepool(
        requirements=[{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]
    )
    b.node("big", instance_type="m5.2xlarge")
    b.pod("web-1", "big", cpu="500m", memory="512Mi")
    return b


def test_without_the_gate_overlays_are_read_and_ignored():
    b = oversized()
    b.add(overlay("dear", NOT_M5_2XLARGE, price="9"))
    snapshot = b.snapshot()
    assert list(snapshot.node_overlays) == ["dear"]
    result = plan(snapshot, b.catalog)
    assert [c.decision for c in result.commands] == ["replace"]
    assert result.node_overlays == []


def test_an_overlaid_price_keeps_a_node_that_would_be_replaced():
    # Every other type made dearer than the node: no replacement is cheaper, so nothing happens.
    b = oversized()
    b.add(overlay("dear", NOT_M5_2XLARGE, price="9"))
    result = plan(b.snapshot(), b.catalog, GATE)
    assert result.commands == []
    assert result.node_overlays == ["NodeOverlay dear: 70 instance type(s) in NodePool(s) default"]
    (blocked,) = result.blocked
    assert "cheaper" in blocked.reason, blocked.reason


def test_an_overlaid_discount_makes_a_replacement_the_launch_choice_and_is_named():
    # m5.large on-demand at 50 % off becomes the cheapest option the replacement launches first.
    b = oversized()
    b.add(
        overlay(
            "m5-discount",
            [
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large"]},
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            ],
            priceAdjustment="-90%",
        )
    )
    base = plan(b.snapshot(), b.catalog)
    overlaid = plan(b.snapshot(), b.catalog, GATE)
    assert base.commands[0].replacements[0].instance_types[0] != "m5.large"
    (command,) = overlaid.commands
    replacement = command.replacements[0]
    assert replacement.instance_types[0] == "m5.large"
    assert replacement.price == pytest.approx(
        b.catalog.types["m5.large"].price(b.catalog.zones[0], "on-demand") * 0.1
    )
    assert command.message.endswith("(prices from NodeOverlay m5-discount)")
    assert command.savings_per_hour_best > base.commands[0].savings_per_hour_best


def test_the_candidate_price_and_balanced_totals_are_the_overlaid_ones():
    # Karpenter's candidates and computeNodePoolTotals price nodes with the pool's instance types,
    # which the overlay decorator has overlaid (pkg/cloudprovider/overlay/cloudprovider.go).
    b = oversized()
    b.add(overlay("flat", [], price="1.5"))
    ctx = b.context(GATE)
    node = ctx.snapshot.nodes["big"]
    assert node_price(ctx, node) == 1.5
    assert pool_totals(ctx, ["default"])["default"].cost == 1.5
    assert node_price(b.context(), node) != 1.5


def fuse_cluster() -> ClusterBuilder:
    """A pod needing one `smarter-devices/fuse` (its device plugin reports it on the node) alone on an
    m5.2xlarge: only a replacement known to have the resource can take it."""
    b = oversized()
    node = b.objects[1]
    for field in ("capacity", "allocatable"):
        node["status"][field][FUSE] = "1"
    pod = b.objects[2]
    pod["spec"]["containers"][0]["resources"]["requests"][FUSE] = "1"
    return b


def test_overlaid_capacity_lets_the_simulation_place_an_extended_resource_on_a_replacement():
    b = fuse_cluster()
    assert plan(b.snapshot(), b.catalog, GATE).commands == []  # no catalog type has the resource
    b.add(
        overlay(
            "fuse",
            [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5"]}],
            capacity={FUSE: "1"},
        )
    )
    assert plan(b.snapshot(), b.catalog).commands == []  # the gate is off
    (command,) = plan(b.snapshot(), b.catalog, GATE).commands
    assert command.decision == "replace"
    assert all(t.startswith("m5.") for t in command.replacements[0].instance_types)


def test_an_overlay_only_for_another_pool_changes_nothing_here():
    b = fuse_cluster()
    b.add(
        overlay(
            "fuse-elsewhere",
            [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu"]}],
            capacity={FUSE: "1"},
        )
    )
    result = plan(b.snapshot(), b.catalog, GATE)
    assert result.commands == [] and result.node_overlays == []


def test_a_bad_or_conflicting_overlay_is_a_problem_of_the_plan_and_holds_consolidation_back():
    # Karpenter skips such an overlay and consolidates on (fails open, designs/node-overlay.md
    # "Misconfiguration"); karpflow reports it and moves no pods in the pools it may reach, since the
    # prices the user meant would decide the move (fails closed).
    b = oversized()
    b.add(overlay("both", [], price="1", priceAdjustment="+1"))
    b.add(overlay("x-first", [], price="9", weight=5))
    b.add(overlay("a-second", [], price="0.01", weight=5))
    result = plan(b.snapshot(), b.catalog, GATE)
    problems = [p for p in result.problems if p.startswith("NodeOverlay")]
    assert len(problems) == 2, problems
    assert problems[0].startswith("NodeOverlay both: spec: cannot set both 'price' and 'priceAdjustment'")
    assert problems[1].startswith("NodeOverlay a-second: conflicts with NodeOverlay x-first")
    assert result.commands == []
    (blocked,) = result.blocked
    assert blocked.reason == (
        "NodeOverlay both is not applied (it is invalid): consolidation waits, since prices decide it "
        "(fails closed)"
    )
    assert kind_of(blocked.reason) == Kind.NODE_OVERLAY


def test_a_conflict_holds_only_the_pools_the_overlay_reaches_and_empty_nodes_still_go():
    b = oversized()
    b.nodepool(
        "other",
        requirements=[{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}],
        budgets=[{"nodes": "100%"}],
    )
    b.node("idle", pool="other", instance_type="m5.large")
    b.node("busy", pool="other", instance_type="m5.2xlarge")
    b.pod("api-1", "busy", cpu="500m", memory="512Mi")
    only_default = [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["default"]}]
    b.add(overlay("x-first", only_default, price="9", weight=5))
    b.add(overlay("a-second", only_default, price="0.01", weight=5))
    result = plan(b.snapshot(), b.catalog, GATE.model_copy(update={"all_methods": True}))
    decided = {(c.method, tuple(c.nodes)) for c in result.commands}
    assert ("emptiness", ("idle",)) in decided
    assert any(nodes == ("busy",) for _, nodes in decided)  # the other pool consolidates
    reasons = {b.node: b.reason for b in result.blocked}
    assert reasons["big"].startswith(
        "NodeOverlay a-second is not applied (it conflicts with NodeOverlay x-first)"
    )


def test_the_optimal_strategy_launches_at_the_overlaid_prices():
    # karpflow's Optimal strategy reads the same pool views: its target fleet's launch options, its
    # moves' replacements and its ledger
    b = oversized()
    b.add(
        overlay(
            "m5-large-free",
            [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large"]}],
            price="0.001",
        )
    )
    optimal = GATE.model_copy(update={"consolidation_strategy": "Optimal"})
    (command,) = plan(b.snapshot(), b.catalog, optimal).commands
    assert command.method == "optimal-consolidation"
    (replacement,) = command.replacements
    assert replacement.instance_types[0] == "m5.large"
    assert replacement.price == pytest.approx(0.001)


def test_karpflow_plan_shows_what_each_overlay_changed_only_with_the_gate(tmp_path):
    b = oversized()
    b.add(
        overlay(
            "m5-large-free",
            [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large"]}],
            price="0.001",
        )
    )
    path = b.write(tmp_path / "cluster.yaml")

    def invoke(*args: str) -> str:
        at = ["--at", "2026-11-22T10:00:00Z"]
        result = CliRunner().invoke(
            main, ["plan", "--snapshot", str(path), *at, *args], env={"COLUMNS": "250"}
        )
        assert result.exit_code == 0, result.output
        return result.output

    assert "NodeOverlay" not in invoke()
    shown = invoke("--node-overlay")
    assert "NodeOverlay m5-large-free: 1 instance type(s) in NodePool(s) default" in shown
    assert "default: m5.large, t3.micro" in shown and "$0.0010" in shown  # the overlaid launch choice
    data = json.loads(invoke("--node-overlay", "-o", "json"))
    assert data["nodeOverlays"] == ["NodeOverlay m5-large-free: 1 instance type(s) in NodePool(s) default"]
    assert data["commands"][0]["message"].endswith("(prices from NodeOverlay m5-large-free)")


def test_a_pass_reuses_the_overlaid_catalog_until_an_overlay_or_a_pools_labels_change():
    b = oversized()
    b.add(overlay("flat", [], price="1.5"))
    first = b.snapshot()
    again = first.at(first.now)  # the next pass: the builder's same parsed overlays and pools
    assert overlaid_catalog(b.catalog, first)[0] is overlaid_catalog(b.catalog, again)[0]
    # a NodePool whose status (or anything but its name and template labels) changed: the same
    again.nodepools = {"default": first.nodepools["default"].model_copy(update={"status": None})}
    assert overlaid_catalog(b.catalog, first)[0] is overlaid_catalog(b.catalog, again)[0]
    b.objects[0]["spec"]["template"]["metadata"]["labels"] = {"team": "a"}
    relabelled = b.snapshot()
    relabelled.node_overlays = first.node_overlays
    assert overlaid_catalog(b.catalog, relabelled)[0] is not overlaid_catalog(b.catalog, first)[0]
    # a new overlay object (an edit): computed again
    assert overlaid_catalog(b.catalog, b.snapshot())[0] is not overlaid_catalog(b.catalog, first)[0]
