"""The controller's planning activities with the real planner on a stubbed cache and visibility:
they heartbeat while they wait, leave a backed-off NodePool's budget to the others, and send
per-node reasons as changes."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.api.failure.v1 import Failure
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.testing import ActivityEnvironment

import activities.controller_housekeeping as housekeeping_module
import activities.planning as planning_module
from activities.planning import narrowed
from api import node_reasons
from api import search_attributes as sa
from api.constants import DISRUPTED_TAINT_KEY, KARPFLOW_DISRUPTED_TAINT_KEY
from api.controller_io import Backoff, PassRequest, PassResult, Pause, ValidateRequest
from api.workflow_io import Approval
from kube.times import rfc3339
from planner.model import PlanOptions
from planner.plan import CommandOut
from runtime import metrics
from sim.cluster_builder import ClusterBuilder
from tests.unit.workflows.planning_stubs import StartedVisibility, planning, quiet_cluster


async def test_a_pass_heartbeats_while_it_waits_for_the_cache(monkeypatch: pytest.MonkeyPatch):
    """The first sync of a large cluster can take a minute; the heartbeat timeout is 30 s. Without
    heartbeats meanwhile, Temporal times the pass out and retries it, forever on a big cluster."""
    monkeypatch.setattr(planning_module, "HEARTBEAT_EVERY", 0.05)
    beats: list[float] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(asyncio.get_running_loop().time())
    activities = planning(quiet_cluster(3).objects, sync_seconds=1.0)
    began = asyncio.get_running_loop().time()
    await env.run(activities.plan_pass, PassRequest())
    during_the_wait = [t for t in beats if t - began < 0.9]
    assert len(during_the_wait) >= 5, beats


def two_pools_with_drift() -> ClusterBuilder:
    """`batch` and `default`, one drifted node each (launched before their NodePool's template
    changed); batch's is older, so drift would pick it first."""
    b = ClusterBuilder(now=datetime.now(UTC))
    b.nodeclass()
    pools = [b.nodepool(pool, consolidate_after="Never") for pool in ("batch", "default")]
    b.node("batch-old", pool="batch", age=timedelta(days=9))
    b.node("default-young", pool="default", age=timedelta(days=1))
    for node in ("batch-old", "default-young"):
        b.pod(f"{node}-web", node)
    for pool in pools:
        pool["spec"]["template"]["metadata"]["labels"] = {"team": "new"}
    b.node("default-current", pool="default", age=timedelta(days=1))
    b.pod("default-current-web", "default-current")
    return b


async def test_a_backed_off_pool_leaves_the_pass_to_the_other_pools():
    """Issue 17 item 7: while `batch` backed off Drifted, the one drift command per pass went to
    batch every pass (and was dropped by the controller), and default's drifted node waited. A
    batch (the default since issue 35) takes both; a backed-off pool is still left out of it."""
    one_per_pass = PlanOptions(drift_commands_per_pass=1)
    activities = planning(two_pools_with_drift().objects, options=one_per_pass)
    alone = await activities.plan_pass(PassRequest())
    assert [(c.reason, c.nodes) for c in alone.commands] == [("Drifted", ["batch-old"])]
    batch = await planning(two_pools_with_drift().objects).plan_pass(PassRequest())
    assert [c.nodes for c in batch.commands] == [["batch-old"], ["default-young"]]

    backoff = Backoff(
        nodepool="batch",
        reason="Drifted",
        failures=2,
        until=datetime.now(UTC) + timedelta(minutes=4),
        last_failure="disruption/batch/Drifted/abc",
    )
    result = await activities.plan_pass(PassRequest(backoffs=[backoff]))
    assert [(c.reason, c.nodes) for c in result.commands] == [("Drifted", ["default-young"])]
    assert result.reasons is not None
    assert "NodePool batch backs off Drifted until" in result.reasons.changed["batch-old"]


