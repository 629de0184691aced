"""The controller's planning activities with the real planner on a stubbed cache and visibility:
they heartbeat while they wait, leave a backed-off NodePool's budget to the others, and send
per-node reasons as changes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.api.failure.v1 import Failure
from temporalio.testing import ActivityEnvironment

import activities.planning as planning_module
from api.constants import DISRUPTED_TAINT_KEY, KARPFLOW_DISRUPTED_TAINT_KEY
from api.controller_io import Backoff, PassRequest, PassResult, ValidateRequest
from runtime import metrics
from sim.cluster_builder import ClusterBuilder
from tests.unit.workflows.planning_stubs import planning, quiet_cluster


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
    batch every pass (and was dropped by the controller), and default's drifted node waited."""
    activities = planning(two_pools_with_drift().objects)
    alone = await activities.plan_pass(PassRequest())
    assert [(c.reason, c.nodes) for c in alone.commands] == [("Drifted", ["batch-old"])]

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
