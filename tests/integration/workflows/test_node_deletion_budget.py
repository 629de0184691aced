"""`kubectl delete node` under a NodeDisruptionBudget that allows nothing: the termination waits
and the node keeps every pod, daemon pods included, as on a real cluster (issue 32's acceptance).

The DaemonSet controller does not remove daemon pods from a node being deleted
(kubernetes/kubernetes pkg/controller/daemon/daemon_controller.go `NodeShouldRunDaemonPod` reads no
deletionTimestamp): a node a finalizer holds keeps them until a drain evicts them."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from temporalio.service import RPCError

from api.workflow_io import TerminationStatus
from sim.testing import assert_no_violations
from tests.integration.workflows.conftest import Workload, node, scenario
from workflows.termination import TerminationWorkflow

pytestmark = pytest.mark.integration

A, B = node("172.31.1.10"), node("172.31.2.20")
WEB = [Workload("shop", "web", "100m", "128Mi", ["10"] * 3 + ["20"], pdb={"maxUnavailable": 1})]
FROZEN = {
    "apiVersion": "karpflow.dev/v1alpha1",
    "kind": "NodeDisruptionBudget",
    "metadata": {"name": "frozen"},
    "spec": {"selector": {"matchLabels": {"karpenter.sh/nodepool": "default"}}, "maxUnavailable": 0},
}


def _on(pod: dict[str, Any], name: str) -> bool:
    return (pod.get("spec") or {}).get("nodeName") == name


@pytest.mark.sim_stack(scenario=scenario([A, B], WEB), time_scale=0.05)
async def test_kubectl_delete_node_under_a_zero_budget_keeps_every_pod_for_a_minute(karpflow):
    karpflow.stack.store.create("nodedisruptionbudgets", FROZEN)
    before = {p["metadata"]["uid"]: p for p in await karpflow.pods() if _on(p, A.name)}
    kinds = {(p["metadata"].get("ownerReferences") or [{}])[0].get("kind") for p in before.values()}
    assert {"DaemonSet", "ReplicaSet"} <= kinds, kinds  # the node runs a daemon pod and workload pods
    leaving: list[str] = []  # every pod of A that starts terminating or goes, whoever does it

    def watch(event: Any) -> None:
        pod = event.object
        gone = event.type == "DELETED" or pod["metadata"].get("deletionTimestamp")
        if event.resource.plural == "pods" and _on(pod, A.name) and gone:
            leaving.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']} ({event.type})")

    stop_watching = karpflow.stack.store.add_listener(watch)
    termination = await karpflow.termination_id(A.name)
    try:
        async with karpflow.worker():
            await karpflow.run(
                "kubectl", "--kubeconfig", str(karpflow.stack.kubeconfig_path), "delete", "node", A.name,
                "--wait=false",
            )  # fmt: skip

            async def waiting() -> TerminationStatus | None:
                with contextlib.suppress(RPCError):
                    handle = karpflow.client.get_workflow_handle(termination)
                    status = await handle.query(TerminationWorkflow.status)
                    return status if status.phase == "Waiting" else None
                return None

            status = await karpflow.eventually(waiting, within=30, what="the termination waiting")
            assert status.waiting_for == "NodeDisruptionBudget frozen", status
            # A minute of the cluster's time (3 s here): the kubelet, the DaemonSet controller,
            # the taint manager and the pod GC all had their turns.
            await asyncio.sleep(karpflow.stack.scale.seconds(60))
            status = await karpflow.client.get_workflow_handle(termination).query(TerminationWorkflow.status)
            assert (status.phase, status.waiting_for) == ("Waiting", "NodeDisruptionBudget frozen")
    finally:
        stop_watching()

    assert leaving == []
    after = {p["metadata"]["uid"]: p for p in await karpflow.pods() if _on(p, A.name)}
    assert set(after) == set(before)
    assert not [p["metadata"]["name"] for p in after.values() if p["metadata"].get("deletionTimestamp")]
    held = (await karpflow.nodes())[A.name]
    assert held["metadata"].get("deletionTimestamp")  # still held by karpflow's finalizer
    assert_no_violations(karpflow.stack)