def reasons_of(result: PassResult) -> dict[str, str]:
    assert result.reasons is not None
    return result.reasons.changed


async def test_a_pass_sends_only_what_changed_since_what_the_controller_holds():
    b = quiet_cluster(50)
    activities = planning(b.objects)
    env = ActivityEnvironment()
    first = await env.run(activities.plan_pass, PassRequest())
    assert first.reasons is not None and first.reasons.base == ""
    assert len(first.reasons.changed) == 50 and first.blocked == {}
    held = first.reasons.fingerprint

    same = await env.run(activities.plan_pass, PassRequest(reasons_base=held))
    assert same.reasons is not None and same.reasons.base == held and same.reasons.entries == 0

    web_7 = next(o for o in b.objects if o["metadata"]["name"] == "web-7")
    web_7["metadata"]["annotations"] = {"karpenter.sh/do-not-disrupt": "true"}
    one = await env.run(activities.plan_pass, PassRequest(reasons_base=held))
    assert one.reasons is not None and one.reasons.base == held
    assert one.reasons.changed == {
        "ip-10-0-0-7.us-west-2.compute.internal": "pod default/web-7 has karpenter.sh/do-not-disrupt"
    }

    # A controller that holds something else (another worker planned its last pass) gets everything.
    other = await env.run(activities.plan_pass, PassRequest(reasons_base="0" * 32))
    assert other.reasons is not None and other.reasons.base == "" and len(other.reasons.changed) == 50


async def test_in_flight_is_read_for_this_task_queue_only():
    """Another cluster's worker may share the namespace: its workflows' nodes are not ours."""
    activities = planning(quiet_cluster(1).objects)
    await activities.plan_pass(PassRequest())
    (query, *_) = activities.client.queries  # type: ignore[attr-defined]
    assert "ExecutionStatus = 'Running'" in query
    assert f"TaskQueue = '{activities.task_queue}'" in query


@pytest.mark.parametrize(("coexistence", "orphan"), [(False, "karpenter-held"), (True, "karpflow-held")])
async def test_crash_cleanup_takes_only_the_taint_key_karpflow_writes_in_its_mode(coexistence, orphan):
    """Beside Karpenter, `karpenter.sh/disrupted` is Karpenter's (it holds it while it drains a node):
    karpflow's crash cleanup must leave it, and take its own `karpflow.dev/disrupted` instead."""
    b = ClusterBuilder(now=datetime.now(UTC))
    b.nodeclass()
    b.nodepool("default", policy="WhenEmpty", consolidate_after="Never")
    for name, key in (
        ("karpenter-held", DISRUPTED_TAINT_KEY),
        ("karpflow-held", KARPFLOW_DISRUPTED_TAINT_KEY),
    ):
        b.node(name, taints=[{"key": key, "effect": "NoSchedule"}])
        b.pod(f"{name}-web", name)
    result = await planning(b.objects, karpenter_coexistence=coexistence).plan_pass(PassRequest())
    assert result.orphan_taints == [orphan]


async def test_a_planned_command_carries_its_summary_and_a_refused_one_is_counted():
    b = ClusterBuilder(now=datetime.now(UTC))
    b.nodeclass()
    b.nodepool("default", budgets=[{"nodes": "100%"}])
    b.node("ip-10-0-9-9.us-west-2.compute.internal")
    activities = planning(b.objects)
    (command,) = (await activities.plan_pass(PassRequest())).commands
    assert (command.decision, command.consolidation_type) == ("delete", "empty")
    assert command.summary.startswith("Empty: delete 1 node: ip-10-0-9-9")
    assert command.memo["reason"] == "Empty" and command.details

    b.pod("arrived", "ip-10-0-9-9.us-west-2.compute.internal")  # no longer empty: validation refuses
    activities.cache.items = b.objects  # type: ignore[attr-defined]
    refused = metrics.FAILED_VALIDATIONS.labels(consolidation_type="empty")._value.get()
    (verdict,) = await activities.validate_commands(ValidateRequest(commands=[command]))
    assert not verdict.valid
    assert metrics.FAILED_VALIDATIONS.labels(consolidation_type="empty")._value.get() == refused + 1


