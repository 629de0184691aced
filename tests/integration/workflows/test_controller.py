"""The controller on the local stack: karpflow acts on its own.

A fragmented cluster (40 nodes, each a quarter used) is left to the ControllerWorkflow: it must
consolidate to a lower hourly cost with the invariant checker at zero, and never have more nodes of
the pool disrupting at once than the budget allows (checked continuously while it works).
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.client import Client

from api.controller_io import ControllerStatus
from api.workflow_ids import controller_workflow_id
from planner.catalog import bundled_catalog
from sim.scenario import scenario_from_documents
from sim.scenarios import generate_demo as gen
from sim.testing import assert_no_violations

from .conftest import DemoNode, Workload, assert_rbac_allows, worker_requests

pytestmark = pytest.mark.integration

BUDGET = 5
KARPFLOW = os.path.join(os.path.dirname(sys.executable), "karpflow")
FRAGMENTED = [
    DemoNode(
        f"172.31.1.{10 + i}", "m5.xlarge", "us-west-2a", "on-demand", "default", timedelta(days=3), "frag"
    )
    for i in range(40)
]
# Two 500m / 1Gi pods per 4-vCPU node: the whole load fits on about a quarter of the nodes.
LOAD = [
    Workload("shop", f"svc-{i}", "500m", "1Gi", [n.ip.rsplit(".", 1)[-1]] * 2, pdb={"maxUnavailable": 1})
    for i, n in enumerate(FRAGMENTED)
]


def fragmented_scenario() -> Any:
    nodes = [n for n in FRAGMENTED]
    listing = copy.deepcopy(gen.scenario_list(nodes, LOAD))
    for item in listing["items"]:
        if item["kind"] == "NodePool":
            disruption = item["spec"]["disruption"]
            disruption["consolidateAfter"] = "0s"
            disruption["budgets"] = [{"nodes": str(BUDGET)}]
    return scenario_from_documents([listing], "fragmented")


def hourly_cost(instances: list[dict[str, Any]]) -> float:
    catalog = bundled_catalog("us-west-2")
    total = 0.0
    for instance in instances:
        kind = catalog.get(instance["InstanceType"])
        total += kind.price(instance["Placement"]["AvailabilityZone"], "on-demand") if kind else 0.0
    return total


def disrupting(nodes: dict[str, dict[str, Any]]) -> list[str]:
    """Nodes a budget counts as disrupting: tainted karpenter.sh/disrupted or being deleted."""
    return sorted(
        name
        for name, node in nodes.items()
        if node["metadata"].get("deletionTimestamp")
        or any(t.get("key") == "karpenter.sh/disrupted" for t in node["spec"].get("taints") or ())
    )


# Once again when it fails: at time scale 1/100 its 240 s bound has run out on a loaded 2-core
# machine (README, "Tests"); a second failure is a real one.
@pytest.mark.flaky(reruns=1)
@pytest.mark.slow
@pytest.mark.sim_stack(scenario=fragmented_scenario(), time_scale=0.01)
async def test_a_fragmented_cluster_consolidates_on_its_own_within_its_budget(karpflow):
    before = hourly_cost(karpflow.instances())
    now_disrupting = set(disrupting(await karpflow.nodes()))
    worst = sorted(now_disrupting)

    def watch_budget(event: Any) -> None:
        # Every change to a Node as the emulator stores it: a poll of the API every 20 ms missed what
        # lasted less, and listing 40 nodes 50 times a second was a fifth of the test's CPU.
        nonlocal worst
        if event.resource.plural != "nodes":
            return
        if event.type != "DELETED" and disrupting({event.name: event.object}):
            now_disrupting.add(event.name)
        else:
            now_disrupting.discard(event.name)
        if len(now_disrupting) > len(worst):
            worst = sorted(now_disrupting)

    stop_watching = karpflow.stack.store.add_listener(watch_budget)
    handle = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
    status = ControllerStatus()
    try:
        async with karpflow.worker(controller=True, controller_interval=0.3, controller_validation=0.5):

            async def converged() -> bool:
                nonlocal status
                try:
                    status = await handle.query("status", result_type=ControllerStatus)
                except Exception:
                    return False
                return status.passes > 1 and status.quiet

            await karpflow.eventually(converged, within=240, what=lambda: status.model_dump_json(indent=1))
            # What an operator sees: `karpflow status` through the real CLI.
            shown = await karpflow.run(
                KARPFLOW,
                "status",
                "--output",
                "json",
                "--cluster-name",
                karpflow.stack.cluster_name,
                KARPFLOW_TEMPORAL_ADDRESS=karpflow.temporal_address,
                KARPFLOW_TASK_QUEUE=karpflow.task_queue,
            )
            assert json.loads(shown.stdout)["quiet"] is True
            await handle.terminate("test over")
    finally:
        stop_watching()

    after = hourly_cost(karpflow.instances())
    nodes = await karpflow.nodes()
    assert after < before * 0.6, (before, after, sorted(nodes))
    # Never more nodes disrupting at once than the budget allows (the pool has 40, the budget 5).
    assert 0 < len(worst) <= BUDGET, worst
    assert math.isclose(before, 40 * 0.192, rel_tol=0.01)
    assert_no_violations(karpflow.stack)
    # ('', ''): the informer asking for the seed-era kinds the emulator does not serve (404).
    calls = {call for call in worker_requests(karpflow.stack) if call != ("", "")}
    assert {("list", "pods"), ("list", "nodepools"), ("list", "poddisruptionbudgets")} <= calls
    assert_rbac_allows(calls)
    print(
        f"fragmented 40 nodes: ${before:.3f}/h -> ${after:.3f}/h on {len(nodes)} nodes; "
        f"at most {len(worst)} disrupting"
    )


SMALL = FRAGMENTED[:12]


def small_scenario() -> Any:
    listing = copy.deepcopy(gen.scenario_list(list(SMALL), LOAD[:12]))
    for item in listing["items"]:
        if item["kind"] == "NodePool":
            item["spec"]["disruption"]["consolidateAfter"] = "0s"
            item["spec"]["disruption"]["budgets"] = [{"nodes": "3"}]
    return scenario_from_documents([listing], "fragmented-12")


async def controller_status(client: Client, cluster: str) -> ControllerStatus | None:
    try:
        handle = client.get_workflow_handle(controller_workflow_id(cluster))
        return await handle.query("status", result_type=ControllerStatus)
    except Exception:
        return None


async def disruptions(karpflow: Any) -> list[tuple[str, str]]:
    """(workflow id, status) of every DisruptionWorkflow run of this test."""
    query = f"TaskQueue = '{karpflow.task_queue}' AND WorkflowType = 'DisruptionWorkflow'"
    return [(e.id, e.status.name) async for e in karpflow.client.list_workflows(query)]


@pytest.mark.slow
@pytest.mark.sim_stack(scenario=small_scenario(), time_scale=0.01)
async def test_a_worker_killed_mid_pass_and_mid_command_leaves_nothing_behind(karpflow):
    """SIGKILL the worker while the controller validates a command, and again while a disruption
    runs; a new worker finishes: no command started twice, no taint left, no instance leaked."""
    env = {
        "KARPFLOW_CONTROLLER": "true",
        "KARPFLOW_CONTROLLER_INTERVAL": "0.3",
        "KARPFLOW_CONTROLLER_VALIDATION": "2",
    }
    cluster = karpflow.stack.cluster_name
    workers = [karpflow.worker_process(**env)]
    try:

        async def validating() -> bool:
            status = await controller_status(karpflow.client, cluster)
            return bool(status and status.validating)

        await karpflow.eventually(validating, within=60, what=karpflow.worker_logs)
        workers[-1].send_signal(signal.SIGKILL)  # mid-pass: a command waits for its validation
        workers[-1].wait()
        workers.append(karpflow.worker_process(**env))

        async def running() -> bool:
            return any(state == "RUNNING" for _, state in await disruptions(karpflow))

        await karpflow.eventually(running, within=60, what=karpflow.worker_logs)
        workers[-1].send_signal(signal.SIGKILL)  # mid-command: a disruption is under way
        workers[-1].wait()
        workers.append(karpflow.worker_process(**env))

        async def quiet() -> bool:
            status = await controller_status(karpflow.client, cluster)
            return bool(status and status.quiet and status.passes > 1)

        await karpflow.eventually(quiet, within=180, what=karpflow.worker_logs)
    finally:
        for process in workers:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=30)
        await karpflow.client.get_workflow_handle(controller_workflow_id(cluster)).terminate("test over")

    runs = await disruptions(karpflow)
    ids = [workflow_id for workflow_id, _ in runs]
    assert runs and len(ids) == len(set(ids)), f"a command was started twice: {sorted(ids)}"
    assert all(state == "COMPLETED" for _, state in runs), runs
    assert len(await karpflow.nodes()) < len(SMALL)
    assert_no_violations(karpflow.stack)  # no taint left, no leaked instance, no PDB broken


OLD = DemoNode("172.31.1.60", "m5.large", "us-west-2a", "on-demand", "default", timedelta(days=3), "expired")
NEW = DemoNode("172.31.1.61", "m5.large", "us-west-2a", "on-demand", "default", timedelta(hours=5), "full")


def expiring_scenario() -> Any:
    workloads = [
        Workload("shop", "big", "1500m", "1Gi", ["60"]),  # fits on no other node
        Workload("shop", "fill", "1500m", "1Gi", ["61"]),
    ]
    listing = copy.deepcopy(gen.scenario_list([OLD, NEW], workloads))
    for item in listing["items"]:
        if item["kind"] == "NodePool":
            item["spec"]["template"]["spec"]["expireAfter"] = "48h"
            item["spec"]["disruption"]["consolidateAfter"] = "Never"
    return scenario_from_documents([listing], "expiring")


@pytest.mark.sim_stack(scenario=expiring_scenario(), time_scale=0.01)
async def test_an_expired_node_gets_capacity_for_its_pods_before_it_drains(karpflow):
    """Karpenter would leave `big` Pending until its provisioner reacts; karpflow launches first."""
    from api.workflow_io import DisruptionStatus

    async with karpflow.worker(controller=True, controller_interval=0.3, controller_validation=0.5):

        async def started() -> list[str]:
            return [i for i, _ in await disruptions(karpflow) if "/Expired/" in i]

        (workflow_id,) = await karpflow.eventually(started, within=60)
        handle = karpflow.client.get_workflow_handle(workflow_id, result_type=DisruptionStatus)
        result = await handle.result()
        assert result.phase == "Succeeded" and result.forceful
        (replacement,) = result.replacements
        assert replacement.state == "Initialized"

        async def big_moved() -> bool:
            pods = [p for p in await karpflow.pods() if p["metadata"]["name"].startswith("big-")]
            return bool(pods) and all(
                p["spec"].get("nodeName") == replacement.node and p["status"]["phase"] == "Running"
                for p in pods
            )

        await karpflow.eventually(big_moved, within=60)
        await karpflow.client.get_workflow_handle(
            controller_workflow_id(karpflow.stack.cluster_name)
        ).terminate("test over")
    assert OLD.name not in await karpflow.nodes()
    assert_no_violations(karpflow.stack)


@pytest.mark.sim_stack(scenario=expiring_scenario(), time_scale=0.01)
async def test_karpflow_plan_live_plans_on_the_cluster_itself(karpflow):
    shown = await karpflow.run(
        KARPFLOW, "plan", "--live", "--output", "json", KUBECONFIG=str(karpflow.stack.kubeconfig_path)
    )
    planned = json.loads(shown.stdout)
    assert [(c["reason"], c["nodes"]) for c in planned["commands"]] == [("Expired", [OLD.name])]
    assert planned["summary"]["nodes"] == 2
    refused = await karpflow.run(KARPFLOW, "plan", check=False)
    assert refused.returncode == 2 and "give --snapshot FILE or --live" in refused.stderr


REPAIR_POOL = [
    DemoNode(f"172.31.1.{70 + i}", "m5.xlarge", "us-west-2a", "on-demand", "default", timedelta(days=3), "r")
    for i in range(5)
]


def repair_scenario(nodes: list[Any]) -> Any:
    workloads = [
        Workload("shop", f"r-{n.ip.rsplit('.', 1)[-1]}", "500m", "1Gi", [n.ip.rsplit(".", 1)[-1]])
        for n in nodes
    ]
    listing = copy.deepcopy(gen.scenario_list(list(nodes), workloads))
    for item in listing["items"]:
        if item["kind"] == "NodePool":
            item["spec"]["disruption"]["consolidateAfter"] = "Never"  # only repair may act here
    return scenario_from_documents([listing], "repair")


async def set_not_ready(karpflow: Any, name: str, since: timedelta) -> None:
    """What the node lifecycle controller records when a kubelet stops: Ready False since `since` ago."""
    node = (await karpflow.nodes())[name]
    at = (datetime.now(UTC) - since).strftime("%Y-%m-%dT%H:%M:%SZ")
    node["status"]["conditions"] = [c for c in node["status"]["conditions"] if c["type"] != "Ready"] + [
        {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "lastTransitionTime": at}
    ]
    await karpflow.kube.request("PUT", f"/api/v1/nodes/{name}/status", body=node)


@pytest.mark.sim_stack(scenario=repair_scenario(REPAIR_POOL), time_scale=0.01)
async def test_node_repair_replaces_a_node_not_ready_for_half_an_hour(karpflow):
    sick = REPAIR_POOL[0].name
    await set_not_ready(karpflow, sick, timedelta(minutes=31))
    async with karpflow.worker(controller=True, controller_interval=0.3, controller_validation=0.5):

        async def repaired() -> list[str]:
            return [
                i for i, state in await disruptions(karpflow) if "/Unhealthy/" in i and state == "COMPLETED"
            ]

        (repair_id,) = await karpflow.eventually(repaired, within=90)
        assert repair_id.startswith(f"disruption/{karpflow.stack.cluster_name}/default/Unhealthy/")
        await karpflow.client.get_workflow_handle(
            controller_workflow_id(karpflow.stack.cluster_name)
        ).terminate("test over")
    nodes = await karpflow.nodes()
    assert sick not in nodes and all(n.name in nodes for n in REPAIR_POOL[1:])
    assert_no_violations(karpflow.stack)


@pytest.mark.sim_stack(scenario=repair_scenario(REPAIR_POOL[:4]), time_scale=0.01)
async def test_no_repair_when_more_than_a_fifth_rounded_up_is_unhealthy(karpflow):
    """Karpenter allows ceil(20 %) unhealthy nodes per NodePool: 1 of 4 is repaired (the test above
    shows a repair), 2 of 4 is a sick pool, not a sick node."""
    sick = [n.name for n in REPAIR_POOL[:2]]
    for name in sick:
        await set_not_ready(karpflow, name, timedelta(hours=2))
    handle = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
    async with karpflow.worker(controller=True, controller_interval=0.3, controller_validation=0.5):

        async def a_few_passes() -> ControllerStatus | None:
            status = await controller_status(karpflow.client, karpflow.stack.cluster_name)
            return status if status and status.passes >= 5 else None

        status = await karpflow.eventually(a_few_passes, within=60)
        await handle.terminate("test over")
    assert await disruptions(karpflow) == []
    assert (
        "2 of 4 nodes of NodePool default are unhealthy (more than 1: 20% rounded up): no repair"
        in status.blocked[sick[0]]
    )
    assert set(sick) <= set(await karpflow.nodes())


ARM = DemoNode("172.31.1.90", "m7g.large", "us-west-2a", "on-demand", "arm", timedelta(days=3), "arm")
HOSTS = [
    DemoNode(f"172.31.1.{91 + i}", "m5.xlarge", "us-west-2a", "on-demand", "default", timedelta(days=3), "h")
    for i in range(2)
]


def two_pools() -> Any:
    workloads = [
        Workload("shop", "on-arm", "200m", "256Mi", ["90"]),
        Workload("shop", "on-default", "200m", "256Mi", ["91"]),
    ]
    listing = copy.deepcopy(gen.scenario_list([ARM, *HOSTS], workloads))
    for item in listing["items"]:
        if item["kind"] == "NodePool":
            item["spec"]["disruption"]["consolidateAfter"] = "Never"
    return scenario_from_documents([listing], "two pools")


@pytest.mark.sim_stack(scenario=two_pools(), time_scale=0.01)
async def test_deleting_a_nodepool_drains_and_terminates_its_nodes(karpflow):
    """karpflow holds NodePools with a finalizer, so a deleted pool waits until its nodes are gone
    (Karpenter's NodeClaim owner references give it the same cascade)."""
    path = "/apis/karpenter.sh/v1/nodepools/arm"
    async with karpflow.worker(controller=True, controller_interval=0.3, controller_validation=0.5):

        async def held() -> bool:
            return "karpflow.io/nodepool-nodes" in (await karpflow.kube.request("GET", path))["metadata"].get(
                "finalizers", []
            )

        await karpflow.eventually(held, within=30)
        await karpflow.run(
            "kubectl",
            "--kubeconfig",
            str(karpflow.stack.kubeconfig_path),
            "delete",
            "nodepool",
            "arm",
            "--wait=false",
        )

        async def pool_gone() -> bool:
            try:
                await karpflow.kube.request("GET", path)
            except Exception:
                return True
            return False

        await karpflow.eventually(pool_gone, within=90)
        await karpflow.client.get_workflow_handle(
            controller_workflow_id(karpflow.stack.cluster_name)
        ).terminate("test over")
    nodes = await karpflow.nodes()
    assert ARM.name not in nodes and all(h.name in nodes for h in HOSTS)
    runs = await disruptions(karpflow)
    assert [i for i, _ in runs if "/NodePoolDeleted/" in i], runs
    pods = [p for p in await karpflow.pods() if p["metadata"]["name"].startswith("on-arm-")]
    assert pods and all(p["spec"].get("nodeName") in {h.name for h in HOSTS} for p in pods)
    assert_no_violations(karpflow.stack)
