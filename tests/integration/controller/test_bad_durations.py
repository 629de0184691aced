"""A negative duration on the local stack (issue 17 item 1): `kubectl annotate nodepool default
karpflow.dev/expire-after=-1h` is reported by `karpflow plan --live` and by `karpflow status` (the
controller's status query), and the controller expires nothing. It used to expire every node of the
pool, then each replacement seconds after it registered."""

from __future__ import annotations

import json
import os
import sys

import pytest

from api.constants import DISRUPTED_TAINT_KEY
from tests.integration.workflows.conftest import node

from .test_controller import FAST, scenario, status

pytestmark = pytest.mark.integration

KARPFLOW = os.path.join(os.path.dirname(sys.executable), "karpflow")
# Three days old: any expireAfter shorter than that (and a negative one) expires them at once.
A, B = node("172.31.1.10", "m5.large"), node("172.31.2.20", "m5.large")
PROBLEM = "karpflow.dev/expire-after='-1h': invalid duration '-1h': must not be negative"


@pytest.mark.sim_stack(scenario=scenario([A, B], [], consolidate_after="Never"))
async def test_a_negative_expire_after_is_reported_and_expires_nothing(karpflow):
    env = {"KUBECONFIG": str(karpflow.stack.kubeconfig_path)}
    await karpflow.run("kubectl", "annotate", "nodepool", "default", "karpflow.dev/expire-after=-1h", **env)
    before = {i["InstanceId"] for i in karpflow.instances()}

    shown = json.loads((await karpflow.run(KARPFLOW, "plan", "--live", "--output", "json", **env)).stdout)
    assert shown["commands"] == []
    assert any(PROBLEM in p for p in shown["problems"]), shown["problems"]

    async with karpflow.worker(**FAST):
        final = await karpflow.eventually(
            lambda: _after_passes(karpflow, 5), within=60, what="five controller passes"
        )
        text = await karpflow.run(
            KARPFLOW,
            "status",
            KARPFLOW_TEMPORAL_ADDRESS=karpflow.temporal_address,
            KARPFLOW_CLUSTER_NAME=karpflow.stack.cluster_name,
        )
        nodes = await karpflow.nodes()

    assert any(PROBLEM in p for p in final.problems), final.problems
    assert PROBLEM in " ".join(text.stdout.split())  # rich wraps the line at the terminal's width
    assert final.started == [] and final.in_flight == []
    assert set(nodes) == {A.name, B.name}
    assert not any(n["metadata"].get("deletionTimestamp") for n in nodes.values())
    assert not any(
        t.get("key") == DISRUPTED_TAINT_KEY for n in nodes.values() for t in n["spec"].get("taints") or []
    )
    assert {i["InstanceId"] for i in karpflow.instances()} == before
    started = [e.id async for e in karpflow.client.list_workflows(f'TaskQueue="{karpflow.task_queue}"')]
    assert [i for i in started if not i.startswith("karpflow-controller/")] == [], started


async def _after_passes(karpflow, passes: int):
    try:
        current = await status(karpflow)
    except Exception:
        return None
    return current if current.passes >= passes else None