def test_a_failed_commands_record_quotes_its_innermost_cause():
    """What the controller's backoff says of a failed disruption: the activity's error, not the wrappers."""
    failure = Failure(message="Child Workflow execution failed")
    failure.cause.message = "Activity task failed"
    failure.cause.cause.message = "instance i-0abc is not tagged\n for cluster c"
    failure.cause.cause.application_failure_info.type = "InstanceNotOwned"
    assert (
        planning_module.failure_text(failure)
        == "InstanceNotOwned: instance i-0abc is not tagged for cluster c"
    )
    assert planning_module.failure_text(Failure(message="timed out")) == "timed out"


# -- operator controls (issue 19): pauses, rate budgets, batches, upkeep --------------------------------


def pause(**fields: str) -> Pause:
    return Pause(**fields, since=datetime.now(UTC))  # type: ignore[arg-type]


async def test_a_pause_is_a_window_of_the_pass_that_holds_back_what_it_covers():
    activities = planning(two_pools_with_drift().objects)
    result = await activities.plan_pass(
        PassRequest(pauses=[pause(scope="nodepool", nodepool="batch", reason="upgrade", by="ops")])
    )
    assert [(c.reason, c.nodes) for c in result.commands] == [("Drifted", ["default-young"])]
    held = reasons_of(result)["batch-old"]
    assert "paused (NodePool batch by ops: upgrade)" in held and "until resumed" in held, held

    everything = await activities.plan_pass(PassRequest(pauses=[pause(scope="global")]))
    assert everything.commands == []
    drift_only = await activities.plan_pass(PassRequest(pauses=[pause(scope="action", action="Drift")]))
    assert drift_only.commands == []
    # The drifted nodes count as waiting, so the controller is not quiet while a pause holds them.
    assert "default-young" in node_reasons.waiting(reasons_of(drift_only))


@dataclass
class Listed:
    """What `client.list_workflows` yields of a closed workflow (the fields a pass reads)."""

    workflow_type: str
    status: WorkflowExecutionStatus
    start_time: datetime
    typed_search_attributes: TypedSearchAttributes
    id: str = "disruption/listed"
    run_id: str = "run"


def started(
    node: str,
    pool: str,
    minutes_ago: int,
    status=WorkflowExecutionStatus.COMPLETED,
    phase: str | None = None,
    workflow_type: str = "DisruptionWorkflow",
) -> Listed:
    pairs: list[SearchAttributePair] = [
        SearchAttributePair(sa.NODES, [node]),
        SearchAttributePair(sa.NODEPOOL, pool),
        SearchAttributePair(sa.REASON, "Empty"),
    ]
    if phase is not None:
        pairs.append(SearchAttributePair(sa.PHASE, phase))
    return Listed(
        workflow_type,
        status,
        datetime.now(UTC) - timedelta(minutes=minutes_ago),
        TypedSearchAttributes(pairs),
    )


def empty_nodes(
    pools: tuple[str, ...] = ("default",), per_pool: int = 3, rate: str | None = None
) -> ClusterBuilder:
    """`per_pool` empty nodes and a busy one in each pool; budgets: all at once, and `rate` per hour."""
    b = ClusterBuilder(now=datetime.now(UTC))
    b.nodeclass()
    for pool in pools:
        budgets = [{"nodes": "100%"}] + ([{"nodes": rate, "per": "1h"}] if rate else [])
        b.nodepool(pool, policy="WhenEmpty", consolidate_after="0s", budgets=budgets)
        for index in range(per_pool):
            b.node(f"{pool}-{index}", pool=pool, age=timedelta(days=1))
        b.node(f"{pool}-busy", pool=pool, age=timedelta(days=1))
        b.pod(f"{pool}-web", f"{pool}-busy")
    return b


