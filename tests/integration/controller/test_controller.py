"""ControllerWorkflow end to end: the real worker starts it, it plans on its informer cache and starts
DisruptionWorkflows on its own (real Temporal dev server, the emulator, moto)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
import signal
import time
from datetime import timedelta
from typing import Any

import pytest
import yaml

from api.constants import DISRUPTED_TAINT_KEY
from api.controller_io import QUERY_STATUS, ControllerStatus
from api.workflow_ids import controller_workflow_id
from api.workflow_io import DisruptionStatus
from sim.scenario import parse_scenario
from sim.scenarios import generate_demo as gen
from sim.testing import assert_no_violations
from tests.integration.workflows.conftest import Workload, node

pytestmark = pytest.mark.integration

FAST = {"controller": True, "controller_interval": 0.5, "controller_validation": 0.5}


def scenario(nodes: list[Any], workloads: list[Any], consolidate_after: str = "1s") -> Any:
    """The demo's shape with a short consolidateAfter, so that the cluster can go quiet in seconds."""
    nodes = [dataclasses.replace(n, pods=[]) for n in nodes]
    listing = copy.deepcopy(gen.scenario_list(nodes, workloads))
    for item in listing["items"]:
        if item["kind"] == "NodePool":
            item["spec"].setdefault("disruption", {})["consolidateAfter"] = consolidate_after
    return parse_scenario(yaml.safe_dump(listing), "controller test scenario")


A, B = node("172.31.1.10", "m5.xlarge"), node("172.31.2.20", "m5.xlarge")
TWENTY_PODS = [Workload("shop", "web", "100m", "128Mi", ["10"] * 10 + ["20"] * 10, pdb={"maxUnavailable": 2})]


async def status(karpflow: Any) -> ControllerStatus:
    handle = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
    return await handle.query(QUERY_STATUS, result_type=ControllerStatus)


async def until_quiet(karpflow: Any, within: float = 90, after_passes: int = 1) -> ControllerStatus:
    deadline = time.monotonic() + within
    last: ControllerStatus | None = None
    while time.monotonic() < deadline:
        try:
            last = await status(karpflow)
        except Exception:
            last = None
        if last is not None and last.quiet and last.passes >= after_passes:
            return last
        await asyncio.sleep(0.3)
    raise AssertionError(f"controller not quiet after {within}s: {last}")


@pytest.mark.sim_stack(scenario=scenario([A, B], TWENTY_PODS))
async def test_the_worker_starts_the_controller_and_it_consolidates_two_nodes_into_one(karpflow):
    before = {i["InstanceId"] for i in karpflow.instances()}
    async with karpflow.worker(**FAST) as worker:
        assert worker.informer is not None
        final = await until_quiet(karpflow, after_passes=3)
        nodes = await karpflow.nodes()
    assert final.synced and final.passes >= 3
    assert len(nodes) == 1 and not set(nodes) & {A.name, B.name}, nodes
    assert not any(
        t.get("key") == DISRUPTED_TAINT_KEY for n in nodes.values() for t in n["spec"].get("taints") or []
    )
    running = {i["InstanceId"] for i in karpflow.instances()}
    assert len(running) == 1 and not running & before
    assert_no_violations(karpflow.stack)


# -- a fragmented cluster: 40 m5.large, each about a fifth used ---------------------------------------

FORTY = [node(f"172.31.{i // 4}.{10 + i}", "m5.large") for i in range(40)]
SPREAD = [Workload("shop", "api", "200m", "256Mi", [str(10 + i) for i in range(40)] * 2)]


def hourly_cost(karpflow: Any) -> float:
    from planner.catalog import bundled_catalog

    catalog = bundled_catalog("us-west-2")
    total = 0.0
    for instance in karpflow.instances():
        itype = catalog.get(instance["InstanceType"])
        total += itype.price(instance["Placement"]["AvailabilityZone"], "on-demand")
    return total


def disrupting(nodes: dict[str, Any]) -> int:
    return sum(
        1
        for n in nodes.values()
        if n["metadata"].get("deletionTimestamp")
        or any(t.get("key") == DISRUPTED_TAINT_KEY for t in n["spec"].get("taints") or [])
    )


