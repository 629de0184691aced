"""Validation of consolidation commands on a fresh snapshot (behaviour notes §1.7)."""

from __future__ import annotations

from planner.consolidation import MultiNodeConsolidation, SingleNodeConsolidation
from planner.model import PlanOptions
from planner.plan import command_out, plan, validate_command
from tests.unit.planner.sched_fixtures import (
    CATALOG,
    context,
    make_catalog,
    node,
    nodepool,
    pod,
    snapshot,
)


def planned(objects, method=None):
    """The consolidation command planned on `objects` (single-node unless a method is given)."""
    method = method or SingleNodeConsolidation()
    result = plan(snapshot(*objects), CATALOG, methods=[method])
    [command] = result.commands_
    return command


def validate(command, objects, catalog=CATALOG, method=None):
    return (method or SingleNodeConsolidation()).validate(context(snapshot(*objects), catalog), command)


DELETE_CLUSTER = [nodepool(), node("a"), node("b"), pod("one", "a"), pod("two", "b")]
REPLACE_CLUSTER = [nodepool(), node("a", "m5.2xlarge"), pod("app", "a")]


def test_unchanged_cluster_keeps_the_command():
    delete = planned(DELETE_CLUSTER)
    assert delete.decision == "delete"
    assert validate(delete, DELETE_CLUSTER).valid
    replace = planned(REPLACE_CLUSTER)
    assert replace.decision == "replace"
    result = validate(replace, REPLACE_CLUSTER)
    assert result.valid and result.command is replace


def test_churn_when_a_node_gains_a_do_not_disrupt_pod():
    command = planned(DELETE_CLUSTER)
    changed = [*DELETE_CLUSTER, pod("guarded", "a", annotations={"karpenter.sh/do-not-disrupt": "true"})]
    result = validate(command, changed)
    assert not result.valid and result.reason.startswith("churn") and "do-not-disrupt" in result.reason


def test_churn_when_a_node_is_gone_or_deleting():
    command = planned(DELETE_CLUSTER)
    assert "churn" in validate(command, [nodepool(), node("b"), pod("two", "b")]).reason
    deleting = [nodepool(), node("a", deleting=True), node("b"), pod("one", "a"), pod("two", "b")]
    assert "churn" in validate(command, deleting).reason


def test_budget_failure_when_the_fresh_budget_is_spent():
    command = planned(DELETE_CLUSTER)
    frozen = [nodepool(budgets=[{"nodes": "0"}]), *DELETE_CLUSTER[1:]]
    result = validate(command, frozen)
    assert not result.valid and result.reason.startswith("budget")


def test_scheduling_failure_when_the_destination_filled_up():
    command = planned(DELETE_CLUSTER)
    filled = [*DELETE_CLUSTER, pod("newcomer", "b", cpu="3")]
    result = validate(command, filled)
    assert not result.valid and result.reason.startswith("scheduling")


def test_delete_that_now_needs_a_replacement_is_refused():
    command = planned([nodepool(limits={"cpu": "100"}), *DELETE_CLUSTER[1:]])
    # b is full now: a's pod would need a new node.
    changed = [nodepool(limits={"cpu": "100"}), *DELETE_CLUSTER[1:], pod("newcomer", "b", cpu="3")]
    result = validate(command, changed)
    assert not result.valid and "no longer fit without a new node" in result.reason


def test_replace_whose_options_got_more_expensive_is_refused():
    command = planned(REPLACE_CLUSTER)
    cheapest = command.replacements[0].instance_type_names[0]
    gone = make_catalog(
        unavailable=[(cheapest, z, ct) for z in ("test-1a", "test-1b") for ct in ("on-demand", "spot")]
    )
    result = validate(command, REPLACE_CLUSTER, catalog=gone)
    assert not result.valid and cheapest in result.reason


def test_replace_that_is_no_longer_needed_is_refused():
    command = planned(REPLACE_CLUSTER)
    roomy = [*REPLACE_CLUSTER, node("fresh", "m5.xlarge")]
    result = validate(command, roomy)
    assert not result.valid and "better command exists" in result.reason


def test_multi_node_commands_validate_through_plan_validate_command():
    objects = [
        nodepool(),
        node("a"),
        node("b"),
        node("c"),
        pod("one", "a"),
        pod("two", "b"),
        pod("three", "c", cpu="2"),
    ]
    result = plan(snapshot(*objects), CATALOG, methods=[MultiNodeConsolidation()])
    [out] = result.commands
    assert out.method == "multi-node-consolidation"
    checked = validate_command(snapshot(*objects), CATALOG, out, methods=[MultiNodeConsolidation()])
    assert checked.valid and checked.command is not None
    assert checked.command.nodes == out.nodes and checked.command.replacements[0].instance_types == (
        command_out(result.commands_[0]).replacements[0].instance_types
    )
    assert out.decision == "replace" and out.nodes == ["a", "b", "c"]
    assert out.replacements[0].instance_types[0] == "c5.xlarge"
    # m5.xlarge is filtered out (same type as the nodes removed, not cheaper): only c5.xlarge is planned.
    assert out.replacements[0].instance_types == ["c5.xlarge"]
    # A pod landed on c during the delay: 5 cpu no longer fit a c5.xlarge.
    crowded = [*objects, pod("newcomer", "c", cpu="1")]
    again = validate_command(snapshot(*crowded), CATALOG, out, methods=[MultiNodeConsolidation()])
    assert not again.valid and "can no longer be c5.xlarge" in again.reason


def test_a_command_with_several_new_nodes_stands_on_an_unchanged_cluster():
    objects = [
        nodepool(requirements=[{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]),
        node("a", "m5.4xlarge"),
        node("b", "m5.4xlarge"),
        pod("cpu-0", "a", cpu="3500m"),
        pod("cpu-1", "a", cpu="3500m"),
        pod("mem-0", "b", cpu="1", memory="14Gi"),
        pod("mem-1", "b", cpu="1", memory="14Gi"),
    ]
    options = PlanOptions(max_replacements=3)
    result = plan(snapshot(*objects), CATALOG, options, methods=[MultiNodeConsolidation()])
    [out] = result.commands
    assert len(out.replacements) == 2
    checked = validate_command(snapshot(*objects), CATALOG, out, options, methods=[MultiNodeConsolidation()])
    assert checked.valid, checked.reason
    # A pod landed on b during the delay: the planned new nodes no longer hold everything.
    crowded = [*objects, pod("newcomer", "b", cpu="3", memory="20Gi")]
    again = validate_command(snapshot(*crowded), CATALOG, out, options, methods=[MultiNodeConsolidation()])
    assert not again.valid and again.reason.startswith("scheduling:")
