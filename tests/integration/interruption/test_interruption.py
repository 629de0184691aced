"""Interruption handling end to end: moto SQS and EventBridge, the emulator, the real Temporal dev
server and the real worker with its interruption poller."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy

from api.controller_io import ControllerState, Pause
from api.workflow_ids import controller_workflow_id, interruption_workflow_id
from cluster.interruption import REBALANCE_ANNOTATION, instance_id_of
from runtime.controller_start import controller_input
from tests.integration.workflows.conftest import Workload, node, scenario

pytestmark = pytest.mark.integration

A = node("172.31.1.10", "m5.large", capacity="spot")
B = node("172.31.2.20", "m5.large")
# B is nearly full: A's pods need a replacement (the scheduling simulation finds none elsewhere).
PODS = [
    Workload("shop", "web", "100m", "128Mi", ["10", "10", "20"], pdb={"maxUnavailable": 1}),
    Workload("batch", "filler", "1700m", "256Mi", ["20"]),
]
WORLD = scenario([A, B], PODS)
SPOT_DEADLINE_S = 120  # EC2 reclaims a spot instance two minutes after its warning


async def instance_of(karpflow, name: str) -> str:
    return instance_id_of((await karpflow.nodes())[name])


async def runs_of(karpflow, workflow_id: str) -> int:
    return len([e async for e in karpflow.client.list_workflows(f'WorkflowId="{workflow_id}"')])


def spot_id(karpflow, instance: str) -> str:
    return interruption_workflow_id(karpflow.stack.cluster_name, instance, "spot")


def rebalance_id(karpflow, instance: str) -> str:
    return interruption_workflow_id(karpflow.stack.cluster_name, instance, "rebalance")


async def replaced(karpflow, old: str) -> str | None:
    """The name of a Ready node other than the starting ones, once `old` is gone."""
    nodes = await karpflow.nodes()
    if old in nodes:
        return None
    new = [
        n
        for name, n in nodes.items()
        if name not in (A.name, B.name)
        and any(
            c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", [])
        )
    ]
    return new[0]["metadata"]["name"] if new else None


@pytest.mark.sim_stack(scenario=WORLD)
async def test_spot_interruption_via_eventbridge_replaces_and_drains_the_node(karpflow, queue):
    instance = await instance_of(karpflow, A.name)
    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1) as w:
        started = time.monotonic()
        queue.put_spot_interruption(instance)
        new = await karpflow.eventually(
            lambda: replaced(karpflow, A.name),
            within=60,
            what=lambda: f"replacement, {w.interruptions.counters}",
        )
        drained = time.monotonic() - started
        await karpflow.eventually(lambda: _async(queue.depth() == 0), within=10, what="queue empty")
        print(f"spot interruption: event → node drained and gone in {drained:.2f}s (new node {new})")
        assert w.interruptions.counters["kind:SpotInterruption"] == 1
        assert w.interruptions.counters["deleted"] == 1
    terminated = {i["InstanceId"] for i in karpflow.instances(("shutting-down", "terminated"))}
    assert instance in terminated
    pods = [p for p in await karpflow.pods() if p["metadata"]["namespace"] == "shop"]
    assert pods and all(p["spec"].get("nodeName") != A.name for p in pods)


def _body(instance: str) -> str:
    return json.dumps(
        {
            "version": "0",
            "id": "7e3e5b4f-0000-0000-0000-000000000001",
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": "us-west-2",
            "resources": [f"arn:aws:ec2:us-west-2:123456789012:instance/{instance}"],
            "detail": {"instance-id": instance, "instance-action": "terminate"},
        }
    )


async def _async(value):
    return value


@pytest.mark.sim_stack(scenario=WORLD)
async def test_the_same_message_three_times_starts_one_workflow_and_one_replacement(karpflow, queue):
    instance = await instance_of(karpflow, A.name)
    before = {i["InstanceId"] for i in karpflow.instances()}
    body = _body(instance)
    for _ in range(3):
        queue.send(body)
    async with karpflow.worker(interruption_queue=queue.url, interruption_wait=1) as w:
        await karpflow.eventually(lambda: replaced(karpflow, A.name), within=60, what="replacement")
        await karpflow.eventually(lambda: _async(queue.depth() == 0), within=10, what="queue empty")
        # SQS delivers at least once: on a loaded machine a message whose handling outlasts its
        # visibility timeout comes back, and is one more repeat.
        received = w.interruptions.counters["deleted"]
        assert received >= 3 and w.interruptions.counters["kind:SpotInterruption"] == received
        # The repeats are dropped by the poller's memo, before any Temporal call.
        assert w.interruptions.counters["start_calls"] == 1
        assert w.interruptions.counters["duplicate"] == received - 1
    assert await runs_of(karpflow, spot_id(karpflow, instance)) == 1
    launched = {
        i["InstanceId"] for i in karpflow.instances(("pending", "running", "shutting-down", "terminated"))
    }
    assert len(launched - before) == 1


@pytest.mark.sim_stack(scenario=WORLD)
async def test_malformed_unknown_instance_and_unknown_kind_are_deleted_and_nothing_happens(karpflow, queue):
    before = {i["InstanceId"] for i in karpflow.instances()}
    queue.send("this is not json {")
    queue.send(_body("i-0000000000000dead"))
    queue.send(json.dumps({**json.loads(_body("i-1")), "detail-type": "EC2 AMI State Change"}))
    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1) as w:
        await karpflow.eventually(
            lambda: _async(w.interruptions.counters["deleted"] == 3),
            within=20,
            what=lambda: str(w.interruptions.counters),
        )
        assert queue.depth() == 0
        c = w.interruptions.counters
        assert (c["kind:Unparseable"], c["kind:Unknown"], c["kind:SpotInterruption"]) == (1, 1, 1)
        # The worker keeps running: a real interruption afterwards is still handled.
        queue.put_spot_interruption(await instance_of(karpflow, B.name))
        await karpflow.eventually(lambda: replaced(karpflow, B.name), within=60, what="B replaced")
    assert await runs_of(karpflow, spot_id(karpflow, "i-0000000000000dead")) == 0
    assert {A.name} <= set(await karpflow.nodes())
    launched = {i["InstanceId"] for i in karpflow.instances()} - before
    assert len(launched) == 1  # B's replacement only


@pytest.mark.sim_stack(scenario=WORLD)
async def test_a_failed_handler_leaves_the_message_for_redelivery(karpflow, queue):
    instance = await instance_of(karpflow, A.name)
    failures = []

    def fail_once(event):
        if not failures:
            failures.append(event.event_id)
            raise RuntimeError("injected handler failure")

    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1) as w:
        w.interruptions.fail_hook = fail_once
        queue.put_spot_interruption(instance)
        await karpflow.eventually(lambda: _async(w.interruptions.counters["failed"] == 1), within=20)
        assert w.interruptions.counters["deleted"] == 0 and queue.depth() == 1
        await karpflow.eventually(
            lambda: replaced(karpflow, A.name), within=60, what="replacement after redelivery"
        )
        assert w.interruptions.counters["received"] == 2 and w.interruptions.counters["deleted"] == 1
    assert await runs_of(karpflow, spot_id(karpflow, instance)) == 1


@pytest.mark.slow(seconds=85)
@pytest.mark.sim_stack(scenario=WORLD, time_scale=1)
async def test_event_to_drained_at_time_scale_one(karpflow, queue):
    """Real simulated delays (pod start, kubelet, boot): the old node is drained at once, while its
    replacement boots alongside (termination_deadline); prints the figure for the report."""
    instance = await instance_of(karpflow, A.name)

    async def drained() -> bool:
        pods = [p for p in await karpflow.pods() if p["metadata"]["namespace"] == "shop"]
        return all(p["spec"].get("nodeName") != A.name for p in pods)

    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1):
        started = time.monotonic()
        queue.put_spot_interruption(instance)
        await karpflow.eventually(drained, within=150, what="pods off the interrupted node")
        elapsed = time.monotonic() - started
        print(f"spot interruption at time scale 1: event → node drained in {elapsed:.2f}s")
        await karpflow.eventually(lambda: replaced(karpflow, A.name), within=180, what="Ready replacement")
        print(
            f"spot interruption at time scale 1: event → replacement Ready, old node gone in "
            f"{time.monotonic() - started:.2f}s"
        )


@pytest.mark.sim_stack(scenario=WORLD)
async def test_a_rebalance_recommendation_without_opt_in_records_an_event_only(karpflow, queue):
    instance = await instance_of(karpflow, A.name)
    before = {i["InstanceId"] for i in karpflow.instances()}
    rebalance = {
        **json.loads(_body(instance)),
        "detail-type": "EC2 Instance Rebalance Recommendation",
        "detail": {"instance-id": instance},
    }
    queue.send(json.dumps(rebalance))
    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1) as w:
        await karpflow.eventually(lambda: _async(w.interruptions.counters["deleted"] == 1), within=20)
        assert w.interruptions.counters["kind:RebalanceRecommendation"] == 1
    events = (await karpflow.kube.request("GET", "/api/v1/namespaces/default/events"))["items"]
    (recorded,) = [e for e in events if e["involvedObject"]["name"] == A.name]
    # Karpenter's reason, on the node's UID (what `kubectl describe node` matches)
    assert recorded["reason"] == "SpotRebalanceRecommendation", recorded
    assert recorded["involvedObject"]["uid"] == (await karpflow.kube.get_node(A.name))["metadata"]["uid"]
    assert await runs_of(karpflow, rebalance_id(karpflow, instance)) == 0
    assert A.name in await karpflow.nodes()
    assert {i["InstanceId"] for i in karpflow.instances()} == before


@pytest.mark.sim_stack(scenario=WORLD)
async def test_a_rebalance_recommendation_with_opt_in_replaces_the_node(karpflow, queue):
    await karpflow.kube.request(
        "PATCH",
        "/apis/karpenter.sh/v1/nodepools/default",
        body={"metadata": {"annotations": {REBALANCE_ANNOTATION: "true"}}},
        content_type="application/merge-patch+json",
    )
    instance = await instance_of(karpflow, A.name)
    rebalance = {
        **json.loads(_body(instance)),
        "detail-type": "EC2 Instance Rebalance Recommendation",
        "detail": {"instance-id": instance},
    }
    queue.send(json.dumps(rebalance))
    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1):
        await karpflow.eventually(lambda: replaced(karpflow, A.name), within=60, what="proactive replacement")
    described = await karpflow.client.get_workflow_handle(rebalance_id(karpflow, instance)).describe()
    assert described.workflow_type == "DisruptionWorkflow"


@pytest.mark.sim_stack(scenario=WORLD)
async def test_a_rebalance_replacement_waits_for_the_budget(karpflow, queue):
    """Opted in, but the NodePool's budget allows no disruption: the event only, no workflow."""
    await karpflow.kube.request(
        "PATCH",
        "/apis/karpenter.sh/v1/nodepools/default",
        body={
            "metadata": {"annotations": {REBALANCE_ANNOTATION: "true"}},
            "spec": {"disruption": {"budgets": [{"nodes": "0"}]}},
        },
        content_type="application/merge-patch+json",
    )
    instance = await instance_of(karpflow, A.name)
    rebalance = {
        **json.loads(_body(instance)),
        "detail-type": "EC2 Instance Rebalance Recommendation",
        "detail": {"instance-id": instance},
    }
    queue.send(json.dumps(rebalance))
    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1) as w:
        await karpflow.eventually(lambda: _async(w.interruptions.counters["deleted"] == 1), within=20)
    assert await runs_of(karpflow, rebalance_id(karpflow, instance)) == 0
    assert A.name in await karpflow.nodes()


