"""Where a termination's drain deadline comes from (issue 17 item 1): the NodePool's grace period as
karpflow reads it, karpflow.dev/termination-grace-period first (it was ignored at termination time),
and an invalid one read as no deadline, never as a deadline in the past nor as the template's value."""

from __future__ import annotations

import asyncio

import pytest

from api.constants import TERMINATION_TIMESTAMP_ANNOTATION
from tests.integration.workflows.conftest import node, scenario
from tests.integration.workflows.test_termination import HELD, _only_trainer_left, pods_on

pytestmark = pytest.mark.integration

A, B = node("172.31.1.10"), node("172.31.2.20")


async def annotate(karpflow, value: str) -> None:
    await karpflow.run(
        "kubectl",
        "annotate",
        "nodepool",
        "default",
        f"karpflow.dev/termination-grace-period={value}",
        KUBECONFIG=str(karpflow.stack.kubeconfig_path),
    )


@pytest.mark.sim_stack(scenario=scenario([A, B], HELD))
async def test_the_grace_period_annotation_sets_the_drain_deadline(karpflow):
    await annotate(karpflow, "4s")
    async with karpflow.worker():
        handle = await karpflow.start_termination(A.name)
        status = await asyncio.wait_for(handle.result(), 60)  # without a deadline it would never end
    assert status.deadline is not None and status.pods_deleted == 1  # the held pod went at the deadline
    assert A.name not in await karpflow.nodes()


@pytest.mark.sim_stack(scenario=scenario([A, B], HELD, termination_grace_period="4s"))
async def test_an_invalid_grace_period_annotation_is_no_deadline(karpflow):
    await annotate(karpflow, "-1h")
    async with karpflow.worker():
        handle = await karpflow.start_termination(A.name)
        await karpflow.eventually(lambda: _only_trainer_left(karpflow), within=10, what="web pods evicted")
        await asyncio.sleep(6)  # past the template's 4s: its value must not be used instead
        node_now = (await karpflow.nodes())[A.name]
        trainers = [p for p in await pods_on(karpflow, A.name) if p["metadata"]["namespace"] == "ml"]
        await handle.terminate("test over")
    assert TERMINATION_TIMESTAMP_ANNOTATION not in (node_now["metadata"].get("annotations") or {})
    assert len(trainers) == 1 and not trainers[0]["metadata"].get("deletionTimestamp")
