"""An emptiness command on a node whose pods cost nothing to evict (Karpenter v1.14 `Candidate.IsEmpty`):
the taint activity's guard takes the node, and its termination drains those pods as any drain does;
the simulated kube-scheduler places them elsewhere. Real Temporal dev server, emulator, moto, worker."""

from __future__ import annotations

import pytest

from sim.testing import assert_no_violations
from tests.integration.workflows.conftest import Workload, node, scenario

pytestmark = pytest.mark.integration

A, B = node("172.31.1.10", "m5.xlarge"), node("172.31.2.20", "m5.xlarge")
# The annotation's minimum: eviction cost clamped to -10, so B counts as empty.
FREE = {"controller.kubernetes.io/pod-deletion-cost": "-2147483647"}
PODS = [
    Workload("shop", "web", "100m", "128Mi", ["10"]),
    Workload("batch", "scratch", "100m", "128Mi", ["20", "20"], annotations=FREE),
]


@pytest.mark.sim_stack(scenario=scenario([A, B], PODS))
async def test_a_node_whose_pods_cost_nothing_to_evict_is_emptied_and_its_pods_move(karpflow):
    async with karpflow.worker():
        handle = await karpflow.client.start_workflow(
            "DisruptionWorkflow",
            {"reason": "Empty", "nodes": [B.name]},
            id=karpflow.workflow_id("disruption/default/Empty/free-pods"),
            task_queue=karpflow.task_queue,
        )
        status = await handle.result()

        async def moved() -> bool:
            scratch = [p for p in await karpflow.pods() if p["metadata"]["namespace"] == "batch"]
            return len(scratch) == 2 and all(p["spec"].get("nodeName") == A.name for p in scratch)

        await karpflow.eventually(moved, within=60, what="the batch pods running on A")
    assert status["phase"] == "Succeeded"
    (candidate,) = status["candidates"]
    assert candidate["node"] == B.name and candidate["tainted"]
    assert B.name not in await karpflow.nodes()
    assert_no_violations(karpflow.stack)