@pytest.mark.sim_stack(scenario=WORLD)
async def test_a_paused_controller_holds_the_rebalance_replacement_back(karpflow, queue):
    """Issue 30 item 6: the poller built its view without the controller's pauses, so `karpflow pause`
    stopped every command but the proactive replacements. The controller runs with the pause in its
    state from its first task (as after a continue-as-new); the poller reads it with its query."""
    await opt_in_to_rebalance(karpflow)
    settings = karpflow.settings(controller=True)
    paused = Pause(scope="global", reason="incident", by="ops", since=datetime.now(UTC))
    await karpflow.client.start_workflow(
        "ControllerWorkflow",
        controller_input(settings).model_copy(update={"state": ControllerState(pauses={"global": paused})}),
        id=controller_workflow_id(karpflow.stack.cluster_name),
        task_queue=karpflow.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    instance = await instance_of(karpflow, A.name)
    queue.put_rebalance_recommendation(instance)
    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1, controller=True) as w:
        await karpflow.eventually(lambda: _async(w.interruptions.counters["deleted"] == 1), within=30)
    assert await runs_of(karpflow, rebalance_id(karpflow, instance)) == 0
    assert A.name in await karpflow.nodes()


async def opt_in_to_rebalance(karpflow) -> None:
    await karpflow.kube.request(
        "PATCH",
        "/apis/karpenter.sh/v1/nodepools/default",
        body={"metadata": {"annotations": {REBALANCE_ANNOTATION: "true"}}},
        content_type="application/merge-patch+json",
    )


