"""`karpflow uninstall` on the real stack, as an operator runs it once karpflow is to go: it refuses
while a worker still polls, and then takes karpflow's marks off, so that a NodePool deletion (which
karpflow's finalizer held for its nodes) completes with karpflow gone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from api.constants import DISRUPTED_TAINT_KEY, HOLDER_ANNOTATION, NODEPOOL_FINALIZER, TERMINATION_FINALIZER
from tests.integration.workflows.conftest import REPO, node, scenario

pytestmark = pytest.mark.integration

A, B = node("172.31.1.10"), node("172.31.2.20")
NODEPOOL = "/apis/karpenter.sh/v1/nodepools/default"


async def uninstall(karpflow, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **karpflow.stack.client_env(),
        "KARPFLOW_TEMPORAL_ADDRESS": karpflow.temporal_address,
        "KARPFLOW_TASK_QUEUE": karpflow.task_queue,
        "COLUMNS": "200",
    }
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "cli", "uninstall", *flags],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.sim_stack(scenario=scenario([A, B], []))
async def test_uninstall_waits_for_the_workers_then_frees_what_karpflow_held(karpflow):
    pool = await karpflow.kube.request("GET", NODEPOOL)
    pool["metadata"]["finalizers"] = [NODEPOOL_FINALIZER]
    await karpflow.kube.request("PUT", NODEPOOL, body=pool)

    def held_by_karpflow(node: dict) -> bool:
        node["spec"].setdefault("taints", []).append({"key": DISRUPTED_TAINT_KEY, "effect": "NoSchedule"})
        node["metadata"].setdefault("annotations", {})[HOLDER_ANNOTATION] = "disruption/x/default/Empty/1@r"
        return True

    await karpflow.kube.update_node(A.name, held_by_karpflow)

    async with karpflow.worker():
        refused = await uninstall(karpflow, "--yes")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (
        f"polled task queue {karpflow.task_queue}" in refused.stderr
        and "nothing was changed" in refused.stderr
    )
    assert NODEPOOL_FINALIZER in (await karpflow.kube.request("GET", NODEPOOL))["metadata"]["finalizers"]

    # Temporal lists a stopped worker's poller for a while: an operator who scaled the worker to 0 and
    # knows it is gone says so; the dry run shows every mark and changes nothing.
    shown = await uninstall(karpflow, "--dry-run", "--skip-temporal-checks")
    assert shown.returncode == 0, shown.stderr
    assert NODEPOOL_FINALIZER in shown.stdout and HOLDER_ANNOTATION in shown.stdout
    assert NODEPOOL_FINALIZER in (await karpflow.kube.request("GET", NODEPOOL))["metadata"]["finalizers"]

    done = await uninstall(karpflow, "--yes", "--skip-temporal-checks")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 of 3 object(s) cleaned" in done.stdout, done.stdout
    nodes = await karpflow.nodes()
    for name in (A.name, B.name):
        meta, spec = nodes[name]["metadata"], nodes[name]["spec"]
        assert TERMINATION_FINALIZER not in (meta.get("finalizers") or [])
        assert not any(t["key"] == DISRUPTED_TAINT_KEY for t in spec.get("taints") or [])
        assert HOLDER_ANNOTATION not in (meta.get("annotations") or {})

    # The NodePool karpflow held is deleted at once now, and a node too.
    await karpflow.run("kubectl", "delete", "nodepool", "default", "--wait=true", "--timeout=30s",
                       **karpflow.stack.client_env())  # fmt: skip
    await karpflow.run("kubectl", "delete", "node", A.name, "--wait=true", "--timeout=30s",
                       **karpflow.stack.client_env())  # fmt: skip
    assert A.name not in await karpflow.nodes()
    again = await uninstall(karpflow, "--yes", "--skip-temporal-checks")
    assert again.returncode == 0 and "nothing to remove" in again.stdout, again.stdout
