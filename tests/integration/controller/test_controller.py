"""ControllerWorkflow end to end: the real worker starts it, it plans on its informer cache and starts
DisruptionWorkflows on its own (real Temporal dev server, the emulator, moto)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from typing import Any

import pytest

from api.constants import DISRUPTED_TAINT_KEY
from api.controller_io import ControllerStatus
from api.workflow_ids import controller_workflow_id
from sim.scenario import scenario_from_documents
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
    return scenario_from_documents([listing], "controller test scenario")


A, B = node("172.31.1.10", "m5.xlarge"), node("172.31.2.20", "m5.xlarge")
TWENTY_PODS = [Workload("shop", "web", "100m", "128Mi", ["10"] * 10 + ["20"] * 10, pdb={"maxUnavailable": 2})]


async def status(karpflow: Any) -> ControllerStatus:
    handle = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
    return await handle.query("status", result_type=ControllerStatus)


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
    async with karpflow.worker(**FAST):
        final = await until_quiet(karpflow, after_passes=3)
        nodes = await karpflow.nodes()
    assert final.passes >= 3
    assert len(nodes) == 1 and not set(nodes) & {A.name, B.name}, nodes
    assert not any(
        t.get("key") == DISRUPTED_TAINT_KEY for n in nodes.values() for t in n["spec"].get("taints") or []
    )
    running = {i["InstanceId"] for i in karpflow.instances()}
    assert len(running) == 1 and not running & before
    assert_no_violations(karpflow.stack)
