"""What the operator's verbs show, without servers: `karpflow status` keeps only what is still true
when it runs, and `karpflow disrupt` plans with in-flight nodes held out as the controller does and
names the command that holds each one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.in_flight import InFlight
from api.controller_io import Backoff, ControllerStatus, ControllerStopped
from planner.catalog import bundled_catalog
from planner.cli import with_held_tainted
from planner.model import PlanOptions
from planner.plan import plan
from planner.snapshot import Snapshot
from planner.why_not import in_flight_reason
from runtime.controller_cli import ControllerRun, current
from runtime.disrupt_cli import also_disrupted, choose
from sim.cluster_builder import ClusterBuilder

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def flying(holders: dict[str, tuple[str, str]]) -> InFlight:
    found = InFlight()
    found.holders = dict(holders)
    found.ids = sorted({workflow_id for workflow_id, _ in holders.values()})
    return found


def last_pass() -> ControllerStatus:
    return ControllerStatus(
        cluster="c",
        passes=155,
        last_pass_at=NOW - timedelta(minutes=5),
        in_flight=["disruption/c/default/Empty/done", "disruption/c/default/Drifted/going"],
        blocked={
            "a": "disruption in progress: disruption/c/default/Empty/done",
            "b": in_flight_reason("disruption/c/default/Drifted/going", "AwaitingApproval"),
            "c": "pod default/web has karpenter.sh/do-not-disrupt",
        },
        backoffs=[
            Backoff(nodepool="default", reason="Empty", failures=1, until=NOW - timedelta(seconds=1)),
            Backoff(nodepool="gpu", reason="Drifted", failures=2, until=NOW + timedelta(minutes=2)),
        ],
        validating=["disruption/c/default/Underutilized/x"],
        quiet=True,
    )


def test_status_keeps_only_what_still_holds_when_it_runs():
    now = flying({"b": ("disruption/c/default/Drifted/going", "Tainting")})
    shown = current(last_pass(), ControllerRun(state="running", workflow_id="k"), now, NOW)
    assert shown.in_flight == ["disruption/c/default/Drifted/going"]  # the completed one is gone
    assert set(shown.blocked) == {"b", "c"}  # a's holder finished: the next pass tells
    assert shown.blocked["b"] == "disruption in progress: disruption/c/default/Drifted/going"  # its phase now
    assert [b.nodepool for b in shown.backoffs] == ["gpu"]  # default's backoff is over
    assert shown.validating == ["disruption/c/default/Underutilized/x"] and shown.quiet


def test_a_stopped_controller_validates_nothing_and_is_not_quiet():
    stopped = ControllerRun(
        state="stopped", workflow_id="k", stopped=ControllerStopped(reason="maint", by="ops", at=NOW)
    )
    shown = current(last_pass(), stopped, flying({}), NOW)
    assert shown.validating == [] and not shown.quiet and shown.in_flight == []
    assert shown.stopping.startswith("stopped by ops at 2026-12-01 12:00:00: maint")
    assert "running" not in stopped.line() and "working" not in stopped.line()


def two_empty_nodes() -> ClusterBuilder:
    b = ClusterBuilder(now=NOW)
    b.nodeclass()
    b.nodepool("default", budgets=[{"nodes": "100%"}])
    b.node("held")
    b.node("free")
    return b


def test_disrupt_holds_out_a_node_a_running_command_holds_and_names_that_command():
    b = two_empty_nodes()
    holders = {"held": ("disruption/c/default/Empty/by-hand", "AwaitingApproval")}
    snapshot = Snapshot.from_objects(with_held_tainted(b.objects, set(holders)), now=NOW)
    result = plan(snapshot, bundled_catalog("us-west-2"), PlanOptions(all_methods=True))
    commands, left = choose(result, ("held", "free"), False, flying(holders))
    assert [c.nodes for c in commands] == [["free"]]
    assert left == [
        "held: Disruption disruption/c/default/Empty/by-hand waits for approval "
        "(`karpflow approve disruption/c/default/Empty/by-hand` or "
        "`karpflow reject disruption/c/default/Empty/by-hand`); nothing new started for it"
    ]
    assert not any(t.get("key") for t in b.objects[-1]["spec"].get("taints") or [])  # the input untouched


def test_disrupt_without_the_in_flight_view_would_give_the_held_node_a_second_command():
    """The old behaviour, kept as a witness: the plan alone knows nothing of a command that waits
    for approval (its node is not tainted yet)."""
    b = two_empty_nodes()
    result = plan(
        Snapshot.from_objects(b.objects, now=NOW), bundled_catalog("us-west-2"), PlanOptions(all_methods=True)
    )
    commands, _ = choose(result, ("held",), False)
    assert commands and "held" in commands[0].nodes


def test_the_nodes_a_command_takes_beyond_those_named_are_listed():
    class Command:
        nodes = ["a", "b"]

    assert also_disrupted([Command()], ["a"]) == ["b"]
    assert also_disrupted([Command()], ["a", "b"]) == []
