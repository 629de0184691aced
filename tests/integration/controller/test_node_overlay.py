"""A NodeOverlay applied on the emulator changes a consolidation decision (issue 33 item 5).

Real pieces: the emulator serving NodeOverlay with Karpenter's CRD, the worker's ClusterCache (its
informer lists and watches NodeOverlays) and the planning activity, on the Temporal dev server's
client. Two planning activities share the cache: one with the NodeOverlay gate on, one with it off
(Karpenter's default).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest
from temporalio.testing import ActivityEnvironment

from activities.planning import PlanningActivities
from api.controller_io import PassRequest, PassResult
from cluster.informer import ClusterCache
from planner.model import PlanOptions
from tests.integration.controller.test_controller import scenario
from tests.integration.workflows.conftest import Workload, node

pytestmark = pytest.mark.integration

# One on-demand m5.xlarge holding two small pods: single-node consolidation replaces it with a
# cheaper, smaller node.
OVERSIZED = scenario(
    [node("172.31.1.10", "m5.xlarge")], [Workload("shop", "web", "100m", "128Mi", ["10"] * 2)]
)

# Every offering at $9/h, the node's own too: no replacement is cheaper than the node.
FLAT_PRICE = {
    "apiVersion": "karpenter.sh/v1alpha1",
    "kind": "NodeOverlay",
    "metadata": {"name": "flat-price"},
    "spec": {"requirements": [{"key": "karpenter.sh/capacity-type", "operator": "Exists"}], "price": "9"},
}


async def pass_of(env: ActivityEnvironment, planning: PlanningActivities) -> PassResult:
    result: PassResult = await env.run(planning.plan_pass, PassRequest())
    return result


async def until(
    planning: PlanningActivities, env: ActivityEnvironment, wanted: bool, within: float
) -> PassResult:
    """Passes until one has a command (wanted) or none (not wanted); consolidateAfter is 1 s."""
    deadline = time.monotonic() + within
    while True:
        result = await pass_of(env, planning)
        if bool(result.commands) == wanted or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.5)


@pytest.mark.sim_stack(scenario=OVERSIZED, secure=False)
async def test_a_node_overlay_applied_on_the_emulator_stops_a_replace_it_made_cheaper_nowhere(karpflow):
    cache = ClusterCache(karpflow.kube)
    cache.start()
    env = ActivityEnvironment()
    gated = PlanningActivities(
        cache,
        karpflow.kube,
        karpflow.client,
        task_queue=karpflow.task_queue,
        options=PlanOptions(node_overlay=True),
    )
    default = PlanningActivities(cache, karpflow.kube, karpflow.client, task_queue=karpflow.task_queue)
    try:
        assert await cache.wait_ready(30)
        before = await until(gated, env, wanted=True, within=20)
        (command,) = before.commands
        assert (command.method, command.decision) == ("single-node-consolidation", "replace")

        created = await karpflow.kube.request(
            "POST", "/apis/karpenter.sh/v1alpha1/nodeoverlays", body=FLAT_PRICE
        )
        assert created["metadata"]["name"] == "flat-price"
        deadline = time.monotonic() + 20
        while "flat-price" not in cache.snapshot(datetime.now(UTC)).node_overlays:
            assert time.monotonic() < deadline, "the informer never saw the NodeOverlay"
            await asyncio.sleep(0.2)

        after = await pass_of(env, gated)
        assert after.commands == []
        assert after.reasons is not None
        reasons = (
            {**before.reasons.changed, **after.reasons.changed} if before.reasons else after.reasons.changed
        )
        (why,) = reasons.values()
        assert "Can't replace with a cheaper node (current $9.0000/h)" in why, why
        # The gate off (Karpenter's default): the overlay is read and ignored.
        (still,) = (await pass_of(env, default)).commands
        assert still.decision == "replace"
    finally:
        await cache.stop()