async def gone_and_terminated(karpflow, name: str, instance: str) -> bool:
    states = {i["InstanceId"] for i in karpflow.instances(("shutting-down", "terminated"))}
    return name not in await karpflow.nodes() and instance in states


async def started_with_attributes(karpflow, workflow_id: str) -> dict:
    """The search attributes a workflow carried in its very first event."""
    history = await karpflow.client.get_workflow_handle(workflow_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    return dict(started.search_attributes.indexed_fields)


@pytest.mark.sim_stack(scenario=WORLD)
async def test_a_spot_warning_after_a_refused_rebalance_still_drains_the_node_before_its_deadline(
    karpflow, queue
):
    """Issue 17's acceptance: a spot node annotated do-not-disrupt, in a pool opted in to rebalance
    replacement. EC2 sends the rebalance recommendation first: its voluntary command is refused
    (do-not-disrupt). The spot warning 15 s later has a workflow of its own (not a duplicate of the
    rebalance's) and drains the node and terminates its instance before the two minutes are up."""
    await opt_in_to_rebalance(karpflow)

    def do_not_disrupt(n):
        n["metadata"].setdefault("annotations", {})["karpenter.sh/do-not-disrupt"] = "true"
        return True

    await karpflow.kube.update_node(A.name, do_not_disrupt)
    instance = await instance_of(karpflow, A.name)
    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1) as w:
        queue.put_rebalance_recommendation(instance)
        await karpflow.eventually(
            lambda: _async(w.interruptions.counters["kind:RebalanceRecommendation"] == 1), within=20
        )
        await asyncio.sleep(15)
        warned = datetime.now(UTC)
        queue.put_spot_interruption(instance, when=warned)
        deadline = warned + timedelta(minutes=2)
        await karpflow.eventually(
            lambda: gone_and_terminated(karpflow, A.name, instance),
            within=(deadline - datetime.now(UTC)).total_seconds(),
            what=lambda: f"node drained and instance terminated, {w.interruptions.counters}",
        )
        finished = datetime.now(UTC)
        rebalance = await karpflow.client.get_workflow_handle(rebalance_id(karpflow, instance)).describe()
        spot_handle = karpflow.client.get_workflow_handle(spot_id(karpflow, instance))
        await karpflow.eventually(lambda: _closed(spot_handle), within=60, what="its replacement up")
        spot = await spot_handle.describe()
    took = (finished - warned).total_seconds()
    print(f"rebalance then spot: drained and terminated {took:.1f}s after the warning ({SPOT_DEADLINE_S}s)")
    assert finished < deadline
    assert rebalance.status == WorkflowExecutionStatus.FAILED  # refused: do-not-disrupt
    assert spot.status == WorkflowExecutionStatus.COMPLETED
    assert "KarpflowNodes" in await started_with_attributes(karpflow, spot_id(karpflow, instance))
    pods = [p for p in await karpflow.pods() if p["metadata"]["namespace"] == "shop"]
    assert pods and all(p["spec"].get("nodeName") != A.name for p in pods)


