"""The informer against the emulator over HTTP: list, then watch; a reload (every open watch ends
with 410 Gone) makes it re-list; a pass reads the cache and sends no request."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from activities.planning import PlanningActivities
from api.controller_io import PassInput
from cluster.informer import Informer, default_resources
from tests.integration.workflows.conftest import Workload, node, scenario

pytestmark = pytest.mark.integration

A, B = node("172.31.1.10", "m5.xlarge"), node("172.31.2.20", "m5.xlarge")
PODS = [Workload("shop", "web", "100m", "128Mi", ["10", "20"] * 3)]


async def eventually(check: Any, within: float = 20) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.mark.sim_stack(scenario=scenario([A, B], PODS))
async def test_the_informer_lists_watches_and_relists_after_410(karpflow):
    informer = Informer(karpflow.kube, default_resources("karpenter"), watch_timeout=30, retry_seconds=0.1)
    task = asyncio.create_task(informer.run())
    try:
        await eventually(lambda: informer.synced)
        assert informer.count("Node") == 2 and informer.count("NodePool") == 1
        assert informer.count("Pod") == len(await karpflow.pods())

        # A watch event: a node's label changes, the cache follows without a list.
        requests = informer.requests

        def label(n: dict[str, Any]) -> bool:
            n["metadata"].setdefault("labels", {})["seen"] = "yes"
            return True

        await karpflow.kube.update_node(A.name, label)
        await eventually(
            lambda: any(
                (o["metadata"].get("labels") or {}).get("seen") == "yes"
                for o in informer.objects()
                if o["kind"] == "Node"
            )
        )
        assert informer.requests == requests

        # A planning pass reads the cache only.
        planning = PlanningActivities(informer, karpflow.kube, None, region="us-west-2")
        out = await planning.plan_pass(PassInput())
        assert out.synced and informer.requests == requests

        # Reloading the emulator ends every watch with 410: the informer re-lists the new cluster.
        await asyncio.to_thread(karpflow.stack.load_scenario, scenario([A], PODS[:0]))
        await eventually(lambda: informer.count("Node") == 1 and informer.count("Pod") == 1)
        assert sum(s.relists for s in informer.stores.values()) >= 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