async def test_a_rate_budget_counts_the_starts_temporal_visibility_lists():
    """Issue 19 item 4: rate budgets saw no recent start outside `karpflow plan --snapshot` tests: the
    pass never read them, so a rate of 2 per hour allowed 2 every pass."""
    objects = empty_nodes(rate="2").objects
    alone = await planning(objects).plan_pass(PassRequest())
    assert sorted(n for c in alone.commands for n in c.nodes) == ["default-0", "default-1"]

    visibility = StartedVisibility(
        [
            started("gone-1", "default", 20),  # this hour: counts, though its node is gone
            started("gone-2", "default", 90),  # before the hour
            started("gone-3", "default", 5, WorkflowExecutionStatus.FAILED),  # rolled back: took nothing
            started("other", "batch", 5),  # another pool's
        ]
    )
    result = await planning(objects, visibility=visibility).plan_pass(PassRequest())
    assert sorted(n for c in result.commands for n in c.nodes) == ["default-0"]
    assert any("StartTime >" in q and "TaskQueue" in q for q in visibility.queries), visibility.queries
    held = reasons_of(result)["default-1"]
    assert "rate budget for" in held and "2 started in the last 1h" in held  # gone-1's and default-0's, held

    # Commands the controller started that visibility may not list yet count too.
    holding = await planning(objects, visibility=visibility).plan_pass(PassRequest(holding=["default-2"]))
    assert [n for c in holding.commands for n in c.nodes] == []


async def test_a_rate_budget_counts_only_the_commands_that_disrupted_something():
    """Issue 30 item 5: a rejected approval, or one that timed out, closes COMPLETED in phase Rejected
    having changed nothing; it counted against the rate like a command that took its node."""
    objects = empty_nodes(rate="2").objects
    visibility = StartedVisibility(
        [
            started("rejected", "default", 5, phase="Rejected"),  # `karpflow reject`, or the timeout
            started("rolled-back", "default", 5, WorkflowExecutionStatus.FAILED, phase="RolledBack"),
            started("done", "default", 10, phase="Succeeded"),  # took its node: counts
        ]
    )
    result = await planning(objects, visibility=visibility).plan_pass(PassRequest())
    assert sorted(n for c in result.commands for n in c.nodes) == ["default-0"]  # 2 per hour, 1 started
    assert "2 started in the last 1h" in reasons_of(result)["default-1"]  # done's and default-0's

    # Running commands count whatever their phase (one awaiting approval may take its node any time),
    # and so does a termination (a `kubectl delete node` took its node whatever its phase says).
    running = StartedVisibility(
        [
            started("waiting", "default", 5, WorkflowExecutionStatus.RUNNING, phase="AwaitingApproval"),
            started("deleted", "default", 5, workflow_type="TerminationWorkflow", phase="Succeeded"),
        ]
    )
    held = await planning(objects, visibility=running).plan_pass(PassRequest())
    assert [n for c in held.commands for n in c.nodes] == []


async def test_without_a_rate_budget_a_pass_does_not_read_the_starts():
    visibility = StartedVisibility([started("gone-1", "default", 20)])
    await planning(empty_nodes().objects, visibility=visibility).plan_pass(PassRequest())
    assert not [q for q in visibility.queries if "StartTime >" in q]