@pytest.mark.sim_stack(scenario=WORLD)
async def test_a_spot_warning_takes_over_a_node_a_rebalance_command_still_holds(karpflow, queue):
    """The rebalance's voluntary command holds the node while its replacement never gets ready; the
    spot warning that follows takes the node over and drains it (onto its own replacement) before
    its deadline, and the voluntary command's rollback does not untaint the node the spot path drains."""
    await opt_in_to_rebalance(karpflow)
    instance = await instance_of(karpflow, A.name)
    rebalance = karpflow.client.get_workflow_handle(rebalance_id(karpflow, instance))

    def launched_by_the_rebalance(described: dict) -> bool:
        tags = {t["Key"]: t["Value"] for t in described.get("Tags") or ()}
        return tags.get("karpflow.io/command-id", "").startswith(rebalance.id)

    karpflow.stack.faults.add_never_ready(predicate=launched_by_the_rebalance)
    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1) as w:
        queue.put_rebalance_recommendation(instance)

        async def holds() -> bool:
            node = (await karpflow.nodes())[A.name]
            holder = (node["metadata"].get("annotations") or {}).get("karpflow.io/disruption-command", "")
            return holder.startswith(rebalance.id)

        await karpflow.eventually(holds, within=30, what="the rebalance command holding the node")
        warned = datetime.now(UTC)
        queue.put_spot_interruption(instance, when=warned)
        await karpflow.eventually(
            lambda: gone_and_terminated(karpflow, A.name, instance),
            within=SPOT_DEADLINE_S,
            what=lambda: f"node drained and instance terminated, {w.interruptions.counters}",
        )
        assert datetime.now(UTC) < warned + timedelta(seconds=SPOT_DEADLINE_S)
        assert (await rebalance.describe()).status == WorkflowExecutionStatus.RUNNING  # still waiting
        await rebalance.cancel()
        await karpflow.eventually(
            lambda: _closed(rebalance), within=30, what="the rebalance command rolled back"
        )
    spot = await karpflow.client.get_workflow_handle(spot_id(karpflow, instance)).describe()
    assert spot.status == WorkflowExecutionStatus.COMPLETED


