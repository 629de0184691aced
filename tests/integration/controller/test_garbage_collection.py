"""The garbage collection of karpflow's own launches on the real stack (Temporal dev server, the
emulator, moto, the real worker with its controller): an operator's `temporal workflow terminate` of a
DisruptionWorkflow waiting on its replacement leaves that replacement running (a terminated workflow
compensates nothing); the controller's collection terminates it and deletes its Node, its crash
cleanup untaints the candidates, and nothing is left behind."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.constants import DISRUPTED_TAINT_KEY
from api.controller_io import ControllerStatus
from api.workflow_ids import controller_workflow_id
from api.workflow_io import DisruptionInput, DisruptionStatus, DisruptionTimeouts, ReplacementSpec
from runtime.metrics import REGISTRY
from sim.binaries import temporal_cli
from sim.testing import assert_no_violations, kubectl
from tests.integration.controller.test_controller import TWENTY_PODS, A, B, scenario
from workflows.disruption import DisruptionWorkflow

pytestmark = pytest.mark.integration

# Collections every half second; the grace and the registration TTL short enough for a test (the
# defaults are Karpenter's 30 s and 15 min).
COLLECTING = {
    "controller": True,
    "controller_interval": 0.3,
    "controller_validation": 0.5,
    "gc_interval": 0.5,
    "gc_grace": 0.5,
    "gc_registration_ttl": 1.0,
}


def replace_both() -> DisruptionInput:
    return DisruptionInput(
        reason="Underutilized",
        nodes=[A.name, B.name],
        replacements=[
            ReplacementSpec(nodepool="default", instance_types=["m5.xlarge"], zones=["us-west-2a"])
        ],
        # Still waiting when the operator terminates it.
        timeouts=DisruptionTimeouts(replacement_ready="1h", heartbeat="5s"),
    )


async def controller_status(karpflow: Any) -> ControllerStatus | None:
    handle = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
    try:
        return await handle.query("status", result_type=ControllerStatus)
    except Exception:
        return None


def collected(reason: str) -> float:
    """Collections counted for `reason` in the default pool, whatever the other labels say
    (consolidation_policy and termination_mode came later: #3179)."""
    wanted = {"reason": reason, "nodepool": "default", "capacity_type": "on-demand"}
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        for sample in metric.samples
        if sample.name == "karpenter_nodeclaims_disrupted_total"
        and all(sample.labels.get(k) == v for k, v in wanted.items())
    )


@pytest.mark.parametrize("registers", [True, False], ids=["node-never-ready", "no-node"])
@pytest.mark.sim_stack(scenario=scenario([A, B], TWENTY_PODS, consolidate_after="Never"))
async def test_a_terminated_disruption_waiting_on_its_replacement_leaves_nothing_behind(karpflow, registers):
    if registers:  # the replacement's Node registers and never becomes Ready
        karpflow.stack.faults.add_never_ready(instance_types=["m5.xlarge"])
    else:  # the replacement never starts a kubelet: no Node at all

        def no_bootstrap(nodeclass: dict[str, Any]) -> None:
            nodeclass["spec"]["amiFamily"] = "Custom"
            nodeclass["spec"]["userData"] = "#!/bin/bash\necho 'no bootstrap here'\n"

        karpflow.stack.store.mutate("ec2nodeclasses", "default", no_bootstrap)
    reason = "registration_timeout" if registers else "garbage_collected"
    counted = collected(reason)
    before = {i["InstanceId"] for i in karpflow.instances()}
    workflow_id = karpflow.workflow_id("disruption/default/Underutilized/gc")
    async with karpflow.worker(**COLLECTING):
        handle = await karpflow.client.start_workflow(
            DisruptionWorkflow.run, replace_both(), id=workflow_id, task_queue=karpflow.task_queue
        )

        async def waiting() -> DisruptionStatus | None:
            status = await handle.query(DisruptionWorkflow.status)
            replacement = status.replacements[0]
            ready = status.phase == "WaitingForReplacements" and replacement.instance_id
            if registers:
                ready = ready and any(n not in (A.name, B.name) for n in await karpflow.nodes())
            return status if ready else None

        status = await karpflow.eventually(waiting, what="the command to wait for its replacement")
        leaked = status.replacements[0].instance_id
        assert leaked is not None and leaked not in before
        # While the command runs, its replacement is its own: collections come and leave it.
        seen = (await controller_status(karpflow) or ControllerStatus()).garbage

        async def collected_again() -> bool:
            now = (await controller_status(karpflow) or ControllerStatus()).garbage
            return now is not None and (seen is None or now.at > seen.at)

        await karpflow.eventually(collected_again, what="a collection while the command runs")
        assert leaked in {i["InstanceId"] for i in karpflow.instances()}

        await karpflow.run(
            temporal_cli(),
            "workflow",
            "terminate",
            "--workflow-id",
            workflow_id,
            "--reason",
            "an operator gives up on the command",
            "--address",
            karpflow.temporal_address,
        )

        async def nothing_left() -> bool:
            nodes = await karpflow.nodes()
            untainted = not any(
                t["key"] == DISRUPTED_TAINT_KEY for n in nodes.values() for t in n["spec"].get("taints") or ()
            )
            running = {i["InstanceId"] for i in karpflow.instances()}
            counted_once = collected(reason) == counted + 1  # once the termination is complete
            return running == before and set(nodes) == {A.name, B.name} and untainted and counted_once

        await karpflow.eventually(
            nothing_left,
            within=60,
            what=lambda: f"instance {leaked} collected, candidates untainted: {karpflow.worker_logs()}",
        )

    assert (await handle.describe()).status.name == "TERMINATED"
    assert [i["State"]["Name"] for i in karpflow.instances(("pending", "running", "shutting-down"))] == [
        "running"
    ] * 2
    listed = json.loads(kubectl(karpflow.stack, "get", "events", "-A", "-o", "json"))["items"]
    garbage = [e for e in listed if e["reason"] == "InstanceGarbageCollected"]
    on = {e["involvedObject"]["kind"] for e in garbage if leaked in e["message"]}
    assert on == ({"NodePool", "Node"} if registers else {"NodePool"}), garbage
    assert_no_violations(karpflow.stack)