async def test_a_batch_counts_its_earlier_commands_against_node_disruption_budgets():
    """Issue 19 item 10: two commands validated together were each checked alone, so a budget of one
    unavailable node let both start."""

    def cluster(empty: tuple[str, ...], budget: bool) -> list[dict]:
        b = ClusterBuilder(now=datetime.now(UTC))
        b.nodeclass()
        for pool in ("a", "b"):
            b.nodepool(pool, policy="WhenEmpty", consolidate_after="0s", budgets=[{"nodes": "100%"}])
            b.node(f"{pool}-1", pool=pool, age=timedelta(days=1))
            b.node(f"{pool}-busy", pool=pool, age=timedelta(days=1))
            b.pod(f"{pool}-web", f"{pool}-busy")
            if pool not in empty:
                b.pod(f"{pool}-late", f"{pool}-1")
        if budget:
            every = {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "Exists"}]}
            b.node_disruption_budget("one-at-a-time", selector=every, max_unavailable=1)
        return b.objects

    (first,) = (await planning(cluster(("a",), False)).plan_pass(PassRequest())).commands
    (second,) = (await planning(cluster(("b",), False)).plan_pass(PassRequest())).commands
    assert (first.nodes, second.nodes) == (["a-1"], ["b-1"])

    verdicts = await planning(cluster(("a", "b"), True)).validate_commands(
        ValidateRequest(commands=[first, second])
    )
    assert [v.valid for v in verdicts] == [True, False]
    assert "NodeDisruptionBudget one-at-a-time allows 0" in verdicts[1].reason, verdicts[1].reason


def test_upkeep_writes_the_valid_condition_only_when_it_changes_and_finds_stale_claims():
    now = datetime.now(UTC)
    b = ClusterBuilder(now=now)
    b.node("n1", pool=None)
    good = b.maintenance_window("quiet", actions=["Drift"])
    bad = b.maintenance_window("broken", actions=["Reboot"])
    good["status"] = {"conditions": [{"type": "Valid", "status": "True"}]}
    ndb = b.node_disruption_budget("both", selector=None, max_unavailable=1, min_available=1)
    uid = next(o for o in b.objects if o["kind"] == "Node")["metadata"]["uid"]
    claim = {"node": "n1", "uid": uid, "holder": "disruption/x@run", "since": rfc3339(now)}
    old = {**claim, "since": rfc3339(now - timedelta(minutes=10))}
    ndb["status"] = {"claims": [claim, {**claim, "node": "gone"}, old]}

    upkeep = housekeeping_module.controls_upkeep(b.objects, [], now)
    assert upkeep is not None
    assert sorted((c.kind, c.name, c.valid) for c in upkeep.conditions) == [
        ("MaintenanceWindow", "broken", False),
        ("NodeDisruptionBudget", "both", False),
    ]
    assert "spec.actions" in next(c.message for c in upkeep.conditions if c.name == "broken")
    assert upkeep.stale_claims == 2  # the gone node's, and the old one whose holder no longer runs

    # Once written, the same conditions are not written again; a running holder keeps its claim.
    for obj, message in ((bad, upkeep.conditions[0].message), (ndb, upkeep.conditions[1].message)):
        obj.setdefault("status", {})["conditions"] = [
            {"type": "Valid", "status": "False", "message": message}
        ]
    ndb["status"]["claims"] = [old]
    assert housekeeping_module.controls_upkeep(b.objects, ["disruption/x"], now) is None


@pytest.mark.parametrize(("value", "gated"), [("true", True), ("Drifted", True), ("Empty", False)])
async def test_a_pool_that_requires_approval_puts_it_in_its_commands(value: str, gated: bool):
    """`karpflow.dev/require-approval`: "true", or the reasons that wait (issue 19 item 6)."""
    b = two_pools_with_drift()
    batch = next(o for o in b.objects if o["kind"] == "NodePool" and o["metadata"]["name"] == "batch")
    batch["metadata"].setdefault("annotations", {})["karpflow.dev/require-approval"] = value
    # One pass takes both pools' drifted nodes; only batch's command waits for approval.
    drift, other = (await planning(b.objects).plan_pass(PassRequest())).commands
    assert (drift.nodes, other.nodes) == (["batch-old"], ["default-young"])
    assert (drift.input.get("approval") is not None) == gated, drift.input
    assert other.input.get("approval") is None
    # What the Web UI shows before anyone opens it says the command will wait (issue 19 leftovers),
    # also once validation narrowed it.
    assert drift.summary.startswith("Drifted (awaits approval, 24h): " if gated else "Drifted: "), (
        drift.summary
    )
    assert ("**Awaits approval**" in drift.details) == gated, drift.details
    kept = narrowed(drift, CommandOut.model_validate(drift.planned))
    assert (kept.summary, kept.details) == (drift.summary, drift.details)