async def _closed(handle) -> bool:
    return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING


# A spot node in us-west-2a running a pod pinned to its zone; B in us-west-2b cannot take it.
PINNED_A = node("172.31.1.10", "m5.large", zone="us-west-2a", capacity="spot")
OTHER_ZONE_B = node("172.31.2.20", "m5.large", zone="us-west-2b")
PINNED = [
    Workload(
        "ml", "zonal", "1500m", "512Mi", ["10"], node_selector={"topology.kubernetes.io/zone": "us-west-2a"}
    ),
    Workload("shop", "web", "100m", "128Mi", ["20"]),
]


@pytest.mark.sim_stack(scenario=scenario([PINNED_A, OTHER_ZONE_B], PINNED))
async def test_a_spot_replacement_honours_its_pods_zone_and_avoids_the_reclaimed_offering(karpflow, queue):
    """Issue 17 item 4: the replacement is what the displaced pods need (the planner's scheduling
    simulation on the informer cache), not the interrupted node's offering again: EC2 has no spot
    m5.large left in us-west-2a (it is reclaiming it), and the pod may only run in us-west-2a."""
    karpflow.stack.faults.add_insufficient_capacity("m5.large", "us-west-2a", "spot")
    instance = await instance_of(karpflow, PINNED_A.name)

    async def zonal_runs_in_its_zone() -> dict | None:
        nodes = await karpflow.nodes()
        for pod in await karpflow.pods():
            if pod["metadata"]["namespace"] != "ml" or pod["metadata"].get("deletionTimestamp"):
                continue
            host = nodes.get(pod["spec"].get("nodeName") or "")
            if host and host["metadata"]["name"] != PINNED_A.name and pod["status"].get("phase") == "Running":
                return host
        return None

    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1) as w:
        queue.put_spot_interruption(instance)
        host = await karpflow.eventually(
            zonal_runs_in_its_zone,
            within=60,
            what=lambda: f"the zone-pinned pod running again, {w.interruptions.counters}",
        )
    labels = host["metadata"]["labels"]
    assert labels["topology.kubernetes.io/zone"] == "us-west-2a"
    assert (labels["node.kubernetes.io/instance-type"], labels["karpenter.sh/capacity-type"]) != (
        "m5.large",
        "spot",
    )


