"""Capacity reservations' warnings end to end: `karpflow sim interrupt` puts EC2's event on
EventBridge, the queue's rules deliver it, and the worker's poller drains and replaces the nodes
(docs/interruption.md). Real parts: moto SQS and EventBridge, the emulator, the Temporal dev server,
the worker, the karpflow CLI. The node's reservation label is set with kubectl here, standing in for
the registration of a node launched into a capacity block (tests/integration/controller/
test_reserved_capacity.py launches one for real)."""

from __future__ import annotations

import pytest

from api.workflow_ids import interruption_workflow_id
from tests.integration.interruption.test_interruption import (
    KARPFLOW,
    WORLD,
    A,
    _async,
    instance_of,
    replaced,
    runs_of,
)

pytestmark = pytest.mark.integration


@pytest.mark.sim_stack(scenario=WORLD, secure=False)
async def test_a_capacity_blocks_expiration_warning_drains_and_replaces_its_node(karpflow, queue):
    instance = await instance_of(karpflow, A.name)
    env = karpflow.stack.client_env()
    await karpflow.run(
        "kubectl", "label", "node", A.name,
        "karpenter.k8s.aws/capacity-reservation-id=cr-0block1",
        "karpenter.k8s.aws/capacity-reservation-type=capacity-block",
        **env,
    )  # fmt: skip
    async with karpflow.worker(interruption_queue=queue.name, interruption_wait=1) as w:
        sim = ["sim", "--url", karpflow.stack.kube_url, "--kubeconfig", str(karpflow.stack.kubeconfig_path)]
        done = await karpflow.run(
            str(KARPFLOW), *sim, "interrupt", A.name, "--kind", "capacity-block-expiration"
        )
        assert "Sent the capacity-block-expiration event" in done.stdout, done.stdout
        workflow_id = interruption_workflow_id(
            karpflow.stack.cluster_name, instance, "capacity-block-expiration"
        )

        async def started() -> bool:
            return await runs_of(karpflow, workflow_id) == 1

        await karpflow.eventually(started, within=30, what=lambda: str(w.interruptions.counters))
        await karpflow.eventually(
            lambda: replaced(karpflow, A.name),
            within=60,
            what=lambda: f"replacement, {w.interruptions.counters}",
        )
        await karpflow.eventually(lambda: _async(queue.depth() == 0), within=10, what="queue empty")
        assert w.interruptions.counters["kind:CapacityBlockExpiration"] == 1