async def watch_budget(karpflow: Any, percent: int, breaches: list[str], stop: asyncio.Event) -> int:
    """Every 100 ms: nodes disrupting at once never exceed the pool's `nodes: <percent>%` budget."""
    peak = 0
    while not stop.is_set():
        nodes = await karpflow.nodes()
        now = disrupting(nodes)
        peak = max(peak, now)
        allowed = math.ceil(percent * len(nodes) / 100)
        if now > allowed:
            breaches.append(f"{now} disrupting of {len(nodes)} nodes, budget {allowed}")
        await asyncio.sleep(0.1)
    return peak


@pytest.mark.sim_stack(scenario=scenario(FORTY, SPREAD))
async def test_a_fragmented_cluster_of_40_nodes_consolidates_within_its_budget(karpflow):
    cost_before = hourly_cost(karpflow)
    breaches: list[str] = []
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_budget(karpflow, 20, breaches, stop))
    async with karpflow.worker(**FAST):
        await until_quiet(karpflow, within=240, after_passes=3)
    stop.set()
    peak = await watcher
    cost_after = hourly_cost(karpflow)
    nodes = await karpflow.nodes()
    assert not breaches, breaches[:5]
    assert peak >= 1  # the watcher saw the disruptions it judges
    assert cost_after < cost_before / 2, (cost_before, cost_after, len(nodes))
    assert len(karpflow.instances()) == len(nodes)  # no instance without its node (no leak)
    assert_no_violations(karpflow.stack)


# -- SIGKILL of the worker in the middle of a command, then a restart -----------------------------------


@pytest.mark.sim_stack(
    scenario=scenario(
        FORTY[:12], [Workload("shop", "api", "200m", "256Mi", [str(10 + i) for i in range(12)] * 2)]
    )
)
async def test_a_worker_killed_mid_command_restarts_without_starting_anything_twice(karpflow):
    env = {
        "KARPFLOW_CONTROLLER": "true",
        "KARPFLOW_CONTROLLER_INTERVAL": "0.5",
        "KARPFLOW_CONTROLLER_VALIDATION": "0.5",
    }
    first = karpflow.worker_process(**env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            query = f'TaskQueue="{karpflow.task_queue}" AND WorkflowType="DisruptionWorkflow"'
            if [wf async for wf in karpflow.client.list_workflows(query)]:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the controller started no disruption")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    second = karpflow.worker_process(**env)
    try:
        await until_quiet(karpflow, within=180, after_passes=2)
    finally:
        second.terminate()
        second.wait(30)
    ids: dict[str, int] = {}
    query = f'TaskQueue="{karpflow.task_queue}" AND WorkflowType="DisruptionWorkflow"'
    async for wf in karpflow.client.list_workflows(query):
        ids[wf.id] = ids.get(wf.id, 0) + 1
    assert ids and all(count == 1 for count in ids.values()), ids
    nodes = await karpflow.nodes()
    assert disrupting(nodes) == 0
    assert len(karpflow.instances()) == len(nodes) < 12
    assert_no_violations(karpflow.stack)


# -- expiration: forceful, and the pods get their replacement before the drain ---------------------------

OLD = dataclasses.replace(node("172.31.3.30", "m5.xlarge"), age=timedelta(days=31))  # expireAfter 720h
BUSY = [Workload("shop", "big", "3", "4Gi", ["30"])]  # fits on no other node: there is none


@pytest.mark.sim_stack(scenario=scenario([OLD], BUSY, consolidate_after="Never"))
async def test_an_expired_node_whose_pods_fit_nowhere_gets_a_replacement_before_its_drain(karpflow):
    async with karpflow.worker(**FAST):
        await until_quiet(karpflow, within=120, after_passes=2)
        query = f'TaskQueue="{karpflow.task_queue}" AND WorkflowType="DisruptionWorkflow"'
        runs = [wf async for wf in karpflow.client.list_workflows(query)]
        assert len(runs) == 1 and "/Expired/" in runs[0].id, [r.id for r in runs]
        handle = karpflow.client.get_workflow_handle(runs[0].id, result_type=DisruptionStatus)
        result = await handle.result()
    assert result.phase == "Succeeded"
    replacement = result.replacements[0]
    assert replacement.state == "Initialized"
    nodes = await karpflow.nodes()
    assert set(nodes) == {replacement.node}
    big = [p for p in await karpflow.pods() if p["metadata"]["namespace"] == "shop"]
    assert big and all(p["spec"].get("nodeName") == replacement.node for p in big)
    assert_no_violations(karpflow.stack)