async def test_the_pools_approval_timeout_reaches_the_command_and_its_summary():
    """`karpflow.dev/approval-timeout`: how long the command waits before the timeout rejects it."""
    b = two_pools_with_drift()
    batch = next(o for o in b.objects if o["kind"] == "NodePool" and o["metadata"]["name"] == "batch")
    batch["metadata"].setdefault("annotations", {}).update(
        {"karpflow.dev/require-approval": "true", "karpflow.dev/approval-timeout": "4h"}
    )
    drift, _ = (await planning(b.objects).plan_pass(PassRequest())).commands
    assert drift.nodes == ["batch-old"]
    assert Approval.model_validate(drift.input["approval"]).timeout == timedelta(hours=4)
    assert drift.summary.startswith("Drifted (awaits approval, 4h): "), drift.summary


@pytest.mark.parametrize("value", ["0s", "Never", "tomorrow"])
async def test_an_approval_timeout_that_does_not_parse_fails_the_pool_closed(value: str):
    b = two_pools_with_drift()
    batch = next(o for o in b.objects if o["kind"] == "NodePool" and o["metadata"]["name"] == "batch")
    batch["metadata"].setdefault("annotations", {}).update(
        {"karpflow.dev/require-approval": "true", "karpflow.dev/approval-timeout": value}
    )
    result = await planning(b.objects).plan_pass(PassRequest())
    assert [c.nodes for c in result.commands] == [["default-young"]]  # batch disrupts nothing
    assert any(f"karpflow.dev/approval-timeout={value!r}" in p for p in result.problems), result.problems


async def test_a_require_approval_that_does_not_parse_fails_the_pool_closed():
    b = two_pools_with_drift()
    batch = next(o for o in b.objects if o["kind"] == "NodePool" and o["metadata"]["name"] == "batch")
    batch["metadata"].setdefault("annotations", {})["karpflow.dev/require-approval"] = "yes"
    result = await planning(b.objects).plan_pass(PassRequest())
    assert [c.nodes for c in result.commands] == [["default-young"]]  # batch disrupts nothing
    assert any("karpflow.dev/require-approval='yes'" in p for p in result.problems), result.problems


async def test_a_command_validation_narrowed_is_all_of_the_one_validated_command():
    """Issue 31 item 1: an Empty command over `batch` and `default` (which requires approval) lost its
    `default` node in validation; it still waited for default's approval, named both pools, kept the
    dropped node's UID and showed two different savings."""
    b = ClusterBuilder(now=datetime.now(UTC))
    b.nodeclass()
    for pool in ("batch", "default"):
        b.nodepool(pool, policy="WhenEmpty", consolidate_after="0s", budgets=[{"nodes": "100%"}])
        b.node(f"{pool}-empty", pool=pool, age=timedelta(days=1))
    default = next(o for o in b.objects if o["kind"] == "NodePool" and o["metadata"]["name"] == "default")
    default["metadata"]["annotations"] = {"karpflow.dev/require-approval": "Empty"}
    activities = planning(b.objects)
    (command,) = (await activities.plan_pass(PassRequest())).commands
    assert sorted(command.nodepools) == ["batch", "default"] and command.input.get("approval") is not None

    b.pod("arrived", "default-empty")  # default's node is no longer empty
    activities.cache.items = b.objects  # type: ignore[attr-defined]
    (verdict,) = await activities.validate_commands(ValidateRequest(commands=[command]))
    kept = verdict.command
    assert verdict.valid and kept is not None
    assert kept.nodes == ["batch-empty"] and kept.nodepools == ["batch"]
    assert "/batch/Empty/" in kept.workflow_id and "default" not in kept.workflow_id
    assert kept.input.get("approval") is None  # batch does not ask for approval
    assert set(kept.input["node_uids"]) == {"batch-empty"}
    assert not kept.summary.startswith("Empty (awaits approval")
    assert kept.memo["estimatedSavingsPerHour"] == round(kept.savings_per_hour, 6)
    assert f"${kept.savings_per_hour:.4f}/h" in kept.summary + kept.details


