"""The coexistence mode as its Deployment runs it: the rendered overlay with
KARPFLOW_KARPENTER_COEXISTENCE=true, the worker as its ServiceAccount on the secure emulator, beside
the simulated Karpenter. Every call the mode makes (NodeClaims created, read, stamped, deleted) is
allowed by deploy/base/rbac.yaml, and without the NodeClaim write rule the replacement is refused
and rolled back with nothing lost."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError

from api.constants import DISRUPTED_TAINT_KEY, KARPFLOW_DISRUPTED_TAINT_KEY
from sim.testing import assert_no_violations, kubectl
from tests.integration.workflows.conftest import Workload, node, scenario
from tests.integration.workflows.test_in_cluster import (
    ACCOUNT,
    SERVICE_ACCOUNT,
    container_from_cluster,
    drop_rule,
    execute,
    operators_overlay,
    pod_environment,
    replace_nodes,
    stack_values,
    start_worker,
)
from workflows.disruption import DisruptionWorkflow

pytestmark = pytest.mark.integration

A, B = node("172.31.1.10", "m5.xlarge"), node("172.31.2.20", "m5.xlarge")
PODS = [Workload("shop", "web", "100m", "128Mi", ["10"] * 6, pdb={"maxUnavailable": 2})]
NODECLAIM_WRITES = {
    "apiGroups": ["karpenter.sh"],
    "resources": ["nodeclaims"],
    "verbs": ["create", "update", "delete"],
}


def no_disruption_taint(nodes: dict[str, dict[str, Any]]) -> bool:
    keys = {t["key"] for n in nodes.values() for t in n["spec"].get("taints") or ()}
    return not keys & {DISRUPTED_TAINT_KEY, KARPFLOW_DISRUPTED_TAINT_KEY}


@pytest.mark.slow
@pytest.mark.rbac_by_test
@pytest.mark.sim_stack(scenario=scenario([A, B], PODS), secure=True, karpenter=True)
async def test_the_mode_runs_as_its_service_account_and_needs_the_nodeclaim_rule(karpflow, tmp_path):
    stack = karpflow.stack
    values = {**stack_values(karpflow), "KARPFLOW_KARPENTER_COEXISTENCE": "true"}
    kubectl(stack, "apply", "-k", str(operators_overlay(tmp_path / "overlay", values)))
    role = kubectl(stack, "get", "clusterrole", ACCOUNT, "-o", "json")
    assert '"create"' in role and "nodeclaims" in role
    container = container_from_cluster(stack)
    assert container.env["KARPFLOW_KARPENTER_COEXISTENCE"] == "true"
    before = {i["InstanceId"] for i in karpflow.instances()}
    worker = start_worker(
        container, pod_environment(stack, tmp_path / "serviceaccount"), tmp_path / "worker.log"
    )
    try:
        # 1. A replacement through a NodeClaim and A handed to Karpenter, every call as the account.
        done = await execute(karpflow, "disruption/default/Drifted/coexist-a", replace_nodes(A.name))
        log = (tmp_path / "worker.log").read_text()
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{log[-3000:]}"
        handle = karpflow.client.get_workflow_handle_for(
            DisruptionWorkflow.run, "disruption/default/Drifted/coexist-a"
        )
        status = await handle.result()
        assert status.phase == "Succeeded", status
        (replacement,) = status.replacements
        assert replacement.nodeclaim and replacement.node
        nodes = await karpflow.eventually(
            lambda: _nodes_without(karpflow, A.name), within=30, what="Karpenter to terminate node A"
        )
        assert set(nodes) == {B.name, replacement.node} and no_disruption_taint(nodes)
        worker_calls = [r for r in stack.requests.query() if r.user == SERVICE_ACCOUNT]
        assert any(r.method == "POST" and r.path.endswith("/nodeclaims") for r in worker_calls)
        assert any(r.method == "DELETE" and "/nodeclaims/" in r.path for r in worker_calls)
        refused = [(r.method, r.path, r.status) for r in worker_calls if r.status in (401, 403)]
        assert not refused, refused
        launched = {i["InstanceId"] for i in karpflow.instances()} - before
        assert launched == {replacement.instance_id}  # Karpenter's launch; karpflow launched nothing

        # 2. Without the NodeClaim write rule the replacement is refused, and the command rolls back.
        drop_rule(stack, NODECLAIM_WRITES)
        failed = await execute(
            karpflow,
            "disruption/default/Drifted/coexist-b",
            replace_nodes(B.name, replacement_ready="10s"),
        )
        assert failed.returncode != 0
        with pytest.raises(WorkflowFailureError) as failure:
            await karpflow.client.get_workflow_handle("disruption/default/Drifted/coexist-b").result()
        message = failure.value.cause.message
        assert 'cannot create resource "nodeclaims"' in message and SERVICE_ACCOUNT in message, message
        assert "untainted 1 candidate(s)" in message, message
        nodes = await karpflow.nodes()
        assert set(nodes) == {B.name, replacement.node} and no_disruption_taint(nodes)
    finally:
        worker.terminate()
        await asyncio.to_thread(worker.wait, 30)
    karpenter = stack.controllers.controllers["karpenter"].status()
    assert karpenter["garbage_collected"] == [] and karpenter["taints_removed"] == [], karpenter
    assert_no_violations(stack)


async def _nodes_without(karpflow: Any, name: str) -> dict[str, Any] | None:
    nodes = await karpflow.nodes()
    return None if name in nodes else nodes
