"""A replacement whose NodePool carries labels the kubelet refuses to start with (issue 30, item 7).

The real worker, the emulator, moto: the user data tells the kubelet only the labels it accepts
(launch/kubelet_labels.py), the simulator's kubelet refuses to start on any other
(sim/controllers/bootstrap.py), and registration writes the rest on the Node before it counts as
initialized.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from api.workflow_io import DisruptionInput, DisruptionTimeouts, ReplacementSpec
from sim.apiserver.store import WatchEvent
from sim.testing import assert_no_violations
from tests.integration.workflows.conftest import Workload, node, scenario
from workflows.disruption import DisruptionWorkflow

pytestmark = pytest.mark.integration

# Two m5.xlarge, lightly used: one m5.xlarge replaces both.
A, B = node("172.31.1.10", "m5.xlarge"), node("172.31.2.20", "m5.xlarge")
WORKLOADS = [Workload("shop", "web", "100m", "128Mi", ["10"] * 4 + ["20"] * 4, pdb={"maxUnavailable": 2})]
POOL_LABELS = {"node-restriction.kubernetes.io/team": "a", "example.com/x": "y"}
INITIALIZED = "karpenter.sh/initialized"


def _label_the_pool(pool: dict[str, Any]) -> None:
    metadata = pool["spec"]["template"].setdefault("metadata", {})
    metadata["labels"] = {**(metadata.get("labels") or {}), **POOL_LABELS}


# Each family's user data, recognised by what its AMI reads.
FAMILIES = {
    "al2023@latest": "application/node.eks.aws",
    "al2@latest": "/etc/eks/bootstrap.sh",
    "bottlerocket@latest": "[settings.kubernetes",
}


@pytest.mark.parametrize("alias", sorted(FAMILIES))
@pytest.mark.sim_stack(scenario=scenario([A, B], WORKLOADS))
async def test_a_replacement_with_a_node_restriction_label_registers_initializes_and_carries_it(
    karpflow, alias
):
    karpflow.stack.store.mutate("nodepools", "default", _label_the_pool)
    # The AMI family follows the alias (status.amis, the AMIs launched, stays as it was).
    karpflow.stack.store.mutate(
        "ec2nodeclasses", "default", lambda c: c["spec"].update(amiSelectorTerms=[{"alias": alias}])
    )
    # Every version of a Node that says it is initialized, as the API server stored it.
    initialized: list[tuple[str, dict[str, str]]] = []

    def watch(event: WatchEvent) -> None:
        if event.resource.plural == "nodes" and event.type != "DELETED":
            labels = event.object["metadata"].get("labels") or {}
            if labels.get(INITIALIZED) == "true":
                initialized.append((event.name, labels))

    stop = karpflow.stack.store.add_listener(watch)
    try:
        async with karpflow.worker():
            status = await karpflow.client.execute_workflow(
                DisruptionWorkflow.run,
                DisruptionInput(
                    reason="Underutilized",
                    nodes=[A.name, B.name],
                    replacements=[
                        ReplacementSpec(
                            nodepool="default", instance_types=["m5.xlarge"], zones=["us-west-2a"]
                        )
                    ],
                    # A bound, not a measure: the old code's node never registered and failed here.
                    timeouts=DisruptionTimeouts(replacement_ready="60s"),
                ),
                id=karpflow.workflow_id("disruption/default/Underutilized"),
                task_queue=karpflow.task_queue,
            )
    finally:
        stop()

    replacement = status.replacements[0]
    assert status.phase == "Succeeded" and replacement.state == "Initialized", status
    labels = (await karpflow.nodes())[replacement.node]["metadata"]["labels"]
    assert {key: labels.get(key) for key in POOL_LABELS} == POOL_LABELS
    versions = [version for name, version in initialized if name == replacement.node]
    assert versions and all(POOL_LABELS.items() <= version.items() for version in versions)
    # The kubelet was told example.com/x; node-restriction.kubernetes.io/team came from registration.
    user_data = base64.b64decode(
        karpflow.stack.ec2_client().describe_instance_attribute(
            InstanceId=replacement.instance_id, Attribute="userData"
        )["UserData"]["Value"]
    ).decode()
    assert FAMILIES[alias] in user_data
    assert "example.com/x" in user_data and "node-restriction.kubernetes.io" not in user_data
    assert karpflow.stack.controllers.controllers["nodes"].boot_failures == {}
    assert_no_violations(karpflow.stack)