class OneNode:
    """The API server's face to `apply_annotations`: one node, replaced when its name is reused."""

    def __init__(self, node: dict) -> None:
        self.node = node
        self.writes = 0

    async def get_node(self, name: str) -> dict:
        assert name == self.node["metadata"]["name"]
        return copy.deepcopy(self.node)

    async def update_node(self, name: str, mutate) -> dict:  # type: ignore[no-untyped-def]
        node = await self.get_node(name)
        if mutate(node):
            self.writes += 1
            self.node = node
        return node


async def test_the_controllers_annotations_are_pinned_to_the_node_they_were_planned_for():
    """Issue 30 item 9: `apply_annotations` wrote by name, so a node that reused the name (EKS names
    nodes by their private IP) between the pass and the write got the other node's marker."""
    from planner.drift import NODEPOOL_HASH_VERSION
    from planner.plan import plan

    stale = {"karpenter.sh/nodepool-hash": "0", "karpenter.sh/nodepool-hash-version": NODEPOOL_HASH_VERSION}
    b = ClusterBuilder()
    b.nodepool("default")
    drifted = b.node("drifted", stamp_hash=False, annotations=stale)
    result = plan(b.snapshot(), b.catalog, methods=[], simulate=None)
    (change,) = [a.model_dump(mode="json") for a in result.annotations]
    assert change["node"] == "drifted" and change["uid"] == drifted["metadata"]["uid"]

    reused = copy.deepcopy(drifted)
    reused["metadata"]["uid"] = "a-later-node-of-the-same-name"
    kube = OneNode(reused)
    activities = planning([])
    activities.kube = kube  # type: ignore[assignment]
    assert await activities.apply_annotations([change]) == 0
    assert (
        kube.writes == 0 and "karpenter.sh/voluntary-disruption" not in kube.node["metadata"]["annotations"]
    )

    kube.node = copy.deepcopy(drifted)
    assert await activities.apply_annotations([change]) == 1
    assert kube.node["metadata"]["annotations"]["karpenter.sh/voluntary-disruption"] == "drifted"
    assert await activities.apply_annotations([change]) == 0  # idempotent: nothing left to change


def test_a_pass_result_carries_commands_up_to_its_payload_budget_and_the_rest_wait():
    from activities.planning import within_payload
    from api.controller_io import PlannedCommand

    def command(i: int) -> PlannedCommand:
        wid = f"disruption/c/default/Drifted/{i:04d}"
        return PlannedCommand(
            workflow_id=wid,
            method="drift",
            reason="Drifted",
            nodes=[f"n{i}"],
            nodepools=["default"],
            forceful=False,
            needs_validation=False,
            input={"pad": "x" * 900},
            planned={},
        )

    commands = [command(i) for i in range(30)]
    sizes = [len(c.model_dump_json()) for c in commands]
    kept, why = within_payload(commands, limit=sum(sizes[:10]))
    assert kept == commands[:10]
    assert why is not None and why.startswith("20 command(s) of this pass wait for the next")
    assert within_payload(commands, limit=sum(sizes)) == (commands, None)
    # One command larger than the budget still goes: a pass always starts its first.
    first, left = within_payload(commands[:2], limit=1)
    assert first == commands[:1] and left is not None and left.startswith("1 command(s) of this pass")