@pytest.mark.sim_stack(scenario=WORLD)
async def test_a_rebalance_replacement_counts_a_notready_node_against_the_budget(karpflow, queue):
    """Issue 17 item 13: one rule for "is this node disrupting" (planner/budgets.py). The pool allows
    one disruption, and B is NotReady: the planner counts it as disrupting, so does the rebalance."""
    await karpflow.kube.request(
        "PATCH",
        "/apis/karpenter.sh/v1/nodepools/default",
        body={
            "metadata": {"annotations": {REBALANCE_ANNOTATION: "true"}},
            "spec": {"disruption": {"budgets": [{"nodes": "1"}]}},
        },
        content_type="application/merge-patch+json",
    )
    sick = (await karpflow.nodes())[B.name]
    sick["status"]["conditions"] = [c for c in sick["status"]["conditions"] if c["type"] != "Ready"] + [
        {
            "type": "Ready",
            "status": "False",
            "reason": "KubeletNotReady",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ]
    await karpflow.kube.request("PUT", f"/api/v1/nodes/{B.name}/status", body=sick)
    instance = await instance_of(karpflow, A.name)
    rebalance = {
        **json.loads(_body(instance)),
        "detail-type": "EC2 Instance Rebalance Recommendation",
        "detail": {"instance-id": instance},
    }
    queue.send(json.dumps(rebalance))
    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1) as w:
        await karpflow.eventually(lambda: _async(w.interruptions.counters["deleted"] == 1), within=20)
    assert await runs_of(karpflow, rebalance_id(karpflow, instance)) == 0
    assert A.name in await karpflow.nodes()


KARPFLOW = Path(sys.executable).parent / "karpflow"


@pytest.mark.sim_stack(scenario=WORLD, secure=False)
async def test_karpflow_sim_interrupt_sends_what_ec2_and_aws_health_send(karpflow, queue):
    """`karpflow sim interrupt NODE --kind ...` puts the event on EventBridge; the queue's rules
    deliver it and the worker reads it as it reads AWS's (docs/interruption.md)."""
    instance = await instance_of(karpflow, A.name)

    async def interrupt(kind: str, *more: str) -> str:
        sim = ["sim", "--url", karpflow.stack.kube_url, "--kubeconfig", str(karpflow.stack.kubeconfig_path)]
        done = await karpflow.run(str(KARPFLOW), *sim, "interrupt", A.name, "--kind", kind, *more)
        return done.stdout

    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1) as w:
        said = await interrupt("health")
        assert f"Sent the health event for {instance} (node {A.name}) through EventBridge" in said, said
        await karpflow.eventually(
            lambda: _async(w.interruptions.counters.get("kind:Unknown") == 1 and queue.depth() == 0),
            within=30,
            what=lambda: f"the AWS Health issue read and deleted, {w.interruptions.counters}",
        )
        assert not w.interruptions.counters.get("acted")  # nobody acts on an issue
        # Straight onto the queue, as a rule would have delivered it.
        said = await interrupt("rebalance", "--queue", queue.url)
        assert f"to {queue.url}" in said, said
        await karpflow.eventually(
            lambda: _async(w.interruptions.counters.get("kind:RebalanceRecommendation") == 1),
            within=30,
            what=lambda: f"the rebalance recommendation read, {w.interruptions.counters}",
        )
        await interrupt("spot")

        async def spot_started() -> bool:
            return await runs_of(karpflow, spot_id(karpflow, instance)) == 1

        await karpflow.eventually(spot_started, within=30, what=lambda: str(w.interruptions.counters))
        assert w.interruptions.counters["kind:SpotInterruption"] == 1
    refused = await karpflow.run(
        str(KARPFLOW), "sim", "--url", karpflow.stack.kube_url, "interrupt", "no-such-node", "--kind", "spot",
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "404" in refused.stderr, refused.stderr
